"""The runtime's driver glue, run against a fake driver (no GPU needed).

The fake mimics cuda-bindings' calling conventions and `(CUresult, *values)` returns for the calls
inferno.cuda makes; "device memory" is host memory, and two PTX-free "kernels" (add_one, scale2)
run in Python by reading the `void*[]` argument array exactly as the driver would. This catches
glue errors (argument order, unpacking, bookkeeping) on every push; tests/gpu checks the real thing.
"""

import ctypes
import struct

import numpy as np
import pytest
from cuda.bindings import driver as real

from inferno.cuda import (
    CudaError, Device, DeviceArena, Event, Graph, Launch, LaunchError, Library, OutOfMemoryError, ParamSpec,
    PinnedBuffer, Stream, d2d, d2h, device_alloc, encode_tiled, from_device, h2d, launch, memset_d8, pack_params,
    to_device,
)
from inferno.cuda import driver as driver_mod
from inferno.cuda.image import ImageError

R = real.CUresult
OK = R.CUDA_SUCCESS
PTX = b".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry add_one() {}\n"
KERNELS = {"add_one": [8, 4], "scale2": [8, 4]}


class FakeDriver:
    """Just enough of cuda.bindings.driver; enums and structs come from the real module."""

    def __init__(self, device_bytes=1 << 30):
        self.mem: dict[int, ctypes.Array] = {}
        self.device_bytes = device_bytes
        self.calls: list[tuple] = []
        self.capturing: dict[int, list] = {}
        self.graphs: dict[int, list] = {}
        self.execs: dict[int, list] = {}
        self.next_handle = 100
        self.func_names: dict[int, str] = {}
        self.max_smem: dict[int, int] = {}

    def __getattr__(self, name):
        return getattr(real, name)

    def _handle(self):
        self.next_handle += 1
        return self.next_handle

    # device / context
    def cuInit(self, flags): return (OK,)
    def cuDeviceGetCount(self): return (OK, 1)
    def cuDeviceGet(self, i): return (OK, real.CUdevice(i))
    def cuDevicePrimaryCtxRetain(self, dev): return (OK, real.CUcontext(0x1234))
    def cuDevicePrimaryCtxRelease(self, dev): return (OK,)
    def cuCtxSetCurrent(self, ctx): return (OK,)
    def cuCtxSynchronize(self): return (OK,)
    def cuDeviceGetName(self, n, dev): return (OK, b"Fake H200" + b"\0" * (n - 9))
    def cuDeviceTotalMem(self, dev): return (OK, self.device_bytes)
    def cuDeviceGetPCIBusId(self, n, dev): return (OK, b"0000:00:06.0" + b"\0" * (n - 12))

    def cuDeviceGetAttribute(self, attr, dev):
        a = real.CUdevice_attribute
        table = {a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 9, a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: 0,
                 a.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: 132,
                 a.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 232448,
                 a.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: 1024, a.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: 60 << 20}
        return (OK, table[attr])

    def cuGetErrorString(self, err): return (OK, b"fake description")

    # memory
    def _used(self): return sum(len(b) for b in self.mem.values())

    def cuMemAlloc(self, n):
        if self._used() + n > self.device_bytes:
            return (R.CUDA_ERROR_OUT_OF_MEMORY, None)
        buf = (ctypes.c_char * (n + 256))()
        ptr = ctypes.addressof(buf)
        ptr += -ptr % 256
        self.mem[ptr] = buf
        return (OK, real.CUdeviceptr(ptr))

    def cuMemFree(self, ptr):
        del self.mem[int(ptr)]
        return (OK,)

    def cuMemGetInfo(self): return (OK, self.device_bytes - self._used(), self.device_bytes)
    def cuMemHostAlloc(self, n, flags): return (OK, int(self.cuMemAlloc(n)[1]))
    def cuMemFreeHost(self, ptr): return self.cuMemFree(ptr)

    def _copy(self, dst, src, n, stream=0):
        self.calls.append(("copy", int(dst), int(src), n, stream))
        ctypes.memmove(int(dst), int(src), n)
        return (OK,)

    cuMemcpyHtoD = cuMemcpyDtoH = cuMemcpyDtoD = _copy
    cuMemcpyHtoDAsync = cuMemcpyDtoHAsync = cuMemcpyDtoDAsync = _copy

    def cuMemsetD8(self, dst, v, n, stream=0):
        ctypes.memset(int(dst), v, n)
        return (OK,)

    cuMemsetD8Async = cuMemsetD8

    # streams / events
    def cuStreamCreateWithPriority(self, flags, prio): return (OK, real.CUstream(self._handle()))
    def cuStreamSynchronize(self, s):
        self.calls.append(("sync", int(s)))
        return (OK,)
    def cuStreamQuery(self, s): return (OK,)
    def cuStreamDestroy(self, s): return (OK,)
    def cuStreamWaitEvent(self, s, e, f): return (OK,)
    def cuEventCreate(self, flags): return (OK, real.CUevent(self._handle()))
    def cuEventRecord(self, e, s): return (OK,)
    def cuEventSynchronize(self, e): return (OK,)
    def cuEventQuery(self, e): return (R.CUDA_ERROR_NOT_READY,)
    def cuEventElapsedTime(self, a, b): return (OK, 1.25)
    def cuEventDestroy(self, e): return (OK,)

    # libraries / kernels
    def cuLibraryLoadData(self, data, *rest):
        assert data.endswith(b"\0") and rest == (None, None, 0, None, None, 0)
        return (OK, real.CUlibrary(self._handle()))

    def cuLibraryGetKernel(self, lib, name):
        if name.decode() not in KERNELS:
            return (R.CUDA_ERROR_NOT_FOUND, None)
        h = self._handle()
        self.func_names[h] = name.decode()
        return (OK, real.CUkernel(h))

    def cuLibraryGetKernelCount(self, lib): return (OK, len(KERNELS))
    def cuLibraryEnumerateKernels(self, n, lib): return (OK, list(KERNELS))
    def cuKernelGetName(self, k): return (OK, k.encode())
    def cuKernelGetFunction(self, k): return (OK, real.CUfunction(int(k)))
    def cuFuncLoad(self, f): return (OK,)
    def cuLibraryUnload(self, lib): return (OK,)
    def cuFuncGetName(self, f): return (OK, self.func_names[int(f)].encode())

    def cuFuncGetParamInfo(self, f, i):
        sizes = KERNELS[self.func_names[int(f)]]
        if i >= len(sizes):
            return (R.CUDA_ERROR_INVALID_VALUE, None, None)
        return (OK, 8 * i, sizes[i])

    def cuFuncGetAttribute(self, attr, f):
        if attr == real.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES:
            return (OK, 1024)
        return (OK, 16)

    def cuFuncSetAttribute(self, f, attr, v):
        self.max_smem[int(f)] = v
        return (OK,)

    # launches: run the two fake kernels on host memory
    def _run(self, name, args):
        ptr, n = args
        x = np.frombuffer((ctypes.c_float * n).from_address(ptr), np.float32)
        if name == "add_one":
            x += 1
        else:
            x *= 2

    def _args(self, f, address):
        sizes = KERNELS[self.func_names[int(f)]]
        ptrs = (ctypes.c_void_p * len(sizes)).from_address(address)
        raw = [ctypes.string_at(ptrs[i], s) for i, s in enumerate(sizes)]
        return [struct.unpack("<Q", raw[0])[0], struct.unpack("<I", raw[1])[0]]

    def _enqueue(self, f, stream, address, record):
        args = self._args(f, address)  # values are copied at launch time, as the driver does
        self.calls.append(record)
        s = int(stream)
        if s in self.capturing:
            self.capturing[s].append([int(f), args, record])
        else:
            self._run(self.func_names[int(f)], args)
        return (OK,)

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, address, extra):
        assert isinstance(address, int) and extra == 0
        return self._enqueue(f, stream, address, ("launch", (gx, gy, gz), (bx, by, bz), smem))

    def cuLaunchKernelEx(self, cfg, f, address, extra):
        c = cfg.attrs[0].value.clusterDim
        assert cfg.numAttrs == 1 and cfg.attrs[0].id == real.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        rec = ("launch_ex", (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ), (cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ),
               cfg.sharedMemBytes, (c.x, c.y, c.z))
        return self._enqueue(f, cfg.hStream, address, rec)

    # graphs
    def cuStreamBeginCapture(self, s, mode):
        self.capturing[int(s)] = []
        return (OK,)

    def cuStreamEndCapture(self, s):
        h = self._handle()
        self.graphs[h] = self.capturing.pop(int(s))
        return (OK, real.CUgraph(h))

    def cuGraphInstantiate(self, g, flags):
        h = self._handle()
        self.execs[h] = [list(n) for n in self.graphs[int(g)]]
        return (OK, real.CUgraphExec(h))

    def cuGraphLaunch(self, ge, s):
        for f, args, _rec in self.execs[int(ge)]:
            self._run(self.func_names[f], args)
        return (OK,)

    def cuGraphUpload(self, ge, s): return (OK,)

    def cuGraphGetNodes(self, g, n):
        nodes = [real.CUgraphNode(int(g) * 1000 + i) for i in range(len(self.graphs[int(g)]))]
        return (OK, nodes[:n] if n else None, len(nodes))

    def cuGraphNodeGetType(self, node): return (OK, real.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL)

    def cuGraphKernelNodeGetParams(self, node):
        g, i = divmod(int(node), 1000)
        f, _args, rec = self.graphs[g][i]
        p = real.CUDA_KERNEL_NODE_PARAMS()
        p.func = real.CUfunction(f)
        p.gridDimX, p.gridDimY, p.gridDimZ = rec[1]
        p.blockDimX, p.blockDimY, p.blockDimZ = rec[2]
        p.sharedMemBytes = rec[3]
        return (OK, p)

    def cuGraphExecKernelNodeSetParams(self, ge, node, p):
        _g, i = divmod(int(node), 1000)
        self.execs[int(ge)][i][1] = self._args(p.func, p.kernelParams)
        return (OK,)

    def cuGraphExecDestroy(self, ge): return (OK,)
    def cuGraphDestroy(self, g): return (OK,)

    def cuTensorMapEncodeTiled(self, *args):
        self.calls.append(("tma",) + args)
        return (OK, real.CUtensorMap())


@pytest.fixture
def fake(monkeypatch):
    f = FakeDriver()
    monkeypatch.setattr(driver_mod, "_cu", f)
    monkeypatch.setattr(Device, "_open", {})
    return f


@pytest.fixture
def dev(fake):
    return Device.open(0)


def test_device_open_reads_properties(dev):
    assert (dev.name, dev.compute_capability, dev.arch, dev.sm_count) == ("Fake H200", (9, 0), "sm_90a", 132)
    assert dev.l2_bytes == 60 << 20 and dev.total_mem == 1 << 30 and 0 < dev.free_mem() <= dev.total_mem
    assert dev.pci_bus_id == "0000:00:06.0"  # what NVML finds the device by (inferno.bench.clocks)
    assert Device.open(0) is dev
    with pytest.raises(CudaError, match="GPU 3 requested, this machine has 1"):
        Device.open(3)


def test_copies_and_memset_move_bytes(dev, fake):
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    a, b = to_device(None, x, "a"), device_alloc(x.nbytes, "b")
    d2d(b, a)
    assert fake.calls[-2:] == [("copy", b.ptr, a.ptr, x.nbytes, 0), ("sync", 0)]  # stream=None: finished on return
    np.testing.assert_array_equal(from_device(b, np.float32, 1000), x)
    with PinnedBuffer(x.nbytes) as pin:
        s = Stream.create()
        d2h(pin, b, stream=s)
        assert fake.calls[-1][0] == "copy" and fake.calls[-1][4] == s.handle  # async: no sync
        np.testing.assert_array_equal(pin.array(np.float32, 1000), x)
        memset_d8(b, 0, stream=s)
        h2d(b, pin, stream=s, nbytes=8)
        got = from_device(b, np.float32, 1000)
        assert got[0] == x[0] and got[1] == x[1] and not got[2:].any()
    a.free()
    b.free()


def test_out_of_memory_paths(dev, fake):
    fake.device_bytes = 1 << 20
    with pytest.raises(OutOfMemoryError, match="'huge'.*device free"):
        device_alloc(2 << 20, "huge")
    with DeviceArena(dev, 8 << 20, name="w") as arena:
        with pytest.raises(OutOfMemoryError, match="'w/big'"):
            arena.alloc("big", 4 << 20)


def test_events_and_streams(dev):
    s = Stream.create()
    e0, e1 = Event().record(s), Event().record(s)
    s.wait(e1)
    assert Event.elapsed_ms(e0, e1) == 1.25
    assert s.query() and not e1.query()
    for x in (e0, e1, s):
        x.close()


def test_library_kernel_launch_runs_with_packed_args(dev, fake):
    lib = Library.load(PTX, "k.ptx", dev)
    k = lib.kernel("add_one")
    assert k.param_sizes() == [8, 4]
    x = np.arange(10, dtype=np.float32)
    buf = to_device(None, x, "x")
    p = pack_params([ParamSpec("p", "ptr"), ParamSpec("n", "u32")], [buf, 6], kernel="add_one")
    launch(k, (1,), (32,), p)
    np.testing.assert_array_equal(from_device(buf, np.float32, 10), x + (np.arange(10) < 6))
    Launch(k, 1, 32, p)(Stream.create())
    assert fake.calls[-1] == ("launch", (1, 1, 1), (32, 1, 1), 0)
    launch(k, (4, 2), 32, p, cluster=(2, 1))
    assert fake.calls[-1] == ("launch_ex", (4, 2, 1), (32, 1, 1), 0, (2, 1, 1))
    Launch(k, (4, 2), 32, p, cluster=(2, 2))(None)
    assert fake.calls[-1][-1] == (2, 2, 1)
    with pytest.raises(ImageError, match="has no kernel 'nope'; it has: add_one, scale2"):
        lib.kernel("nope")
    k.set_max_dynamic_smem(100_000)
    launch(k, 1, 32, p, smem=100_000)
    assert fake.calls[-1][-1] == 100_000
    with pytest.raises(LaunchError, match="exceed"):
        k.set_max_dynamic_smem(232448)  # plus 1024 static
    lib.close()
    buf.free()


def test_graph_capture_replay_and_update(dev):
    lib = Library.load(PTX, "k.ptx", dev)
    add, scale = lib.kernel("add_one"), lib.kernel("scale2")
    spec = [ParamSpec("p", "ptr"), ParamSpec("n", "u32")]
    x, y = to_device(None, np.zeros(4, np.float32), "x"), to_device(None, np.zeros(4, np.float32), "y")
    s = Stream.create()
    px = pack_params(spec, [x, 4])
    with Graph.capture(s) as g:
        launch(add, 1, 32, px, stream=s)
        launch(scale, 1, 32, pack_params(spec, [x, 4]), stream=s)
        launch(add, 1, 32, px, stream=s)
    assert not from_device(x, np.float32, 4).any()
    ge = g.instantiate()
    ge.launch(s)
    ge.launch(s)
    assert np.all(from_device(x, np.float32, 4) == 9)
    nodes = ge.kernel_nodes()
    assert [(n.index, n.name, n.grid, n.block, n.param_sizes) for n in nodes] == [
        (0, "add_one", (1, 1, 1), (32, 1, 1), [8, 4]), (1, "scale2", (1, 1, 1), (32, 1, 1), [8, 4]),
        (2, "add_one", (1, 1, 1), (32, 1, 1), [8, 4])]
    ge.update_kernel_params(2, pack_params(spec, [y, 4]))
    ge.launch(s)
    assert np.all(from_device(x, np.float32, 4) == 20) and np.all(from_device(y, np.float32, 4) == 1)
    with pytest.raises(LaunchError, match="sizes"):
        ge.update_kernel_params(nodes[0], pack_params([ParamSpec("p", "ptr")], [y]))
    ge.close()
    g.close()


def test_capture_with_a_failing_body_ends_capture(dev, fake):
    s = Stream.create()
    with pytest.raises(RuntimeError):
        with Graph.capture(s):
            raise RuntimeError("boom")
    assert fake.capturing == {}


def test_encode_tiled_passes_driver_types(dev, fake):
    buf = device_alloc(1 << 16, "t")
    desc = encode_tiled("bf16", buf, [128, 64], [256], [64, 32], swizzle=128)
    assert len(desc) == 128
    args = fake.calls[-1][1:]
    assert args[0] == real.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 and args[1] == 2 and args[2] == buf.ptr
    assert [int(v) for v in args[3]] == [128, 64] and [int(v) for v in args[4]] == [256]
    assert [int(v) for v in args[5]] == [64, 32] and [int(v) for v in args[6]] == [1, 1]
    assert args[8] == real.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B
    buf.free()
