"""Quantized GEMV on the CPU: the kernel's view of row-split-k128-v1 vs the format decoder, the
numpy model of its math, the variant table, and cubin builds for sm_90a and sm_120a."""

import numpy as np
import pytest

from inferno.artifact.formats import groupwise as gw
from inferno.cuda.errors import LaunchError
from inferno.kernels import gemv_variants as gv
from inferno.kernels import qlayout as ql
from inferno.kernels.build import build_variant, dsl_available

FORMATS = list(gw.SCHEMES)
SHAPES = [(5, 200), (3, 256), (2, 1000), (7, 8)]


@pytest.fixture
def rng():
    return np.random.default_rng()


def _payload(fmt, n, k, rng):
    w = rng.standard_normal((n, k)).astype(np.float32)
    w[0, : min(k, 40)] = 0  # an all-zero (scale +0) group where the format allows it
    return gw.encode(fmt, w)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_kernel_view_matches_format_decoder(fmt, n, k, rng):
    pay = _payload(fmt, n, k, rng)
    codes, scales = gw.unpack(fmt, pay, (n, k))
    assert np.array_equal(ql.kernel_codes(fmt, pay, n, k), codes)
    ks = ql.kernel_scales(fmt, pay, n, k)
    assert np.array_equal(ks[:, : scales.shape[1]], scales.astype(np.float32))
    assert not ks[:, scales.shape[1]:].any()  # padding groups: scale 0
    rows = np.array([n - 1, 0])
    assert np.array_equal(ql.kernel_codes(fmt, pay, n, k, rows), codes[rows])


@pytest.mark.parametrize("fmt", FORMATS)
def test_extreme_codes(fmt):
    s = gw.SCHEMES[fmt]
    k = 256
    codes = np.tile(np.arange(s.qmin, s.qmax + 1), -(-2 * k // (s.qmax - s.qmin + 1)))[: 2 * k].reshape(2, k)
    scales = np.full((2, k // s.group), 0.5, np.float16)
    pay = gw.pack(fmt, codes.astype(np.int8), scales)
    assert np.array_equal(ql.kernel_codes(fmt, pay, 2, k), codes)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n,k", [(6, 200), (4, 384)])
def test_planes_match_geometry(fmt, n, k):
    p, g = ql.planes(fmt, n, k), gw.geometry(fmt, (n, k))
    assert 4 * p.words == g.nbytes
    assert 4 * p.high_off == g.high_offset
    assert 4 * p.scale_off == g.scale_offset
    assert 4 * p.base_row * n == g.base_bytes


@pytest.mark.parametrize("fmt", FORMATS)
def test_reference_matches_dequantised_matmul(fmt, rng):
    n, k, t = 6, 200, 3
    pay = _payload(fmt, n, k, rng)
    w = gw.decode(fmt, pay, (n, k)).astype(np.float64)
    x = rng.standard_normal((t, k))
    r = rng.standard_normal((t, n))
    y = x @ w.T
    np.testing.assert_allclose(ql.reference(fmt, pay, n, k, x), y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ql.reference(fmt, pay, n, k, x, "residual", r), y + r, rtol=1e-12, atol=1e-12)
    g, u = y[:, :3], y[:, 3:]
    np.testing.assert_allclose(ql.reference(fmt, pay, n, k, x, "swiglu"), g / (1 + np.exp(-g)) * u,
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ql.reference(fmt, pay, n, k, x, outs=np.array([4, 1])), y[:, [4, 1]],
                               rtol=1e-12, atol=1e-12)


def test_payload_size_is_checked(rng):
    pay = _payload("Q4G64_F16S", 4, 128, rng)
    with pytest.raises(ql.GemvLayoutError, match="payload has"):
        ql.kernel_codes("Q4G64_F16S", pay[:-4], 4, 128)
    with pytest.raises(ql.GemvLayoutError, match="no GEMV layout"):
        ql.planes("NVFP4", 4, 128)


def test_variant_table():
    names = {v.name for v in gv.GEMV_VARIANTS}
    assert len(names) == len(gv.GEMV_VARIANTS) == 4 * 3 * 4
    assert gv.variant_name("Q5G64_F16S", "residual", 3) == "gemv_q5_t4_res"
    assert gv.variant_name("W8G32_F16S", "swiglu", 8) == "gemv_w8_t8_swiglu"
    assert gv.variant_name("Q4G64_F16S") == "gemv_q4_t1"
    for v in gv.GEMV_VARIANTS:
        assert v.source_file.is_file()
    with pytest.raises(LaunchError, match="1..8 columns"):
        gv.variant_name("Q4G64_F16S", "plain", 9)
    with pytest.raises(LaunchError, match="weight format"):
        gv.variant_name("BF16")
    with pytest.raises(LaunchError, match="epilogue"):
        gv.variant_name("Q4G64_F16S", "gelu")
    assert all(v.config["regconst"] for v in gv.GEMV_VARIANTS)
    old = gv.make_variant("Q4G64_F16S", "swiglu", 1, regconst=False)
    assert old.name == "gemv_q4_t1_swiglu_immc" and old.config["regconst"] is False


@pytest.mark.skipif(not dsl_available(), reason="CuTe DSL not installed")
@pytest.mark.parametrize("name,arch", [("gemv_q4_t1", "sm_90a"), ("gemv_w8_t2_res", "sm_90a"),
                                       ("gemv_q5_t1_swiglu", "sm_120a"), ("gemv_q6_t1", "sm_120a")])
def test_builds(name, arch, tmp_path):
    v = gv.gemv_variant(name)
    m = build_variant(v, arch, tmp_path)
    assert (tmp_path / arch / f"{name}.cubin").stat().st_size > 1000
    assert m.block == [gv.THREADS, 1, 1]
    assert [p.name for p in m.params] == [a.name for a in v.args if a is not None]
    assert m.params[0].dyn_shape == ["WL"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n,k", [(3, 256), (5, 200)])
def test_random_payload_is_valid(fmt, n, k, rng):
    pay = ql.random_payload(fmt, n, k, rng)
    codes, scales = gw.unpack(fmt, pay, (n, k))  # raises on any layout violation
    assert np.array_equal(ql.kernel_codes(fmt, pay, n, k), codes)
