"""Tensor-core GEMV on the CPU: the kernel's decode (`cute_kernels.gemv_mma.pairs_*`, `b_regs`) run
on numpy lanes, assembled into m16n8k16 fragments exactly as mma.sync reads them, against the numpy
reference; the variant table, the launcher's checks, and a few cubin builds."""

import numpy as np
import pytest

from inferno.artifact.formats import groupwise as gw
from inferno.cuda.errors import LaunchError
from inferno.kernels import gemv_mma_variants as mv
from inferno.kernels import qlayout as ql
from inferno.kernels.build import build_variant, dsl_available
from inferno.kernels.reference import bf16

pytestmark = pytest.mark.skipif(not dsl_available(), reason="CuTe DSL not installed")
FORMATS = list(gw.SCHEMES)
LANES = np.arange(32)
G, TQ = LANES // 4, LANES % 4  # lane -> (group id g, thread in quad t)


class NumpyOps:
    """The decode's ops on uint32 lane vectors (>> arithmetic, as the kernel's Int32)."""

    @staticmethod
    def c(u):
        return np.full(32, u, np.uint32)

    @staticmethod
    def shl(v, s):
        return (v << np.uint32(s)).astype(np.uint32)

    @staticmethod
    def shr(v, s):
        return (v.view(np.int32) >> s).view(np.uint32)

    @staticmethod
    def band(v, m):
        return v & np.uint32(m)

    @staticmethod
    def band_xor(v, m, k):
        return (v & np.uint32(m)) ^ k

    @staticmethod
    def band_or(v, m, k):
        return (v & np.uint32(m)) | k

    @staticmethod
    def imul(v, m):
        return (v.astype(np.uint64) * m & 0xFFFFFFFF).astype(np.uint32)

    @staticmethod
    def prmt(a, b, sel):
        src = np.stack([(a >> np.uint32(8 * i)) & 0xFF for i in range(4)]
                       + [(b >> np.uint32(8 * i)) & 0xFF for i in range(4)])
        out = np.zeros(32, np.uint32)
        for j in range(4):
            out |= src[(sel >> (4 * j)) & 7] << np.uint32(8 * j)
        return out

    @staticmethod
    def mul16(v):
        lo, hi = _halves(v)
        return _pack(lo * 16, hi * 16)


def _halves(v):
    f = lambda h: (h.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)  # noqa: E731
    return f(v & 0xFFFF), f(v >> np.uint32(16))


def _pack(lo, hi):
    b = lambda a: np.asarray(a, np.float32).astype(bf16).view(np.uint16).astype(np.uint32)  # noqa: E731
    return b(lo) | (b(hi) << np.uint32(16))


def _a_matrix(regs):
    """A [16, 16] from the 4 A words of every lane (rows g / g+8, k slots 2t.. / 2t+8..)."""
    a = np.zeros((16, 16))
    for i, (dr, dk) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
        lo, hi = _halves(regs[i])
        a[G + dr, 2 * TQ + dk], a[G + dr, 2 * TQ + dk + 1] = lo, hi
    return a


def _b_matrix(regs):
    b = np.zeros((16, 8))
    for i, dk in enumerate((0, 8)):
        lo, hi = _halves(regs[i])
        b[2 * TQ + dk, G], b[2 * TQ + dk + 1, G] = lo, hi
    return b


def emulate(fmt, pay, n, k, x):
    """The kernel's arithmetic for plain [n, k] (n % 16 == 0), float64: decode per lane, mma per
    tile and k-step, C started at -bias * sum(x), times the group scale."""
    from cute_kernels import gemv_mma as km

    ops = NumpyOps()
    p = ql.planes(fmt, n, k)
    words = np.frombuffer(pay, np.uint32)
    base = words[: n * p.base_row].reshape(n, p.base_row)
    high = words[p.high_off: p.high_off + n * p.high_row].reshape(n, p.high_row) if p.high_row else None
    scales = ql.kernel_scales(fmt, pay, n, k).astype(np.float64)
    xp = np.zeros((8, p.k_pad), np.float32)
    xp[: x.shape[0], :k] = x
    xb = xp.astype(bf16).view(np.uint16).astype(np.uint32)
    nx = 8 if p.bits < 8 else 4
    kb = np.full(32, km.BIAS_BF16[p.bits] * 0x10001, np.uint32)
    y = np.zeros((8, n))
    for tile in range(n // 16):
        for grp in range(p.k_pad // p.group):
            k0 = grp * p.group + 2 * nx * TQ  # first x of each lane's slice
            xw = [xb[G, k0 + 2 * i] | (xb[G, k0 + 2 * i + 1] << np.uint32(16)) for i in range(nx)]
            bregs = km.b_regs(ops, p.bits, xw)
            nb = sum(_a_matrix([kb] * 4) @ _b_matrix(bregs[m]) for m in km.bias_steps(p.bits))
            prs = []
            for h in range(2):
                rows = tile * 16 + 8 * h + G
                w0, w1 = base[rows, grp * 8 + 2 * TQ], base[rows, grp * 8 + 2 * TQ + 1]
                if p.bits == 4:
                    prs.append(km.pairs_q4(ops, w0, w1))
                elif p.bits == 5:
                    hw = high[rows, 2 * grp + TQ // 2]
                    hh = (hw.view(np.int32) >> (16 * (TQ % 2)).astype(np.int32)).view(np.uint32)
                    prs.append(km.pairs_q5(ops, w0, w1, hh))
                elif p.bits == 6:
                    prs.append(km.pairs_q6(ops, w0, w1, high[rows, 4 * grp + TQ]))
                else:
                    prs.append(km.pairs_w8(ops, w0, w1))
            d = nb
            for m in range(4):
                a = _a_matrix([prs[0][m][0], prs[1][m][0], prs[0][m][1], prs[1][m][1]])
                d = d + a @ _b_matrix(bregs[m])
            rows16 = tile * 16 + np.arange(16)
            y[:, rows16] += (scales[rows16, grp][:, None] * d).T
    return y[: x.shape[0]]


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_and_fragments_match_reference(fmt):
    rng = np.random.default_rng(7)
    n, k, t = 32, 200, 5
    pay = ql.random_payload(fmt, n, k, rng)
    x = rng.standard_normal((t, k)).astype(bf16).astype(np.float32)
    want = ql.reference(fmt, pay, n, k, x)
    got = emulate(fmt, pay, n, k, x)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * np.abs(want).max())


@pytest.mark.parametrize("fmt", FORMATS)
def test_extreme_codes(fmt):
    s = gw.SCHEMES[fmt]
    n, k = 16, 256
    codes = np.resize(np.arange(s.qmin, s.qmax + 1), n * k).reshape(n, k).astype(np.int8)
    pay = gw.pack(fmt, codes, np.full((n, k // s.group), 0.5, np.float16))
    x = np.eye(8, k, dtype=np.float32)
    x[7] = 1.0
    got = emulate(fmt, np.asarray(pay), n, k, x)
    np.testing.assert_array_equal(got, ql.reference(fmt, pay, n, k, x))


def test_variant_table():
    names = {v.name for v in mv.GEMV_MMA_VARIANTS}
    assert len(names) == len(mv.GEMV_MMA_VARIANTS) == 4 * 3 * 2
    assert mv.variant_name("Q4G64_F16S", "swiglu", 1) == "gemv_mma_q4_t1_swiglu"
    assert mv.variant_name("W8G32_F16S", "residual", 2) == "gemv_mma_w8_t8_res"
    assert mv.variant_name("Q6G64_F16S", "plain", 8) == "gemv_mma_q6_t8"
    with pytest.raises(LaunchError, match="1..8 columns"):
        mv.variant_name("Q4G64_F16S", "plain", 9)
    with pytest.raises(LaunchError, match="weight format"):
        mv.variant_name("BF16")
    with pytest.raises(LaunchError, match="epilogue"):
        mv.variant_name("Q4G64_F16S", "gelu")
    with pytest.raises(LaunchError, match="no tensor-core GEMV variant"):
        mv.gemv_mma_variant("gemv_q4_t1")
    alt = mv.make_variant("Q5G64_F16S", "plain", 1, tiles=2, warps=8, steps=1, stages=6)
    assert alt.name == "gemv_mma_q5_t1_r2_w8_s1_p6" and alt.grid[0] == "cdiv(M, 32)"
    assert not mv.prefers_mma("Q4G64_F16S", 1) and mv.prefers_mma("Q4G64_F16S", 3)
    assert not mv.prefers_mma("W8G32_F16S", 4) and mv.prefers_mma("W8G32_F16S", 8)
    with pytest.raises(LaunchError, match="weight format"):
        mv.prefers_mma("BF16", 8)
    from inferno.kernels import registry

    assert registry.get("gemv_mma_q4_t8_swiglu").grid[0] == "cdiv(M, 8)"


class _Loaded:
    """A stand-in for a loaded kernel: the launcher checks arguments before it touches it."""

    def __init__(self, v):
        self.variant = v
        self.manifest = type("M", (), {"config": v.config, "grid": list(v.grid)})()


def test_launcher_refuses_bad_arguments():
    from inferno.cuda.memory import DeviceBuffer

    kern = mv.GemvMma(_Loaded(mv.gemv_mma_variant("gemv_mma_q4_t1_res")))
    assert kern.outs == 16 and kern.fmt == "Q4G64_F16S"
    fake = DeviceBuffer.__new__(DeviceBuffer)
    with pytest.raises(LaunchError, match="exceeds its 1"):
        kern(fake, fake, fake, 64, 256, 2, r=fake)
    with pytest.raises(LaunchError, match="multiple of 8"):
        kern(fake, fake, fake, 64, 260, 1, r=fake)
    with pytest.raises(LaunchError, match="residual"):
        kern(fake, fake, fake, 64, 256, 1)
    bad = _Loaded(mv.gemv_mma_variant("gemv_mma_q4_t1"))
    bad.manifest.grid = ["cdiv(M, 4)", "1", "1"]
    with pytest.raises(LaunchError, match="manifest grid"):
        mv.GemvMma(bad)


@pytest.mark.parametrize("name,arch", [("gemv_mma_q4_t1_swiglu", "sm_90a"), ("gemv_mma_q6_t8_res", "sm_90a"),
                                       ("gemv_mma_w8_t1", "sm_120a")])
def test_builds(name, arch, tmp_path):
    v = mv.gemv_mma_variant(name)
    m = build_variant(v, arch, tmp_path)
    assert (tmp_path / arch / f"{name}.cubin").stat().st_size > 1000
    assert m.block == [32 * mv.WARPS, 1, 1]
    assert [p.name for p in m.params] == [a.name for a in v.args if a is not None]
