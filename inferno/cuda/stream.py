"""Streams and events."""

from __future__ import annotations

from typing import Any

from inferno.cuda.driver import driver
from inferno.cuda.errors import check


class Stream:
    """A CUDA stream. `Stream.create()` makes a non-blocking one (no implicit sync with stream 0).

    `pdl`: launches of PDL-capable kernels (`Kernel.pdl`) on this stream use programmatic dependent
    launch, so a kernel's CTAs start while its predecessor drains and wait for it in-kernel.
    """

    __slots__ = ("handle", "_owned", "pdl")

    def __init__(self, handle: Any, owned: bool = False):
        self.handle = handle
        self._owned = owned
        self.pdl = False

    @classmethod
    def create(cls, non_blocking: bool = True, priority: int = 0) -> "Stream":
        cu = driver()
        flags = cu.CUstream_flags.CU_STREAM_NON_BLOCKING if non_blocking else cu.CUstream_flags.CU_STREAM_DEFAULT
        return cls(check(cu.cuStreamCreateWithPriority(flags, priority), "cuStreamCreateWithPriority"), True)

    @classmethod
    def legacy(cls) -> "Stream":
        """The legacy default stream (handle 0)."""
        return cls(driver().CUstream(0), False)

    def synchronize(self) -> None:
        check(driver().cuStreamSynchronize(self.handle), "cuStreamSynchronize")

    def wait(self, event: "Event") -> None:
        """Make later work on this stream wait for `event` (no host block)."""
        check(driver().cuStreamWaitEvent(self.handle, event.handle, 0), "cuStreamWaitEvent")

    def query(self) -> bool:
        """True when all work on the stream has finished."""
        cu = driver()
        (err,) = cu.cuStreamQuery(self.handle)
        if err == cu.CUresult.CUDA_ERROR_NOT_READY:
            return False
        check((err,), "cuStreamQuery")
        return True

    def close(self) -> None:
        if self._owned:
            self._owned = False
            check(driver().cuStreamDestroy(self.handle), "cuStreamDestroy")

    def __repr__(self) -> str:
        return f"Stream(0x{int(self.handle):x})"


def stream_handle(stream: "Stream | Any | None") -> Any:
    """Driver handle for a Stream, a raw CUstream/int, or None (the legacy default stream, 0)."""
    if stream is None:
        return 0
    if isinstance(stream, Stream):
        return stream.handle
    return stream


class Event:
    """A CUDA event; `timing=True` (default) lets `elapsed_ms` measure between two of them."""

    __slots__ = ("handle", "timing")

    def __init__(self, timing: bool = True):
        cu = driver()
        flags = cu.CUevent_flags.CU_EVENT_DEFAULT if timing else cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
        self.handle = check(cu.cuEventCreate(flags), "cuEventCreate")
        self.timing = timing

    @classmethod
    def create(cls, timing: bool = True) -> "Event":
        return cls(timing)

    def record(self, stream: "Stream | Any | None" = None) -> "Event":
        check(driver().cuEventRecord(self.handle, stream_handle(stream)), "cuEventRecord")
        return self

    def synchronize(self) -> None:
        check(driver().cuEventSynchronize(self.handle), "cuEventSynchronize")

    def query(self) -> bool:
        """True when the work before the recorded point has finished."""
        cu = driver()
        (err,) = cu.cuEventQuery(self.handle)
        if err == cu.CUresult.CUDA_ERROR_NOT_READY:
            return False
        check((err,), "cuEventQuery")
        return True

    @staticmethod
    def elapsed_ms(start: "Event", end: "Event") -> float:
        """Milliseconds between two recorded, completed timing events."""
        return float(check(driver().cuEventElapsedTime(start.handle, end.handle), "cuEventElapsedTime"))

    def close(self) -> None:
        h, self.handle = self.handle, None
        if h is not None:
            check(driver().cuEventDestroy(h), "cuEventDestroy")
