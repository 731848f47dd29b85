"""Kernel variants of the quantized decode GEMV (`cute_kernels/gemv_q.py`) and their launcher.

One variant per (format, epilogue, column count T): `gemv_<q4|q5|q6|w8>_t<T>[_res|_swiglu]`,
T in 1, 2, 4, 8 (a variant accepts any 1 <= T <= its T). Host arguments, in order:
  w  int32 [WL]           the format's `row-split-k128-v1` payload, as is (see docs/kernels-gemv.md)
  x  bf16  [T, K]         row stride x_stride
  r  bf16  [T, M]         residual (the `_res` variants only)
  y  bf16  [T, M]         M = weight rows (plain, residual) or weight rows / 2 (swiglu)
Grid: one CTA per `outs` outputs (rows_for(T) weight rows; half as many outputs for swiglu).

The registry holds E's variants; these are listed in GEMV_VARIANTS until they join its VARIANTS.
`GemvQ.load(name)` loads one from the kernel cache (`inferno.kernels.cache.load` takes a Variant).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from inferno.artifact.formats.groupwise import geometry
from inferno.cuda.errors import LaunchError
from inferno.cuda.launch import launch
from inferno.cuda.memory import DeviceBuffer
from inferno.cuda.params import TensorArg
from inferno.kernels.launchers import _buf, _int
from inferno.kernels.registry import Tensor, Variant

if TYPE_CHECKING:
    from inferno.cuda.device import Device
    from inferno.kernels.cache import LoadedKernel

FORMATS = {  # format -> (short name, bits, group)
    "Q4G64_F16S": ("q4", 4, 64),
    "Q5G64_F16S": ("q5", 5, 64),
    "Q6G64_F16S": ("q6", 6, 64),
    "W8G32_F16S": ("w8", 8, 32),
}
COLS = (1, 2, 4, 8)
EPILOGUES = {"plain": "", "residual": "_res", "swiglu": "_swiglu"}

def rows_for(cols: int) -> int:
    """Weight rows per CTA: 4 (x reused 4 times), 2 at T = 8 to stay within 255 registers."""
    return 4 if cols <= 4 else 2

THREADS = 128


def variant_name(fmt: str, epilogue: str = "plain", cols: int = 1) -> str:
    """The variant for `fmt` with `epilogue` that takes `cols` columns (the smallest T >= cols)."""
    if fmt not in FORMATS:
        raise LaunchError(f"no GEMV kernel for weight format {fmt!r}; formats: {', '.join(FORMATS)}")
    if epilogue not in EPILOGUES:
        raise LaunchError(f"unknown GEMV epilogue {epilogue!r}; epilogues: {', '.join(EPILOGUES)}")
    t = next((c for c in COLS if c >= cols), None)
    if t is None or cols < 1:
        raise LaunchError(f"GEMV takes 1..{COLS[-1]} columns, got {cols}; split the batch")
    return f"gemv_{FORMATS[fmt][0]}_t{t}{EPILOGUES[epilogue]}"


def gemv_tensors(epilogue: str) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """The tensor arguments (w, x, r, y) of a quantized decode GEMV: w int32 words, x bf16 [T, K],
    r (residual epilogue only) and y bf16 [T, M]."""
    return (Tensor("w", "i32", ("WL",), (1,)), Tensor("x", "bf16", ("T", "K"), ("x_stride", 1)),
            Tensor("r", "bf16", ("T", "M"), ("r_stride", 1)) if epilogue == "residual" else None,
            Tensor("y", "bf16", ("T", "M"), ("y_stride", 1)))


def make_variant(fmt: str, epilogue: str, cols: int, rows: int | None = None,
                 threads: int = THREADS, inplace: bool = True, unroll: int = 1,
                 regconst: bool = True) -> Variant:
    """The variant for (fmt, epilogue, cols); rows/threads other than the defaults (for tuning)
    add `_r<rows>_n<threads>` to the name, the shift decode (inplace=False) `_shift`, a chunk-loop
    unroll `_u<unroll>`, 2^23 and sign-XOR constants as immediates (regconst=False, the old code) `_immc`."""
    _, bits, group = FORMATS[fmt]
    name = variant_name(fmt, epilogue, cols)
    rows = rows or rows_for(cols)
    if (rows, threads) != (rows_for(cols), THREADS):
        name += f"_r{rows}_n{threads}"
    if not inplace:
        name += "_shift"
    if unroll != 1:
        name += f"_u{unroll}"
    if not regconst:
        name += "_immc"
    outs = rows // 2 if epilogue == "swiglu" else rows
    w, x, r, y = gemv_tensors(epilogue)
    what = {"plain": "y = W x", "residual": "y = r + W x",
            "swiglu": "out = silu(W[:I] x) * (W[I:] x)"}[epilogue]
    return Variant(
        name=name, op="gemv_q", source="cute_kernels.gemv_q", cls="GemvQ",
        config=dict(bits=bits, group=group, cols=cols, epilogue=epilogue, rows=rows, threads=threads,
                    inplace=inplace, unroll=unroll, regconst=regconst),
        args=(w, x, r, y), grid=(f"cdiv(M, {outs})", "1", "1"),
        divisibility={"K": 8, "x_stride": 8},
        pdl=True,
        summary=f"{what}, W {fmt} row-split-k128-v1, x bf16 [T<={cols}, K], fp32 accumulate",
    )


GEMV_VARIANTS: tuple[Variant, ...] = tuple(
    make_variant(fmt, epi, cols) for fmt in FORMATS for epi in EPILOGUES for cols in COLS)
_BY_NAME = {v.name: v for v in GEMV_VARIANTS}


def gemv_variant(name: str) -> Variant:
    """The GEMV variant called `name`."""
    v = _BY_NAME.get(name)
    if v is None:
        raise LaunchError(f"no GEMV variant {name!r}; names look like {GEMV_VARIANTS[0].name}")
    return v


@lru_cache(maxsize=1024)
def _payload_bytes(fmt: str, n: int, k: int) -> int:
    return geometry(fmt, (n, k)).nbytes


def gemv_args(name: str, max_cols: int, epilogue: str, weight_bytes: Callable[[int, int], int], w: DeviceBuffer,
              x: DeviceBuffer, y: DeviceBuffer, n: int, k: int, cols: int,
              r: DeviceBuffer | None) -> tuple[int, list]:
    """The checked arguments of a quantized decode GEMV call: (outputs M, [w, x, (r,) y] tensor args);
    `weight_bytes(n, k)` is the size of W in the layout the kernel reads."""
    n, k, cols = (_int(v, nm, name) for v, nm in ((n, "n"), (k, "k"), (cols, "cols")))
    if cols > max_cols:
        raise LaunchError(f"kernel {name}: cols = {cols} exceeds its {max_cols}; use a wider variant")
    if k % 8:
        raise LaunchError(f"kernel {name}: k = {k} must be a multiple of 8")
    if epilogue == "swiglu" and n % 2:
        raise LaunchError(f"kernel {name}: swiglu needs an even row count (gate | up), got {n}")
    if (r is None) != (epilogue != "residual"):
        raise LaunchError(f"kernel {name}: pass r exactly for the residual epilogue")
    m = n // 2 if epilogue == "swiglu" else n
    nbytes = weight_bytes(n, k)
    args: list = [TensorArg(_buf(w, "w", name, nbytes), (nbytes // 4,)),
                  TensorArg(_buf(x, "x", name, cols * k * 2), (cols, k), (k,))]
    if r is not None:
        args.append(TensorArg(_buf(r, "r", name, cols * m * 2, align=2), (cols, m), (m,)))
    args.append(TensorArg(_buf(y, "y", name, cols * m * 2, align=2), (cols, m), (m,)))
    return m, args


class GemvQ:
    """Typed launcher: y[t] = epilogue(W x[t]) for t < cols, W a row-split-k128-v1 payload on device."""

    def __init__(self, loaded: "LoadedKernel"):
        self.loaded = loaded
        self.name = loaded.variant.name
        c = loaded.manifest.config
        self.bits, self.group, self.cols, self.epilogue = c["bits"], c["group"], c["cols"], c["epilogue"]
        self.fmt = next(f for f, (_, b, g) in FORMATS.items() if (b, g) == (self.bits, self.group))
        self.outs = c["rows"] // 2 if self.epilogue == "swiglu" else c["rows"]
        if loaded.manifest.grid != [f"cdiv(M, {self.outs})", "1", "1"]:
            raise LaunchError(f"kernel {self.name}: manifest grid {loaded.manifest.grid} is not this launcher's")

    @classmethod
    def load(cls, name: str, device: "Device | None" = None) -> "GemvQ":
        from inferno.kernels.cache import load

        return cls(load(gemv_variant(name), device))

    def __call__(self, w: DeviceBuffer, x: DeviceBuffer, y: DeviceBuffer, n: int, k: int, cols: int, *,
                 r: DeviceBuffer | None = None, stream: Any = None) -> None:
        """W is [n, k] (n = 2I for swiglu); x [cols, k], y (and r) [cols, n or I], contiguous bf16."""
        m, args = gemv_args(self.name, self.cols, self.epilogue, lambda n, k: _payload_bytes(self.fmt, n, k),
                            w, x, y, n, k, cols, r)
        mf = self.loaded.manifest
        launch(self.loaded.kernel, (-(-m // self.outs), 1, 1), mf.block, self.loaded.layout.pack(args), mf.smem,
               stream)


def build(out_dir: str, archs: tuple[str, ...] = ("sm_90a",), names: tuple[str, ...] | None = None) -> None:
    """Compile the GEMV variants (all, or `names`) into out_dir/<arch>/; progress to stderr."""
    from pathlib import Path

    from inferno.kernels.build import build_all

    vs = [v for v in GEMV_VARIANTS if names is None or v.name in names]
    build_all(vs, list(archs), Path(out_dir))


if __name__ == "__main__":
    import sys

    build(sys.argv[1], tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else ("sm_90a",),
          tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else None)
