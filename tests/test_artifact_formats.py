"""Tensor formats and layouts of `.ninfer` v2: sizes, exact bytes, encoder rules, decode checks.

Expected bytes are written out by hand from NInfer `storage-layouts.md` §2-4 and
`tensor-formats.md` §3-7; a slow scalar oracle of `MAXABS_F16_RECIP_RNE_V1` (struct's binary16
rounding, numpy float32 scalars) cross-checks the vectorised encoder.
"""

import math
import struct

import ml_dtypes
import numpy as np
import pytest

from inferno.artifact import formats as F
from inferno.artifact.formats import groupwise, nvfp4, plain
from inferno.errors import ArtifactError

RS, CT, BS = "row-split-k128-v1", "contiguous-le-v1", "blockscale-k16-m128x4-v1"


def h(*pairs):
    """Little-endian uint16 words -> bytes."""
    return b"".join(struct.pack("<H", p) for p in pairs)


# --- registries and sizes ---------------------------------------------------------------------

def test_closed_registries_match_spec():
    assert set(F.FORMATS) == {"BF16", "FP32", "I32", "Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S",
                              "W8G32_F16S", "NVFP4"}
    assert set(F.LAYOUTS) == {CT, RS, BS}
    assert F.FORMATS["NVFP4"] == (BS,) and F.FORMATS["BF16"] == (CT,)
    assert F.FORMATS["Q4G64_F16S"] == (RS,)
    assert F.RESOURCE_ENCODINGS == {"raw-bytes-v1": 1}
    for bad_fmt, layout in [("F16", CT), ("FP16", CT), ("Q4G32_F16S", RS), ("I64", CT)]:
        with pytest.raises(ArtifactError, match="unknown tensor format"):
            F.packed_nbytes(bad_fmt, layout, (4, 4))
    with pytest.raises(ArtifactError, match="does not accept"):
        F.packed_nbytes("NVFP4", RS, (128, 64))
    with pytest.raises(ArtifactError, match="does not accept"):
        F.packed_nbytes("BF16", RS, (128, 64))
    with pytest.raises(ArtifactError, match="unknown tensor layout"):
        F.packed_nbytes("BF16", "contiguous-be-v1", (4,))


@pytest.mark.parametrize("fmt,shape,want", [
    ("Q5G64_F16S", (2, 130), 528),                 # storage-layouts.md §3.6 worked example
    ("Q4G64_F16S", (7168, 5120), 19_496_960),      # artifact-container.md tensor example
    ("Q4G64_F16S", (1, 128), 260),
    ("Q5G64_F16S", (1, 128), 516),
    ("Q6G64_F16S", (1, 128), 516),
    ("W8G32_F16S", (1, 128), 264),
    ("W8G32_F16S", (3, 1), 3 * 128 + 128 + 3 * 4 * 2),  # base 384 -> scale at 512
])
def test_row_split_sizes(fmt, shape, want):
    assert F.packed_nbytes(fmt, RS, shape) == want


def test_other_sizes_and_rank_rules():
    assert F.packed_nbytes("BF16", CT, ()) == 2
    assert F.packed_nbytes("FP32", CT, (3, 5)) == 60
    assert F.packed_nbytes("I32", CT, (7,)) == 28
    assert F.packed_nbytes("NVFP4", BS, (128, 64)) == 4096 + 512 + 4
    assert F.packed_nbytes("NVFP4", BS, (256, 192)) == 256 * 96 + 256 * 12 + 4
    with pytest.raises(ArtifactError, match="rank 0..16"):
        F.packed_nbytes("FP32", CT, (1,) * 17)
    with pytest.raises(ArtifactError, match="rank-2"):
        F.packed_nbytes("Q4G64_F16S", RS, (2, 4, 64))
    with pytest.raises(ArtifactError, match="rank-2"):
        F.packed_nbytes("Q4G64_F16S", RS, (64,))
    for bad in [(64, 64), (128, 32), (128,), (1, 128, 64)]:
        with pytest.raises(ArtifactError, match="N % 128"):
            F.packed_nbytes("NVFP4", BS, bad)
    with pytest.raises(ArtifactError, match="positive"):
        F.packed_nbytes("FP32", CT, (3, 0))


# --- hand-computed 1x128 payloads ----------------------------------------------------------------

def test_q4_bytes_by_hand():
    w = np.zeros((1, 128), np.float32)
    w[0, :6] = [7, -7, 1.5, 2.5, -0.5, -1.5]      # scale 7/7 = 1.0; ties go to even
    got = F.encode("Q4G64_F16S", RS, w).tobytes()
    base = bytes([0x97, 0x22, 0xE0]) + bytes(61)  # codes 7,-7 | 2,2 | 0,-2 (u = 7,9,2,2,0,14)
    assert got == base + bytes(256 - 64) + h(0x3C00, 0x0000)  # group 1 all zero -> scale +0
    assert np.array_equal(F.decode("Q4G64_F16S", RS, got, (1, 128))[0, :6], [7, -7, 2, 2, 0, -2])


def test_q5_bytes_by_hand():
    w = np.zeros((1, 128), np.float32)
    w[0, :5] = [15, -15, -1, 8, -8]               # u = 15, 17, 31, 8, 24; scale 1.0
    got = F.encode("Q5G64_F16S", RS, w).tobytes()
    base = bytes([0x1F, 0x8F, 0x08]) + bytes(61)
    high = bytes([0b00010110]) + bytes(15)        # bit 4 of lanes 1, 2, 4
    assert got == base + bytes(192) + high + bytes(240) + h(0x3C00, 0)
    assert F.decode("Q5G64_F16S", RS, got, (1, 128))[0, :5].tolist() == [15, -15, -1, 8, -8]


def test_q6_bytes_by_hand():
    w = np.zeros((1, 128), np.float32)
    w[0, :4] = [31, -31, -1, 16]                  # u = 31, 33, 63, 16; scale 1.0
    got = F.encode("Q6G64_F16S", RS, w).tobytes()
    base = bytes([0x1F, 0x0F]) + bytes(62)
    high = bytes([0x79]) + bytes(31)              # lane bits[5:4] = 1, 2, 3, 1 -> 01 11 10 01
    assert got == base + bytes(192) + high + bytes(224) + h(0x3C00, 0)
    assert F.decode("Q6G64_F16S", RS, got, (1, 128))[0, :4].tolist() == [31, -31, -1, 16]


def test_w8_bytes_by_hand():
    w = np.zeros((1, 128), np.float32)
    w[0, :5] = [127, -127, -1, 0.5, 1.5]          # group 0: scale 1.0
    w[0, 64:67] = [254, 3, -5]                    # group 2: scale 2.0; 1.5 -> 2, -2.5 -> -2
    got = F.encode("W8G32_F16S", RS, w).tobytes()
    base = bytearray(128)
    base[0:5] = bytes([0x7F, 0x81, 0xFF, 0x00, 0x02])
    base[64:67] = bytes([0x7F, 0x02, 0xFE])
    assert got == bytes(base) + bytes(128) + h(0x3C00, 0, 0x4000, 0)
    dec = F.decode("W8G32_F16S", RS, got, (1, 128))
    assert dec[0, :5].tolist() == [127, -127, -1, 0, 2] and dec[0, 64:67].tolist() == [254, 4, -4]


def test_nvfp4_bytes_by_hand():
    w = np.zeros((128, 64), np.float32)
    w[0, :8] = [6, -6, 0.25, 0.75, 2.5, 5, -3, 1.75]  # amax 6 -> d_w 448; block scale 448 = 0x7E
    w[0, 16] = 3                                       # block scale 224 = 0x76, code 6.0
    w[33, 32] = 1                                      # 74.67 -> e4m3 72 = 0x69; 6.22 -> 6.0
    got = F.encode("NVFP4", BS, w).tobytes()
    code = bytearray(4096)
    code[0:4] = bytes([0xF7, 0x20, 0x64, 0x4D])        # 6,-6 | 0,1 | 2,4 | -3,2 (ties to even)
    code[8] = 0x07
    code[33 * 32 + 16] = 0x07
    scale = bytearray(512)
    scale[0], scale[1] = 0x7E, 0x76
    scale[(33 % 32) * 16 + (33 // 32) * 4 + 2] = 0x69  # swizzled position of (row 33, group 2)
    assert got == bytes(code) + bytes(scale) + struct.pack("<f", 448.0)
    dec = F.decode("NVFP4", BS, got, (128, 64))
    assert dec[0, :8].tolist() == [6, -6, 0, 1, 2, 4, -3, 2]
    assert dec[0, 16] == 3 and dec[33, 32] == np.float32(6 * 72) / np.float32(448)


def test_direct_bytes_by_hand():
    assert F.encode("FP32", CT, np.array([1.0, -2.0], np.float32)).tobytes() == \
        bytes.fromhex("0000803f000000c0")
    assert F.encode("I32", CT, np.array([[1, -2]], np.int64)).tobytes() == \
        bytes.fromhex("01000000feffffff")
    bf = F.encode("BF16", CT, np.array([1.0, -2.0, 1.00390625], np.float32)).tobytes()
    assert bf == bytes.fromhex("803f00c0803f")  # 1 + 2^-8 is a tie -> even (1.0)


# --- K padding and plane order -----------------------------------------------------------------

@pytest.mark.parametrize("fmt", list(groupwise.SCHEMES))
def test_k_padding_and_planes(fmt):
    s = groupwise.SCHEMES[fmt]
    rng = np.random.default_rng(3)
    w = rng.standard_normal((3, 130)).astype(np.float32)
    data = F.encode(fmt, RS, w)
    geo = groupwise.geometry(fmt, (3, 130))
    assert geo.k_pad == 256 and geo.groups_per_row == 256 // s.group
    assert data.size == geo.nbytes == F.packed_nbytes(fmt, RS, (3, 130))
    assert geo.high_offset == math.ceil(geo.base_bytes / 256) * 256
    scales = data[geo.scale_offset:].view("<f2").reshape(3, geo.groups_per_row)
    lg = math.ceil(130 / s.group)
    assert np.all(scales[:, :lg] > 0) and not scales[:, lg:].view(np.uint16).any()
    assert not data[geo.base_bytes:geo.high_offset].any()
    assert not data[geo.high_offset + geo.high_bytes:geo.scale_offset].any()
    codes, sc = groupwise.unpack(fmt, data, (3, 130))
    assert codes.shape == (3, 130) and sc.shape == (3, lg)
    # row-major (row, group) order: row 1's first base bytes follow all of row 0's groups
    row1 = groupwise.pack(fmt, codes[1:2], sc[1:2])
    assert np.array_equal(data[geo.groups_per_row * 32:2 * geo.groups_per_row * 32],
                          row1[:geo.groups_per_row * 32])
    # lanes past K are zero codes: in row 0, the partial group keeps only lanes 128/129
    pg = 130 // s.group
    partial = data[pg * 32:(pg + 1) * 32]
    assert not partial[(1 if s.bits < 8 else 2):].any()
    assert not data[(pg + 1) * 32:geo.groups_per_row * 32].any()


def test_partial_group_scale_uses_logical_lanes_only():
    w = np.zeros((1, 65), np.float32)
    w[0, 64] = -14.0  # the only value of group 1 (lanes 65..127 are padding)
    codes, scales = groupwise.quantize("Q4G64_F16S", w)
    assert scales[0].tolist() == [0.0, 2.0] and codes[0, 64] == -7


# --- canonical encoder rules -------------------------------------------------------------------

def _f16(x: np.float32) -> np.float32:
    return np.float32(struct.unpack("<e", struct.pack("<e", float(x)))[0])


def _oracle(fmt, row):
    """Scalar MAXABS_F16_RECIP_RNE_V1 for one row (tensor-formats.md §7.2)."""
    s = groupwise.SCHEMES[fmt]
    codes, scales = [], []
    for g0 in range(0, len(row), s.group):
        grp = [np.float32(v) for v in row[g0:g0 + s.group]]
        amax = max(abs(v) for v in grp)
        if amax == 0:
            scales.append(0.0)
            codes += [0] * len(grp)
            continue
        sc = _f16(np.float32(amax / np.float32(s.qmax)))
        if sc == 0:
            sc = np.float32(2.0**-24)
        inv = np.float32(np.float32(1) / sc)
        scales.append(float(sc))
        codes += [int(min(max(np.rint(np.float32(v * inv)), s.qmin), s.qmax)) for v in grp]
    return codes, scales


@pytest.mark.parametrize("fmt", list(groupwise.SCHEMES))
def test_encoder_matches_scalar_oracle(fmt):
    rng = np.random.default_rng(11)
    rows = [rng.standard_normal(200).astype(np.float32) * 3,
            (rng.standard_normal(200) * 1e-6).astype(np.float32),   # binary16-subnormal scales
            (rng.standard_normal(200) * 1e-9).astype(np.float32),   # below the 2^-24 rescue
            np.round(rng.standard_normal(200) * 8).astype(np.float32) / 2]  # many exact ties
    w = np.stack(rows)
    codes, scales = groupwise.quantize(fmt, w)
    for r, row in enumerate(rows):
        oc, osc = _oracle(fmt, row)
        assert codes[r].tolist() == oc
        assert scales[r].astype(np.float32).tolist() == osc


def test_reciprocal_multiply_not_division():
    # scale16 = 0x3F97; x * f32(1/s) = 1.5 exactly -> 2, whereas x / s = 1.4999999 -> 1
    s = np.float16(np.uint16(0x3F97).view(np.float16))
    x = np.uint32(0x403627FF).view(np.float32)
    w = np.zeros((1, 64), np.float32)
    w[0, 0], w[0, 1] = np.float32(s) * 7, x
    codes, scales = groupwise.quantize("Q4G64_F16S", w)
    assert scales[0, 0] == s and codes[0, 1] == 2
    assert np.rint(x / np.float32(s)) == 1


def test_ties_to_even_both_signs():
    w = np.zeros((1, 64), np.float32)
    w[0, :7] = [7, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5]
    codes, _ = groupwise.quantize("Q4G64_F16S", w)
    assert codes[0, :7].tolist() == [7, 0, 0, 2, -2, 2, -2]


def test_zero_group_rescue_and_clamp():
    w = np.zeros((3, 64), np.float32)
    w[1, :2] = [7 * 2.0**-26, -7 * 2.0**-26]     # raw scale 2^-26 rounds to 0 -> 0x0001 rescue
    w[2, :2] = [9.8 * 2.0**-24, -9.8 * 2.0**-24]  # scale 1.4*2^-24 rounds to 2^-24 -> +-9.8 clamps
    codes, scales = groupwise.quantize("Q4G64_F16S", w)
    assert scales[0, 0] == 0 and not codes[0].any()
    assert scales[1, 0].view(np.uint16) == 0x0001 and codes[1, :2].tolist() == [2, -2]
    assert codes[2, :2].tolist() == [7, -8]
    w8 = np.zeros((1, 32), np.float32)
    w8[0, :2] = [178 * 2.0**-24, -178 * 2.0**-24]  # scale 1.40*2^-24 -> 2^-24
    c8, _ = groupwise.quantize("W8G32_F16S", w8)
    assert c8[0, :2].tolist() == [127, -127]       # never -128


def test_encoder_rejects_nonfinite_and_overflow():
    w = np.zeros((1, 64), np.float32)
    w[0, 3] = np.nan
    with pytest.raises(ArtifactError, match="NaN or infinity"):
        F.encode("Q4G64_F16S", RS, w)
    w[0, 3] = 7 * 70000.0
    with pytest.raises(ArtifactError, match="overflows binary16"):
        F.encode("Q4G64_F16S", RS, w)
    w[0, 3] = np.inf
    with pytest.raises(ArtifactError, match="NaN or infinity"):
        F.encode("NVFP4", BS, np.pad(w, ((0, 127), (0, 0))))


@pytest.mark.parametrize("fmt", list(groupwise.SCHEMES))
def test_groupwise_error_bound(fmt):
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((16, 300)) * rng.uniform(0.01, 10, (16, 1))).astype(np.float32)
    dec = F.decode(fmt, RS, F.encode(fmt, RS, w), w.shape)
    _, scales = groupwise.quantize(fmt, w)
    g = groupwise.SCHEMES[fmt].group
    step = np.repeat(scales.astype(np.float32), g, axis=1)[:, :300]
    assert np.all(np.abs(dec - w) <= 0.5 * step * (1 + 1e-6) + 1e-30)


def test_higher_rank_is_the_flattened_matrix():
    rng = np.random.default_rng(6)
    w = rng.standard_normal((3, 5, 96)).astype(np.float32)
    for fmt in groupwise.SCHEMES:
        data = F.encode(fmt, RS, w)
        assert np.array_equal(data, F.encode(fmt, RS, w.reshape(15, 96)))
        assert data.size == F.packed_nbytes(fmt, RS, (15, 96))
        dec = F.decode(fmt, RS, data, (3, 5, 96))
        assert dec.shape == (3, 5, 96)
        assert np.array_equal(dec.reshape(15, 96), F.decode(fmt, RS, data, (15, 96)))


# --- decoder invariant checks ------------------------------------------------------------------

def test_groupwise_decode_rejects_broken_payloads():
    w = np.random.default_rng(7).standard_normal((3, 130)).astype(np.float32)
    good = F.encode("Q5G64_F16S", RS, w)
    geo = groupwise.geometry("Q5G64_F16S", (3, 130))

    def bad(patch, match):
        data = good.copy()
        patch(data)
        with pytest.raises(ArtifactError, match=match):
            F.decode("Q5G64_F16S", RS, data.tobytes(), (3, 130))
        with pytest.raises(ArtifactError, match=match):
            groupwise.decode_bf16("Q5G64_F16S", data.tobytes(), (3, 130), workers=2)

    bad(lambda d: d.__setitem__(geo.base_bytes, 1), "plane padding")
    bad(lambda d: d.__setitem__(geo.high_offset + geo.high_bytes, 1), "plane padding")
    bad(lambda d: d.__setitem__(geo.scale_offset + 1, 0x80), "negative, infinite or NaN")
    bad(lambda d: d.__setitem__(slice(geo.scale_offset, geo.scale_offset + 2), [0, 0x7C]),
        "negative, infinite or NaN")
    bad(lambda d: d.__setitem__(geo.scale_offset + 2 * 3 + 1, 0x3C), "padding group")  # group 3
    bad(lambda d: d.__setitem__(2 * 32 + 1, 0x01), "K padding")       # lane 2 of group 2
    bad(lambda d: d.__setitem__(slice(geo.scale_offset, geo.scale_offset + 2), [0, 0]),
        "scale is 0")
    with pytest.raises(ArtifactError, match="needs 792 bytes"):
        F.decode("Q5G64_F16S", RS, good[:-1].tobytes(), (3, 130))
    w8 = F.encode("W8G32_F16S", RS, np.ones((1, 32), np.float32))
    w8[0] = 0x80
    with pytest.raises(ArtifactError, match="-128"):
        F.decode("W8G32_F16S", RS, w8, (1, 32))
    with pytest.raises(ArtifactError, match="-128"):
        groupwise.decode_bf16("W8G32_F16S", w8, (1, 32))


@pytest.mark.parametrize("fmt", list(groupwise.SCHEMES))
def test_decode_bf16_is_decode_rounded(fmt, monkeypatch):
    """decode_bf16 (row chunks on threads, its own rounding) gives decode's values rounded to bf16, bit for
    bit: ties, zero groups, a ragged K, more chunks than threads, higher rank."""
    rng = np.random.default_rng(11)
    monkeypatch.setattr(groupwise, "_ROWS_PER_CHUNK_ELEMS", 3 * 256)  # a few rows a chunk
    for shape in ((37, 200), (2, 9, 130), (1, 64)):
        w = rng.standard_normal(shape).astype(np.float32) * rng.uniform(1e-3, 1e3, (*shape[:-1], 1))
        w.reshape(-1, shape[-1])[::5] = 0.0
        pay = F.encode(fmt, RS, w)
        want = F.decode(fmt, RS, pay, shape).astype(ml_dtypes.bfloat16)
        for workers in (1, 3):
            got = groupwise.decode_bf16(fmt, pay, shape, workers)
            assert got.dtype == ml_dtypes.bfloat16 and got.shape == shape
            np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_q_formats_pack_every_legal_code():
    for fmt, s in groupwise.SCHEMES.items():
        codes = np.zeros((1, 256), np.int8)
        vals = np.arange(s.qmin, s.qmax + 1)
        codes[0, :vals.size] = vals
        scales = np.full((1, 256 // s.group), np.float16(0.5))
        back, sc = groupwise.unpack(fmt, groupwise.pack(fmt, codes, scales), (1, 256))
        assert np.array_equal(back, codes) and np.array_equal(sc, scales)
        with pytest.raises(ArtifactError, match="outside"):
            groupwise.pack(fmt, np.full((1, 64), s.qmin - 1, np.int16), scales[:, :64 // s.group])


# --- NVFP4 -------------------------------------------------------------------------------------

def test_nvfp4_swizzle_matches_spec_formula():
    n, k = 256, 192
    groups = k // 16
    rng = np.random.default_rng(8)
    scales = rng.integers(0, 0x7F, (n, groups), dtype=np.uint8)
    plane = nvfp4.swizzle_scales(scales)
    for r in range(n):
        for g in range(groups):
            ri = r % 128
            off = (r // 128 * (k // 64) + g // 4) * 512 + (ri % 32) * 16 + (ri // 32) * 4 + g % 4
            assert plane[off] == scales[r, g]
    assert np.array_equal(nvfp4.unswizzle_scales(plane, n, groups), scales)


def test_nvfp4_all_code_and_scale_words():
    e2m1 = [0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6]
    codes = np.zeros((128, 32), np.uint8)
    codes[0, :8] = [c | (c + 8) << 4 for c in range(8)]       # all 16 code words on row 0
    scales = np.zeros((128, 4), np.uint8)
    scales[0, 0] = 0x38                                         # e=7, m=0 -> 1.0
    data = nvfp4.pack(codes, scales, np.float32(1.0))
    dec = F.decode("NVFP4", BS, data, (128, 64))
    assert dec[0, 0:16:2].tolist() == e2m1[:8] and dec[0, 1:16:2].tolist() == e2m1[8:]
    assert np.signbit(dec[0, 1])                                # 0x8 is -0
    # every valid E4M3FN scale word decodes per the spec's formula
    words = np.array([w for w in range(256) if not (w & 0x80) and w != 0x7F], np.uint8)
    for wd in words:
        e, m = int(wd) >> 3, int(wd) & 7
        want = m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0**(e - 7)
        sc = np.zeros((128, 4), np.uint8)
        sc[0, 0] = wd
        c = np.zeros((128, 32), np.uint8)
        c[0, 0] = 0x02                                          # 1.0
        got = F.decode("NVFP4", BS, nvfp4.pack(c, sc, np.float32(2.0)), (128, 64))[0, 0]
        assert got == np.float32(want) / np.float32(2.0)


def test_nvfp4_rejects_bad_words():
    codes = np.zeros((128, 32), np.uint8)
    for word in (0x80, 0x7F, 0xFF, 0xB8):
        scales = np.zeros((128, 4), np.uint8)
        scales[5, 1] = word
        with pytest.raises(ArtifactError, match="E4M3FN"):
            nvfp4.pack(codes, scales, 1.0)
    for d in (0.0, -1.0, np.inf, np.nan):
        with pytest.raises(ArtifactError, match="divisor"):
            nvfp4.pack(codes, np.zeros((128, 4), np.uint8), d)
    good = nvfp4.pack(codes, np.zeros((128, 4), np.uint8), 1.0)
    for pos, val, match in [(good.size - 1, 0x80, "divisor"),          # -1.0 divisor
                            (4096 + 3, 0x7F, "E4M3FN")]:
        data = good.copy()
        data[pos] = val
        with pytest.raises(ArtifactError, match=match):
            F.decode("NVFP4", BS, data, (128, 64))


def test_nvfp4_round_trip_error_bound():
    rng = np.random.default_rng(9)
    w = (rng.standard_normal((256, 128)) * rng.uniform(0.01, 4, (256, 1))).astype(np.float32)
    codes, scales, d = nvfp4.quantize(w)
    dec = F.decode("NVFP4", BS, F.encode("NVFP4", BS, w), w.shape)
    unit = np.repeat(scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32), 16, axis=1) / d
    assert np.all(np.abs(dec - w) <= unit * 1.0 + 1e-12)  # half the widest E2M1 gap (2)
    rel = np.linalg.norm(dec - w) / np.linalg.norm(w)
    assert rel < 0.12


def test_nvfp4_zero_matrix():
    dec = F.decode("NVFP4", BS, F.encode("NVFP4", BS, np.zeros((128, 64), np.float32)), (128, 64))
    assert not dec.any()


# --- direct formats ----------------------------------------------------------------------------

def test_direct_words_are_preserved():
    bf = np.array([0x7FC1, 0xFF81, 0x8000, 0x0001, 0x7F80], np.uint16).view(ml_dtypes.bfloat16)
    got = F.encode("BF16", CT, bf)
    assert got.tobytes() == bf.tobytes()
    assert np.array_equal(plain.decode_words("BF16", got, (5,)).view(np.uint16), bf.view(np.uint16))
    f = np.array([0x7FC00123, 0x80000000, 0x00000001, 0xFF800000], np.uint32).view(np.float32)
    assert F.encode("FP32", CT, f).tobytes() == f.tobytes()
    assert np.array_equal(F.decode("FP32", CT, F.encode("FP32", CT, f), (4,)).view(np.uint32),
                          f.view(np.uint32))
    i = np.array([-2**31, 2**31 - 1, 0, -1], np.int64)
    out = F.decode("I32", CT, F.encode("I32", CT, i), (2, 2))
    assert out.dtype == np.int32 and out.ravel().tolist() == i.tolist()
    assert F.decode("BF16", CT, F.encode("BF16", CT, np.float32(2.5)), ()).shape == ()


def test_direct_refuses_implicit_conversions():
    with pytest.raises(ArtifactError, match="integer"):
        F.encode("I32", CT, np.array([1.0], np.float32))
    with pytest.raises(ArtifactError, match="outside"):
        F.encode("I32", CT, np.array([2**31], np.int64))
    with pytest.raises(ArtifactError, match="floating"):
        F.encode("FP32", CT, np.array([1], np.int32))
    with pytest.raises(ArtifactError, match="float32 range"):
        F.encode("FP32", CT, np.array([1e300]))
    with pytest.raises(ArtifactError, match="needs 8 bytes"):
        F.decode("FP32", CT, b"\0" * 7, (2,))
