"""CPU: the GDN decode kernels (gdn_conv, gdn_step, the fused gdn_conv_step family) build for sm_90a
and sm_120a; manifests, launcher packing (grid, cluster) and checks; the fused step's algebra (one
pass over S) against the numpy reference."""

import hashlib
import struct

import numpy as np
import pytest

from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import DeviceBuffer
from inferno.cuda.params import ParamLayout, ParamSpec
from inferno.kernels.gdn_variants import GDN_LAUNCHERS, GDN_VARIANTS, GdnConv, GdnConvStep, GdnStep
from inferno.kernels.manifest import Manifest, grid_symbols, source_hash
from inferno.kernels.registry import ARCHS, Tensor
from inferno.model.reference.gdn import causal_conv, recurrent_delta_rule
from inferno.model.reference.norms import gated_rms_norm, l2_normalize, sigmoid, silu, softplus
from kernel_fakes import LaunchRecorder, fake_loaded

SMEM_LIMIT = {"sm_90a": 232448, "sm_120a": 101376}
BY_NAME = {v.name: v for v in GDN_VARIANTS}
PAIRS = [(v.name, a) for v in GDN_VARIANTS for a in v.archs]


# --- the fused step's algebra (what cute_kernels/gdn_step.py computes), no GPU --------------------


def fused_step(q, k, v, a, b, a_log, dt_bias, z, w, state, eps):
    """One decode token, all value heads, in the kernel's one-pass form: k^T S and q^T S from the
    old state, then u = beta (v - e^g k^T S), S' = e^g S + k u^T, o = e^g q^T S + (q.k) u."""
    decay = np.exp(-np.exp(a_log) * softplus(a + dt_bias))
    beta = sigmoid(b)
    ks = np.einsum("hk,hkv->hv", k, state)
    qs = np.einsum("hk,hkv->hv", q, state)
    u = beta[:, None] * (v - decay[:, None] * ks)
    new_state = decay[:, None, None] * state + k[:, :, None] * u[:, None, :]
    o = decay[:, None] * qs + np.sum(q * k, axis=1)[:, None] * u
    return gated_rms_norm(o, z, w, eps), new_state


def test_fused_step_algebra_matches_reference():
    rng = np.random.default_rng(0)
    hk, hv, d = 4, 12, 16
    q = l2_normalize(rng.standard_normal((hk, d), np.float32)) * np.float32(d**-0.5)
    k = l2_normalize(rng.standard_normal((hk, d), np.float32))
    q, k = (np.repeat(x, hv // hk, axis=0) for x in (q, k))
    v, z = rng.standard_normal((2, hv, d), np.float32)
    a, b, dt_bias = rng.standard_normal((3, hv), np.float32)
    a_log = np.log(rng.uniform(1, 16, hv)).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    state = rng.standard_normal((hv, d, d), np.float32)
    out, new_state = fused_step(q, k, v, a, b, a_log, dt_bias, z, w, state, 1e-6)
    g = -np.exp(a_log) * softplus(a + dt_bias)
    o_ref, s_ref = recurrent_delta_rule(q[:, None], k[:, None], v[:, None], g[:, None], sigmoid(b)[:, None], state)
    np.testing.assert_allclose(new_state, s_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out, gated_rms_norm(o_ref[:, 0], z, w, 1e-6), rtol=1e-4, atol=1e-5)


def test_conv_tap_major_layout_matches_reference():
    """The kernel's tap-major state [K-1, C] / weight [K, C] are the reference's [C, K-1] / [C, K] transposed."""
    rng = np.random.default_rng(1)
    c = 24
    x = rng.standard_normal(c, np.float32)
    st = rng.standard_normal((3, c), np.float32)  # kernel layout: tap 0 = oldest
    wt = rng.standard_normal((4, c), np.float32)
    out = silu(wt[3] * x + wt[0] * st[0] + wt[1] * st[1] + wt[2] * st[2])
    new_st = np.stack([st[1], st[2], x])
    ref_out, ref_st = causal_conv(x[None], st.T, wt.T)
    np.testing.assert_allclose(out, silu(ref_out[0]), rtol=1e-6)
    np.testing.assert_array_equal(new_st, ref_st.T)


# --- the default fused kernel's thread layout (pure index math, no GPU) ---------------------------


CONV_STEP_CONFIGS = [v.config for v in GDN_VARIANTS if v.cls == "GdnConvStep"]


@pytest.mark.parametrize("config", CONV_STEP_CONFIGS, ids=lambda c: f"s{c['splits']}t{c['threads']}")
def test_conv_step_lane_layout_covers_the_state_once(config):
    """Every (row, 4-column chunk) of a head's state belongs to exactly one (CTA, compute warp, lane,
    row) of GdnConvStep; the butterfly offsets reduce over exactly the lanes of one chunk (rows) or
    of one row group (columns); the shuffle sources hold each lane's raw q/k rows; lanes 0-15 / 16-31
    convolve the key head's q / k chunks."""
    gdn_step = pytest.importorskip("cute_kernels.gdn_step", reason="CuTe DSL not installed")
    k = gdn_step.GdnConvStep(**config)
    assert config["threads"] == 32 * (k.warps + 1)
    owner = np.zeros((128, 32), np.int32)  # [row, 4-column chunk]
    for split in range(k.splits):
        for warp in range(k.warps):
            for lane in range(32):
                rg, cwi, row0, chunk = k.lane_layout(split, warp, lane)
                owner[row0: row0 + k.rows, chunk] += 1
                same_chunk = {lane ^ m for m in _xor_span(k.row_offsets)}
                assert same_chunk == {r * k.cpw + cwi for r in range(k.lpc)}
                same_rows = {lane ^ m for m in _xor_span(k.col_offsets)}
                assert same_rows == {rg * k.cpw + c for c in range(k.cpw)}
                for i in range(k.rows):
                    src = k.qk_source(rg, i)
                    assert 0 <= src < 16 and 8 * src + i % 8 == row0 + i
    np.testing.assert_array_equal(owner, 1)
    hk = 16
    for kh in (0, 5, hk - 1):
        chunks = [k.qk_chunk(kh, lane, hk) for lane in range(32)]
        assert chunks == [kh * 16 + i for i in range(16)] + [(hk + kh) * 16 + i for i in range(16)]


def _xor_span(offsets) -> set[int]:
    """All lane xor-masks reachable by a butterfly over `offsets`."""
    masks = {0}
    for o in offsets:
        masks |= {m ^ o for m in masks}
    return masks


# --- builds and manifests -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(kernel_builds):
    return kernel_builds(GDN_VARIANTS, ARCHS)


def _manifest(root, name, arch) -> Manifest:
    return Manifest.read(root / arch / f"{name}.json")


def test_variants_are_distinct_and_have_launchers():
    from inferno.kernels.registry import VARIANTS

    assert len(BY_NAME) == len(GDN_VARIANTS)
    taken = {v.name for v in VARIANTS if v not in GDN_VARIANTS}
    assert not taken & set(BY_NAME), "a GDN variant name clashes with a registry variant"
    assert {v.op for v in GDN_VARIANTS} == set(GDN_LAUNCHERS)
    for v in GDN_VARIANTS:
        assert set(v.archs) == set(ARCHS) and v.source_file.is_file()


@pytest.mark.parametrize("name,arch", PAIRS)
def test_manifest_complete_and_consistent(built, name, arch):
    from inferno.cuda.image import cubin_entries, inspect_image
    from inferno.kernels import cache

    v = BY_NAME[name]
    m = _manifest(built, name, arch)
    cubin = (built / arch / f"{name}.cubin").read_bytes()
    info = inspect_image(cubin)
    assert info.kind == "cubin" and info.arch == arch
    assert m.entry in cubin_entries(cubin)
    assert (m.variant, m.op, m.arch, m.source) == (v.name, v.op, arch, v.source)
    assert m.source_hash == source_hash(v.source_file, v.config)
    assert m.cubin_sha256 == hashlib.sha256(cubin).hexdigest()
    assert m.config == v.config and m.cluster == [1, 1, 1]
    assert m.block[1:] == [1, 1] and m.block[0] % 32 == 0 and 32 <= m.block[0] <= 1024
    assert 0 <= m.smem <= SMEM_LIMIT[arch]
    # One parameter per host argument, in order, with the declared dynamic symbols.
    args = [a for a in v.args if a is not None]
    assert [p.name for p in m.params] == [a.name for a in args]
    for p, a in zip(m.params, args):
        if isinstance(a, Tensor):
            assert (p.kind, p.dtype, p.dyn_shape, p.dyn_stride) == ("tensor", a.dtype, list(a.dyn_shape),
                                                                     list(a.dyn_stride))
        else:
            assert (p.kind, p.size) == (a.dtype, 4)
    specs = [ParamSpec(p.name, p.kind, p.size, p.align, len(p.dyn_shape) if p.kind == "tensor" else 0,
                       len(p.dyn_stride)) for p in m.params]
    assert list(ParamLayout(specs).offsets) == [p.offset for p in m.params]
    assert grid_symbols(m.grid) <= {s for p in m.params for s in p.dyn_shape}
    assert cache.stale_reason(v, arch, built) is None


def test_step_block_and_smem(built):
    for arch in ARCHS:
        m = _manifest(built, "gdn_step", arch)
        warps = m.config["warps"]
        assert m.block == [32 * warps, 1, 1]
        # q, k (fp32 [dk]) + two per-warp partial rows (fp32 [warps, dv]) + 4 scalars
        dk, dv = m.config["head_k"], m.config["head_v"]
        assert m.smem >= 4 * (2 * dk + 2 * warps * dv + 4)


# --- launchers without a GPU: packing and validation up to the driver call ----------------------


@pytest.fixture
def rec(monkeypatch):
    from inferno.kernels import gdn_variants

    r = LaunchRecorder()
    monkeypatch.setattr(gdn_variants, "launch", r)
    return r


def _fake_loaded(built, name, arch="sm_90a"):
    return fake_loaded(BY_NAME[name], _manifest(built, name, arch))


def _dev(nbytes, ptr):
    return DeviceBuffer(ptr, nbytes, "buf")


@pytest.mark.parametrize("arch", ARCHS)
def test_conv_launcher_packs_and_grids(built, rec, arch):
    k = GdnConv(_fake_loaded(built, "gdn_conv", arch))
    b, c, ns, xs = 3, 10240, 5, 10240 + 64
    x, st, w = _dev(b * xs * 2, 1 << 20), _dev(ns * 3 * c * 2, 1 << 24), _dev(4 * c * 2, 1 << 26)
    slots, out = _dev(b * 4, 1 << 27), _dev(b * c * 2, 1 << 28)
    k(x, st, w, slots, out, b, c, ns, x_stride=xs)
    grid, block, params, smem = rec.calls[-1]
    assert grid == (10, 3, 1) and block == (128, 1, 1) and smem == 0
    assert params.raw("x") == struct.pack("<Qiiq", x.ptr, b, c, xs)
    assert params.raw("conv_state") == struct.pack("<Qiiqq", st.ptr, ns, c, 3 * c, c)
    assert params.raw("conv_w") == struct.pack("<Qiiq", w.ptr, c, 0, c)
    assert params.raw("slots") == struct.pack("<Qii", slots.ptr, b, 0)
    assert params.raw("out") == struct.pack("<Qiiq", out.ptr, b, c, c)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("hk,hv", [(16, 48), (16, 32)])
def test_step_launcher_packs_and_grids(built, rec, arch, hk, hv):
    k = GdnStep(_fake_loaded(built, "gdn_step", arch))
    b, ns, d = 4, 6, 128
    cq, zw = 2 * hk * d + hv * d, hv * d
    # a and b live inside one fused [B, 2 * Hv] projection output: row stride 2 * Hv, b at +Hv.
    ab = _dev(b * 2 * hv * 2, 1 << 30)
    bufs = dict(qkv=_dev(b * cq * 2, 1 << 20), z=_dev(b * zw * 2, 1 << 22), a=ab,
                b=DeviceBuffer(ab.ptr + hv * 2, ab.nbytes - hv * 2, "b"),
                a_log=_dev(hv * 4, 1 << 23), dt_bias=_dev(hv * 4, (1 << 23) + 4096),
                norm_w=_dev(d * 2, 1 << 24), state=_dev(ns * hv * d * d * 4, 1 << 32),
                slots=_dev(b * 4, 1 << 25), out=_dev(b * zw * 2, 1 << 26))
    k(*bufs.values(), b, hk, hv, ns, 1e-6, a_stride=2 * hv, b_stride=2 * hv)
    grid, block, params, smem = rec.calls[-1]
    assert grid == (hv, b, 1) and block == (256, 1, 1) and smem > 0
    p = {n: bufs[n].ptr for n in bufs}
    assert params.raw("qkv") == struct.pack("<Qiiq", p["qkv"], b, cq, cq)
    assert params.raw("z") == struct.pack("<Qiiq", p["z"], b, zw, zw)
    assert params.raw("a") == struct.pack("<Qiiq", p["a"], b, hv, 2 * hv)
    assert params.raw("b") == struct.pack("<Qiiq", p["b"], b, hv, 2 * hv)
    assert params.raw("a_log") == struct.pack("<Qii", p["a_log"], hv, 0)
    assert params.raw("dt_bias") == struct.pack("<Qii", p["dt_bias"], hv, 0)
    assert params.raw("norm_w") == struct.pack("<Q", p["norm_w"])
    assert params.raw("state") == struct.pack("<Qii", p["state"], ns * hv, 0)
    assert params.raw("slots") == struct.pack("<Qii", p["slots"], b, 0)
    assert params.raw("out") == struct.pack("<Qiiq", p["out"], b, zw, zw)
    assert struct.unpack("<f", params.raw("eps"))[0] == pytest.approx(1e-6)


FUSED = [v.name for v in GDN_VARIANTS if v.op == "gdn_conv_step" and not v.config.get("sums")]


@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("hk,hv", [(16, 48), (16, 32)])
def test_conv_step_launcher_packs_grids_and_clusters(built, rec, name, hk, hv):
    k = GdnConvStep(_fake_loaded(built, name, "sm_90a"))
    splits, threads = k.config["splits"], k.config["threads"]
    b, ns, d = 3, 5, 128
    c, zw = 2 * hk * d + hv * d, hv * d
    row = c + zw + 2 * hv  # one fused projection row: x | z | a | b
    mix = _dev(b * row * 2, 1 << 20)
    bufs = dict(x=mix, conv_state=_dev(ns * 3 * c * 2, 1 << 24), conv_w=_dev(4 * c * 2, 1 << 25),
                z=DeviceBuffer(mix.ptr + c * 2, mix.nbytes - c * 2, "z"),
                a=DeviceBuffer(mix.ptr + (c + zw) * 2, mix.nbytes - (c + zw) * 2, "a"),
                b=DeviceBuffer(mix.ptr + (c + zw + hv) * 2, mix.nbytes - (c + zw + hv) * 2, "b"),
                a_log=_dev(hv * 4, 1 << 26), dt_bias=_dev(hv * 4, (1 << 26) + 4096), norm_w=_dev(d * 2, 1 << 27),
                state=_dev(ns * hv * d * d * 4, 1 << 32), slots=_dev(b * 4, 1 << 28), sync=_dev(b * hk * 4, 1 << 29),
                out=_dev(b * zw * 2, 1 << 30))
    k(*bufs.values(), b, hk, hv, ns, 1e-6, x_stride=row, z_stride=row, a_stride=row, b_stride=row)
    grid, block, params, smem = rec.calls[-1]
    assert grid == (splits, hv, b) and block == (threads, 1, 1) and smem > 0
    assert rec.clusters[-1] == ((splits, 1, 1) if splits > 1 else None)
    p = {n: bufs[n].ptr for n in bufs}
    assert params.raw("x") == struct.pack("<Qiiq", p["x"], b, c, row)
    assert params.raw("conv_state") == struct.pack("<Qiiqq", p["conv_state"], ns, c, 3 * c, c)
    assert params.raw("conv_w") == struct.pack("<Qiiq", p["conv_w"], c, 0, c)
    assert params.raw("z") == struct.pack("<Qiiq", p["z"], b, zw, row)
    assert params.raw("a") == struct.pack("<Qiiq", p["a"], b, hv, row)
    assert params.raw("b") == struct.pack("<Qiiq", p["b"], b, hv, row)
    assert params.raw("state") == struct.pack("<Qii", p["state"], ns * hv, 0)
    assert params.raw("sync") == struct.pack("<Qii", p["sync"], b * hk, 0)
    assert params.raw("out") == struct.pack("<Qiiq", p["out"], b, zw, zw)
    assert struct.unpack("<f", params.raw("eps"))[0] == pytest.approx(1e-6)


def test_conv_step_sums_takes_fp32_inputs(built, rec):
    """gdn_conv_step_sums: x and z are fp32 (an accumulating GEMV's sums): bf16-sized buffers are refused."""
    k = GdnConvStep(_fake_loaded(built, "gdn_conv_step_sums"))
    hk, hv, d, ns = 16, 48, 128, 2
    c, zw = 2 * hk * d + hv * d, hv * d
    big = _dev(64 << 20, 1 << 20)
    x, z = _dev(c * 4, 1 << 30), _dev(zw * 4, 1 << 31)
    k(x, big, big, z, *[big] * 9, 1, hk, hv, ns)
    p = rec.calls[-1][2]
    assert p.raw("x") == struct.pack("<Qiiq", x.ptr, 1, c, c) and p.raw("z") == struct.pack("<Qiiq", z.ptr, 1, zw, zw)
    with pytest.raises(LaunchError, match=f"x 'buf' has {c * 2} bytes, the call needs {c * 4}"):
        k(_dev(c * 2, 1 << 30), big, big, z, *[big] * 9, 1, hk, hv, ns)


def test_conv_step_refuses_a_short_sync_buffer(built, rec):
    k = GdnConvStep(_fake_loaded(built, "gdn_conv_step"))
    big = _dev(64 << 20, 1 << 20)
    args = [big] * 11 + [DeviceBuffer(1 << 20, 2 * 16 * 4 - 4, "sync"), big]
    with pytest.raises(LaunchError, match="sync 'sync' has 124 bytes, the call needs 128"):
        k(*args, 2, 16, 48, 2)
    with pytest.raises(LaunchError, match="v_heads = 40 must be a multiple of k_heads = 16"):
        k(*[big] * 13, 1, 16, 40, 1)
    assert rec.calls == []


def test_launchers_refuse_bad_arguments_before_the_driver(built, rec):
    conv = GdnConv(_fake_loaded(built, "gdn_conv"))
    big = _dev(64 << 20, 1 << 20)
    with pytest.raises(LaunchError, match="channels = 100 must be a multiple of 8"):
        conv(big, big, big, big, big, 1, 100, 1)
    with pytest.raises(LaunchError, match="conv_state 'small' has 16 bytes"):
        conv(big, DeviceBuffer(1 << 20, 16, "small"), big, big, big, 1, 1024, 2)
    with pytest.raises(LaunchError, match="x_stride 512 is less than the row width 1024"):
        conv(big, big, big, big, big, 2, 1024, 2, x_stride=512)
    with pytest.raises(LaunchError, match="x_stride = 1028 must be a multiple of 8"):
        conv(big, big, big, big, big, 2, 1024, 2, x_stride=1028)
    with pytest.raises(LaunchError, match="not 16-byte aligned"):
        conv(_dev(1 << 20, (1 << 20) + 8), big, big, big, big, 1, 1024, 1)
    with pytest.raises(LaunchError, match="batch must be >= 1"):
        conv(big, big, big, big, big, 0, 1024, 1)
    with pytest.raises(LaunchError, match="must be a DeviceBuffer"):
        conv(big.ptr, big, big, big, big, 1, 1024, 1)
    step = GdnStep(_fake_loaded(built, "gdn_step"))
    with pytest.raises(LaunchError, match="v_heads = 40 must be a multiple of k_heads = 16"):
        step(*[big] * 10, 1, 16, 40, 1)
    with pytest.raises(LaunchError, match="state 'small'"):
        step(*[big] * 7, DeviceBuffer(1 << 20, 48 * 128 * 128 * 4, "small"), big, big, 1, 16, 48, 2)
    with pytest.raises(LaunchError, match="'eps' expects f32"):
        step(*[big] * 10, 1, 16, 48, 1, "1e-6")
    with pytest.raises(LaunchError, match="needs a 'gdn_step' kernel"):
        GdnStep(_fake_loaded(built, "gdn_conv"))
    assert rec.calls == []
