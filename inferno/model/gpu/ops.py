"""The device operations the GPU executor's decode path is written in, on CUDA (`CudaOps`).

`layers.py` speaks only to this interface, so the same launch sequence runs on the GPU
(`CudaOps`: our kernels, one stream, capturable into a CUDA graph) and on the CPU
(`inferno.model.gpu.emulator.EmulatedOps`: numpy models of the same kernels over an emulated
device memory), which lets the wiring — buffer offsets, row orders, state layouts — be tested
against the reference executor on machines without a GPU.

Every kernel this executor needs is resolved when `CudaOps` is made, so a missing kernel fails
at start-up with an error that names it, not in the middle of a generation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ContextManager, Protocol

import numpy as np

from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import DeviceBuffer
from inferno.errors import InfernoError, NotBuiltError
from inferno.kernels.gemv_mma_variants import ACCUMULATE, Addend
from inferno.kernels.tiled import MIXED_HIGH
from inferno.model.config import ModelConfig


@dataclass(frozen=True)
class AttnGeometry:
    """Static shapes of one attention call (batch 1)."""

    n_heads: int
    n_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    eps: float
    pages_per_seq: int  # page-table width
    n_pages: int  # pages in each layer's pool
    splits: int  # split-K partitions of the decode kernel


Norm = tuple[DeviceBuffer, float]  # (zero-centred RMSNorm weight bf16 [k], eps) a GEMV applies to x first

FOLD_NORM_ENV = "INFERNO_FOLD_NORM"  # 0: a separate rmsnorm launch before the GEMVs (A/B)


def folds_norm_shape(fmt: str, epilogue: str, tiled: bool, k: int) -> bool:
    """Whether a `_n` kernel family covers this GEMV: tensor-core Q4-Q6 (tile16-v1) or NVFP4
    (tile16-nvfp4-v1) plain or swiglu with K <= NORM_KMAX, or bf16 plain."""
    from inferno.kernels import gemv_mma_variants as M

    if fmt == "BF16":
        return epilogue == "plain"
    return (tiled and epilogue in ("plain", "swiglu") and (fmt == "NVFP4" or (fmt in M.FORMATS and M.FORMATS[fmt][1] != 8))
            and k <= M.NORM_KMAX)


DEFER_ENV = "INFERNO_DEFER"  # 0: every residual GEMV finishes its own rows (A/B of deferred residuals)


Reader = tuple[str, str, bool]  # (format, epilogue, tiled) of a GEMV reading a residual stream, its RMSNorm folded


def defers_residual_shape(out_fmt: str, out_tiled: bool, out_k: int, readers: list[Reader], k: int) -> bool:
    """Whether a residual GEMV (out_fmt, [k, out_k]) can leave its sums to the GEMVs that read its output
    (`readers`, K = k, each folding the RMSNorm): the writer tensor-core Q4-Q6 (tile16-v1), each reader that
    too (plain or swiglu) or bf16 plain, K within NORM_KMAX; unless $INFERNO_DEFER=0."""
    import os

    from inferno.kernels import gemv_mma_variants as M

    def q(fmt: str, tiled: bool) -> bool:
        return tiled and fmt in M.FORMATS and M.FORMATS[fmt][1] != 8

    def reads(fmt: str, epilogue: str, tiled: bool) -> bool:
        return epilogue == "plain" if fmt == "BF16" else q(fmt, tiled) and epilogue in ("plain", "swiglu")

    return (os.environ.get(DEFER_ENV, "1") != "0" and q(out_fmt, out_tiled) and out_k <= M.KMAX
            and k <= M.NORM_KMAX and bool(readers) and all(reads(*r) for r in readers))


def accumulates_inputs_shape(fmt: str, tiled: bool, k: int) -> bool:
    """Whether a merged input projection (fmt, K = k, the RMSNorm folded) can leave fp32 sums to the mixer that
    reads it (GDN conv + step, or the attention decode and combine): tensor-core Q4-Q6 (tile16-v1), K within
    NORM_KMAX; unless $INFERNO_DEFER=0."""
    import os

    from inferno.kernels import gemv_mma_variants as M

    return (os.environ.get(DEFER_ENV, "1") != "0" and tiled and fmt in M.FORMATS
            and M.FORMATS[fmt][1] != 8 and k <= M.NORM_KMAX)


def fold_norms() -> bool:
    """The A/B switch $INFERNO_FOLD_NORM (on unless 0), read when the operations are made."""
    import os

    return os.environ.get(FOLD_NORM_ENV, "1") != "0"



class Ops(Protocol):
    """Device memory plus the kernels of one decode step; all work is queued in order."""

    def alloc(self, name: str, nbytes: int) -> DeviceBuffer: ...
    def upload(self, buf: DeviceBuffer, array: np.ndarray) -> None: ...  # queued; `array` is free again at return
    def download(self, buf: DeviceBuffer, dtype: Any, shape: tuple[int, ...]) -> np.ndarray: ...  # waits for queued work
    def zero(self, buf: DeviceBuffer) -> None: ...
    def write(self, buf: DeviceBuffer, array: np.ndarray) -> None: ...  # queued; `array` stays untouched until synced
    def read(self, out: np.ndarray, buf: DeviceBuffer) -> None: ...  # queued; valid after synchronize()
    def synchronize(self) -> None: ...
    def marker(self) -> Callable[[], None]: ...  # queued; calling it waits for the work queued before it
    def side(self) -> ContextManager[None]: ...  # launches inside may run concurrently with the next ones ...
    def join(self) -> None: ...  # ... until here
    def copy2d(self, dst: DeviceBuffer, dst_pitch: int, src: DeviceBuffer, src_pitch: int, width: int,
               height: int) -> None: ...
    def embedding(self, ids: DeviceBuffer, table: DeviceBuffer, out: DeviceBuffer, vocab: int, hidden: int) -> None: ...
    def rmsnorm(self, x: DeviceBuffer, w: DeviceBuffer, y: DeviceBuffer, n: int, eps: float) -> None: ...
    # tiled: w in tile16-v1; norm: x is RMS-normed first; epilogue "accumulate": y fp32 [n] += W x (sums left for
    # the next GEMV, whose `add` = Addend(s=y, xo, z) makes its x bf16(x + s), writes that to xo, zeroes z);
    # q4_rows: rows [0, q4_rows) of a tiled w are a Q4 tile16-v1 image ahead of the rest (merge.py's mixed stack)
    def gemv(self, fmt: str, epilogue: str, w: DeviceBuffer, x: DeviceBuffer, y: DeviceBuffer, n: int, k: int,
             r: DeviceBuffer | None = None, tiled: bool = False, norm: Norm | None = None,
             add: Addend | None = None, q4_rows: int = 0) -> None: ...
    def linear_bf16(self, x: DeviceBuffer, w: DeviceBuffer, y: DeviceBuffer, n: int, k: int,
                    norm: Norm | None = None,
                    sums: DeviceBuffer | None = None) -> None: ...  # sums (with norm): x is bf16(x + sums)
    def folds_norm(self, fmt: str, epilogue: str, tiled: bool, k: int) -> bool: ...  # gemv / linear_bf16 take norm=
    # whether a residual GEMV (out_fmt [k, out_k]) may `accumulate` for the GEMVs reading its output (`readers`,
    # K = k): gemv takes add=, linear_bf16 sums=
    def defers_residual(self, out_fmt: str, out_tiled: bool, out_k: int, readers: list[Reader],
                        k: int) -> bool: ...
    # sums: x and z are fp32, the sums of an accumulating q|k|v|z GEMV, rounded to bf16 and zeroed by the call
    def gdn_conv_step(self, x: DeviceBuffer, conv_state: DeviceBuffer, conv_w: DeviceBuffer, z: DeviceBuffer,
                      a: DeviceBuffer, b: DeviceBuffer, a_log: DeviceBuffer, dt_bias: DeviceBuffer,
                      norm_w: DeviceBuffer, state: DeviceBuffer, slots: DeviceBuffer, sync: DeviceBuffer,
                      out: DeviceBuffer, k_heads: int, v_heads: int, n_slots: int, eps: float,
                      sums: bool = False) -> None: ...
    # whether the merged input GEMV of a `mixer` ("gdn" or "attention") layer (fmt, K = k, the RMSNorm folded) may
    # accumulate for gdn_conv_step(sums=True) or attention(sums=True)
    def accumulates_inputs(self, mixer: str, fmt: str, tiled: bool, k: int) -> bool: ...
    # attention: q_proj and gate bf16 [n_heads * head_dim] (head h at h * head_dim, as the projections
    # write them), k and v [n_kv_heads * head_dim]; q is the fp32 [n_heads, head_dim] scratch prep fills
    # q/k norm + RoPE, k and v appended to the paged cache, split-K decode into part_o / part_lse (q: the
    # normed q, fp32), the partials merged and gated by sigmoid(gate) into out
    def attention(self, q_proj: DeviceBuffer, k: DeviceBuffer, v: DeviceBuffer, q_norm: DeviceBuffer,
                  k_norm: DeviceBuffer, positions: DeviceBuffer, lens: DeviceBuffer, page_table: DeviceBuffer,
                  kv: DeviceBuffer, q: DeviceBuffer, part_o: DeviceBuffer, part_lse: DeviceBuffer,
                  gate: DeviceBuffer, out: DeviceBuffer, g: AttnGeometry,
                  sums: bool = False) -> None: ...  # sums: q_proj, k, v, gate fp32 sums, zeroed by the call
    def argmax(self, x: DeviceBuffer, out: DeviceBuffer, n: int) -> None: ...
    def sample(self, logits: DeviceBuffer, counts: DeviceBuffer, scratch: DeviceBuffer, out: DeviceBuffer, n: int,
               params: Any, u: float) -> None: ...  # out[0] = token, counts[token] += 1


def _missing(kernel: str, owner: str, why: str) -> NotBuiltError:
    return NotBuiltError(f"the GPU executor needs the {kernel} kernel ({owner}), which {why}; "
                         "run with --device cpu until it is built")


class CudaOps:
    """`Ops` on one GPU: a device arena of `capacity` bytes, one stream, our kernels."""

    branches = False  # side() forks onto a second stream only while set (graph capture)
    _side: tuple | None = None  # (stream, fork event, join event), made on first use
    _forked = False
    _uploads: Any = None  # the UploadRing of `upload`, made on first use, freed by `synchronize`

    def __init__(self, device: Any, capacity: int, config: ModelConfig, attn_group: int | None, pdl: bool = True):
        from inferno.cuda import DeviceArena, Stream

        self.device = device
        self._resolve(config, attn_group)
        self.stream = Stream.create()
        self.stream.pdl = pdl  # kernels that wait in-kernel launch while their predecessor drains
        self.arena = DeviceArena(device, capacity, "gpu executor")

    # ---- kernel resolution ---------------------------------------------------------------------
    def _resolve(self, config: ModelConfig, attn_group: int | None) -> None:
        from inferno.kernels import launchers as L
        from inferno.kernels.cache import load
        from inferno.kernels.gemv_bf16_variants import GemvBf16
        from inferno.kernels.gemv_bf16_variants import variant_name as bf16_gemv_name
        from inferno.kernels.registry import get, variants

        dev = self.device
        self.fold_norms = fold_norms()

        def width(v) -> int:  # the widest row a norm variant holds (launchers.RMSNorm.max_n)
            return v.config.get("threads_per_row", 0) * v.config.get("chunks", 0) * 8

        norms = sorted((v for v in variants(dev.arch) if v.op == "rmsnorm"), key=width)
        fit = [v for v in norms if width(v) >= config.hidden]
        if not fit:
            raise _missing(f"rmsnorm for width {config.hidden}", "inferno/kernels/registry.py", "has no variant that wide")
        self._rmsnorm = L.RMSNorm(load(fit[0], dev))
        self._embedding = L.Embedding(load(get("embedding"), dev))
        self._gemv_bf16 = GemvBf16(load(get(bf16_gemv_name(1)), dev))
        self._gemv: dict[str, Any] = {}
        self._argmax: Any = None  # loaded on first greedy use (optional)
        self._gdn_conv_step_sums: Any = None  # loaded when the GDN input GEMV accumulates (optional)
        self._sampler: Any = None  # loaded on first device-sampled token (optional)
        if config.gdn_layers:
            try:
                from inferno.kernels.gdn_variants import GdnConvStep
            except ImportError as e:
                raise _missing("GDN decode", "inferno/kernels/gdn_variants.py", f"cannot be imported ({e})") from None
            self._gdn_conv_step = GdnConvStep(load(get("gdn_conv_step"), dev))
        if config.attention_layers:
            try:
                from inferno.kernels import attn_variants as A
            except ImportError as e:
                raise _missing("attention decode", "inferno/kernels/attn_variants.py",
                               f"cannot be imported ({e})") from None
            try:
                decode = A.decode_variant(config.n_heads, config.n_kv_heads, fused=True)
            except LaunchError:
                raise _missing(f"attn_decode_g{attn_group}", "inferno/kernels/attn_variants.py",
                               f"has no variant for {attn_group} query heads per kv head "
                               f"(groups built: {', '.join(map(str, A.GROUPS))})") from None
            self._attn_decode = A.AttnDecodeFused(load(decode, dev))
            self._attn_combine = A.AttnCombine(load(A.COMBINE_EARLY, dev))
        self._attn_sums: tuple[Any, Any] | None = None  # loaded when the attention input GEMV accumulates

    def _gemv_launcher(self, fmt: str, epilogue: str, tiled: bool = False, norm: bool = False,
                       add: bool = False, lo4: bool = False) -> Any:
        from inferno.kernels import gemv_nvfp4_variants as F
        from inferno.kernels.cache import load
        from inferno.kernels.gemv_variants import GemvQ, gemv_variant, variant_name

        if fmt == "BF16":
            return self._gemv_bf16_launcher(epilogue, norm, add)
        if norm and not tiled:
            raise LaunchError(f"no GEMV with the RMSNorm folded in for {fmt} in its row-split layout")
        if tiled:  # groupwise-int in tile16-v1, NVFP4 in tile16-nvfp4-v1: the tensor-core GEMV
            from inferno.kernels import gemv_mma_nvfp4_variants as N
            from inferno.kernels import gemv_mma_variants as M

            if fmt == F.FORMAT:
                if add or epilogue == ACCUMULATE:
                    raise LaunchError("no NVFP4 GEMV accumulates or adds a deferred residual")
                cls, name = N.GemvMmaNvfp4, N.variant_name(epilogue, 1, norm)
            else:
                cls, name = M.GemvMma, M.variant_name(fmt, epilogue, 1, norm, add) + ("_lo4" if lo4 else "")
            g = self._gemv.get(name)
            if g is None:
                g = self._gemv[name] = cls.load(name, self.device)
            return g
        name = F.variant_name(epilogue, 1) if fmt == F.FORMAT else variant_name(fmt, epilogue, 1)
        g = self._gemv.get(name)
        if g is None:
            if fmt == F.FORMAT:
                g = self._gemv[name] = F.GemvNvfp4(load(F.gemv_nvfp4_variant(name), self.device))
            else:
                g = self._gemv[name] = GemvQ(load(gemv_variant(name), self.device))
        return g

    def _gemv_bf16_launcher(self, epilogue: str, norm: bool = False, add: bool = False) -> Any:
        """The bf16 GEMV with `epilogue` (BF16 matrices of mixed identities such as nvfp4), or (`norm`) the
        one with the RMSNorm folded in (plain only; `add`: reading x + accumulated sums)."""
        from inferno.kernels.cache import load
        from inferno.kernels.gemv_bf16_variants import GemvBf16, variant_name
        from inferno.kernels.registry import get

        name = variant_name(1, epilogue, norm, add)
        g = self._gemv.get(name)
        if g is None:
            g = self._gemv[name] = GemvBf16(load(get(name), self.device))
        return g

    def preload_gemv(self, keys: set[tuple[str, str, bool]]) -> None:
        """Load every (format, epilogue, tiled) GEMV the model uses before the first step."""
        for fmt, epilogue, tiled in sorted(keys):
            self._gemv_launcher(fmt, epilogue, tiled)

    # ---- memory ----------------------------------------------------------------------------------
    def alloc(self, name: str, nbytes: int) -> DeviceBuffer:
        return self.arena.alloc(name, nbytes)

    def upload(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        if self._uploads is None:
            from inferno.cuda.staging import UploadRing

            self._uploads = UploadRing(self.stream)
        self._uploads.copy(buf, array)

    def download(self, buf: DeviceBuffer, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        from inferno.cuda import d2h

        self.stream.synchronize()
        out = np.empty(shape, dtype)
        d2h(out, buf, nbytes=out.nbytes)
        return out

    def zero(self, buf: DeviceBuffer) -> None:
        from inferno.cuda import memset_d8

        memset_d8(buf, 0, stream=self.stream)

    def write(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        from inferno.cuda import h2d

        h2d(buf, array, stream=self.stream)

    def read(self, out: np.ndarray, buf: DeviceBuffer) -> None:
        from inferno.cuda import d2h

        d2h(out, buf, stream=self.stream, nbytes=out.nbytes)

    def synchronize(self) -> None:
        self.stream.synchronize()
        if self._uploads is not None:  # the upload slots' pinned memory goes back
            self._uploads.close()
            self._uploads = None

    def marker(self) -> Callable[[], None]:
        from inferno.cuda import Event

        event = Event.create(timing=False).record(self.stream)

        def wait() -> None:
            event.synchronize()
            event.close()

        return wait

    @contextmanager
    def side(self) -> Iterator[None]:
        """Launches inside go to a second stream that starts after the work queued so far, so they run
        concurrently with what the main stream queues next, until `join()`. Only while `branches` is
        set (graph capture); otherwise everything stays on the one stream."""
        if not self.branches:
            yield
            return
        from inferno.cuda import Event, Stream

        if self._side is None:
            side = Stream.create()
            side.pdl = self.stream.pdl
            self._side = (side, Event(timing=False), Event(timing=False))
        side, fork, _ = self._side
        fork.record(self.stream)
        side.wait(fork)
        main, self.stream = self.stream, side
        try:
            yield
        finally:
            self.stream = main
        self._forked = True

    def join(self) -> None:
        """The main stream waits for the side stream's work (no-op when nothing was forked)."""
        if self._forked:
            side, _, joined = self._side
            joined.record(side)
            self.stream.wait(joined)
            self._forked = False

    def copy2d(self, dst: DeviceBuffer, dst_pitch: int, src: DeviceBuffer, src_pitch: int, width: int,
               height: int) -> None:
        from inferno.cuda.driver import driver
        from inferno.cuda.errors import check

        need_src, need_dst = (height - 1) * src_pitch + width, (height - 1) * dst_pitch + width
        if need_src > src.nbytes or need_dst > dst.nbytes:
            raise ValueError(f"copy2d {src.name} -> {dst.name}: {height} rows of {width} bytes do not fit")
        cu = driver()
        p = cu.CUDA_MEMCPY2D()
        p.srcMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
        p.srcDevice = src.ptr
        p.srcPitch = src_pitch
        p.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
        p.dstDevice = dst.ptr
        p.dstPitch = dst_pitch
        p.WidthInBytes = width
        p.Height = height
        check(cu.cuMemcpy2DAsync(p, self.stream.handle), "cuMemcpy2DAsync", f"{src.name} -> {dst.name}")

    # ---- kernels -----------------------------------------------------------------------------------
    def embedding(self, ids, table, out, vocab, hidden) -> None:
        self._embedding(ids, table, out, 1, vocab, hidden, stream=self.stream)

    def rmsnorm(self, x, w, y, n, eps) -> None:
        self._rmsnorm(x, w, y, 1, n, eps, stream=self.stream)

    def gemv(self, fmt, epilogue, w, x, y, n, k, r=None, tiled=False, norm=None, add=None, q4_rows=0) -> None:
        if q4_rows:
            self._gemv_mixed(fmt, epilogue, w, x, y, n, k, norm, add, q4_rows)
            return
        g = self._gemv_launcher(fmt, epilogue, tiled, norm is not None, add is not None)
        if add is not None:
            g(w, x, y, n, k, 1, r=r, norm=norm, add=add, stream=self.stream)
        elif norm is None:
            g(w, x, y, n, k, 1, r=r, stream=self.stream)
        else:
            g(w, x, y, n, k, 1, r=r, norm=norm, stream=self.stream)

    def _gemv_mixed(self, fmt, epilogue, w, x, y, n, k, norm, add, q4_rows) -> None:
        """A mixed stack (merge.py: rows [0, q4_rows) a Q4 tile16-v1 image ahead of the `fmt` rows): one `_lo4`
        launch when it accumulates with the norm folded (the merged input projection), else one launch per part."""
        from inferno.kernels.tiled import TILE_ROWS
        from inferno.model.gpu.merge import mixed_parts

        if fmt != MIXED_HIGH or epilogue not in ("plain", ACCUMULATE):
            raise LaunchError(f"a mixed stack is Q4 rows ahead of {MIXED_HIGH} ones, read by a plain or accumulating "
                              f"GEMV; got {fmt} {epilogue}")
        if epilogue == ACCUMULATE and norm is not None:
            g = self._gemv_launcher(fmt, epilogue, True, True, add is not None, lo4=True)
            g(w, x, y, n, k, 1, norm=norm, add=add, lo=q4_rows // TILE_ROWS, stream=self.stream)
            return
        ob = 4 if epilogue == ACCUMULATE else 2  # bytes per output
        for part, row0, rows, offset, size in mixed_parts(n, k, q4_rows):
            self.gemv(part, epilogue, w.view(offset, size), x, y.view(row0 * ob, rows * ob), rows, k, tiled=True,
                      norm=norm, add=add)

    def linear_bf16(self, x, w, y, n, k, norm=None, sums=None) -> None:
        if sums is not None:
            self._gemv_bf16_launcher("plain", True, True)(w, x, y, n, k, 1, norm=norm, sums=sums, stream=self.stream)
        elif norm is None:
            self._gemv_bf16(w, x, y, n, k, 1, stream=self.stream)
        else:
            self._gemv_bf16_launcher("plain", True)(w, x, y, n, k, 1, norm=norm, stream=self.stream)

    def folds_norm(self, fmt, epilogue, tiled, k) -> bool:
        """Whether the GEMV of (fmt, epilogue, tiled) at K = k takes norm= on this device (tensor-core Q4-Q6
        plain / swiglu and bf16 plain, with their `_n` kernels built), unless $INFERNO_FOLD_NORM=0."""
        if not self.fold_norms or not folds_norm_shape(fmt, epilogue, tiled, k):
            return False
        try:
            self._gemv_launcher(fmt, epilogue, tiled, True)
        except InfernoError:
            return False
        return True

    def defers_residual(self, out_fmt, out_tiled, out_k, readers, k) -> bool:
        """As `defers_residual_shape`, with the norm folded and every kernel family built for this device."""
        if not (self.fold_norms and defers_residual_shape(out_fmt, out_tiled, out_k, readers, k)):
            return False
        try:
            self._gemv_launcher(out_fmt, ACCUMULATE, out_tiled)
            for fmt, epilogue, tiled in readers:
                self._gemv_launcher(fmt, epilogue, tiled, True, True)
        except InfernoError:
            return False
        return True

    def accumulates_inputs(self, mixer, fmt, tiled, k) -> bool:
        """As `accumulates_inputs_shape`, with the norm folded and the kernels built for this device."""
        if not (self.fold_norms and accumulates_inputs_shape(fmt, tiled, k)):
            return False
        try:
            for add in (False, True):
                self._gemv_launcher(fmt, ACCUMULATE, tiled, True, add)
                if fmt == MIXED_HIGH:  # a mixed stack's member (merge.py): loaded now, so a missing one shows here
                    self._gemv_launcher(fmt, ACCUMULATE, tiled, True, add, lo4=True)
            if mixer == "gdn":
                self._gdn_conv_step_launcher(True)
            else:
                self._attn_sums_launchers()
        except InfernoError:
            return False
        return True

    def _attn_sums_launchers(self) -> tuple[Any, Any]:
        """The fused decode and the combine reading fp32 sums (`attn_decode_g<G>_fused_sums`, `attn_combine_sums`)."""
        if self._attn_sums is None:
            from inferno.kernels import attn_variants as A
            from inferno.kernels.cache import load

            name = f"{self._attn_decode.name}_sums"
            self._attn_sums = (A.AttnDecodeFused(load(A.attn_variant(name), self.device)),
                               A.AttnCombine(load(A.COMBINE_SUMS, self.device)))
        return self._attn_sums

    def _gdn_conv_step_launcher(self, sums: bool) -> Any:
        """The conv + step kernel reading bf16 inputs, or (`sums`) fp32 sums (loaded on first use)."""
        if not sums:
            return self._gdn_conv_step
        if self._gdn_conv_step_sums is None:
            from inferno.kernels.cache import load
            from inferno.kernels.gdn_variants import GdnConvStep

            self._gdn_conv_step_sums = GdnConvStep(load("gdn_conv_step_sums", self.device))
        return self._gdn_conv_step_sums

    def gdn_conv_step(self, x, conv_state, conv_w, z, a, b, a_log, dt_bias, norm_w, state, slots, sync, out,
                      k_heads, v_heads, n_slots, eps, sums=False) -> None:
        self._gdn_conv_step_launcher(sums)(x, conv_state, conv_w, z, a, b, a_log, dt_bias, norm_w, state, slots,
                                           sync, out, 1, k_heads, v_heads, n_slots, eps, stream=self.stream)

    def attention(self, q_proj, k, v, q_norm, k_norm, positions, lens, page_table, kv, q, part_o, part_lse, gate,
                  out, g, sums=False) -> None:
        """Two launches: the decode kernel with the prep folded in, then the combine (its lens and gate
        loads before its PDL wait: lens is the host's step buffer, the gate two launches back); `sums`: both
        read fp32 sums, which the combine zeroes."""
        decode, combine = self._attn_sums_launchers() if sums else (self._attn_decode, self._attn_combine)
        decode(q_proj, k, v, q_norm, k_norm, positions, lens, page_table, kv, q, part_o, part_lse,
               batch=1, n_heads=g.n_heads, n_kv_heads=g.n_kv_heads, table_width=g.pages_per_seq,
               splits=g.splits, eps=g.eps, rope_theta=g.rope_theta, scale=g.head_dim ** -0.5,
               q_head_stride=g.head_dim, stream=self.stream)
        combine(part_o, part_lse, lens, gate, out, batch=1, n_heads=g.n_heads, splits=g.splits,
                gate_head_stride=g.head_dim, zero=(q_proj, k, v) if sums else None, n_kv_heads=g.n_kv_heads,
                stream=self.stream)

    def argmax(self, x, out, n) -> None:
        if self._argmax is None:
            from inferno.kernels.sample_variants import Argmax

            self._argmax = Argmax.for_device(self.device)
        self._argmax(x, out, n, stream=self.stream)

    def sample(self, logits, counts, scratch, out, n, params, u) -> None:
        if self._sampler is None:
            from inferno.kernels.sample_variants import DeviceSampler

            self._sampler = DeviceSampler.for_device(self.device)
        self._sampler(logits, counts, scratch, out, n, params, u, stream=self.stream)

    def close(self) -> None:
        self.synchronize()
        for g in self._gemv.values():  # the stream-K GEMVs' workspaces
            if hasattr(g, "free"):
                g.free()
        if self._side is not None:
            side, fork, joined = self._side
            side.synchronize()
            fork.close()
            joined.close()
            side.close()
        self.arena.close()
        self.stream.close()

