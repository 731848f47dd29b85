"""`tile16-nvfp4-v1`: the device layout of NVFP4 matrices for the tensor-core GEMV, made from the
artifact's `blockscale-k16-m128x4-v1` payload at load time so that a warp reads every byte of its
block in 512-byte warp-wide runs (`cute_kernels/gemv_mma_nvfp4.py`).

The A fragment of mma.sync m16n8k16 covers 16 weight rows: lane l = 4g + t (g = l // 4, t = l % 4)
holds rows g and g + 8. A block is 64 codes of a row (4 NVFP4 groups of 16); lane t of a quad holds
group 4j + t of block j of its two rows, i.e. the same bytes as `tile16-v1` Q4 (`inferno/kernels/tiled.py`)
with a 64-code block in place of a Q4 group. For [N, K] (K_pad = align(K, 128), NB = K_pad / 64
blocks per row, NP = NB / 2 block pairs, NT = ceil(N / 16) tiles; rows >= N and codes >= K are zero,
i.e. code +0 with scale 0):

  codes  block (T, j) of 512 B at (T * NB + j) * 512; lane l's 16 B at 16 l:
         [0, 8) = row 16T + g, code bytes 32 j + 8 t .. + 8 (codes 64 j + 16 t .., two a byte, low
         nibble first: group 4 j + t); [8, 16) = row 16T + g + 8, same bytes
  scales block (T, p) of 128 B for the block pair p at scale_offset + (T * NP + p) * 128; lane l's
         4 B at 4 l: E4M3 [s(g, 4(2p) + t), s(g + 8, 4(2p) + t), s(g, 4(2p+1) + t), s(g + 8, 4(2p+1) + t)]
  d_w    FP32 at divisor_offset (the payload's divisor, as is)

The scale plane starts at the next 256-byte boundary after the codes; the divisor follows the scales.
Codes and scales are the payload's bytes, only moved, so decoding is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inferno.artifact.formats import nvfp4
from inferno.errors import InfernoError

TILE_ROWS = 16
BLOCK = 64  # codes of a row per lane quad and block
LAYOUT = "tile16-nvfp4-v1"
PLANE_ALIGN = 256


class TiledNvfp4Error(InfernoError):
    """A payload or image that does not match the matrix it is said to hold."""


def _up(x: int, a: int) -> int:
    return -(-x // a) * a


@dataclass(frozen=True)
class TiledNvfp4Geometry:
    """Sizes and plane offsets of one NVFP4 matrix in `tile16-nvfp4-v1` (bytes)."""

    n: int
    k: int
    tiles: int  # NT
    blocks: int  # NB: 64-code blocks per row (K padded to 128)
    code_bytes: int
    scale_offset: int
    scale_bytes: int
    divisor_offset: int

    @property
    def nbytes(self) -> int:
        return self.divisor_offset + 4


def tiled_geometry(n: int, k: int) -> TiledNvfp4Geometry:
    """The `tile16-nvfp4-v1` geometry of an NVFP4 [n, k] (k a multiple of 16)."""
    if n <= 0 or k <= 0 or k % nvfp4.GROUP:
        raise TiledNvfp4Error(f"{LAYOUT} needs [N, K] with N > 0 and K a positive multiple of {nvfp4.GROUP}, "
                              f"got [{n}, {k}]")
    tiles, nb = -(-n // TILE_ROWS), _up(k, 2 * BLOCK) // BLOCK
    code = tiles * nb * 512
    scale_off = _up(code, PLANE_ALIGN)
    scale = tiles * nb * 64
    return TiledNvfp4Geometry(n, k, tiles, nb, code, scale_off, scale, scale_off + scale)


def _padded(a: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """a [r, c] zero-extended to [rows, cols]."""
    if a.shape == (rows, cols):
        return a
    out = np.zeros((rows, cols), a.dtype)
    out[:a.shape[0], :a.shape[1]] = a
    return out


def tile_words(codes: np.ndarray, scales: np.ndarray, divisor) -> np.ndarray:
    """The `tile16-nvfp4-v1` bytes (uint8) of exact NVFP4 words: packed codes uint8 [N, K/2] (low
    nibble = even k), E4M3 scale words uint8 [N, K/16], FP32 d_w."""
    n, k = codes.shape[0], codes.shape[1] * 2
    if scales.shape != (n, k // nvfp4.GROUP):
        raise TiledNvfp4Error(f"NVFP4 scales {list(scales.shape)} do not match codes [{n}, {k // 2}]")
    t = tiled_geometry(n, k)
    nt, nb = t.tiles, t.blocks
    out = np.zeros(t.nbytes, np.uint8)
    c = _padded(np.ascontiguousarray(codes, np.uint8), nt * 16, nb * 32).view(np.uint64)  # [rows, NB * 4]
    c = c.reshape(nt, 2, 8, nb, 4)  # [tile, half, g, block, t]
    out[:t.code_bytes].view(np.uint64).reshape(nt, nb, 8, 4, 2)[...] = c.transpose(0, 3, 2, 4, 1)
    s = _padded(np.ascontiguousarray(scales, np.uint8), nt * 16, nb * 4)
    s = s.reshape(nt, 2, 8, nb // 2, 2, 4)  # [tile, half, g, pair, q, t]
    out[t.scale_offset:t.divisor_offset].reshape(nt, nb // 2, 8, 4, 2, 2)[...] = s.transpose(0, 3, 2, 5, 4, 1)
    out[t.divisor_offset:] = np.array([divisor], "<f4").view(np.uint8)
    return out


def untile_words(tiled, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """(codes uint8 [n, k/2], scale words uint8 [n, k/16], d_w) of a `tile16-nvfp4-v1` image."""
    t = tiled_geometry(n, k)
    buf = np.frombuffer(tiled, dtype=np.uint8)
    if buf.size != t.nbytes:
        raise TiledNvfp4Error(f"NVFP4 [{n}, {k}] {LAYOUT} image has {buf.size} bytes, expected {t.nbytes}")
    nt, nb = t.tiles, t.blocks
    c = buf[:t.code_bytes].reshape(nt, nb, 8, 4, 2, 8).transpose(0, 4, 2, 1, 3, 5).reshape(nt * 16, nb * 32)
    s = buf[t.scale_offset:t.divisor_offset].reshape(nt, nb // 2, 8, 4, 2, 2).transpose(0, 5, 2, 1, 4, 3)
    s = s.reshape(nt * 16, nb * 4)
    d = buf[t.divisor_offset:].view("<f4")[0]
    return (np.ascontiguousarray(c[:n, :k // 2]), np.ascontiguousarray(s[:n, :k // nvfp4.GROUP]), np.float32(d))


def tile(payload, n: int, k: int) -> np.ndarray:
    """The `tile16-nvfp4-v1` bytes (uint8) of a `blockscale-k16-m128x4-v1` payload of [n, k]."""
    try:
        return tile_words(*nvfp4.unpack(payload, (n, k)))
    except TiledNvfp4Error:
        raise
    except InfernoError as e:
        raise TiledNvfp4Error(f"NVFP4 [{n}, {k}]: {e}") from None


def untile(tiled, n: int, k: int) -> np.ndarray:
    """The `blockscale-k16-m128x4-v1` payload of a `tile16-nvfp4-v1` image (the inverse of `tile`)."""
    return nvfp4.pack(*untile_words(tiled, n, k))
