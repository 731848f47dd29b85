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
from inferno.kernels.manifest import Manifest, grid_symbols

ARCHS = ("sm_90a", "sm_120a")
SMEM_LIMIT = {"sm_90a": 232448, "sm_120a": 101376}
PAIRS = [(v.name, a) for v in av.ATTN_VARIANTS for a in v.archs]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("cutlass.cute", reason="CuTe DSL not installed (pip install -e '.[kernels]')")
    from inferno.kernels.build import build_all

    root = tmp_path_factory.mktemp("attn_kernels")
    build_all(list(av.ATTN_VARIANTS), list(ARCHS), root, progress=None)
    return root


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
        assert _manifest(built, "attn_combine_serial", arch).block == [64, 1, 1]
        for v in av.DECODE_VARIANTS:
            m = _manifest(built, v.name, arch)
            g, t = v.config["group"], v.config["block"]
            assert m.block == [256, 1, 1]
            # q, scores, probabilities (G x 256 / T / T fp32), m/l/alpha, and either the 8-warp
            # reduction buffer (registers kernel) or two K + two V stages of T bf16 rows that the
            # reduction buffer overlays (pipelined kernel)
            stages = 8 * 256 * 4 if v.cls == "AttnDecode" else 2 * 2 * t * 512
            need = 4 * (g * 256 + 2 * g * t + 3 * g) + stages
            assert need <= m.smem <= need + 256  # plus alignment padding
            if v.cls == "AttnDecodePipelined" and arch == "sm_90a":
                assert v.config["ctas_per_sm"] * m.smem <= SMEM_LIMIT[arch] - 2048  # the CTAs fit side by side


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
    m = _manifest(built, "attn_qk_prep", "sm_120a")
    assert [p.name for p in m.params] == ["qg", "k", "v", "q_norm", "k_norm", "positions", "lens", "page_table",
                                          "kv", "q", "eps", "rope_theta"]
    assert [p.size for p in m.params] == [24, 24, 24, 8, 8, 16, 16, 24, 24, 24, 4, 4]


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


def _bufs():
    kb = 1 << 20
    return dict(
        qg=_buf(0x10000000, B * HQ * 512 * 2, "qg"), k=_buf(0x11000000, B * HKV * 256 * 2, "k"),
        v=_buf(0x12000000, B * HKV * 256 * 2, "v"), qn=_buf(0x13000000, 512, "qn"), kn=_buf(0x13001000, 512, "kn"),
        pos=_buf(0x14000000, B * 4, "pos"), lens=_buf(0x14001000, B * 4, "lens"),
        pt=_buf(0x14002000, B * W * 4, "pt"), kv=_buf(0x20000000, N_POOL * LAY.page_bytes + 100, "kv"),
        q=_buf(0x15000000, B * HQ * 256 * 4, "q"), po=_buf(0x16000000, B * HQ * S * 1024, "po"),
        pl=_buf(0x17000000, B * HQ * S * 4, "pl"), out=_buf(0x18000000, B * HQ * 256 * 2 + kb, "out"))


def test_prep_launcher_packs_manifest_layout(built, recorder):
    k = av.AttnQkPrep(_loaded(built, "attn_qk_prep"))
    d = _bufs()
    k(d["qg"], d["k"], d["v"], d["qn"], d["kn"], d["pos"], d["lens"], d["pt"], d["kv"], d["q"],
      batch=B, n_heads=HQ, n_kv_heads=HKV, table_width=W, eps=1e-5, rope_theta=1e7)
    kernel, grid, block, params, smem = recorder.calls[-1]
    assert kernel == "kernel:attn_qk_prep" and block == [128, 1, 1] and smem == 0
    assert grid == (-(-(HQ + HKV) // 4), B, 1)
    rows = N_POOL * LAY.rows_per_page
    want = {"qg": _tensor(0x10000000, (B, HQ * 512), (HQ * 512,)), "k": _tensor(0x11000000, (B, 1024), (1024,)),
            "v": _tensor(0x12000000, (B, 1024), (1024,)), "q_norm": _tensor(0x13000000),
            "k_norm": _tensor(0x13001000), "positions": _tensor(0x14000000, (B,)),
            "lens": _tensor(0x14001000, (B,)), "page_table": _tensor(0x14002000, (B, W), (W,)),
            "kv": _tensor(0x20000000, (rows,), (256,)), "q": _tensor(0x15000000, (B, HQ), (HQ * 256,)),
            "eps": struct.pack("<f", 1e-5), "rope_theta": struct.pack("<f", 1e7)}
    for p in k.loaded.manifest.params:
        assert params.raw(p.name) == want[p.name], p.name


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
    comb(d["po"], d["pl"], d["lens"], d["qg"], d["out"], batch=B, n_heads=HQ, splits=S, out_stride=HQ * 256 + 8)
    _, grid, block, params, _ = recorder.calls[-1]
    assert grid == (HQ, B, 1) and block == [512, 1, 1]
    assert params.raw("out") == _tensor(0x18000000, (B, HQ * 256), (HQ * 256 + 8,))
    assert params.raw("qg") == _tensor(0x10000000, (B, HQ * 512), (HQ * 512,))


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
    with pytest.raises(LaunchError, match="qg_stride"):
        prep(d["qg"], d["k"], d["v"], d["qn"], d["kn"], d["pos"], d["lens"], d["pt"], d["kv"], d["q"],
             batch=B, n_heads=HQ, n_kv_heads=HKV, table_width=W, qg_stride=HQ * 512 - 8)
    with pytest.raises(LaunchError, match="not 16-byte aligned"):
        prep(_buf(0x10000008, B * HQ * 1024, "qg"), d["k"], d["v"], d["qn"], d["kn"], d["pos"], d["lens"],
             d["pt"], d["kv"], d["q"], batch=B, n_heads=HQ, n_kv_heads=HKV, table_width=W)
    assert not recorder.calls


def test_decode_variant_choice():
    assert av.decode_variant(24, 4).name == "attn_decode_g6"
    assert av.decode_variant(16, 2).name == "attn_decode_g8"
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
