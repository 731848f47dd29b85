"""GPU: `dequant_nvfp4_tiled` (NVFP4 `tile16-nvfp4-v1` image -> bf16) vs `dequant_nvfp4` on the
blockscale payload of the same matrix and vs numpy, bit for bit.

Fresh random matrices every run, quantized by the format's own encoder (`nvfp4.quantize`; rows
scaled over a wide range so the block scales span many E4M3 exponents), tiled by
`tiled_nvfp4.tile`. Outputs start poisoned (0xFF = bf16 NaN) between a poisoned head and tail
guard; padding columns of a strided slice must stay poisoned. The 27B shapes (gate_up
[34816, 5120], down [5120, 17408]) are compared in full against `dequant_nvfp4` and on sampled
rows against numpy, and timed (TB/s, share of a device-to-device copy moving as many bytes).

Run: `python -m pytest -s tests/gpu/test_kernels_dequant_nvfp4_tiled.py` (cubins from the kernel
cache; without the DSL build them first: `python -m inferno.kernels.prefill_variants
$INFERNO_KERNEL_DIR sm_90a dequant_nvfp4,dequant_nvfp4_tiled`).
"""

import numpy as np
import pytest

from inferno.artifact.formats import nvfp4 as nv
from inferno.cuda.copy import from_device, memset_d8, to_device
from inferno.cuda.memory import device_alloc
from inferno.kernels.prefill_variants import Dequant
from inferno.kernels.reference import bf16
from inferno.kernels.tiled_nvfp4 import tile, tiled_geometry, untile

GUARD = 256


class _Bufs:
    """Device buffers of one test, freed at the end."""

    def __init__(self):
        self.all = []

    def up(self, a, name):
        b = to_device(None, a, name)
        self.all.append(b)
        return b

    def poisoned(self, nbytes, name):
        b = device_alloc(nbytes, name)
        memset_d8(b, 0xFF)
        self.all.append(b)
        return b


@pytest.fixture
def bufs():
    b = _Bufs()
    yield b
    for x in b.all:
        x.free()


def _matrix(n, k, rng):
    """An NVFP4 payload from `nvfp4.quantize` of a random [n, k] (rows scaled by 2^-12 .. 2^4)."""
    w = rng.standard_normal((n, k), np.float32) * np.exp2(rng.uniform(-12, 4, (n, 1))).astype(np.float32)
    return nv.pack(*nv.quantize(w))


def _run(kern, bufs, w_dev, n, k, n0, rows, stride):
    """Run `kern` on rows [n0, n0 + rows) into a poisoned, guarded [rows, stride] slice; bf16 bits
    uint16 [rows, stride] (0xFFFF where unwritten)."""
    nbytes = ((rows - 1) * stride + k) * 2
    guarded = bufs.poisoned(GUARD + nbytes + GUARD, "out")
    kern(w_dev, guarded.view(GUARD, nbytes + GUARD, "out"), n, k, n0=n0, rows=rows, out_stride=stride)
    raw = from_device(guarded, np.uint8, (GUARD + nbytes + GUARD,))
    assert np.all(raw[:GUARD] == 0xFF), "head guard written"
    assert np.all(raw[GUARD + nbytes:] == 0xFF), "tail guard written"
    full = np.full(rows * stride * 2, 0xFF, np.uint8)
    full[:nbytes] = raw[GUARD:GUARD + nbytes]
    return full.view(np.uint16).reshape(rows, stride)


def _case(device, bufs, rng, n, k, n0=0, rows=None, stride=None, sample=None, pay=None):
    rows = n - n0 if rows is None else rows
    stride = k if stride is None else stride
    pay = _matrix(n, k, rng) if pay is None else pay
    image = tile(pay, n, k)
    assert image.size == tiled_geometry(n, k).nbytes and np.array_equal(untile(image, n, k), pay)
    tiled = _run(Dequant.for_format("NVFP4", device, tiled=True), bufs, bufs.up(image, "image"),
                 n, k, n0, rows, stride)
    plain = _run(Dequant.for_format("NVFP4", device), bufs, bufs.up(pay, "payload"), n, k, n0, rows, stride)
    if stride > k:
        assert np.all(tiled[:, k:] == 0xFFFF), "padding columns written"
    differ = int((tiled != plain).sum())
    sel = np.arange(rows) if sample is None else sample
    codes, scales, d = nv.unpack(pay, (n, k))
    want = nv.dequantize(codes[n0 + sel], scales[n0 + sel], d).astype(bf16).view(np.uint16)
    wrong = int((tiled[sel, :k] != want).sum())
    print(f"dequant_nvfp4_tiled [{n}, {k}] rows [{n0}, {n0 + rows}) stride {stride}: {differ} values differ "
          f"from dequant_nvfp4, {wrong} of {want.size} from numpy ({'all' if sample is None else len(sel)} rows)")
    assert differ == 0 and wrong == 0


@pytest.mark.parametrize("n,k", [(128, 64), (256, 192), (1024, 1088)])
def test_whole(device, bufs, rng, n, k):
    _case(device, bufs, rng, n, k)


def test_row_slices(device, bufs, rng):
    _case(device, bufs, rng, 512, 320, n0=101, rows=300, stride=320 + 64)  # starts and ends inside a tile
    _case(device, bufs, rng, 256, 192, n0=7, rows=3, stride=200)  # inside one tile
    _case(device, bufs, rng, 256, 192, n0=240, rows=16)  # the last tile


@pytest.mark.parametrize("d", [1.0, 1.37 * 2.0**125, 3e38, 1e-37, 2.0**-149])
def test_every_word_and_extreme_divisors(device, bufs, rng, d):
    """Random code and scale words (every finite E4M3 scale), d_w where s / d_w is subnormal, zero or
    infinite for some scales (the kernel's per-code division path)."""
    n, k = 256, 1024
    codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales = rng.integers(0, 0x7F, (n, k // 16), dtype=np.uint8)
    with np.errstate(all="ignore"):
        _case(device, bufs, rng, n, k, pay=nv.pack(codes, scales, np.float32(d)))


@pytest.mark.parametrize("n,k", [(34816, 5120), (5120, 17408)])
def test_model_shapes(device, bufs, rng, n, k):
    """27B gate_up and down: all rows against dequant_nvfp4, sampled rows against numpy."""
    _case(device, bufs, rng, n, k, sample=np.unique(np.r_[0, 15, 16, n - 1, rng.choice(n, 64, replace=False)]))


def test_bandwidth(device, bufs, rng):
    """27B gate_up [34816, 5120]: both NVFP4 kernels against a device-to-device copy moving as many bytes."""
    from inferno.cuda.copy import d2d
    from inferno.cuda.stream import Event, Stream

    n, k = 34816, 5120
    codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales = rng.integers(0, 0x7F, (n, k // 16), dtype=np.uint8)
    pay = nv.pack(codes, scales, np.float32(rng.uniform(0.5, 3000.0)))
    image = tile(pay, n, k)
    dpay, dimg = bufs.up(pay, "payload"), bufs.up(image, "image")
    out_bytes = n * k * 2
    dout = bufs.poisoned(out_bytes, "out")
    moved = image.nbytes + out_bytes
    src, dst = bufs.poisoned(moved // 2, "copy src"), bufs.poisoned(moved // 2, "copy dst")
    tiled, plain = Dequant.for_format("NVFP4", device, tiled=True), Dequant.for_format("NVFP4", device)
    stream = Stream.create()
    try:
        def timed(fn, reps=20):
            fn()
            start, end = Event.create(), Event.create()
            start.record(stream)
            for _ in range(reps):
                fn()
            end.record(stream)
            end.synchronize()
            ms = Event.elapsed_ms(start, end) / reps
            start.close()
            end.close()
            return ms

        copy_ms = timed(lambda: d2d(dst, src, moved // 2, stream=stream))
        plain_ms = timed(lambda: plain(dpay, dout, n, k, stream=stream))
        tiled_ms = timed(lambda: tiled(dimg, dout, n, k, stream=stream))
    finally:
        stream.synchronize()
        stream.close()
    for name, ms in (("dequant_nvfp4", plain_ms), ("dequant_nvfp4_tiled", tiled_ms)):
        print(f"{name} [{n}, {k}]: {ms * 1e3:.0f} us, {moved / 2**20:.0f} MiB moved, {moved / ms / 1e9:.2f} TB/s "
              f"= {100 * copy_ms / ms:.0f} % of a copy moving as many bytes ({moved / copy_ms / 1e9:.2f} TB/s)")
    sample = np.unique(np.r_[0, n - 1, rng.choice(n, 64, replace=False)])
    got = from_device(dout, np.uint16, (n, k))[sample]
    want = nv.dequantize(codes[sample], scales[sample], nv.unpack(pay, (n, k))[2]).astype(bf16).view(np.uint16)
    assert np.array_equal(got, want)
