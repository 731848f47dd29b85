"""Kernel launches: `launch()` validates and launches; `Launch` pre-validates once for hot loops.

Launches are asynchronous. `stream=None` is the legacy default stream, which does not order with
streams made by `Stream.create()` (non-blocking): pass the same stream to dependent work, or sync.
"""

from __future__ import annotations

from typing import Any, Sequence

from inferno.cuda.driver import driver
from inferno.cuda.errors import LaunchError, raise_for
from inferno.cuda.module import Kernel
from inferno.cuda.params import PackedParams
from inferno.cuda.stream import stream_handle as _stream

_STATIC_SMEM_LIMIT = 48 * 1024
_GRID_MAX = (2**31 - 1, 65535, 65535)
_BLOCK_MAX = (1024, 1024, 64)


def _dims(v: Any, what: str, kernel: str, limits: Sequence[int]) -> tuple[int, int, int]:
    if isinstance(v, int) and not isinstance(v, bool):
        v = (v,)
    try:
        t = tuple(int(x.__index__()) for x in v)
    except (TypeError, AttributeError):
        raise LaunchError(f"kernel {kernel}: {what} must be an int or 1-3 ints, got {v!r}") from None
    if not 1 <= len(t) <= 3:
        raise LaunchError(f"kernel {kernel}: {what} must have 1-3 dimensions, got {v!r}")
    t = t + (1,) * (3 - len(t))
    for x, lim in zip(t, limits):
        if not 1 <= x <= lim:
            raise LaunchError(f"kernel {kernel}: {what} {t} is out of range (each dimension 1..{list(limits)})")
    return t


def _validate(kernel: Kernel, grid, block, params: PackedParams, smem: int, cluster):
    if not isinstance(kernel, Kernel):
        raise LaunchError(f"launch needs a Kernel, got {type(kernel).__name__}")
    if not isinstance(params, PackedParams):
        raise LaunchError(f"kernel {kernel.name}: params must be PackedParams (pack_params), got {type(params).__name__}")
    g = _dims(grid, "grid", kernel.name, _GRID_MAX)
    b = _dims(block, "block", kernel.name, _BLOCK_MAX)
    if b[0] * b[1] * b[2] > 1024:
        raise LaunchError(f"kernel {kernel.name}: block {b} has {b[0] * b[1] * b[2]} threads, more than 1024")
    if not isinstance(smem, int) or smem < 0:
        raise LaunchError(f"kernel {kernel.name}: dynamic smem must be a non-negative int, got {smem!r}")
    if smem > _STATIC_SMEM_LIMIT and smem > kernel.max_dynamic_smem:
        raise LaunchError(f"kernel {kernel.name}: {smem} bytes of dynamic smem need "
                          f"kernel.set_max_dynamic_smem({smem}) first")
    c = None
    if cluster is not None:
        c = _dims(cluster, "cluster", kernel.name, (8, 8, 8))
        if any(gi % ci for gi, ci in zip(g, c)):
            raise LaunchError(f"kernel {kernel.name}: grid {g} is not a multiple of cluster {c}")
        if c == (1, 1, 1):
            c = None
    kernel.check_layout(params.layout)
    return g, b, c


def _ex_config(g, b, smem: int, c, pdl: bool) -> Any:
    """A cuLaunchKernelEx config with the cluster dimension `c` (or None) and, with `pdl`, the
    programmatic stream serialization attribute."""
    cu = driver()
    attrs = []
    if c is not None:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = c
        attrs.append(attr)
    if pdl:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        attrs.append(attr)
    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = g
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = b
    cfg.sharedMemBytes = smem
    cfg.attrs = attrs
    cfg.numAttrs = len(attrs)
    return cfg


def _pdl(kernel: Kernel, stream: Any) -> bool:
    """Launch early (PDL) when the kernel waits for its predecessor in-kernel and the stream asks for it."""
    return kernel.pdl and getattr(stream, "pdl", False)


def launch(kernel: Kernel, grid, block, params: PackedParams, smem: int = 0, stream: Any = None,
           cluster: tuple | None = None) -> None:
    """Validate and launch `kernel` (cuLaunchKernel; cuLaunchKernelEx for a cluster > 1 or a PDL launch)."""
    g, b, c = _validate(kernel, grid, block, params, smem, cluster)
    cu = driver()
    pdl = _pdl(kernel, stream)
    if c is None and not pdl:
        (err,) = cu.cuLaunchKernel(kernel.handle, g[0], g[1], g[2], b[0], b[1], b[2], smem, _stream(stream),
                                   params.address, 0)
        if err:
            raise_for(err, "cuLaunchKernel", f"kernel {kernel.name} grid {g} block {b} smem {smem}")
    else:
        cfg = _ex_config(g, b, smem, c, pdl)
        cfg.hStream = _stream(stream)
        (err,) = cu.cuLaunchKernelEx(cfg, kernel.handle, params.address, 0)
        if err:
            raise_for(err, "cuLaunchKernelEx", f"kernel {kernel.name} grid {g} block {b} cluster {c} smem {smem}")


class Launch:
    """A launch validated once; calling it (`launch_obj(stream)`) only calls the driver.

    The PackedParams stay referenced: rewrite them in place (`params.set(...)`) between calls.
    """

    __slots__ = ("kernel", "params", "grid", "block", "smem", "cluster", "_fn", "_args", "_cfg", "_pdl_cfg")

    def __init__(self, kernel: Kernel, grid, block, params: PackedParams, smem: int = 0, cluster: tuple | None = None):
        g, b, c = _validate(kernel, grid, block, params, smem, cluster)
        self.kernel, self.params, self.grid, self.block, self.smem, self.cluster = kernel, params, g, b, smem, c
        cu = driver()
        self._fn = cu.cuLaunchKernel
        self._args = (kernel.handle, g[0], g[1], g[2], b[0], b[1], b[2], smem)
        self._cfg = _ex_config(g, b, smem, c, False) if c is not None else None
        self._pdl_cfg = _ex_config(g, b, smem, c, True) if kernel.pdl else None

    def __call__(self, stream: Any = None) -> None:
        cfg = self._pdl_cfg if self._pdl_cfg is not None and getattr(stream, "pdl", False) else self._cfg
        if cfg is None:
            (err,) = self._fn(*self._args, _stream(stream), self.params.address, 0)
        else:
            cfg.hStream = _stream(stream)
            (err,) = driver().cuLaunchKernelEx(cfg, self.kernel.handle, self.params.address, 0)
        if err:
            raise_for(err, "cuLaunchKernelEx" if cfg is not None else "cuLaunchKernel",
                      f"kernel {self.kernel.name} grid {self.grid} block {self.block} smem {self.smem}")
