"""CPU: the GPU executor's per-kernel profile (inferno/model/gpu/profile.py) on the emulated
executor: every launch of a step is listed once, the bytes of weights + KV + GDN state match the
bench accounting, activations add only a little on top, and the sequence state moves exactly as
`step` / `prefill` move it."""

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
from inferno.model.gpu.profile import record

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
        assert by_name["gemv_bf16_t1 gdn/a_b_projection"].launches == n_gdn
        assert by_name["gdn_step"].launches == n_gdn
        assert by_name["attn_decode+combine"].launches == 2 * n_attn
        assert by_name["rmsnorm input_norm"].launches == c.n_layers
        assert by_name["copy2d qg"].launches == 2 * n_attn
        assert by_name["embedding"].launches == 1
        assert any(k.endswith("text/output_head") for k in by_name)
        assert {"h2d step", "d2h logits"} <= set(by_name)
        for t in times:
            assert t.seconds > 0, t
            assert t.bytes is not None and t.bytes > 0, t
        assert len(by_name) == len(times)  # one entry per label
    finally:
        ex.release(s)


def test_step_bytes_match_the_accounting(ex, acct):
    s = ex.new_state()
    try:
        ex.prefill(PROMPT, s)
        context = s.position + 1
        rec = record(ex, lambda: ex.step(11, s))
        # The GPU keeps the embedding table dequantized to bf16: its row is 2 * hidden bytes,
        # the accounting's the artifact's stored row.
        emb = 2 * ex.config.hidden - acct.weight_bytes["embedding_row"]
        assert rec.fixed_bytes() == acct.decode_step_bytes(context) + emb
        total = sum(t.bytes for t in rec.times())
        assert acct.decode_step_bytes(context) < total < 1.1 * acct.decode_step_bytes(context)
        attn = next(t for t in rec.times() if t.kernel == "attn_decode+combine")
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
    out = profile_kernels(ex, Limits(copy_gbps=1.0, gemm_tflops=1.0), settings, 1.0, lambda _: None)
    assert out["available"]
    step = out["decode_step"]
    assert step["context"] == 21 and step["device_s"] > 0
    rows = {r["kernel"]: r for r in step["kernels"]}
    assert rows["gdn_step"]["limit"] in ("copy", "gemm") and rows["gdn_step"]["ratio"] > 0
    assert out["prefill_chunk"]["tokens"] == 8 and out["prefill_chunk"]["kernels"]


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
