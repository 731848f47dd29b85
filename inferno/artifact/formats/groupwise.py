"""Grouped signed-integer formats Q4G64_F16S / Q5G64_F16S / Q6G64_F16S / W8G32_F16S.

Numeric contract and encoder: NInfer `tensor-formats.md` §4-7 (symmetric, zero-point free, one
binary16 multiplier per group of G values along the last axis; canonical encoder
`MAXABS_F16_RECIP_RNE_V1`). Byte layout `row-split-k128-v1`: `storage-layouts.md` §3.

Layout summary for a logical matrix [N, K] (K padded to K_pad = align_up(K, 128)):
  base plane   N * K_pad/G groups x 32 bytes   (Q4/5/6: lane 2j low nibble, 2j+1 high nibble of
                                                 the low 4 bits; W8: one two's-complement byte)
  zero pad to 256
  high plane   Q5: 8 B/group (bit 4 of lane i -> byte i//8 bit i%8)
               Q6: 16 B/group (bits 4,5 of lane i -> byte i//4 bits 2(i%4), 2(i%4)+1)
  zero pad to 256
  scale plane  one little-endian binary16 per physical group
Groups are in row-major (row, group) order in every plane. Lanes at columns >= K have code 0;
groups wholly beyond K have scale 0.

The codecs take [..., K]: leading dimensions are flattened to rows (expert-major for [E, N, K]),
which is the byte image of the rank-2 [prod(leading), K] tensor that the layout stores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from inferno.errors import ArtifactError

PLANE_ALIGN = 256
K_ALIGN = 128
_ROWS_PER_CHUNK_ELEMS = 1 << 22  # bounds the float32 temporaries of encode/decode


@dataclass(frozen=True)
class Scheme:
    """Code width, group size, legal code interval and per-group plane bytes of one format."""

    name: str
    bits: int
    group: int
    qmin: int
    qmax: int

    @property
    def base_bytes(self) -> int:
        return 32

    @property
    def high_bytes(self) -> int:
        return 0 if self.bits in (4, 8) else self.group * (self.bits - 4) // 8


SCHEMES: dict[str, Scheme] = {
    "Q4G64_F16S": Scheme("Q4G64_F16S", 4, 64, -8, 7),
    "Q5G64_F16S": Scheme("Q5G64_F16S", 5, 64, -16, 15),
    "Q6G64_F16S": Scheme("Q6G64_F16S", 6, 64, -32, 31),
    "W8G32_F16S": Scheme("W8G32_F16S", 8, 32, -127, 127),
}


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


@dataclass(frozen=True)
class Geometry:
    """Physical geometry of one row-split-k128-v1 payload."""

    scheme: Scheme
    rows: int
    k: int
    k_pad: int
    groups_per_row: int
    logical_groups: int
    base_offset: int
    base_bytes: int
    high_offset: int
    high_bytes: int
    scale_offset: int
    scale_bytes: int
    nbytes: int


def geometry(fmt: str, shape: tuple[int, ...]) -> Geometry:
    """Plane offsets and sizes for `shape` = [..., K] (rows = product of leading dimensions)."""
    s = SCHEMES[fmt]
    if len(shape) < 2 or any(d <= 0 for d in shape):
        raise ArtifactError(f"{fmt} needs a matrix [N, K] with positive dimensions, got shape {list(shape)}")
    rows, k = math.prod(shape[:-1]), shape[-1]
    k_pad = _align(k, K_ALIGN)
    gpr = k_pad // s.group
    groups = rows * gpr
    base = groups * s.base_bytes
    high = groups * s.high_bytes
    high_off = _align(base, PLANE_ALIGN)
    scale_off = high_off + _align(high, PLANE_ALIGN)
    return Geometry(s, rows, k, k_pad, gpr, -(-k // s.group), 0, base, high_off, high,
                    scale_off, groups * 2, scale_off + groups * 2)


def quantize(fmt: str, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`MAXABS_F16_RECIP_RNE_V1`: float values [..., K] -> (codes int8 [..., K],
    scales float16 [..., ceil(K/G)]).

    Per logical group: amax = max|x|; scale16 = f16(f32(amax / qmax)) (0 -> 0x0001 rescue when
    amax > 0; all-zero group -> scale +0, codes 0); inv = f32(1 / f32(scale16));
    code = clamp(rint(f32(x * inv)), qmin, qmax). Every step rounds to nearest even.
    """
    s = SCHEMES[fmt]
    x = np.asarray(w)
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ArtifactError(f"{fmt} quantization needs a non-empty last axis, got shape {list(x.shape)}")
    x = x.astype(np.float32, copy=False)
    if not np.all(np.isfinite(x)):
        raise ArtifactError(f"{fmt} quantization input holds NaN or infinity; fix the source tensor")
    k = x.shape[-1]
    ng = -(-k // s.group)
    lead = x.shape[:-1]
    rows = x.reshape(-1, k)
    codes = np.empty(rows.shape, dtype=np.int8)
    scales = np.empty((rows.shape[0], ng), dtype=np.float16)
    step = max(1, _ROWS_PER_CHUNK_ELEMS // (ng * s.group))
    for r0 in range(0, rows.shape[0], step):
        c, sc = _quantize_rows(s, rows[r0:r0 + step], ng)
        codes[r0:r0 + step] = c
        scales[r0:r0 + step] = sc
    return codes.reshape(*lead, k), scales.reshape(*lead, ng)


def _quantize_rows(s: Scheme, x: np.ndarray, ng: int) -> tuple[np.ndarray, np.ndarray]:
    n, k = x.shape
    padded = np.zeros((n, ng * s.group), dtype=np.float32)
    padded[:, :k] = x
    g = padded.reshape(n, ng, s.group)
    amax = np.max(np.abs(g), axis=-1)
    raw = amax / np.float32(s.qmax)
    with np.errstate(over="ignore"):
        scale16 = raw.astype(np.float16)
    if not np.all(np.isfinite(scale16)):
        raise ArtifactError(f"{s.name} quantization: a group's scale overflows binary16 (|x| too large)")
    scale16[(scale16 == 0) & (amax > 0)] = np.float16(2.0**-24)
    zero = amax == 0
    scale32 = scale16.astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.float32(1.0) / scale32
    inv[zero] = 0
    q = np.rint(g * inv[..., None])
    codes = np.clip(q, s.qmin, s.qmax).astype(np.int8)
    return codes.reshape(n, -1)[:, :k], scale16


def dequantize(fmt: str, codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """(codes [..., K], scales [..., ceil(K/G)]) -> float32 f32(f32(scale) * code)."""
    s = SCHEMES[fmt]
    k = codes.shape[-1]
    sc = np.repeat(scales.astype(np.float32), s.group, axis=-1)[..., :k]
    return sc * codes.astype(np.float32)


def pack(fmt: str, codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Lay out logical (codes [..., K] int, scales [..., ceil(K/G)] float16) as row-split-k128-v1.

    Returns the payload as a uint8 array of `geometry(fmt, codes.shape).nbytes` bytes.
    """
    codes = np.asarray(codes)
    geo = geometry(fmt, codes.shape)
    s = geo.scheme
    scales = np.asarray(scales)
    if scales.shape != (*codes.shape[:-1], geo.logical_groups):
        raise ArtifactError(f"{fmt}: scales shape {list(scales.shape)} does not match codes {list(codes.shape)}")
    if codes.size and (codes.min() < s.qmin or codes.max() > s.qmax):
        raise ArtifactError(f"{fmt}: codes outside [{s.qmin}, {s.qmax}]")
    out = np.zeros(geo.nbytes, dtype=np.uint8)
    gpr = geo.groups_per_row
    rows_per = max(1, _ROWS_PER_CHUNK_ELEMS // geo.k_pad)
    c2 = codes.reshape(geo.rows, geo.k)
    for r0 in range(0, geo.rows, rows_per):
        r1 = min(geo.rows, r0 + rows_per)
        u = np.zeros((r1 - r0, geo.k_pad), dtype=np.uint8)
        u[:, :geo.k] = c2[r0:r1].astype(np.int8).view(np.uint8)
        u &= np.uint8((1 << s.bits) - 1)
        base, high = _pack_group_bytes(s, u.reshape(-1, s.group))
        g0, g1 = r0 * gpr, r1 * gpr
        out[geo.base_offset + g0 * 32: geo.base_offset + g1 * 32] = base.reshape(-1)
        if s.high_bytes:
            hb = s.high_bytes
            out[geo.high_offset + g0 * hb: geo.high_offset + g1 * hb] = high.reshape(-1)
    sc = np.zeros((geo.rows, gpr), dtype="<f2")
    sc[:, :geo.logical_groups] = scales.reshape(geo.rows, geo.logical_groups)
    out[geo.scale_offset:] = sc.reshape(-1).view(np.uint8)
    return out


def _pack_group_bytes(s: Scheme, u: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Unsigned b-bit words [groups, G] -> (base bytes [groups, 32], high bytes or None)."""
    if s.bits == 8:
        return u, None
    base = (u[:, 0::2] & 0x0F) | ((u[:, 1::2] & 0x0F) << 4)
    if s.bits == 4:
        return base, None
    hb = s.bits - 4
    bits = np.stack([(u >> (4 + i)) & 1 for i in range(hb)], axis=-1)  # [groups, G, hb], bit 4 first
    high = np.packbits(bits.reshape(u.shape[0], -1), axis=-1, bitorder="little")
    return base, high


def unpack(fmt: str, data, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """row-split-k128-v1 payload -> logical (codes int8 [..., K], scales float16 [..., ceil(K/G)]).

    Checks the layout's invariants: exact length, zero plane padding, zero codes in padded lanes,
    zero scale and codes in wholly padded groups, valid scales (+0 or finite positive, +0 only
    with all-zero codes) and, for W8, no code -128.
    """
    geo = geometry(fmt, shape)
    buf, scales = _checked_planes(fmt, geo, data, shape)
    codes = np.empty((geo.rows, geo.k), dtype=np.int8)
    for r0, r1 in _row_chunks(geo):
        codes[r0:r1] = _codes(fmt, geo, buf, scales, r0, r1)
    lead = tuple(shape[:-1])
    return codes.reshape(*lead, geo.k), scales.reshape(*lead, geo.logical_groups)


def decode_bf16(fmt: str, data, shape: tuple[int, ...], workers: int = 1) -> np.ndarray:
    """row-split-k128-v1 payload -> bfloat16 values in `shape` (the one rounding of f32(scale) * code, as
    `decode(...).astype(bfloat16)`), checked as `unpack` checks, row chunks on `workers` threads (numpy
    releases the GIL in their work), with no float32 copy of the whole matrix."""
    from concurrent.futures import ThreadPoolExecutor

    from ml_dtypes import bfloat16

    geo = geometry(fmt, shape)
    buf, scales = _checked_planes(fmt, geo, data, shape)
    out = np.empty((geo.rows, geo.k), dtype=np.uint16)

    def chunk(rows: tuple[int, int]) -> None:
        r0, r1 = rows
        f = dequantize(fmt, _codes(fmt, geo, buf, scales, r0, r1), scales[r0:r1])
        u = f.view(np.uint32)  # the products are exact: round them to bf16, nearest even
        out[r0:r1] = (u + (0x7FFF + ((u >> 16) & 1))) >> 16

    with ThreadPoolExecutor(max(1, workers)) as pool:
        list(pool.map(chunk, _row_chunks(geo)))
    return out.view(bfloat16).reshape(shape)


def _row_chunks(geo: Geometry) -> list[tuple[int, int]]:
    """Row ranges of about _ROWS_PER_CHUNK_ELEMS codes."""
    rows_per = max(1, _ROWS_PER_CHUNK_ELEMS // geo.k_pad)
    return [(r0, min(geo.rows, r0 + rows_per)) for r0 in range(0, geo.rows, rows_per)]


def _checked_planes(fmt: str, geo: Geometry, data, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(payload bytes, scales float16 [rows, logical groups]) after the checks of length, plane padding,
    scale values and padding groups' scales."""
    buf = np.frombuffer(data, dtype=np.uint8)
    if buf.size != geo.nbytes:
        raise ArtifactError(f"{fmt} payload of shape {list(shape)} needs {geo.nbytes} bytes, got {buf.size}")
    pads = [buf[geo.base_bytes:geo.high_offset],
            buf[geo.high_offset + geo.high_bytes:geo.scale_offset]]
    if any(p.any() for p in pads):
        raise ArtifactError(f"{fmt} payload has nonzero plane padding (row-split-k128-v1 requires zeros)")
    sc_all = buf[geo.scale_offset:].view("<f2").reshape(geo.rows, geo.groups_per_row)
    sc_bits = sc_all.view(np.uint16)
    if np.any((sc_bits & 0x8000) != 0) or np.any((sc_bits & 0x7C00) == 0x7C00):
        raise ArtifactError(f"{fmt} payload holds a negative, infinite or NaN scale")
    if sc_all[:, geo.logical_groups:].view(np.uint16).any():
        raise ArtifactError(f"{fmt} payload has a nonzero scale in a padding group")
    return buf, np.ascontiguousarray(sc_all[:, :geo.logical_groups]).astype(np.float16)


def _codes(fmt: str, geo: Geometry, buf: np.ndarray, scales: np.ndarray, r0: int, r1: int) -> np.ndarray:
    """Codes int8 [r1 - r0, K] of rows r0 .. r1 - 1, after the checks of their K padding, W8's -128 and
    the codes of groups whose scale is 0."""
    s, gpr = geo.scheme, geo.groups_per_row
    g0, g1 = r0 * gpr, r1 * gpr
    base = buf[geo.base_offset + g0 * 32: geo.base_offset + g1 * 32].reshape(-1, 32)
    high = None
    if s.high_bytes:
        hb = s.high_bytes
        high = buf[geo.high_offset + g0 * hb: geo.high_offset + g1 * hb].reshape(-1, hb)
    q = _unpack_group_codes(s, base, high).reshape(r1 - r0, geo.k_pad)
    if q[:, geo.k:].any():
        raise ArtifactError(f"{fmt} payload has nonzero codes in the K padding")
    codes = q[:, :geo.k]
    if s.bits == 8 and np.any(codes == -128):
        raise ArtifactError(f"{fmt} payload holds code -128 (W8 codes are [-127, 127])")
    zero_scale = scales[r0:r1] == 0
    if zero_scale.any():
        padded = np.zeros((r1 - r0, geo.logical_groups * s.group), dtype=np.int8)
        padded[:, :geo.k] = codes
        if np.any(padded.reshape(r1 - r0, geo.logical_groups, s.group)[zero_scale]):
            raise ArtifactError(f"{fmt} payload has nonzero codes in a group whose scale is 0")
    return codes


def _unpack_group_codes(s: Scheme, base: np.ndarray, high: np.ndarray | None) -> np.ndarray:
    """(base [groups, 32], high [groups, H]) -> signed codes int8 [groups, G]."""
    if s.bits == 8:
        return base.view(np.int8)
    u = np.empty((base.shape[0], s.group), dtype=np.uint8)
    u[:, 0::2] = base & 0x0F
    u[:, 1::2] = base >> 4
    if high is not None:
        hb = s.bits - 4
        bits = np.unpackbits(high, axis=-1, bitorder="little").reshape(base.shape[0], s.group, hb)
        for i in range(hb):
            u |= bits[..., i] << (4 + i)
    # sign-extend the b-bit two's-complement word
    shift = 8 - s.bits
    return (u << shift).view(np.int8) >> shift


def encode(fmt: str, w: np.ndarray) -> np.ndarray:
    """Float values [..., K] -> row-split-k128-v1 payload bytes with the canonical encoder."""
    codes, scales = quantize(fmt, w)
    return pack(fmt, codes, scales)


def decode(fmt: str, data, shape: tuple[int, ...]) -> np.ndarray:
    """row-split-k128-v1 payload -> float32 values in `shape`."""
    codes, scales = unpack(fmt, data, shape)
    return dequantize(fmt, codes, scales)
