"""Tensor-core GEMV on the CPU: the kernel's `tile16-v1` addressing (`cute_kernels.gemv_mma.*_offset`)
and decode (`pairs_*`, `b_regs`) run on numpy lanes, assembled into m16n8k16 fragments exactly as
mma.sync reads them, against the numpy reference; the swiglu up-row mapping, the K split, the variant
table, the launcher's checks, and a few cubin builds."""

from pathlib import Path

import numpy as np
import pytest

from inferno.artifact.formats import groupwise as gw
from inferno.cuda.errors import LaunchError
from inferno.kernels import gemv_mma_variants as mv
from inferno.kernels import qlayout as ql
from inferno.kernels import tiled
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
    """The kernel's arithmetic for plain [n, k], float64: every lane's words read from the
    `tile16-v1` image at the kernel's offsets (`cute_kernels.gemv_mma.*_offset`), decoded per lane,
    one mma per tile and k-step, C started at -bias * sum(x), times the group scales."""
    from cute_kernels import gemv_mma as km

    ops = NumpyOps()
    s = gw.SCHEMES[fmt]
    geo = tiled.tiled_geometry(fmt, n, k)
    nt, ngr = geo.tiles, geo.groups
    high, scale = km.plane_offsets(s.bits, nt, ngr)
    assert (high, scale) == (geo.high_offset, geo.scale_offset)
    words = tiled.tile(fmt, pay, n, k).view(np.uint32)

    def at(off, e=0):  # the word e of each lane's run at byte offsets off
        return words[np.asarray(off) // 4 + e]

    k_pad = ngr * s.group
    xp = np.zeros((8, k_pad), np.float32)
    xp[: x.shape[0], :k] = x
    xb = xp.astype(bf16).view(np.uint16).astype(np.uint32)
    nx = 8 if s.bits < 8 else 4
    kb = np.full(32, km.BIAS_BF16[s.bits] * 0x10001, np.uint32)
    y = np.zeros((8, nt * 16))
    for tile in range(nt):
        for j in range(ngr):
            k0 = km.x_first(s.bits, j, LANES)
            xw = [xb[G, k0 + 2 * i] | (xb[G, k0 + 2 * i + 1] << np.uint32(16)) for i in range(nx)]
            bregs = km.b_regs(ops, s.bits, xw)
            nb = sum(_a_matrix([kb] * 4) @ _b_matrix(bregs[m]) for m in km.bias_steps(s.bits))
            w = [at(km.base_offset(tile, j, ngr, LANES), e) for e in range(4)]
            if s.bits in (5, 6):
                h0 = at(km.high_offset(s.bits, high, tile, j, ngr, LANES))
                hh = [h0, h0 >> np.uint32(16)] if s.bits == 5 else \
                    [h0, at(km.high_offset(s.bits, high, tile, j, ngr, LANES), 1)]
            prs = []
            for h in range(2):
                w0, w1 = w[2 * h], w[2 * h + 1]
                if s.bits == 4:
                    prs.append(km.pairs_q4(ops, w0, w1))
                elif s.bits == 5:
                    prs.append(km.pairs_q5(ops, w0, w1, h0, h))
                elif s.bits == 6:
                    prs.append(km.pairs_q6(ops, w0, w1, hh[h]))
                else:
                    prs.append(km.pairs_w8(ops, w0, w1))
            d = nb
            for m in range(4):
                a = _a_matrix([prs[0][m][0], prs[1][m][0], prs[0][m][1], prs[1][m][1]])
                d = d + a @ _b_matrix(bregs[m])
            sw = at(km.scale_offset(scale, tile, j // 2, ngr, LANES), j % 2)
            sc = np.zeros(16)
            sc[G] = (sw & 0xFFFF).astype(np.uint16).view(np.float16)
            sc[G + 8] = (sw >> np.uint32(16)).astype(np.uint16).view(np.float16)
            y[:, tile * 16:(tile + 1) * 16] += (sc[:, None] * d).T
    return y[: x.shape[0], :n]


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_and_fragments_match_reference(fmt):
    rng = np.random.default_rng(7)
    n, k, t = 40, 200, 5  # ragged N (3 tiles, the last 8 rows zero), K not a multiple of 128
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


def test_swiglu_up_rows():
    """The epilogue finds up row I + o at row (I % 16 + r) % 16 of up slot (I % 16 + r) // 16 of the unit."""
    from cute_kernels import gemv_mma as km

    for m in (16, 17, 501, 1000, 17408):
        nt = -(-2 * m // 16)
        for unit in range(-(-m // 16)):
            tiles = km.unit_tiles("swiglu", unit, m, nt)
            assert tiles[0] == unit and all(0 <= t < nt for t in tiles)
            for r in range(16):
                if 16 * unit + r < m:
                    off = m % 16 + r
                    assert 16 * tiles[1 + off // 16] + off % 16 == m + 16 * unit + r


def test_k_split():
    """The measured best splits of docs/kernels-gemv-mma.md (T = 1, H200)."""
    assert mv.k_split(34816, 5120) == 4 and mv.k_split(17408, 5120, "swiglu") == 8  # gate_up
    assert mv.k_split(5120, 17408, "residual") == 8 and mv.k_split(12288, 5120) == 4  # down, value_z
    assert mv.k_split(4096, 5120) == 8 and mv.k_split(7168, 5120) == 4  # query_key, attention q|k
    assert mv.k_split(248320, 5120) == 2 and mv.k_split(16, 8) == 8  # the output head, tiny
    assert mv.k_split(34816, 5120, kws=(8,)) == 8


def test_alternatives():
    names = [v.name for v in mv.alternatives("Q4G64_F16S", "plain", 1)]
    assert names == ["gemv_mma_q4_t1_k8_w8_r1_p5_xj", "gemv_mma_q4_t1_k8_w8_r2_p3"]
    sw = mv.alternatives("Q6G64_F16S", "swiglu", 8)
    assert [v.name for v in sw] == ["gemv_mma_q6_t8_swiglu_k8_w8_r1_p3_xj"] and not sw[0].config["xpre"]
    assert mv.alternatives("W8G32_F16S", "residual", 1)[1].grid[0] == "cdiv(M, 32)"


def test_variant_table():
    names = {v.name for v in mv.GEMV_MMA_VARIANTS}
    # register-x K splits for every (format, epilogue, T), + T = 1 Q4-Q6: xs K splits and stream-K
    # + the deferred-epilogue stream-K members: accumulate (plain, _n, _na), plain / swiglu `_na`, Q4-Q6
    # + the mixed-stack Q5 members (`_acc_n_lo4`, `_acc_na_lo4`)
    assert len(names) == len(mv.GEMV_MMA_VARIANTS) == (4 * 3 * 2 * len(mv.KW) + (3 * 3 + 3 * 2) * (len(mv.XS_KW) + 1)
                                                       + 3 * 5 + 2)
    assert mv.variant_name("Q4G64_F16S", "swiglu", 1) == "gemv_mma_q4_t1_swiglu"
    assert mv.variant_name("W8G32_F16S", "residual", 2) == "gemv_mma_w8_t8_res"
    assert mv.variant_name("Q6G64_F16S", "plain", 8) == "gemv_mma_q6_t8"
    assert "gemv_mma_q6_t8_k4" in names and all(v.pdl for v in mv.GEMV_MMA_VARIANTS)
    with pytest.raises(LaunchError, match="1..8 columns"):
        mv.variant_name("Q4G64_F16S", "plain", 9)
    with pytest.raises(LaunchError, match="weight format"):
        mv.variant_name("BF16")
    with pytest.raises(LaunchError, match="epilogue"):
        mv.variant_name("Q4G64_F16S", "gelu")
    with pytest.raises(LaunchError, match="no tensor-core GEMV variant"):
        mv.gemv_mma_variant("gemv_mma_q4_t1")
    alt = mv.make_variant("Q5G64_F16S", "plain", 1, kw=2, warps=4, tiles=2, stages=4)
    assert alt.name == "gemv_mma_q5_t1_k2_w4_r2_p4" and alt.grid[0] == "cdiv(M, 64)"
    with pytest.raises(LaunchError, match="must divide"):
        mv.make_variant("Q4G64_F16S", "plain", 1, kw=3)
    from inferno.kernels import registry

    assert registry.get("gemv_mma_q4_t8_swiglu_k8").grid[0] == "cdiv(M, 16)"


class _Loaded:
    """A stand-in for a loaded kernel: the launcher checks arguments before it touches it."""

    def __init__(self, v):
        self.variant = v
        self.manifest = type("M", (), {"config": v.config, "grid": list(v.grid)})()


def test_launcher_refuses_bad_arguments():
    from inferno.cuda.memory import DeviceBuffer

    kern = mv.GemvMma(*(_Loaded(mv.gemv_mma_variant(f"gemv_mma_q4_t1_res_k{kw}")) for kw in mv.KW))
    assert kern.fmt == "Q4G64_F16S" and kern.name == "gemv_mma_q4_t1_res"
    assert kern.member(5120, 17408)[1] == 16 and kern.member(248320, 5120)[1] == 64  # kw 8: 1 unit per CTA, kw 2: 4
    fake = DeviceBuffer.__new__(DeviceBuffer)
    with pytest.raises(LaunchError, match="exceeds its 1"):
        kern(fake, fake, fake, 64, 256, 2, r=fake)
    with pytest.raises(LaunchError, match="multiple of 8"):
        kern(fake, fake, fake, 64, 260, 1, r=fake)
    with pytest.raises(LaunchError, match="residual"):
        kern(fake, fake, fake, 64, 256, 1)
    bad = _Loaded(mv.gemv_mma_variant("gemv_mma_q4_t1_k8"))
    bad.manifest.grid = ["cdiv(M, 4)", "1", "1"]
    with pytest.raises(LaunchError, match="manifest grid"):
        mv.GemvMma(bad)
    with pytest.raises(LaunchError, match="one family"):
        mv.GemvMma(_Loaded(mv.gemv_mma_variant("gemv_mma_q4_t1_k8")), _Loaded(mv.gemv_mma_variant("gemv_mma_q5_t1_k4")))


def test_family_members_and_choice():
    """A T = 1 Q4-Q6 family holds register-x, xs and stream-K members; the launcher takes stream-K where
    `sk_wins` (the 27B value_z, gate_up, down, GDN / attention outputs), xs (kw 2 from 512 units, else 4)
    for the rest, and the register-x K split only for K past KMAX. W8 and T = 8 families are register-x only."""
    names = mv.family_members("gemv_mma_q4_t1_swiglu")
    assert names == ["gemv_mma_q4_t1_swiglu_k2", "gemv_mma_q4_t1_swiglu_k4", "gemv_mma_q4_t1_swiglu_k8",
                     "gemv_mma_q4_t1_swiglu_k2_xs", "gemv_mma_q4_t1_swiglu_k4_xs", "gemv_mma_q4_t1_swiglu_sk"]
    assert mv.family_members("gemv_mma_w8_t1") == [f"gemv_mma_w8_t1_k{kw}" for kw in mv.KW]
    assert mv.family_members("gemv_mma_q5_t8_res") == [f"gemv_mma_q5_t8_res_k{kw}" for kw in mv.KW]
    assert mv.family_members("gemv_mma_q6_t1_k4_xs") == ["gemv_mma_q6_t1_k4_xs"]
    fam = {epi: mv.GemvMma(*(_Loaded(mv.gemv_mma_variant(n)) for n in mv.family_members(mv.variant_name(
        "Q5G64_F16S", epi, 1)))) for epi in ("plain", "swiglu", "residual")}
    assert isinstance(fam["swiglu"].member(17408, 5120), mv.GemvMmaSK)  # gate_up: 1088 units x 40 pairs
    assert isinstance(fam["residual"].member(5120, 17408), mv.GemvMmaSK)  # down: 320 x 136
    assert isinstance(fam["plain"].member(12288, 5120), mv.GemvMmaSK)  # value_z: 30,720 blocks
    assert isinstance(fam["residual"].member(5120, 6144), mv.GemvMmaSK)  # GDN / attention output: 15,360
    lk, outs = fam["plain"].member(7168, 5120)  # attention q|k: 17,920 blocks, 448 units
    assert lk.manifest.config["xs"] and lk.manifest.config["kw"] == 4 and outs == 32
    lk, outs = fam["plain"].member(4096, 5120)  # GDN q|k: 10,240 blocks
    assert lk.manifest.config["xs"] and lk.manifest.config["kw"] == 4
    assert isinstance(fam["plain"].member(248320, 5120), mv.GemvMmaSK)  # the output head (measured in sessions 26-27)
    xs = mv.GemvMma(*(_Loaded(mv.gemv_mma_variant(f"gemv_mma_q5_t1_k{kw}_xs")) for kw in mv.XS_KW))
    lk, outs = xs.member(248320, 5120)  # without a stream-K member: xs kw 2 from 512 units
    assert lk.manifest.config["xs"] and lk.manifest.config["kw"] == 2 and outs == 64
    lk, _ = fam["plain"].member(4096, mv.KMAX + 8)
    assert not lk.manifest.config.get("xs") and lk.manifest.config["kw"] == mv.k_split(4096, mv.KMAX + 8)
    only_xs = mv.GemvMma(_Loaded(mv.gemv_mma_variant("gemv_mma_q5_t1_k4_xs")))
    with pytest.raises(LaunchError, match="no loaded member takes K"):
        only_xs.member(64, mv.KMAX + 8)


@pytest.mark.parametrize("m", [1, 16, 17, 24, 501, 1088])
@pytest.mark.parametrize("epilogue", ["plain", "swiglu"])
def test_stream_k_row_ownership(epilogue, m):
    """Every weight row is added into the workspace by exactly one unit, and a unit adds exactly the
    rows its epilogue reads back (gate o and up I + o for swiglu, o for plain), ragged I included."""
    from cute_kernels.gemv_mma import unit_tiles
    from cute_kernels.gemv_mma_sk import owned

    n_w = 2 * m if epilogue == "swiglu" else m
    n_tiles, units = -(-n_w // 16), -(-m // 16)
    adds = {}
    for u in range(units):
        tiles = unit_tiles(epilogue, u, m, n_tiles)
        rows = set()
        for slot in range(3 if epilogue == "swiglu" else 1):
            for r in range(16):
                row = 16 * tiles[slot] + r
                if owned(epilogue, slot, tiles[slot], tiles, u, row, m, n_w):
                    assert row not in rows
                    rows.add(row)
                    adds[row] = adds.get(row, 0) + 1
        outs = [o for o in range(16 * u, 16 * u + 16) if o < m]
        assert rows == set(outs) | ({m + o for o in outs} if epilogue == "swiglu" else set())
    assert sorted(adds) == list(range(n_w)) and set(adds.values()) == {1}


@pytest.mark.skipif(not dsl_available(), reason="CuTe DSL not installed")
@pytest.mark.parametrize("fmt", ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "NVFP4"])
def test_stream_k_sources_step_by_pair(fmt):
    """The ring's copies address group pair p of a tile as the plane's start plus (tile * pairs + p) times
    `pair_bytes`: the bytes `base_offset`, `high_offset` and the member's scale offset name, every tile and pair."""
    from cute_kernels.gemv_mma import base_offset, high_offset
    from cute_kernels.gemv_mma_nvfp4 import GemvMmaNvfp4SK
    from cute_kernels.gemv_mma_sk import GemvMmaSK

    kern = GemvMmaNvfp4SK(4, 16, 1, "plain") if fmt == "NVFP4" else \
        GemvMmaSK(gw.SCHEMES[fmt].bits, 64, 1, "plain", warps=16, kmax=18432, cpa=True)
    base, high, scale = kern.pair_bytes()
    ngr, high0, scale0 = 40, 1 << 20, 1 << 22
    for tile in (0, 1, 7, 300):
        for p in range(ngr // 2):
            pair = tile * (ngr // 2) + p
            for q in range(2):
                assert base_offset(tile, 2 * p + q, ngr, 0) == pair * base + 512 * q
            if kern.hw:
                assert high_offset(kern.bits, high0, tile, 2 * p, ngr, 0) == high0 + pair * high
            assert kern._scale_off(scale0, tile, p, ngr, 0) == scale0 + pair * scale


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
def test_family_load_skips_members_of_other_archs(arch, monkeypatch):
    """On sm_120a (about 100 KB of shared memory per CTA) a T = 1 family loads without its ring stream-K."""
    from inferno.kernels import cache

    dev = type("D", (), {"arch": arch})()
    monkeypatch.setattr(cache, "load", lambda v, device=None: _Loaded(v))
    fam = mv.GemvMma.load("gemv_mma_q5_t1_swiglu", dev)
    assert (fam.sk is not None) == (arch == "sm_90a") and set(fam.xs_by_kw) == set(mv.XS_KW)
    assert isinstance(fam.member(17408, 5120), mv.GemvMmaSK) == (arch == "sm_90a")


def test_stream_k_variants():
    v = mv.make_sk_variant("Q4G64_F16S", "swiglu")
    assert v.name == "gemv_mma_q4_t1_swiglu_sk" and v.grid[0] == f"SMS * {mv.SK_CTAS}"
    assert [a.name for a in v.args if a is not None] == ["w", "x", "y", "ws"]
    assert v.config["cpa"] and v.config["stages"] == mv.SK_STAGES[("q4", True)]
    assert mv.make_sk_variant("Q6G64_F16S", "plain", stages=2, ctas=2, warps=8).name == "gemv_mma_q6_t1_sk_p2_c2_w8"
    regs = mv.make_sk_variant("Q6G64_F16S", "plain", cpa=False)
    assert regs.name == "gemv_mma_q6_t1_sk_regs_p3_c1_w16" and not regs.config["cpa"]
    assert mv.ring_fits("Q6G64_F16S", "swiglu", 3, 16) and not mv.ring_fits("Q6G64_F16S", "swiglu", 4, 16)
    with pytest.raises(LaunchError, match="does not fit"):  # session 25's S5N5: built, then failed at launch
        mv.make_sk_variant("Q4G64_F16S", "swiglu", stages=5)
    assert v.archs == ("sm_90a",) and "sm_120a" in regs.archs  # the ring needs sm_90's shared memory per CTA
    assert mv.sk_wins(43520, "swiglu") and mv.sk_wins(15360, "residual") and not mv.sk_wins(17920, "plain")
    assert mv.sk_wins(620800, "plain")  # the output head (measured in sessions 26-27)
    with pytest.raises(LaunchError, match="Q4-Q6 at T = 1"):
        mv.make_sk_variant("W8G32_F16S", "plain")
    # counters for 2 units padded to 32 words, then fp32 sums [cols, rows of W]
    assert mv.sk_workspace_bytes(17, 34, 1) == 4 * (32 + 34)
    assert mv.sk_workspace_bytes(5120, 5120, 1) == 4 * (320 + 5120)
    kern = mv.GemvMmaSK(_Loaded(v))
    from inferno.cuda.memory import DeviceBuffer

    fake = DeviceBuffer.__new__(DeviceBuffer)
    with pytest.raises(LaunchError, match="takes K <="):
        kern(fake, fake, fake, 64, mv.KMAX + 8, 1)
    with pytest.raises(LaunchError, match="not a stream-K"):
        mv.GemvMmaSK(_Loaded(mv.gemv_mma_variant("gemv_mma_q4_t1_k8")))


def _cuobjdump() -> str | None:
    """cuobjdump on PATH or from the nvidia-cuda-cuobjdump wheel, else None."""
    import shutil
    from pathlib import Path

    tool = shutil.which("cuobjdump")
    if tool is not None:
        return tool
    try:
        import nvidia
    except ImportError:
        return None
    return next((str(p) for r in nvidia.__path__ for p in [Path(r, "cu13", "bin", "cuobjdump")] if p.exists()), None)


def test_probe_variants(tmp_path):
    """The benchmark's stream-K probes build; in their SASS (where cuobjdump is installed) `nochain` keeps
    the row sums' reds but no unit-counter atomics, `empty` and `nocompute` have no mma at all, `nostage`
    stores nothing to shared memory (the staging is x's only shared store), `bare` neither that nor atomics;
    the member is untouched."""
    import subprocess

    from inferno.kernels.build import build_variant

    probes = mv.probe_variants("Q5G64_F16S", "residual")
    assert [v.name for v in probes] == [f"gemv_mma_q5_t1_res_sk_probe_{p}"
                                        for p in ("nochain", "empty", "nocompute", "timeline", "nostage", "bare")]
    assert all(v.name not in {m.name for m in mv.GEMV_MMA_VARIANTS} for v in probes)  # never the executor's
    member = mv.make_sk_variant("Q5G64_F16S", "residual")
    assert "probe" not in member.config
    tool = _cuobjdump()
    sass = {}
    for v in [member, *probes]:
        build_variant(v, "sm_90a", tmp_path)
        if tool is not None:
            cubin = tmp_path / "sm_90a" / f"{v.name}.cubin"
            sass[v.name.rpartition("_probe_")[2] if "_probe_" in v.name else ""] = subprocess.run(
                [tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    if tool is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    assert "ATOM" in sass[""] and "RED" in sass[""] and "HMMA" in sass[""]
    assert "ATOM" not in sass["nochain"] and "RED" in sass["nochain"] and "HMMA" in sass["nochain"]
    assert "HMMA" not in sass["empty"] and "RED" not in sass["empty"]
    assert "HMMA" not in sass["nocompute"] and "LDGSTS" in sass["nocompute"] and "RED" in sass["nocompute"]
    assert "GLOBALTIMER" in sass["timeline"] and "GLOBALTIMER" not in sass[""]
    assert " STS" in sass[""] and " STS" not in sass["nostage"] and "ATOM" in sass["nostage"]
    assert " STS" not in sass["bare"] and "ATOM" not in sass["bare"] and "HMMA" in sass["bare"]
    _x_before_ring(sass[""])


def _x_before_ring(sass: str) -> None:
    """The stream-K prologue split (gemv_mma_sk.PRE_WAIT): ring copies before griddepcontrol.wait (ACQBULK)
    and the rest of the prologue's between it and x's staging barrier, after x's first 16-byte load."""
    wait = sass.index("ACQBULK")
    assert "LDGSTS" in sass[:wait]
    staging = sass[wait:sass.index("BAR.SYNC", wait)]
    assert "LDGSTS" in staging and staging.index("LDG.E.128") < staging.index("LDGSTS")


def _built_sass(variants, tmp_path) -> list[str]:
    """The sm_90a SASS of each variant, built into tmp_path (the test skips where cuobjdump is not installed)."""
    import subprocess

    tool = _cuobjdump()
    out = []
    for v in variants:
        build_variant(v, "sm_90a", tmp_path)
        if tool is not None:
            out.append(subprocess.run([tool, "-sass", str(tmp_path / "sm_90a" / f"{v.name}.cubin")],
                                      capture_output=True, text=True, check=True).stdout)
    if tool is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    return out


def test_deferred_members(tmp_path):
    """The accumulating GEMV and the `_na` members: names, arguments, refusals; their families hold only the
    stream-K member, which they take at any shape. In SASS (where cuobjdump is installed) accumulate has the
    row sums' reds but no atomics or stores (no flush), `_na` stores (x_mid, z) beside the member's flush."""
    assert mv.variant_name("Q5G64_F16S", mv.ACCUMULATE) == "gemv_mma_q5_t1_acc"
    assert mv.variant_name("Q4G64_F16S", "swiglu", 1, norm=True, add=True) == "gemv_mma_q4_t1_swiglu_na"
    for bad, match in ((dict(fmt="W8G32_F16S", epilogue=mv.ACCUMULATE), "Q4-Q6"),
                       (dict(fmt="Q4G64_F16S", epilogue=mv.ACCUMULATE, cols=8), "Q4-Q6, T = 1"),
                       (dict(fmt="Q4G64_F16S", epilogue="swiglu", add=True), "norm=True"),
                       (dict(fmt="Q4G64_F16S", epilogue="residual", norm=True), "RMSNorm")):
        with pytest.raises(LaunchError, match=match):
            mv.variant_name(**bad)
    acc, na = mv.gemv_mma_variant("gemv_mma_q5_t1_acc_sk"), mv.gemv_mma_variant("gemv_mma_q4_t1_swiglu_na_sk")
    assert [a.name for a in acc.args if a is not None] == ["w", "x", "y"] and acc.args[3].dtype == "f32"
    assert [a.name for a in na.args if a is not None] == ["w", "x", "y", "ws", "nw", "eps", "s", "xo", "z"]
    assert mv.family_members("gemv_mma_q5_t1_acc") == ["gemv_mma_q5_t1_acc_sk"]
    assert mv.family_members("gemv_mma_q6_t1_acc_na") == ["gemv_mma_q6_t1_acc_na_sk"]
    assert mv.variant_name("Q5G64_F16S", mv.ACCUMULATE, 1, norm=True) == "gemv_mma_q5_t1_acc_n"
    fam = mv.GemvMma(_Loaded(acc))
    assert isinstance(fam.member(16, 128), mv.GemvMmaSK) and isinstance(fam.member(5120, 6144), mv.GemvMmaSK)
    a, n = _built_sass((acc, na), tmp_path)
    assert "RED" in a and "HMMA" in a and "ATOM" not in a and "STG" not in a
    assert "ATOM" in n and "STG.E.128" in n and "HMMA" in n
    _x_before_ring(n)


def test_lo4_members(tmp_path):
    """The mixed-stack members (`_lo4`: W's first lo tiles a Q4 image, the Q5 accumulating GEMV with the RMSNorm
    folded): names, arguments (lo an i32 last), families of their own, refusals; in SASS no atomics or stores
    (accumulate) and four copies of the block's mmas (the Q4 rounds, the mixed round's two, the Q5 rounds)."""
    n, na = mv.gemv_mma_variant("gemv_mma_q5_t1_acc_n_lo4_sk"), mv.gemv_mma_variant("gemv_mma_q5_t1_acc_na_lo4_sk")
    assert [a.name for a in n.args if a is not None] == ["w", "x", "y", "nw", "eps", "lo"]
    assert [a.name for a in na.args if a is not None][-1] == "lo" and na.args[-1].dtype == "i32"
    assert mv.family_members("gemv_mma_q5_t1_acc_n_lo4") == [n.name]
    assert mv.family_members("gemv_mma_q5_t1_acc_n") == ["gemv_mma_q5_t1_acc_n_sk"]
    assert not any("lo4" in v.name for v in mv.GEMV_MMA_VARIANTS if v.config["bits"] != 5)
    for bad in (dict(fmt="Q4G64_F16S", epilogue=mv.ACCUMULATE, norm=True), dict(fmt="Q5G64_F16S", epilogue="plain",
                norm=True), dict(fmt="Q5G64_F16S", epilogue=mv.ACCUMULATE)):
        with pytest.raises(LaunchError, match="lo4"):
            mv.make_sk_variant(**bad, lo4=True)
    lo, one = _built_sass((n, mv.gemv_mma_variant("gemv_mma_q5_t1_acc_n_sk")), tmp_path)
    assert "ATOM" not in lo and "STG" not in lo and "RED" in lo
    assert lo.count("HMMA") == 4 * one.count("HMMA")


@pytest.mark.parametrize("name,arch", [("gemv_mma_q4_t1_swiglu_k2", "sm_90a"), ("gemv_mma_q5_t1_res_sk", "sm_90a"),
                                       ("gemv_mma_q6_t1_swiglu_sk", "sm_90a"),
                                       ("gemv_mma_q6_t1_k4_xs", "sm_90a"), ("gemv_mma_q4_t1_swiglu_k2_xs", "sm_120a"),
                                       ("gemv_mma_q6_t8_res_k8", "sm_90a"),
                                       ("gemv_mma_w8_t1_k4", "sm_120a")])
def test_builds(name, arch, tmp_path):
    v = mv.gemv_mma_variant(name)
    m = build_variant(v, arch, tmp_path)
    assert (tmp_path / arch / f"{name}.cubin").stat().st_size > 1000
    assert m.block == [32 * v.config["warps"], 1, 1]
    assert [p.name for p in m.params] == [a.name for a in v.args if a is not None]


def test_mlp_probe_builds(tmp_path):
    """tools/bench_mlp_probe.py's kernel (gate_up and down in one launch, no synchronisation) builds, and
    fits one CTA per SM."""
    import importlib.util

    from inferno.kernels.build import build_variant

    spec = importlib.util.spec_from_file_location("bench_mlp_probe",
                                                  Path(__file__).parents[1] / "tools" / "bench_mlp_probe.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    m = build_variant(tool.probe_variant(), "sm_90a", tmp_path)
    assert m.block == [512, 1, 1] and m.smem <= mv.SMEM_BLOCK


def test_stream_probe_builds(tmp_path):
    """tools/bench_stream_probe.py's kernels (per-warp cp.async runs; per-SM bulk copies) build for sm_90a."""
    import importlib.util

    from inferno.kernels.build import build_variant

    spec = importlib.util.spec_from_file_location("bench_stream_probe",
                                                  Path(__file__).parents[1] / "tools" / "bench_stream_probe.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    for c in (tool.CONFIGS[0], tool.CONFIGS[2]):
        m = build_variant(tool.probe_variant(*c), "sm_90a", tmp_path)
        assert m.smem <= mv.SMEM_BLOCK


REGS_PER_SM, SMEM_PER_SM, SMEM_RESERVED = 65536, 228 * 1024, 1024  # sm_90


def _fits_two(threads: int, regs: int, smem: int) -> bool:
    """Whether two CTAs of a kernel fit on one sm_90 SM (registers allocated in 8s a thread)."""
    return 2 * threads * -(-regs // 8) * 8 <= REGS_PER_SM and 2 * (smem + SMEM_RESERVED) <= SMEM_PER_SM


def test_stream_k_members_fill_an_sm(kernel_builds):
    """Every registered stream-K member (groupwise and NVFP4) takes a whole SM: its grid is one CTA per SM with a
    static split, so a member that fit two CTAs on an SM would be packed two to an SM by PDL's early launch and run
    half its CTAs at half speed (-14 % of decode, docs/performance.md session 12). The members pad their shared
    memory to `ONE_CTA_PER_SM` (the Q4 `_acc_n(a)` members have 64 registers: only their shared memory bounds them)."""
    import re
    import subprocess

    from cute_kernels.gemv_mma_sk import ONE_CTA_PER_SM
    from inferno.kernels import gemv_mma_nvfp4_variants as N
    from inferno.kernels.manifest import Manifest

    tool = _cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    members = [v for v in mv.GEMV_MMA_VARIANTS + N.GEMV_MMA_NVFP4_VARIANTS if v.config.get("sk")]
    root = kernel_builds(members, ["sm_90a"])  # the session's builds (test_kernels_build made them)
    two, small = [], []
    for v in members:
        m = Manifest.read(root / "sm_90a" / f"{v.name}.json")
        out = subprocess.run([tool, "-res-usage", str(root / "sm_90a" / f"{v.name}.cubin")], capture_output=True,
                             text=True, check=True).stdout
        regs = int(re.search(r"REG:(\d+)", out).group(1))
        if _fits_two(m.block[0], regs, m.smem):
            two.append(v.name)
        if regs <= 64:
            small.append(v.name)
        assert m.smem >= ONE_CTA_PER_SM, f"{v.name}: {m.smem} bytes of shared memory"
    assert not two, f"members fitting two CTAs on an SM: {two}"
    assert "gemv_mma_q4_t1_acc_n_sk" in small  # the padding is what bounds these
