"""NVFP4 tensor-core GEMV on the CPU: the kernel's `tile16-nvfp4-v1` addressing and decode
(`cute_kernels.gemv_mma_nvfp4`: `e2m1_pair`, `scale_pair`, `pairs_fp4`) run on numpy lanes, assembled into
m16n8k16 fragments as mma.sync reads them, against the format's reference (every code value, both scale
extremes, subnormal scales); the tiled layout's round trip; the variant table, member choice and launcher
checks; cubin builds."""

import time

import ml_dtypes
import numpy as np
import pytest

from inferno.artifact.formats import nvfp4
from inferno.cuda.errors import LaunchError
from inferno.kernels import gemv_mma_nvfp4_variants as nv
from inferno.kernels import gemv_mma_variants as mv
from inferno.kernels import tiled_nvfp4 as tn
from inferno.kernels.build import build_variant, dsl_available
from test_kernels_gemv_mma import LANES, NumpyOps, _a_matrix, _b_matrix, _halves, _pack

pytestmark = pytest.mark.skipif(not dsl_available(), reason="CuTe DSL not installed")
G = LANES // 4
E4M3 = np.arange(0x7F, dtype=np.uint8)  # every valid scale word (sign clear, not NaN)


class Fp4NumpyOps(NumpyOps):
    """NumpyOps on vectors of any length, plus the bf16x2 multiply (round to nearest, subnormals honoured,
    as mul.rn.bf16x2)."""

    @staticmethod
    def c(u):
        return np.uint32(u)

    @staticmethod
    def prmt(a, b, sel):
        a, b = np.broadcast_arrays(np.asarray(a, np.uint32), np.asarray(b, np.uint32))
        src = [(a >> np.uint32(8 * i)) & 0xFF for i in range(4)] + [(b >> np.uint32(8 * i)) & 0xFF for i in range(4)]
        out = np.zeros(a.shape, np.uint32)
        for j in range(4):
            out |= src[(sel >> (4 * j)) & 7] << np.uint32(8 * j)
        return out

    @staticmethod
    def hmul(a, b):
        (al, ah), (bl, bh) = _halves(a), _halves(b)
        return _pack(al * bl, ah * bh)

    @staticmethod
    def hmul_half(a, b, h):
        (al, ah), s = _halves(a), _halves(b)[h]
        return _pack(al * s, ah * s)


OPS = Fp4NumpyOps()


def _bf16_bits(v):
    return np.asarray(v, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)


def test_e2m1_pairs_exact():
    """Every pair i of every code word holds bf16 (e2m1(code i), e2m1(code i + 4)) * 2^-126 exactly."""
    from cute_kernels import gemv_mma_nvfp4 as kf

    codes = np.arange(256, dtype=np.uint32)  # (code i, code i + 4) for all 16 x 16 values
    rng = np.random.default_rng(1)
    for i in range(4):
        w = ((codes & 15) << np.uint32(4 * i)) | ((codes >> np.uint32(4)) << np.uint32(16 + 4 * i))
        keep = np.uint32(0x000F000F << 4 * i)
        w = (w & keep) | (rng.integers(0, 2 ** 32, 256, dtype=np.uint64).astype(np.uint32) & ~keep)  # other codes
        got = kf.e2m1_pair(OPS, w, OPS.shr(w, 8), i)
        lo, hi = _halves(got)
        np.testing.assert_array_equal(lo, nvfp4.E2M1_VALUES[codes & 15] * 2.0 ** -126)
        np.testing.assert_array_equal(hi, nvfp4.E2M1_VALUES[codes >> 4] * 2.0 ** -126)


def test_scale_pairs_exact():
    """Every E4M3 scale (subnormal 2^-9 .. 448, and 0) becomes the bf16 pair (s, s) * 2^119 exactly."""
    from cute_kernels import gemv_mma_nvfp4 as kf

    want = E4M3.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * 2.0 ** 119
    assert want[1] == 2.0 ** -9 * 2.0 ** 119 and want[0x7E] == 448 * 2.0 ** 119
    s = [np.roll(E4M3, 31 * b).astype(np.uint32) for b in range(4)]  # bytes: (g, q0), (g + 8, q0), (g, q1), (g + 8, q1)
    sw = s[0] | (s[1] << np.uint32(8)) | (s[2] << np.uint32(16)) | (s[3] << np.uint32(24))
    for row, pair in enumerate(kf.scale_pairs(OPS, sw)):
        for q, half in enumerate(_halves(pair)):
            np.testing.assert_array_equal(half, want[s[2 * q + row]])


def test_a_words_exact_for_every_code_and_scale():
    """A = e2m1 * 2^-126 times s * 2^119 is bf16(e2m1 * s * 2^-7) exactly for every (code, scale)."""
    from cute_kernels import gemv_mma_nvfp4 as kf

    c, s = np.meshgrid(np.arange(16, dtype=np.uint32), E4M3.astype(np.uint32), indexing="ij")
    c, s = c.reshape(-1), s.reshape(-1)
    word = c | (c << np.uint32(16))
    a = OPS.hmul_half(kf.e2m1_pair(OPS, word, OPS.shr(word, 8), 0), kf.scale_pairs(OPS, s)[0], 0)
    want = nvfp4.E2M1_VALUES[c].astype(np.float64) * s.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(
        np.float64) / 128
    lo, hi = _halves(a)
    np.testing.assert_array_equal(lo, want)
    np.testing.assert_array_equal(hi, want)
    np.testing.assert_array_equal(a & 0xFFFF, _bf16_bits(want))  # exact in bf16: no rounding happened


def emulate(codes, scales, d_w, x):
    """The kernel's arithmetic for [n, k] (float64): every lane's words read from the `tile16-nvfp4-v1`
    image at the kernel's offsets, decoded per lane, one mma per tile and k-step accumulating into the
    fp32 sums (exact here), and the epilogue's 2^7 / d_w. Returns (y [t, n], sums [t, n])."""
    from cute_kernels import gemv_mma as km
    from cute_kernels import gemv_mma_nvfp4 as kf

    n, k = codes.shape[0], codes.shape[1] * 2
    geo = tn.tiled_geometry(n, k)
    nt, nb = geo.tiles, geo.blocks
    scale, div = kf.planes(nt, nb)
    assert (scale, div) == (geo.scale_offset, geo.divisor_offset)
    image = tn.tile_words(codes, scales, d_w)
    words = image[: geo.nbytes // 4 * 4].view(np.uint32)

    def at(off, e=0):
        return words[np.asarray(off) // 4 + e]

    xp = np.zeros((8, nb * 64), np.float32)
    xp[: x.shape[0], :k] = x
    xb = xp.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)
    acc = np.zeros((8, nt * 16))
    for tile in range(nt):
        for j in range(nb):
            k0 = km.x_first(4, j, LANES)
            bregs = km.b_regs(OPS, 4, [xb[G, k0 + 2 * i] | (xb[G, k0 + 2 * i + 1] << np.uint32(16)) for i in range(8)])
            w = [at(km.base_offset(tile, j, nb, LANES), e) for e in range(4)]
            sg, sg8 = kf.scale_pairs(OPS, at(kf.scale_offset(scale, tile, j // 2, nb, LANES)))
            lo = kf.pairs_fp4(OPS, w[0], w[1], sg, j % 2)
            hi = kf.pairs_fp4(OPS, w[2], w[3], sg8, j % 2)
            for m in range(4):
                a = _a_matrix([lo[m][0], hi[m][0], lo[m][1], hi[m][1]])
                acc[:, tile * 16:(tile + 1) * 16] += (a @ _b_matrix(bregs[m])).T
    d = float(words[div // 4].view(np.float32))
    sums = acc[: x.shape[0], :n]
    return sums * kf.OUT_SHIFT / d, sums


def _exact_sums(codes, scales, x):
    """sum_k e2m1 * s * x * 2^-7 in float64 (exact products)."""
    n = codes.shape[0]
    e = np.empty((n, codes.shape[1] * 2))
    e[:, 0::2], e[:, 1::2] = nvfp4.E2M1_VALUES[codes & 15], nvfp4.E2M1_VALUES[codes >> 4]
    s = np.repeat(scales.view(ml_dtypes.float8_e4m3fn).astype(np.float64), nvfp4.GROUP, axis=1)
    return (x.astype(np.float64) @ (e * s).T) / 128


@pytest.mark.parametrize("n,k", [(128, 192), (256, 512), (128, 64)])
def test_fragments_match_reference(n, k):
    """Random weights through the format's encoder (K = 192 and 64 leave a padded half block pair)."""
    rng = np.random.default_rng(11)
    codes, scales, d = nvfp4.quantize(rng.standard_normal((n, k)).astype(np.float32))
    x = rng.standard_normal((8, k)).astype(ml_dtypes.bfloat16).astype(np.float32)
    y, sums = emulate(codes, scales, d, x)
    np.testing.assert_array_equal(sums, _exact_sums(codes, scales, x))
    want = x.astype(np.float64) @ nvfp4.dequantize(codes, scales, d).astype(np.float64).T
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_every_code_scale_extremes_and_subnormals():
    """Every code value against every scale class: 0, the smallest and largest subnormal, the smallest
    normal, 448; x a few unit vectors and all ones: the sums are exact."""
    n, k = 32, 256
    codes4 = np.resize(np.arange(16, dtype=np.uint8), (n, k))
    codes = (codes4[:, 0::2] | (codes4[:, 1::2] << 4)).astype(np.uint8)
    scales = np.resize(np.array([0x00, 0x01, 0x07, 0x08, 0x7E, 0x38], np.uint8), (n, k // 16))
    x = np.zeros((8, k), np.float32)
    x[np.arange(7), np.arange(7) * 37] = 1.0
    x[7] = 1.0
    y, sums = emulate(codes, scales, np.float32(3.0), x)
    np.testing.assert_array_equal(sums, _exact_sums(codes, scales, x))
    np.testing.assert_allclose(y, sums * 128 / 3.0, rtol=1e-15)


def test_tile_round_trip_and_geometry():
    rng = np.random.default_rng(3)
    for n, k in ((128, 64), (256, 192), (384, 5120)):
        pay = nvfp4.encode(rng.standard_normal((n, k)).astype(np.float32))
        image = tn.tile(pay, n, k)
        geo = tn.tiled_geometry(n, k)
        assert image.size == geo.nbytes and geo.blocks == -(-k // 128) * 2 and geo.scale_offset % 256 == 0
        np.testing.assert_array_equal(tn.untile(image, n, k), pay)
    with pytest.raises(tn.TiledNvfp4Error, match="bytes"):
        tn.untile(np.zeros(100, np.uint8), 128, 64)
    with pytest.raises(tn.TiledNvfp4Error, match="NVFP4"):
        tn.tile(np.zeros(100, np.uint8), 128, 64)
    with pytest.raises(tn.TiledNvfp4Error, match="multiple of 16"):
        tn.tiled_geometry(128, 40)


def test_tile_27b_gate_up_in_seconds():
    """The 27B gate_up [34816, 5120] tiles (and untiles) with vectorised numpy, not per element."""
    rng = np.random.default_rng(5)
    n, k = 34816, 5120
    codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales = rng.integers(0, 0x7F, (n, k // 16), dtype=np.uint8)
    t0 = time.perf_counter()
    image = tn.tile_words(codes, scales, np.float32(2.5))
    elapsed = time.perf_counter() - t0
    c, s, d = tn.untile_words(image, n, k)
    assert np.array_equal(c, codes) and np.array_equal(s, scales) and d == np.float32(2.5)
    assert elapsed < 10, f"tiling took {elapsed:.1f} s"


def test_variant_table_and_names():
    names = [v.name for v in nv.GEMV_MMA_NVFP4_VARIANTS]
    assert len(names) == len(set(names)) == (3 + 2) * 3
    assert nv.variant_name("swiglu") == "gemv_mma_nvfp4_t1_swiglu"
    assert nv.variant_name("plain", norm=True) == "gemv_mma_nvfp4_t1_n"
    assert nv.family_members("gemv_mma_nvfp4_t1_swiglu") == ["gemv_mma_nvfp4_t1_swiglu_k2_xs",
                                                             "gemv_mma_nvfp4_t1_swiglu_k4_xs",
                                                             "gemv_mma_nvfp4_t1_swiglu_sk"]
    assert nv.family_members("gemv_mma_nvfp4_t1_n") == ["gemv_mma_nvfp4_t1_n_k2_xs", "gemv_mma_nvfp4_t1_n_k4_xs",
                                                        "gemv_mma_nvfp4_t1_n_sk"]
    from inferno.kernels import registry

    sk = registry.get("gemv_mma_nvfp4_t1_res_sk")
    assert [a.name for a in sk.args if a is not None] == ["w", "x", "r", "y", "ws"] and sk.archs == ("sm_90a",)
    xs = registry.get("gemv_mma_nvfp4_t1_swiglu_n_k2_xs")
    assert [a.name for a in xs.args if a is not None] == ["w", "x", "y", "nw", "eps"]
    assert xs.grid[0] == "cdiv(M, 64)" and xs.config["kmax"] == mv.NORM_KMAX and all(
        v.pdl for v in nv.GEMV_MMA_NVFP4_VARIANTS)
    with pytest.raises(LaunchError, match="1 column"):
        nv.variant_name("plain", 2)
    with pytest.raises(LaunchError, match="plain or swiglu"):
        nv.variant_name("residual", norm=True)
    with pytest.raises(LaunchError, match="no NVFP4 tensor-core GEMV variant"):
        nv.gemv_mma_nvfp4_variant("gemv_mma_nvfp4_t1")
    with pytest.raises(LaunchError, match="family"):
        nv.family_members("gemv_mma_nvfp4_t8")


class _Loaded:
    def __init__(self, v):
        self.variant = v
        self.manifest = type("M", (), {"config": v.config, "grid": list(v.grid)})()


def _family(epi, norm=False):
    return nv.GemvMmaNvfp4(*(_Loaded(nv.gemv_mma_nvfp4_variant(m)) for m in
                             nv.family_members(nv.variant_name(epi, norm=norm))))


def test_member_choice_and_launcher_checks():
    """The groupwise rule: stream-K where `sk_wins` (27B gate_up, down, value_z, the output projections),
    xs kw 4 for the q|k projections, kw 2 from 512 units; refusals before any device work."""
    fam = {epi: _family(epi) for epi in ("plain", "swiglu", "residual")}
    assert fam["swiglu"].name == "gemv_mma_nvfp4_t1_swiglu" and fam["plain"].fmt == "NVFP4"
    assert isinstance(fam["swiglu"].member(17408, 5120), nv.GemvMmaNvfp4SK)
    assert isinstance(fam["residual"].member(5120, 17408), nv.GemvMmaNvfp4SK)
    assert isinstance(fam["plain"].member(12288, 5120), nv.GemvMmaNvfp4SK)
    lk, outs = fam["plain"].member(4096, 5120)
    assert lk.manifest.config["kw"] == 4 and outs == 32
    assert isinstance(fam["plain"].member(248320, 5120), nv.GemvMmaNvfp4SK)  # the head (measured in sessions 26-27)
    with pytest.raises(LaunchError, match="no loaded member takes K"):
        fam["plain"].member(4096, mv.KMAX + 128)
    assert fam["plain"].sk._weight_bytes(256, 192) == tn.tiled_geometry(256, 192).nbytes
    from inferno.cuda.memory import DeviceBuffer

    fake = DeviceBuffer.__new__(DeviceBuffer)
    with pytest.raises(LaunchError, match="exceeds its 1"):
        fam["plain"](fake, fake, fake, 128, 256, 2)
    with pytest.raises(LaunchError, match="k % 16"):
        fam["plain"](fake, fake, fake, 128, 264, 1)
    with pytest.raises(LaunchError, match="residual"):
        fam["residual"](fake, fake, fake, 128, 256, 1)
    assert _family("swiglu", norm=True).norm and _family("swiglu", norm=True).sk.kmax == mv.NORM_KMAX
    with pytest.raises(LaunchError, match="not an NVFP4"):
        nv.GemvMmaNvfp4(_Loaded(mv.gemv_mma_variant("gemv_mma_q4_t1_k4_xs")))


@pytest.mark.parametrize("name", ["gemv_mma_nvfp4_t1_k4_xs", "gemv_mma_nvfp4_t1_res_sk", "gemv_mma_nvfp4_t1_swiglu_sk",
                                  "gemv_mma_nvfp4_t1_swiglu_n_k2_xs", "gemv_mma_nvfp4_t1_n_sk"])
def test_builds(name, tmp_path):
    """The member compiles; in its SASS (where cuobjdump is installed) the A words are HMUL2.BF16 without
    flush-to-zero (the e2m1 0.5 and the E4M3 subnormals are bf16 subnormals), the products HMMA, and no
    register spills at the 2 x 8 warps cap (xs) or the stream-K 1 x 16."""
    import os
    import re
    import shutil
    import subprocess

    v = nv.gemv_mma_nvfp4_variant(name)
    m = build_variant(v, "sm_90a", tmp_path)
    cubin = tmp_path / "sm_90a" / f"{name}.cubin"
    assert cubin.stat().st_size > 1000
    assert m.block == [32 * v.config["warps"], 1, 1]
    assert [p.name for p in m.params] == [a.name for a in v.args if a is not None]
    try:
        import nvidia

        roots = list(nvidia.__path__)
    except ImportError:
        roots = []
    tool = shutil.which("cuobjdump") or next(
        (c for c in (os.path.join(r, "cu13", "bin", "cuobjdump") for r in roots) if os.path.exists(c)), None)
    if tool is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    usage = subprocess.run([tool, "--dump-resource-usage", str(cubin)], capture_output=True, text=True,
                           check=True).stdout
    assert "HMMA.16816.F32.BF16" in sass and "HMUL2.BF16_V2" in sass
    assert not re.search(r"HMUL2[.A-Z0-9_]*FTZ", sass)
    assert not re.search(r"\b(?:LDL|STL)\b", sass) and int(re.search(r"REG:(\d+)", usage).group(1)) <= 128
