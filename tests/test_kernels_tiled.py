"""`tile16-v1`: the load-time device layout of groupwise-int matrices (inferno/kernels/tiled.py)."""

import numpy as np
import pytest

from inferno.artifact.formats import groupwise as gw
from inferno.kernels import qlayout as ql
from inferno.kernels.tiled import TiledLayoutError, tile, tiled_geometry, untile

FORMATS = list(gw.SCHEMES)
SHAPES = [(16, 128), (40, 200), (1002, 264), (48, 1000)]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_round_trip(fmt, n, k):
    pay = ql.random_payload(fmt, n, k, np.random.default_rng())
    t = tile(fmt, pay, n, k)
    assert t.size == tiled_geometry(fmt, n, k).nbytes
    assert np.array_equal(untile(fmt, t, n, k), np.frombuffer(pay, np.uint8))


@pytest.mark.parametrize("fmt", FORMATS)
def test_lane_blocks_hold_the_fragment_bytes(fmt):
    """Spot-check the spec's addressing against the row-split planes for every lane of some blocks."""
    n, k = 40, 384
    rng = np.random.default_rng()
    pay = np.frombuffer(ql.random_payload(fmt, n, k, rng), np.uint8)
    g, tg = gw.geometry(fmt, (n, k)), tiled_geometry(fmt, n, k)
    t = tile(fmt, pay, n, k)
    ng, hb = tg.groups, tg.high_lane_bytes
    base = pay[:g.base_bytes].reshape(n, ng, 32)
    high = pay[g.high_offset:g.high_offset + g.high_bytes].reshape(n, ng, 4 * hb) if hb else None
    sc = pay[g.scale_offset:g.scale_offset + g.scale_bytes].view("<u2").reshape(n, ng)
    tsc = t[tg.scale_offset:].view("<u2")
    for T in range(tg.tiles):
        for j in range(ng):
            for lane in range(32):
                gg, tt = divmod(lane, 4)
                r0, r1 = 16 * T + gg, 16 * T + gg + 8
                blk = t[(T * ng + j) * 512 + 16 * lane:][:16]
                for half, r in ((0, r0), (1, r1)):
                    want = base[r, j, 8 * tt:8 * tt + 8] if r < n else np.zeros(8, np.uint8)
                    assert np.array_equal(blk[8 * half:8 * half + 8], want)
                    if hb:
                        hblk = t[tg.high_offset + (T * ng + j) * 64 * hb + 2 * hb * lane:][:2 * hb]
                        hw = high[r, j, hb * tt:hb * tt + hb] if r < n else np.zeros(hb, np.uint8)
                        assert np.array_equal(hblk[hb * half:hb * half + hb], hw)
                    s = tsc[((T * ng // 2 + j // 2) * 64 + 8 * gg) // 2 + 2 * (j % 2) + half]
                    assert s == (sc[r, j] if r < n else 0)


def test_refuses_a_wrong_size():
    pay = ql.random_payload("Q4G64_F16S", 16, 128, np.random.default_rng())
    with pytest.raises(TiledLayoutError, match="expected"):
        tile("Q4G64_F16S", pay[:-2], 16, 128)
    with pytest.raises(TiledLayoutError, match="formats"):
        tiled_geometry("BF16", 16, 128)


def test_nvfp4_goes_to_its_own_layout():
    """tiled_geometry / tile / untile take NVFP4 too, in tile16-nvfp4-v1 (inferno/kernels/tiled_nvfp4.py)."""
    from inferno.artifact.formats import nvfp4
    from inferno.kernels import tiled_nvfp4

    w = np.random.default_rng(3).standard_normal((128, 256)).astype(np.float32)
    pay = nvfp4.pack(*nvfp4.quantize(w))
    img = tile("NVFP4", pay, 128, 256)
    assert tiled_geometry("NVFP4", 128, 256).nbytes == tiled_nvfp4.tiled_geometry(128, 256).nbytes == img.nbytes
    assert np.array_equal(img, tiled_nvfp4.tile(pay, 128, 256))
    assert untile("NVFP4", img, 128, 256).tobytes() == bytes(pay)
