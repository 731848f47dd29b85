"""CPU: gated-attention decode kernels build for sm_90a and sm_120a, their manifests match the
registry entries, the launchers pack exactly the manifest's parameter layout, and the paged KV
layout helpers are consistent."""

import hashlib
import struct

import numpy as np
import pytest

from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import DeviceBuffer
from inferno.cuda.params import ParamLayout, ParamSpec
from inferno.kernels import attn_variants as av
from inferno.kernels import launchers
from inferno.kernels.cache import LoadedKernel
from inferno.kernels.kv_layout import KVLayout, KVLayoutError, page_table
from inferno.kernels.reference import rel_error
from inferno.kernels.manifest import Manifest, grid_symbols

ARCHS = ("sm_90a", "sm_120a")
SMEM_LIMIT = {"sm_90a": 232448, "sm_120a": 101376}
PAIRS = [(v.name, a) for v in av.ATTN_VARIANTS for a in v.archs]


@pytest.fixture(scope="module")
def built(kernel_builds):
    return kernel_builds(av.ATTN_VARIANTS, ARCHS)


def _manifest(root, name, arch) -> Manifest:
    return Manifest.read(root / arch / f"{name}.json")


@pytest.mark.parametrize("name,arch", PAIRS)
def test_manifest_complete_and_consistent(built, name, arch):
    from inferno.cuda.image import cubin_entries, inspect_image
    from inferno.kernels.cache import stale_reason
    from inferno.kernels.manifest import source_hash

    v = av.attn_variant(name)
    m = _manifest(built, name, arch)
    cubin = (built / arch / f"{name}.cubin").read_bytes()
    info = inspect_image(cubin)
    assert info.kind == "cubin" and info.arch == arch
    assert m.entry in cubin_entries(cubin)
    assert (m.variant, m.op, m.arch, m.source, m.config) == (v.name, v.op, arch, v.source, v.config)
    assert m.source_hash == source_hash(v.source_file, v.config)
    assert m.cubin_sha256 == hashlib.sha256(cubin).hexdigest()
    assert 0 <= m.smem <= SMEM_LIMIT[arch]
    specs = [ParamSpec(p.name, p.kind, p.size, p.align, len(p.dyn_shape) if p.kind == "tensor" else 0,
                       len(p.dyn_stride)) for p in m.params]
    assert list(ParamLayout(specs).offsets) == [p.offset for p in m.params]
    assert grid_symbols(m.grid) <= {s for p in m.params for s in p.dyn_shape}
    assert stale_reason(v, arch, built) is None


def test_block_sizes_and_smem(built):
    for arch in ARCHS:
        assert _manifest(built, "attn_qk_prep", arch).block == [128, 1, 1]
        assert _manifest(built, "attn_combine", arch).block == [512, 1, 1]
        assert _manifest(built, "attn_combine_early", arch).block == [512, 1, 1]
        assert _manifest(built, "attn_combine_serial", arch).block == [64, 1, 1]
        assert _manifest(built, "attn_combine_2pass", arch).block == [512, 1, 1]
        for v in av.DECODE_VARIANTS:
            if arch not in v.archs:
                continue
            m = _manifest(built, v.name, arch)
            g, t = v.config["group"], v.config["block"]
            assert m.block == [256, 1, 1]
            stages = v.config.get("stages", 2) * 2 * t * 512  # K + V stages of T bf16 rows
            if v.cls == "AttnDecodeMma":
                # bf16 q [16, 264], bf16 P [16, 40] (hi and lo rows), fp32 partial scores [4, 8, T],
                # alpha/m/l [8] each
                need = stages + 16 * 264 * 2 + 16 * 40 * 2 + 4 * 8 * t * 4 + 3 * 8 * 4
                assert need <= m.smem <= need + 1024  # the struct rounds up to its 1 KiB alignment
            else:
                # q, scores, probabilities (G x 256 / T / T fp32), m/l/alpha, and either the 8-warp
                # reduction buffer (registers kernel) or the stages that the reduction buffer overlays
                need = 4 * (g * 256 + 2 * g * t + 3 * g) + (8 * 256 * 4 if v.cls == "AttnDecode" else stages)
                assert need <= m.smem <= need + 256  # plus alignment padding
            if v.cls != "AttnDecode" and arch == "sm_90a":
                assert v.config["ctas_per_sm"] * (m.smem + 1024) <= SMEM_LIMIT[arch]  # the CTAs fit side by side
        for v in av.FUSED_VARIANTS:  # AttnDecodeMma's storage + the new token's K and V rows (2 x 256 bf16)
            if arch not in v.archs:
                continue
            m = _manifest(built, v.name, arch)
            unfused = _manifest(built, f"attn_decode_g{v.config['group']}{'_s3' if v.config['stages'] == 3 else ''}",
                                arch)
            assert m.block == [256, 1, 1] and m.config["block"] == 32
            assert unfused.smem + 1024 <= m.smem <= unfused.smem + 2048
            if arch == "sm_90a":
                assert v.config["ctas_per_sm"] * (m.smem + 1024) <= SMEM_LIMIT[arch]


def test_param_abi(built):
    """Tensor params carry {ptr, i32 dynamic shapes, i64 dynamic strides}; names and order as declared."""
    m = _manifest(built, "attn_decode_g6", "sm_90a")
    assert [(p.name, p.kind, p.size, p.dyn_shape, p.dyn_stride) for p in m.params] == [
        ("q", "tensor", 24, ["B", "Hq"], ["q_sb"]),
        ("lens", "tensor", 16, ["B"], []),
        ("page_table", "tensor", 24, ["B", "P"], ["pt_stride"]),
        ("kv", "tensor", 24, ["KR"], ["kv_stride"]),
        ("part_o", "tensor", 40, ["B", "Hq", "S"], ["po_sb", "po_sh"]),
        ("part_lse", "tensor", 40, ["B", "Hq", "S"], ["pl_sb", "pl_sh"]),
        ("scale", "f32", 4, [], []),
    ]
    m = _manifest(built, "attn_decode_g6_fused", "sm_90a")  # prep's inputs, then decode's outputs
    assert [(p.name, p.size) for p in m.params] == [
        ("q_proj", 32), ("k", 24), ("v", 24), ("q_norm", 8), ("k_norm", 8), ("positions", 16), ("lens", 16),
        ("page_table", 24), ("kv", 24), ("q", 24), ("part_o", 40), ("part_lse", 40), ("scale", 4), ("eps", 4),
        ("rope_theta", 4)]
    m = _manifest(built, "attn_qk_prep", "sm_120a")
    assert [p.name for p in m.params] == ["q_proj", "k", "v", "q_norm", "k_norm", "positions", "lens", "page_table",
                                          "kv", "q", "eps", "rope_theta"]
    assert [p.size for p in m.params] == [32, 24, 24, 8, 8, 16, 16, 24, 24, 24, 4, 4]
    assert (m.params[0].dyn_shape, m.params[0].dyn_stride) == (["B", "Hq"], ["qp_sb", "qp_sh"])
    # the gate: own row and head strides
    for name in ("attn_combine", "attn_combine_early", "attn_combine_2pass", "attn_combine_serial"):
        m = _manifest(built, name, "sm_90a")
        assert [(p.name, p.size, p.dyn_shape, p.dyn_stride) for p in m.params][3:] == [
            ("gate", 32, ["B", "Hq"], ["gate_sb", "gate_sh"]), ("out", 24, ["B", "OD"], ["out_stride"])]


# --- launchers pack what the manifests declare ---------------------------------------------------

class _Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, kernel, grid, block, params, smem, stream):
        self.calls.append((kernel, tuple(grid), list(block), params, smem))


@pytest.fixture
def recorder(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(launchers, "launch", rec)
    return rec


def _loaded(built, name, arch="sm_90a") -> LoadedKernel:
    m = _manifest(built, name, arch)
    specs = [ParamSpec(p.name, p.kind, p.size, p.align, len(p.dyn_shape) if p.kind == "tensor" else 0,
                       len(p.dyn_stride)) for p in m.params]
    return LoadedKernel(av.attn_variant(name), m, f"kernel:{name}", ParamLayout(specs, name))


def _buf(addr, nbytes, name):
    return DeviceBuffer(addr, nbytes, name)


def _tensor(ptr, shape=(), stride=()):
    pad = (-(8 + 4 * len(shape))) % 8 if stride else 0
    raw = struct.pack(f"<Q{len(shape)}i{pad}x{len(stride)}q", ptr, *shape, *stride)
    return raw + bytes(-len(raw) % 8)


B, HQ, HKV, W, S = 3, 24, 4, 20, 7
LAY = KVLayout(HKV)
N_POOL = 50


ROW = (HQ + HKV) * 256  # a [q | k] or [gate | v] projection row


def _bufs():
    kb = 1 << 20
    return dict(
        qp=_buf(0x10000000, B * ROW * 2, "q_proj"), gate=_buf(0x19000000, B * ROW * 2, "gate"),
        k=_buf(0x11000000, B * HKV * 256 * 2, "k"),
        v=_buf(0x12000000, B * HKV * 256 * 2, "v"), qn=_buf(0x13000000, 512, "qn"), kn=_buf(0x13001000, 512, "kn"),
        pos=_buf(0x14000000, B * 4, "pos"), lens=_buf(0x14001000, B * 4, "lens"),
        pt=_buf(0x14002000, B * W * 4, "pt"), kv=_buf(0x20000000, N_POOL * LAY.page_bytes + 100, "kv"),
        q=_buf(0x15000000, B * HQ * 256 * 4, "q"), po=_buf(0x16000000, B * HQ * S * 1024, "po"),
        pl=_buf(0x17000000, B * HQ * S * 4, "pl"), out=_buf(0x18000000, B * HQ * 256 * 2 + kb, "out"))


def test_prep_launcher_packs_manifest_layout(built, recorder):
    k = av.AttnQkPrep(_loaded(built, "attn_qk_prep"))
    d = _bufs()
    k(d["qp"], d["k"], d["v"], d["qn"], d["kn"], d["pos"], d["lens"], d["pt"], d["kv"], d["q"],
      batch=B, n_heads=HQ, n_kv_heads=HKV, table_width=W, eps=1e-5, rope_theta=1e7, q_head_stride=256, q_stride=ROW)
    kernel, grid, block, params, smem = recorder.calls[-1]
    assert kernel == "kernel:attn_qk_prep" and block == [128, 1, 1] and smem == 0
    assert grid == (-(-(HQ + HKV) // 4), B, 1)
    rows = N_POOL * LAY.rows_per_page
    want = {"q_proj": _tensor(0x10000000, (B, HQ), (ROW, 256)), "k": _tensor(0x11000000, (B, 1024), (1024,)),
            "v": _tensor(0x12000000, (B, 1024), (1024,)), "q_norm": _tensor(0x13000000),
            "k_norm": _tensor(0x13001000), "positions": _tensor(0x14000000, (B,)),
            "lens": _tensor(0x14001000, (B,)), "page_table": _tensor(0x14002000, (B, W), (W,)),
            "kv": _tensor(0x20000000, (rows,), (256,)), "q": _tensor(0x15000000, (B, HQ), (HQ * 256,)),
            "eps": struct.pack("<f", 1e-5), "rope_theta": struct.pack("<f", 1e7)}
    for p in k.loaded.manifest.params:
        assert params.raw(p.name) == want[p.name], p.name
    # the default reads the q halves of per-head [q | gate] rows (prefill's qg): head stride 512
    k(_buf(0x10000000, B * HQ * 1024, "qg"), d["k"], d["v"], d["qn"], d["kn"], d["pos"], d["lens"], d["pt"], d["kv"],
      d["q"], batch=B, n_heads=HQ, n_kv_heads=HKV, table_width=W)
    assert recorder.calls[-1][3].raw("q_proj") == _tensor(0x10000000, (B, HQ), (HQ * 512, 512))


def test_decode_and_combine_launchers_pack_manifest_layout(built, recorder):
    d = _bufs()
    dec = av.AttnDecode(_loaded(built, "attn_decode_g6"))
    dec(d["q"], d["lens"], d["pt"], d["kv"], d["po"], d["pl"], batch=B, n_heads=HQ, n_kv_heads=HKV,
        table_width=W, splits=S)
    _, grid, block, params, smem = recorder.calls[-1]
    assert grid == (S, HKV, B) and block == [256, 1, 1] and smem == dec.loaded.manifest.smem > 0
    assert params.raw("part_o") == _tensor(0x16000000, (B, HQ, S), (HQ * S * 256, S * 256))
    assert params.raw("part_lse") == _tensor(0x17000000, (B, HQ, S), (HQ * S, S))
    assert params.raw("kv") == _tensor(0x20000000, (N_POOL * LAY.rows_per_page,), (256,))
    assert params.raw("scale") == struct.pack("<f", 256 ** -0.5)

    comb = av.AttnCombine(_loaded(built, "attn_combine"))
    comb(d["po"], d["pl"], d["lens"], d["gate"], d["out"], batch=B, n_heads=HQ, splits=S, gate_stride=ROW,
         out_stride=HQ * 256 + 8)
    _, grid, block, params, _ = recorder.calls[-1]
    assert grid == (HQ, B, 1) and block == [512, 1, 1]
    assert params.raw("out") == _tensor(0x18000000, (B, HQ * 256), (HQ * 256 + 8,))
    assert params.raw("gate") == _tensor(0x19000000, (B, HQ), (ROW, 256))
    comb(d["po"], d["pl"], d["lens"], d["gate"], d["out"], batch=B, n_heads=HQ, splits=S)  # dense [B, Hq * 256]
    assert recorder.calls[-1][3].raw("gate") == _tensor(0x19000000, (B, HQ), (HQ * 256, 256))


def test_paged_attention_reads_the_projection_rows(built, recorder):
    """PagedAttention hands prep and combine q and gate where the GEMVs wrote them: [q | k] and
    [gate | v] rows (head stride 256, row stride Hq*256 + Hkv*256), k and v after them."""
    pa = av.PagedAttention.__new__(av.PagedAttention)  # the launchers of the built manifests, no device
    pa.n_heads, pa.n_kv_heads = HQ, HKV
    pa.prep, pa.decode, pa.combine = (av.AttnQkPrep(_loaded(built, "attn_qk_prep")),
                                      av.AttnDecode(_loaded(built, "attn_decode_g6")),
                                      av.AttnCombine(_loaded(built, "attn_combine")))
    d = _bufs()
    qw = HQ * 256 * 2
    k, v = d["qp"].view(qw, B * ROW * 2 - qw), d["gate"].view(qw, B * ROW * 2 - qw)
    scratch = _buf(0x30000000, pa.scratch_bytes(B, S), "scratch")
    pa(d["qp"], d["gate"], k, v, d["qn"], d["kn"], d["pos"], d["lens"], d["pt"], d["kv"], scratch, d["out"], batch=B,
       table_width=W, splits=S, q_stride=ROW, gate_stride=ROW, kv_stride=ROW)
    assert [c[0] for c in recorder.calls] == ["kernel:attn_qk_prep", "kernel:attn_decode_g6", "kernel:attn_combine"]
    prep_params, comb_params = recorder.calls[0][3], recorder.calls[2][3]
    assert prep_params.raw("q_proj") == _tensor(0x10000000, (B, HQ), (ROW, 256))
    assert prep_params.raw("k") == _tensor(0x10000000 + qw, (B, HKV * 256), (ROW,))
    assert prep_params.raw("v") == _tensor(0x19000000 + qw, (B, HKV * 256), (ROW,))
    assert comb_params.raw("gate") == _tensor(0x19000000, (B, HQ), (ROW, 256))


def test_fused_launcher_packs_manifest_layout(built, recorder):
    d = _bufs()
    qw = HQ * 256 * 2
    k, v = d["qp"].view(qw, B * ROW * 2 - qw), d["gate"].view(qw, B * ROW * 2 - qw)
    dec = av.AttnDecodeFused(_loaded(built, "attn_decode_g6_fused"))
    dec(d["qp"], k, v, d["qn"], d["kn"], d["pos"], d["lens"], d["pt"], d["kv"], d["q"], d["po"], d["pl"], batch=B,
        n_heads=HQ, n_kv_heads=HKV, table_width=W, splits=S, eps=1e-5, rope_theta=5e6, q_stride=ROW, kv_stride=ROW)
    kernel, grid, block, params, smem = recorder.calls[-1]
    assert kernel == "kernel:attn_decode_g6_fused" and grid == (S, HKV, B) and block == [256, 1, 1]
    assert smem == dec.loaded.manifest.smem > 0
    want = {"q_proj": _tensor(0x10000000, (B, HQ), (ROW, 256)), "k": _tensor(0x10000000 + qw, (B, 1024), (ROW,)),
            "v": _tensor(0x19000000 + qw, (B, 1024), (ROW,)), "q_norm": _tensor(0x13000000),
            "k_norm": _tensor(0x13001000), "positions": _tensor(0x14000000, (B,)),
            "lens": _tensor(0x14001000, (B,)), "page_table": _tensor(0x14002000, (B, W), (W,)),
            "kv": _tensor(0x20000000, (N_POOL * LAY.rows_per_page,), (256,)),
            "q": _tensor(0x15000000, (B, HQ), (HQ * 256,)),
            "part_o": _tensor(0x16000000, (B, HQ, S), (HQ * S * 256, S * 256)),
            "part_lse": _tensor(0x17000000, (B, HQ, S), (HQ * S, S)), "scale": struct.pack("<f", 256 ** -0.5),
            "eps": struct.pack("<f", 1e-5), "rope_theta": struct.pack("<f", 5e6)}
    for p in dec.loaded.manifest.params:
        assert params.raw(p.name) == want[p.name], p.name


def test_paged_attention_with_the_fused_decode(built, recorder):
    """A fused decode variant: two launches (no prep), the fused kernel reads the projection rows."""
    pa = av.PagedAttention.__new__(av.PagedAttention)
    pa.n_heads, pa.n_kv_heads = HQ, HKV
    pa.prep, pa.decode, pa.combine = (None, av.AttnDecodeFused(_loaded(built, "attn_decode_g6_fused")),
                                      av.AttnCombine(_loaded(built, "attn_combine")))
    d = _bufs()
    qw = HQ * 256 * 2
    k, v = d["qp"].view(qw, B * ROW * 2 - qw), d["gate"].view(qw, B * ROW * 2 - qw)
    scratch = _buf(0x30000000, pa.scratch_bytes(B, S), "scratch")
    pa(d["qp"], d["gate"], k, v, d["qn"], d["kn"], d["pos"], d["lens"], d["pt"], d["kv"], scratch, d["out"], batch=B,
       table_width=W, splits=S, q_stride=ROW, gate_stride=ROW, kv_stride=ROW)
    assert [c[0] for c in recorder.calls] == ["kernel:attn_decode_g6_fused", "kernel:attn_combine"]
    dec, comb = recorder.calls[0][3], recorder.calls[1][3]
    assert dec.raw("q_proj") == _tensor(0x10000000, (B, HQ), (ROW, 256))
    assert dec.raw("v") == _tensor(0x19000000 + qw, (B, HKV * 256), (ROW,))
    assert dec.raw("q") == _tensor(0x30000000, (B, HQ), (HQ * 256,))
    assert dec.raw("part_o") == comb.raw("part_o") and dec.raw("part_lse") == comb.raw("part_lse")
    assert comb.raw("gate") == _tensor(0x19000000, (B, HQ), (ROW, 256))


def test_fused_launcher_refuses_bad_arguments(built, recorder):
    d = _bufs()
    rest = (d["k"], d["v"], d["qn"], d["kn"], d["pos"], d["lens"], d["pt"], d["kv"], d["q"], d["po"], d["pl"])
    shape = dict(batch=B, n_heads=HQ, n_kv_heads=HKV, table_width=W, splits=S)
    with pytest.raises(LaunchError, match="group 6"):
        av.AttnDecodeFused(_loaded(built, "attn_decode_g8_fused"))(d["qp"], *rest, **shape)
    dec = av.AttnDecodeFused(_loaded(built, "attn_decode_g6_fused"))
    for bad, match in ((dict(splits=S + 1), "part_o"), (dict(q_stride=HQ * 256 - 8), "q_stride"),
                       (dict(kv_stride=1020), "kv_stride"), (dict(q_head_stride=128), "q_head_stride")):
        with pytest.raises(LaunchError, match=match):
            dec(d["qp"], *rest, **{**shape, **bad})
    assert not recorder.calls


def test_launchers_refuse_bad_arguments(built, recorder):
    d = _bufs()
    dec = av.AttnDecode(_loaded(built, "attn_decode_g8"))
    with pytest.raises(LaunchError, match="group 6"):
        dec(d["q"], d["lens"], d["pt"], d["kv"], d["po"], d["pl"], batch=B, n_heads=HQ, n_kv_heads=HKV,
            table_width=W, splits=S)
    dec6 = av.AttnDecode(_loaded(built, "attn_decode_g6"))
    with pytest.raises(LaunchError, match="part_o"):
        dec6(d["q"], d["lens"], d["pt"], d["kv"], d["po"], d["pl"], batch=B, n_heads=HQ, n_kv_heads=HKV,
             table_width=W, splits=S + 1)
    with pytest.raises(LaunchError, match="kv"):
        dec6(d["q"], d["lens"], d["pt"], _buf(0x20000000, LAY.page_bytes - 2, "kv"), d["po"], d["pl"],
             batch=B, n_heads=HQ, n_kv_heads=HKV, table_width=W, splits=S)
    prep = av.AttnQkPrep(_loaded(built, "attn_qk_prep"))
    rest = (d["k"], d["v"], d["qn"], d["kn"], d["pos"], d["lens"], d["pt"], d["kv"], d["q"])
    shape = dict(batch=B, n_heads=HQ, n_kv_heads=HKV, table_width=W)
    for bad, match in ((dict(q_head_stride=256, q_stride=HQ * 256 - 8), "q_stride = 6136 must be >= 6144"),
                       (dict(q_head_stride=128), "q_head_stride = 128 must be >= 256"),
                       (dict(q_head_stride=260), "q_head_stride = 260 .* multiple of 8"),
                       (dict(q_head_stride=512, q_stride=ROW), "q_stride"),
                       (dict(q_head_stride=256, q_stride=2 * ROW), "'q_proj' has .* bytes, the call needs")):
        with pytest.raises(LaunchError, match=match):
            prep(d["qp"], *rest, **shape, **bad)
    with pytest.raises(LaunchError, match="not 16-byte aligned"):
        prep(_buf(0x10000008, B * HQ * 1024, "qg"), *rest, **shape)
    comb = av.AttnCombine(_loaded(built, "attn_combine"))
    for bad, match in ((dict(gate_stride=HQ * 256 - 8), "gate_stride = 6136 must be >= 6144"),
                       (dict(gate_head_stride=252), "gate_head_stride"),
                       (dict(gate_head_stride=512, gate_stride=ROW), "gate_stride"),
                       (dict(gate_head_stride=256, gate_stride=2 * ROW), "'gate' has .* bytes, the call needs")):
        with pytest.raises(LaunchError, match=match):
            comb(d["po"], d["pl"], d["lens"], d["gate"], d["out"], batch=B, n_heads=HQ, splits=S, **bad)
    assert not recorder.calls


def test_decode_variant_choice():
    assert av.decode_variant(24, 4).name == "attn_decode_g6"
    assert av.decode_variant(16, 2).name == "attn_decode_g8"
    assert av.decode_variant(24, 4, fused=True).name == "attn_decode_g6_fused"
    assert av.decode_variant(16, 2, fused=True).cls == "AttnDecodeFused"
    assert av.attn_variant("attn_decode_g8_fused_s3").archs == ("sm_90a",)
    for g in av.GROUPS:  # tensor-core default, the previous pipelined kernel kept as a named fallback
        assert av.attn_variant(f"attn_decode_g{g}").cls == "AttnDecodeMma"
        assert av.attn_variant(f"attn_decode_g{g}_pipelined").cls == "AttnDecodePipelined"
    assert av.attn_variant("attn_decode_g6_s3").archs == ("sm_90a",)
    assert av.COMBINE.cls == "AttnCombineOnline" and av.attn_variant("attn_combine_2pass").cls == "AttnCombine"
    with pytest.raises(LaunchError, match="query heads per kv head"):
        av.decode_variant(16, 4)
    with pytest.raises(LaunchError, match="no attention kernel variant"):
        av.attn_variant("attn_decode_g5")


def test_default_splits():
    assert av.CTAS_PER_SM == 2
    assert av.default_splits(8192, 1, 4) == 66  # 2 x 132 SMs / 4 kv heads: one full wave
    assert av.default_splits(100, 1, 4) == 2  # never more splits than pages
    assert av.default_splits(8192, 8, 4) == 9
    assert av.default_splits(8192, 1, 2, sm_count=170) == 128  # RTX 5090: capped by the 128 pages
    assert av.default_splits(1, 8, 2) == 1
    assert av.partial_bytes(2, 24, 5) == (2 * 24 * 5 * 1024, 2 * 24 * 5 * 4)


# --- paged KV layout --------------------------------------------------------------------------------

def test_layout_sizes():
    assert KVLayout(4).page_bytes == 256 * 1024 and KVLayout(4).token_bytes * 16 == 64 * 1024
    assert KVLayout(2).page_bytes == 128 * 1024
    assert KVLayout(4).pages_for(64) == 1 and KVLayout(4).pages_for(65) == 2 and KVLayout(4).pages_for(0) == 0


def test_layout_write_gather_round_trip_with_scattered_pages():
    rng = np.random.default_rng(0)
    lay = KVLayout(2)
    pool = lay.empty_pool(9)
    pages = np.array([7, 2, 5], np.int32)
    k = rng.standard_normal((150, 2, 256)).astype(np.float32)
    v = rng.standard_normal((150, 2, 256)).astype(np.float32)
    lay.write(pool, pages, 0, k[:100], v[:100])
    lay.write(pool, pages, 100, k[100:], v[100:])
    gk, gv = lay.gather(pool, pages, 150)
    from ml_dtypes import bfloat16

    assert np.array_equal(gk, k.astype(bfloat16).astype(np.float32))
    assert np.array_equal(gv, v.astype(bfloat16).astype(np.float32))
    # row(): the flat [rows, 256] view the kernels use
    flat = pool.reshape(-1, 256)
    assert np.array_equal(flat[lay.row(5, 1, 1, 150 - 128 - 1)], pool[5, 1, 1, 21])
    assert np.array_equal(flat[lay.row(7, 0, 0, 3)].astype(np.float32), gk[3, 0])
    assert np.isnan(pool[5, 0, 0, 22:].astype(np.float32)).all()  # past the end stays poisoned
    assert np.isnan(pool[[0, 1, 3, 4, 6, 8]].astype(np.float32)).all()  # other pages untouched


def test_layout_errors_and_page_table():
    lay = KVLayout(4)
    pool = lay.empty_pool(3)
    with pytest.raises(KVLayoutError, match="grow the table"):
        lay.gather(pool, np.array([0], np.int32), 65)
    with pytest.raises(KVLayoutError, match="outside the pool"):
        lay.gather(pool, np.array([0, 3], np.int32), 65)
    with pytest.raises(KVLayoutError, match="does not match"):
        lay.gather(KVLayout(2).empty_pool(3), np.array([0], np.int32), 1)
    t = page_table([[4, 1], [0], []], width=3)
    assert t.dtype == np.int32 and t.tolist() == [[4, 1, -1], [0, -1, -1], [-1, -1, -1]]
    with pytest.raises(KVLayoutError, match="widen"):
        page_table([[1, 2, 3]], width=2)


# --- numpy emulation of the tensor-core decode kernel (AttnDecodeMma) ------------------------------
# The kernel's own index math, lane by lane: the PTX m16n8k16 fragment layouts (what ldmatrix hands
# each lane and where each accumulator lives), the warp split of S = Q K^T (token half w % 2, dims
# quarter w // 2) and of O = P V (warp pair p = w // 2 on dims 64p.., warp w on its n8 tiles w % 2,
# w % 2 + 2, ..), the partial-score buffer, the block / page walk and its pool rows, zero-filled
# stage rows, and the part_o / part_lse writes from the C fragments. It models the intended index
# math, not the addresses the DSL generates for it: test_kernels_attn_ptx.py checks those in the PTX.

_G_ID, _T_ID = np.arange(32) // 4, np.arange(32) % 4
_A_ROW = _G_ID[:, None] + 8 * ((np.arange(8) // 2) % 2)[None, :]  # a0..a7 of lane: rows g, g, g+8, g+8, ...
_A_COL = 2 * _T_ID[:, None] + (np.arange(8) % 2)[None, :] + 8 * (np.arange(8) // 4)[None, :]
_B_ROW = 2 * _T_ID[:, None] + (np.arange(4) % 2)[None, :] + 8 * (np.arange(4) // 2)[None, :]  # k index
_B_COL = np.broadcast_to(_G_ID[:, None], (32, 4))  # n index
_C_ROW = _G_ID[:, None] + 8 * (np.arange(4) // 2)[None, :]
_C_COL = 2 * _T_ID[:, None] + (np.arange(4) % 2)[None, :]


def _mma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """mma.sync m16n8k16 on lane fragments: a [32, 8], b [32, 4] (bf16 values), c [32, 4] fp32."""
    am, bm, cm = np.zeros((16, 16), np.float32), np.zeros((16, 8), np.float32), np.zeros((16, 8), np.float32)
    am[_A_ROW, _A_COL], bm[_B_ROW, _B_COL], cm[_C_ROW, _C_COL] = a, b, c
    return (am @ bm + cm)[_C_ROW, _C_COL]


def _pv_dim0(w: int, n: int) -> int:
    """First dim of warp w's n-th n8 tile of O = P V (the warp pair's 64-dim column, split by tiles)."""
    return 64 * (w // 2) + 8 * (w % 2 + 2 * n)


def _bf(x):
    from ml_dtypes import bfloat16

    return np.asarray(x, np.float32).astype(bfloat16).astype(np.float32)


def _emulate_cta(q, flat, table, length, splits, split, hkv, kvh, scale, new_kv=None):
    """One CTA (split, kv head) of AttnDecodeMma for one sequence: (part_o [G, 256], lse [G]) or None.
    new_kv (AttnDecodeFused): the new token's (k, v) rows; the pool's rows >= length - 1 are not read,
    the CTA of the last used split takes the new row from new_kv."""
    G, T, per_page = q.shape[0], 32, 2
    n_pages = -(-length // 64)
    pps = max(-(-n_pages // splits), 1)
    p_begin, p_end = split * pps, min(split * pps + pps, n_pages)
    used = -(-n_pages // pps)
    if p_begin >= p_end:
        return None
    fresh = new_kv is not None and split == used - 1
    qb = np.zeros((16, 256), np.float32)  # rows h: bf16 hi(q_h), rows 8 + h: bf16 lo = q_h - hi
    qb[:G] = _bf(q)
    qb[8:8 + G] = _bf(q - qb[:G])
    m, lsum = np.full(G, -np.inf, np.float32), np.zeros(G, np.float32)
    acc = np.zeros((8, 4, 32, 4), np.float32)  # [warp, its n8 tile, lane, c0..c3]
    for blk in range(p_begin * per_page, min(p_end * per_page, -(-length // T))):
        valid = length - blk * T
        page = int(table[blk // per_page])
        tile_k = (page * 2 * hkv + kvh) * per_page + blk % per_page
        assert tile_k * T == KVLayout(hkv).row(page, 0, kvh, blk % per_page * T)  # the kernel's K tile rows
        assert (tile_k + hkv * per_page) * T == KVLayout(hkv).row(page, 1, kvh, blk % per_page * T)
        sk = flat[tile_k * T:(tile_k + 1) * T].copy()
        sv = flat[(tile_k + hkv * per_page) * T:(tile_k + hkv * per_page + 1) * T].copy()
        sk[max(valid, 0):], sv[max(valid, 0):] = 0, 0  # rows past lens: zero-filled, never copied
        if new_kv is not None and 0 < valid <= T:  # fused: the new row is not copied from the pool
            sk[valid - 1] = sv[valid - 1] = np.nan
            if fresh:
                sk[valid - 1], sv[valid - 1] = new_kv
        s_part = np.full((4, 8, T), np.nan, np.float32)
        for w in range(8):
            tq, dq = w % 2, w // 2
            for n in range(2):
                c = np.zeros((32, 4), np.float32)
                for k in range(4):
                    d0 = dq * 64 + 16 * k
                    kt = sk[tq * 16 + 8 * n:tq * 16 + 8 * n + 8, d0:d0 + 16].T  # [k = dim, n = token]
                    c = _mma(qb[:, d0:d0 + 16][_A_ROW, _A_COL], kt[_B_ROW, _B_COL], c)
                hi = _C_ROW < 8  # c0, c1 (row g) + c2, c3 (row g + 8) of the same lane
                s_part[dq, _C_ROW[hi].reshape(32, 2), (tq * 16 + 8 * n + _C_COL[hi]).reshape(32, 2)] = \
                    c[hi].reshape(32, 2) + c[~hi].reshape(32, 2)
        s = s_part[:, :G].sum(0) * np.float32(scale * np.log2(np.e))
        s[:, max(valid, 0):] = -np.inf
        m_new = np.maximum(m, s.max(1))
        alpha = np.exp2(m - m_new)
        p = np.exp2(s - m_new[:, None])
        lsum, m = lsum * alpha + p.sum(1), m_new
        pb = np.zeros((16, T), np.float32)  # P hi and lo rows, as for q
        pb[:G] = _bf(p)
        pb[8:8 + G] = _bf(p - pb[:G])
        a16 = np.ones(16, np.float32)
        a16[:G] = a16[8:8 + G] = alpha
        for w in range(8):
            for n in range(4):
                c = acc[w, n] * a16[_C_ROW]
                for k in range(2):
                    vt = sv[16 * k:16 * k + 16, _pv_dim0(w, n):_pv_dim0(w, n) + 8]  # [k = token, n = dim]
                    c = _mma(pb[:, 16 * k:16 * k + 16][_A_ROW, _A_COL], vt[_B_ROW, _B_COL], c)
                acc[w, n] = c
    out = np.full((G, 256), np.nan, np.float32)
    written = np.zeros((G, 256), int)
    for w in range(8):
        for n in range(4):
            keep = _C_ROW < G  # row g holds hi, row g + 8 (c2, c3 of the lane) lo
            rows, cols = _C_ROW[keep], (_pv_dim0(w, n) + _C_COL)[keep]
            lo = acc[w, n][:, 2:][_C_ROW[:, :2] < G]
            out[rows, cols] = (acc[w, n][keep] + lo) / lsum[rows]
            np.add.at(written, (rows, cols), 1)
    assert (written == 1).all()  # every (head, dim) of the partial written exactly once
    return out, m + np.log2(lsum)


def _emulate_combine(lse: np.ndarray, o: np.ndarray, groups: int = 8, unroll: int = 8) -> np.ndarray:
    """AttnCombineOnline's merge of the used splits (lse [used, H], o [used, H, d]): per group a running
    maximum over loads of `unroll` splits (indices clamped to the last), then the groups rescaled to
    the largest maximum. An empty lse (idle lane) gives zeros."""
    used = lse.shape[0]
    m = np.full((groups,) + lse.shape[1:], -np.inf, np.float32)
    wsum, acc = np.zeros_like(m), np.zeros((groups,) + o.shape[1:], np.float32)
    for g in range(groups):
        for s0 in range(g, used, groups * unroll):
            idx = [min(s0 + u * groups, used - 1) for u in range(unroll)]
            m_new = np.maximum(m[g], lse[idx].max(0))
            c = np.exp2(m[g] - m_new)
            wsum[g], acc[g] = wsum[g] * c, acc[g] * c[..., None]
            for u, i in enumerate(idx):
                w = np.exp2(lse[i] - m_new) * (s0 + u * groups < used)
                wsum[g], acc[g] = wsum[g] + w, acc[g] + o[i] * w[..., None]
            m[g] = m_new
    top = m.max(0)
    top = np.where(top == -np.inf, 0, top)
    f = np.exp2(m - top)
    return (acc * f[..., None]).sum(0) / np.maximum((wsum * f).sum(0), 1)[..., None]


def _emulate_norm_rope(x, w, pos, theta, eps, rotary=64):
    """AttnDecodeFused's q / k prep of one head, lane by lane: lane l holds dims 8l..8l+7; the RoPE
    partner is lane l ^ (rotary / 16); the rotate-half sign sits in sin (negative on the first half of
    the rotary lanes); lanes past the rotary dims get cos 1, sin 0 (fp32 as the kernel)."""
    f32 = np.float32
    x = x.astype(f32).reshape(32, 8)
    y = x / np.sqrt((x.astype(np.float64) ** 2).sum() / 256 + eps) * (w.astype(f32).reshape(32, 8) + 1)
    lanes, e = np.arange(32)[:, None], np.arange(8)[None, :]
    j = (lanes * 8 + e) % (rotary // 2)
    angle = f32(pos) * np.exp2(j.astype(f32) * f32(-2.0 / rotary) * np.log2(f32(theta)))
    rot = np.broadcast_to(lanes < rotary // 8, (32, 8))
    cos = np.where(rot, np.cos(angle), 1).astype(f32)
    sin = np.where(rot, np.sin(angle), 0) * np.where(lanes < rotary // 16, -1, 1)
    partner = y[np.arange(32) ^ (rotary // 16)]
    return (y * cos + partner * sin.astype(f32)).reshape(256)


def test_fused_prep_lane_math_matches_reference():
    """The lane mapping of AttnDecodeFused's norm + RoPE (sign folded into sin) is NeoX RoPE on dims
    0..63 of the zero-centred RMSNorm, as the reference applies it."""
    rng = np.random.default_rng()
    x, w = rng.standard_normal(256), 0.5 * rng.standard_normal(256)
    for pos in (0, 1, 63, 7680, 65535):
        n = x / np.sqrt((x ** 2).mean() + 1e-6) * (1 + w)
        half = 32
        ang = pos * 1e7 ** (-2 * np.arange(half) / 64)
        want = n.copy()
        want[:half] = n[:half] * np.cos(ang) - n[half:64] * np.sin(ang)
        want[half:64] = n[half:64] * np.cos(ang) + n[:half] * np.sin(ang)
        # the fp32 angle is the only difference (~pos * 6e-8 rad), as in attn_qk_prep
        assert rel_error(_emulate_norm_rope(x, w, pos, 1e7, 1e-6), want) < 1e-6 + pos * 2e-8, pos


@pytest.mark.parametrize("lens,splits", [([1, 64, 65, 129], 3), ([7681], 66), ([97], 40), ([4000], 1)])
def test_fused_decode_emulation_appends_the_new_row(lens, splits):
    """AttnDecodeFused's split of the new token: only the last used split holds it (from registers via
    sNew, never from the pool, whose row is not written yet), every other CTA stops before it; the
    merged partials equal attention over history + the new k, v."""
    rng = np.random.default_rng()
    G, d, hkv = 6, 256, 4
    lay = KVLayout(hkv)
    need = [lay.pages_for(n) for n in lens]
    order = rng.permutation(sum(need) + 1)
    at, pages = 0, []
    for n in need:
        pages.append(order[at:at + n].tolist())
        at += n
    table = page_table(pages, max(need))
    pool = lay.empty_pool(sum(need) + 1)  # NaN everywhere, the new rows included
    for s, n in enumerate(lens):
        if n > 1:
            lay.write(pool, table[s], 0, rng.standard_normal((n - 1, hkv, d)).astype(np.float32),
                      rng.standard_normal((n - 1, hkv, d)).astype(np.float32))
    flat = pool.reshape(-1, d).astype(np.float32)
    for s, n in enumerate(lens):
        hist_k, hist_v = lay.gather(pool, table[s], n - 1) if n > 1 else (np.zeros((0, hkv, d)),) * 2
        for kvh in (0, hkv - 1):
            q = _bf(rng.standard_normal((G, d)))
            k_new, v_new = _bf(rng.standard_normal(d)), _bf(rng.standard_normal(d))
            parts = [_emulate_cta(q, flat, table[s], n, splits, i, hkv, kvh, d ** -0.5, (k_new, v_new))
                     for i in range(splits)]
            used = [p for p in parts if p is not None]
            assert all(np.isfinite(p[0]).all() for p in used)
            lse = np.stack([p[1] for p in used])
            w = np.exp2(lse - lse.max(0))
            o = (np.stack([p[0] for p in used]) * w[..., None]).sum(0) / w.sum(0)[:, None]
            keys = np.concatenate([hist_k[:, kvh], k_new[None]]).astype(np.float64)
            values = np.concatenate([hist_v[:, kvh], v_new[None]]).astype(np.float64)
            sc = q.astype(np.float64) @ keys.T * d ** -0.5
            pr = np.exp(sc - sc.max(1, keepdims=True))
            assert rel_error(o, (pr / pr.sum(1, keepdims=True)) @ values) < 1e-5, (n, kvh)


@pytest.mark.parametrize("lens,splits,hkv", [([1, 63, 64, 65], 3, 4), ([200, 0, 130], 2, 2), ([97], 40, 4),
                                             ([4000], 66, 4)])
def test_mma_decode_emulation_matches_reference(lens, splits, hkv):
    rng = np.random.default_rng()
    G, d = 6, 256
    lay = KVLayout(hkv)
    need = [lay.pages_for(n) for n in lens]
    order = rng.permutation(sum(need) + 2)
    at, pages = 0, []
    for n in need:
        pages.append(order[at:at + n].tolist())
        at += n
    table = page_table(pages, max(need) + 1)
    pool = lay.empty_pool(sum(need) + 2)  # NaN outside the cached tokens
    for s, n in enumerate(lens):
        if n:
            kw = 1 + 0.5 * rng.standard_normal(d)  # RMS-normed, (1 + w)-weighted keys like the real cache
            k = rng.standard_normal((n, hkv, d))
            k = k / np.sqrt((k ** 2).mean(-1, keepdims=True)) * kw
            lay.write(pool, table[s], 0, k.astype(np.float32), rng.standard_normal((n, hkv, d)).astype(np.float32))
    flat = pool.reshape(-1, d).astype(np.float32)
    scale = d ** -0.5
    assert not np.any(_emulate_combine(np.zeros((0, G), np.float32), np.zeros((0, G, d), np.float32)))  # idle
    for used in (1, 7, 9, 64, 65, 130):  # one or several loads per group, groups without splits
        lse = (rng.standard_normal((used, G)) * 20).astype(np.float32)
        o = rng.standard_normal((used, G, 8)).astype(np.float32)
        w = np.exp2(lse - lse.max(0))
        assert rel_error(_emulate_combine(lse, o), (o * w[..., None]).sum(0) / w.sum(0)[:, None]) < 1e-6
    for s, n in enumerate(lens):
        if not n:
            assert all(_emulate_cta(np.zeros((G, d), np.float32), flat, table[s], n, splits, i, hkv, 0, scale)
                       is None for i in range(splits))
            continue
        keys, values = lay.gather(pool, table[s], n)
        for kvh in range(hkv):
            q = rng.standard_normal((G, d))
            q = (q / np.sqrt((q ** 2).mean(-1, keepdims=True)) * (1 + 0.5 * rng.standard_normal(d))).astype(np.float32)
            parts = [_emulate_cta(q, flat, table[s], n, splits, i, hkv, kvh, scale) for i in range(splits)]
            used = [p for p in parts if p is not None]
            assert len(used) == -(-lay.pages_for(n) // max(-(-lay.pages_for(n) // splits), 1))
            lse = np.stack([p[1] for p in used])
            w = np.exp2(lse - lse.max(0))
            o = (np.stack([p[0] for p in used]) * w[..., None]).sum(0) / w.sum(0)[:, None]
            o_online = _emulate_combine(lse, np.stack([p[0] for p in used]))
            assert rel_error(o_online, o) < 1e-6
            sc = q.astype(np.float64) @ keys[:, kvh].astype(np.float64).T * scale
            pr = np.exp(sc - sc.max(1, keepdims=True))
            want = (pr / pr.sum(1, keepdims=True)) @ values[:, kvh].astype(np.float64)
            # q and P as bf16 hi + lo pairs, fp32 accumulation: fp32-level error (bf16 q alone: ~2e-3)
            assert rel_error(o, want) < 1e-5, (n, kvh, rel_error(o, want))
            lse_all = (lse.max(0) + np.log2(w.sum(0))) / np.log2(np.e)  # merged lse, natural log
            assert np.allclose(lse_all, sc.max(1) + np.log(pr.sum(1)), atol=2e-2)


def test_fused_decode_issues_q_before_its_second_block(built):
    """The fused decode's prologue split (attn_decode.PRE_WAIT): one KV block's copies (LDGSTS) before
    griddepcontrol.wait (ACQBULK), the other's after it, behind the first 16-byte load of q (or its sums) and
    ahead of the CTA's first barrier (the whole prologue before the wait has its first copies after it only in
    the block loop, past that barrier)."""
    import subprocess

    from test_kernels_gemv_mma import _cuobjdump

    tool = _cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    for v in av.FUSED_VARIANTS:
        sass = subprocess.run([tool, "-sass", str(built / "sm_90a" / f"{v.name}.cubin")], capture_output=True,
                              text=True, check=True).stdout
        wait = sass.index("ACQBULK")
        after = sass[wait:]
        assert "LDGSTS" in sass[:wait] and "LDGSTS" in after, v.name
        assert after.index("LDG.E.128") < after.index("LDGSTS") < after.index("BAR.SYNC"), v.name
