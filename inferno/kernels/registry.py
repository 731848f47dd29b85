"""The kernel registry: every kernel variant we build, with its static config and ABI.

A variant is one compiled kernel: a kernel class from `cute_kernels/` with a fixed config, the
host arguments it is compiled against (fake tensors with named dynamic modes), the kernel
parameters the launcher packs, the grid rule, and the archs it builds for. Variants of one `op`
are alternatives for different archs; `variant_for(op, arch)` picks the first that builds for
the arch, so arch-specific kernels (wgmma on sm_90a) sit in front of portable ones.

This module imports no DSL: it is read at run time on machines that only have cubins.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from pathlib import Path

from inferno.errors import InfernoError

ROOT = Path(__file__).resolve().parents[2]
ARCHS = ("sm_90a", "sm_120a")


class UnknownKernelError(InfernoError):
    """A kernel variant or op name that the registry does not hold."""


@dataclass(frozen=True)
class Tensor:
    """A global-memory tensor argument. Shape/stride entries: int = static, str = dynamic symbol."""

    name: str
    dtype: str  # "bf16" | "i32" | "f32"
    shape: tuple[str | int, ...]
    stride: tuple[str | int, ...]
    align: int = 16

    @property
    def dyn_shape(self) -> tuple[str, ...]:
        return tuple(s for s in self.shape if isinstance(s, str))

    @property
    def dyn_stride(self) -> tuple[str, ...]:
        return tuple(s for s in self.stride if isinstance(s, str))


@dataclass(frozen=True)
class Scalar:
    """A by-value scalar argument."""

    name: str
    dtype: str  # "f32" | "i32"


@dataclass(frozen=True)
class Param:
    """A kernel parameter that is not a plain host argument (TMA descriptor, coordinate shape...).

    kind: "tma" (128-byte CUtensorMap of tensor `of`), "shape" (the i32 dynamic shape of tensor
    `of`, packed as bytes), or "bytes" (`size` raw bytes, e.g. the wgmma accumulate flag).
    """

    name: str
    kind: str
    of: str = ""
    size: int = 0
    align: int = 1


@dataclass(frozen=True)
class Variant:
    name: str
    op: str
    source: str  # module holding the kernel class
    cls: str
    config: dict = field(default_factory=dict)
    archs: tuple[str, ...] = ARCHS
    args: tuple[Tensor | Scalar | None, ...] = ()  # host arguments, in order (None: unused optional)
    params: tuple[Param, ...] | None = None  # kernel params when they differ from the host args
    grid: tuple[str, str, str] = ("1", "1", "1")  # expressions over the symbols and SMS (manifest.py)
    divisibility: dict = field(default_factory=dict)  # symbol -> divisor the kernel assumes
    summary: str = ""
    pdl: bool = False  # the kernel calls griddepcontrol.wait before it touches memory: it may launch early

    @property
    def source_file(self) -> Path:
        return ROOT / (self.source.replace(".", "/") + ".py")

    def abi_key(self) -> str:
        """Everything besides the source and config that a built kernel and its manifest depend on."""
        return repr((self.cls, self.args, self.params, self.grid, sorted(self.divisibility.items())))

    def build_command(self, arch: str, out: str = "DIR") -> str:
        return f"inferno kernels build --arch {arch} --out {out} --only {self.name}"


def _rows(name: str, cols: str = "N", rows: str = "M", stride: str | None = None) -> Tensor:
    """A row-major bf16 matrix [rows, cols] whose row stride (elements) is its own symbol."""
    return Tensor(name, "bf16", (rows, cols), (stride or f"{name}_stride", 1))


def _norm(name: str, tpr: int, rows: int, chunks: int, residual: bool) -> Variant:
    x, y, w = _rows("x"), _rows("y"), Tensor("w", "bf16", ("N",), (1,))
    r, h = (_rows("r"), _rows("h")) if residual else (None, None)
    max_n = tpr * chunks * 8
    what = "h = x + r; y = RMSNorm(h)" if residual else "zero-centred RMSNorm"
    return Variant(
        name=name, op="add_rmsnorm" if residual else "rmsnorm", source="cute_kernels.rmsnorm",
        cls="RMSNorm",
        config=dict(threads_per_row=tpr, rows_per_cta=rows, chunks=chunks, residual=residual),
        args=(x, r, w, y, h, Scalar("eps", "f32")),
        # Grid-stride rows: a few CTAs per SM, each prefetching its next row.
        grid=(f"min(cdiv(M, {rows}), SMS * {NORM_CTAS_PER_SM})", "1", "1"),
        divisibility={"N": 8, "x_stride": 8, "y_stride": 8, "r_stride": 8, "h_stride": 8},
        pdl=True, summary=f"{what}, {tpr} threads per row, {rows} row(s) per CTA, N <= {max_n}",
    )


# Measured on the H200 (tools/sweep_rmsnorm.py, 8192 x 5120): 160 threads x 4 chunks with a grid
# of 8 CTAs per SM reached 88 % of copy bandwidth; one CTA per row 82 %, 128 x 5 chunks 85 %.
NORM_CTAS_PER_SM = 8

CORE_VARIANTS: tuple[Variant, ...] = (
    # RMSNorm widths: launchers pick the narrowest variant that holds the row (max N in the name).
    _norm("rmsnorm_1k", 32, 4, 4, False),
    _norm("rmsnorm_5k", 160, 1, 4, False),
    _norm("rmsnorm_8k", 128, 1, 8, False),
    _norm("rmsnorm_16k", 256, 1, 8, False),
    _norm("add_rmsnorm_5k", 160, 1, 4, True),
    _norm("add_rmsnorm_8k", 256, 1, 4, True),
    Variant(
        name="silu_mul", op="silu_mul", source="cute_kernels.silu_mul", cls="SiluMul",
        config=dict(threads=256),
        args=(Tensor("gu", "bf16", ("T", "I2"), ("gu_stride", 1)),
              Tensor("out", "bf16", ("T", "I"), ("out_stride", 1))),
        grid=("cdiv(I, 2048)", "T", "1"),
        divisibility={"I": 8, "I2": 8, "gu_stride": 8, "out_stride": 8},
        summary="out = silu(gu[:, :I]) * gu[:, I:]",
    ),
    Variant(
        name="embedding", op="embedding", source="cute_kernels.embedding", cls="EmbeddingGather",
        config=dict(threads=256),
        args=(Tensor("ids", "i32", ("T",), (1,), align=4),
              Tensor("table", "bf16", ("V", "H"), ("table_stride", 1)),
              Tensor("out", "bf16", ("T", "H"), ("out_stride", 1))),
        grid=("cdiv(H, 2048)", "T", "1"),
        divisibility={"H": 8, "table_stride": 8, "out_stride": 8},
        pdl=True, summary="out[t] = table[ids[t]] (bf16 rows, int32 ids)",
    ),
    Variant(
        name="gemm_wgmma", op="gemm", source="cute_kernels.gemm_sm90", cls="HopperGemm",
        config=dict(tile_m=128, tile_n=256, raster=8), archs=("sm_90a",),
        args=(_rows("a", "K", "M"), _rows("b", "K", "N"), _rows("c", "N", "M")),
        params=(Param("a_tma", "tma", of="a"), Param("a_shape", "shape", of="a", size=8, align=4),
                Param("b_tma", "tma", of="b"), Param("b_shape", "shape", of="b", size=8, align=4),
                Param("c_tma", "tma", of="c"), Param("c_shape", "shape", of="c", size=8, align=4),
                Param("mma_accumulate", "bytes", size=1, align=1)),
        grid=("cdiv(M, 128) * cdiv(N, 256)", "1", "1"),
        divisibility={"K": 8, "N": 8, "a_stride": 8, "b_stride": 8, "c_stride": 8},
        summary="C = A @ B^T, bf16, wgmma + TMA, 128x256 tiles, 4-stage pipeline",
    ),
    Variant(
        name="gemm_simt", op="gemm", source="cute_kernels.gemm_simt", cls="SimtGemm",
        args=(_rows("a", "K", "M"), _rows("b", "K", "N"), _rows("c", "N", "M")),
        grid=("cdiv(N, 64)", "cdiv(M, 64)", "1"),
        divisibility={"K": 8, "a_stride": 8, "b_stride": 8},
        summary="C = A @ B^T, bf16, CUDA-core fallback for any arch",
    ),
)

# Kernel families defined beside their launchers (module, tuple name). They import this module,
# so they are collected on first use rather than at import time.
_FAMILIES = (
    ("inferno.kernels.gemv_variants", "GEMV_VARIANTS"),
    ("inferno.kernels.gemv_mma_variants", "GEMV_MMA_VARIANTS"),
    ("inferno.kernels.gemv_mma_nvfp4_variants", "GEMV_MMA_NVFP4_VARIANTS"),
    ("inferno.kernels.gemv_bf16_variants", "GEMV_BF16_VARIANTS"),
    ("inferno.kernels.gemv_nvfp4_variants", "GEMV_NVFP4_VARIANTS"),
    ("inferno.kernels.gdn_variants", "GDN_VARIANTS"),
    ("inferno.kernels.gdn_prefill_variants", "GDN_PREFILL_VARIANTS"),
    ("inferno.kernels.gdn_prefill_variants", "GDN_CHUNK_VSPLIT_VARIANTS"),
    ("inferno.kernels.attn_variants", "ATTN_VARIANTS"),
    ("inferno.kernels.prefill_variants", "PREFILL_VARIANTS"),
    ("inferno.kernels.sample_variants", "SAMPLE_VARIANTS"),
)


@functools.cache
def _all() -> tuple[tuple[Variant, ...], dict[str, Variant]]:
    found = list(CORE_VARIANTS)
    for module, name in _FAMILIES:
        found.extend(getattr(importlib.import_module(module), name))
    by_name: dict[str, Variant] = {}
    for v in found:
        if v.name in by_name:
            raise RuntimeError(f"kernel variant {v.name!r} is registered twice")
        by_name[v.name] = v
    return tuple(found), by_name


def __getattr__(name: str) -> tuple[Variant, ...]:
    if name == "VARIANTS":  # every registered variant, core and families
        return _all()[0]
    raise AttributeError(name)


def variants(arch: str | None = None) -> list[Variant]:
    """All variants, or those that build for `arch`."""
    return [v for v in _all()[0] if arch is None or arch in v.archs]


def get(name: str) -> Variant:
    """The variant called `name`."""
    v = _all()[1].get(name)
    if v is None:
        raise UnknownKernelError(f"no kernel variant {name!r}; `inferno kernels list` shows them")
    return v


def variant_for(op: str, arch: str) -> Variant:
    """The preferred variant of `op` that builds for `arch`."""
    every = _all()[0]
    for v in every:
        if v.op == op and arch in v.archs:
            return v
    ops = sorted({v.op for v in every})
    if op not in ops:
        raise UnknownKernelError(f"no kernel op {op!r}; ops: {', '.join(ops)}")
    raise UnknownKernelError(f"kernel op {op!r} has no variant for {arch}")
