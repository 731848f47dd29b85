"""Prefill-path kernels: groupwise-int weights -> bf16 dequantisation, and causal flash attention
over the paged KV cache. Registry variants (`PREFILL_VARIANTS`, the registry adds them to its
table) and their typed launchers. See docs/kernels-prefill.md.

  dequant_<q4|q5|q6|w8>  w int32 [WL] (the whole `row-split-k128-v1` payload of W [N, K];
  dequant_<..>_tiled     the whole `tile16-v1` image, inferno/kernels/tiled.py;
  dequant_nvfp4          `blockscale-k16-m128x4-v1` for NVFP4, N % 128 == 0, K % 64 == 0;
  dequant_nvfp4_tiled    the whole `tile16-nvfp4-v1` image, inferno/kernels/tiled_nvfp4.py, K % 16 == 0)
                         -> out bf16 [M, K] = rows [n0, n0 + M) of W (row stride out_stride)
  attn_prefill_g<2|6|8>  q, gate bf16 [T, Hq, 256] (strides q_stride/q_hstride, ...; q fp32 in
                         the _qf32 variants, as the decode prep kernel writes it), the paged
                         KV pool [rows, 256] (inferno/kernels/kv_layout.py) with an int32 page
                         table, prefix length P -> out bf16 [T, Hq, 256] (row stride out_stride)
                         = causal softmax(q K^T * scale) V * sigmoid(gate), keys 0..P+i for query i

This module imports neither the DSL nor the kernel cache at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferno.cuda.errors import LaunchError
from inferno.cuda.launch import launch
from inferno.cuda.memory import DeviceBuffer
from inferno.cuda.params import TensorArg
from inferno.kernels.kv_layout import HEAD_DIM, PAGE_TOKENS  # a key tile of the kernel = one page
from inferno.kernels.manifest import eval_grid
from inferno.kernels.launchers import _buf, _int
from inferno.kernels.registry import Scalar, Tensor, Variant

if TYPE_CHECKING:
    from inferno.cuda.device import Device
    from inferno.kernels.cache import LoadedKernel

BF16, I32 = 2, 4
DEQUANT_THREADS = 256
DEQUANT_ITEMS = 4  # tile16-v1: items (8 codes of a row) per thread
NVFP4_TILED_ITEMS = 4  # tile16-nvfp4-v1: 512-byte blocks per warp
ATTN_BLOCK_M = 64  # query rows per CTA (4 warps x 16)
ATTN_THREADS = 128
FORMATS = {  # format -> (short name, bits, group)
    "Q4G64_F16S": ("q4", 4, 64),
    "Q5G64_F16S": ("q5", 5, 64),
    "Q6G64_F16S": ("q6", 6, 64),
    "W8G32_F16S": ("w8", 8, 32),
}
DEQUANT_FORMATS = {**{f: f"dequant_{short}" for f, (short, _, _) in FORMATS.items()}, "NVFP4": "dequant_nvfp4"}
DEQUANT_TILED = {**{f: f"dequant_{short}_tiled" for f, (short, _, _) in FORMATS.items()},  # weights in tile16-v1
                 "NVFP4": "dequant_nvfp4_tiled"}  # NVFP4 in tile16-nvfp4-v1
GQA_GROUPS = (2, 6, 8)  # Hq / Hkv: tiny test models (4 : 2), 27B, 35B-A3B


def _dequant(fmt: str) -> Variant:
    short, bits, group = FORMATS[fmt]
    return Variant(
        name=f"dequant_{short}", op=f"dequant_{short}", source="cute_kernels.dequant", cls="DequantQ",
        config=dict(bits=bits, group=group, threads=DEQUANT_THREADS),
        args=(Tensor("w", "i32", ("WL",), (1,)),
              Tensor("out", "bf16", ("M", "K"), ("out_stride", 1)),
              Scalar("n_total", "i32"), Scalar("n0", "i32")),
        grid=(f"cdiv(M * cdiv(K, 128) * 4, {DEQUANT_THREADS})", "1", "1"),
        divisibility={"K": 8, "out_stride": 8},
        summary=f"out = bf16(W[n0:n0+M]), W {fmt} row-split-k128-v1, one thread per 32 codes",
    )


def _dequant_tiled(fmt: str) -> Variant:
    short, bits, group = FORMATS[fmt]
    return Variant(
        name=DEQUANT_TILED[fmt], op=f"dequant_{short}_tiled", source="cute_kernels.dequant", cls="DequantQTiled",
        config=dict(bits=bits, group=group, threads=DEQUANT_THREADS, items=DEQUANT_ITEMS),
        args=(Tensor("w", "i32", ("WL",), (1,)),
              Tensor("out", "bf16", ("M", "K"), ("out_stride", 1)),
              Scalar("n_total", "i32"), Scalar("n0", "i32")),
        # x: the 2 K_pad items of a row tile; y: M / 16 + 1 tiles (a slice that starts inside a tile touches one more)
        grid=(f"cdiv(cdiv(K, 128) * 256, {DEQUANT_ITEMS * DEQUANT_THREADS})", "cdiv(M, 16) + 1", "1"),
        divisibility={"K": 8, "out_stride": 8},
        summary=f"out = bf16(W[n0:n0+M]), W {fmt} tile16-v1, {DEQUANT_ITEMS} x 8 codes per thread",
    )


def _dequant_nvfp4() -> Variant:
    return Variant(
        name="dequant_nvfp4", op="dequant_nvfp4", source="cute_kernels.dequant", cls="DequantNvfp4",
        config=dict(threads=DEQUANT_THREADS),
        args=(Tensor("w", "i32", ("WL",), (1,)),
              Tensor("out", "bf16", ("M", "K"), ("out_stride", 1)),
              Scalar("n_total", "i32"), Scalar("n0", "i32")),
        grid=(f"cdiv(M * (K // 32), {DEQUANT_THREADS})", "1", "1"),
        divisibility={"K": 64, "out_stride": 8},
        summary="out = bf16(W[n0:n0+M]), W NVFP4 blockscale-k16-m128x4-v1, one thread per 32 codes",
    )


def _dequant_nvfp4_tiled() -> Variant:
    per_cta = NVFP4_TILED_ITEMS * DEQUANT_THREADS // 32
    return Variant(
        name="dequant_nvfp4_tiled", op="dequant_nvfp4_tiled", source="cute_kernels.dequant", cls="DequantNvfp4Tiled",
        config=dict(threads=DEQUANT_THREADS, items=NVFP4_TILED_ITEMS),
        args=(Tensor("w", "i32", ("WL",), (1,)),
              Tensor("out", "bf16", ("M", "K"), ("out_stride", 1)),
              Scalar("n_total", "i32"), Scalar("n0", "i32")),
        # x: the K_pad / 64 blocks of a row tile, one per warp and step; y: M / 16 + 1 tiles
        grid=(f"cdiv(cdiv(K, 128) * 2, {per_cta})", "cdiv(M, 16) + 1", "1"),
        divisibility={"K": 16, "out_stride": 8},
        summary="out = bf16(W[n0:n0+M]), W NVFP4 tile16-nvfp4-v1, a warp per 512-byte block, "
                "codes shuffled to whole-sector stores",
    )


def _attn(group: int, q_f32: bool = False) -> Variant:
    hd = HEAD_DIM
    return Variant(
        name=f"attn_prefill_g{group}" + ("_qf32" if q_f32 else ""), op="attn_prefill",
        source="cute_kernels.attn_prefill", cls="AttnPrefill",
        config=dict(group=group, head_dim=hd, block_m=ATTN_BLOCK_M, block_n=PAGE_TOKENS,
                    threads=ATTN_THREADS, q_f32=q_f32),
        args=(Tensor("q", "f32" if q_f32 else "bf16", ("T", "HQ", hd), ("q_stride", "q_hstride", 1)),
              Tensor("gate", "bf16", ("T", "HQ", hd), ("gate_stride", "gate_hstride", 1)),
              Tensor("kv", "bf16", ("R", hd), (hd, 1)),
              Tensor("pages", "i32", ("NP",), (1,), align=4),
              Tensor("out", "bf16", ("T", "HQ", hd), ("out_stride", hd, 1)),
              Scalar("prefix", "i32"), Scalar("scale", "f32")),
        grid=("HQ", f"cdiv(T, {ATTN_BLOCK_M})", "1"),
        divisibility={"q_stride": 8, "q_hstride": 8, "gate_stride": 8, "gate_hstride": 8, "out_stride": 8},
        summary=f"causal flash attention prefill, GQA {group}:1, head_dim {hd}, {'fp32' if q_f32 else 'bf16'} q, "
                "paged bf16 KV, mma.sync 16x8x16, out * sigmoid(gate)",
    )


PREFILL_VARIANTS: tuple[Variant, ...] = (
    *(_dequant(f) for f in FORMATS), *(_dequant_tiled(f) for f in FORMATS), _dequant_nvfp4(),
    _dequant_nvfp4_tiled(),
    *(_attn(g, f) for f in (False, True) for g in GQA_GROUPS))
_BY_NAME = {v.name: v for v in PREFILL_VARIANTS}


def prefill_variant(name: str) -> Variant:
    """The prefill variant called `name`."""
    v = _BY_NAME.get(name)
    if v is None:
        raise LaunchError(f"no prefill kernel variant {name!r}; names: {', '.join(_BY_NAME)}")
    return v


class _PrefillLauncher:
    """A loaded prefill kernel: argument checks, packing by manifest symbol names, grid, launch."""

    def __init__(self, loaded: "LoadedKernel"):
        self.loaded = loaded
        self.name = loaded.variant.name
        self.config = loaded.manifest.config

    @classmethod
    def load(cls, name: str, device: "Device | None" = None):
        """Load variant `name` for `device` (default GPU 0) from the kernel cache (built when stale)."""
        from inferno.kernels.cache import load

        return cls(load(prefill_variant(name), device))

    def _divisible(self, what: str, value: int, sym: str) -> None:
        d = self.loaded.manifest.divisibility.get(sym, 1)
        if value % d:
            raise LaunchError(f"kernel {self.name}: {what} = {value} must be a multiple of {d}")

    def _launch(self, ptrs: dict[str, int], scalars: dict[str, float], symbols: dict[str, int],
                stream: Any) -> None:
        m = self.loaded.manifest
        args: list = []
        for p in m.params:
            if p.kind == "tensor":
                args.append(TensorArg(ptrs[p.name], tuple(symbols[s] for s in p.dyn_shape),
                                      tuple(symbols[s] for s in p.dyn_stride)))
            else:
                args.append(scalars[p.name])
        launch(self.loaded.kernel, eval_grid(m.grid, symbols), m.block, self.loaded.layout.pack(args),
               m.smem, stream)


class Dequant(_PrefillLauncher):
    """out[r, :] = bf16(W[n0 + r, :]) for r < rows, W [n, k] a quantized matrix on the device: the
    artifact payload, or (the `_tiled` variants) a groupwise-int matrix's tile16-v1 image or an
    NVFP4 matrix's tile16-nvfp4-v1 image."""

    @classmethod
    def for_format(cls, fmt: str, device: "Device | None" = None, tiled: bool = False) -> "Dequant":
        """The kernel for `fmt` weights; tiled: the matrix lies in tile16-v1 (NVFP4: tile16-nvfp4-v1)."""
        names = DEQUANT_TILED if tiled else DEQUANT_FORMATS
        if fmt not in names:
            raise LaunchError(f"no {'tile16-v1 ' if tiled else ''}dequant kernel for weight format {fmt!r}; "
                              f"formats: {', '.join(names)}")
        return cls.load(names[fmt], device)

    @property
    def tiled(self) -> bool:
        """Whether this kernel reads the tile16-v1 / tile16-nvfp4-v1 image (else the artifact payload)."""
        return self.name in DEQUANT_TILED.values()

    @property
    def fmt(self) -> str:
        names = DEQUANT_TILED if self.tiled else DEQUANT_FORMATS
        return next(f for f, name in names.items() if name == self.name)

    def payload_bytes(self, n: int, k: int) -> int:
        """Bytes of the [n, k] weight as this kernel reads it (payload or tile16-v1 / tile16-nvfp4-v1 image)."""
        if self.tiled and self.fmt == "NVFP4":
            from inferno.kernels.tiled_nvfp4 import TiledNvfp4Error
            from inferno.kernels.tiled_nvfp4 import tiled_geometry as nvfp4_tiled_geometry

            try:
                return nvfp4_tiled_geometry(n, k).nbytes
            except TiledNvfp4Error as e:
                raise LaunchError(f"kernel {self.name}: {e}") from None
        if self.tiled:
            from inferno.kernels.tiled import tiled_geometry

            return tiled_geometry(self.fmt, n, k).nbytes
        if self.fmt == "NVFP4":
            from inferno.artifact.formats.nvfp4 import geometry as nvfp4_geometry

            if n % 128 or k % 64:
                raise LaunchError(f"kernel {self.name}: NVFP4 needs n % 128 == 0 and k % 64 == 0, got [{n}, {k}]")
            return nvfp4_geometry((n, k)).nbytes
        from inferno.artifact.formats.groupwise import geometry

        return geometry(self.fmt, (n, k)).nbytes

    def __call__(self, w: DeviceBuffer, out: DeviceBuffer, n: int, k: int, *, n0: int = 0,
                 rows: int | None = None, out_stride: int | None = None, stream: Any = None) -> None:
        """Dequantise rows [n0, n0 + rows) (default: all n) of W [n, k] into out [rows, k] bf16; w holds
        `payload_bytes(n, k)` bytes (the tile16-v1 image for the `_tiled` kernels)."""
        n, k = _int(n, "n", self.name), _int(k, "k", self.name)
        n0 = _int(n0, "n0", self.name, lo=0)
        rows = n - n0 if rows is None else _int(rows, "rows", self.name)
        if n0 + rows > n:
            raise LaunchError(f"kernel {self.name}: rows [{n0}, {n0 + rows}) run past the matrix's {n} rows")
        self._divisible("k", k, "K")
        stride = k if out_stride is None else _int(out_stride, "out_stride", self.name)
        if stride < k:
            raise LaunchError(f"kernel {self.name}: out_stride {stride} is less than k = {k}")
        self._divisible("out_stride", stride, "out_stride")
        too_big = rows * (-(-k // 128) * 4) >= 2**31
        if self.tiled:  # grid y: one CTA row per 16-row tile, plus one
            too_big = too_big or -(-rows // 16) + 1 > 65535
        if too_big:
            raise LaunchError(f"kernel {self.name}: {rows} x {k} is too large for one call; dequantise in slices")
        nbytes = self.payload_bytes(n, k)
        ptrs = {"w": _buf(w, "w", self.name, nbytes),
                "out": _buf(out, "out", self.name, ((rows - 1) * stride + k) * BF16)}
        symbols = {"WL": nbytes // 4, "M": rows, "K": k, "out_stride": stride}
        self._launch(ptrs, {"n_total": n, "n0": n0}, symbols, stream)


class AttnPrefill(_PrefillLauncher):
    """Causal attention of T new tokens (positions P..P+T-1) over the paged KV of positions
    0..P+T-1 (already written), gated: out = softmax(q K^T * scale) V * sigmoid(gate)."""

    @classmethod
    def for_group(cls, group: int, device: "Device | None" = None, q_f32: bool = False) -> "AttnPrefill":
        """The kernel for Hq / Hkv = group; q_f32: q is fp32 (e.g. the decode prep's q scratch)."""
        if group not in GQA_GROUPS:
            raise LaunchError(f"no prefill attention kernel for Hq/Hkv = {group}; groups: {GQA_GROUPS}")
        return cls.load(f"attn_prefill_g{group}" + ("_qf32" if q_f32 else ""), device)

    def __call__(self, q: DeviceBuffer, gate: DeviceBuffer, kv_pool: DeviceBuffer, pages: DeviceBuffer,
                 out: DeviceBuffer, tokens: int, n_heads: int, prefix: int, n_pages: int,
                 scale: float = HEAD_DIM ** -0.5, *, q_stride: int | None = None,
                 q_hstride: int = HEAD_DIM, gate_stride: int | None = None,
                 gate_hstride: int = HEAD_DIM, out_stride: int | None = None, stream: Any = None) -> None:
        """q, gate [tokens, n_heads, 256] bf16 (q fp32 for the _qf32 variants) with row / head
        strides in elements (default contiguous; gate_stride = 2 * n_heads * 256, gate_hstride =
        512 read the gate halves of the interleaved q|gate projection in place); kv_pool
        [n_pages, 2, Hkv, 64, 256] bf16 with Hkv = n_heads / group; pages int32
        [>= cdiv(prefix + tokens, 64)] page ids of this sequence; out [tokens, n_heads * 256] bf16
        (row stride out_stride)."""
        t = _int(tokens, "tokens", self.name)
        hq = _int(n_heads, "n_heads", self.name)
        p = _int(prefix, "prefix", self.name, lo=0)
        n_pool = _int(n_pages, "n_pages", self.name)
        g = self.config["group"]
        if hq % g:
            raise LaunchError(f"kernel {self.name}: n_heads = {hq} is not a multiple of its GQA group {g}")
        width = hq * HEAD_DIM
        qs = width if q_stride is None else _int(q_stride, "q_stride", self.name)
        gs = width if gate_stride is None else _int(gate_stride, "gate_stride", self.name)
        os_ = width if out_stride is None else _int(out_stride, "out_stride", self.name)
        qh, gh = _int(q_hstride, "q_hstride", self.name), _int(gate_hstride, "gate_hstride", self.name)
        for what, v, sym in (("q_stride", qs, "q_stride"), ("q_hstride", qh, "q_hstride"),
                             ("gate_stride", gs, "gate_stride"), ("gate_hstride", gh, "gate_hstride"),
                             ("out_stride", os_, "out_stride")):
            self._divisible(what, v, sym)
        if os_ < width:
            raise LaunchError(f"kernel {self.name}: out_stride {os_} is less than the row width {width}")
        if -(-t // ATTN_BLOCK_M) > 65535:
            raise LaunchError(f"kernel {self.name}: {t} tokens exceed {65535 * ATTN_BLOCK_M}; split the chunk")
        need_pages = -(-(p + t) // PAGE_TOKENS)
        rows = n_pool * 2 * (hq // g) * PAGE_TOKENS
        span = lambda s, h, size: ((t - 1) * s + (hq - 1) * h + HEAD_DIM) * size  # noqa: E731
        q_size = 4 if self.config["q_f32"] else BF16
        ptrs = {"q": _buf(q, "q", self.name, span(qs, qh, q_size)),
                "gate": _buf(gate, "gate", self.name, span(gs, gh, BF16)),
                "kv": _buf(kv_pool, "kv_pool", self.name, rows * HEAD_DIM * BF16),
                "pages": _buf(pages, "pages", self.name, need_pages * I32, align=4),
                "out": _buf(out, "out", self.name, ((t - 1) * os_ + width) * BF16)}
        symbols = {"T": t, "HQ": hq, "R": rows, "NP": need_pages, "q_stride": qs, "q_hstride": qh,
                   "gate_stride": gs, "gate_hstride": gh, "out_stride": os_}
        self._launch(ptrs, {"prefix": p, "scale": float(scale)}, symbols, stream)


def build(out_dir: str, archs: tuple[str, ...] = ("sm_90a",), names: tuple[str, ...] | None = None) -> None:
    """Compile the prefill variants (all, or `names`) into out_dir/<arch>/; progress to stderr."""
    from pathlib import Path

    from inferno.kernels.build import build_all

    build_all([v for v in PREFILL_VARIANTS if names is None or v.name in names], list(archs), Path(out_dir))


if __name__ == "__main__":
    import sys

    build(sys.argv[1], tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else ("sm_90a",),
          tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else None)
