"""NVFP4 in layout `blockscale-k16-m128x4-v1`.

Numeric contract (NInfer `tensor-formats.md` §3.3): for a matrix [N, K], each K-group of 16
holds E2M1 code words (bit 3 sign, magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6) and one E4M3FN scale
word (bias 7, no infinities, 0x7F/0xFF NaN); the matrix has one FP32 divisor d_w (finite, > 0):
    W[n, k] = e2m1(c[n, k]) * e4m3(s[n, k // 16]) / d_w
Stored scales must be +0 or positive finite (sign bit clear, not 0x7F).

Layout (`storage-layouts.md` §4; N % 128 == 0, K % 64 == 0):
  code plane   N*K/2 bytes, row-major, low nibble = even k, high nibble = odd k
  zero pad to 256
  scale plane  N*K/16 bytes; scale (n, g) at
               (n//128 * K/64 + g//4) * 512 + (n%128 % 32) * 16 + (n%128 // 32) * 4 + g % 4
  divisor      4 bytes, little-endian FP32

NInfer defines no NVFP4 encoder (its converter copies a published checkpoint's words). `quantize`
is Inferno's own, for synthetic artifacts, in the usual max-abs scheme:
  d_w = f32(448 * 6 / amax(W))            (1.0 for an all-zero matrix)
  s   = e4m3_rne(min(f32(f32(amax_block * d_w) / 6), 448))
  c   = e2m1_rne(f32(f32(x * d_w) / f32(s)))   (magnitudes above 6 clamp to 6; s == 0 -> c = 0)
E2M1 rounding is to nearest, ties to the even mantissa bit; a zero magnitude is stored as +0.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from inferno.errors import ArtifactError

PLANE_ALIGN = 256
GROUP = 16
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)
E4M3_MAX = 448.0
_ROWS_PER_CHUNK = 128


@dataclass(frozen=True)
class Geometry:
    """Physical geometry of one blockscale-k16-m128x4-v1 payload."""

    n: int
    k: int
    code_bytes: int
    scale_offset: int
    scale_bytes: int
    divisor_offset: int
    nbytes: int


def geometry(shape: tuple[int, ...]) -> Geometry:
    """Plane offsets for a rank-2 [N, K] with N % 128 == 0 and K % 64 == 0."""
    if len(shape) != 2 or shape[0] <= 0 or shape[1] <= 0 or shape[0] % 128 or shape[1] % 64:
        raise ArtifactError(f"NVFP4 needs a matrix [N, K] with N % 128 == 0 and K % 64 == 0, got shape {list(shape)}")
    n, k = shape
    code = n * k // 2
    scale_off = -(-code // PLANE_ALIGN) * PLANE_ALIGN
    scale = n * k // GROUP
    return Geometry(n, k, code, scale_off, scale, scale_off + scale, scale_off + scale + 4)


def swizzle_scales(scales: np.ndarray) -> np.ndarray:
    """Natural [N, K/16] scale words -> the scale plane bytes (flat uint8)."""
    n, groups = scales.shape
    # (row_tile, row_inner//32, row_inner%32, k_tile, lane) -> (row_tile, k_tile, %32, //32, lane)
    s = scales.reshape(n // 128, 4, 32, groups // 4, 4)
    return np.ascontiguousarray(s.transpose(0, 3, 2, 1, 4)).reshape(-1)


def unswizzle_scales(plane: np.ndarray, n: int, groups: int) -> np.ndarray:
    """Scale plane bytes -> natural [N, K/16] scale words."""
    s = plane.reshape(n // 128, groups // 4, 32, 4, 4)
    return np.ascontiguousarray(s.transpose(0, 3, 2, 1, 4)).reshape(n, groups)


def _check_words(scales: np.ndarray, divisor: np.float32) -> None:
    if np.any(scales & 0x80) or np.any(scales == 0x7F):
        raise ArtifactError("NVFP4 block scales must be +0 or positive finite E4M3FN words")
    if not (np.isfinite(divisor) and divisor > 0):
        raise ArtifactError(f"NVFP4 weight divisor must be finite and positive, got {divisor!r}")


def pack(codes: np.ndarray, scales: np.ndarray, divisor) -> np.ndarray:
    """Exact words -> payload. codes: packed uint8 [N, K/2] (low nibble = even k);
    scales: E4M3FN words uint8 [N, K/16]; divisor: FP32 d_w."""
    codes = np.asarray(codes)
    scales = np.asarray(scales)
    if scales.dtype != np.uint8:
        scales = scales.view(np.uint8) if scales.dtype.itemsize == 1 else scales
    if codes.dtype != np.uint8 or codes.ndim != 2 or scales.dtype != np.uint8:
        raise ArtifactError("NVFP4 pack needs uint8 codes [N, K/2] and uint8 scale words [N, K/16]")
    geo = geometry((codes.shape[0], codes.shape[1] * 2))
    if scales.shape != (geo.n, geo.k // GROUP):
        raise ArtifactError(f"NVFP4 scales shape {list(scales.shape)} does not match [{geo.n}, {geo.k // GROUP}]")
    d = np.float32(divisor)
    _check_words(scales, d)
    out = np.zeros(geo.nbytes, dtype=np.uint8)
    out[:geo.code_bytes] = codes.reshape(-1)
    out[geo.scale_offset:geo.divisor_offset] = swizzle_scales(scales)
    out[geo.divisor_offset:] = np.array([d], dtype="<f4").view(np.uint8)
    return out


def unpack(data, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """Payload -> (packed codes uint8 [N, K/2], natural scale words uint8 [N, K/16], d_w)."""
    geo = geometry(shape)
    buf = np.frombuffer(data, dtype=np.uint8)
    if buf.size != geo.nbytes:
        raise ArtifactError(f"NVFP4 payload of shape {list(shape)} needs {geo.nbytes} bytes, got {buf.size}")
    if buf[geo.code_bytes:geo.scale_offset].any():
        raise ArtifactError("NVFP4 payload has nonzero padding between its code and scale planes")
    codes = buf[:geo.code_bytes].reshape(geo.n, geo.k // 2)
    scales = unswizzle_scales(buf[geo.scale_offset:geo.divisor_offset], geo.n, geo.k // GROUP)
    d = buf[geo.divisor_offset:].view("<f4")[0]
    _check_words(scales, d)
    return codes, scales, np.float32(d)


def dequantize(codes: np.ndarray, scales: np.ndarray, divisor) -> np.ndarray:
    """Exact words -> float32 W = f32(e2m1 * e4m3) / d_w (the product is exact)."""
    n, half = codes.shape
    out = np.empty((n, half * 2), dtype=np.float32)
    out[:, 0::2] = E2M1_VALUES[codes & 0x0F]
    out[:, 1::2] = E2M1_VALUES[codes >> 4]
    sc = scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    out *= np.repeat(sc, GROUP, axis=1)
    out /= np.float32(divisor)
    return out


def _e2m1_codes(m: np.ndarray) -> np.ndarray:
    """Non-negative float32 magnitudes -> E2M1 magnitude codes 0..7, nearest, ties to even."""
    idx = np.zeros(m.shape, dtype=np.uint8)
    for t in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0):
        idx += m > np.float32(t)
    for t in (0.75, 1.75, 3.5):  # ties whose upper neighbour has mantissa bit 0
        idx += m == np.float32(t)
    return idx


def quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """Inferno's NVFP4 encoder (see module doc): float [N, K] -> (codes, scales, d_w) words."""
    x = np.asarray(w).astype(np.float32, copy=False)
    geo = geometry(x.shape)
    if not np.all(np.isfinite(x)):
        raise ArtifactError("NVFP4 quantization input holds NaN or infinity; fix the source tensor")
    amax = np.float32(np.max(np.abs(x))) if x.size else np.float32(0)
    d = np.float32(1.0) if amax == 0 else np.float32(E4M3_MAX * 6.0) / amax
    if not np.isfinite(d):
        raise ArtifactError("NVFP4 quantization: the weight divisor overflows float32 (values too small)")
    codes = np.empty((geo.n, geo.k // 2), dtype=np.uint8)
    scales = np.empty((geo.n, geo.k // GROUP), dtype=np.uint8)
    for r0 in range(0, geo.n, _ROWS_PER_CHUNK):
        g = x[r0:r0 + _ROWS_PER_CHUNK].reshape(-1, geo.k // GROUP, GROUP)
        bamax = np.max(np.abs(g), axis=-1)
        sv = np.minimum((bamax * d) / np.float32(6.0), np.float32(E4M3_MAX))
        s8 = sv.astype(ml_dtypes.float8_e4m3fn)
        s32 = s8.astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = (g * d) / s32[..., None]
        q[np.broadcast_to(s32[..., None] == 0, q.shape)] = 0
        mag = _e2m1_codes(np.abs(q))
        c = mag | np.where((q < 0) & (mag > 0), np.uint8(8), np.uint8(0))
        c = c.reshape(g.shape[0], -1)
        codes[r0:r0 + _ROWS_PER_CHUNK] = c[:, 0::2] | (c[:, 1::2] << 4)
        scales[r0:r0 + _ROWS_PER_CHUNK] = s8.view(np.uint8)
    return codes, scales, d


def encode(w: np.ndarray) -> np.ndarray:
    """Float [N, K] -> blockscale-k16-m128x4-v1 payload bytes with Inferno's encoder."""
    return pack(*quantize(w))


def decode(data, shape: tuple[int, ...]) -> np.ndarray:
    """blockscale-k16-m128x4-v1 payload -> float32 [N, K]."""
    return dequantize(*unpack(data, shape))
