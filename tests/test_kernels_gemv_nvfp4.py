"""NVFP4 decode GEMV on the CPU: a numpy model of the kernel's word-level decode (code words,
swizzled scale word addresses, the E2M1 / E4M3 bit constructions, the divisor word) vs the
format's decoder, the kernel's summation order vs the dequantised matmul, the variant table, the
launcher's checks, and cubin builds for sm_90a and sm_120a."""

import types

import ml_dtypes
import numpy as np
import pytest

from inferno.artifact.formats import nvfp4
from inferno.cuda.errors import LaunchError
from inferno.kernels import gemv_nvfp4_variants as gf
from inferno.kernels.build import build_variant, dsl_available

SHAPES = [(128, 64), (256, 192), (384, 320)]


@pytest.fixture
def rng():
    return np.random.default_rng()


def _payload(n, k, rng):
    w = rng.standard_normal((n, k)).astype(np.float32) * rng.uniform(0.01, 1.0, (n, 1)).astype(np.float32)
    w[1, 16:32] = 0  # an all-zero block: scale +0
    w[2, :16] = 1.5e-5 * np.abs(w).max()  # tiny block: an E4M3 subnormal scale
    return nvfp4.encode(w)


def _f32(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, np.uint32).view(np.float32)


def kernel_e2m1(c: np.ndarray) -> np.ndarray:
    """cute_kernels/gemv_nvfp4._e2m1_f32 in numpy."""
    c = c.astype(np.uint32)
    m = c & 7
    normal = (((m >> 1) + 126) << 23) | ((m & 1) << 22)
    sub = (m & 1) * 0x3F000000
    return _f32(((c & 8) << 28) | np.where(m >= 2, normal, sub))


def kernel_e4m3(s: np.ndarray) -> np.ndarray:
    """cute_kernels/gemv_nvfp4._e4m3_f32 in numpy."""
    s = s.astype(np.uint32)
    e = s >> 3
    normal = _f32(((e + 120) << 23) | ((s & 7) << 20))
    return np.where(e == 0, (s & 7).astype(np.float32) * np.float32(2.0 ** -9), normal)


def kernel_view(pay: np.ndarray, n: int, k: int):
    """(W [n, k] as e2m1 values, scales [n, k/16], d_w) read from the int32 words as the kernel does."""
    words = pay.view(np.int32).view(np.uint32)
    scale_off = (n * (k // 8) + 63) // 64 * 64
    d_w = _f32(words[scale_off + n * (k // 64)])
    rows = np.arange(n)[:, None]
    chunks = np.arange(k // 32)[None, :]
    codes = np.empty((n, k), np.float32)
    for j in range(4):  # the 16-byte load of chunk c: words 4c + j of the row
        wd = words[rows * (k // 8) + 4 * chunks + j]
        for i in range(8):
            codes[:, np.arange(k // 32) * 32 + 8 * j + i] = kernel_e2m1((wd >> (4 * i)) & 0xF)
    srow = scale_off + (rows // 128) * (k // 64) * 128 + (rows % 32) * 4 + (rows % 128) // 32
    sw = words[srow + (chunks // 2) * 128] >> ((chunks % 2) * 16)
    scales = np.empty((n, k // 16), np.float32)
    for h in range(2):
        scales[:, 2 * np.arange(k // 32) + h] = kernel_e4m3((sw >> (8 * h)) & 0xFF)
    return codes, scales, d_w


def kernel_math(pay, n, k, x):
    """The kernel's sums: per 16-code group sum(e2m1 * x) in fp32, times the scale, / d_w at the end."""
    codes, scales, d_w = kernel_view(pay, n, k)
    g = (codes.reshape(n, k // 16, 16)[None] * x.reshape(x.shape[0], 1, k // 16, 16)).sum(-1, dtype=np.float32)
    return (g * scales[None]).sum(-1, dtype=np.float32) / d_w


@pytest.mark.parametrize("n,k", SHAPES)
def test_kernel_view_matches_format_decoder(n, k, rng):
    pay = _payload(n, k, rng)
    codes, scales, d = nvfp4.unpack(pay.tobytes(), (n, k))
    kc, ks, kd = kernel_view(pay, n, k)
    assert kd == d
    assert np.array_equal(ks, scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32))
    assert (scales == 0).any() and ((scales > 0) & (scales < 8)).any()  # +0 and subnormal scales covered
    e2m1 = np.empty((n, k), np.float32)
    e2m1[:, 0::2], e2m1[:, 1::2] = nvfp4.E2M1_VALUES[codes & 15], nvfp4.E2M1_VALUES[codes >> 4]
    assert np.array_equal(kc, e2m1)
    assert np.array_equal((kc * np.repeat(ks, 16, axis=1)) / kd, nvfp4.decode(pay.tobytes(), (n, k)))


def test_every_e2m1_and_e4m3_word():
    assert np.array_equal(kernel_e2m1(np.arange(16)), nvfp4.E2M1_VALUES)
    s = np.arange(0x7F, dtype=np.uint8)
    assert np.array_equal(kernel_e4m3(s), s.view(ml_dtypes.float8_e4m3fn).astype(np.float32))


@pytest.mark.parametrize("n,k", SHAPES)
def test_kernel_math_matches_dequantised_matmul(n, k, rng):
    pay = _payload(n, k, rng)
    x = rng.standard_normal((3, k)).astype(np.float32)
    want = x.astype(np.float64) @ nvfp4.decode(pay.tobytes(), (n, k)).astype(np.float64).T
    got = kernel_math(pay, n, k, x)
    assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)


def test_variant_table():
    names = [v.name for v in gf.GEMV_NVFP4_VARIANTS]
    assert len(set(names)) == len(names) == 3 * 4
    assert gf.variant_name("residual", 3) == "gemv_nvfp4_t4_res"
    assert gf.variant_name("swiglu", 8) == "gemv_nvfp4_t8_swiglu"
    assert gf.variant_name() == "gemv_nvfp4_t1"
    for v in gf.GEMV_NVFP4_VARIANTS:
        assert v.source_file.is_file() and v.op == "gemv_nvfp4"
    from inferno.kernels.registry import get

    assert get("gemv_nvfp4_t1").cls == "GemvNvfp4"  # registered
    with pytest.raises(LaunchError, match="1..8 columns"):
        gf.variant_name("plain", 9)
    with pytest.raises(LaunchError, match="epilogue"):
        gf.variant_name("gelu")


def _launcher(name):
    v = gf.gemv_nvfp4_variant(name)
    outs = v.config["rows"] // 2 if v.config["epilogue"] == "swiglu" else v.config["rows"]
    mf = types.SimpleNamespace(config=v.config, grid=[f"cdiv(M, {outs})", "1", "1"], block=[128, 1, 1], smem=0)
    return gf.GemvNvfp4(types.SimpleNamespace(variant=v, manifest=mf))


def test_launcher_checks():
    from inferno.model.gpu.emulator import EmulatedOps

    mem = EmulatedOps(1 << 22)
    w, x, y = mem.alloc("w", 1 << 20), mem.alloc("x", 1 << 14), mem.alloc("y", 1 << 14)
    k = _launcher("gemv_nvfp4_t2")
    with pytest.raises(LaunchError, match="exceeds its 2"):
        k(w, x, y, 128, 256, 3)
    with pytest.raises(LaunchError, match="n % 128 == 0 and k % 64 == 0"):
        k(w, x, y, 128, 260, 1)
    with pytest.raises(LaunchError, match="n % 128 == 0 and k % 64 == 0"):
        k(w, x, y, 100, 256, 1)
    with pytest.raises(LaunchError, match="bytes, the call needs"):
        k(w, x, y, 8192, 256, 1)
    with pytest.raises(LaunchError, match="residual"):
        k(w, x, y, 128, 256, 1, r=x)
    with pytest.raises(LaunchError, match="residual"):
        _launcher("gemv_nvfp4_t1_res")(w, x, y, 128, 256, 1)
    with pytest.raises(LaunchError, match="manifest grid"):
        v = gf.gemv_nvfp4_variant("gemv_nvfp4_t1")
        gf.GemvNvfp4(types.SimpleNamespace(variant=v, manifest=types.SimpleNamespace(config=v.config, grid=["1"])))


@pytest.mark.skipif(not dsl_available(), reason="CuTe DSL not installed")
@pytest.mark.parametrize("name,arch", [("gemv_nvfp4_t1", "sm_90a"), ("gemv_nvfp4_t8_res", "sm_90a"),
                                       ("gemv_nvfp4_t1_swiglu", "sm_120a"), ("gemv_nvfp4_t4", "sm_120a")])
def test_builds(name, arch, tmp_path):
    v = gf.gemv_nvfp4_variant(name)
    m = build_variant(v, arch, tmp_path)
    assert (tmp_path / arch / f"{name}.cubin").stat().st_size > 1000
    assert m.block == [gf.THREADS, 1, 1]
    assert [p.name for p in m.params] == [a.name for a in v.args if a is not None]
    assert m.params[0].dyn_shape == ["WL"]
