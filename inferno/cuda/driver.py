"""Loads `cuda.bindings.driver` and initialises the driver once per process."""

from __future__ import annotations

import threading
from types import ModuleType

from inferno.cuda.errors import DriverUnavailableError, error_detail, result_name

_lock = threading.Lock()
_cu: ModuleType | None = None


def driver() -> ModuleType:
    """The initialised `cuda.bindings.driver` module; DriverUnavailableError if there is no driver."""
    global _cu
    if _cu is not None:
        return _cu
    with _lock:
        if _cu is None:
            try:
                from cuda.bindings import driver as cu
            except ImportError as e:
                raise DriverUnavailableError(
                    "import cuda.bindings", "ImportError", str(e), "install cuda-python (pip install cuda-python)"
                ) from None
            try:
                (err,) = cu.cuInit(0)
            except Exception as e:  # libcuda.so missing: cuda-pathfinder raises its own error
                raise DriverUnavailableError(
                    "cuInit", "no libcuda", f"{type(e).__name__}: {str(e).splitlines()[0]}",
                    "no NVIDIA driver on this machine",
                ) from None
            if err:
                raise DriverUnavailableError("cuInit", result_name(err), error_detail(err))
            _cu = cu
    return _cu
