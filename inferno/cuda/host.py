"""Pinned (page-locked) host memory: fast, async-capable staging for host<->device copies."""

from __future__ import annotations

import ctypes

import numpy as np

from inferno.cuda.driver import driver
from inferno.cuda.errors import InfernoError, OutOfMemoryError, check, result_name
from inferno.cuda.memory import fmt_bytes


class PinnedBuffer:
    """`nbytes` of page-locked host memory (cuMemHostAlloc, portable across contexts).

    `array(dtype, shape)` gives zero-copy numpy views; views keep the buffer alive, but
    `close()` frees it at once, so close only when no view is in use.
    """

    def __init__(self, nbytes: int, name: str = "pinned"):
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise InfernoError(f"pinned buffer {name!r}: size must be a positive int, got {nbytes!r}")
        cu = driver()
        err, ptr = cu.cuMemHostAlloc(nbytes, cu.CU_MEMHOSTALLOC_PORTABLE)
        if err:
            raise OutOfMemoryError(
                f"cuMemHostAlloc failed: {result_name(err)} allocating pinned buffer {name!r} of "
                f"{fmt_bytes(nbytes)}; use less pinned host memory",
                name=name, requested=nbytes, used=0, capacity=0, free=None)
        self.ptr: int = int(ptr)
        self.nbytes = nbytes
        self.name = name
        raw = (ctypes.c_ubyte * nbytes).from_address(self.ptr)
        raw._owner = self  # numpy views hold `raw`, which holds us: no free while a view lives
        self._raw = raw

    def array(self, dtype, shape, offset: int = 0) -> np.ndarray:
        """A zero-copy numpy view of `shape` elements of `dtype` starting at byte `offset`."""
        if self.ptr == 0:
            raise InfernoError(f"pinned buffer {self.name!r} is closed")
        dt = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if offset < 0 or offset % dt.alignment or offset + count * dt.itemsize > self.nbytes:
            raise InfernoError(f"pinned buffer {self.name!r}: view {shape} {dt} at byte {offset} does not fit its "
                               f"{self.nbytes} bytes (or is misaligned)")
        return np.frombuffer(self._raw, dtype=dt, count=count, offset=offset).reshape(shape)

    def close(self) -> None:
        """Free the memory now (views made by `array` become invalid)."""
        ptr, self.ptr = self.ptr, 0
        if ptr:
            self._raw = None
            check(driver().cuMemFreeHost(ptr), "cuMemFreeHost")

    def __del__(self):
        if getattr(self, "ptr", 0):
            try:
                self.close()
            except Exception:  # interpreter shutdown: the driver may be gone
                pass

    def __enter__(self) -> "PinnedBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PinnedBuffer({self.name!r}, ptr=0x{self.ptr:x}, {fmt_bytes(self.nbytes)})"
