"""CUDA driver runtime on cuda-python: device, memory, pinned host, streams, modules, launch, TMA, graphs.

Importing this package never touches the driver; the first call that needs it runs cuInit.
"""

from inferno.cuda.copy import d2d, d2h, from_device, h2d, memset_d8, to_device
from inferno.cuda.device import Device, arch_name, gpu_count
from inferno.cuda.errors import CudaError, DriverUnavailableError, LaunchError, OutOfMemoryError, check
from inferno.cuda.graph import Graph, GraphExec, KernelNode
from inferno.cuda.host import PinnedBuffer
from inferno.cuda.image import ImageError, ImageInfo, check_arch, cubin_entries, inspect_image
from inferno.cuda.launch import Launch, launch
from inferno.cuda.memory import DeviceArena, DeviceBuffer, device_alloc
from inferno.cuda.module import Kernel, Library
from inferno.cuda.params import PackedParams, ParamLayout, ParamSpec, TensorArg, pack_params
from inferno.cuda.stream import Event, Stream
from inferno.cuda.tma import encode_tiled

__all__ = [
    "CudaError", "Device", "DeviceArena", "DeviceBuffer", "DriverUnavailableError", "Event", "Graph", "GraphExec",
    "ImageError", "ImageInfo", "Kernel", "KernelNode", "Launch", "LaunchError", "Library", "OutOfMemoryError",
    "PackedParams", "ParamLayout", "ParamSpec", "PinnedBuffer", "Stream", "TensorArg", "arch_name", "check",
    "check_arch", "cubin_entries", "d2d", "d2h", "device_alloc", "encode_tiled", "from_device", "gpu_count", "h2d",
    "inspect_image", "launch", "memset_d8", "pack_params", "to_device",
]
