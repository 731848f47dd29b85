"""CPU: the GDN prefill kernels (gdn_conv_prefill, gdn_chunk and its vsplit variants) — their algebra
against A1's numpy reference (including the split-column solve and the cluster RMSNorm), builds for
sm_90a and sm_120a (tensor-core mma in the SASS, smem within the arch limit, registers without
spills), manifests consistent with the registry entries, launcher packing and argument checks."""

import hashlib
import struct

import numpy as np
import pytest
from gdn_prefill_emulation import chunk_kernel, inputs_to_heads

from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import DeviceBuffer
from inferno.cuda.params import ParamLayout, ParamSpec
from inferno.kernels.gdn_prefill_variants import (DEFAULT_VSPLIT, GDN_CHUNK_VSPLIT_VARIANTS, GDN_PREFILL_LAUNCHERS,
                                                  GDN_PREFILL_VARIANTS, VSPLITS, GdnChunk, GdnConvPrefill,
                                                  chunk_variant)
from inferno.kernels.manifest import Manifest, grid_symbols, source_hash
from inferno.kernels.registry import ARCHS, Tensor
from inferno.model.reference.gdn import causal_conv, chunked_delta_rule, recurrent_delta_rule
from inferno.model.reference.norms import gated_rms_norm
from kernel_fakes import LaunchRecorder, fake_loaded

SMEM_LIMIT = {"sm_90a": 232448, "sm_120a": 101376}
ALL = (*GDN_PREFILL_VARIANTS, *GDN_CHUNK_VSPLIT_VARIANTS)
BY_NAME = {v.name: v for v in ALL}
ALT_ARCHS = ("sm_90a",)  # the non-default vsplit variants are built for the H200 only (test time)
PAIRS = [(v.name, a) for v in GDN_PREFILL_VARIANTS for a in v.archs] + [
    (v.name, a) for v in GDN_CHUNK_VSPLIT_VARIANTS for a in ALT_ARCHS]
D = 128


def _rel(x, ref) -> float:
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def _heads(rng, t, hk=2, hv=6):
    qkv = rng.standard_normal((t, 2 * hk * D + hv * D), np.float32)
    a, b = rng.standard_normal((2, t, hv), np.float32)
    a_log = np.log(rng.uniform(1, 16, hv)).astype(np.float32)
    dt_bias = np.log(np.expm1(rng.uniform(1e-3, 0.1, hv))).astype(np.float32)
    state = 0.1 * rng.standard_normal((hv, D, D), np.float32)
    return inputs_to_heads(qkv, a, b, a_log, dt_bias, hk, hv), state


# --- the kernel's algebra (tests/gdn_prefill_emulation.py mirrors the kernel), no GPU -------------


@pytest.mark.parametrize("t", [1, 63, 64, 65, 200])
def test_chunk_algebra_matches_reference(t):
    """R = beta (v - exp(G) k S), one solve for v_new, k rescaled to the chunk end: exact in fp32."""
    rng = np.random.default_rng(t)
    (q, k, v, g, beta), state = _heads(rng, t)
    o_ref, s_ref = recurrent_delta_rule(q, k, v, g, beta, state)
    o, s = chunk_kernel(q, k, v, g, beta, state, round_bf16=False)
    print(f"t={t}: o rel {_rel(o, o_ref):.1e}  state rel {_rel(s, s_ref):.1e}")
    assert _rel(o, o_ref) < 1e-5 and _rel(s, s_ref) < 1e-5
    if t > 1:  # and A1's chunked form agrees with both
        o_c, s_c = chunked_delta_rule(q, k, v, g, beta, state)
        assert _rel(o, o_c) < 1e-5 and _rel(s, s_c) < 1e-5


def _split_solve(l_mat: np.ndarray, r_mat: np.ndarray, p: int) -> np.ndarray:
    """GdnChunk._solve_split on every column at once: lane r of a column holds x[p j + r] (zero until
    solved) and sums terms j < ceil(i / p) of row i in two alternating fp32 partials; a butterfly over
    the p lanes adds them; the owner lane stores x_i. Asserts every lane gets the same row sum."""
    c, ncol = r_mat.shape
    xs = np.zeros((p, c // p, ncol), np.float32)
    out = np.empty_like(r_mat)
    for i in range(c):
        lane = []
        for r in range(p):
            parts = [np.zeros(ncol, np.float32), np.zeros(ncol, np.float32)]
            for j in range((i + p - 1) // p):
                parts[j % 2] = parts[j % 2] + l_mat[i, p * j + r] * xs[r, j]
            lane.append(parts[0] + parts[1])
        off = 1
        while off < p:
            lane = [lane[r] + lane[r ^ off] for r in range(p)]
            off <<= 1
        assert all(np.array_equal(x, lane[0]) for x in lane)
        out[i] = r_mat[i] - lane[0]
        xs[i % p, i // p] = out[i]
    return out


@pytest.mark.parametrize("p", [2, 4])
def test_split_solve_matches_solve(p):
    """The value-split solve (p lanes per column, interleaved terms) solves (I + L) x = R."""
    rng = np.random.default_rng(p)
    k = rng.standard_normal((64, D), np.float32)
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    g = np.cumsum(-rng.uniform(0, 0.1, 64)).astype(np.float32)
    beta = rng.uniform(0, 1, 64).astype(np.float32)
    l_mat = np.tril(beta[:, None] * (k @ k.T) * np.exp(np.minimum(g[:, None] - g[None, :], 0)), -1)
    r_mat = rng.standard_normal((64, D // p), np.float32)
    x = _split_solve(l_mat.astype(np.float32), r_mat, p)
    ref = np.linalg.solve(np.eye(64) + l_mat.astype(np.float64), r_mat.astype(np.float64))
    assert _rel(x, ref) < 1e-5


@pytest.mark.parametrize("vs", [2, 4])
def test_split_rmsnorm_from_partial_sums(vs):
    """Per-CTA partial sums of o^2 over dv / vs columns, added in rank order, give the gated RMSNorm
    of the whole row when each CTA scales only its own columns."""
    rng = np.random.default_rng(vs)
    o = rng.standard_normal((64, D), np.float32)
    z = rng.standard_normal((64, D), np.float32)
    w = (1 + 0.2 * rng.standard_normal(D)).astype(np.float32)
    eps, dvs = 1e-6, D // vs
    parts = [np.sum(o[:, r * dvs:(r + 1) * dvs] ** 2, axis=1) for r in range(vs)]
    total = parts[0]
    for x in parts[1:]:
        total = total + x
    scale = 1 / np.sqrt(total / D + eps)
    y = np.concatenate([o[:, r * dvs:(r + 1) * dvs] * scale[:, None] * w[r * dvs:(r + 1) * dvs]
                        * z[:, r * dvs:(r + 1) * dvs] / (1 + np.exp(-z[:, r * dvs:(r + 1) * dvs]))
                        for r in range(vs)], axis=1)
    np.testing.assert_allclose(y, gated_rms_norm(o, z, w, eps), rtol=1e-5, atol=1e-6)


def test_bf16_operands_cost_well_under_the_gpu_tolerance():
    """The bf16 roundings of the tensor-core operands (q, k, S, A, v_new, k_d) over 4 chunks."""
    rng = np.random.default_rng(7)
    (q, k, v, g, beta), state = _heads(rng, 256)
    o_ref, s_ref = recurrent_delta_rule(q, k, v, g, beta, state)
    o, s = chunk_kernel(q, k, v, g, beta, state, round_bf16=True)
    print(f"bf16 operands: o rel {_rel(o, o_ref):.2e}  state rel {_rel(s, s_ref):.2e}")
    assert _rel(o, o_ref) < 5e-3 and _rel(s, s_ref) < 5e-3


def _conv_like_kernel(x, st, w, tokens_per_thread=16):
    """The conv kernel's indexing: token blocks, each sliding a window that starts in the state when
    the block starts before token K-1; the first block writes the new state."""
    t, c = x.shape
    taps = w.shape[0] - 1

    def raw(p):
        return x[p] if p >= 0 else st[p + taps]

    out = np.empty_like(x)
    for t0 in range(0, t, tokens_per_thread):
        win = [raw(t0 - taps + j) for j in range(taps)]
        for s in range(t0, min(t0 + tokens_per_thread, t)):
            out[s] = w[taps] * x[s] + sum(win[j] * w[j] for j in range(taps))
            win = win[1:] + [x[s]]
    return out, np.stack([raw(t - taps + j) for j in range(taps)])


@pytest.mark.parametrize("t", [1, 2, 3, 5, 16, 17, 40])
def test_conv_indexing_matches_reference(t):
    rng = np.random.default_rng(t)
    c = 16
    x = rng.standard_normal((t, c), np.float32)
    st = rng.standard_normal((3, c), np.float32)  # tap-major, tap 0 oldest
    w = rng.standard_normal((4, c), np.float32)  # tap-major
    out, new_st = _conv_like_kernel(x, st, w)
    ref, ref_st = causal_conv(x, st.T, w.T)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(new_st, ref_st.T)


# --- builds and manifests -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(kernel_builds):
    kernel_builds(GDN_PREFILL_VARIANTS, ARCHS)  # about 35 s when nothing else built them
    return kernel_builds(GDN_CHUNK_VSPLIT_VARIANTS, ALT_ARCHS)  # about 20 s


def _manifest(root, name, arch) -> Manifest:
    return Manifest.read(root / arch / f"{name}.json")


def test_variants_are_distinct_and_have_launchers():
    from inferno.kernels.gdn_variants import GDN_VARIANTS
    from inferno.kernels.registry import VARIANTS

    taken = {v.name for v in (*VARIANTS, *GDN_VARIANTS) if v not in ALL}
    assert len(BY_NAME) == len(ALL) and not taken & set(BY_NAME)
    assert {v.op for v in ALL} == set(GDN_PREFILL_LAUNCHERS)
    for v in ALL:
        assert set(v.archs) == set(ARCHS) and v.source_file.is_file()
    # one gdn_chunk in GDN_PREFILL_VARIANTS (the executor's), one variant per vsplit in all
    assert [v.name for v in GDN_PREFILL_VARIANTS if v.op == "gdn_chunk"] == ["gdn_chunk"]
    assert chunk_variant(DEFAULT_VSPLIT).name == "gdn_chunk"
    for n in VSPLITS:
        v = chunk_variant(n)
        assert v.config["vsplit"] == n and v.grid == (("Hv" if n == 1 else f"Hv * {n}"), "1", "1")
    assert sorted(chunk_variant(n).name for n in VSPLITS) == sorted(v.name for v in ALL if v.op == "gdn_chunk")
    with pytest.raises(LaunchError, match="vsplit = 3 is not one of"):
        chunk_variant(3)


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
    assert 0 <= m.smem <= SMEM_LIMIT[arch]
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


def _cuobjdump():
    import os
    import shutil

    tool = shutil.which("cuobjdump")
    if tool is None:
        try:
            import nvidia
        except ImportError:
            nvidia = None
        cand = [os.path.join(p, "cu13", "bin", "cuobjdump") for p in (nvidia.__path__ if nvidia else [])]
        tool = next((c for c in cand if os.path.exists(c)), None)
    if tool is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    return tool


@pytest.mark.parametrize("vs", VSPLITS)
def test_chunk_block_smem_and_tensor_cores(built, vs):
    """256 threads; q/k tiles + S (bf16, dv/vs columns) + L (fp32) + A (bf16) (+ the row partial sums)
    in smem; the products are HMMA; registers: no spills at vsplit 1 and 2 (at most 255 per thread, as
    one CTA per SM), at most 128 at vsplit 4 (two CTAs per SM) with only a few spilled loop
    invariants; cluster barriers exactly when the value dim is split."""
    import re
    import subprocess

    v = chunk_variant(vs)
    dvs = D // vs
    need = 2 * 64 * D * 2 + D * dvs * 2 + 64 * 64 * 4 + 64 * 64 * 2 + 2 * 64 * 4 + (2 * 64 * 4 if vs > 1 else 0)
    archs = ARCHS if v in GDN_PREFILL_VARIANTS else ALT_ARCHS
    for arch in archs:
        m = _manifest(built, v.name, arch)
        assert m.block == [256, 1, 1] and need <= m.smem <= SMEM_LIMIT[arch]
    tool = _cuobjdump()
    for arch in archs:
        cubin = str(built / arch / f"{v.name}.cubin")
        sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([tool, "--dump-resource-usage", cubin], capture_output=True, text=True,
                               check=True).stdout
        regs = int(re.search(r"REG:(\d+)", usage).group(1))
        hmma, ldsm = sass.count("HMMA.16816.F32.BF16"), sass.count("LDSM")
        spills = len(re.findall(r"\b(?:LDL|STL)\b", sass))
        print(f"{v.name} {arch}: {regs} registers, {spills} LDL/STL, {hmma} HMMA.16816.F32.BF16, {ldsm} LDSM")
        # Per warp and chunk: X S (128/vs) + X k^T (64) + A v_new (64/vs) + S update (64/vs) mma.sync.
        assert hmma == 64 + 256 // vs and ldsm > 0
        if vs == 1:
            assert regs <= 255 and spills <= 4  # the 16-byte stack of the original kernel
        elif vs == 2:
            assert regs <= 255 and spills == 0
        else:
            assert regs <= 128 and spills <= 32
        assert ("UCGABAR_ARV" in sass) == (vs > 1) and ("UCGABAR_WAIT" in sass) == (vs > 1)
        if vs > 1:  # the DSMEM reads of the partial sums (generic LD after mapa) follow the cluster wait
            dsmem = [m.start() for m in re.finditer(r"\bLD\.E\b", sass)]
            assert len(dsmem) == 2 * vs and min(dsmem) > sass.index("UCGABAR_WAIT")


# --- launchers without a GPU: packing and validation up to the driver call ----------------------


@pytest.fixture
def rec(monkeypatch):
    from inferno.kernels import launchers

    r = LaunchRecorder()
    monkeypatch.setattr(launchers, "launch", r)
    return r


def _fake_loaded(built, name, arch="sm_90a"):
    return fake_loaded(BY_NAME[name], _manifest(built, name, arch))


def _dev(nbytes, ptr):
    return DeviceBuffer(ptr, nbytes, "buf")


@pytest.mark.parametrize("arch", ARCHS)
def test_conv_launcher_packs_and_grids(built, rec, arch):
    k = GdnConvPrefill(_fake_loaded(built, "gdn_conv_prefill", arch))
    t, c, ns, xs, slot = 1000, 10240, 5, 10240 + 64, 3
    x, st, w = _dev(t * xs * 2, 1 << 30), _dev(ns * 3 * c * 2, 1 << 24), _dev(4 * c * 2, 1 << 26)
    out = _dev(t * c * 2, 1 << 32)
    k(x, st, w, out, t, c, ns, slot, x_stride=xs)
    grid, block, params, smem = rec.calls[-1]
    assert grid == (10, 63, 1) and block == (128, 1, 1) and smem == 0
    assert params.raw("x") == struct.pack("<Qiiq", x.ptr, t, c, xs)
    assert params.raw("conv_state") == struct.pack("<Qiiqq", st.ptr, ns, c, 3 * c, c)
    assert params.raw("conv_w") == struct.pack("<Qiiq", w.ptr, c, 0, c)
    assert params.raw("out") == struct.pack("<Qiiq", out.ptr, t, c, c)
    assert params.raw("slot") == struct.pack("<i", slot)


@pytest.mark.parametrize("name,arch", [p for p in PAIRS if BY_NAME[p[0]].op == "gdn_chunk"])
@pytest.mark.parametrize("hk,hv", [(16, 48), (16, 32)])
def test_chunk_launcher_packs_and_grids(built, rec, name, arch, hk, hv):
    k = GdnChunk(_fake_loaded(built, name, arch))
    vs = BY_NAME[name].config["vsplit"]
    t, ns, slot = 1024, 6, 5
    cq, zw = 2 * hk * D + hv * D, hv * D
    ab = _dev(t * 2 * hv * 2, 1 << 30)  # a and b inside one fused [T, 2 * Hv] projection output
    bufs = dict(qkv=_dev(t * cq * 2, 1 << 33), z=_dev(t * zw * 2, 1 << 34), a=ab,
                b=DeviceBuffer(ab.ptr + hv * 2, ab.nbytes - hv * 2, "b"),
                a_log=_dev(hv * 4, 1 << 23), dt_bias=_dev(hv * 4, (1 << 23) + 4096),
                norm_w=_dev(D * 2, 1 << 24), state=_dev(ns * hv * D * D * 4, 1 << 35),
                out=_dev(t * zw * 2, 1 << 36))
    k(*bufs.values(), t, hk, hv, ns, slot, 1e-6, a_stride=2 * hv, b_stride=2 * hv)
    grid, block, params, smem = rec.calls[-1]
    assert grid == (hv * vs, 1, 1) and block == (256, 1, 1) and smem > 48 * 1024
    assert rec.clusters[-1] == (vs, 1, 1)  # one cluster of vs CTAs per value head
    p = {n: bufs[n].ptr for n in bufs}
    assert params.raw("qkv") == struct.pack("<Qiiq", p["qkv"], t, cq, cq)
    assert params.raw("z") == struct.pack("<Qiiq", p["z"], t, zw, zw)
    assert params.raw("a") == struct.pack("<Qiiq", p["a"], t, hv, 2 * hv)
    assert params.raw("b") == struct.pack("<Qiiq", p["b"], t, hv, 2 * hv)
    assert params.raw("a_log") == struct.pack("<Qii", p["a_log"], hv, 0)
    assert params.raw("dt_bias") == struct.pack("<Qii", p["dt_bias"], hv, 0)
    assert params.raw("norm_w") == struct.pack("<Q", p["norm_w"])
    assert params.raw("state") == struct.pack("<Qii", p["state"], ns * hv, 0)
    assert params.raw("out") == struct.pack("<Qiiq", p["out"], t, zw, zw)
    assert params.raw("slot") == struct.pack("<i", slot)
    assert struct.unpack("<f", params.raw("eps"))[0] == pytest.approx(1e-6)


def test_launchers_refuse_bad_arguments_before_the_driver(built, rec):
    conv = GdnConvPrefill(_fake_loaded(built, "gdn_conv_prefill"))
    big = _dev(64 << 20, 1 << 20)
    other = _dev(64 << 20, 1 << 30)
    with pytest.raises(LaunchError, match="channels = 100 must be a multiple of 8"):
        conv(big, big, big, other, 1, 100, 1, 0)
    with pytest.raises(LaunchError, match="slot = 2 is outside the 2 state slots"):
        conv(big, big, big, other, 4, 1024, 2, 2)
    with pytest.raises(LaunchError, match="slot must be >= 0"):
        conv(big, big, big, other, 4, 1024, 2, -1)
    with pytest.raises(LaunchError, match="x and out overlap"):
        conv(big, other, other, big, 4, 1024, 2, 0)
    with pytest.raises(LaunchError, match="tokens must be >= 1"):
        conv(big, other, other, other, 0, 1024, 2, 0)
    with pytest.raises(LaunchError, match="x_stride = 1028 must be a multiple of 8"):
        conv(big, other, other, other, 2, 1024, 2, 0, x_stride=1028)
    chunk = GdnChunk(_fake_loaded(built, "gdn_chunk"))
    with pytest.raises(LaunchError, match="v_heads = 40 must be a multiple of k_heads = 16"):
        chunk(*[big] * 9, 1, 16, 40, 1, 0)
    with pytest.raises(LaunchError, match="state 'small'"):
        chunk(*[big] * 7, DeviceBuffer(1 << 20, 48 * 128 * 128 * 4, "small"), big, 1, 16, 48, 2, 1)
    with pytest.raises(LaunchError, match="qkv 'buf' has"):
        chunk(*[big] * 9, 4096, 16, 48, 1, 0)
    with pytest.raises(LaunchError, match="needs a 'gdn_chunk' kernel"):
        GdnChunk(_fake_loaded(built, "gdn_conv_prefill"))
    assert rec.calls == []
