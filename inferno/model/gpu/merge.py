"""Groupwise-int matrices stacked by rows into one matrix (the merged decode input projections).

A GDN layer's `query_key` (Q4) and `value_z` (Q5), or an attention layer's `query_key` and
`gate_value`, read the same normed input: stacked as rows [W0; W1] they are one GEMV. The stack is
stored in the widest format of its parts. The groupwise codes are signed two's-complement words with
one f16 scale per group of 64 along K, the same group for Q4, Q5 and Q6 (`formats.groupwise`): a Q4
code (-8..7) is the same value as a Q5 or Q6 code, so a narrower part is re-packed exactly (the
format's own `unpack` / `pack`) and the stack dequantizes to the same values, bit for bit.

`row-split-k128-v1` keeps every plane in (row, group) order, so the stack's planes are its parts'
planes one after the other: only the narrower parts are re-packed; the widest ones are copied.

A mixed stack (`mixed_q4_rows`: a Q4 part of whole 16-row tiles, then a Q5 part of the same K) is not
widened: its device image is the Q4 part's `tile16-v1` image, zero-padded to a 256-byte boundary, then
the Q5 part's (`mixed_image`; sizes: `tiled.mixed_offset` / `mixed_nbytes`), read as two matrices into two
row ranges (`mixed_parts`) except by the stream-K `_lo4` GEMV. Its placement keeps the wider format and
the whole shape, with `q4_rows` the rows held as Q4.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from inferno.artifact.formats import groupwise
from inferno.errors import ArtifactError
from inferno.kernels.tiled import MIXED_HIGH, MIXED_LOW, TILE_ROWS, mixed_nbytes, mixed_offset, tile, tiled_geometry

MERGEABLE = ("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S")  # formats a stack may hold (one group size)


def merged_format(formats: Sequence[str]) -> str:
    """The format of a stack of parts in `formats`: the widest (all must be groupwise Q4-Q6)."""
    bad = [f for f in formats if f not in MERGEABLE]
    if bad or not formats:
        raise ArtifactError(f"cannot stack {', '.join(formats) or 'no'} matrices by rows; "
                            f"only {', '.join(MERGEABLE)} are merged")
    return max(formats, key=lambda f: groupwise.SCHEMES[f].bits)


def widen(src: str, dst: str, payload, shape: tuple[int, int]) -> np.ndarray:
    """The `row-split-k128-v1` payload of `src` [n, k] re-packed as the (at least as wide) format `dst`."""
    if groupwise.SCHEMES[dst].bits < groupwise.SCHEMES[src].bits:
        raise ArtifactError(f"cannot narrow {src} to {dst} exactly")
    if src == dst:
        return np.frombuffer(payload, np.uint8)
    if src == "Q4G64_F16S":
        return _widen_q4(dst, payload, shape)
    return groupwise.pack(dst, *groupwise.unpack(src, payload, shape))


def _sign_table(hb: int) -> np.ndarray:
    """Two Q4 base bytes (4 codes, a little-endian uint16) -> the high bits Q5 (hb = 1) or Q6 (hb = 2) stores
    for those codes: each code's sign (its nibble's bit 3), hb times, code after code from bit 0."""
    x = np.arange(1 << 16, dtype=np.uint32)
    out = np.zeros(1 << 16, np.uint32)
    for c in range(4):
        out |= ((x >> (4 * c + 3)) & 1) * ((1 << hb) - 1) << (hb * c)
    return out.astype(np.uint8)


_SIGNS = {1: _sign_table(1), 2: _sign_table(2)}


def _widen_q4(dst: str, payload, shape: tuple[int, int]) -> np.ndarray:
    """A Q4 payload as Q5 / Q6 (`pack(dst, *unpack(Q4, ...))`, byte for byte, with no codes array): the base
    and scale planes are Q4's (a code's low 4 bits; the same groups), and a code's bits 4 and up in the high
    plane are its sign."""
    src_geo, geo = groupwise.geometry("Q4G64_F16S", shape), groupwise.geometry(dst, shape)
    buf = np.frombuffer(payload, np.uint8)
    if buf.size != src_geo.nbytes:
        raise ArtifactError(f"Q4G64_F16S {list(shape)} payload has {buf.size} bytes, its format needs "
                            f"{src_geo.nbytes}")
    out = np.zeros(geo.nbytes, np.uint8)
    out[:geo.base_bytes] = buf[:src_geo.base_bytes]
    hb = geo.scheme.bits - 4
    quads = _SIGNS[hb][buf[:src_geo.base_bytes].view("<u2")]  # the high bits of 4 codes
    high = quads if hb == 2 else quads[0::2] | (quads[1::2] << 4)
    out[geo.high_offset:geo.high_offset + geo.high_bytes] = high
    out[geo.scale_offset:] = buf[src_geo.scale_offset:]
    return out


def stack_rows(parts: Sequence[tuple[str, object, tuple[int, int]]]) -> tuple[str, np.ndarray, tuple[int, int]]:
    """(format, payload, shape) of the parts (format, row-split payload, [n_i, k]) stacked by rows."""
    fmt = merged_format([f for f, _, _ in parts])
    k = parts[0][2][1]
    if any(s[1] != k for _, _, s in parts):
        raise ArtifactError(f"cannot stack matrices of different widths {[list(s) for _, _, s in parts]}")
    n = sum(s[0] for _, _, s in parts)
    out_geo = groupwise.geometry(fmt, (n, k))
    out = np.zeros(out_geo.nbytes, np.uint8)
    at = {"base": out_geo.base_offset, "high": out_geo.high_offset, "scale": out_geo.scale_offset}
    for src, payload, shape in parts:
        data = widen(src, fmt, payload, shape)
        geo = groupwise.geometry(fmt, shape)
        if data.size != geo.nbytes:
            raise ArtifactError(f"{src} {list(shape)} payload has {data.size} bytes, its format needs {geo.nbytes}")
        for plane, off, size in (("base", geo.base_offset, geo.base_bytes), ("high", geo.high_offset, geo.high_bytes),
                                 ("scale", geo.scale_offset, geo.scale_bytes)):
            out[at[plane]:at[plane] + size] = data[off:off + size]
            at[plane] += size
    return fmt, out, (n, k)


def mixed_q4_rows(formats: Sequence[str], shapes: Sequence[tuple[int, int]]) -> int:
    """The rows a stack of parts (`formats`, `shapes` [n_i, k]) holds as a Q4 `tile16-v1` image ahead of the
    rest: the first part's, when the stack is mixed (a Q4 part of whole tiles, then a non-empty Q5 part of the
    same K), else 0 (the stack is widened: `stack_rows`)."""
    if (tuple(formats) != (MIXED_LOW, MIXED_HIGH) or len(shapes) != 2 or shapes[0][1] != shapes[1][1]
            or shapes[0][0] % TILE_ROWS or not shapes[1][0]):
        return 0
    return int(shapes[0][0])


def mixed_parts(n: int, k: int, q4_rows: int) -> tuple[tuple[str, int, int, int, int], ...]:
    """(format, first row, rows, byte offset, bytes) of the two `tile16-v1` images of a mixed stack [n, k]
    (`tiled.mixed_nbytes`)."""
    return ((MIXED_LOW, 0, q4_rows, 0, tiled_geometry(MIXED_LOW, q4_rows, k).nbytes),
            (MIXED_HIGH, q4_rows, n - q4_rows, mixed_offset(q4_rows, k),
             tiled_geometry(MIXED_HIGH, n - q4_rows, k).nbytes))


def mixed_image(payloads: Sequence[object], n: int, k: int, q4_rows: int) -> np.ndarray:
    """The device image of a mixed stack [n, k] from its parts' `row-split-k128-v1` payloads (Q4, then Q5)."""
    out = np.zeros(mixed_nbytes(n, k, q4_rows), np.uint8)
    for (fmt, _, rows, offset, size), payload in zip(mixed_parts(n, k, q4_rows), payloads, strict=True):
        out[offset:offset + size] = tile(fmt, payload, rows, k)
    return out
