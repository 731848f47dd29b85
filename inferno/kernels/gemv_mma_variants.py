"""Kernel variants of the tensor-core decode GEMV (`cute_kernels/gemv_mma.py`) and their launcher.

One variant per (format, epilogue, T): `gemv_mma_<q4|q5|q6|w8>_t<T>[_res|_swiglu]`, T in 1, 8
(a variant accepts any 1 <= T <= its T; the mma costs the same for T = 1..8, T = 1 only skips
the other columns' x loads and stores). Host arguments and their meaning are those of the CUDA-core
GEMV (`inferno.kernels.gemv_variants`): w int32 payload as is, x bf16 [T, K], r bf16 [T, M]
(`_res` only), y bf16 [T, M]. Grid: one CTA per `tiles` 16-row tiles (16 outputs per tile,
8 for swiglu).

    from inferno.kernels.gemv_mma_variants import GemvMma, variant_name
    k = GemvMma.load(variant_name("Q4G64_F16S", "swiglu", cols=1))
    k(w, x, y, n=34816, k=5120, cols=1)             # same call as GemvQ

Measured on the H200 (docs/kernels-gemv-mma.md) the tensor-core GEMV is 1.9-4.7x faster than the
CUDA-core one at T = 8 but slower at T = 1; `prefers_mma(fmt, cols)` says which to use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inferno.cuda.errors import LaunchError
from inferno.kernels.gemv_variants import EPILOGUES, FORMATS, GemvQ
from inferno.kernels.registry import Tensor, Variant

if TYPE_CHECKING:
    from inferno.cuda.device import Device
    from inferno.kernels.cache import LoadedKernel

COLS = (1, 8)
TILES, WARPS, STEPS, STAGES = 1, 4, 1, 4  # defaults: 16 rows per CTA, 4 warps split K, 1 step per batch,
# 4 batches in flight per warp


# Smallest column count at which the tensor-core GEMV beats the CUDA-core one (H200, 2026-11-29):
# its T = 8 variant (whose cost at fewer columns is at most its T = 8 cost) against the CUDA-core
# T = 4 variant (cols 3-4) and T = 8 variant (cols 5-8); at T = 1 it is slower for every format.
MMA_MIN_COLS = {"Q4G64_F16S": 3, "Q5G64_F16S": 3, "Q6G64_F16S": 3, "W8G32_F16S": 5}


def prefers_mma(fmt: str, cols: int) -> bool:
    """True when `GemvMma` is the faster GEMV for `fmt` at `cols` batch rows (else use `GemvQ`)."""
    if fmt not in MMA_MIN_COLS:
        raise LaunchError(f"no GEMV kernel for weight format {fmt!r}; formats: {', '.join(FORMATS)}")
    return cols >= MMA_MIN_COLS[fmt]


def variant_name(fmt: str, epilogue: str = "plain", cols: int = 1) -> str:
    """The variant for `fmt` with `epilogue` that takes `cols` columns (T = 1, else 8)."""
    if fmt not in FORMATS:
        raise LaunchError(f"no GEMV kernel for weight format {fmt!r}; formats: {', '.join(FORMATS)}")
    if epilogue not in EPILOGUES:
        raise LaunchError(f"unknown GEMV epilogue {epilogue!r}; epilogues: {', '.join(EPILOGUES)}")
    t = next((c for c in COLS if c >= cols), None)
    if t is None or cols < 1:
        raise LaunchError(f"GEMV takes 1..{COLS[-1]} columns, got {cols}; split the batch")
    return f"gemv_mma_{FORMATS[fmt][0]}_t{t}{EPILOGUES[epilogue]}"


def outs_per_cta(epilogue: str, tiles: int) -> int:
    return tiles * (8 if epilogue == "swiglu" else 16)


def make_variant(fmt: str, epilogue: str, cols: int, tiles: int = TILES, warps: int = WARPS,
                 steps: int = STEPS, stages: int = STAGES) -> Variant:
    """The variant for (fmt, epilogue, cols); a non-default shape adds `_r<tiles>_w<warps>_s<steps>_p<stages>`."""
    _, bits, group = FORMATS[fmt]
    name = variant_name(fmt, epilogue, cols)
    if (tiles, warps, steps, stages) != (TILES, WARPS, STEPS, STAGES):
        name += f"_r{tiles}_w{warps}_s{steps}_p{stages}"
    w = Tensor("w", "i32", ("WL",), (1,))
    x = Tensor("x", "bf16", ("T", "K"), ("x_stride", 1))
    y = Tensor("y", "bf16", ("T", "M"), ("y_stride", 1))
    r = Tensor("r", "bf16", ("T", "M"), ("r_stride", 1)) if epilogue == "residual" else None
    what = {"plain": "y = W x", "residual": "y = r + W x",
            "swiglu": "out = silu(W[:I] x) * (W[I:] x)"}[epilogue]
    return Variant(
        name=name, op="gemv_mma", source="cute_kernels.gemv_mma", cls="GemvMma",
        config=dict(bits=bits, group=group, cols=cols, epilogue=epilogue, tiles=tiles, warps=warps,
                    steps=steps, stages=stages),
        archs=("sm_90a", "sm_120a"),
        args=(w, x, r, y), grid=(f"cdiv(M, {outs_per_cta(epilogue, tiles)})", "1", "1"),
        divisibility={"K": 8, "x_stride": 8},
        summary=f"{what}, W {fmt} row-split-k128-v1, x bf16 [T<={cols}, K], mma.sync bf16, fp32 accumulate",
    )


GEMV_MMA_VARIANTS: tuple[Variant, ...] = tuple(
    make_variant(fmt, epi, cols) for fmt in FORMATS for epi in EPILOGUES for cols in COLS)
_BY_NAME = {v.name: v for v in GEMV_MMA_VARIANTS}


def gemv_mma_variant(name: str) -> Variant:
    """The tensor-core GEMV variant called `name`."""
    v = _BY_NAME.get(name)
    if v is None:
        raise LaunchError(f"no tensor-core GEMV variant {name!r}; names look like {GEMV_MMA_VARIANTS[0].name}")
    return v


class GemvMma(GemvQ):
    """Typed launcher with `GemvQ`'s call: y[t] = epilogue(W x[t]) for t < cols (same checks)."""

    def __init__(self, loaded: "LoadedKernel"):
        self.loaded = loaded
        self.name = loaded.variant.name
        c = loaded.manifest.config
        self.bits, self.group, self.cols, self.epilogue = c["bits"], c["group"], c["cols"], c["epilogue"]
        self.fmt = next(f for f, (_, b, g) in FORMATS.items() if (b, g) == (self.bits, self.group))
        self.outs = outs_per_cta(self.epilogue, c["tiles"])
        if loaded.manifest.grid != [f"cdiv(M, {self.outs})", "1", "1"]:
            raise LaunchError(f"kernel {self.name}: manifest grid {loaded.manifest.grid} is not this launcher's")

    @classmethod
    def load(cls, name: str, device: "Device | None" = None) -> "GemvMma":
        from inferno.kernels.cache import load

        return cls(load(gemv_mma_variant(name), device))


def build(out_dir: str, archs: tuple[str, ...] = ("sm_90a",), names: tuple[str, ...] | None = None) -> None:
    """Compile the variants (all, or `names`) into out_dir/<arch>/; progress to stderr."""
    from pathlib import Path

    from inferno.kernels.build import build_all

    build_all([v for v in GEMV_MMA_VARIANTS if names is None or v.name in names], list(archs), Path(out_dir))


if __name__ == "__main__":
    import sys

    build(sys.argv[1], tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else ("sm_90a",),
          tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else None)
