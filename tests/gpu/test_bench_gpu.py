"""`inferno bench` on the GPU: same-run limits, and the runner over the GPU executor (tiny model).

Numbers are printed (run with -s to see them), never asserted as speeds: only that the limits
are physically plausible and the ratios exist.
"""

from __future__ import annotations

import pytest

from inferno.artifact import open_checked
from inferno.artifact.synth import synthesize_artifact
from inferno.bench.accounting import StateDtypes, account
from inferno.bench.limits import measure_gpu_limits
from inferno.bench.report import build_report, text_table
from inferno.bench.runner import BenchSettings, run_bench
from inferno.cuda import Device
from inferno.model.gpu.profile import step_spans


@pytest.fixture(scope="module")
def device():
    return Device.open(0)


@pytest.fixture(scope="module")
def limits(device):
    lim = measure_gpu_limits(device, print)
    print(f"\n{device!r}: copy {lim.copy_gbps:,.0f} GB/s, GEMM {lim.gemm_tflops} TFLOP/s, notes {lim.notes}")
    return lim


def test_limits_are_plausible(device, limits):
    assert 100 < limits.copy_gbps < 20_000  # GB/s, read + written
    if device.arch == "sm_90a":
        assert limits.gemm_tflops is not None and 50 < limits.gemm_tflops < 3000, limits.notes
        assert "gemm_wgmma" in limits.gemm_impl
    else:
        assert limits.gemm_tflops is None and limits.notes


def test_bench_runs_on_the_gpu_executor(tmp_path, limits):
    from inferno.model.gpu import GpuExecutor

    path = synthesize_artifact("tiny-dense", tmp_path / "tiny.ninfer", progress=False)
    art, spec, config, expected = open_checked(path)
    art.close()
    s = BenchSettings(64, 32, contexts=(512,), reps=2, warmup=1, prefill_chunk=32, kernel_table=True)
    with GpuExecutor(path, max_seqs=1, max_context=s.max_tokens, progress=False) as ex:
        acct = account(config, expected, getattr(ex, "state_dtypes", StateDtypes()))
        out = run_bench(ex, acct, limits, s, print, step_spans)
    assert [r["prompt_tokens"] for r in out["runs"]] == [64, 512]
    for r in out["runs"]:
        assert [x["completion_tokens"] for x in r["samples"]] == [32, 32]
        assert 0 < r["decode_roofline_ratio"] < 1.5
        if limits.gemm_tflops is not None:
            assert 0 < r["prefill_mma_ratio"] < 1.5
    report = build_report(date="-", command="test", device={"name": "GPU", "executor": "gpu"},
                          model={"identity": spec.name}, settings={}, limits=limits.to_json(),
                          accounting=acct.summary(65), runs=out["runs"], skipped=[],
                          host_overhead=out["host_overhead"], kernels=out["kernels"])
    print("\n" + text_table(report))
    h = out["host_overhead"]
    # Graph replay, the next step queued while the host waits for a token: a device span per wait, the
    # first holding the first two steps.
    assert h["available"] and h["cuda_graph"] is True and h["steps"] == 31 and h["device_spans"] == 30
    assert 0 < h["device_s_per_step"] <= h["wall_s_per_step"], h
    assert h["host_overhead_s_per_step"] >= 0 and 0 <= h["host_overhead_ratio"] < 1
    assert h["device_idle_between_steps_s"]["mean"] >= 0
