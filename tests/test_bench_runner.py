"""The bench runner over the engine loop: repetitions, spreads, ratios to limits, host overhead per
decode step, the kernel table."""

from __future__ import annotations

import json
import statistics
from contextlib import contextmanager

import pytest

from fake_executor import FakeExecutor
from inferno.artifact.identities import lookup
from inferno.bench.accounting import account
from inferno.bench.limits import Limits, cpu_limits
from inferno.bench.profile import DECODE, KernelProfiler, KernelTime, StepSpan, host_overhead, kernel_rows
from inferno.bench.report import SCHEMA, build_report, markdown_row, text_table
from inferno.bench.runner import BenchSettings, prompt_ids, run_bench, spread, time_generation
from inferno.checkpoint.presets import get_preset
from inferno.errors import UsageError
from inferno.model.config import ModelConfig


@pytest.fixture(scope="module")
def acct():
    config = ModelConfig.from_hf({**get_preset("tiny-dense").text})
    return account(config, lookup("inferno-test-tiny-dense", "groupwise-int").expected(config))


class ProfilingFake(FakeExecutor):
    """A fake executor with the per-kernel hooks: two kernels per decode step, one per prefill chunk."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.profiled_at: list[int] = []

    def profile_step(self, token, state):
        self.profiled_at.append(len(state.tokens))
        self.step(token, state)
        return [KernelTime("gemv", 1e-3, bytes=10**6), KernelTime("attn", 2e-3, bytes=10**6, flops=4 * 10**9, launches=2)]

    def profile_prefill(self, tokens, state):
        self.prefill(tokens, state)
        return [KernelTime("gemm", 1e-3, flops=10**9)]


def test_spread_and_prompt():
    s = spread([3.0, 1.0, 2.0, 10.0])
    assert s == {"median": 2.5, "min": 1.0, "max": 10.0, "stdev": statistics.stdev([3, 1, 2, 10]), "n": 4}
    assert spread([5.0])["stdev"] == 0.0
    assert prompt_ids(50, 20, 0) == prompt_ids(50, 20, 0) and len(prompt_ids(50, 20, 0)) == 20
    assert all(0 <= t < 50 for t in prompt_ids(50, 200, 1))


@pytest.mark.parametrize("kw", [dict(prompt_tokens=0), dict(decode_tokens=1), dict(reps=0), dict(warmup=-1),
                                dict(prefill_chunk=0), dict(contexts=(5, 0))])
def test_settings_reject_bad_values(kw):
    base = dict(prompt_tokens=8, decode_tokens=4)
    with pytest.raises(UsageError):
        BenchSettings(**{**base, **kw})


def test_settings_cases_keep_order_without_repeats():
    s = BenchSettings(8, 4, contexts=(32, 8, 16, 32))
    assert s.cases == (8, 32, 16) and s.max_tokens == 36


def test_generation_ignores_eos_and_counts_exactly():
    ex = FakeExecutor(script=[])  # every sampled token is the EOS id
    st = time_generation(ex, [1, 2, 3, 4, 5], 6, prefill_chunk=2)
    assert st.completion_tokens == 6 and st.prompt_tokens == 5
    assert ex.prefill_calls == [2, 2, 1] and ex.steps == 5 and ex.all_released()


def test_run_bench_on_cpu_limits_has_null_ratios(acct):
    ex = FakeExecutor(delay=0.0005)
    s = BenchSettings(8, 5, contexts=(12,), reps=3, warmup=1, prefill_chunk=4, kernel_table=True)
    out = run_bench(ex, acct, cpu_limits(), s, lambda m: None)
    assert [r["prompt_tokens"] for r in out["runs"]] == [8, 12]
    assert len(ex.states) == 2 * (3 + 1) and ex.all_released()
    r = out["runs"][0]
    assert r["decode"]["tok_s"]["n"] == 3 and len(r["samples"]) == 3
    assert all(x["completion_tokens"] == 5 for x in r["samples"])
    assert r["decode"]["tok_s"]["median"] == statistics.median(4 / x["decode_s"] for x in r["samples"])
    assert r["prefill"]["tok_s"]["median"] == statistics.median(8 / x["prefill_s"] for x in r["samples"])
    assert r["decode_roofline_tok_s"] is None and r["decode_roofline_ratio"] is None and r["prefill_mma_ratio"] is None
    assert r["prefill_flops"] == acct.prefill_flops(8, 4)
    assert r["decode_bytes_per_step"] == acct.decode_bytes(8, 5) / 4
    assert out["kernels"] == {"available": False,
                              "reason": "FakeExecutor has no per-kernel timing hooks (profile_step / profile_prefill)"}
    assert out["host_overhead"] == {"available": False, "reason": "FakeExecutor has no device step timer"}


def test_ratios_and_kernel_table_with_measured_limits(acct):
    ex = ProfilingFake(delay=0.0005)
    assert isinstance(ex, KernelProfiler) and not isinstance(FakeExecutor(), KernelProfiler)
    limits = Limits(copy_gbps=2.0, gemm_tflops=4.0, gemm_impl="test")
    s = BenchSettings(6, 4, reps=2, warmup=0, prefill_chunk=4, kernel_table=True)
    out = run_bench(ex, acct, limits, s, lambda m: None)
    r = out["runs"][0]
    roofline = 3 / (acct.decode_bytes(6, 4) / 2e9)
    assert r["decode_roofline_tok_s"] == pytest.approx(roofline)
    assert r["decode_roofline_ratio"] == pytest.approx(r["decode"]["tok_s"]["median"] / roofline)
    assert r["prefill_mma_ratio"] == pytest.approx(r["prefill_tflops"] / 4.0)
    assert r["prefill_tflops"] == pytest.approx(acct.prefill_flops(6, 4) / r["prefill"]["seconds"]["median"] / 1e12)
    k = out["kernels"]
    assert k["available"] and ex.profiled_at == [6] and ex.all_released()  # after the 6-token prompt
    rows = k["decode_step"]["kernels"]
    assert rows[0]["gbps"] == pytest.approx(1.0) and rows[0]["ratio"] == pytest.approx(0.5) and rows[0]["limit"] == "copy"
    assert rows[1]["launches"] == 2 and rows[1]["tflops"] == pytest.approx(2.0)
    assert rows[1]["limit"] == "gemm" and rows[1]["ratio"] == pytest.approx(0.5)
    assert k["decode_step"]["device_s"] == pytest.approx(3e-3) and k["decode_step"]["context"] == 7
    assert k["prefill_chunk"]["tokens"] == 4 and k["prefill_chunk"]["kernels"][0]["tflops"] == pytest.approx(1.0)


def test_kernel_rows_without_limits_have_no_ratio():
    rows = kernel_rows([KernelTime("x", 2e-6, bytes=4000)], None, None)
    assert rows[0]["gbps"] == pytest.approx(2.0) and rows[0]["ratio"] is None and rows[0]["tflops"] is None


def test_report_text_and_markdown(acct):
    ex = ProfilingFake()
    limits = Limits(copy_gbps=4000.0, gemm_tflops=700.0, gemm_impl="test")
    s = BenchSettings(6, 4, reps=1, warmup=0, kernel_table=True)
    out = run_bench(ex, acct, limits, s, lambda m: None, FakeTimer(1e-3, 2e-4))
    report = build_report(date="2026-11-29T20:00:00+00:00", command="inferno bench x.ninfer",
                          device={"kind": "cuda", "name": "NVIDIA H200", "executor": "gpu"},
                          model={"identity": "inferno-test-tiny-dense/groupwise-int"}, settings={},
                          limits=limits.to_json(), accounting=acct.summary(7), runs=out["runs"],
                          skipped=[{"prompt_tokens": 262144, "reason": "does not fit"}],
                          host_overhead=out["host_overhead"], kernels=out["kernels"])
    assert json.loads(json.dumps(report))["schema"] == SCHEMA
    text = text_table(report)
    assert "262144 skipped: does not fit" in text and "attn" in text
    h = out["host_overhead"]
    assert (f"host overhead per decode step: {h['host_overhead_s_per_step'] * 1e6:,.1f} us = "
            f"{100 * h['host_overhead_ratio']:.1f} % of the step") in text
    assert "device 1,000.0 us over 3 steps; device idle between steps 200.0 us mean" in text
    row = markdown_row(report)
    assert row.startswith("| 2026-11-29 | NVIDIA H200 | `inferno bench x.ninfer` | prefill 6: ")
    assert "% of roofline" in row and "of 700 TFLOP/s GEMM" in row and row.count("|") == 6
    assert f"host overhead {100 * h['host_overhead_ratio']:.1f} % of a decode step" in row
    report["host_overhead"] = {"available": False, "reason": "no timer"}
    assert "host overhead per decode step: not measured (no timer)" in text_table(report)
    assert "host overhead" not in markdown_row(report)


def test_runs_on_the_gpu_executor_emulated(tmp_path):
    """The same runner over the GPU executor's launch sequence (EmulatedOps: numpy, no GPU)."""
    from inferno.artifact import open_checked
    from inferno.artifact.synth import synthesize_artifact
    from inferno.bench.accounting import StateDtypes
    from inferno.model.gpu import GpuExecutor
    from inferno.model.gpu.profile import step_spans

    path = synthesize_artifact("tiny-dense", tmp_path / "tiny.ninfer", progress=False)
    art, _spec, config, expected = open_checked(path)
    art.close()
    s = BenchSettings(8, 4, reps=1, warmup=0, kernel_table=True)
    with GpuExecutor(path, emulate=True, max_seqs=1, max_context=s.max_tokens, progress=False) as ex:
        ops = ex.ops
        out = run_bench(ex, account(config, expected, StateDtypes()), cpu_limits(), s, lambda m: None, step_spans)
        assert ex.ops is ops  # the step timer put the executor's operations back
    (r,) = out["runs"]
    assert [x["completion_tokens"] for x in r["samples"]] == [4]
    assert out["kernels"]["available"] is isinstance(ex, KernelProfiler)
    h = out["host_overhead"]
    # the engine keeps the next step queued (queue_sample): the first span holds the first two steps
    assert h["available"] and h["steps"] == 3 and h["device_spans"] == 2 and h["prompt_tokens"] == 8
    # The emulator runs every operation on the host: device time is the time inside the step's
    # operations, a real and large part of the wall time; the rest is the loop's own host time.
    assert 0 < h["device_s_per_step"] < h["wall_s_per_step"] and 0 < h["host_overhead_ratio"] < 0.5
    assert h["host_overhead_s_per_step"] == pytest.approx(h["wall_s_per_step"] - h["device_s_per_step"])
    assert h["device_idle_between_steps_s"]["max"] > 0 and h["cuda_graph"] is False


class FakeTimer:
    """A step timer for FakeExecutor: every call to `step` is one span of `seconds` device time,
    `idle` after the previous one; `prefill` calls are spans of the phase current at the time."""

    def __init__(self, seconds: float, idle: float):
        self.seconds, self.idle = seconds, idle

    @contextmanager
    def __call__(self, executor, reserve):
        clock = type("Clock", (), {"phase": "", "spans": []})()
        step, prefill = executor.step, executor.prefill

        def span(fn):
            def run(*args):
                clock.spans.append(StepSpan(clock.phase, self.seconds, self.idle if clock.spans else None))
                return fn(*args)
            return run

        executor.step, executor.prefill = span(step), span(prefill)
        try:
            yield clock
        finally:
            del executor.step, executor.prefill


def test_host_overhead_from_one_more_generation(acct):
    ex = FakeExecutor(delay=0.002)
    s = BenchSettings(6, 5, reps=1, warmup=0, prefill_chunk=4)
    out = run_bench(ex, acct, cpu_limits(), s, lambda m: None, FakeTimer(5e-4, 1e-4))
    h = out["host_overhead"]
    assert ex.prefill_calls == [4, 2, 4, 2] and ex.steps == 8 and ex.all_released()  # timed run + measured run
    assert h["available"] and h["steps"] == 4 and h["device_spans"] == 4  # the 2 prefill spans are not decode
    assert h["device_s_per_step"] == pytest.approx(5e-4) and h["wall_s_per_step"] >= 2e-3
    assert h["host_overhead_s_per_step"] == pytest.approx(h["wall_s_per_step"] - 5e-4)
    assert h["host_overhead_ratio"] == pytest.approx(1 - 5e-4 / h["wall_s_per_step"])
    assert h["device_idle_between_steps_s"] == {"mean": pytest.approx(1e-4), "median": pytest.approx(1e-4),
                                                "max": pytest.approx(1e-4)}
    assert h["timed_wall_s_per_step"] == pytest.approx(out["runs"][0]["decode"]["seconds"]["median"] / 4)


def test_host_overhead_arithmetic():
    spans = [StepSpan("", 9.0, None), StepSpan(DECODE, 1e-3, 5e-4), StepSpan(DECODE, 3e-3, 1e-4),
             StepSpan(DECODE, 2e-3, 3e-4)]
    h = host_overhead(spans, 3, 9e-3)
    assert h["wall_s_per_step"] == pytest.approx(3e-3) and h["device_s_per_step"] == pytest.approx(2e-3)
    assert h["host_overhead_s_per_step"] == pytest.approx(1e-3) and h["host_overhead_ratio"] == pytest.approx(1 / 3)
    assert h["device_s_per_span"] == {"median": 2e-3, "min": 1e-3, "max": 3e-3}
    # the first decode span's idle time follows the prefill, not a step: left out
    assert h["device_idle_between_steps_s"]["mean"] == pytest.approx(2e-4) and h["device_idle_between_steps_s"]["max"] == 3e-4
    assert host_overhead(spans[:2], 1, 2e-3)["device_idle_between_steps_s"] is None
    with pytest.raises(ValueError):
        host_overhead(spans[:1], 3, 1.0)
