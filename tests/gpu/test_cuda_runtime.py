"""The CUDA driver runtime on a real GPU: device, memory, copies, streams, libraries, launches,
TMA descriptors and graphs.

Kernels are hand-written PTX (`.version 8.0`, `.target sm_90`) loaded through cuLibraryLoadData,
which JIT-compiles them; nothing needs a compiler on the GPU machine. The foreign-arch refusal
test takes a cubin the driver's own JIT linker made for this GPU and patches the SM number in its
ELF e_flags (bits 8..15 for ELF ABI 8), since no cubin for another GPU can be built there.
"""

import ctypes
import threading
import time

import numpy as np
import pytest

from inferno.cuda import (
    CudaError, Device, DeviceArena, Event, Graph, ImageError, Launch, LaunchError, Library, OutOfMemoryError,
    ParamLayout, ParamSpec, PinnedBuffer, Stream, TensorArg, arch_name, d2d, d2h, device_alloc, encode_tiled,
    from_device, gpu_count, h2d, inspect_image, launch, memset_d8, pack_params, to_device,
)
from inferno.cuda.driver import driver
from inferno.cuda.errors import check

PTX = r""".version 8.0
.target sm_90
.address_size 64

.extern .shared .align 16 .b8 dsmem[];

// p[i] += 1.0f for i < n
.visible .entry add_one(.param .u64 p, .param .u32 n)
{
  .reg .pred %q;
  .reg .b32 %r<6>;
  .reg .b64 %rd<4>;
  .reg .f32 %f<3>;
  ld.param.u64 %rd1, [p];
  ld.param.u32 %r1, [n];
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4;
  setp.ge.u32 %q, %r5, %r1;
  @%q bra DONE;
  cvta.to.global.u64 %rd2, %rd1;
  mul.wide.u32 %rd3, %r5, 4;
  add.s64 %rd2, %rd2, %rd3;
  ld.global.f32 %f1, [%rd2];
  add.f32 %f2, %f1, 0f3F800000;
  st.global.f32 [%rd2], %f2;
DONE:
  ret;
}

// p[i] *= 2.0f for i < n
.visible .entry scale2(.param .u64 p, .param .u32 n)
{
  .reg .pred %q;
  .reg .b32 %r<6>;
  .reg .b64 %rd<4>;
  .reg .f32 %f<3>;
  ld.param.u64 %rd1, [p];
  ld.param.u32 %r1, [n];
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4;
  setp.ge.u32 %q, %r5, %r1;
  @%q bra DONE;
  cvta.to.global.u64 %rd2, %rd1;
  mul.wide.u32 %rd3, %r5, 4;
  add.s64 %rd2, %rd2, %rd3;
  ld.global.f32 %f1, [%rd2];
  add.f32 %f2, %f1, %f1;
  st.global.f32 [%rd2], %f2;
DONE:
  ret;
}

// y[i] += a * x[i]; x is a CuTe-style tensor struct {u64 ptr; i32 n; pad}
.visible .entry axpy_t(.param .align 8 .b8 x[16], .param .f32 a, .param .u64 y)
{
  .reg .pred %q;
  .reg .b32 %r<6>;
  .reg .b64 %rd<6>;
  .reg .f32 %f<5>;
  ld.param.u64 %rd1, [x];
  ld.param.u32 %r1, [x+8];
  ld.param.f32 %f1, [a];
  ld.param.u64 %rd2, [y];
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4;
  setp.ge.s32 %q, %r5, %r1;
  @%q bra DONE;
  mul.wide.u32 %rd3, %r5, 4;
  cvta.to.global.u64 %rd4, %rd1;
  add.s64 %rd4, %rd4, %rd3;
  cvta.to.global.u64 %rd5, %rd2;
  add.s64 %rd5, %rd5, %rd3;
  ld.global.f32 %f2, [%rd4];
  ld.global.f32 %f3, [%rd5];
  fma.rn.f32 %f4, %f1, %f2, %f3;
  st.global.f32 [%rd5], %f4;
DONE:
  ret;
}

// out[blockIdx.x] = rank of the block in its cluster (thread 0 writes)
.visible .entry cluster_rank(.param .u64 out)
{
  .reg .pred %q;
  .reg .b32 %r<4>;
  .reg .b64 %rd<4>;
  mov.u32 %r1, %tid.x;
  setp.ne.u32 %q, %r1, 0;
  @%q bra DONE;
  ld.param.u64 %rd1, [out];
  cvta.to.global.u64 %rd1, %rd1;
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %cluster_ctarank;
  mul.wide.u32 %rd2, %r2, 4;
  add.s64 %rd1, %rd1, %rd2;
  st.global.u32 [%rd1], %r3;
DONE:
  ret;
}

// Dynamic shared memory of `nbytes`: thread t stores t at the top of it (from the end down),
// then reads back the word of thread ntid-1-t: out[t] = ntid-1-t.
.visible .entry smem_echo(.param .u64 out, .param .u32 nbytes)
{
  .reg .b32 %r<10>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [out];
  ld.param.u32 %r1, [nbytes];
  mov.u32 %r2, %tid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, dsmem;
  add.s32 %r4, %r4, %r1;            // end of dynamic smem
  add.s32 %r5, %r2, 1;
  shl.b32 %r5, %r5, 2;
  sub.s32 %r6, %r4, %r5;            // end - 4*(t+1)
  st.shared.u32 [%r6], %r2;
  bar.sync 0;
  sub.s32 %r7, %r3, %r2;            // ntid - t  = (ntid-1-t) + 1
  shl.b32 %r7, %r7, 2;
  sub.s32 %r8, %r4, %r7;            // end - 4*(ntid-t)
  ld.shared.u32 %r9, [%r8];
  cvta.to.global.u64 %rd1, %rd1;
  mul.wide.u32 %rd2, %r2, 4;
  add.s64 %rd1, %rd1, %rd2;
  st.global.u32 [%rd1], %r9;
  ret;
}

// One TMA tile load: a 32x32 f32 box at (x0, y0) of the tensor described by `tmap` lands in
// shared memory (1024-aligned, so 128B swizzle is exact), then out[0..1023] = the smem bytes as is.
.visible .entry tma_tile(.param .align 64 .b8 tmap[128], .param .u64 out, .param .u32 x0, .param .u32 y0)
{
  .reg .pred %q<4>;
  .reg .b32 %r<12>;
  .reg .b64 %rd<6>;
  .reg .f32 %f1;
  .shared .align 1024 .b8 tile[4096];
  .shared .align 8 .b64 bar;
  mov.b64 %rd1, tmap;
  ld.param.u64 %rd2, [out];
  ld.param.u32 %r1, [x0];
  ld.param.u32 %r2, [y0];
  mov.u32 %r3, %tid.x;
  mov.u32 %r4, bar;
  mov.u32 %r5, tile;
  setp.ne.u32 %q1, %r3, 0;
  @%q1 bra INIT_DONE;
  mbarrier.init.shared::cta.b64 [%r4], 1;
  fence.proxy.async.shared::cta;
INIT_DONE:
  bar.sync 0;
  @%q1 bra ISSUED;
  mov.u32 %r6, 4096;
  mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r4], %r6;
  cvta.param.u64 %rd3, %rd1;
  cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%r5], [%rd3, {%r1, %r2}], [%r4];
ISSUED:
WAIT:
  mbarrier.try_wait.parity.shared::cta.b64 %q2, [%r4], 0;
  @!%q2 bra WAIT;
  cvta.to.global.u64 %rd2, %rd2;
  mov.u32 %r7, %ntid.x;
LOOP:
  setp.ge.u32 %q3, %r3, 1024;
  @%q3 bra DONE;
  shl.b32 %r8, %r3, 2;
  add.s32 %r9, %r5, %r8;
  ld.shared.f32 %f1, [%r9];
  mul.wide.u32 %rd4, %r3, 4;
  add.s64 %rd5, %rd2, %rd4;
  st.global.f32 [%rd5], %f1;
  add.u32 %r3, %r3, %r7;
  bra LOOP;
DONE:
  ret;
}
"""

ADD_ONE = [ParamSpec("p", "ptr"), ParamSpec("n", "u32")]
SCALE2 = ADD_ONE
AXPY = [ParamSpec("x", "tensor", dyn_shape=1), ParamSpec("a", "f32"), ParamSpec("y", "ptr")]
CLUSTER_RANK = [ParamSpec("out", "ptr")]
SMEM_ECHO = [ParamSpec("out", "ptr"), ParamSpec("nbytes", "u32")]
TMA_TILE = [ParamSpec("tmap", "tma"), ParamSpec("out", "ptr"), ParamSpec("x0", "u32"), ParamSpec("y0", "u32")]


@pytest.fixture(scope="module")
def dev():
    d = Device.open(0)
    if d.compute_capability < (9, 0):
        pytest.skip(f"these tests need sm_90 or newer (clusters, TMA); {d.name} is {d.arch}")
    return d


@pytest.fixture(scope="module")
def lib(dev):
    lib = Library.load(PTX.encode(), "test_kernels.ptx", dev)
    yield lib
    lib.close()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def blocks(n, b=256):
    return (n + b - 1) // b


def jit_cubin(ptx: str) -> bytes:
    """A cubin for this GPU made by the driver's JIT linker from PTX."""
    cu = driver()
    data = ptx.encode() + b"\0"
    state = check(cu.cuLinkCreate(0, [], []), "cuLinkCreate")
    try:
        check(cu.cuLinkAddData(state, cu.CUjitInputType.CU_JIT_INPUT_PTX, data, len(data), b"kernels.ptx", 0, [], []),
              "cuLinkAddData")
        out, size = check(cu.cuLinkComplete(state), "cuLinkComplete")
        return ctypes.string_at(int(out), int(size))
    finally:
        cu.cuLinkDestroy(state)


# ---- device ---------------------------------------------------------------------------------------

def test_device_properties(dev):
    assert gpu_count() >= 1
    assert dev.name
    assert dev.arch == arch_name(dev.compute_capability)
    assert dev.sm_count > 0 and dev.l2_bytes > 0
    assert dev.max_smem_per_block_optin >= 48 * 1024
    free = dev.free_mem()
    assert 0 < free <= dev.total_mem
    if "H200" in dev.name:
        assert dev.compute_capability == (9, 0) and dev.arch == "sm_90a"
        assert dev.sm_count == 132
        assert dev.total_mem > 130 * 2**30
    assert Device.open(0) is dev
    dev.synchronize()


def test_other_threads_need_activate(dev):
    seen = {}

    def worker():
        try:
            device_alloc(256, "no-context").free()
            seen["first"] = "ok"
        except CudaError as e:
            seen["first"] = e.result
            seen["msg"] = str(e)
        dev.activate()
        buf = device_alloc(256, "with-context")
        buf.free()
        seen["second"] = "ok"

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["first"] == "CUDA_ERROR_INVALID_CONTEXT"
    assert "activate" in seen["msg"]
    assert seen["second"] == "ok"


# ---- memory ---------------------------------------------------------------------------------------

def test_arena_alloc_report_and_capacity_error(dev):
    with DeviceArena(dev, 64 << 20, name="test-arena") as arena:
        a = arena.alloc("weights.a", 10 << 20)
        b = arena.alloc("weights.b", 1000, align=4096)
        c = arena.alloc("scratch", 3 << 20)
        assert a.ptr % 256 == 0 and b.ptr % 4096 == 0
        spans = sorted((x.ptr, x.ptr + x.nbytes) for x in (a, b, c))
        assert all(spans[i][1] <= spans[i + 1][0] for i in range(2))
        rep = arena.report()
        assert "test-arena" in rep and "weights.a" in rep and "scratch" in rep
        # the reservations are real memory: write and read each
        for buf, byte in ((a, 1), (b, 2), (c, 3)):
            memset_d8(buf, byte)
        for buf, byte in ((a, 1), (b, 2), (c, 3)):
            assert np.all(from_device(buf, np.uint8, buf.nbytes) == byte)
        with pytest.raises(OutOfMemoryError) as e:
            arena.alloc("too-big", 60 << 20)
        msg = str(e.value)
        assert "'too-big'" in msg and "test-arena" in msg and "64.0 MiB" in msg and "device free" in msg


def test_device_out_of_memory_names_the_reservation(dev):
    huge = dev.total_mem + (1 << 30)
    with pytest.raises(OutOfMemoryError) as e:
        device_alloc(huge, "kv-cache")
    assert "'kv-cache'" in str(e.value) and e.value.free is not None
    with DeviceArena(dev, 2 * huge, name="big") as arena:
        with pytest.raises(OutOfMemoryError, match="'big/layer0'"):
            arena.alloc("layer0", huge)


def test_pinned_round_trip_h2d_d2d_d2h(dev, rng):
    n = 1 << 20
    src = rng.standard_normal(n).astype(np.float32)
    with PinnedBuffer(src.nbytes, "stage-in") as pin_in, PinnedBuffer(src.nbytes, "stage-out") as pin_out:
        pin_in.array(np.float32, n)[:] = src
        out = pin_out.array(np.float32, n)
        out[:] = np.nan  # poison
        a = device_alloc(src.nbytes, "a")
        b = device_alloc(src.nbytes, "b")
        try:
            memset_d8(a, 0xFF)
            memset_d8(b, 0xFF)
            h2d(a, pin_in)
            d2d(b, a)
            d2h(pin_out, b)
            np.testing.assert_array_equal(out, src)
            # pageable numpy in and out, with an explicit size and a sub-range
            host = np.full(n, -1.0, np.float32)
            h2d(b, src[: n // 2], nbytes=src.nbytes // 2)
            d2h(host, b)
            np.testing.assert_array_equal(host, src)
        finally:
            a.free()
            b.free()


def test_async_copies_on_a_stream(dev, rng):
    n = 1 << 22
    src = rng.integers(0, 2**31, n, dtype=np.int32)
    s = Stream.create()
    with PinnedBuffer(src.nbytes) as pin_in, PinnedBuffer(src.nbytes) as pin_out:
        pin_in.array(np.int32, n)[:] = src
        pin_out.array(np.int32, n)[:] = 7
        buf = device_alloc(src.nbytes, "async")
        try:
            h2d(buf, pin_in, stream=s)
            d2h(pin_out, buf, stream=s)
            s.synchronize()
            assert s.query()
            np.testing.assert_array_equal(pin_out.array(np.int32, n), src)
        finally:
            buf.free()
    s.close()


def test_copy_size_checks(dev):
    buf = device_alloc(64, "small")
    try:
        with pytest.raises(Exception, match="do not fit"):
            h2d(buf, np.zeros(100, np.float32))
        with pytest.raises(Exception, match="C-contiguous"):
            h2d(buf, np.zeros((4, 4), np.float32)[:, ::2])
    finally:
        buf.free()


def test_to_device_and_arena(dev, rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    with DeviceArena(dev, 1 << 20) as arena:
        buf = to_device(arena, x, "x")
        np.testing.assert_array_equal(from_device(buf, np.float32, (3, 5)), x)
    own = to_device(None, x, "x-own")
    np.testing.assert_array_equal(from_device(own, np.float32, x.shape), x)
    own.free()



def test_upload_ring(dev, rng):
    """Odd sizes, a source longer than a slot, the ring wrapping, each source overwritten right after
    `copy` returns, and the bytes past each copy untouched."""
    from inferno.cuda.staging import UploadRing

    slot = 1 << 16
    sizes = [1, 7, slot - 1, slot, slot + 3, 5 * slot + 17, 12345]
    s = Stream.create()
    ring = UploadRing(s, slots=3, slot_bytes=slot)
    bufs, want = [], []
    try:
        for i, n in enumerate(sizes):
            src = rng.integers(0, 256, n, dtype=np.uint8)
            want.append(src.copy())
            buf = device_alloc(n + 64, f"ring {i}")
            memset_d8(buf, 0xA5)
            bufs.append(buf)
            ring.copy(buf, src)
            src[:] = rng.integers(0, 256, n, dtype=np.uint8)  # free again: the queued copy must not see this
        ring.close()
        for buf, w in zip(bufs, want):
            got = from_device(buf, np.uint8, (buf.nbytes,))
            np.testing.assert_array_equal(got[:w.size], w)
            assert (got[w.size:] == 0xA5).all()
        ring.copy(bufs[0], want[1])  # usable again after close
        ring.close()
        assert from_device(bufs[0], np.uint8, (7,)).tolist() == want[1].tolist()
        with pytest.raises(Exception, match="does not fit"):
            ring.copy(bufs[0], np.zeros(bufs[0].nbytes + 1, np.uint8))
    finally:
        ring.close()
        for buf in bufs:
            buf.free()
        s.close()

# ---- streams and events ---------------------------------------------------------------------------

def test_event_timing_and_cross_stream_wait(dev):
    s1, s2 = Stream.create(), Stream.create()
    nbytes = 256 << 20
    buf = device_alloc(nbytes, "big")
    start, end, ready = Event(), Event(), Event(timing=False)
    host = np.zeros(nbytes, np.uint8)
    try:
        start.record(s1)
        memset_d8(buf, 0x5A, stream=s1)
        end.record(s1)
        ready.record(s1)
        s2.wait(ready)  # s2's copy must see the memset
        d2h(host, buf, stream=s2)
        s2.synchronize()
        end.synchronize()
        ms = Event.elapsed_ms(start, end)
        assert 0 < ms < 1000
        assert start.query() and end.query()
        assert np.all(host == 0x5A)
    finally:
        buf.free()
        for x in (start, end, ready, s1, s2):
            x.close()


# ---- libraries and launches -----------------------------------------------------------------------

def test_library_entries_and_kernel_attributes(lib):
    assert {"add_one", "scale2", "axpy_t", "cluster_rank", "smem_echo", "tma_tile"} <= set(lib.entries())
    k = lib.kernel("add_one")
    assert k is lib.kernel("add_one")
    assert k.attribute("num_regs") > 0
    assert k.attribute("max_threads_per_block") >= 256
    assert k.param_sizes() == [8, 4]
    assert lib.kernel("axpy_t").param_sizes() == [16, 4, 8]
    assert lib.kernel("tma_tile").param_sizes() == [128, 8, 4, 4]
    with pytest.raises(ImageError, match="has no kernel 'nope'.*add_one"):
        lib.kernel("nope")


def test_launch_add_one(dev, lib, rng):
    n = 100_003
    x = rng.standard_normal(n).astype(np.float32)
    buf = to_device(None, x, "x")
    try:
        k = lib.kernel("add_one")
        p = pack_params(ADD_ONE, [buf, n], kernel="add_one")
        launch(k, blocks(n), 256, p)
        dev.synchronize()
        np.testing.assert_array_equal(from_device(buf, np.float32, n), x + np.float32(1))
        # the same PackedParams, rewritten in place: only the first half this time
        p.set("n", n // 2)
        s = Stream.create()
        launch(k, blocks(n), 256, p, stream=s)
        s.synchronize()
        want = x + np.float32(1)
        want[: n // 2] += np.float32(1)
        np.testing.assert_array_equal(from_device(buf, np.float32, n), want)
        s.close()
    finally:
        buf.free()


def test_tensor_and_f32_params(dev, lib, rng):
    n = 5000
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    dx, dy = to_device(None, x, "x"), to_device(None, y, "y")
    try:
        p = pack_params(AXPY, [TensorArg(dx, (n - 7,), ()), 2.5, dy], kernel="axpy_t")
        launch(lib.kernel("axpy_t"), blocks(n), 256, p)
        got = from_device(dy, np.float32, n)
        want = y.copy()
        want[: n - 7] = (np.float32(2.5) * x[: n - 7] + y[: n - 7]).astype(np.float32)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(got[n - 7:], y[n - 7:])  # the tensor's n bounded the kernel
    finally:
        dx.free()
        dy.free()


def test_mismatched_params_are_refused_before_the_driver(lib):
    k = lib.kernel("add_one")
    wrong = pack_params([ParamSpec("p", "ptr"), ParamSpec("n", "u64")], [0, 1], kernel="add_one")
    with pytest.raises(LaunchError, match=r"sizes \[8, 4\].*sizes \[8, 8\]"):
        launch(k, 1, 32, wrong)
    with pytest.raises(LaunchError, match="argument 1 'n' expects u32"):
        pack_params(ADD_ONE, [0, 1.5], kernel="add_one")


def test_cluster_launch(dev, lib):
    out = device_alloc(64 * 4, "ranks")
    try:
        memset_d8(out, 0xFF)
        launch(lib.kernel("cluster_rank"), 64, 32, pack_params(CLUSTER_RANK, [out]), cluster=(4, 1, 1))
        ranks = from_device(out, np.uint32, 64)
        np.testing.assert_array_equal(ranks, np.tile(np.arange(4, dtype=np.uint32), 16))
        memset_d8(out, 0xFF)
        launch(lib.kernel("cluster_rank"), 64, 32, pack_params(CLUSTER_RANK, [out]))  # no cluster: rank 0
        assert np.all(from_device(out, np.uint32, 64) == 0)
    finally:
        out.free()


def test_large_dynamic_shared_memory(dev, lib):
    k = lib.kernel("smem_echo")
    nbytes = min(200 * 1024, dev.max_smem_per_block_optin)
    out = device_alloc(256 * 4, "echo")
    try:
        p = pack_params(SMEM_ECHO, [out, nbytes])
        with pytest.raises(LaunchError, match="set_max_dynamic_smem"):
            launch(k, 1, 256, p, smem=nbytes)
        with pytest.raises(LaunchError, match="exceed"):
            k.set_max_dynamic_smem(dev.max_smem_per_block_optin + 1)
        k.set_max_dynamic_smem(nbytes)
        launch(k, 1, 256, p, smem=nbytes)
        np.testing.assert_array_equal(from_device(out, np.uint32, 256), np.arange(255, -1, -1, dtype=np.uint32))
    finally:
        out.free()


def test_cubin_for_another_arch_is_refused(dev):
    cubin = jit_cubin(PTX)
    info = inspect_image(cubin)
    sm = dev.compute_capability[0] * 10 + dev.compute_capability[1]
    assert (info.kind, info.sm) == ("cubin", sm)
    Library.load(cubin, "jit.cubin", dev).close()  # its own arch loads
    foreign = 120 if sm != 120 else 90
    patched = bytearray(cubin)
    patched[49 if cubin[8] >= 8 else 48] = foreign  # SM number in e_flags
    with pytest.raises(ImageError) as e:
        Library.load(bytes(patched), "foreign.cubin", dev)
    msg = str(e.value)
    assert f"sm_{foreign}" in msg and dev.arch in msg and dev.name in msg and "rebuild" in msg
    with pytest.raises(ImageError, match=r"manifest"):
        Library.load(cubin, "jit.cubin", dev, arch="sm_120a" if sm != 120 else "sm_90a")


# ---- TMA ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("swizzle", [0, 128])
def test_tma_tile_load(dev, lib, rng, swizzle):
    rows, cols = 70, 100  # f32, row pitch 400 B (a multiple of 16)
    x0, y0 = 80, 50  # the 32x32 box hangs over both edges: out-of-bounds elements read as 0
    src = rng.standard_normal((rows, cols)).astype(np.float32)
    dsrc = to_device(None, src, "src")
    out = device_alloc(32 * 32 * 4, "tile")
    try:
        tmap = encode_tiled("f32", dsrc.ptr, [cols, rows], [cols * 4], [32, 32], swizzle=swizzle)
        assert len(tmap) == 128
        memset_d8(out, 0xFF)
        launch(lib.kernel("tma_tile"), 1, 128, pack_params(TMA_TILE, [tmap, out, x0, y0]))
        got = from_device(out, np.float32, (32, 32))
        want = np.zeros((32, 32), np.float32)
        want[: rows - y0, : cols - x0] = src[y0:, x0:]
        if swizzle == 128:  # 16-byte chunk j of row r sits at chunk j ^ (r % 8)
            unswz = np.empty_like(got).reshape(32, 8, 4)
            g = got.reshape(32, 8, 4)
            for r in range(32):
                for j in range(8):
                    unswz[r, j] = g[r, j ^ (r % 8)]
            got = unswz.reshape(32, 32)
        np.testing.assert_array_equal(got, want)
    finally:
        dsrc.free()
        out.free()


def test_tma_bad_request_is_refused_before_the_driver(dev):
    buf = device_alloc(1 << 16, "t")
    try:
        with pytest.raises(LaunchError, match="multiples of 16"):
            encode_tiled("bf16", buf.ptr, [100, 10], [200], [64, 8], swizzle=128)  # 200 B: not a multiple of 16
    finally:
        buf.free()


# ---- graphs ---------------------------------------------------------------------------------------

def test_graph_capture_replay_and_param_update(dev, lib):
    n = 4096
    x = device_alloc(n * 4, "x")
    y = device_alloc(n * 4, "y")
    s = Stream.create()
    try:
        memset_d8(x, 0)
        memset_d8(y, 0)
        add, scale = lib.kernel("add_one"), lib.kernel("scale2")
        px = pack_params(ADD_ONE, [x, n], kernel="add_one")
        with Graph.capture(s) as g:
            launch(add, blocks(n), 256, px, stream=s)
            launch(scale, blocks(n), 256, pack_params(SCALE2, [x, n]), stream=s)
            launch(add, blocks(n), 256, px, stream=s)
        assert np.all(from_device(x, np.float32, n) == 0)  # capture does not run anything
        ge = g.instantiate()
        ge.upload(s)
        ge.launch(s)  # 0 -> 1 -> 2 -> 3
        ge.launch(s)  # 3 -> 4 -> 8 -> 9
        s.synchronize()
        assert np.all(from_device(x, np.float32, n) == 9)
        nodes = ge.kernel_nodes()
        assert [nd.name for nd in nodes] == ["add_one", "scale2", "add_one"]
        assert nodes[0].grid == (blocks(n), 1, 1) and nodes[0].block == (256, 1, 1)
        # changing the PackedParams does not touch the graph ...
        px.set("n", 1)
        ge.launch(s)  # 9 -> 10 -> 20 -> 21
        s.synchronize()
        assert np.all(from_device(x, np.float32, n) == 21)
        # ... update_kernel_params does: the last add now works on y
        ge.update_kernel_params(nodes[2], pack_params(ADD_ONE, [y, n], kernel="add_one"))
        ge.launch(s)  # x: 21 -> 22 -> 44 ; y: 0 -> 1
        s.synchronize()
        assert np.all(from_device(x, np.float32, n) == 44)
        assert np.all(from_device(y, np.float32, n) == 1)
        with pytest.raises(LaunchError, match="sizes"):
            ge.update_kernel_params(1, pack_params(CLUSTER_RANK, [y]))
        ge.close()
        g.close()
    finally:
        x.free()
        y.free()
        s.close()


def test_failed_capture_leaves_the_stream_usable(dev, lib):
    s = Stream.create()
    with pytest.raises(LaunchError):
        with Graph.capture(s):
            launch(lib.kernel("add_one"), 0, 256, pack_params(ADD_ONE, [0, 0]), stream=s)
    buf = device_alloc(1024, "after")
    memset_d8(buf, 1, stream=s)
    s.synchronize()
    buf.free()
    s.close()


# ---- overhead (printed, never asserted) -----------------------------------------------------------

def test_launch_overhead(dev, lib, capsys):
    n, calls = 256, 3000
    x = device_alloc(n * 4, "x")
    s = Stream.create()
    try:
        memset_d8(x, 0)
        k = lib.kernel("add_one")
        layout = ParamLayout(ADD_ONE, "add_one")
        p = layout.pack([x, n])
        prepared = Launch(k, 1, 256, p)
        with Graph.capture(s) as g:
            prepared(s)
        ge = g.instantiate()
        ge.upload(s)
        results = {}
        for label, fn in (("launch()", lambda: launch(k, 1, 256, p, stream=s)),
                          ("Launch.__call__", lambda: prepared(s)),
                          ("GraphExec.launch (1 node)", lambda: ge.launch(s)),
                          ("pack_params", lambda: layout.pack([x, n])),
                          ("PackedParams.set", lambda: p.set(1, n))):
            fn()
            s.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            s.synchronize()
            results[label] = (t1 - t0) / calls * 1e6
        # 1 + 3 * (calls + 1) kernel launches ran (the pack/set rows launch nothing)
        assert np.all(from_device(x, np.float32, n) == 3 * (calls + 1))
        with capsys.disabled():
            print("\nhost-side cost per call (us): " + ", ".join(f"{k}: {v:.2f}" for k, v in results.items()))
        ge.close()
        g.close()
    finally:
        x.free()
        s.close()
