"""CPU: the GPU executor's per-kernel profile (inferno/model/gpu/profile.py) on the emulated
executor: every launch of a step is listed once, the bytes of weights + KV + GDN state match the
bench accounting, activations add only a little on top, and the sequence state moves exactly as
`step` / `prefill` move it; NVFP4 and BF16 weights are sized from their payload geometry; the step
timer (`step_spans`) watches the executor's own run without changing it."""

from __future__ import annotations

import time

import numpy as np
import pytest

from inferno.artifact import open_checked
from inferno.artifact.convert import convert
from inferno.bench.accounting import account
from inferno.bench.profile import KernelProfiler, KernelTime
from inferno.checkpoint.synth import synthesize
from inferno.cuda.memory import DeviceBuffer
from inferno.errors import UsageError
from inferno.model.gpu import GpuExecutor
from inferno.model.gpu.profile import payload_nbytes, record, step_spans

PROMPT = list(range(3, 3 + 70))  # across a KV page boundary (64 tokens)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-profile")
    return convert(synthesize("tiny-dense", root / "ckpt"), root / "tiny.ninfer", "groupwise-int", progress=False)


@pytest.fixture(scope="module")
def ex(artifact):
    e = GpuExecutor(artifact, emulate=True, max_seqs=3, max_context=192, progress=False)
    yield e
    e.close()


@pytest.fixture(scope="module")
def acct(artifact, ex):
    a, _spec, config, expected = open_checked(artifact)
    a.close()
    return account(config, expected, ex.state_dtypes)


def _kernels(times: list[KernelTime]) -> list[KernelTime]:
    return [t for t in times if not t.kernel.startswith(("h2d ", "d2h ", "copy2d "))]  # copies: not kernels


def test_is_a_kernel_profiler(ex):
    assert isinstance(ex, KernelProfiler)


def test_step_profile_lists_every_launch(ex):
    c = ex.config
    s = ex.new_state()
    try:
        ex.prefill(PROMPT[:10], s)
        before = ex.ops.launches
        ex.step(7, s)
        per_step = ex.ops.launches - before
        times = ex.profile_step(7, s)
        assert sum(t.launches for t in _kernels(times)) == per_step
        by_name = {t.kernel: t for t in times}
        n_gdn, n_attn = len(c.gdn_layers), len(c.attention_layers)
        ab = [by_name[k].launches for k in ("gemv_bf16_t1_n gdn/a_b_projection", "gemv_bf16_t1_na gdn/a_b_projection")
              if k in by_name]  # _na: reading the previous layer's deferred down sums
        assert sum(ab) == n_gdn
        assert sum(by_name[k].launches for k in ("gdn_conv_step", "gdn_conv_step_sums") if k in by_name) == n_gdn
        assert by_name["attention"].launches == 2 * n_attn
        assert not [k for k in by_name if k.startswith("rmsnorm") and "final_norm" not in k]  # folded into GEMVs
        assert not [k for k in by_name if k.startswith("copy2d")]  # q and gate are read where the GEMVs wrote them
        assert by_name["embedding"].launches == 1
        assert any(k.endswith("text/output_head") for k in by_name)
        assert {"h2d step", "d2h logits"} <= set(by_name)
        for t in times:
            assert t.seconds > 0, t
            assert t.bytes is not None and t.bytes > 0, t
        assert len(by_name) == len(times)  # one entry per label
    finally:
        ex.release(s)


def test_step_bytes_match_the_accounting(artifact, ex, acct):
    s = ex.new_state()
    try:
        ex.prefill(PROMPT, s)
        context = s.position + 1
        rec = record(ex, lambda: ex.step(11, s))
        # The GPU keeps the embedding table dequantized to bf16: its row is 2 * hidden bytes,
        # the accounting's the artifact's stored row.
        emb = 2 * ex.config.hidden - acct.weight_bytes["embedding_row"]
        # Merged input projections: a widened stack holds the narrower half at the wider width, a mixed one each
        # half's image (and padding); the profile counts those bytes, the accounting the artifact's.
        a, *_ = open_checked(artifact)
        try:
            wider = sum(p.nbytes - sum(len(a.tensor_bytes(s)) for s in p.sources) for p in ex.plan.placements if p.merged)
        finally:
            a.close()
        # tiny-dense: Q4 query_key halves of whole tiles over Q5 value_z / gate_value, mixed: the halves' bytes
        assert wider == 0 and all(p.q4_rows for p in ex.plan.placements if p.merged)
        assert rec.fixed_bytes() == acct.decode_step_bytes(context) + emb + wider
        total = sum(t.bytes for t in rec.times())
        assert acct.decode_step_bytes(context) < total < 1.1 * acct.decode_step_bytes(context)
        attn = next(t for t in rec.times() if t.kernel == "attention")
        c = ex.config
        assert attn.flops == len(c.attention_layers) * 4 * c.n_heads * c.head_dim * context
    finally:
        ex.release(s)


def test_profiled_step_moves_the_state_like_step(ex):
    a, b = ex.new_state(), ex.new_state()
    try:
        ex.prefill(PROMPT[:20], a)
        ex.prefill(PROMPT[:20], b)
        ex.step(9, a)
        ex.profile_step(9, b)
        assert a.position == b.position == 21
        np.testing.assert_array_equal(ex.step(4, a), ex.step(4, b))
    finally:
        ex.release(a)
        ex.release(b)


def test_profiled_prefill_moves_the_state_like_prefill(ex, acct):
    a, b = ex.new_state(), ex.new_state()
    try:
        ex.prefill(PROMPT[:40], a)
        times = ex.profile_prefill(PROMPT[:40], b)
        assert a.position == b.position == 40
        np.testing.assert_array_equal(ex.step(4, a), ex.step(4, b))
        assert all(t.seconds > 0 for t in times), times
        # The model math of the chunk; the executor may carry only the last token through the
        # last layer's tail, so a little less, never more.
        flops, want = sum(t.flops or 0 for t in times), acct.prefill_flops(40, 1024)
        assert 0.8 * want <= flops <= want, (flops, want)
    finally:
        ex.release(a)
        ex.release(b)


def test_ops_and_graph_flag_come_back_after_an_error(ex):
    real, graph = ex.ops, ex.cuda_graph
    s = ex.new_state()
    try:
        with pytest.raises(UsageError):
            ex.profile_step(ex.config.vocab, s)  # out of the vocabulary
        assert ex.ops is real and ex.program.ops is real and ex.states.ops is real
        assert ex.cuda_graph == graph
        assert s.position == 0
    finally:
        ex.release(s)


def test_bench_kernel_table(ex):
    """`inferno bench --kernel-table`'s runner takes the profile as it comes (rows, rates, ratios)."""
    from inferno.bench.limits import Limits
    from inferno.bench.runner import BenchSettings, profile_kernels

    settings = BenchSettings(prompt_tokens=20, decode_tokens=2, prefill_chunk=8, kernel_table=True)
    out = profile_kernels(ex, Limits(copy_gbps=1.0, gemm_tflops=1.0), settings, lambda _: None)
    assert out["available"]
    step = out["decode_step"]
    assert step["context"] == 21 and step["device_s"] > 0
    rows = {r["kernel"]: r for r in step["kernels"]}
    conv = rows.get("gdn_conv_step_sums", rows.get("gdn_conv_step"))  # _sums: after an accumulating GEMV
    assert conv["limit"] in ("copy", "gemm") and conv["ratio"] > 0
    assert out["prefill_chunk"]["tokens"] == 8 and out["prefill_chunk"]["kernels"]


@pytest.fixture(scope="module")
def nvfp4_ex(artifact):
    root = artifact.parent
    path = convert(root / "ckpt", root / "tiny-nv.ninfer", "nvfp4", progress=False)
    e = GpuExecutor(path, emulate=True, max_seqs=2, max_context=128, progress=False)
    a, _spec, config, expected = open_checked(path)
    a.close()
    yield e, account(config, expected, e.state_dtypes)
    e.close()


def test_nvfp4_identity_profile_sizes_every_weight_from_its_payload(nvfp4_ex):
    """The nvfp4 identity mixes NVFP4, BF16 and groupwise matrices: each GEMV's weight bytes are the
    device payload's (what the executor uploaded), and the step adds up to the accounting."""
    ex, acct = nvfp4_ex
    formats = {p.fmt for p in ex.plan.placements}
    assert {"NVFP4", "BF16"} <= formats
    s, s2 = ex.new_state(), ex.new_state()
    try:
        ex.prefill(PROMPT[:30], s)
        context = s.position + 1
        rec = record(ex, lambda: ex.step(5, s))
        chunk = ex.profile_prefill(PROMPT[:16], s2)
    finally:
        ex.release(s)
        ex.release(s2)
    by_role: dict[str, int] = {}
    for p in ex.plan.placements:  # device weight bytes per role, over the layers
        key = p.name.split("/", 3)[3] if p.name.startswith("text/layers/") else p.name
        by_role[key] = by_role.get(key, 0) + p.nbytes
    gemvs = [(label, w) for label, _, w in rec.records if label.startswith("gemv_")]
    assert {label.split()[0].split("_t1")[0] for label, _ in gemvs} >= {"gemv_mma_nvfp4", "gemv_bf16"}  # tile16-nvfp4-v1
    weights: dict[str, int] = {}
    for label, w in gemvs:
        weights[label.split()[1]] = weights.get(label.split()[1], 0) + w.fixed
    norm = 2 * ex.config.hidden  # a GEMV folding an RMSNorm also reads its weight (the first reader counts it)
    for role_, nbytes in weights.items():
        extra = nbytes - by_role[role_]
        assert extra % norm == 0 and 0 <= extra <= ex.config.n_layers * norm, role_
    # The accounting counts the artifact's fused NVFP4 input projections; the device holds them in
    # tile16-nvfp4-v1 (or split by rows, each half its own payload): a few bytes apart.
    emb = 2 * ex.config.hidden - acct.weight_bytes["embedding_row"]
    assert abs(rec.fixed_bytes() - acct.decode_step_bytes(context) - emb) < 1e-4 * acct.decode_step_bytes(context)
    dequant = [t for t in chunk if t.kernel.startswith("dequant NVFP4")]
    assert dequant and all(t.bytes > 0 for t in dequant)


@pytest.mark.parametrize("fmt, shape, want", [("NVFP4", (256, 128), 256 * 128 // 2 + 256 * 128 // 16 + 4),
                                              ("BF16", (3, 5), 30),
                                              ("Q4G64_F16S", (2, 64), None)])
def test_payload_nbytes(fmt, shape, want):
    from inferno.artifact.formats.groupwise import geometry

    got = payload_nbytes(fmt, *shape)
    assert got == (geometry(fmt, shape).nbytes if want is None else want)


def test_step_spans_watch_the_executor_without_changing_it(ex):
    """One span per step (from the step's first queued operation to the host's wait for its token),
    the phase set when it opened, the executor's operations back afterwards, the same tokens."""
    from inferno.engine.params import SamplingParams

    greedy = SamplingParams(temperature=0.0)
    a, b = ex.new_state(), ex.new_state()
    try:
        ta = ex.prefill_sample(PROMPT[:20], a, greedy, 0.0)
        tb = ex.prefill_sample(PROMPT[:20], b, greedy, 0.0)
        real = ex.ops
        with step_spans(ex, reserve=4) as clock:
            assert ex.ops is not real
            clock.phase = "decode"
            for _ in range(4):
                tb = ex.step_sample(tb, b, greedy, 0.0)
            clock.phase = "after"
            ex.ops.zero(ex.program.ws["argmax"])  # queued, never waited for: closed on exit
        assert ex.ops is real and ex.program.ops is real
        for _ in range(4):
            ta = ex.step_sample(ta, a, greedy, 0.0)
        assert ta == tb and a.position == b.position == 24
        spans = clock.spans
        assert [sp.phase for sp in spans] == ["decode"] * 4 + ["after"]  # the open span is closed on exit
        assert spans[0].idle_before is None and all(sp.idle_before >= 0 for sp in spans[1:])
        assert all(sp.seconds > 0 for sp in spans)
    finally:
        ex.release(a)
        ex.release(b)


class GateDriver:
    """The driver calls EventTimer makes, faked: fails the test if the host ever waits on a stream
    that is still held (on the GPU that would hang), and logs the order of holds, records and waits."""

    def __init__(self):
        self.host: dict[int, object] = {}
        self.log: list[str] = []
        self.want = 0  # the value the stream waits for; held while the gate word is below it
        self.word_ptr = 0
        self.next = 100

    def __getattr__(self, name):
        from cuda.bindings import driver as real

        return getattr(real, name)

    def _held(self) -> bool:
        import ctypes

        return ctypes.c_uint32.from_address(self.word_ptr).value < self.want

    def cuMemHostAlloc(self, n, flags):
        import ctypes

        buf = (ctypes.c_ubyte * n)()
        self.host[ctypes.addressof(buf)] = buf
        self.word_ptr = ctypes.addressof(buf)
        return (0, ctypes.addressof(buf))

    def cuMemFreeHost(self, ptr):
        self.host.pop(ptr)
        return (0,)

    def cuStreamWaitValue32(self, stream, addr, value, flags):
        assert int(addr) == self.word_ptr and not self._held()
        self.want = value
        self.log.append("hold")
        return (0,)

    def cuEventCreate(self, flags):
        from cuda.bindings import driver as real

        self.next += 1
        return (0, real.CUevent(self.next))

    def cuEventRecord(self, e, s):
        self.log.append("event")
        return (0,)

    def cuEventSynchronize(self, e):
        assert not self._held(), "waited on an event behind a held stream"
        return (0,)

    def cuEventElapsedTime(self, a, b):
        return (0, 0.5)

    def cuEventDestroy(self, e):
        return (0,)

    def cuStreamSynchronize(self, s):
        assert not self._held(), "synchronized a held stream"
        self.log.append("sync")
        return (0,)


def test_event_timer_holds_the_stream_per_batch_and_never_waits_on_it(monkeypatch):
    from inferno.bench.accounting import StateDtypes
    from inferno.cuda import Stream
    from inferno.cuda import driver as driver_mod
    from inferno.model.gpu.profile import EventTimer, RecordingOps

    fake = GateDriver()
    monkeypatch.setattr(driver_mod, "_cu", fake)
    stream = Stream(1)

    class Ops:
        def kernel(self):
            fake.log.append("launch")

        def write(self, buf, array):  # a copy from pageable memory: may wait for the stream
            assert not fake._held(), "host copy issued behind a held stream"
            fake.log.append("copy")

        def hidden_wait(self):  # waits for the device without saying so: only the watchdog helps
            deadline = time.monotonic() + 5
            while fake._held():
                assert time.monotonic() < deadline, "the watchdog never released the stream"
                time.sleep(0.01)
            fake.log.append("waited")

        def synchronize(self):
            stream.synchronize()

    timer = EventTimer(stream, batch=3)
    timer.WATCHDOG_S = 0.3
    rec = RecordingOps(Ops(), None, StateDtypes(), None, timer)
    for _ in range(4):
        rec.kernel()
    rec.synchronize()  # releases the held stream first
    rec.kernel()
    rec.write(DeviceBuffer(64, 16, "ws/step"), np.zeros(4, np.int32))
    rec.kernel()
    assert not timer.stalled
    rec.hidden_wait()
    assert timer.stalled
    timer.release()
    rec.resolve()
    timer.close()
    launch = ["event", "launch", "event"]
    assert fake.log == (["hold"] + 3 * launch + ["hold"] + launch + ["sync", "hold"] + launch
                        + ["event", "copy", "event", "hold"] + launch + ["event", "waited", "event", "sync"])
    assert [s for _, s, _ in rec.records] == [5e-4] * 8 and not fake.host
