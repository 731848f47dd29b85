"""Arena bookkeeping and error messages, with cuMemAlloc replaced by a fake (no GPU needed)."""

import pytest

from inferno.cuda import memory
from inferno.cuda.errors import OutOfMemoryError
from inferno.cuda.memory import DeviceArena, DeviceBuffer, fmt_bytes
from inferno.errors import InfernoError


class FakeDriverMemory:
    """Hands out 256-aligned fake addresses; can pretend the device is out of memory."""

    def __init__(self, device_bytes=1 << 40):
        self.next = 0x7F00_0000_0000
        self.live: dict[int, int] = {}
        self.device_bytes = device_bytes

    def alloc(self, nbytes, name, used=0, capacity=0):
        if sum(self.live.values()) + nbytes > self.device_bytes:
            raise OutOfMemoryError(f"out of GPU memory allocating {name!r}", name=name, requested=nbytes,
                                   used=used, capacity=capacity, free=self.free())
        ptr = self.next
        self.next += nbytes + (-nbytes % 4096) + 4096
        self.live[ptr] = nbytes
        return ptr

    def release(self, ptr):
        del self.live[ptr]

    def free(self):
        return self.device_bytes - sum(self.live.values())


@pytest.fixture
def fake(monkeypatch):
    f = FakeDriverMemory()
    monkeypatch.setattr(memory, "_mem_alloc", f.alloc)
    monkeypatch.setattr(memory, "_mem_free", f.release)
    monkeypatch.setattr(memory, "_device_free", f.free)
    return f


def test_reservations_are_aligned_disjoint_and_counted(fake):
    arena = DeviceArena(None, 1 << 20, name="weights")
    a = arena.alloc("a", 100)
    b = arena.alloc("b", 1000, align=1024)
    c = arena.alloc("c", 8, align=16)
    assert a.ptr % 256 == 0 and b.ptr % 1024 == 0 and c.ptr % 16 == 0
    spans = sorted((x.ptr, x.ptr + x.nbytes) for x in (a, b, c))
    assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))
    assert (a.name, b.nbytes) == ("a", 1000)
    assert arena.used == (c.ptr + 8) - a.ptr  # padding counted
    assert len(fake.live) == 1  # one block
    assert arena.reserved == 1 << 20


def test_full_arena_names_reservation_and_sizes(fake):
    arena = DeviceArena(None, 4096, name="kv")
    arena.alloc("k0", 3000)
    with pytest.raises(OutOfMemoryError) as e:
        arena.alloc("v0", 2000)
    msg = str(e.value)
    assert "arena 'kv' is full" in msg and "'v0'" in msg
    assert fmt_bytes(2000) in msg and fmt_bytes(3000) in msg and fmt_bytes(4096) in msg and "device free" in msg
    assert (e.value.requested, e.value.used, e.value.capacity) == (2000, 3000, 4096)
    assert isinstance(e.value, InfernoError)


def test_blocks_grow_on_demand_up_to_capacity(fake):
    arena = DeviceArena(None, 10_000, name="act", block_bytes=4096)
    arena.alloc("x", 3000)
    arena.alloc("y", 3000)  # does not fit block 0's tail: a second block
    assert len(fake.live) == 2
    arena.alloc("z", 500)  # first fit: block 0's tail
    assert len(fake.live) == 2
    big = arena.alloc("big", 1800)  # block 2 gets the remaining 1808 bytes of capacity
    assert big.nbytes == 1800 and arena.reserved == 10_000
    with pytest.raises(OutOfMemoryError):
        arena.alloc("more", 4000)


def test_device_out_of_memory_surfaces_with_the_reservation_name(fake):
    fake.device_bytes = 1000
    arena = DeviceArena(None, 1 << 20, name="w")
    with pytest.raises(OutOfMemoryError, match="'w/emb'"):
        arena.alloc("emb", 10)


def test_report_lists_reservations_largest_first(fake):
    arena = DeviceArena(None, 1 << 20, name="weights")
    arena.alloc("small", 10)
    arena.alloc("large", 100_000)
    rep = arena.report()
    lines = rep.splitlines()
    assert lines[0].startswith("arena 'weights': used") and "2 reservations" in lines[0]
    assert lines[1].split()[0] == "large" and lines[2].split()[0] == "small"


def test_reset_reuses_blocks_and_close_frees_them(fake):
    arena = DeviceArena(None, 1 << 16, name="scratch")
    first = arena.alloc("a", 512)
    arena.reset()
    assert arena.used == 0 and arena.report().count("\n") == 0
    again = arena.alloc("a", 512)
    assert again.ptr == first.ptr and len(fake.live) == 1
    arena.close()
    assert fake.live == {}
    with pytest.raises(InfernoError, match="closed"):
        arena.alloc("b", 1)


@pytest.mark.parametrize("nbytes,align,match", [(0, 256, "positive int"), (-5, 256, "positive int"),
                                                (1.5, 256, "positive int"), (8, 3, "power of two")])
def test_bad_requests(fake, nbytes, align, match):
    with pytest.raises(InfernoError, match=match):
        DeviceArena(None, 4096).alloc("r", nbytes, align)


def test_bad_capacity():
    with pytest.raises(InfernoError, match="capacity must be a positive int"):
        DeviceArena(None, 0)


def test_buffer_views_stay_inside():
    buf = DeviceBuffer(0x1000, 256, "b")
    v = buf.view(128, 64)
    assert (v.ptr, v.nbytes, int(v)) == (0x1080, 64, 0x1080)
    with pytest.raises(InfernoError, match="outside"):
        buf.view(200, 100)


def test_owned_buffer_frees_once():
    calls = []
    buf = DeviceBuffer(0x1000, 16, "b", lambda: calls.append(1))
    buf.free()
    buf.free()
    assert calls == [1]


def test_fmt_bytes():
    assert fmt_bytes(512) == "512 B"
    assert fmt_bytes(1536) == "1.5 KiB"
    assert fmt_bytes(3 * 2**30) == "3.0 GiB"
