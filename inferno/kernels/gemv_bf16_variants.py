"""Kernel variants of the bf16 decode GEMV (`cute_kernels/gemv_bf16.py`) and their launcher.

One variant per (epilogue, column count T): `gemv_bf16_t<T>[_res|_swiglu]`, T in 1, 2, 4, 8
(a variant accepts any 1 <= T <= its T), plus `gemv_bf16_t1_n`: T = 1, plain epilogue, with the
zero-centred RMSNorm folded into its x load (y = W . bf16(x * rsqrt(mean(x^2) + eps) * (1 + nw)),
rounded as the rmsnorm kernel rounds it), and `gemv_bf16_t1_na`: the same on x = bf16(x + s) (s fp32 [K],
after eps: a residual deferred by an accumulating GEMV). Host arguments, in order:
  w   bf16 [N, K]   row stride w_stride (K a multiple of 8)
  x   bf16 [T, K]   row stride x_stride (the un-normed residual stream for `_n`)
  r   bf16 [T, M]   residual (the `_res` variants only)
  nw  bf16 [K]      norm weight (the `_n` variant only)
  y   bf16 [T, M]   M = N (plain, residual) or N / 2 (swiglu: W rows = [gate I | up I])
  eps f32           norm epsilon (the `_n` variant only)
Grid: one CTA per `outs` outputs (rows weight rows; half as many outputs for swiglu).
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import DeviceBuffer
from inferno.cuda.params import TensorArg
from inferno.kernels.launchers import BF16, Launcher, _buf, _int
from inferno.kernels.registry import Scalar, Tensor, Variant

if TYPE_CHECKING:
    from inferno.cuda.device import Device

COLS = (1, 2, 4, 8)
EPILOGUES = {"plain": "", "residual": "_res", "swiglu": "_swiglu"}
THREADS = 128
NORM_SUFFIX = "_n"


def rows_for(cols: int, epilogue: str = "plain") -> int:
    """Weight rows per CTA: 1 at T = 1 (small N still fills the GPU), more as x reuse pays off;
    at least 2 for swiglu (the gate and up rows of an output)."""
    rows = 1 if cols == 1 else 2 if cols <= 4 else 4
    return max(rows, 2) if epilogue == "swiglu" else rows


def variant_name(cols: int = 1, epilogue: str = "plain", norm: bool = False, add: bool = False) -> str:
    """The variant with `epilogue` that takes `cols` columns (the smallest T >= cols); `norm`: the
    one with the RMSNorm folded into its x load (T = 1, plain epilogue only); `add` (with norm): the one
    reading x as bf16(x + s), s the fp32 sums of an accumulating GEMV (`_na`)."""
    if add and not norm:
        raise LaunchError("the bf16 GEMV adds accumulated sums only with the RMSNorm folded (norm=True)")
    if epilogue not in EPILOGUES:
        raise LaunchError(f"unknown GEMV epilogue {epilogue!r}; epilogues: {', '.join(EPILOGUES)}")
    t = next((c for c in COLS if c >= cols), None)
    if t is None or cols < 1:
        raise LaunchError(f"bf16 GEMV takes 1..{COLS[-1]} columns, got {cols}; split the batch")
    if norm and (t != 1 or epilogue != "plain"):
        raise LaunchError(f"the bf16 GEMV folds the RMSNorm at 1 column with the plain epilogue only "
                          f"(asked: {cols} columns, {epilogue}); run rmsnorm first")
    return f"gemv_bf16_t{t}{EPILOGUES[epilogue]}{NORM_SUFFIX if norm else ''}{'a' if add else ''}"


def norm_variant_name() -> str:
    """The variant that folds the RMSNorm into its x load: `gemv_bf16_t1_n`."""
    return variant_name(1, "plain", norm=True)


def prefetch_for(cols: int, epilogue: str = "plain") -> int:
    """16-byte chunks of each weight row a thread loads before the PDL wait (their x is staged
    too): 5 for one row per CTA (a whole 5120-wide row at 128 threads), fewer for more rows.
    sm_90a registers: 48 at T = 1 (33 without staging), 128 for `_n`, no more than before above."""
    return max(1, 5 // rows_for(cols, epilogue))


def make_variant(cols: int, rows: int | None = None, threads: int = THREADS, unroll: int = 2,
                 epilogue: str = "plain", norm: bool = False, prefetch: int | None = None,
                 add: bool = False) -> Variant:
    """The variant for `cols` columns and `epilogue` (with the folded RMSNorm when `norm`, reading x + s when
    `add`: GemvBf16Add, s fp32 [K] after eps); rows/threads/unroll/prefetch other than the defaults (for
    tuning) add `_r<rows>_n<threads>_u<unroll>_p<prefetch>` to the name."""
    name = variant_name(cols, epilogue, norm, add)
    rows = rows or rows_for(cols, epilogue)
    prefetch = prefetch or prefetch_for(cols, epilogue)
    if (rows, threads, unroll, prefetch) != (rows_for(cols, epilogue), THREADS, 2, prefetch_for(cols, epilogue)):
        name += f"_r{rows}_n{threads}_u{unroll}_p{prefetch}"
    outs = rows // 2 if epilogue == "swiglu" else rows
    r = Tensor("r", "bf16", ("T", "M"), ("r_stride", 1), align=2) if epilogue == "residual" else None
    nw = Tensor("nw", "bf16", ("K",), (1,)) if norm else None
    eps = Scalar("eps", "f32") if norm else None
    what = {"plain": "y = W x", "residual": "y = r + W x", "swiglu": "out = silu(W[:I] x) * (W[I:] x)"}[epilogue]
    config = dict(cols=cols, rows=rows, threads=threads, unroll=unroll, epilogue=epilogue, prefetch=prefetch)
    if norm:
        what, config["norm"] = "y = W . rmsnorm(x, nw, eps)", True
    if add:
        what, config["add"] = "y = W . rmsnorm(bf16(x + s), nw, eps)", True
    return Variant(
        name=name, op="gemv_bf16", source="cute_kernels.gemv_bf16", cls="GemvBf16Add" if add else "GemvBf16",
        config=config,
        args=(Tensor("w", "bf16", ("N", "K"), ("w_stride", 1)), Tensor("x", "bf16", ("T", "K"), ("x_stride", 1)),
              r, nw, Tensor("y", "bf16", ("T", "M"), ("y_stride", 1), align=2), eps,
              *((Tensor("s", "f32", ("K",), (1,)),) if add else ())),
        grid=(f"cdiv(M, {outs})", "1", "1"),
        divisibility={"K": 8, "w_stride": 8, "x_stride": 8},
        pdl=True,
        summary=f"{what}, W bf16 [N, K], x bf16 [T<={cols}, K], {rows} row(s) per CTA, fp32 accumulate",
    )


GEMV_BF16_VARIANTS: tuple[Variant, ...] = (*(make_variant(c, epilogue=e) for e in EPILOGUES for c in COLS),
                                            make_variant(1, norm=True), make_variant(1, norm=True, add=True))


class GemvBf16(Launcher):
    """y[t] = epilogue(W x[t]) for t < cols; W [n, k], x [cols, k], y (and r) [cols, n or n / 2],
    contiguous bf16 on the device. A `_n` variant normalises x first: pass norm=(nw, eps)."""

    op = "gemv_bf16"

    def __init__(self, loaded):
        super().__init__(loaded)
        self.cols, self.rows = self.config["cols"], self.config["rows"]
        self.epilogue = self.config.get("epilogue", "plain")
        self.norm = bool(self.config.get("norm", False))
        self.add = bool(self.config.get("add", False))

    @classmethod
    def load(cls, cols: int = 1, device: "Device | None" = None, epilogue: str = "plain",
             norm: bool = False, add: bool = False) -> "GemvBf16":
        """The launcher of the variant for `cols` columns and `epilogue` (folded RMSNorm if `norm`, x + s if
        `add`)."""
        from inferno.kernels.cache import load
        from inferno.kernels.registry import get

        return cls(load(get(variant_name(cols, epilogue, norm, add)), device))

    def __call__(self, w: DeviceBuffer, x: DeviceBuffer, y: DeviceBuffer, n: int, k: int, cols: int = 1, *,
                 r: DeviceBuffer | None = None, norm: tuple[DeviceBuffer, float] | None = None,
                 sums: DeviceBuffer | None = None, stream: Any = None) -> None:
        """W is [n, k] (n = 2I for swiglu); pass r exactly for the residual epilogue,
        norm=(nw bf16 [k], eps) exactly for a `_n` variant (x is then the un-normed row) and sums (fp32 [k]:
        x is read as bf16(x + sums)) exactly for the `_na` one."""
        n, k, cols = (_int(v, nm, self.name) for v, nm in ((n, "n"), (k, "k"), (cols, "cols")))
        if cols > self.cols:
            raise LaunchError(f"kernel {self.name}: cols = {cols} exceeds its {self.cols}; use a wider variant")
        self._divisible("k", k, "K")
        if (r is None) != (self.epilogue != "residual"):
            raise LaunchError(f"kernel {self.name}: pass r exactly for the residual epilogue")
        if (norm is None) == self.norm:
            raise LaunchError(f"kernel {self.name}: pass norm=(nw, eps) exactly for a {NORM_SUFFIX} variant "
                              f"({norm_variant_name()})")
        if (sums is None) == self.add:
            raise LaunchError(f"kernel {self.name}: pass sums= exactly for the {NORM_SUFFIX}a variant")
        if self.epilogue == "swiglu" and n % 2:
            raise LaunchError(f"kernel {self.name}: swiglu needs an even row count (gate | up), got {n}")
        m = n // 2 if self.epilogue == "swiglu" else n
        args: list = [TensorArg(_buf(w, "w", self.name, n * k * BF16), (n, k), (k,)),
                      TensorArg(_buf(x, "x", self.name, cols * k * BF16), (cols, k), (k,))]
        if r is not None:
            args.append(TensorArg(_buf(r, "r", self.name, cols * m * BF16, align=2), (cols, m), (m,)))
        eps = None
        if norm is not None:
            nw, eps = self._norm_args(norm)
            args.append(TensorArg(_buf(nw, "nw", self.name, k * BF16), (k,)))
        args.append(TensorArg(_buf(y, "y", self.name, cols * m * BF16, align=2), (cols, m), (m,)))
        if eps is not None:
            args.append(eps)
        if sums is not None:
            args.append(TensorArg(_buf(sums, "sums", self.name, k * 4), (k,)))
        self._launch(args, {"N": n, "M": m, "K": k, "T": cols}, stream)

    def _norm_args(self, norm: Any) -> tuple[DeviceBuffer, float]:
        """(nw, eps) from the `norm` pair, eps a finite float > 0."""
        if not isinstance(norm, tuple) or len(norm) != 2:
            raise LaunchError(f"kernel {self.name}: norm must be the pair (nw, eps), got {type(norm).__name__}")
        nw, eps = norm
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not 0 < eps < math.inf:
            raise LaunchError(f"kernel {self.name}: norm eps must be a finite number > 0, got {eps!r}")
        return nw, float(eps)
