"""Kernel variants of the bf16 decode GEMV (`cute_kernels/gemv_bf16.py`) and their launcher.

One variant per (epilogue, column count T): `gemv_bf16_t<T>[_res|_swiglu]`, T in 1, 2, 4, 8
(a variant accepts any 1 <= T <= its T). Host arguments, in order:
  w  bf16 [N, K]   row stride w_stride (K a multiple of 8)
  x  bf16 [T, K]   row stride x_stride
  r  bf16 [T, M]   residual (the `_res` variants only)
  y  bf16 [T, M]   M = N (plain, residual) or N / 2 (swiglu: W rows = [gate I | up I])
Grid: one CTA per `outs` outputs (rows weight rows; half as many outputs for swiglu).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import DeviceBuffer
from inferno.cuda.params import TensorArg
from inferno.kernels.launchers import BF16, Launcher, _buf, _int
from inferno.kernels.registry import Tensor, Variant

if TYPE_CHECKING:
    from inferno.cuda.device import Device

COLS = (1, 2, 4, 8)
EPILOGUES = {"plain": "", "residual": "_res", "swiglu": "_swiglu"}
THREADS = 128


def rows_for(cols: int, epilogue: str = "plain") -> int:
    """Weight rows per CTA: 1 at T = 1 (small N still fills the GPU), more as x reuse pays off;
    at least 2 for swiglu (the gate and up rows of an output)."""
    rows = 1 if cols == 1 else 2 if cols <= 4 else 4
    return max(rows, 2) if epilogue == "swiglu" else rows


def variant_name(cols: int = 1, epilogue: str = "plain") -> str:
    """The variant with `epilogue` that takes `cols` columns (the smallest T >= cols)."""
    if epilogue not in EPILOGUES:
        raise LaunchError(f"unknown GEMV epilogue {epilogue!r}; epilogues: {', '.join(EPILOGUES)}")
    t = next((c for c in COLS if c >= cols), None)
    if t is None or cols < 1:
        raise LaunchError(f"bf16 GEMV takes 1..{COLS[-1]} columns, got {cols}; split the batch")
    return f"gemv_bf16_t{t}{EPILOGUES[epilogue]}"


def make_variant(cols: int, rows: int | None = None, threads: int = THREADS, unroll: int = 2,
                 epilogue: str = "plain") -> Variant:
    """The variant for `cols` columns and `epilogue`; rows/threads/unroll other than the defaults
    (for tuning) add `_r<rows>_n<threads>_u<unroll>` to the name."""
    name = variant_name(cols, epilogue)
    rows = rows or rows_for(cols, epilogue)
    if (rows, threads, unroll) != (rows_for(cols, epilogue), THREADS, 2):
        name += f"_r{rows}_n{threads}_u{unroll}"
    outs = rows // 2 if epilogue == "swiglu" else rows
    r = Tensor("r", "bf16", ("T", "M"), ("r_stride", 1), align=2) if epilogue == "residual" else None
    what = {"plain": "y = W x", "residual": "y = r + W x", "swiglu": "out = silu(W[:I] x) * (W[I:] x)"}[epilogue]
    return Variant(
        name=name, op="gemv_bf16", source="cute_kernels.gemv_bf16", cls="GemvBf16",
        config=dict(cols=cols, rows=rows, threads=threads, unroll=unroll, epilogue=epilogue),
        args=(Tensor("w", "bf16", ("N", "K"), ("w_stride", 1)), Tensor("x", "bf16", ("T", "K"), ("x_stride", 1)),
              r, Tensor("y", "bf16", ("T", "M"), ("y_stride", 1), align=2)),
        grid=(f"cdiv(M, {outs})", "1", "1"),
        divisibility={"K": 8, "w_stride": 8, "x_stride": 8},
        pdl=True,
        summary=f"{what}, W bf16 [N, K], x bf16 [T<={cols}, K], {rows} row(s) per CTA, fp32 accumulate",
    )


GEMV_BF16_VARIANTS: tuple[Variant, ...] = tuple(make_variant(c, epilogue=e) for e in EPILOGUES for c in COLS)


class GemvBf16(Launcher):
    """y[t] = epilogue(W x[t]) for t < cols; W [n, k], x [cols, k], y (and r) [cols, n or n / 2],
    contiguous bf16 on the device."""

    op = "gemv_bf16"

    def __init__(self, loaded):
        super().__init__(loaded)
        self.cols, self.rows = self.config["cols"], self.config["rows"]
        self.epilogue = self.config.get("epilogue", "plain")

    @classmethod
    def load(cls, cols: int = 1, device: "Device | None" = None, epilogue: str = "plain") -> "GemvBf16":
        """The launcher of the variant for `cols` columns and `epilogue`."""
        from inferno.kernels.cache import load
        from inferno.kernels.registry import get

        return cls(load(get(variant_name(cols, epilogue)), device))

    def __call__(self, w: DeviceBuffer, x: DeviceBuffer, y: DeviceBuffer, n: int, k: int, cols: int = 1, *,
                 r: DeviceBuffer | None = None, stream: Any = None) -> None:
        """W is [n, k] (n = 2I for swiglu); pass r exactly for the residual epilogue."""
        n, k, cols = (_int(v, nm, self.name) for v, nm in ((n, "n"), (k, "k"), (cols, "cols")))
        if cols > self.cols:
            raise LaunchError(f"kernel {self.name}: cols = {cols} exceeds its {self.cols}; use a wider variant")
        self._divisible("k", k, "K")
        if (r is None) != (self.epilogue != "residual"):
            raise LaunchError(f"kernel {self.name}: pass r exactly for the residual epilogue")
        if self.epilogue == "swiglu" and n % 2:
            raise LaunchError(f"kernel {self.name}: swiglu needs an even row count (gate | up), got {n}")
        m = n // 2 if self.epilogue == "swiglu" else n
        args = [TensorArg(_buf(w, "w", self.name, n * k * BF16), (n, k), (k,)),
                TensorArg(_buf(x, "x", self.name, cols * k * BF16), (cols, k), (k,))]
        if r is not None:
            args.append(TensorArg(_buf(r, "r", self.name, cols * m * BF16, align=2), (cols, m), (m,)))
        args.append(TensorArg(_buf(y, "y", self.name, cols * m * BF16, align=2), (cols, m), (m,)))
        self._launch(args, {"N": n, "M": m, "K": k, "T": cols}, stream)
