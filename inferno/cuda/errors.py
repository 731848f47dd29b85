"""Errors raised by the CUDA driver layer.

`check` unwraps the `(CUresult, *values)` tuples that `cuda.bindings.driver` returns and raises
`CudaError` naming the call and the result, e.g.
`cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)`.
"""

from __future__ import annotations

from typing import Any

from inferno.errors import InfernoError

# What the user can do about the errors people actually hit.
_HINTS = {
    "CUDA_ERROR_INVALID_CONTEXT": "call Device.open() or device.activate() in this thread first",
    "CUDA_ERROR_NOT_INITIALIZED": "call Device.open() first",
    "CUDA_ERROR_NO_DEVICE": "this machine has no NVIDIA GPU",
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION": "the driver is older than the PTX ISA; ship a cubin or lower .version",
    "CUDA_ERROR_NO_BINARY_FOR_GPU": "the image holds no code for this GPU's arch; rebuild it for this GPU",
    "CUDA_ERROR_INVALID_IMAGE": "the image is not a valid cubin/PTX/fatbin; rebuild it",
    "CUDA_ERROR_OUT_OF_MEMORY": "free GPU memory or use a smaller configuration",
    "CUDA_ERROR_ILLEGAL_ADDRESS": "a kernel touched memory it does not own; the context is now unusable",
}


class CudaError(InfernoError):
    """A driver call failed. `call` is the driver function, `result` the CUresult name."""

    def __init__(self, call: str, result: str, detail: str = "", context: str = ""):
        self.call = call
        self.result = result
        self.detail = detail
        msg = f"{call} failed: {result}"
        if detail:
            msg += f" ({detail})"
        if context:
            msg = f"{context}: {msg}"
        hint = _HINTS.get(result)
        if hint:
            msg += f"; {hint}"
        super().__init__(msg)


class DriverUnavailableError(CudaError):
    """No usable CUDA driver (libcuda missing, or no GPU)."""


class OutOfMemoryError(InfernoError):
    """A reservation did not fit: names the reservation and every size that matters."""

    def __init__(self, message: str, *, name: str, requested: int, used: int, capacity: int, free: int | None):
        self.name = name
        self.requested = requested
        self.used = used
        self.capacity = capacity
        self.free = free
        super().__init__(message)


class LaunchError(InfernoError):
    """Kernel arguments or a launch configuration that do not match the kernel."""


def result_name(err: Any) -> str:
    """The CUresult's enum name (`CUDA_ERROR_OUT_OF_MEMORY`), or its number if unknown."""
    name = getattr(err, "name", None)
    return name if isinstance(name, str) else f"CUresult {int(err)}"


def error_detail(err: Any) -> str:
    """The driver's description of a CUresult, or '' when the driver cannot say."""
    try:
        from cuda.bindings import driver as cu

        e, s = cu.cuGetErrorString(err)
        if e == cu.CUresult.CUDA_SUCCESS and s:
            return s.decode() if isinstance(s, bytes) else str(s)
    except Exception:  # no driver library: the name alone must do
        pass
    return ""


def raise_for(err: Any, call: str, context: str = "") -> None:
    """Raise the CudaError for a failed CUresult."""
    raise CudaError(call, result_name(err), error_detail(err), context)


def check(result: tuple, call: str, context: str = "") -> Any:
    """Unwrap a cuda-bindings result tuple: raise CudaError on failure, else return the values.

    `(err,)` -> None; `(err, v)` -> v; `(err, v1, v2, ...)` -> (v1, v2, ...).
    """
    err = result[0]
    if err:
        raise_for(err, call, context)
    n = len(result)
    if n == 1:
        return None
    if n == 2:
        return result[1]
    return result[1:]
