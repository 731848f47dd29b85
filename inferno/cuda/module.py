"""Loading code images (cubin, PTX, fatbin) and getting kernels out of them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferno.cuda.driver import driver
from inferno.cuda.errors import CudaError, LaunchError, check, error_detail, result_name
from inferno.cuda.image import ImageError, check_arch, cubin_entries, inspect_image

if TYPE_CHECKING:
    from inferno.cuda.device import Device
from inferno.cuda.params import ParamLayout


class Library:
    """A loaded code image (cuLibraryLoadData). Load with `Library.load`; get kernels with `kernel()`."""

    def __init__(self, handle: Any, name: str, device: "Device", info, entries: list[str] | None):
        self.handle = handle
        self.name = name
        self.device = device
        self.info = info
        self._entries = entries
        self._kernels: dict[str, Kernel] = {}

    @classmethod
    def load(cls, image: bytes, name: str, device: "Device", arch: str | None = None) -> "Library":
        """Load a cubin (or PTX text, or fatbin) for `device`.

        Refuses, before the driver sees it, an image built for another arch than the device's,
        and one whose manifest `arch` disagrees with the image or the device.
        """
        if isinstance(image, str):
            image = image.encode()
        info = inspect_image(image, f"kernel image {name!r}")
        check_arch(info, device.arch, f"kernel image {name!r}", arch, device.name)
        data = image + b"\0" if info.kind == "ptx" and not image.endswith(b"\0") else image
        cu = driver()
        handle = check(cu.cuLibraryLoadData(data, None, None, 0, None, None, 0), "cuLibraryLoadData",
                       f"loading {name!r} ({info.kind} for {info.arch or 'several archs'})")
        entries = cubin_entries(image) if info.kind == "cubin" else None
        return cls(handle, name, device, info, entries)

    def entries(self) -> list[str]:
        """Kernel entry names in this library."""
        if self._entries is None:
            cu = driver()
            n = int(check(cu.cuLibraryGetKernelCount(self.handle), "cuLibraryGetKernelCount"))
            kernels = check(cu.cuLibraryEnumerateKernels(n, self.handle), "cuLibraryEnumerateKernels")
            self._entries = [_decode(check(cu.cuKernelGetName(k), "cuKernelGetName")) for k in kernels]
        return list(self._entries)

    def kernel(self, entry: str) -> "Kernel":
        """The kernel named `entry`, bound to the current context."""
        k = self._kernels.get(entry)
        if k is not None:
            return k
        cu = driver()
        err, kern = cu.cuLibraryGetKernel(self.handle, entry.encode())
        if err == cu.CUresult.CUDA_ERROR_NOT_FOUND:
            have = self.entries()
            raise ImageError(f"kernel image {self.name!r} has no kernel {entry!r}; it has: "
                             f"{', '.join(have) if have else 'none'}; check the manifest entry name")
        check((err, kern), "cuLibraryGetKernel", f"kernel {entry!r} in {self.name!r}")
        func = check(cu.cuKernelGetFunction(kern), "cuKernelGetFunction", f"kernel {entry!r}")
        # Load now (the driver loads lazily by default) so a bad image fails here, not at first launch.
        check(cu.cuFuncLoad(func), "cuFuncLoad", f"kernel {entry!r} in {self.name!r}")
        k = Kernel(func, entry, self)
        k.param_sizes()  # query now, so launches (and graph captures) make no extra driver calls
        self._kernels[entry] = k
        return k

    def close(self) -> None:
        h, self.handle = self.handle, None
        if h is not None:
            self._kernels.clear()
            check(driver().cuLibraryUnload(h), "cuLibraryUnload")


def _decode(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _attr_enum(attr: Any) -> Any:
    cu = driver()
    if isinstance(attr, str):
        key = attr.upper()
        key = key if key.startswith("CU_FUNC_ATTRIBUTE_") else "CU_FUNC_ATTRIBUTE_" + key
        try:
            return getattr(cu.CUfunction_attribute, key)
        except AttributeError:
            raise LaunchError(f"unknown kernel attribute {attr!r} (e.g. num_regs, max_threads_per_block, "
                              "shared_size_bytes, max_dynamic_shared_size_bytes)") from None
    return attr


def func_param_sizes(func: Any, name: str = "kernel") -> list[int]:
    """Byte size of each parameter of a CUfunction (cuFuncGetParamInfo until it runs out)."""
    cu = driver()
    sizes: list[int] = []
    while True:
        err, _off, size = cu.cuFuncGetParamInfo(func, len(sizes))
        if err == cu.CUresult.CUDA_ERROR_INVALID_VALUE:
            return sizes
        if err:
            raise CudaError("cuFuncGetParamInfo", result_name(err), error_detail(err), f"kernel {name}")
        sizes.append(int(size))


class Kernel:
    """A kernel function. `handle` is the CUfunction that launches take."""

    def __init__(self, handle: Any, name: str, library: Library):
        self.handle = handle
        self.name = name
        self.library = library
        self.max_dynamic_smem = 0
        self.pdl = False  # waits for its predecessor in-kernel (griddepcontrol.wait): PDL launches allowed
        self._param_sizes: list[int] | None = None
        self._checked_layouts: dict[int, ParamLayout] = {}  # strong refs keep ids unique

    def attribute(self, attr: Any) -> int:
        """A CUfunction attribute: a CUfunction_attribute or its short name ("num_regs")."""
        a = _attr_enum(attr)
        return int(check(driver().cuFuncGetAttribute(a, self.handle), "cuFuncGetAttribute", f"kernel {self.name}"))

    def set_max_dynamic_smem(self, nbytes: int) -> None:
        """Allow launches with up to `nbytes` of dynamic shared memory (needed above 48 KiB)."""
        static = self.attribute("shared_size_bytes")
        limit = self.library.device.max_smem_per_block_optin
        if not isinstance(nbytes, int) or nbytes < 0 or nbytes + static > limit:
            raise LaunchError(f"kernel {self.name}: {nbytes} bytes of dynamic shared memory plus {static} static "
                              f"exceed the GPU's {limit} per block; use a smaller tile configuration")
        cu = driver()
        check(cu.cuFuncSetAttribute(self.handle, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    nbytes), "cuFuncSetAttribute", f"kernel {self.name}")
        self.max_dynamic_smem = nbytes

    def param_sizes(self) -> list[int]:
        """Byte size of each parameter as the driver sees the kernel (cuFuncGetParamInfo)."""
        if self._param_sizes is None:
            self._param_sizes = func_param_sizes(self.handle, self.name)
        return self._param_sizes

    def check_layout(self, layout: "ParamLayout") -> None:
        """Refuse a parameter layout whose count or sizes differ from the kernel's (once per layout)."""
        key = id(layout)
        if key in self._checked_layouts:
            return
        have = self.param_sizes()
        want = list(layout.sizes)
        if have != want:
            raise LaunchError(f"kernel {self.name}: takes {len(have)} parameters of sizes {have} bytes, but the "
                              f"packed arguments ({layout.kernel}) have {len(want)} of sizes {want}; the manifest "
                              "does not match the cubin, rebuild it")
        self._checked_layouts[key] = layout

    def __repr__(self) -> str:
        return f"Kernel({self.name!r})"
