"""`tile16-v1`: the load-time device layout of groupwise-int matrices (inferno/kernels/tiled.py)."""

import numpy as np
import pytest

from inferno.artifact.formats import groupwise as gw
from inferno.kernels import qlayout as ql
from inferno.kernels.tiled import TiledLayoutError, tile, tiled_geometry, unpack_q5, untile

FORMATS = list(gw.SCHEMES)
Q5 = "Q5G64_F16S"
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
    if fmt == Q5:  # its words are re-packed (test_q5_codes_sit_whole); the moves are checked on the inverse
        unpack_q5(t[:tg.base_bytes].view(np.uint32).reshape(-1, 32, 4),
                  t[tg.high_offset:tg.high_offset + tg.high_bytes].view(np.uint32).reshape(-1, 32))
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


def test_q5_codes_sit_whole():
    """Q5 after `pack_q5`, against codes placed by hand: codes c and c + 4 (c < 3) of base word i of a row at
    bits 5c and 16 + 5c (raw 5 bits); codes 3 and 7: nibbles in the lane's high word at 8h + 4i and
    16 + 8h + 4i, high bits at bits 15 and 31 of the base word. Every code value, every lane."""
    n, k = 32, 256
    codes = np.resize(np.arange(-16, 16), n * k).reshape(n, k)
    codes = np.random.default_rng().permuted(codes, axis=1).astype(np.int8)
    pay = gw.pack(Q5, codes, np.ones((n, k // 64), np.float16))
    tg = tiled_geometry(Q5, n, k)
    t = tile(Q5, np.asarray(pay), n, k)
    base = t[:tg.base_bytes].view(np.uint32).reshape(tg.tiles, tg.groups, 32, 4).astype(np.int64)
    high = t[tg.high_offset:tg.high_offset + tg.high_bytes].view(np.uint32).reshape(tg.tiles, tg.groups, 32)
    high = high.astype(np.int64)
    raw = codes.astype(np.int64) & 31
    for T in range(tg.tiles):
        for j in range(tg.groups):
            for lane in range(32):
                g, tt = divmod(lane, 4)
                for h in range(2):
                    row = raw[16 * T + g + 8 * h, 64 * j + 16 * tt:][:16]
                    for i in range(2):
                        w, c = base[T, j, lane, 2 * h + i], row[8 * i:8 * i + 8]
                        got = [(w >> 5 * m) & 31 for m in range(3)] + [
                            ((high[T, j, lane] >> 8 * h + 4 * i) & 15) | ((w >> 15) & 1) << 4]
                        got += [(w >> 16 + 5 * m) & 31 for m in range(3)] + [
                            ((high[T, j, lane] >> 16 + 8 * h + 4 * i) & 15) | ((w >> 31) & 1) << 4]
                        assert got == list(c), (T, j, lane, h, i)


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
