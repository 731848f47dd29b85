"""Device memory: owned allocations and a named bump arena over a few large blocks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from inferno.cuda.driver import driver
from inferno.cuda.errors import CudaError, InfernoError, OutOfMemoryError, check, error_detail, result_name

if TYPE_CHECKING:
    from inferno.cuda.device import Device


def fmt_bytes(n: int) -> str:
    """Human size: 1536 -> '1.5 KiB'."""
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(x) < 1024 or unit == "TiB":
            return f"{int(x)} B" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    raise AssertionError("unreachable")


class DeviceBuffer:
    """A named range of device memory. `ptr` is the device address; `int(buf)` gives it too."""

    __slots__ = ("ptr", "nbytes", "name", "_free")

    def __init__(self, ptr: int, nbytes: int, name: str, free: Callable[[], None] | None = None):
        self.ptr = ptr
        self.nbytes = nbytes
        self.name = name
        self._free = free

    def __int__(self) -> int:
        return self.ptr

    def view(self, offset: int, nbytes: int, name: str | None = None) -> "DeviceBuffer":
        """A sub-range that does not own memory."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise InfernoError(f"buffer {self.name!r}: view [{offset}, {offset + nbytes}) is outside its "
                               f"{self.nbytes} bytes")
        return DeviceBuffer(self.ptr + offset, nbytes, name or f"{self.name}[{offset}:{offset + nbytes}]")

    def free(self) -> None:
        """Free an owned allocation (no-op for views and arena reservations, and when already freed)."""
        f, self._free = self._free, None
        if f is not None:
            f()

    def __repr__(self) -> str:
        return f"DeviceBuffer({self.name!r}, ptr=0x{self.ptr:x}, {fmt_bytes(self.nbytes)})"


def _mem_alloc(nbytes: int, name: str, used: int = 0, capacity: int = 0) -> int:
    """cuMemAlloc; OutOfMemoryError names the reservation and the device's free memory."""
    cu = driver()
    err, ptr = cu.cuMemAlloc(nbytes)
    if err == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
        free = _device_free()
        raise OutOfMemoryError(
            f"out of GPU memory allocating {name!r}: requested {fmt_bytes(nbytes)}"
            + (f", arena used {fmt_bytes(used)} of {fmt_bytes(capacity)}" if capacity else "")
            + f", device free {fmt_bytes(free) if free is not None else 'unknown'}; "
            "use a smaller configuration or free GPU memory",
            name=name, requested=nbytes, used=used, capacity=capacity, free=free)
    if err:
        raise CudaError("cuMemAlloc", result_name(err), error_detail(err), f"allocating {name!r} ({nbytes} bytes)")
    return int(ptr)


def _mem_free(ptr: int) -> None:
    cu = driver()
    check(cu.cuMemFree(ptr), "cuMemFree")


def _device_free() -> int | None:
    cu = driver()
    err, free, _total = cu.cuMemGetInfo()
    return None if err else int(free)


def device_alloc(nbytes: int, name: str) -> DeviceBuffer:
    """An owned device allocation in the current context; call `free()` when done."""
    if not isinstance(nbytes, int) or nbytes <= 0:
        raise InfernoError(f"device allocation {name!r}: size must be a positive int, got {nbytes!r}")
    ptr = _mem_alloc(nbytes, name)
    return DeviceBuffer(ptr, nbytes, name, lambda: _mem_free(ptr))


class DeviceArena:
    """Named, aligned sub-allocations carved from a few large device blocks.

    Blocks are allocated on demand, each `block_bytes` (default: the whole capacity) or the
    request if larger, never more than `capacity` in total. Reservations live until `reset()` or
    `close()`; there is no per-reservation free.
    """

    def __init__(self, device: "Device | None", capacity: int, name: str = "arena", block_bytes: int | None = None):
        if not isinstance(capacity, int) or capacity <= 0:
            raise InfernoError(f"arena {name!r}: capacity must be a positive int, got {capacity!r}")
        if block_bytes is not None and (not isinstance(block_bytes, int) or block_bytes <= 0):
            raise InfernoError(f"arena {name!r}: block_bytes must be a positive int, got {block_bytes!r}")
        self.device = device
        self.name = name
        self.capacity = capacity
        self.block_bytes = min(block_bytes or capacity, capacity)
        self._blocks: list[list[int]] = []  # [ptr, size, top]
        self._reserved = 0  # bytes of blocks allocated
        self._entries: list[tuple[str, int, int, int]] = []  # name, block index, offset, nbytes
        self.used = 0  # bytes handed out, alignment padding included
        self._closed = False

    def alloc(self, name: str, nbytes: int, align: int = 256) -> DeviceBuffer:
        """Reserve `nbytes` aligned to `align` (a power of two) under `name`."""
        if self._closed:
            raise InfernoError(f"arena {self.name!r} is closed; cannot reserve {name!r}")
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise InfernoError(f"arena {self.name!r}: reservation {name!r} needs a positive int size, got {nbytes!r}")
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise InfernoError(f"arena {self.name!r}: reservation {name!r} alignment must be a power of two, got {align!r}")
        for bi, (ptr, size, top) in enumerate(self._blocks):  # first fit over the block tops
            start = -(-(ptr + top) // align) * align - ptr
            if start + nbytes <= size:
                return self._take(name, bi, start, nbytes)
        # New block: cuMemAlloc is 256-aligned; larger alignments get padding room.
        need = nbytes + (align - 256 if align > 256 else 0)
        size = max(self.block_bytes, need)
        if self._reserved + size > self.capacity:
            size = self.capacity - self._reserved
        if size < need:
            free = _device_free()
            raise OutOfMemoryError(
                f"arena {self.name!r} is full: reservation {name!r} requested {fmt_bytes(nbytes)}, used "
                f"{fmt_bytes(self.used)} of capacity {fmt_bytes(self.capacity)} "
                f"(device free {fmt_bytes(free) if free is not None else 'unknown'}); raise the arena capacity "
                "or use a smaller configuration",
                name=name, requested=nbytes, used=self.used, capacity=self.capacity, free=free)
        ptr = _mem_alloc(size, f"{self.name}/{name}", self.used, self.capacity)
        self._blocks.append([ptr, size, 0])
        self._reserved += size
        start = -(-ptr // align) * align - ptr
        return self._take(name, len(self._blocks) - 1, start, nbytes)

    def _take(self, name: str, bi: int, start: int, nbytes: int) -> DeviceBuffer:
        block = self._blocks[bi]
        self.used += start + nbytes - block[2]
        block[2] = start + nbytes
        self._entries.append((name, bi, start, nbytes))
        return DeviceBuffer(block[0] + start, nbytes, name)

    @property
    def reserved(self) -> int:
        """Bytes of device memory the arena holds (its blocks)."""
        return self._reserved

    def report(self) -> str:
        """Usage summary: totals, then every reservation, largest first."""
        lines = [f"arena {self.name!r}: used {fmt_bytes(self.used)} of {fmt_bytes(self.capacity)} "
                 f"({len(self._entries)} reservations, {len(self._blocks)} blocks holding "
                 f"{fmt_bytes(self._reserved)})"]
        for name, bi, off, n in sorted(self._entries, key=lambda e: -e[3]):
            lines.append(f"  {name:<40} {fmt_bytes(n):>12}  block {bi} +0x{off:x}")
        return "\n".join(lines)

    def reset(self) -> None:
        """Forget every reservation (their buffers become invalid) and keep the blocks for reuse."""
        for b in self._blocks:
            b[2] = 0
        self._entries.clear()
        self.used = 0

    def close(self) -> None:
        """Free the blocks; every buffer handed out becomes invalid."""
        if self._closed:
            return
        self._closed = True
        blocks, self._blocks = self._blocks, []
        self._entries.clear()
        self.used = self._reserved = 0
        for ptr, _size, _top in blocks:
            _mem_free(ptr)

    def __enter__(self) -> "DeviceArena":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
