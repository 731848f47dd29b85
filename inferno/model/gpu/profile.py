"""Per-kernel device times of one decode step / prefill call of the GPU executor (`inferno bench --kernel-table`).

`profile(executor, run)` runs `run()` (the executor's own `step` or `prefill`, so the sequence
state changes exactly as it would) EAGERLY, with the executor's `Ops` swapped for a
`RecordingOps` that brackets every queued device operation — kernels, the step-input upload,
the logits download, 2-D copies — with a pair of CUDA events (host clock on the emulator; the
stream is held while the host queues each batch of launches, so they run back to back as in the
CUDA graph and the events time the device, not Python's launch overhead), and notes what that
launch must move (weights + activations + state read and written, in the
kernels' storage dtypes) and compute (2*N*K per matrix, 7*dk*dv per GDN value head, 4*d per
attended key and query head). Launches are merged per kernel and role (the layer index is
dropped: "gemv_q4_t1 mlp/gate_up" over all layers), in the order they first ran. Operations
this module does not know (added to `Ops` later) are timed with unknown bytes and FLOPs.

`step_spans(executor)` is the other measurement, of the executor as it normally runs (CUDA graph
replay, device sampling, the token read back): while it is open, the executor's own `Ops` calls
are watched, and a CUDA event goes onto the stream before the first operation queued after the
host last waited for the stream, and another just before the host waits again. Each pair is a
`StepSpan`: the device time of the work the host queued between two waits (one decode step: the
step-input upload, the graph, the sampler, the token download), and the device time the stream
sat idle since the previous span ended. `inferno bench` turns the decode spans into host
overhead per step (`inferno.bench.profile.host_overhead`).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferno.artifact.formats import FORMATS, packed_nbytes
from inferno.bench.accounting import STATE_DTYPES, StateDtypes, kv_vector_bytes
from inferno.bench.profile import KernelTime, StepSpan
from inferno.cuda.memory import DeviceBuffer
from inferno.errors import ArtifactError
from inferno.model.config import ModelConfig

BF16, F32, I32 = 2, 4, 4
BLOCKING = frozenset({"upload", "download", "synchronize", "close"})  # host waits for the stream
UNTIMED = frozenset({"alloc", "preload_gemv", "side", "join", "folds_norm", "defers_residual",
                     "accumulates_inputs", "marker"})
# not device work (side / join: stream fork and join; folds_norm, defers_residual, accumulates_inputs:
# questions about the kernels; marker: a wait point)
HOST_COPIES = frozenset({"write", "read"})  # queued, timed, but never behind a held stream
OPS_ATTRS = ("ops", "pops")  # where the executor and its programs hold device operations (Ops, PrefillOps)


@dataclass
class Work:
    """What one launch moves and computes; `fixed` is the part the accounting counts (weights, as the
    device holds them, KV, state)."""

    bytes: int | None
    flops: int | None = None
    fixed: int = 0
    launches: int = 1


def payload_nbytes(fmt: str, n: int, k: int) -> int:
    """Stored bytes of an [n, k] weight in `fmt` (its one registered layout: codes, scales, padding,
    an NVFP4 divisor), as the device holds it and a GEMV or dequant kernel reads it."""
    layouts = FORMATS.get(fmt)
    if not layouts:
        raise ArtifactError(f"unknown weight format {fmt!r} (registered: {', '.join(FORMATS)})")
    return packed_nbytes(fmt, layouts[0], (n, k))


def gemv_variant(fmt: str, epilogue: str) -> str:
    """The name of the one-column GEMV kernel `CudaOps.gemv` launches for `fmt` and `epilogue`."""
    if fmt == "BF16":
        from inferno.kernels.gemv_bf16_variants import variant_name as bf16_name

        return bf16_name(1, epilogue)
    from inferno.kernels import gemv_nvfp4_variants as nvfp4

    if fmt == nvfp4.FORMAT:
        return nvfp4.variant_name(epilogue, 1)
    from inferno.kernels.gemv_variants import variant_name

    return variant_name(fmt, epilogue, 1)


def role(buf: DeviceBuffer) -> str:
    """A buffer's name without the layer prefix or a view's range ('text/layers/3/mlp/down' -> 'mlp/down')."""
    name = buf.name.split("[")[0]
    if name.startswith("text/layers/"):
        return name.split("/", 3)[3]
    return name


class HostTimer:
    """Host clock marks (the emulator runs each operation synchronously)."""

    def start(self, hold: bool = True) -> Any:
        return time.perf_counter()

    def stop(self, mark: Any) -> Any:
        return (mark, time.perf_counter())

    def seconds(self, span: Any) -> float:
        return span[1] - span[0]

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class EventTimer:
    """A pair of CUDA events on the executor's stream around each launch, with the stream held back
    while the host queues each batch of `batch` launches (`cuStreamWaitValue32` on a word of pinned
    host memory, written to let it go). Eager Python launches are slower than small kernels: without
    the hold the GPU idles between launches and an event pair would time the host's launch overhead
    too; with it, a batch runs back to back on the device. Calls that may wait for the stream
    (synchronize, host copies) release it first; a watchdog releases a hold older than `WATCHDOG_S`
    seconds (something waited on the device unseen), so a missed case costs a stall, never a hang."""

    WATCHDOG_S = 5.0

    def __init__(self, stream: Any, batch: int = 64):
        from inferno.cuda import PinnedBuffer

        self.stream, self.batch = stream, batch
        self.events: list = []
        self._pinned = PinnedBuffer(4, "profile gate")
        self._word = self._pinned.array(np.uint32, (1,))
        self._word[0] = 0
        self._value = 0  # the value the stream waits for, when held
        self._held = False
        self._held_since = 0.0
        self._queued = 0
        self.gated = True  # False when the driver refused the stream wait (times then include host gaps)
        self.stalled = False  # the watchdog had to release the stream
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="profile gate watchdog", daemon=True)
        self._watchdog.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.25):
            with self._lock:
                if self._held and time.monotonic() - self._held_since > self.WATCHDOG_S:
                    self.stalled = True
                    self._word[0] = self._value
                    self._held = False
                    print("kernel profile: the host waited on the held stream; released it (this batch's "
                          "times include host gaps)", file=sys.stderr)

    def _hold(self) -> None:
        if self._held or not self.gated:
            return
        from inferno.cuda.driver import driver
        from inferno.cuda.stream import stream_handle

        cu = driver()
        try:  # pinned memory has the same address on the device (unified addressing)
            (err,) = cu.cuStreamWaitValue32(stream_handle(self.stream), cu.CUdeviceptr(self._pinned.ptr),
                                            self._value + 1, cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
        except Exception as e:  # a binding that takes other argument types: profile without the hold
            err = e
        if err:
            self.gated = False
            print(f"kernel profile: cannot hold the stream ({err!r}); kernel times include host launch gaps",
                  file=sys.stderr)
            return
        with self._lock:
            self._value += 1
            self._held, self._held_since, self._queued = True, time.monotonic(), 0

    def release(self) -> None:
        """Let the held stream run (the host is done queueing, or about to wait on the device)."""
        with self._lock:
            if self._held:
                self._word[0] = self._value
                self._held = False

    def _record(self):
        from inferno.cuda import Event

        e = Event()
        self.events.append(e)
        return e.record(self.stream)

    def start(self, hold: bool = True) -> Any:
        """Mark the start of a launch; `hold=False` (host copies) leaves the stream running."""
        if hold:
            self._hold()
        return self._record()

    def stop(self, mark: Any) -> Any:
        span = (mark, self._record())
        self._queued += 1
        if self._queued >= self.batch:
            self.release()
        return span

    def seconds(self, span: Any) -> float:
        from inferno.cuda import Event

        span[1].synchronize()
        return Event.elapsed_ms(span[0], span[1]) / 1e3

    def close(self) -> None:
        """Release the stream, wait for it, free the events and the gate word."""
        from inferno.cuda.errors import CudaError

        self._stop.set()
        self._watchdog.join()
        self.release()
        try:
            self.stream.synchronize()  # the stream no longer reads the gate word
        except CudaError:
            pass  # only after a failed run (a successful one was synchronized): its error is on its way up
        for e in self.events:
            e.close()
        self.events.clear()
        self._pinned.close()


class RecordingOps:
    """Wraps an `Ops`: device operations are timed and recorded, everything else passes through."""

    def __init__(self, ops: Any, config: ModelConfig, dtypes: StateDtypes, step_buffer: DeviceBuffer | None,
                 timer: Any):
        self.ops, self.c, self.dtypes, self.step_buffer, self.timer = ops, config, dtypes, step_buffer, timer
        self.records: list[tuple[str, Any, Work]] = []
        self.length = 0  # attended tokens of the current step (from the step inputs the host queues)
        self._norms: set[int] = set()  # norm weights a GEMV with the norm folded in has read (counted once)

    def sibling(self, ops: Any) -> RecordingOps:
        """A RecordingOps over another operations object (the prefill kernels) into the same recording."""
        other = RecordingOps(ops, self.c, self.dtypes, self.step_buffer, self.timer)
        other.records = self.records
        return other

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.ops, name)
        if name in BLOCKING:
            def blocking(*args, **kwargs):
                self.timer.release()  # never wait on a held stream
                return attr(*args, **kwargs)

            return blocking
        if name.startswith("_") or name in UNTIMED or not callable(attr):
            return attr

        def timed(*args, **kwargs):
            label, work = self._describe(name, args, kwargs)
            if name in HOST_COPIES:
                self.timer.release()  # a copy from / to pageable memory may wait for the stream
            mark = self.timer.start(hold=name not in HOST_COPIES)
            out = attr(*args, **kwargs)
            self.records.append((label, self.timer.stop(mark), work))
            return out

        return timed

    def _describe(self, name: str, args: tuple, kwargs: dict) -> tuple[str, Work]:
        how = getattr(self, f"_w_{name}", None)
        if how is None:
            return name, Work(None)
        return how(*args, **kwargs)

    # ---- what each operation moves --------------------------------------------------------------
    def _w_write(self, buf, array):
        if self.step_buffer is not None and buf.ptr == self.step_buffer.ptr:
            self.length = int(array[3])  # step record: token, position, slot, length, page table
        return "h2d " + buf.name.removeprefix("ws/"), Work(array.nbytes)

    def _w_read(self, out, buf):
        return "d2h " + buf.name.removeprefix("ws/"), Work(out.nbytes)

    def _w_zero(self, buf):
        return "memset", Work(buf.nbytes)

    def _w_copy2d(self, dst, dst_pitch, src, src_pitch, width, height):
        return "copy2d " + role(dst).removeprefix("ws/"), Work(2 * width * height)

    def _w_embedding(self, ids, table, out, vocab, hidden):
        return "embedding", Work(I32 + 2 * hidden * BF16, fixed=hidden * BF16)

    def _w_rmsnorm(self, x, w, y, n, eps):
        return f"rmsnorm {role(w)}", Work(3 * n * BF16, fixed=self._norm_bytes((w, eps), n))

    def _w_gemv(self, fmt, epilogue, w, x, y, n, k, r=None, tiled=False, norm=None, add=None, q4_rows=0):
        m = n // 2 if epilogue == "swiglu" else n
        # The bytes of the matrix as the device holds it (fmt, [n, k]): for merged input projections
        # (residency.MERGED_INPUTS) a widened stack counts its narrower half at the wider width, a mixed one
        # (q4_rows) its two images; inferno/bench/accounting.py keeps counting the artifact's own bytes (the roofline).
        if tiled:
            from inferno.kernels import gemv_mma_nvfp4_variants as N
            from inferno.kernels.gemv_mma_variants import variant_name
            from inferno.kernels.tiled import mixed_nbytes, tiled_geometry

            name = (N.variant_name(epilogue, 1, norm is not None) if fmt == "NVFP4"
                    else variant_name(fmt, epilogue, 1, norm is not None, add is not None))
            if q4_rows and epilogue == "accumulate" and norm is not None:  # CudaOps.gemv's one `_lo4` launch
                name += "_lo4"
            weights = mixed_nbytes(n, k, q4_rows) if q4_rows else tiled_geometry(fmt, n, k).nbytes
        else:
            weights, name = payload_nbytes(fmt, n, k), gemv_variant(fmt, epilogue)
        weights += self._norm_bytes(norm, k)
        act = (k + m + (m if r is not None else 0)) * BF16
        if epilogue == "accumulate":  # y fp32, added to (read and written in L2)
            act += m * (2 * F32 - BF16)
        if add is not None:  # s read, xo and z written
            act += k * (2 * F32 + BF16)
        return f"{name} {role(w)}", Work(weights + act, 2 * n * k, fixed=weights)

    def _w_linear_bf16(self, x, w, y, n, k, norm=None, sums=None):
        from inferno.kernels.gemv_bf16_variants import variant_name

        weights = n * k * BF16 + self._norm_bytes(norm, k)
        return (f"{variant_name(1, 'plain', norm is not None, sums is not None)} {role(w)}",
                Work(weights + (k + n) * BF16 + (k * F32 if sums is not None else 0), 2 * n * k, fixed=weights))

    def _norm_bytes(self, norm, k: int) -> int:
        """A norm's weight bytes, counted by the first launch of the recording that reads it (an rmsnorm,
        a GEMV folding it, the GDN step computing a|b)."""
        if norm is None or norm[0].ptr in self._norms:
            return 0
        self._norms.add(norm[0].ptr)
        return k * BF16

    def _w_gdn_conv_step(self, x, conv_state, conv_w, z, a, b, a_log, dt_bias, norm_w, state, slots, sync, out,
                         k_heads, v_heads, n_slots, eps, sums=False):
        c = self.c
        dk, dv = c.gdn_k_dim, c.gdn_v_dim
        channels = 2 * k_heads * dk + v_heads * dv
        window = 2 * (c.conv_kernel - 1) * channels * STATE_DTYPES[self.dtypes.conv]  # read + written
        rec = 2 * v_heads * dk * dv * STATE_DTYPES[self.dtypes.recurrent]  # read + written
        weights = c.conv_kernel * channels * BF16 + 2 * v_heads * F32 + dv * BF16  # conv, a_log, dt_bias, norm
        act = (channels + 2 * v_heads * dv + 2 * v_heads) * BF16  # x (q k v), z, out, a b
        if sums:  # x and z fp32 sums, read and zeroed
            act += (channels + v_heads * dv) * (2 * F32 - BF16)
        fixed = window + rec + weights
        flops = 2 * c.conv_kernel * channels + 7 * v_heads * dk * dv
        return "gdn_conv_step" + ("_sums" if sums else ""), Work(I32 + act + fixed, flops, fixed=fixed)

    def _w_attn_prep(self, qg, k, v, q_norm, k_norm, positions, lens, page_table, kv, q, g):
        d = g.head_dim
        new_kv = 2 * g.n_kv_heads * kv_vector_bytes(d, self.dtypes.kv)
        act = (g.n_heads * d + 2 * g.n_kv_heads * d) * BF16 + g.n_heads * d * F32
        return "attn_prep", Work(3 * I32 + act + 2 * d * BF16 + new_kv, fixed=new_kv + 2 * d * BF16)

    def _w_attention(self, q_proj, k, v, q_norm, k_norm, positions, lens, page_table, kv, q, part_o, part_lse,
                     gate, out, g, sums=False):
        """The decode kernel (prep folded in: q, k, v in, the new K/V row out) and the combine (`sums`: q, k, v
        and gate read as fp32 sums and zeroed)."""
        _, prep = self._w_attn_prep(q_proj, k, v, q_norm, k_norm, positions, lens, page_table, kv, q, g)
        d, hq, n = g.head_dim, g.n_heads, self.length
        cache = n * 2 * g.n_kv_heads * kv_vector_bytes(d, self.dtypes.kv)  # as the accounting counts the context
        table = -(-n // 64) * I32
        partial = 2 * g.splits * hq * (d + 1) * F32  # written by the split kernel, read by the combine
        act = 2 * hq * d * BF16  # gate, out
        if sums:  # q, k, v, gate fp32 read and zeroed instead of bf16 read
            act += (2 * hq + 2 * g.n_kv_heads) * d * (2 * F32 - BF16)
        return "attention", Work(prep.bytes + table + cache + partial + act, 4 * hq * d * n,
                                 fixed=prep.fixed + cache, launches=2)

    def _w_argmax(self, x, out, n):
        return "argmax", Work(n * BF16 + I32)

    # ---- prefill operations (prefill.py's PrefillOps) ---------------------------------------------
    def _w_embed_rows(self, ids, table, out, tokens, vocab, hidden):
        return "embed_rows", Work(tokens * (I32 + 2 * hidden * BF16), fixed=tokens * hidden * BF16)

    def _w_rmsnorm_rows(self, x, w, y, rows, n, eps):
        return f"rmsnorm_rows {role(w)}", Work((2 * rows + 1) * n * BF16, fixed=n * BF16)

    def _w_add_rmsnorm_rows(self, x, r, w, y, h, rows, n, eps):
        return f"add_rmsnorm_rows {role(w)}", Work((4 * rows + 1) * n * BF16, fixed=n * BF16)

    def _w_dequant(self, fmt, w, out, n, k, tiled=False):
        if tiled:
            from inferno.kernels.tiled import tiled_geometry

            weights = tiled_geometry(fmt, n, k).nbytes
        else:
            weights = payload_nbytes(fmt, n, k)
        layout = (" tile16-nvfp4-v1" if fmt == "NVFP4" else " tile16-v1") if tiled else ""
        return f"dequant {fmt}{layout} {role(w)}", Work(weights + n * k * BF16, fixed=weights)

    def _w_gemm(self, a, b, c, m, n, k):
        return f"gemm {role(b)}", Work((m * k + n * k + m * n) * BF16, 2 * m * n * k)

    def _w_silu_mul(self, gu, out, rows, inter):
        return "silu_mul", Work(3 * rows * inter * BF16)

    def _w_gdn_conv_rows(self, x, conv_state, conv_w, out, tokens, channels, n_slots, slot, x_stride):
        c = self.c
        state = 2 * (c.conv_kernel - 1) * channels * STATE_DTYPES[self.dtypes.conv]
        weights = c.conv_kernel * channels * BF16
        return f"gdn_conv_rows {role(conv_w)}", Work(2 * tokens * channels * BF16 + state + weights,
                                                     2 * c.conv_kernel * channels * tokens, fixed=state + weights)

    def _w_gdn_chunk(self, qkv, z, a, b, a_log, dt_bias, norm_w, state, out, tokens, k_heads, v_heads, n_slots,
                     slot, eps, z_stride, ab_stride):
        c = self.c
        dk, dv = c.gdn_k_dim, c.gdn_v_dim
        rec = 2 * v_heads * dk * dv * STATE_DTYPES[self.dtypes.recurrent]
        weights = 2 * v_heads * F32 + dv * BF16
        act = tokens * (2 * k_heads * dk + 3 * v_heads * dv + 2 * v_heads) * BF16
        return "gdn_chunk", Work(act + weights + rec, 7 * v_heads * dk * dv * tokens, fixed=rec + weights)

    def _w_attn_prep_rows(self, qg, k, v, q_norm, k_norm, positions, lens, tables, kv, q, g, tokens):
        label, one = self._w_attn_prep(qg, k, v, q_norm, k_norm, positions, lens, tables, kv, q, g)
        return "attn_prep_rows", Work(tokens * one.bytes, fixed=tokens * one.fixed)

    def _w_attn_prefill(self, q, gate, kv, pages, out, tokens, prefix, g):
        d, hq = g.head_dim, g.n_heads
        cache = (prefix + tokens) * 2 * g.n_kv_heads * kv_vector_bytes(d, self.dtypes.kv)
        keys = tokens * prefix + tokens * (tokens + 1) // 2  # causal: token i sees prefix + i + 1 keys
        act = tokens * hq * d * (F32 + 2 * BF16)  # q (fp32), gate, out
        return "attn_prefill", Work(cache + act, 4 * hq * d * keys, fixed=cache)

    # ---- results ----------------------------------------------------------------------------------
    def resolve(self) -> None:
        """Turn every launch's timer marks into seconds (after the device finished them)."""
        self.records = [(label, span if isinstance(span, float) else self.timer.seconds(span), work)
                        for label, span, work in self.records]

    def times(self) -> list[KernelTime]:
        """One KernelTime per label (launches merged, in first-run order); after `resolve()`."""
        merged: dict[str, list] = {}
        for label, seconds, work in self.records:
            m = merged.setdefault(label, [0.0, 0, 0, 0])
            m[0] += seconds
            m[1] = None if m[1] is None or work.bytes is None else m[1] + work.bytes
            m[2] = None if m[2] is None or work.flops is None else m[2] + work.flops
            m[3] += work.launches
        return [KernelTime(label, s, b, f or None, n) for label, (s, b, f, n) in merged.items()]

    def fixed_bytes(self) -> int:
        """Bytes of weights, KV cache and GDN state over the recorded launches (what the accounting counts)."""
        return sum(w.fixed for _, _, w in self.records)


def profile(executor: Any, run: Callable[[], Any]) -> list[KernelTime]:
    """Run `run()` on `executor` eagerly with every device operation timed; the merged kernel times."""
    return record(executor, run).times()


def record(executor: Any, run: Callable[[], Any]) -> RecordingOps:
    """Run `run()` with the executor's operations swapped for `RecordingOps` (one per operations
    object, sharing one recording) wherever the executor's parts hold them (`OPS_ATTRS`); the
    recording of the decode ops, resolved to seconds."""
    real = executor.ops
    stream = getattr(real, "stream", None)
    timer = EventTimer(stream) if stream is not None else HostTimer()
    rec = RecordingOps(real, executor.config, executor.state_dtypes,
                       getattr(executor.program, "step_buffer", None), timer)
    wrappers = {id(real): rec}
    swaps: list[tuple[Any, str, Any]] = []
    for holder in [executor, *vars(executor).values()]:
        for attr in OPS_ATTRS:
            ops = getattr(holder, attr, None)
            if ops is None or not (ops is real or getattr(ops, "ops", None) is real):
                continue
            if id(ops) not in wrappers:
                wrappers[id(ops)] = rec.sibling(ops)
            swaps.append((holder, attr, ops))
    graphs = executor.cuda_graph
    try:
        for holder, attr, ops in swaps:
            setattr(holder, attr, wrappers[id(ops)])
        executor.cuda_graph = False
        run()
        timer.release()
        real.synchronize()
        rec.resolve()
        return rec
    finally:
        executor.cuda_graph = graphs
        for holder, attr, ops in reversed(swaps):
            setattr(holder, attr, ops)
        timer.close()


# ---- device spans of the executor's normal run (graph replay) ----------------------------------------
HOST_WAITS = frozenset({"synchronize", "download"})  # the host waits for the stream: the open span ends
SPAN_PASS = frozenset({"alloc", "upload", "preload_gemv", "close", "side", "join", "folds_norm",
                       "defers_residual", "accumulates_inputs"})  # not queued stream work


class SpanClock:
    """Marks device spans on `stream` (CUDA events; the host clock when `stream` is None, on the
    emulator, whose operations run synchronously). A span opens at the first `begin` after the
    last `end` and carries the `phase` set when it opened. `reserve` events are made up front, so
    the measured loop does not pay for creating them."""

    def __init__(self, stream: Any, reserve: int = 0):
        self.stream = stream
        self.phase = ""
        self.spans: list[StepSpan] = []
        self._free: list = []
        self._used: list = []
        self._open: tuple[str, Any] | None = None
        self._marks: list[tuple[str, Any, Any]] = []
        if stream is not None:
            from inferno.cuda import Event

            self._free = [Event() for _ in range(reserve)]

    def _mark(self) -> Any:
        if self.stream is None:
            return time.perf_counter()
        if self._free:
            e = self._free.pop()
        else:
            from inferno.cuda import Event

            e = Event()
        self._used.append(e)
        return e.record(self.stream)

    def begin(self) -> None:
        """Work is about to be queued: open a span unless one is open."""
        if self._open is None:
            self._open = (self.phase, self._mark())

    def end(self) -> None:
        """The host is about to wait for the stream: close the open span, if any."""
        if self._open is not None:
            phase, start = self._open
            self._marks.append((phase, start, self._mark()))
            self._open = None

    def _seconds(self, a: Any, b: Any) -> float:
        if self.stream is None:
            return b - a
        from inferno.cuda import Event

        b.synchronize()
        return Event.elapsed_ms(a, b) / 1e3

    def resolve(self) -> list[StepSpan]:
        """The closed spans in order, with the idle time before each (after the device finished them)."""
        self.spans = []
        prev_end = None
        for phase, start, stop in self._marks:
            idle = None if prev_end is None else self._seconds(prev_end, start)
            self.spans.append(StepSpan(phase, self._seconds(start, stop), idle))
            prev_end = stop
        self._marks.clear()
        return self.spans

    def close(self) -> None:
        for e in self._used + self._free:
            e.close()
        self._used.clear()
        self._free.clear()


class SpanOps:
    """Wraps an `Ops`: every operation that queues work opens a span of `clock`, every host wait
    closes it; the calls themselves pass through unchanged."""

    def __init__(self, ops: Any, clock: SpanClock):
        self.ops, self.clock = ops, clock

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.ops, name)
        if name.startswith("_") or name in SPAN_PASS or not callable(attr):
            return attr
        if name == "marker":  # waiting on a marker is a host wait: it ends the open span (at the stream's tail)
            def waited_on() -> Callable[[], None]:
                wait = attr()

                def end_then_wait() -> None:
                    self.clock.end()
                    wait()

                return end_then_wait

            return waited_on
        mark = self.clock.end if name in HOST_WAITS else self.clock.begin

        def marked(*args, **kwargs):
            mark()
            return attr(*args, **kwargs)

        return marked


@contextmanager
def step_spans(executor: Any, reserve: int = 0) -> Iterator[SpanClock]:
    """Watch `executor`'s own device operations (its `ops`, as it runs: graphs stay on) and mark a
    span per stretch of queued work between host waits; set `clock.phase` to tag the spans that
    follow. On exit the stream is drained and `clock.spans` holds the resolved spans. `reserve`:
    spans to make events for up front (about the number of steps)."""
    real = executor.ops
    clock = SpanClock(getattr(real, "stream", None), 2 * reserve + 8)
    executor.ops = SpanOps(real, clock)
    try:
        yield clock
        clock.end()
        real.synchronize()
        clock.resolve()
    finally:
        executor.ops = real
        clock.close()
