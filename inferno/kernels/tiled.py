"""`tile16-v1`: the device layout of groupwise-int matrices, made from the artifact's `row-split-k128-v1`
payload at load time so that the tensor-core GEMV reads every weight byte in 512-byte warp-wide runs.

A warp's mma.sync m16n8k16 A fragment covers 16 weight rows: lane l = 4g + t (g = l // 4, t = l % 4)
holds rows g and g + 8, and the 4 lanes of a quad split each row's k range. With one group of one
row spread over a quad (lane t: codes 16t .. 16t + 15 of the group), the data a warp needs for one
(tile of 16 rows, group) is 512 bytes of base codes; `tile16-v1` stores exactly those bytes, in lane
order, one block after another along K, tile after tile. For [N, K] (K_pad = align(K, 128), G the
group, NG = K_pad / G groups per row, NT = ceil(N / 16) tiles; rows >= N are zero, i.e. code 0 and
scale 0):

  base   block (T, j) of 512 B at (T * NG + j) * 512; lane l's 16 B at 16 l:
         [0, 8) = row 16T + g, base bytes 8t .. 8t + 8 of group j; [8, 16) = row 16T + g + 8, same bytes
         (a group's 32 base bytes: Q4/Q5/Q6 low nibbles, two codes a byte, low nibble first; W8 bytes)
  high   Q5 (hb = 2) / Q6 (hb = 4): block (T, j) of 64 hb B at (T * NG + j) * 64 hb; lane l's 2 hb B at
         2 hb l: [0, hb) = row g's high bytes hb t .. hb t + hb of group j, [hb, 2 hb) = row g + 8's
  scale  block (T, p) of 64 B for the group pair p (groups 2p, 2p + 1) at (T * NG / 2 + p) * 64; at
         8 g: binary16 [s(g, 2p), s(g + 8, 2p), s(g, 2p + 1), s(g + 8, 2p + 1)] (row offsets in the tile)

Planes start at 0, `high_offset` and `scale_offset`, each 256-byte aligned. The bytes of a block are
the same bytes as in the row-split payload, only moved, except Q5's (`pack_q5`): its base words and a
lane's high word hold each code's 5 bits together, so the decode is one shift and one LOP3 for most
register pairs of codes (cute_kernels/gemv_mma.py `pairs_q5`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inferno.artifact.formats.groupwise import PLANE_ALIGN, SCHEMES, geometry
from inferno.errors import InfernoError

TILE_ROWS = 16
LAYOUT = "tile16-v1"


class TiledLayoutError(InfernoError):
    """A payload that does not match the matrix it is said to hold."""


def _up(x: int, a: int) -> int:
    return -(-x // a) * a


@dataclass(frozen=True)
class TiledGeometry:
    """Sizes and plane offsets of one matrix in `tile16-v1` (bytes)."""

    fmt: str
    n: int
    k: int
    tiles: int  # NT
    groups: int  # NG, per row
    high_lane_bytes: int  # hb: 0 (Q4, W8), 2 (Q5), 4 (Q6)
    base_bytes: int
    high_offset: int
    high_bytes: int
    scale_offset: int
    scale_bytes: int

    @property
    def nbytes(self) -> int:
        return self.scale_offset + self.scale_bytes


NVFP4 = "NVFP4"  # held in `tile16-nvfp4-v1` (inferno/kernels/tiled_nvfp4.py): tiled_geometry / tile / untile
# take it too, so callers that hold either kind of tensor-core GEMV image need one entry point


def tiled_geometry(fmt: str, n: int, k: int):
    """The `tile16-v1` geometry of `fmt` [n, k] (NVFP4: its `tile16-nvfp4-v1` geometry)."""
    if fmt == NVFP4:
        from inferno.kernels import tiled_nvfp4

        return tiled_nvfp4.tiled_geometry(n, k)
    if fmt not in SCHEMES:
        raise TiledLayoutError(f"no {LAYOUT} layout for format {fmt!r}; formats: {', '.join(SCHEMES)}")
    g = geometry(fmt, (n, k))
    tiles, ng = -(-n // TILE_ROWS), g.groups_per_row
    hb = g.scheme.high_bytes // 4
    base = tiles * ng * 512
    high = tiles * ng * 64 * hb
    high_off = _up(base, PLANE_ALIGN)
    scale_off = high_off + _up(high, PLANE_ALIGN)
    return TiledGeometry(fmt, n, k, tiles, ng, hb, base, high_off, high, scale_off, tiles * ng * 32)


MIXED_LOW, MIXED_HIGH = "Q4G64_F16S", "Q5G64_F16S"  # a mixed stack: Q4 rows ahead of Q5 rows


def mixed_offset(q4_rows: int, k: int) -> int:
    """Byte offset of the Q5 image in a mixed stack whose first `q4_rows` rows (a multiple of 16) are a Q4
    image: the Q4 `tile16-v1` image's bytes padded to PLANE_ALIGN."""
    return _up(tiled_geometry(MIXED_LOW, q4_rows, k).nbytes, PLANE_ALIGN)


def mixed_nbytes(n: int, k: int, q4_rows: int) -> int:
    """Bytes of a mixed stack of [n, k]: rows [0, q4_rows) a Q4 `tile16-v1` image, padded to PLANE_ALIGN, then
    rows [q4_rows, n) a Q5 one (the stream-K `lo4` GEMV members read it whole)."""
    if q4_rows <= 0 or q4_rows % TILE_ROWS or q4_rows >= n:
        raise TiledLayoutError(f"a mixed stack of {n} rows needs 0 < Q4 rows < {n}, a multiple of {TILE_ROWS}; "
                               f"got {q4_rows}")
    return mixed_offset(q4_rows, k) + tiled_geometry(MIXED_HIGH, n - q4_rows, k).nbytes


_HIGH_BITS = (4, 9, 14, 15, 20, 25, 30, 31)  # where `pack_q5` puts the high bits of codes 0-7 of a base word


def _spread_table() -> np.ndarray:
    """Byte b (the high bits of codes 0-7 of a base word) -> those bits at `_HIGH_BITS`."""
    out = np.zeros(256, np.uint32)
    for c, pos in enumerate(_HIGH_BITS):
        out |= ((np.arange(256) >> c) & 1).astype(np.uint32) << np.uint32(pos)
    return out


_SPREAD = _spread_table()
_U = np.uint32
Q5_SLICE = 512  # blocks `tile` packs at a time (256 KiB of base words)


def pack_q5(base: np.ndarray, high: np.ndarray) -> None:
    """Q5's lane words, in place: base uint32 [..., 4] (row g's words 0, 1, row g + 8's), high uint32 [...]
    (row g's 16 high bits, then row g + 8's; bit c = code c's bit 4).

    A base word holds codes c = 0..7 of a row (c = 8..15 for word 1) as nibbles (nibble c at bits 4c) and
    the pairs the decode needs are (c, c + 4). Packed, codes 0-2 / 4-6 sit whole (5 bits, raw) at bits
    5c / 16 + 5(c - 4) and the high bits of codes 3 and 7 at bits 15 and 31; the high word takes the
    nibbles of codes 3 and 7 of word i of row h at bits 8h + 4i and 16 + 8h + 4i."""
    packed = np.zeros_like(high)
    for h in range(2):
        for i in range(2):
            w = base[..., 2 * h + i]
            packed |= ((w >> _U(12)) & _U(0x000F000F)) << _U(8 * h + 4 * i)
            hb = (high >> _U(16 * h + 8 * i)) & _U(0xFF)
            base[..., 2 * h + i] = ((w & _U(0x000F000F)) | ((w & _U(0x00F000F0)) << _U(1))
                                    | ((w & _U(0x0F000F00)) << _U(2)) | _SPREAD[hb])
    high[...] = packed


def unpack_q5(base: np.ndarray, high: np.ndarray) -> None:
    """The inverse of `pack_q5`, in place."""
    hw = np.zeros_like(high)
    for h in range(2):
        for i in range(2):
            w = base[..., 2 * h + i]
            hb = np.zeros_like(w)
            for c, pos in enumerate(_HIGH_BITS):
                hb |= ((w >> _U(pos)) & _U(1)) << _U(c)
            hw |= hb << _U(16 * h + 8 * i)
            base[..., 2 * h + i] = ((w & _U(0x000F000F)) | ((w >> _U(1)) & _U(0x00F000F0))
                                    | ((w >> _U(2)) & _U(0x0F000F00))
                                    | (((high >> _U(8 * h + 4 * i)) & _U(0x000F000F)) << _U(12)))
    high[...] = hw


def _q5_planes(image: np.ndarray, t: TiledGeometry) -> tuple[np.ndarray, np.ndarray]:
    """Views of a Q5 image's base words [blocks, 32 lanes, 4] and high words [blocks, 32 lanes]."""
    base = image[:t.base_bytes].view(np.uint32).reshape(-1, 32, 4)
    return base, image[t.high_offset:t.high_offset + t.high_bytes].view(np.uint32).reshape(-1, 32)


def _rows(plane: np.ndarray, n: int, tiles: int) -> np.ndarray:
    """[n, ...] -> [tiles * 16, ...] with zero rows appended."""
    if tiles * TILE_ROWS == n:
        return plane
    out = np.zeros((tiles * TILE_ROWS,) + plane.shape[1:], plane.dtype)
    out[:n] = plane
    return out


def tile(fmt: str, payload, n: int, k: int) -> np.ndarray:
    """The `tile16-v1` bytes (uint8) of a `row-split-k128-v1` payload of `fmt` [n, k] (NVFP4: the
    `tile16-nvfp4-v1` bytes of its `blockscale-k16-m128x4-v1` payload)."""
    if fmt == NVFP4:
        from inferno.kernels import tiled_nvfp4

        return tiled_nvfp4.tile(payload, n, k)
    g, t = geometry(fmt, (n, k)), tiled_geometry(fmt, n, k)
    buf = np.frombuffer(payload, dtype=np.uint8)
    if buf.size != g.nbytes:
        raise TiledLayoutError(f"{fmt} [{n}, {k}] payload has {buf.size} bytes, expected {g.nbytes}")
    nt, ng, hb = t.tiles, t.groups, t.high_lane_bytes
    out = np.zeros(t.nbytes, np.uint8)
    # moved in whole units (8-byte base runs, hb-byte high runs, 2-byte scales): numpy copies elements
    base = _rows(buf[:g.base_bytes].view(np.uint64).reshape(n, ng, 4), n, nt).reshape(nt, 2, 8, ng, 4)
    out[:t.base_bytes].view(np.uint64).reshape(nt, ng, 8, 4, 2)[...] = base.transpose(0, 3, 2, 4, 1)
    if hb:
        unit = np.uint16 if hb == 2 else np.uint32
        high = buf[g.high_offset:g.high_offset + g.high_bytes].view(unit).reshape(n, ng, 4)
        high = _rows(high, n, nt).reshape(nt, 2, 8, ng, 4)
        out[t.high_offset:t.high_offset + t.high_bytes].view(unit).reshape(nt, ng, 8, 4, 2)[...] = \
            high.transpose(0, 3, 2, 4, 1)
    sc = buf[g.scale_offset:g.scale_offset + g.scale_bytes].view(np.uint16).reshape(n, ng // 2, 2)  # [row, pair, j]
    sc = _rows(sc, n, nt).reshape(nt, 2, 8, ng // 2, 2)  # [tile, half, g, pair, j]
    out[t.scale_offset:].view(np.uint16).reshape(nt, ng // 2, 8, 2, 2)[...] = sc.transpose(0, 3, 2, 4, 1)
    if g.scheme.bits == 5:
        base, high = _q5_planes(out, t)
        for b0 in range(0, base.shape[0], Q5_SLICE):  # slices whose temporaries stay in the caches
            pack_q5(base[b0:b0 + Q5_SLICE], high[b0:b0 + Q5_SLICE])
    return out


def untile(fmt: str, tiled, n: int, k: int) -> np.ndarray:
    """The `row-split-k128-v1` bytes of a `tile16-v1` image (the inverse of `tile`; padding rows dropped;
    NVFP4: the blockscale payload of a `tile16-nvfp4-v1` image)."""
    if fmt == NVFP4:
        from inferno.kernels import tiled_nvfp4

        return tiled_nvfp4.untile(tiled, n, k)
    g, t = geometry(fmt, (n, k)), tiled_geometry(fmt, n, k)
    buf = np.frombuffer(tiled, dtype=np.uint8)
    if buf.size != t.nbytes:
        raise TiledLayoutError(f"{fmt} [{n}, {k}] {LAYOUT} image has {buf.size} bytes, expected {t.nbytes}")
    nt, ng, hb = t.tiles, t.groups, t.high_lane_bytes
    if g.scheme.bits == 5:
        buf = buf.copy()
        unpack_q5(*_q5_planes(buf, t))
    out = np.zeros(g.nbytes, np.uint8)
    base = buf[:t.base_bytes].reshape(nt, ng, 8, 4, 2, 8).transpose(0, 4, 2, 1, 3, 5)
    out[:g.base_bytes] = base.reshape(nt * 16, -1)[:n].reshape(-1)
    if hb:
        high = buf[t.high_offset:t.high_offset + t.high_bytes].reshape(nt, ng, 8, 4, 2, hb).transpose(0, 4, 2, 1, 3, 5)
        out[g.high_offset:g.high_offset + g.high_bytes] = high.reshape(nt * 16, -1)[:n].reshape(-1)
    sc = buf[t.scale_offset:].reshape(nt, ng // 2, 8, 2, 2, 2).transpose(0, 4, 2, 1, 3, 5)
    out[g.scale_offset:g.scale_offset + g.scale_bytes] = sc.reshape(nt * 16, -1)[:n].reshape(-1)
    return out
