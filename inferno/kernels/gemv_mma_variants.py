"""Kernel variants of the tensor-core decode GEMV (`cute_kernels/gemv_mma.py`) and their launcher.

The weights are the `tile16-v1` image of the matrix (`inferno.kernels.tiled.tile`), not the
row-split payload. Host arguments as the CUDA-core GEMV (`inferno.kernels.gemv_variants`): w int32
tile16-v1 image, x bf16 [T, K], r bf16 [T, M] (`_res` only), y bf16 [T, M].

A family per (format, epilogue, T): `gemv_mma_<q4|q5|q6|w8>_t<T>[_res|_swiglu]`, T in 1, 8 (a
variant accepts any 1 <= T <= its T). Its members `<family>_k<kw>` differ in how many warps split
K (kw = 2, 4, 8 of the CTA's 8 warps); the launcher picks the member per call from the shape
(`k_split`, a rule fitted to H200 measurements):

    from inferno.kernels.gemv_mma_variants import GemvMma, variant_name
    k = GemvMma.load(variant_name("Q4G64_F16S", "swiglu", cols=1))    # loads the family
    k(w_tiled, x, y, n=34816, k=5120, cols=1)                          # same call as GemvQ
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

from inferno.cuda.errors import LaunchError
from inferno.cuda.launch import launch
from inferno.cuda.memory import DeviceBuffer
from inferno.kernels.gemv_variants import EPILOGUES, FORMATS, gemv_args
from inferno.kernels.registry import Tensor, Variant
from inferno.kernels.tiled import LAYOUT, tiled_geometry

if TYPE_CHECKING:
    from inferno.cuda.device import Device
    from inferno.kernels.cache import LoadedKernel

COLS = (1, 8)
KW = (2, 4, 8)  # members of a family: warps splitting K
WARPS, TILES = 8, 1  # warps per CTA, output units (16 outputs) per warp row
XPRE = True  # x one group pair ahead in registers (else loaded when its pair is computed)
# register stages of group pairs per warp (stages - 1 pairs of weights in flight; swiglu streams 2
# tiles at once): about as many as fit 128 registers (2 CTAs of 8 warps per SM) without spilling
STAGES = {("q4", False): 4, ("q5", False): 3, ("q6", False): 3, ("w8", False): 4,
          ("q4", True): 3, ("q5", True): 2, ("q6", True): 2, ("w8", True): 3}
STAGES_XJ = 1  # stages x loaded when needed affords beyond STAGES (its x registers are not held ahead)


def stages_for(fmt: str, epilogue: str, xpre: bool = XPRE) -> int:
    return STAGES[(FORMATS[fmt][0], epilogue == "swiglu")] + (0 if xpre else STAGES_XJ)


# K split rule (measured on the H200, tools/bench_gemv.py --mma --mma-tune, docs/kernels-gemv-mma.md)
RUN_PAIRS = 10  # a warp should stream >= 10 (tile, group pair) blocks: its register pipeline is 2-4 deep
MIN_WARPS, MAX_WARPS = 1536, 32768  # but keep >= ~12 and <= ~250 warps of work per SM


def k_split(m: int, k: int, epilogue: str = "plain", kws: tuple[int, ...] = KW) -> int:
    """The kw (of `kws`) for m outputs and K = k: the largest split whose warps still stream >= RUN_PAIRS
    blocks, then doubled while fewer than MIN_WARPS warps, halved while more than MAX_WARPS."""
    units, pairs = -(-m // 16), -(-k // 128)
    blocks = pairs * (2 if epilogue == "swiglu" else 1)  # swiglu streams a gate and an up tile
    ks = sorted(kws)
    i = max([j for j, kw in enumerate(ks) if blocks >= RUN_PAIRS * kw] or [0])
    while i + 1 < len(ks) and units * ks[i] < MIN_WARPS:
        i += 1
    while i > 0 and units * ks[i] > MAX_WARPS:
        i -= 1
    return ks[i]


def variant_name(fmt: str, epilogue: str = "plain", cols: int = 1) -> str:
    """The family for `fmt` with `epilogue` that takes `cols` columns (T = 1, else 8)."""
    if fmt not in FORMATS:
        raise LaunchError(f"no GEMV kernel for weight format {fmt!r}; formats: {', '.join(FORMATS)}")
    if epilogue not in EPILOGUES:
        raise LaunchError(f"unknown GEMV epilogue {epilogue!r}; epilogues: {', '.join(EPILOGUES)}")
    t = next((c for c in COLS if c >= cols), None)
    if t is None or cols < 1:
        raise LaunchError(f"GEMV takes 1..{COLS[-1]} columns, got {cols}; split the batch")
    return f"gemv_mma_{FORMATS[fmt][0]}_t{t}{EPILOGUES[epilogue]}"


def outs_per_cta(warps: int, kw: int, tiles: int) -> int:
    return 16 * tiles * (warps // kw)


def make_variant(fmt: str, epilogue: str, cols: int, kw: int = 8, warps: int = WARPS, tiles: int = TILES,
                 stages: int | None = None, xpre: bool = XPRE) -> Variant:
    """Member `<family>_k<kw>`; a non-default warps/tiles/stages/xpre adds `_w<warps>_r<tiles>_p<stages>`
    (and `_xj`: x loaded when needed)."""
    _, bits, group = FORMATS[fmt]
    stages = stages or stages_for(fmt, epilogue, xpre)
    if warps % kw:
        raise LaunchError(f"kw = {kw} must divide warps = {warps}")
    name = f"{variant_name(fmt, epilogue, cols)}_k{kw}"
    if (warps, tiles, stages, xpre) != (WARPS, TILES, stages_for(fmt, epilogue), XPRE):
        name += f"_w{warps}_r{tiles}_p{stages}" + ("" if xpre else "_xj")
    w = Tensor("w", "i32", ("WL",), (1,))
    x = Tensor("x", "bf16", ("T", "K"), ("x_stride", 1))
    y = Tensor("y", "bf16", ("T", "M"), ("y_stride", 1))
    r = Tensor("r", "bf16", ("T", "M"), ("r_stride", 1)) if epilogue == "residual" else None
    what = {"plain": "y = W x", "residual": "y = r + W x",
            "swiglu": "out = silu(W[:I] x) * (W[I:] x)"}[epilogue]
    return Variant(
        name=name, op="gemv_mma", source="cute_kernels.gemv_mma", cls="GemvMma",
        config=dict(bits=bits, group=group, cols=cols, epilogue=epilogue, warps=warps, kw=kw, tiles=tiles,
                    stages=stages, xpre=xpre),
        archs=("sm_90a", "sm_120a"),
        args=(w, x, r, y), grid=(f"cdiv(M, {outs_per_cta(warps, kw, tiles)})", "1", "1"),
        divisibility={"K": 8, "x_stride": 8},
        pdl=True,
        summary=f"{what}, W {fmt} {LAYOUT}, x bf16 [T<={cols}, K], mma.sync bf16, fp32 accumulate, "
                f"{kw} warps split K",
    )


def alternatives(fmt: str, epilogue: str, cols: int) -> list[Variant]:
    """Other kernel shapes at kw = 8 (benchmarked and GPU-tested, not registered): x loaded when
    needed with more weight stages; two tiles per warp sharing x (plain and residual)."""
    out = [make_variant(fmt, epilogue, cols, 8, xpre=False)]
    if epilogue != "swiglu":
        out.append(make_variant(fmt, epilogue, cols, 8, tiles=2, stages=STAGES[(FORMATS[fmt][0], True)]))
    return out


GEMV_MMA_VARIANTS: tuple[Variant, ...] = tuple(
    make_variant(fmt, epi, cols, kw) for fmt in FORMATS for epi in EPILOGUES for cols in COLS for kw in KW)
_BY_NAME = {v.name: v for v in GEMV_MMA_VARIANTS}


def gemv_mma_variant(name: str) -> Variant:
    """The tensor-core GEMV variant called `name` (a family member)."""
    v = _BY_NAME.get(name)
    if v is None:
        raise LaunchError(f"no tensor-core GEMV variant {name!r}; names look like {GEMV_MMA_VARIANTS[0].name}")
    return v


@lru_cache(maxsize=1024)
def _tiled_bytes(fmt: str, n: int, k: int) -> int:
    return tiled_geometry(fmt, n, k).nbytes


class GemvMma:
    """Typed launcher over one or more members of a family: y[t] = epilogue(W x[t]) for t < cols,
    W the `tile16-v1` image of [n, k] (n = 2I for swiglu). Each call runs the member `k_split` picks."""

    def __init__(self, *loaded: "LoadedKernel"):
        if not loaded:
            raise LaunchError("GemvMma needs at least one loaded kernel")
        self.by_kw: dict[int, tuple[Any, int]] = {}
        for lk in loaded:
            c = lk.manifest.config
            outs = outs_per_cta(c["warps"], c["kw"], c["tiles"])
            if lk.manifest.grid != [f"cdiv(M, {outs})", "1", "1"]:
                raise LaunchError(f"kernel {lk.variant.name}: manifest grid {lk.manifest.grid} is not this launcher's")
            self.by_kw[c["kw"]] = (lk, outs)
        c = loaded[0].manifest.config
        self.bits, self.group, self.cols, self.epilogue = c["bits"], c["group"], c["cols"], c["epilogue"]
        if any(lk.manifest.config[f] != c[f] for lk in loaded for f in ("bits", "group", "cols", "epilogue")):
            raise LaunchError("GemvMma: the kernels are not members of one family")
        self.name = variant_name(next(f for f, (_, b, g) in FORMATS.items() if (b, g) == (self.bits, self.group)),
                                 self.epilogue, self.cols)
        self.fmt = next(f for f, (_, b, g) in FORMATS.items() if (b, g) == (self.bits, self.group))

    @classmethod
    def load(cls, name: str, device: "Device | None" = None) -> "GemvMma":
        """A family name loads all its members; a member name only that one."""
        from inferno.kernels.cache import load

        names = [name] if name in _BY_NAME else [f"{name}_k{kw}" for kw in KW]
        return cls(*(load(gemv_mma_variant(nm), device) for nm in names))

    def member(self, m: int, k: int) -> tuple[Any, int]:
        """(loaded kernel, outputs per CTA) for m outputs and K = k."""
        return self.by_kw[k_split(m, k, self.epilogue, tuple(self.by_kw))]

    def __call__(self, w: DeviceBuffer, x: DeviceBuffer, y: DeviceBuffer, n: int, k: int, cols: int, *,
                 r: DeviceBuffer | None = None, stream: Any = None) -> None:
        """W is [n, k] in tile16-v1 (n = 2I for swiglu); x [cols, k], y (and r) [cols, n or I], contiguous bf16."""
        m, args = gemv_args(self.name, self.cols, self.epilogue, lambda n, k: _tiled_bytes(self.fmt, n, k),
                            w, x, y, n, k, cols, r)
        lk, outs = self.member(m, k)
        mf = lk.manifest
        launch(lk.kernel, (-(-m // outs), 1, 1), mf.block, lk.layout.pack(args), mf.smem, stream)


def build(out_dir: str, archs: tuple[str, ...] = ("sm_90a",), names: tuple[str, ...] | None = None) -> None:
    """Compile the variants (all, or `names`: members or families) into out_dir/<arch>/; progress to stderr."""
    from pathlib import Path

    from inferno.kernels.build import build_all

    want = None if names is None else {nm for n in names for nm in ([n] if n in _BY_NAME else
                                                                    [f"{n}_k{kw}" for kw in KW])}
    build_all([v for v in GEMV_MMA_VARIANTS if want is None or v.name in want], list(archs), Path(out_dir))


if __name__ == "__main__":
    import sys

    build(sys.argv[1], tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else ("sm_90a",),
          tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else None)
