"""GpuExecutor.profile_step / profile_prefill on the GPU (tiny dense artifact, CUDA graphs on):
CUDA-event times for every launch, byte counts that match the bench accounting, the sequence
state moved exactly as `step` / `prefill` move it, and the graphs still in use afterwards.
The step timer on graph-replayed steps; the nvfp4 identity's kernel table. Failures print the kernel table."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from inferno.artifact import open_checked
from inferno.artifact.convert import convert
from inferno.artifact.formats import packed_nbytes
from inferno.bench.accounting import account
from inferno.checkpoint.synth import synthesize
from inferno.model.gpu import GpuExecutor
from inferno.engine.params import SamplingParams
from inferno.model.gpu.profile import record, step_spans

PROMPT = [(5 + 7 * i) % 1000 for i in range(70)]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-profile")
    return convert(synthesize("tiny-dense", root / "ckpt"), root / "tiny.ninfer", "groupwise-int", progress=False)


@pytest.fixture(scope="module")
def ex(artifact):
    e = GpuExecutor(artifact, max_seqs=2, max_context=512, cuda_graph=True, progress=False)
    yield e
    e.close()


def table(times) -> str:
    return "\n".join(f"  {t.kernel:<44} n={t.launches:<3} {t.seconds * 1e6:9.1f} us  {t.bytes} B  {t.flops} flop"
                     for t in times)


def test_step_profile_times_every_launch(artifact, ex):
    a, _spec, config, expected = open_checked(artifact)
    a.close()
    acct = account(config, expected, ex.state_dtypes)
    s = ex.new_state()
    try:
        ex.prefill(PROMPT, s)
        context = s.position + 1
        rec = record(ex, lambda: ex.step(11, s))
        times = rec.times()
        print("\n" + table(times))
        bad = [t for t in times if not (t.seconds > 0 and math.isfinite(t.seconds))]
        assert not bad, f"launches without a positive event time:\n{table(bad)}"
        assert sum(t.seconds for t in times) < 0.5, f"implausible device time:\n{table(times)}"
        assert rec.timer.gated, "the stream could not be held (see stderr): times include host launch gaps"
        norm = next(t for t in times if t.kernel == "rmsnorm text/final_norm")  # the others fold into GEMVs
        assert norm.seconds / norm.launches < 10e-6, (
            f"a {config.hidden}-wide rmsnorm timed at {norm.seconds / norm.launches * 1e6:.1f} us: host launch "
            f"gaps are being timed (the stream hold did not work)\n{table(times)}")
        names = {t.kernel for t in times}
        assert "gemv_bf16_t1_n gdn/a_b_projection" in names and "attention" in names, table(times)
        emb = 2 * config.hidden - acct.weight_bytes["embedding_row"]  # the GPU's table is bf16
        # merged input projections: a widened stack holds its narrower half at the wider width, a mixed one each
        # half's image (the accounting: the artifact's bytes)
        inv = {e.name: e for e in expected}
        wider = sum(p.nbytes - sum(packed_nbytes(inv[s].format, inv[s].layout, inv[s].shape) for s in p.sources)
                    for p in ex.plan.placements if p.merged)
        assert rec.fixed_bytes() == acct.decode_step_bytes(context) + emb + wider
        assert ex.cuda_graph and ex.ops is ex.program.ops
    finally:
        ex.release(s)


def test_profiled_step_and_prefill_move_the_state_like_graph_replay(ex):
    a, b = ex.new_state(), ex.new_state()
    try:
        ex.prefill(PROMPT[:40], a)
        ex.profile_prefill(PROMPT[:40], b)
        ex.step(9, a)
        ex.profile_step(9, b)
        assert a.position == b.position == 41
        la, lb = ex.step(4, a), ex.step(4, b)  # both replayed from the graph
        err = float(np.abs(la - lb).max())
        assert err <= 1e-2 * max(1.0, float(np.abs(la).max())), (
            f"logits after a profiled prefill + step differ from plain ones by {err:.3g}: the profile moved "
            "the state differently")
        assert int(np.argmax(la)) == int(np.argmax(lb))
    finally:
        ex.release(a)
        ex.release(b)


def test_step_spans_time_graph_replayed_steps(ex):
    """The step timer on the executor as the engine runs it (graphs, device sampling): one span per
    step, device times that fit inside the wall time, and the executor untouched afterwards."""
    greedy = SamplingParams(temperature=0.0)
    a, b = ex.new_state(), ex.new_state()
    try:
        ta = ex.prefill_sample(PROMPT, a, greedy, 0.0)
        tb = ex.prefill_sample(PROMPT, b, greedy, 0.0)
        real, n = ex.ops, 16
        with step_spans(ex, reserve=n) as clock:
            clock.phase = "decode"
            t0 = time.perf_counter()
            for _ in range(n):
                tb = ex.step_sample(tb, b, greedy, 0.0)
            wall = time.perf_counter() - t0
        assert ex.ops is real and ex.cuda_graph
        for _ in range(n):
            ta = ex.step_sample(ta, a, greedy, 0.0)
        assert ta == tb, "watched steps sampled other tokens than plain ones"
        spans = clock.spans
        print(f"\n{n} steps: wall {wall / n * 1e6:.1f} us/step, device "
              f"{sum(s.seconds for s in spans) / n * 1e6:.1f} us/step, idle between "
              f"{[round(s.idle_before * 1e6, 1) for s in spans[1:]]} us")
        assert len(spans) == n and all(s.phase == "decode" for s in spans)
        assert all(0 < s.seconds < 0.1 for s in spans)
        assert 0 < sum(s.seconds for s in spans) <= wall
        assert all(s.idle_before >= 0 for s in spans[1:])
    finally:
        ex.release(a)
        ex.release(b)


def test_nvfp4_identity_kernel_table(artifact):
    """The qwen3.6-27b/nvfp4 layout on the tiny model: NVFP4 and BF16 GEMVs profiled with their payload bytes."""
    root = artifact.parent
    path = convert(root / "ckpt", root / "tiny-nv.ninfer", "nvfp4", progress=False)
    with GpuExecutor(path, max_seqs=1, max_context=256, cuda_graph=True, progress=False) as e:
        s = e.new_state()
        try:
            e.prefill(PROMPT[:40], s)
            times = e.profile_step(3, s)
        finally:
            e.release(s)
        s = e.new_state()
        try:
            chunk = e.profile_prefill(PROMPT[:40], s)
        finally:
            e.release(s)
    print("\n" + table(times) + "\n" + table(chunk))
    names = {t.kernel.split()[0] for t in times}
    # NVFP4 matrices on the tensor-core GEMV (tile16-nvfp4-v1), the a|b projection on the bf16 one
    assert all(any(n.startswith(f) for n in names) for f in ("gemv_mma_nvfp4_t1", "gemv_bf16_t1")), table(times)
    assert all(t.seconds > 0 and t.bytes for t in times if t.kernel.startswith("gemv_")), table(times)
    assert any(t.kernel.startswith("dequant NVFP4") for t in chunk), table(chunk)
