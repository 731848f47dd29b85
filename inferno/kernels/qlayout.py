"""The groupwise-int GEMV's view of a `row-split-k128-v1` payload, and a numpy model of its math.

The GEMV kernel (`cute_kernels/gemv_q.py`) reads the artifact payload as is, as little-endian
int32 words; no load-time repack. For W [N, K] (K_pad = align_up(K, 128), G the group):

  base  words [0, N * B)         B = K_pad/8 words per row (Q4/Q5/Q6), K_pad/4 (W8)
  high  words [H0, H0 + N * Hr)  H0 = align_up(N * B, 64); Hr = K_pad/32 (Q5), K_pad/16 (Q6)
  scale words [S0, ...)          S0 = H0 + align_up(N * Hr, 64) (= H0 for Q4/W8); 2 fp16 per word

Thread step = one 32-code chunk c of one row: base words 4c..4c+3 (W8: 8c..8c+7; one or two
16-byte loads), high word c (Q5) or words 2c, 2c+1 (Q6), and scale (row * K_pad/G + 32c/G).
Code q of the chunk (q = 0..31) is nibble q%8 of base word q//8 (W8: byte q%4 of word q//4),
plus high bit q (Q5) or high bits 2(q%16), 2(q%16)+1 of word q//16 (Q6) as bits 4 and 5.
`kernel_codes` decodes exactly as the kernel's default (in-place) path does, so a test can pin
the bit logic against `inferno.artifact.formats.groupwise.unpack`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inferno.artifact.formats.groupwise import SCHEMES, encode, geometry
from inferno.errors import InfernoError

MAGIC = 0x4B000000  # float 2^23
CHUNK = 32


class GemvLayoutError(InfernoError):
    """A GEMV argument that does not fit the kernel's layout."""


@dataclass(frozen=True)
class Planes:
    """Word offsets and per-row word counts of the three planes, as the kernel computes them."""

    bits: int
    group: int
    k_pad: int
    base_row: int
    high_off: int
    high_row: int
    scale_off: int
    words: int


def _up(x: int, a: int) -> int:
    return -(-x // a) * a


def planes(fmt: str, n: int, k: int) -> Planes:
    """The kernel's plane arithmetic for `fmt` [n, k] (checked against the format's geometry)."""
    if fmt not in SCHEMES:
        raise GemvLayoutError(f"no GEMV layout for format {fmt!r}; formats: {', '.join(SCHEMES)}")
    s = SCHEMES[fmt]
    k_pad = _up(k, 128)
    base_row = k_pad // 8 if s.bits < 8 else k_pad // 4
    high_row = {5: k_pad // 32, 6: k_pad // 16}.get(s.bits, 0)
    high_off = _up(n * base_row, 64)
    scale_off = high_off + _up(n * high_row, 64)
    words = scale_off + n * (k_pad // s.group) // 2
    return Planes(s.bits, s.group, k_pad, base_row, high_off, high_row, scale_off, words)


def _words(fmt: str, payload, n: int, k: int) -> tuple[Planes, np.ndarray]:
    p = planes(fmt, n, k)
    buf = np.frombuffer(payload, dtype=np.uint8)
    if buf.size != geometry(fmt, (n, k)).nbytes or buf.size != 4 * p.words:
        raise GemvLayoutError(f"{fmt} [{n}, {k}] payload has {buf.size} bytes, expected {4 * p.words}")
    return p, buf.view(np.uint32)


def _take(words: np.ndarray, off: int, n: int, per_row: int, rows: np.ndarray | None) -> np.ndarray:
    m = words[off: off + n * per_row].reshape(n, per_row)
    return m if rows is None else m[rows]


def _f32(bits: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(bits, dtype=np.uint32).view(np.float32)


def _sar(w: np.ndarray, n: int) -> np.ndarray:
    """Arithmetic right shift of uint32 words (the kernel's Int32 >>)."""
    return (w.view(np.int32) >> n).view(np.uint32)


def _move_bits(h: np.ndarray, src: int, dst: int, width: int) -> np.ndarray:
    m = _sar(h, src - dst) if src >= dst else h << np.uint32(dst - src)
    return m & np.uint32(((1 << width) - 1) << dst)


def kernel_codes(fmt: str, payload, n: int, k: int, rows: np.ndarray | None = None) -> np.ndarray:
    """Codes int8 [n, k] (or of the given rows) decoded with the kernel's in-place arithmetic.

    Code i of each 8-code step comes out as the float code * base^p (see `GemvQ._code_float`):
    2^23 + (code + bias) * base^p built by AND/OR of the field where it lies in its word, minus
    2^23 + bias * base^p (Q5: minus the float holding the high bit instead); then / base^p.
    """
    p, w = _words(fmt, payload, n, k)
    base = np.ascontiguousarray(_take(w, 0, n, p.base_row, rows))
    nr, nch = base.shape[0], p.k_pad // CHUNK
    magic = np.uint32(MAGIC)
    out = np.empty((nr, nch, CHUNK), np.float32)  # every step below is exact in fp32
    if p.bits == 8:
        words = (base ^ np.uint32(0x80808080)).reshape(nr, nch, 8)
        for q in range(CHUNK):
            b, e = q % 4, (q % 4) % 2
            src = words[:, :, q // 4] if b < 2 else _sar(np.ascontiguousarray(words[:, :, q // 4]), 16)
            f = _f32((src & np.uint32(0xFF << (8 * e))) | magic) - np.float32(2.0**23 + 128 * 256.0**e)
            out[:, :, q] = f * np.float32(256.0**-e)
        return out.reshape(nr, p.k_pad)[:, :k].astype(np.int8)
    words = base.reshape(nr, nch, 4)
    if p.bits == 4:
        words = words ^ np.uint32(0x88888888)
    if p.bits in (5, 6):
        high = np.ascontiguousarray(_take(w, p.high_off, n, p.high_row, rows)).reshape(nr, nch, p.bits - 4)
    for q in range(CHUNK):
        j, i = divmod(q, 8)
        e = i if i < 5 else i - 3
        src = np.ascontiguousarray(words[:, :, j])
        src = src if i < 5 else _sar(src, 12)
        a = (src & np.uint32(0xF << (4 * e))) | magic
        if p.bits == 5:
            f = _f32(a) - _f32(_move_bits(np.ascontiguousarray(high[:, :, 0]), q, 4 * e + 4, 1) | magic)
        else:
            if p.bits == 6:
                h = np.ascontiguousarray(high[:, :, j // 2]) ^ np.uint32(0xAAAAAAAA)
                a = a | _move_bits(h, 2 * (q % 16), 4 * e + 4, 2)
            f = _f32(a) - np.float32(2.0**23 + (1 << (p.bits - 1)) * 16.0**e)
        out[:, :, q] = f * np.float32(16.0**-e)
    return out.reshape(nr, p.k_pad)[:, :k].astype(np.int8)


def kernel_scales(fmt: str, payload, n: int, k: int, rows: np.ndarray | None = None) -> np.ndarray:
    """Scales float32 [n, K_pad / G] (or of the given rows), read from the scale words."""
    p, w = _words(fmt, payload, n, k)
    sw = _take(w, p.scale_off, n, p.k_pad // p.group // 2, rows)
    return np.ascontiguousarray(sw).view("<f2").astype(np.float32)


def dequant_rows(fmt: str, payload, n: int, k: int, rows: np.ndarray | None = None) -> np.ndarray:
    """W float64 [len(rows) or n, k] as the kernel sees it (code * scale)."""
    g = planes(fmt, n, k).group
    sc = np.repeat(kernel_scales(fmt, payload, n, k, rows).astype(np.float64), g, axis=1)[:, :k]
    return kernel_codes(fmt, payload, n, k, rows).astype(np.float64) * sc


def reference(fmt: str, payload, n: int, k: int, x: np.ndarray, epilogue: str = "plain",
              r: np.ndarray | None = None, outs: np.ndarray | None = None) -> np.ndarray:
    """The kernel's result in float64: x [T, k] -> [T, M] (M = n, or n/2 for swiglu), or only the
    output columns `outs`; r (residual) is [T, M] (or [T, len(outs)]).

    silu(gate) * up is taken of the unrounded sums, and r is added before the one bf16 rounding.
    """
    m = n // 2 if epilogue == "swiglu" else n
    o = np.arange(m) if outs is None else np.asarray(outs)
    xf = np.asarray(x, dtype=np.float64)
    if epilogue == "swiglu":
        g = xf @ dequant_rows(fmt, payload, n, k, o).T
        u = xf @ dequant_rows(fmt, payload, n, k, o + m).T
        return g / (1.0 + np.exp(-g)) * u
    y = xf @ dequant_rows(fmt, payload, n, k, o).T
    if epilogue == "residual":
        return y + np.asarray(r, dtype=np.float64)
    return y


def random_payload(fmt: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """A valid random payload for tests and benchmarks: uniformly random code bits (W8: no -128)
    and positive fp16 scales ~ 3 / (qmax sqrt(k)); a K that is not a multiple of 128 goes through
    the format's encoder (random normal weights) so that the padding is as the format requires."""
    s = SCHEMES[fmt]
    if k % 128:
        return encode(fmt, rng.standard_normal((n, k)).astype(np.float32))
    g = geometry(fmt, (n, k))
    buf = rng.integers(0, 256, g.nbytes, dtype=np.uint8)
    buf[g.base_bytes:g.high_offset] = 0
    buf[g.high_offset + g.high_bytes:g.scale_offset] = 0
    if s.bits == 8:
        base = buf[:g.base_bytes]
        base[base == 0x80] = 0x81
    sc = rng.uniform(0.5, 1.5, n * g.groups_per_row) / (s.qmax * np.sqrt(k) / 3)
    buf[g.scale_offset:] = sc.astype("<f2").view(np.uint8)
    return buf
