"""Host -> device uploads through a ring of page-locked slots.

A copy from pageable numpy memory is synchronous and runs at a fraction of the link's rate. `UploadRing`
copies each source into one of a few pinned slots (host memcpy) and queues the slot's device copy on a
stream, so the host fills the next slot while the device copies this one. The source may be reused as
soon as `copy` returns; the device data is there once the stream has reached the copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from inferno.cuda.copy import h2d
from inferno.cuda.errors import InfernoError
from inferno.cuda.host import PinnedBuffer
from inferno.cuda.memory import DeviceBuffer
from inferno.cuda.stream import Event

SLOTS = 4
SLOT_BYTES = 32 << 20


class UploadRing:
    """`slots` pinned slots of `slot_bytes`, their copies queued on `stream`; the slots are made on the
    first copy and freed by `close` (which waits for the queued copies)."""

    def __init__(self, stream: Any, slots: int = SLOTS, slot_bytes: int = SLOT_BYTES):
        if slots < 2 or slot_bytes <= 0:
            raise InfernoError(f"upload ring: needs 2 slots or more of positive size, got {slots} x {slot_bytes}")
        self.stream = stream
        self.slots, self.slot_bytes = slots, slot_bytes
        self._bufs: list[PinnedBuffer] = []
        self._views: list[np.ndarray] = []
        self._done: list[Event | None] = []
        self._next = 0

    def _open(self) -> None:
        for i in range(self.slots):
            buf = PinnedBuffer(self.slot_bytes, f"upload slot {i}")
            self._bufs.append(buf)
            self._views.append(buf.array(np.uint8, self.slot_bytes))
            self._done.append(None)

    def copy(self, dst: DeviceBuffer, src: np.ndarray) -> None:
        """Queue the copy of `src`'s bytes to the start of `dst` (`src` is free again on return)."""
        raw = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
        if raw.size > dst.nbytes:
            raise InfernoError(f"upload of {raw.size} bytes does not fit {dst.name!r} ({dst.nbytes} bytes)")
        if not self._bufs:
            self._open()
        for off in range(0, raw.size, self.slot_bytes):
            n = min(self.slot_bytes, raw.size - off)
            i = self._next
            self._next = (i + 1) % self.slots
            done = self._done[i]
            if done is not None:
                done.synchronize()  # the slot's previous copy has left it
            self._views[i][:n] = raw[off:off + n]
            h2d(dst.ptr + off, self._bufs[i], stream=self.stream, nbytes=n)
            if done is None:
                done = self._done[i] = Event.create(timing=False)
            done.record(self.stream)

    def close(self) -> None:
        """Wait for the queued copies, then free the slots (a later copy makes them again)."""
        for done in self._done:
            if done is not None:
                done.synchronize()
                done.close()
        for buf in self._bufs:
            buf.close()
        self._bufs, self._views, self._done, self._next = [], [], [], 0
