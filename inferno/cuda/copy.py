"""Copies between host and device, and device memset.

`stream=None`: the operation has completed when the function returns (it runs on the legacy
default stream, which is then synchronized), so any stream may use the result. With a stream the
operation is asynchronous and ordered on that stream only; from/to a `PinnedBuffer` it overlaps
with compute. Keep pageable numpy memory alive until the stream has synchronized.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from inferno.cuda.driver import driver
from inferno.cuda.errors import InfernoError, check
from inferno.cuda.host import PinnedBuffer
from inferno.cuda.memory import DeviceBuffer, device_alloc
from inferno.cuda.stream import stream_handle

if TYPE_CHECKING:
    from inferno.cuda.memory import DeviceArena

DeviceLike = DeviceBuffer | int
HostLike = np.ndarray | PinnedBuffer


def _finish(stream: Any) -> None:
    """For `stream=None`, wait until the work just queued on the legacy default stream is finished."""
    if stream is None:
        check(driver().cuStreamSynchronize(0), "cuStreamSynchronize")


def _dev(x: Any, what: str) -> tuple[int, int | None]:
    """(address, size or None) of a device operand."""
    if isinstance(x, DeviceBuffer):
        return x.ptr, x.nbytes
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return int(x), None
    raise InfernoError(f"{what} must be a DeviceBuffer or a device address (int), got {type(x).__name__}")


def _host(x: Any, what: str, writable: bool) -> tuple[int, int]:
    """(address, size) of a host operand."""
    if isinstance(x, PinnedBuffer):
        if not x.ptr:
            raise InfernoError(f"{what}: pinned buffer {x.name!r} is closed")
        return x.ptr, x.nbytes
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:
            raise InfernoError(f"{what} must be a C-contiguous numpy array (use np.ascontiguousarray)")
        if writable and not x.flags.writeable:
            raise InfernoError(f"{what} must be a writable numpy array")
        return x.ctypes.data, x.nbytes
    raise InfernoError(f"{what} must be a numpy array or a PinnedBuffer, got {type(x).__name__}")


def _size(nbytes: int | None, what: str, *limits: int | None) -> int:
    known = [n for n in limits if n is not None]
    if nbytes is None:
        if not known:
            raise InfernoError(f"{what}: pass nbytes when both sides are raw addresses")
        nbytes = min(known)
    if not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
        raise InfernoError(f"{what}: nbytes must be a non-negative int, got {nbytes!r}")
    for n in known:
        if nbytes > n:
            raise InfernoError(f"{what}: {nbytes} bytes do not fit a {n}-byte operand")
    return int(nbytes)


def h2d(dst: DeviceLike, src: HostLike, stream: Any = None, nbytes: int | None = None) -> None:
    """Copy host -> device (`nbytes` defaults to the host operand's size)."""
    d, dn = _dev(dst, "h2d destination")
    s, sn = _host(src, "h2d source", writable=False)
    n = _size(nbytes if nbytes is not None else sn, "h2d", dn, sn)
    if n == 0:
        return
    cu = driver()
    check(cu.cuMemcpyHtoDAsync(d, s, n, stream_handle(stream)), "cuMemcpyHtoDAsync")
    _finish(stream)


def d2h(dst: HostLike, src: DeviceLike, stream: Any = None, nbytes: int | None = None) -> None:
    """Copy device -> host (`nbytes` defaults to the host operand's size)."""
    d, dn = _host(dst, "d2h destination", writable=True)
    s, sn = _dev(src, "d2h source")
    n = _size(nbytes if nbytes is not None else dn, "d2h", dn, sn)
    if n == 0:
        return
    cu = driver()
    check(cu.cuMemcpyDtoHAsync(d, s, n, stream_handle(stream)), "cuMemcpyDtoHAsync")
    _finish(stream)


def d2d(dst: DeviceLike, src: DeviceLike, nbytes: int | None = None, stream: Any = None) -> None:
    """Copy device -> device (`nbytes` defaults to the smaller buffer)."""
    d, dn = _dev(dst, "d2d destination")
    s, sn = _dev(src, "d2d source")
    n = _size(nbytes, "d2d", dn, sn)
    if n == 0:
        return
    cu = driver()
    check(cu.cuMemcpyDtoDAsync(d, s, n, stream_handle(stream)), "cuMemcpyDtoDAsync")
    _finish(stream)


def memset_d8(dst: DeviceLike, value: int, nbytes: int | None = None, stream: Any = None) -> None:
    """Fill `nbytes` (default: the whole buffer) with the byte `value`."""
    d, dn = _dev(dst, "memset destination")
    if not isinstance(value, (int, np.integer)) or not 0 <= value <= 255:
        raise InfernoError(f"memset_d8: value must be a byte 0..255, got {value!r}")
    n = _size(nbytes, "memset_d8", dn)
    if n == 0:
        return
    cu = driver()
    check(cu.cuMemsetD8Async(d, int(value), n, stream_handle(stream)), "cuMemsetD8Async")
    _finish(stream)


def to_device(arena: "DeviceArena | None", array: np.ndarray, name: str) -> DeviceBuffer:
    """Synchronously upload `array` into a new reservation (arena) or owned allocation (None)."""
    arr = np.ascontiguousarray(array)
    n = max(arr.nbytes, 1)
    buf = arena.alloc(name, n) if arena is not None else device_alloc(n, name)
    h2d(buf, arr)
    return buf


def from_device(buf: DeviceLike, dtype, shape) -> np.ndarray:
    """Synchronously download a device buffer into a new numpy array of `shape` and `dtype`."""
    out = np.empty(shape, dtype=dtype)
    d2h(out, buf)
    return out
