"""Kernel variants of the NVFP4 decode GEMV (`cute_kernels/gemv_nvfp4.py`) and their launcher.

One variant per (epilogue, column count T): `gemv_nvfp4_t<T>[_res|_swiglu]`, T in 1, 2, 4, 8
(a variant accepts any 1 <= T <= its T). Host arguments, in order:
  w  int32 [WL]           the `blockscale-k16-m128x4-v1` payload, as is (docs/artifact-format.md)
  x  bf16  [T, K]         row stride x_stride
  r  bf16  [T, M]         residual (the `_res` variants only)
  y  bf16  [T, M]         M = weight rows (plain, residual) or weight rows / 2 (swiglu)
Grid: one CTA per `outs` outputs (rows_for(T) weight rows; half as many outputs for swiglu).
The weight matrix is [N, K] with N % 128 == 0 and K % 64 == 0 (the layout's own rule).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferno.artifact.formats.nvfp4 import geometry
from inferno.cuda.errors import LaunchError
from inferno.cuda.launch import launch
from inferno.cuda.memory import DeviceBuffer
from inferno.cuda.params import TensorArg
from inferno.errors import ArtifactError
from inferno.kernels.launchers import _buf, _int
from inferno.kernels.registry import Tensor, Variant

if TYPE_CHECKING:
    from inferno.cuda.device import Device
    from inferno.kernels.cache import LoadedKernel

FORMAT = "NVFP4"
COLS = (1, 2, 4, 8)
EPILOGUES = {"plain": "", "residual": "_res", "swiglu": "_swiglu"}
THREADS = 128


def rows_for(cols: int) -> int:
    """Weight rows per CTA: 4 (x reused 4 times), 2 at T = 8 to bound registers."""
    return 4 if cols <= 4 else 2


def variant_name(epilogue: str = "plain", cols: int = 1) -> str:
    """The variant with `epilogue` that takes `cols` columns (the smallest T >= cols)."""
    if epilogue not in EPILOGUES:
        raise LaunchError(f"unknown GEMV epilogue {epilogue!r}; epilogues: {', '.join(EPILOGUES)}")
    t = next((c for c in COLS if c >= cols), None)
    if t is None or cols < 1:
        raise LaunchError(f"GEMV takes 1..{COLS[-1]} columns, got {cols}; split the batch")
    return f"gemv_nvfp4_t{t}{EPILOGUES[epilogue]}"


def make_variant(epilogue: str, cols: int) -> Variant:
    rows = rows_for(cols)
    outs = rows // 2 if epilogue == "swiglu" else rows
    w = Tensor("w", "i32", ("WL",), (1,))
    x = Tensor("x", "bf16", ("T", "K"), ("x_stride", 1))
    y = Tensor("y", "bf16", ("T", "M"), ("y_stride", 1))
    r = Tensor("r", "bf16", ("T", "M"), ("r_stride", 1)) if epilogue == "residual" else None
    what = {"plain": "y = W x", "residual": "y = r + W x",
            "swiglu": "out = silu(W[:I] x) * (W[I:] x)"}[epilogue]
    return Variant(
        name=variant_name(epilogue, cols), op="gemv_nvfp4", source="cute_kernels.gemv_nvfp4", cls="GemvNvfp4",
        config=dict(cols=cols, epilogue=epilogue, rows=rows, threads=THREADS),
        args=(w, x, r, y), grid=(f"cdiv(M, {outs})", "1", "1"),
        divisibility={"K": 64, "x_stride": 8},
        pdl=True,
        summary=f"{what}, W NVFP4 blockscale-k16-m128x4-v1, x bf16 [T<={cols}, K], fp32 accumulate",
    )


GEMV_NVFP4_VARIANTS: tuple[Variant, ...] = tuple(make_variant(epi, cols) for epi in EPILOGUES for cols in COLS)
_BY_NAME = {v.name: v for v in GEMV_NVFP4_VARIANTS}


def gemv_nvfp4_variant(name: str) -> Variant:
    """The NVFP4 GEMV variant called `name`."""
    v = _BY_NAME.get(name)
    if v is None:
        raise LaunchError(f"no NVFP4 GEMV variant {name!r}; names look like {GEMV_NVFP4_VARIANTS[0].name}")
    return v


def payload_bytes(n: int, k: int, kernel: str = "gemv_nvfp4") -> int:
    """Bytes of an NVFP4 [n, k] payload; LaunchError when the layout cannot hold that shape."""
    try:
        return geometry((n, k)).nbytes
    except ArtifactError:
        raise LaunchError(f"kernel {kernel}: NVFP4 needs n % 128 == 0 and k % 64 == 0, got [{n}, {k}]") from None


class GemvNvfp4:
    """Typed launcher: y[t] = epilogue(W x[t]) for t < cols, W an NVFP4 payload on the device."""

    def __init__(self, loaded: "LoadedKernel"):
        self.loaded = loaded
        self.name = loaded.variant.name
        c = loaded.manifest.config
        self.cols, self.epilogue = c["cols"], c["epilogue"]
        self.outs = c["rows"] // 2 if self.epilogue == "swiglu" else c["rows"]
        if loaded.manifest.grid != [f"cdiv(M, {self.outs})", "1", "1"]:
            raise LaunchError(f"kernel {self.name}: manifest grid {loaded.manifest.grid} is not this launcher's")

    @classmethod
    def load(cls, name: str, device: "Device | None" = None) -> "GemvNvfp4":
        from inferno.kernels.cache import load

        return cls(load(gemv_nvfp4_variant(name), device))

    def __call__(self, w: DeviceBuffer, x: DeviceBuffer, y: DeviceBuffer, n: int, k: int, cols: int, *,
                 r: DeviceBuffer | None = None, stream: Any = None) -> None:
        """W is [n, k] (n = 2I for swiglu); x [cols, k], y (and r) [cols, n or I], contiguous bf16."""
        n, k, cols = (_int(v, nm, self.name) for v, nm in ((n, "n"), (k, "k"), (cols, "cols")))
        if cols > self.cols:
            raise LaunchError(f"kernel {self.name}: cols = {cols} exceeds its {self.cols}; use a wider variant")
        nbytes = payload_bytes(n, k, self.name)
        if (r is None) != (self.epilogue != "residual"):
            raise LaunchError(f"kernel {self.name}: pass r exactly for the residual epilogue")
        m = n // 2 if self.epilogue == "swiglu" else n
        args: list = [TensorArg(_buf(w, "w", self.name, nbytes), (-(-nbytes // 4),)),
                      TensorArg(_buf(x, "x", self.name, cols * k * 2), (cols, k), (k,))]
        if r is not None:
            args.append(TensorArg(_buf(r, "r", self.name, cols * m * 2, align=2), (cols, m), (m,)))
        args.append(TensorArg(_buf(y, "y", self.name, cols * m * 2, align=2), (cols, m), (m,)))
        mf = self.loaded.manifest
        launch(self.loaded.kernel, (-(-m // self.outs), 1, 1), mf.block, self.loaded.layout.pack(args), mf.smem,
               stream)
