"""Kernel variants of the NVFP4 tensor-core decode GEMV (`cute_kernels/gemv_mma_nvfp4.py`) and its launcher.

The weights are the `tile16-nvfp4-v1` image of the matrix (`inferno.kernels.tiled_nvfp4.tile`), not the
`blockscale-k16-m128x4-v1` payload. Host arguments as the groupwise tensor-core GEMV
(`inferno.kernels.gemv_mma_variants`): w int32 image, x bf16 [1, K], r bf16 [1, M] (`_res` only),
y bf16 [1, M], the stream-K workspace ws, and for the `_n` families the norm weight nw bf16 [K] and eps.

A family per epilogue (T = 1): `gemv_mma_nvfp4_t1[_res|_swiglu]`, and `gemv_mma_nvfp4_t1[_swiglu]_n`
with the zero-centred RMSNorm folded into the x staging (K <= 8192). Members: x in shared memory with
2 or 4 warps splitting K (`<family>_k2_xs`, `_k4_xs`) and stream-K through a cp.async ring
(`<family>_sk`, sm_90a); the launcher picks the member per call by the groupwise rule (`sk_wins`):

    from inferno.kernels.gemv_mma_nvfp4_variants import GemvMmaNvfp4, variant_name
    k = GemvMmaNvfp4.load(variant_name("swiglu"))          # loads the family
    k(w_tiled, x, y, n=34816, k=5120, cols=1)              # same call as GemvMma
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from inferno.cuda.errors import LaunchError
from inferno.kernels import gemv_mma_variants as mv
from inferno.kernels.gemv_variants import EPILOGUES, gemv_tensors
from inferno.kernels.registry import Tensor, Variant
from inferno.kernels.tiled_nvfp4 import LAYOUT, TiledNvfp4Error, tiled_geometry

if TYPE_CHECKING:
    from inferno.cuda.device import Device

FORMAT = "NVFP4"
BITS, GROUP = 4, 16  # the config's format key (the launcher's `_format`)
WARPS = 8
# stages of block pairs per warp (x in shared memory) and of the stream-K ring, plain-or-residual / swiglu:
# as Q4 (sm_90a, no spills: 126 / 128 registers of the 2 x 8 warps cap)
STAGES_XS = {False: 4, True: 3}
SK_STAGES = {False: 3, True: 2}


def variant_name(epilogue: str = "plain", cols: int = 1, norm: bool = False) -> str:
    """The family with `epilogue` (T = 1); `norm`: the RMSNorm folded into the x staging (plain, swiglu)."""
    if epilogue not in EPILOGUES:
        raise LaunchError(f"unknown GEMV epilogue {epilogue!r}; epilogues: {', '.join(EPILOGUES)}")
    if cols != 1:
        raise LaunchError(f"the NVFP4 tensor-core GEMV takes 1 column, got {cols}; use the CUDA-core gemv_nvfp4")
    if norm and epilogue == "residual":
        raise LaunchError("the GEMV with the RMSNorm folded in is plain or swiglu")
    return f"gemv_mma_nvfp4_t1{EPILOGUES[epilogue]}{'_n' if norm else ''}"


def _summary(epilogue: str, norm: bool, how: str) -> str:
    what = {"plain": "y = W x", "residual": "y = r + W x",
            "swiglu": "out = silu(W[:I] x) * (W[I:] x)"}[epilogue] + (" (x RMS-normed)" if norm else "")
    return f"{what}, W NVFP4 {LAYOUT}, x bf16 [1, K <= {mv.kmax_for(norm)}] in shared memory, {how}, " \
           "mma.sync bf16, fp32 accumulate"


def make_variant(epilogue: str, kw: int = 4, stages: int | None = None, norm: bool = False) -> Variant:
    """Member `<family>_k<kw>_xs` (another stage count: `_xs_p<stages>`)."""
    default = STAGES_XS[epilogue == "swiglu"]
    stages = stages or default
    if WARPS % kw:
        raise LaunchError(f"kw = {kw} must divide warps = {WARPS}")
    name = f"{variant_name(epilogue, 1, norm)}_k{kw}_xs" + ("" if stages == default else f"_p{stages}")
    w, x, r, y = gemv_tensors(epilogue)
    return Variant(
        name=name, op="gemv_mma_nvfp4", source="cute_kernels.gemv_mma_nvfp4", cls="GemvMmaNvfp4",
        config=dict(bits=BITS, group=GROUP, cols=1, epilogue=epilogue, warps=WARPS, kw=kw, tiles=1, stages=stages,
                    xs=True, kmax=mv.kmax_for(norm), **({"norm": True} if norm else {})),
        archs=("sm_90a", "sm_120a"),
        args=(w, x, r, y, *mv.norm_tensors(norm)), grid=(f"cdiv(M, {mv.outs_per_cta(WARPS, kw, 1)})", "1", "1"),
        divisibility={"K": 16, "x_stride": 8},
        pdl=True,
        summary=_summary(epilogue, norm, f"{kw} warps split K"),
    )


def make_sk_variant(epilogue: str, stages: int | None = None, norm: bool = False) -> Variant:
    """The stream-K member `<family>_sk` (ring of SK_STAGES, 1 CTA x 16 warps per SM; another depth `_sk_p<s>`)."""
    default = SK_STAGES[epilogue == "swiglu"]
    stages = stages or default
    name = f"{variant_name(epilogue, 1, norm)}_sk" + ("" if stages == default else f"_p{stages}")
    w, x, r, y = gemv_tensors(epilogue)
    return Variant(
        name=name, op="gemv_mma_nvfp4", source="cute_kernels.gemv_mma_nvfp4", cls="GemvMmaNvfp4SK",
        config=dict(bits=BITS, group=GROUP, cols=1, epilogue=epilogue, warps=mv.SK_WARPS, stages=stages,
                    ctas=mv.SK_CTAS, kmax=mv.kmax_for(norm), sk=True, cpa=True, **({"norm": True} if norm else {})),
        archs=("sm_90a",),  # the ring needs sm_90's 227 KB of shared memory per CTA
        args=(w, x, r, y, Tensor("ws", "i32", ("WS",), (1,)), *mv.norm_tensors(norm)),
        grid=(f"SMS * {mv.SK_CTAS}", "1", "1"),
        divisibility={"K": 16, "x_stride": 8},
        pdl=True,
        summary=_summary(epilogue, norm, "stream-K, weights through a cp.async ring, self-cleaning workspace"),
    )


def members(epilogue: str, norm: bool = False) -> list[Variant]:
    """The registered members of a family."""
    return [make_variant(epilogue, kw, norm=norm) for kw in mv.XS_KW] + [make_sk_variant(epilogue, norm=norm)]


def tune_variants(epilogue: str) -> list[Variant]:
    """Other shapes for the benchmark (not registered): kw 8, one stage more / less, ring depth +-1."""
    xs, sk = STAGES_XS[epilogue == "swiglu"], SK_STAGES[epilogue == "swiglu"]
    return ([make_variant(epilogue, 8)] + [make_variant(epilogue, 4, s) for s in (xs - 1, xs + 1) if s >= 2]
            + [make_sk_variant(epilogue, s) for s in (sk - 1, sk + 1) if s >= 2])


GEMV_MMA_NVFP4_VARIANTS: tuple[Variant, ...] = tuple(
    v for norm in (False, True) for epi in EPILOGUES if not (norm and epi == "residual") for v in members(epi, norm))
_BY_NAME = {v.name: v for v in GEMV_MMA_NVFP4_VARIANTS}


def gemv_mma_nvfp4_variant(name: str) -> Variant:
    """The NVFP4 tensor-core GEMV variant called `name` (a member)."""
    v = _BY_NAME.get(name)
    if v is None:
        raise LaunchError(f"no NVFP4 tensor-core GEMV variant {name!r}; names look like "
                          f"{GEMV_MMA_NVFP4_VARIANTS[0].name}")
    return v


def family_members(name: str) -> list[str]:
    """Member names of a family name, or [name] for a member name."""
    if name in _BY_NAME:
        return [name]
    out = [v.name for v in GEMV_MMA_NVFP4_VARIANTS if v.name.startswith(name + "_")
           and variant_name(v.config["epilogue"], 1, bool(v.config.get("norm"))) == name]
    if not out:
        raise LaunchError(f"no NVFP4 tensor-core GEMV family {name!r}; names look like {variant_name()}")
    return out


@lru_cache(maxsize=1024)
def tiled_bytes(n: int, k: int) -> int:
    """Bytes of the `tile16-nvfp4-v1` image of [n, k]; LaunchError when the layout cannot hold it."""
    try:
        return tiled_geometry(n, k).nbytes
    except TiledNvfp4Error as e:
        raise LaunchError(str(e)) from None


class _Nvfp4Launch:
    """The NVFP4 weight format of the tensor-core GEMV launchers."""

    @staticmethod
    def _format(config: dict) -> str:
        if (config["bits"], config["group"]) != (BITS, GROUP):
            raise LaunchError(f"kernel config {config} is not an NVFP4 tensor-core GEMV")
        return FORMAT

    def _weight_bytes(self, n: int, k: int) -> int:
        if k % 16:
            raise LaunchError(f"kernel {self.name}: NVFP4 needs k % 16 == 0, got {k}")
        return tiled_bytes(n, k)


class GemvMmaNvfp4SK(_Nvfp4Launch, mv.GemvMmaSK):
    """Typed launcher of one NVFP4 stream-K member (`mv.GemvMmaSK`: it owns its zeroed workspaces)."""


class GemvMmaNvfp4(_Nvfp4Launch, mv.GemvMma):
    """Typed launcher over members of one NVFP4 family: y = epilogue(W x), W the `tile16-nvfp4-v1` image of
    [n, k] (n = 2I for swiglu), the same call as `mv.GemvMma` (norm=(weight, eps) for a `_n` family); each
    call runs the member `member` picks (stream-K where `sk_wins`, else x in shared memory)."""

    sk_cls = GemvMmaNvfp4SK

    def _family_name(self) -> str:
        return variant_name(self.epilogue, self.cols, self.norm)

    @classmethod
    def load(cls, name: str, device: "Device | None" = None) -> "GemvMmaNvfp4":
        """A family name loads all its members built for the device's arch; a member name only that one."""
        from inferno.cuda.device import Device
        from inferno.kernels.cache import load

        device = device or Device.open()
        names = family_members(name)
        if name not in _BY_NAME:
            names = [nm for nm in names if device.arch in gemv_mma_nvfp4_variant(nm).archs]
        return cls(*(load(gemv_mma_nvfp4_variant(nm), device) for nm in names))


def build(out_dir: str, archs: tuple[str, ...] = ("sm_90a",), names: tuple[str, ...] | None = None) -> None:
    """Compile the variants (all, or `names`: members or families) into out_dir/<arch>/; progress to stderr."""
    from pathlib import Path

    from inferno.kernels.build import build_all

    want = None if names is None else {nm for n in names for nm in family_members(n)}
    build_all([v for v in GEMV_MMA_NVFP4_VARIANTS if want is None or v.name in want], list(archs), Path(out_dir))


if __name__ == "__main__":
    import sys

    build(sys.argv[1], tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else ("sm_90a",),
          tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else None)
