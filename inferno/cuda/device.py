"""The GPU: primary context, properties, and the arch name kernels are built for."""

from __future__ import annotations

import threading

from inferno.cuda.driver import driver
from inferno.cuda.errors import CudaError, check

# Compute capabilities with an arch-specific ("a") target; our kernels are built for those.
_ARCH_SPECIFIC = {(9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1)}


def arch_name(cc: tuple[int, int]) -> str:
    """Arch our cubins target for a compute capability: (9, 0) -> "sm_90a", (8, 9) -> "sm_89"."""
    major, minor = cc
    return f"sm_{major}{minor}" + ("a" if (major, minor) in _ARCH_SPECIFIC else "")


def gpu_count() -> int:
    """Number of CUDA devices; 0 without a driver or GPU. Never raises."""
    try:
        cu = driver()
        err, n = cu.cuDeviceGetCount()
        return int(n) if not err else 0
    except Exception:
        return 0


class Device:
    """One GPU with its retained primary context. `Device.open(i)` returns the same object per ordinal."""

    _open: dict[int, "Device"] = {}
    _lock = threading.Lock()

    def __init__(self, ordinal: int, handle, context):
        cu = driver()
        self.ordinal = ordinal
        self.handle = handle
        self.context = context
        raw = check(cu.cuDeviceGetName(256, handle), "cuDeviceGetName")
        self.name: str = raw.split(b"\0", 1)[0].decode(errors="replace")
        attr = cu.CUdevice_attribute

        def get(a) -> int:
            return int(check(cu.cuDeviceGetAttribute(a, handle), "cuDeviceGetAttribute", a.name))

        self.compute_capability: tuple[int, int] = (
            get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        )
        self.arch: str = arch_name(self.compute_capability)
        self.sm_count: int = get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        self.max_smem_per_block_optin: int = get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        self.max_threads_per_block: int = get(attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
        self.l2_bytes: int = get(attr.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
        self.total_mem: int = int(check(cu.cuDeviceTotalMem(handle), "cuDeviceTotalMem"))
        bus = check(cu.cuDeviceGetPCIBusId(32, handle), "cuDeviceGetPCIBusId")
        self.pci_bus_id: str = (bus if isinstance(bus, str) else bus.split(b"\0", 1)[0].decode()).rstrip("\0")

    @classmethod
    def open(cls, ordinal: int = 0) -> "Device":
        """Retain device `ordinal`'s primary context and make it current in this thread."""
        with cls._lock:
            dev = cls._open.get(ordinal)
            if dev is None:
                cu = driver()
                n = int(check(cu.cuDeviceGetCount(), "cuDeviceGetCount"))
                if not 0 <= ordinal < n:
                    raise CudaError("cuDeviceGet", "CUDA_ERROR_INVALID_DEVICE",
                                    f"GPU {ordinal} requested, this machine has {n}",
                                    "pick a GPU ordinal below the device count")
                handle = check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
                ctx = check(cu.cuDevicePrimaryCtxRetain(handle), "cuDevicePrimaryCtxRetain")
                check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
                dev = cls(ordinal, handle, ctx)
                cls._open[ordinal] = dev
        dev.activate()
        return dev

    def activate(self) -> None:
        """Make this device's context current in the calling thread (each thread needs it once)."""
        cu = driver()
        check(cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def free_mem(self) -> int:
        """Free device memory in bytes (as the driver sees it now)."""
        cu = driver()
        free, _total = check(cu.cuMemGetInfo(), "cuMemGetInfo")
        return int(free)

    def synchronize(self) -> None:
        """Wait for all work on this device's context."""
        cu = driver()
        check(cu.cuCtxSynchronize(), "cuCtxSynchronize")

    def close(self) -> None:
        """Release the primary context; every buffer, module and stream of it becomes invalid."""
        cu = driver()
        with Device._lock:
            if Device._open.get(self.ordinal) is self:
                del Device._open[self.ordinal]
                check(cu.cuDevicePrimaryCtxRelease(self.handle), "cuDevicePrimaryCtxRelease")

    def __repr__(self) -> str:
        return (f"Device({self.ordinal}: {self.name}, {self.arch}, {self.sm_count} SMs, "
                f"{self.total_mem / 2**30:.1f} GiB)")
