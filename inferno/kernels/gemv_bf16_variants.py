"""Kernel variants of the bf16 decode GEMV (`cute_kernels/gemv_bf16.py`) and their launcher.

One variant per column count T: `gemv_bf16_t<T>`, T in 1, 2, 4, 8 (a variant accepts any
1 <= T <= its T). Host arguments, in order:
  w  bf16 [N, K]   row stride w_stride (K a multiple of 8)
  x  bf16 [T, K]   row stride x_stride
  y  bf16 [T, N]   row stride y_stride
Grid: one CTA per rows_for(T) weight rows.
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
THREADS = 128


def rows_for(cols: int) -> int:
    """Weight rows per CTA: 1 at T = 1 (small N still fills the GPU), more as x reuse pays off."""
    return 1 if cols == 1 else 2 if cols <= 4 else 4


def variant_name(cols: int = 1) -> str:
    """The variant that takes `cols` columns (the smallest T >= cols)."""
    t = next((c for c in COLS if c >= cols), None)
    if t is None or cols < 1:
        raise LaunchError(f"bf16 GEMV takes 1..{COLS[-1]} columns, got {cols}; split the batch")
    return f"gemv_bf16_t{t}"


def make_variant(cols: int, rows: int | None = None, threads: int = THREADS, unroll: int = 2) -> Variant:
    """The variant for `cols` columns; rows/threads/unroll other than the defaults (for tuning) add
    `_r<rows>_n<threads>_u<unroll>` to the name."""
    name = variant_name(cols)
    rows = rows or rows_for(cols)
    if (rows, threads, unroll) != (rows_for(cols), THREADS, 2):
        name += f"_r{rows}_n{threads}_u{unroll}"
    return Variant(
        name=name, op="gemv_bf16", source="cute_kernels.gemv_bf16", cls="GemvBf16",
        config=dict(cols=cols, rows=rows, threads=threads, unroll=unroll),
        args=(Tensor("w", "bf16", ("N", "K"), ("w_stride", 1)), Tensor("x", "bf16", ("T", "K"), ("x_stride", 1)),
              Tensor("y", "bf16", ("T", "N"), ("y_stride", 1), align=2)),
        grid=(f"cdiv(N, {rows})", "1", "1"),
        divisibility={"K": 8, "w_stride": 8, "x_stride": 8},
        summary=f"y = W x, W bf16 [N, K], x bf16 [T<={cols}, K], {rows} row(s) per CTA, fp32 accumulate",
    )


GEMV_BF16_VARIANTS: tuple[Variant, ...] = tuple(make_variant(c) for c in COLS)


class GemvBf16(Launcher):
    """y[t] = W x[t] for t < cols; W [n, k], x [cols, k], y [cols, n], contiguous bf16 on the device."""

    op = "gemv_bf16"

    def __init__(self, loaded):
        super().__init__(loaded)
        self.cols, self.rows = self.config["cols"], self.config["rows"]

    @classmethod
    def load(cls, cols: int = 1, device: "Device | None" = None) -> "GemvBf16":
        """The launcher of the variant for `cols` columns."""
        from inferno.kernels.cache import load
        from inferno.kernels.registry import get

        return cls(load(get(variant_name(cols)), device))

    def __call__(self, w: DeviceBuffer, x: DeviceBuffer, y: DeviceBuffer, n: int, k: int, cols: int = 1, *,
                 stream: Any = None) -> None:
        n, k, cols = (_int(v, nm, self.name) for v, nm in ((n, "n"), (k, "k"), (cols, "cols")))
        if cols > self.cols:
            raise LaunchError(f"kernel {self.name}: cols = {cols} exceeds its {self.cols}; use a wider variant")
        self._divisible("k", k, "K")
        args = [TensorArg(_buf(w, "w", self.name, n * k * BF16), (n, k), (k,)),
                TensorArg(_buf(x, "x", self.name, cols * k * BF16), (cols, k), (k,)),
                TensorArg(_buf(y, "y", self.name, cols * n * BF16, align=2), (cols, n), (n,))]
        self._launch(args, {"N": n, "K": k, "T": cols}, stream)
