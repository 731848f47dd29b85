"""CPU: kernel variants build for sm_90a and sm_120a, and their manifests are complete and consistent.

Building all ~530 (variant, arch) pairs is most of the suite's time on 2 cores, so by default the manifest
check covers, per arch and kernel class, the fewest variants whose configs together hold every config value
of that class (every bit width, epilogue, stage count, ... compiles at least once); the other test modules
build the variants the engine launches in their own checks. `INFERNO_TEST_ALL_KERNELS=1` checks every pair.
"""

import dataclasses
import hashlib
import json
import os
import shutil
import struct
from pathlib import Path

import pytest

pytest.importorskip("cutlass.cute", reason="CuTe DSL not installed (pip install -e '.[kernels]')")

from inferno.cuda.image import cubin_entries, inspect_image  # noqa: E402
from inferno.cuda.params import ParamLayout, ParamSpec, TensorArg  # noqa: E402
from inferno.kernels import cache  # noqa: E402
from inferno.kernels import build as kbuild  # noqa: E402
from inferno.kernels.manifest import Manifest, eval_grid, grid_symbols, kernel_sources, source_hash  # noqa: E402
from inferno.kernels.registry import ARCHS, VARIANTS, get  # noqa: E402

SMEM_LIMIT = {"sm_90a": 232448, "sm_120a": 101376}
USED_HERE = ("rmsnorm_1k", "rmsnorm_8k", "silu_mul", "embedding", "gemm_simt", "gemm_wgmma")  # by the tests below


def covering_pairs(variants) -> list[tuple[str, str]]:
    """(name, arch) pairs: per (arch, kernel class), greedily the variant holding the most config values not yet
    covered, until every (key, value) of that class's configs is covered; registry order breaks ties."""
    families: dict[tuple, list] = {}
    for v in variants:
        for a in v.archs:
            families.setdefault((a, v.source, v.cls), []).append(v)
    pairs = []
    for (arch, _, _), members in families.items():
        values = [{(k, repr(x)) for k, x in v.config.items()} for v in members]
        need = set().union(*values)
        while True:
            i = max(range(len(members)), key=lambda j: len(values[j] & need))
            pairs.append((members[i].name, arch))
            need -= values[i]
            if not need:
                break
    return pairs


ALL_PAIRS = [(v.name, a) for v in VARIANTS for a in v.archs]
PAIRS = ALL_PAIRS if os.environ.get("INFERNO_TEST_ALL_KERNELS") == "1" else sorted(
    set(covering_pairs(VARIANTS)) | {(n, a) for n in USED_HERE for a in get(n).archs}, key=ALL_PAIRS.index)


@pytest.fixture(scope="session")
def built(kernel_builds):
    """The PAIRS, built once for the whole test session (conftest.kernel_builds: other modules reuse them)."""
    for arch in ARCHS:
        kernel_builds([get(n) for n, a in PAIRS if a == arch], [arch])
    return kernel_builds([], [])


def test_covering_pairs_hold_every_config_value_of_each_class():
    pairs = covering_pairs(VARIANTS)
    held: dict[tuple, set] = {}
    for n, a in pairs:
        v = get(n)
        held.setdefault((a, v.source, v.cls), set()).update((k, repr(x)) for k, x in v.config.items())
    for v in VARIANTS:
        for a in v.archs:
            assert {(k, repr(x)) for k, x in v.config.items()} <= held[(a, v.source, v.cls)], (v.name, a)
    assert len(set(pairs)) < len(ALL_PAIRS) / 2


def _manifest(root, name, arch) -> Manifest:
    return Manifest.read(root / arch / f"{name}.json")


def test_every_op_builds_for_both_archs_and_prefers_wgmma_on_hopper():
    from inferno.kernels.registry import variant_for

    for op in {v.op for v in VARIANTS}:
        for arch in ARCHS:
            assert arch in variant_for(op, arch).archs
    assert variant_for("gemm", "sm_90a").name == "gemm_wgmma"
    assert variant_for("gemm", "sm_120a").name == "gemm_simt"


@pytest.mark.parametrize("name,arch", PAIRS)
def test_manifest_complete_and_consistent(built, name, arch):
    v = get(name)
    m = _manifest(built, name, arch)
    cubin = (built / arch / f"{name}.cubin").read_bytes()
    info = inspect_image(cubin)
    assert info.kind == "cubin" and info.arch == arch
    assert m.entry in cubin_entries(cubin)
    assert (m.variant, m.op, m.arch, m.source) == (v.name, v.op, arch, v.source)
    assert m.source_hash == source_hash(v.source_file, v.config)
    assert m.cubin_sha256 == hashlib.sha256(cubin).hexdigest()
    assert m.compiler.startswith("nvidia-cutlass-dsl ")
    assert m.config == v.config and m.cluster == [1, 1, 1]
    assert 32 <= m.block[0] * m.block[1] * m.block[2] <= 1024 and m.block[0] % 32 == 0
    assert 0 <= m.smem <= SMEM_LIMIT[arch]
    # Parameter layout: offsets agree with the driver-side layout, kinds carry what the launcher needs.
    specs = [ParamSpec(p.name, p.kind, p.size, p.align, len(p.dyn_shape) if p.kind == "tensor" else 0,
                       len(p.dyn_stride)) for p in m.params]
    assert list(ParamLayout(specs).offsets) == [p.offset for p in m.params]
    syms = set()
    for p in m.params:
        syms |= set(p.dyn_shape)
        if p.kind == "tma":
            assert p.of and len(p.tma["box"]) == 2 and p.tma["swizzle"] in (0, 32, 64, 128)
            assert p.tma["box"][0] * 2 <= max(p.tma["swizzle"], 256)
    assert grid_symbols(m.grid) <= syms | {"SMS"}
    assert cache.stale_reason(v, arch, built) is None


def test_gemm_wgmma_abi(built):
    m = _manifest(built, "gemm_wgmma", "sm_90a")
    assert [(p.name, p.kind, p.size) for p in m.params] == [
        ("a_tma", "tma", 128), ("a_shape", "bytes", 8), ("b_tma", "tma", 128), ("b_shape", "bytes", 8),
        ("c_tma", "tma", 128), ("c_shape", "bytes", 8), ("mma_accumulate", "bytes", 1)]
    tma = {p.of: p.tma for p in m.params if p.kind == "tma"}
    assert tma == {"a": {"box": [64, 128], "swizzle": 128}, "b": {"box": [64, 256], "swizzle": 128},
                   "c": {"box": [32, 128], "swizzle": 64}}
    assert m.block == [256, 1, 1] and m.smem > 48 * 1024
    assert eval_grid(m.grid, {"M": 1000, "N": 1000, "K": 264}) == (8 * 4, 1, 1)


def test_build_is_deterministic(built, tmp_path):
    kbuild.build_variant(get("silu_mul"), "sm_90a", tmp_path)
    a = (built / "sm_90a" / "silu_mul.cubin").read_bytes()
    assert (tmp_path / "sm_90a" / "silu_mul.cubin").read_bytes() == a


def test_stale_and_missing_kernels_name_the_build_command(built, tmp_path, monkeypatch):
    v = get("rmsnorm_8k")
    shutil.copytree(built / "sm_90a", tmp_path / "sm_90a")
    assert cache.stale_reason(v, "sm_90a", tmp_path) is None
    changed = dataclasses.replace(v, grid=("M", "1", "1"))
    assert "registry entry changed" in cache.stale_reason(changed, "sm_90a", tmp_path)
    js = tmp_path / "sm_90a" / "rmsnorm_8k.json"
    d = json.loads(js.read_text())
    d["source_hash"] = "0" * 64
    js.write_text(json.dumps(d))
    assert "stale" in cache.stale_reason(v, "sm_90a", tmp_path)
    monkeypatch.setattr(kbuild, "dsl_available", lambda: False)
    with pytest.raises(cache.KernelNotBuiltError) as e:
        cache.ensure_built(v, "sm_90a", tmp_path)
    assert f"inferno kernels build --arch sm_90a --out {tmp_path} --only rmsnorm_8k" in str(e.value)
    (tmp_path / "sm_90a" / "silu_mul.cubin").unlink()
    assert "not built" in cache.stale_reason(get("silu_mul"), "sm_90a", tmp_path)
    monkeypatch.undo()
    cache.ensure_built(v, "sm_90a", tmp_path)  # the DSL is here: rebuilt in place
    assert cache.stale_reason(v, "sm_90a", tmp_path) is None


def test_refuses_arch_it_does_not_build_for(tmp_path):
    with pytest.raises(kbuild.KernelBuildError, match="does not build for sm_120a"):
        kbuild.build_variant(get("gemm_wgmma"), "sm_120a", tmp_path)


def test_source_change_makes_kernel_stale(built, tmp_path, monkeypatch):
    v = get("embedding")
    shutil.copytree(built / "sm_120a", tmp_path / "sm_120a")
    src = tmp_path / "embedding.py"
    src.write_text(v.source_file.read_text() + "\n# edited\n")
    monkeypatch.setattr(type(v), "source_file", property(lambda self: src))
    assert "stale" in cache.stale_reason(v, "sm_120a", tmp_path)


def test_imported_kernel_module_is_part_of_the_source(tmp_path):
    """A kernel's hash covers the sibling modules it imports: the NVFP4 stream-K GEMV inherits its ring
    from gemv_mma_sk.py, which inherits from gemv_mma.py; an edit there changes the NVFP4 hash."""
    pkg = tmp_path / "cute_kernels"
    shutil.copytree(Path(get("gemm_wgmma").source_file).parent, pkg)
    src = pkg / "gemv_mma_nvfp4.py"
    assert [p.name for p in kernel_sources(src)] == ["gemv_mma_nvfp4.py", "gemv_mma.py", "gemv_mma_sk.py"]
    before = source_hash(src, {"bits": 4})
    (pkg / "gemv_mma.py").write_text((pkg / "gemv_mma.py").read_text() + "\n# edited\n")
    assert source_hash(src, {"bits": 4}) != before
    assert [p.name for p in kernel_sources(pkg / "rmsnorm.py")] == ["rmsnorm.py"]


# --- typed launchers, without a GPU: validation and packing up to the driver call ------------


class _Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, kernel, grid, block, params, smem, stream):
        self.calls.append((grid, tuple(block), params, smem))


class _Buf:
    """Stands in for a DeviceBuffer (the launchers check isinstance)."""


def _fake_loaded(built, name, arch="sm_90a"):
    from inferno.kernels.cache import LoadedKernel

    m = _manifest(built, name, arch)
    specs = [ParamSpec(p.name, p.kind, p.size, p.align, len(p.dyn_shape) if p.kind == "tensor" else 0,
                       len(p.dyn_stride)) for p in m.params]
    return LoadedKernel(get(name), m, None, ParamLayout(specs, name))


@pytest.fixture
def rec(monkeypatch):
    from inferno.kernels import launchers

    r = _Recorder()
    monkeypatch.setattr(launchers, "launch", r)
    return r


def _dev(nbytes, ptr=1 << 20):
    from inferno.cuda.memory import DeviceBuffer

    return DeviceBuffer(ptr, nbytes, "buf")


def test_rmsnorm_launcher_packs_and_grids(built, rec):
    from inferno.kernels.launchers import RMSNorm

    k = RMSNorm(_fake_loaded(built, "rmsnorm_1k"))
    x, w, y = _dev(130 * 256 * 2), _dev(512, 1 << 22), _dev(130 * 256 * 2, 1 << 24)
    k(x, w, y, 130, 256, 1e-5)
    grid, block, params, smem = rec.calls[0]
    from inferno.kernels.registry import NORM_CTAS_PER_SM

    assert grid == (NORM_CTAS_PER_SM, 1, 1) and block == (128, 1, 1)  # min(cdiv(130, 4), 1 SM x k CTAs)
    k.loaded.sm_count = 132
    k(x, w, y, 130, 256, 1e-5)
    assert rec.calls[-1][0] == (33, 1, 1)
    assert params.raw("x") == struct.pack("<Qiiq", x.ptr, 130, 256, 256)
    assert params.raw("w") == struct.pack("<Qii", w.ptr, 256, 0)
    assert struct.unpack("<f", params.raw("eps"))[0] == pytest.approx(1e-5)


def test_launchers_refuse_bad_arguments_before_the_driver(built, rec):
    from inferno.cuda.errors import LaunchError
    from inferno.kernels.launchers import Embedding, Gemm, RMSNorm, SiluMul

    k = RMSNorm(_fake_loaded(built, "rmsnorm_8k"))
    x = _dev(4 * 5120 * 2)
    with pytest.raises(LaunchError, match="multiple of 8"):
        k(x, x, x, 4, 5124)
    with pytest.raises(LaunchError, match="exceeds its maximum 8192"):
        k(x, x, x, 1, 8200)
    with pytest.raises(LaunchError, match="the call needs"):
        k(x, x, x, 5, 5120)
    with pytest.raises(LaunchError, match="DeviceBuffer"):
        k(_Buf(), x, x, 4, 5120)
    with pytest.raises(LaunchError, match="not 16-byte aligned"):
        k(_dev(4 * 5120 * 2, (1 << 20) + 8), x, x, 4, 5120)
    with pytest.raises(LaunchError, match="rows must be >= 1"):
        k(x, x, x, 0, 5120)
    with pytest.raises(LaunchError, match="'eps' expects f32"):
        k(x, x, x, 4, 5120, "1e-6")
    with pytest.raises(LaunchError, match="rmsnorm"):
        SiluMul(_fake_loaded(built, "rmsnorm_8k"))
    s = SiluMul(_fake_loaded(built, "silu_mul"))
    with pytest.raises(LaunchError, match="inter = 12 must be a multiple of 8"):
        s(x, x, 2, 12)
    e = Embedding(_fake_loaded(built, "embedding"))
    with pytest.raises(LaunchError, match="table"):
        e(x, _dev(100), x, 4, 1000, 64)
    g = Gemm(_fake_loaded(built, "gemm_simt"))
    with pytest.raises(LaunchError, match="k = 12 must be a multiple of 8"):
        g(x, x, x, 4, 4, 12)
    assert rec.calls == []


def test_gemm_launchers_pack_tma_and_tensors(built, rec, monkeypatch):
    from inferno.cuda import tma
    from inferno.kernels.launchers import Gemm

    encoded = []

    def fake_encode(dtype, ptr, dims, strides, box, swizzle):
        encoded.append((dtype, ptr, list(dims), list(strides), list(box), swizzle))
        return bytes([len(encoded)]) * 128

    monkeypatch.setattr(tma, "encode_tiled", fake_encode)
    a, b, c = _dev(100 * 72 * 2, 1 << 20), _dev(136 * 72 * 2, 1 << 24), _dev(100 * 136 * 2, 1 << 28)
    Gemm(_fake_loaded(built, "gemm_wgmma"))(a, b, c, 100, 136, 72)
    grid, block, params, smem = rec.calls[-1]
    assert grid == (1, 1, 1) and block == (256, 1, 1) and smem > 48 * 1024
    assert encoded == [("bf16", a.ptr, [72, 100], [144], [64, 128], 128),
                       ("bf16", b.ptr, [72, 136], [144], [64, 256], 128),
                       ("bf16", c.ptr, [136, 100], [272], [32, 128], 64)]
    assert params.raw("b_shape") == struct.pack("<ii", 136, 72)
    assert params.raw("mma_accumulate") == b"\0"
    Gemm(_fake_loaded(built, "gemm_simt", "sm_120a"))(a, b, c, 100, 136, 72)
    grid, block, params, smem = rec.calls[-1]
    assert grid == (3, 2, 1)
    assert params.raw("a") == struct.pack("<Qiiq", a.ptr, 100, 72, 72)


def test_grid_rules():
    assert eval_grid(["cdiv(M, 4)", "T", "1"], {"M": 9, "T": 3}) == (3, 3, 1)
    assert eval_grid(["cdiv(M, 128) * cdiv(N, 256)", "max(1, K // 8)", "min(2, 5)"],
                     {"M": 129, "N": 256, "K": 7}) == (2, 1, 2)
    from inferno.kernels.manifest import ManifestError

    with pytest.raises(ManifestError, match="needs 'Q'"):
        eval_grid(["Q", "1", "1"], {})
    with pytest.raises(ManifestError, match="unsupported"):
        eval_grid(["__import__('os')", "1", "1"], {})


def test_ptx_entry_parser():
    from inferno.kernels.manifest import ptx_entries

    ptx = """
.visible .entry k0(
\t.param .align 64 .b8 k0_param_0[128],
\t.param .align 4 .b8 k0_param_1[8],
\t.param .f32 k0_param_2,
\t.param .u64 k0_param_3
)
.reqntid 256, 1, 1
{
}
.visible .entry k1()
.maxntid 128, 1, 1
{
}"""
    e = ptx_entries(ptx)
    assert [x.name for x in e] == ["k0", "k1"]
    assert e[0].params == [(128, 64), (8, 4), (4, 4), (8, 8)] and e[0].reqntid == (256, 1, 1)
    assert e[1].params == [] and e[1].reqntid is None


def test_tensor_param_sizes_match_driver_layout():
    from inferno.cuda.params import tensor_layout
    from inferno.kernels.registry import Tensor

    for ns in range(4):
        for nst in range(3):
            t = Tensor("t", "bf16", tuple(f"s{i}" for i in range(ns)) or (1,),
                       tuple(f"d{i}" for i in range(nst)) or (1,))
            assert kbuild.tensor_param_size(t) == tensor_layout(ns, nst)[0]
    assert TensorArg(1, (2,), ()).ptr == 1
