"""Kernel variants for sampling on the device: greedy argmax over bf16 logits, and its launcher.

`SAMPLE_VARIANTS` (the lead adds them to the registry's table):
  argmax_bf16   out[0] = first index of the maximum of x bf16 [N] (N a multiple of 8), one CTA

`Argmax.for_device(device)` loads it from the kernel cache (building it where the DSL is).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferno.cuda.errors import LaunchError
from inferno.cuda.launch import launch
from inferno.cuda.memory import DeviceBuffer
from inferno.cuda.params import TensorArg
from inferno.kernels.manifest import eval_grid
from inferno.kernels.registry import Tensor, Variant

if TYPE_CHECKING:
    from inferno.cuda.device import Device
    from inferno.kernels.cache import LoadedKernel

ARGMAX = Variant(
    name="argmax_bf16", op="argmax", source="cute_kernels.argmax", cls="Argmax",
    config=dict(threads=1024),
    args=(Tensor("x", "bf16", ("N",), (1,)), Tensor("out", "i32", (1,), (1,), align=4)),
    grid=("1", "1", "1"),
    divisibility={"N": 8},
    summary="greedy sampling: first index of the maximum of bf16 logits [N], one CTA",
)

SAMPLE_VARIANTS: tuple[Variant, ...] = (ARGMAX,)


class Argmax:
    """Typed launcher: out[0] (int32) = argmax of x bf16 [n]."""

    def __init__(self, loaded: "LoadedKernel"):
        self.loaded = loaded
        self.name = loaded.variant.name

    @classmethod
    def for_device(cls, device: "Device | None" = None) -> "Argmax":
        from inferno.cuda.device import Device
        from inferno.kernels.cache import load

        return cls(load(ARGMAX, device or Device.open()))

    def __call__(self, x: DeviceBuffer, out: DeviceBuffer, n: int, *, stream: Any = None) -> None:
        from inferno.kernels.launchers import _buf, _int

        n = _int(n, "n", self.name)
        if n % 8:
            raise LaunchError(f"kernel {self.name}: n = {n} must be a multiple of 8")
        px = _buf(x, "x", self.name, n * 2)
        po = _buf(out, "out", self.name, 4, align=4)
        m = self.loaded.manifest
        args = []
        for p in m.params:
            args.append(TensorArg(px, (n,)) if p.name == "x" else TensorArg(po))
        launch(self.loaded.kernel, eval_grid(m.grid, {"N": n}), m.block, self.loaded.layout.pack(args), m.smem, stream)
