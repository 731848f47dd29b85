"""Typed kernel-argument packing, validated before any driver call.

A kernel's parameters are described by `ParamSpec`s (from its manifest). `ParamLayout` turns
them into byte offsets once; `pack` writes arguments into one aligned ctypes buffer and builds
the `void*[]` array that cuLaunchKernel takes. `PackedParams.set`/`update` rewrite arguments in
place, so a decode step reuses the same buffers.

Kinds and layouts (the CuTe DSL ABI, research/cute-dsl.md §3):
  ptr  u64 device address        i32 / u32 / f32  4 bytes      i64 / u64  8 bytes
  tensor  struct {u64 ptr; i32 per dynamic shape mode; i64 per dynamic stride mode}, align 8
  tma  128-byte CUtensorMap, align 64       bytes  `size` raw bytes, align `align` (default 1)
"""

from __future__ import annotations

import ctypes
import math
import struct
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from inferno.cuda.errors import LaunchError

_FIXED = {"ptr": (8, 8), "i32": (4, 4), "u32": (4, 4), "i64": (8, 8), "u64": (8, 8), "f32": (4, 4), "tma": (128, 64)}
KINDS = tuple(_FIXED) + ("tensor", "bytes")
_INT_RANGE = {"i32": (-(2**31), 2**31 - 1), "u32": (0, 2**32 - 1), "i64": (-(2**63), 2**63 - 1),
              "u64": (0, 2**64 - 1), "ptr": (0, 2**64 - 1)}
_FMT = {"i32": "<i", "u32": "<I", "i64": "<q", "u64": "<Q", "ptr": "<Q", "f32": "<f"}
_BUF_ALIGN = 64


def tensor_layout(dyn_shape: int, dyn_stride: int) -> tuple[int, int, int]:
    """(size, offset of the i32 shapes, offset of the i64 strides) of a tensor parameter."""
    shape_off = 8
    stride_off = shape_off + 4 * dyn_shape
    stride_off += -stride_off % 8
    size = stride_off + 8 * dyn_stride
    return size + (-size % 8), shape_off, stride_off


@dataclass(frozen=True)
class ParamSpec:
    """One kernel parameter. `size`/`align` default to the kind's layout and are checked against it."""

    name: str
    kind: str
    size: int | None = None
    align: int | None = None
    dyn_shape: int = 0
    dyn_stride: int = 0

    def __post_init__(self):
        where = f"parameter {self.name!r}"
        if self.kind not in KINDS:
            raise LaunchError(f"{where}: unknown kind {self.kind!r}; use one of {', '.join(KINDS)}")
        if self.kind != "tensor" and (self.dyn_shape or self.dyn_stride):
            raise LaunchError(f"{where}: dyn_shape/dyn_stride apply to tensor parameters only")
        if self.dyn_shape < 0 or self.dyn_stride < 0:
            raise LaunchError(f"{where}: dyn_shape/dyn_stride must be >= 0")
        if self.kind in _FIXED:
            want = _FIXED[self.kind]
        elif self.kind == "tensor":
            want = (tensor_layout(self.dyn_shape, self.dyn_stride)[0], 8)
        else:  # bytes
            if self.size is None or self.size <= 0:
                raise LaunchError(f"{where}: kind 'bytes' needs a positive size")
            want = (self.size, self.align or 1)
            if want[1] & (want[1] - 1):
                raise LaunchError(f"{where}: align must be a power of two, got {want[1]}")
        for field, value, expect in (("size", self.size, want[0]), ("align", self.align, want[1])):
            if value is None:
                object.__setattr__(self, field, expect)
            elif value != expect:
                raise LaunchError(f"{where}: kind {self.kind!r} has {field} {expect}, the spec says {value}")


class TensorArg(NamedTuple):
    """Value of a tensor parameter: device address plus its dynamic shape (i32) and stride (i64) modes."""

    ptr: Any
    shape: Sequence[int] = ()
    stride: Sequence[int] = ()


def _describe(v: Any) -> str:
    r = repr(v)
    return f"{type(v).__name__} {r[:40] + '...' if len(r) > 43 else r}"


def _as_int(v: Any) -> int | None:
    if type(v) is int:
        return v
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        return int(v)
    return None


def _as_ptr(v: Any) -> int | None:
    p = _as_int(v)
    if p is None:
        p = _as_int(getattr(v, "ptr", None))
    return p


class ParamLayout:
    """Byte layout of a kernel's parameter list; packs argument lists into `PackedParams`."""

    def __init__(self, specs: Sequence[ParamSpec], kernel: str = "kernel"):
        self.kernel = kernel
        self.specs = tuple(specs)
        names = [s.name for s in self.specs]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise LaunchError(f"kernel {kernel}: duplicate parameter names {sorted(dup)}")
        self.index = {n: i for i, n in enumerate(names)}
        offsets, off = [], 0
        for s in self.specs:
            off += -off % s.align
            offsets.append(off)
            off += s.size
        self.offsets = tuple(offsets)
        self.nbytes = off
        self.sizes = tuple(s.size for s in self.specs)
        self._writers = tuple(self._writer(i, s) for i, s in enumerate(self.specs))

    def _bad(self, i: int, s: ParamSpec, expects: str, v: Any) -> LaunchError:
        return LaunchError(f"kernel {self.kernel}: argument {i} '{s.name}' expects {expects}, got {_describe(v)}")

    def _writer(self, i: int, s: ParamSpec) -> Callable[[Any, Any, int], None]:
        """A function (buffer, value, base) that validates `value` and writes it at base + offset."""
        off = self.offsets[i]
        kind = s.kind
        if kind in ("i32", "u32", "i64", "u64", "ptr"):
            lo, hi = _INT_RANGE[kind]
            packer = struct.Struct(_FMT[kind]).pack_into
            conv = _as_ptr if kind == "ptr" else _as_int
            expects = "a device address (int or DeviceBuffer)" if kind == "ptr" else f"{kind} (int in [{lo}, {hi}])"

            def write_int(buf, v, base):
                x = conv(v)
                if x is None or not lo <= x <= hi:
                    raise self._bad(i, s, expects, v)
                packer(buf, base + off, x)

            return write_int
        if kind == "f32":
            packer = struct.Struct("<f").pack_into

            def write_f32(buf, v, base):
                if isinstance(v, (bool, np.bool_)) or not isinstance(v, (float, int, np.floating, np.integer)):
                    raise self._bad(i, s, "f32 (a float)", v)
                x = float(v)
                if math.isfinite(x) and abs(x) > 3.4028234663852886e38:
                    raise self._bad(i, s, "f32 (a float within float32 range)", v)
                packer(buf, base + off, x)

            return write_f32
        if kind == "tensor":
            _size, shape_off, stride_off = tensor_layout(s.dyn_shape, s.dyn_stride)
            nsh, nst = s.dyn_shape, s.dyn_stride
            expects = (f"a tensor (ptr, shape[{nsh}], stride[{nst}])" if nsh or nst
                       else "a tensor address (int, DeviceBuffer or TensorArg(ptr))")
            pad = stride_off - shape_off - 4 * nsh
            pack = struct.Struct(f"<Q{nsh}i{pad}x{nst}q").pack_into  # the whole struct in one call

            def write_tensor(buf, v, base):
                if isinstance(v, tuple):
                    if len(v) != 3 and not (len(v) == 1 and not nsh and not nst):
                        raise self._bad(i, s, expects, v)
                    ptr, shape, stride = (tuple(v) + ((), ()))[:3]
                elif not nsh and not nst:
                    ptr, shape, stride = v, (), ()
                else:
                    raise self._bad(i, s, expects, v)
                p = _as_ptr(ptr)
                if p is None or not 0 <= p < 2**64 or len(shape) != nsh or len(stride) != nst:
                    raise self._bad(i, s, expects, v)
                try:
                    pack(buf, base + off, p, *shape, *stride)
                except struct.error:
                    raise self._bad(i, s, expects + " with i32 shapes and i64 strides", v) from None

            return write_tensor
        size = s.size  # tma, bytes

        def write_bytes(buf, v, base):
            if not isinstance(v, (bytes, bytearray, memoryview)) or len(v) != size:
                raise self._bad(i, s, f"{size} bytes" + (" (a CUtensorMap from encode_tiled)" if kind == "tma" else ""), v)
            ctypes.memmove(ctypes.addressof(buf) + base + off, v if type(v) is bytes else bytes(v), size)

        return write_bytes

    def pack(self, args: Sequence[Any]) -> "PackedParams":
        """Validate `args` against the specs and pack them into a new, reusable PackedParams."""
        packed = PackedParams(self)
        packed.update(args)
        return packed


class PackedParams:
    """Packed argument values plus the `void*[]` array pointing at each; `address` is for cuLaunchKernel."""

    __slots__ = ("layout", "_buf", "_base", "_ptrs", "address")

    def __init__(self, layout: ParamLayout):
        self.layout = layout
        self._buf = (ctypes.c_char * (layout.nbytes + _BUF_ALIGN))()
        start = ctypes.addressof(self._buf)
        self._base = -start % _BUF_ALIGN
        n = len(layout.specs)
        self._ptrs = (ctypes.c_void_p * max(n, 1))(*(start + self._base + o for o in layout.offsets))
        self.address: int = ctypes.addressof(self._ptrs)

    def update(self, args: Sequence[Any]) -> None:
        """Rewrite every argument (count and types are checked)."""
        lay = self.layout
        if len(args) != len(lay.specs):
            names = ", ".join(s.name for s in lay.specs)
            raise LaunchError(f"kernel {lay.kernel}: expects {len(lay.specs)} arguments ({names}), got {len(args)}")
        buf, base = self._buf, self._base
        for w, v in zip(lay._writers, args):
            w(buf, v, base)

    def set(self, which: int | str, value: Any) -> None:
        """Rewrite one argument by index or name."""
        lay = self.layout
        i = lay.index.get(which) if isinstance(which, str) else which
        if i is None or not isinstance(i, int) or not 0 <= i < len(lay.specs):
            raise LaunchError(f"kernel {lay.kernel}: no parameter {which!r}")
        lay._writers[i](self._buf, value, self._base)

    def raw(self, which: int | str) -> bytes:
        """The packed bytes of one argument."""
        lay = self.layout
        i = lay.index[which] if isinstance(which, str) else which
        start = self._base + lay.offsets[i]
        return bytes(self._buf[start:start + lay.sizes[i]])

    @property
    def kernel(self) -> str:
        return self.layout.kernel


def pack_params(specs: Sequence[ParamSpec] | ParamLayout, args: Sequence[Any], kernel: str = "kernel") -> PackedParams:
    """Validate and pack `args`; messages read "kernel X: argument 3 'n' expects i32, got float 1.5"."""
    layout = specs if isinstance(specs, ParamLayout) else ParamLayout(specs, kernel)
    return layout.pack(args)
