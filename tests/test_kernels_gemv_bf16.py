"""bf16 GEMV on the CPU: the variant table, cubin builds for sm_90a and sm_120a (16-byte weight
loads in the PTX, the staged weight loads ahead of the PDL wait), and the launcher's checks,
packing and grid with the driver's launch recorded; the same for the folded-RMSNorm variant."""

import re
import struct

import numpy as np
import pytest

from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import DeviceBuffer
from inferno.kernels import gemv_bf16_variants as gb
from inferno.kernels.build import build_variant, dsl_available
from inferno.kernels.registry import get

needs_dsl = pytest.mark.skipif(not dsl_available(), reason="CuTe DSL not installed")


def test_variant_table():
    assert [v.name for v in gb.GEMV_BF16_VARIANTS] == [f"gemv_bf16_t{t}{e}" for e in ("", "_res", "_swiglu")
                                                       for t in (1, 2, 4, 8)] + ["gemv_bf16_t1_n", "gemv_bf16_t1_na"]
    assert gb.variant_name(1, "residual") == "gemv_bf16_t1_res"
    assert gb.variant_name(3, "swiglu") == "gemv_bf16_t4_swiglu"
    assert get("gemv_bf16_t1_swiglu").config["rows"] == 2  # gate + up rows of one output
    with pytest.raises(LaunchError, match="unknown GEMV epilogue"):
        gb.variant_name(1, "gelu")
    assert get("gemv_bf16_t4") is gb.GEMV_BF16_VARIANTS[2]  # registered
    assert gb.variant_name(3) == "gemv_bf16_t4" and gb.variant_name(8) == "gemv_bf16_t8"
    for bad in (0, 9):
        with pytest.raises(LaunchError, match="1..8 columns"):
            gb.variant_name(bad)
    assert gb.make_variant(1, rows=2, prefetch=2).name == "gemv_bf16_t1_r2_n128_u2_p2"
    assert gb.make_variant(1, prefetch=3).name == "gemv_bf16_t1_r1_n128_u2_p3"
    assert [gb.prefetch_for(c, e) for c, e in ((1, "plain"), (1, "swiglu"), (4, "plain"), (8, "plain"))] == [5, 2, 2, 1]


def test_norm_variant_table():
    v = get(gb.norm_variant_name())
    assert v.name == "gemv_bf16_t1_n" == gb.variant_name(1, norm=True) and v.pdl
    assert v.config == dict(cols=1, rows=1, threads=128, unroll=2, epilogue="plain", prefetch=5, norm=True)
    assert [a.name for a in v.args if a is not None] == ["w", "x", "nw", "y", "eps"]
    assert v.args[3].shape == ("K",) and v.args[5].dtype == "f32"
    assert all("norm" not in u.config for u in gb.GEMV_BF16_VARIANTS if u is not v and not u.config.get("add"))
    na = get(gb.variant_name(1, norm=True, add=True))
    assert na.name == "gemv_bf16_t1_na" and na.cls == "GemvBf16Add" and na.config["norm"]
    assert [a.name for a in na.args if a is not None] == ["w", "x", "nw", "y", "eps", "s"] and na.args[6].dtype == "f32"
    with pytest.raises(LaunchError, match="norm=True"):
        gb.variant_name(1, add=True)
    for cols, epilogue in ((2, "plain"), (1, "residual"), (1, "swiglu")):
        with pytest.raises(LaunchError, match="folds the RMSNorm at 1 column"):
            gb.variant_name(cols, epilogue, norm=True)


@needs_dsl
def test_kernel_refuses_norm_it_does_not_support():
    from cute_kernels.gemv_bf16 import GemvBf16

    assert GemvBf16(1, norm=True).norm
    for kw in (dict(cols=2), dict(cols=1, epilogue="residual"), dict(cols=1, rows=2, epilogue="swiglu")):
        with pytest.raises(ValueError, match="cols = 1 with the plain epilogue only"):
            GemvBf16(norm=True, **kw)
    with pytest.raises(ValueError, match="prefetch"):
        GemvBf16(1, prefetch=0)


@needs_dsl
@pytest.mark.parametrize("name,arch", [("gemv_bf16_t1", "sm_90a"), ("gemv_bf16_t8", "sm_90a"),
                                       ("gemv_bf16_t1", "sm_120a"), ("gemv_bf16_t2", "sm_120a"),
                                       ("gemv_bf16_t1_res", "sm_90a"), ("gemv_bf16_t1_swiglu", "sm_90a"),
                                       ("gemv_bf16_t8_swiglu", "sm_120a"), ("gemv_bf16_t1_n", "sm_90a"),
                                       ("gemv_bf16_t1_na", "sm_90a"), ("gemv_bf16_t1_n", "sm_120a")])
def test_builds(name, arch, tmp_path):
    v = get(name)
    m = build_variant(v, arch, tmp_path)
    assert (tmp_path / arch / f"{name}.cubin").stat().st_size > 1000
    outs = v.config["rows"] // (2 if name.endswith("_swiglu") else 1)
    assert m.block == [gb.THREADS, 1, 1] and m.grid == [f"cdiv(M, {outs})", "1", "1"]
    want = {"_res": ["w", "x", "r", "y"], "_n": ["w", "x", "nw", "y", "eps"], "_na": ["w", "x", "nw", "y", "eps", "s"]}
    assert [p.name for p in m.params] == want.get(name[name.rfind("_"):], ["w", "x", "y"])


def _ptx(name: str, tmp_path) -> str:
    import importlib

    from inferno.kernels import build

    cutlass, cute, cuda, fake = build._import_dsl()
    v = get(name)
    kernel = getattr(importlib.import_module(v.source), v.cls)(**v.config)
    compiled = cute.compile(kernel, *build._fake_args(v, cutlass, cute, cuda, fake),
                            options=f"--gpu-arch sm_90a --keep-ptx --dump-dir {tmp_path}")
    return compiled.__ptx__


@needs_dsl
@pytest.mark.parametrize("name", ["gemv_bf16_t1", "gemv_bf16_t4", "gemv_bf16_t1_res", "gemv_bf16_t2_swiglu",
                                  "gemv_bf16_t1_n"])
def test_loads_are_16_bytes(name, tmp_path):
    """Every weight, x (and norm weight) load in the PTX is a 16-byte vector load; the residual
    epilogue adds one 2-byte load (its r element)."""
    loads = re.findall(r"ld\.global\S*", _ptx(name, tmp_path))
    scalar = [ld for ld in loads if ".v4." not in ld]
    assert loads and len(scalar) == (1 if name.endswith("_res") else 0), loads
    assert all(ld.endswith("16") for ld in scalar), scalar


@needs_dsl
@pytest.mark.parametrize("name", ["gemv_bf16_t1", "gemv_bf16_t8", "gemv_bf16_t1_swiglu", "gemv_bf16_t1_n"])
def test_staged_weights_load_before_the_pdl_wait(name, tmp_path):
    """PDL: the `prefetch` chunks of each weight row load before griddepcontrol.wait, unpredicated
    (all in flight at once), and nothing else does; x and the norm weight load after it."""
    v = get(name)
    ptx = _ptx(name, tmp_path)
    assert ptx.count("griddepcontrol.wait;") == 1
    before, after = ptx.split("griddepcontrol.wait;")
    early = re.findall(r"(@%p\d+ )?ld\.global\S*", before)
    assert len(early) == v.config["prefetch"] * v.config["rows"] and not any(early), early
    staged_x = v.config["prefetch"] * v.config["cols"] * (2 if name.endswith("_n") else 1)
    assert len(re.findall(r"ld\.global", after)) > staged_x


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    """A GemvBf16 launcher for gemv_bf16_t2 built here (sm_90a), with a fake loaded module."""
    if not dsl_available():
        pytest.skip("CuTe DSL not installed")
    from inferno.cuda.params import ParamLayout, ParamSpec
    from inferno.kernels.cache import LoadedKernel

    root = tmp_path_factory.mktemp("gemv-bf16")
    m = build_variant(get("gemv_bf16_t2"), "sm_90a", root)
    specs = [ParamSpec(p.name, p.kind, p.size, p.align, len(p.dyn_shape), len(p.dyn_stride)) for p in m.params]
    return gb.GemvBf16(LoadedKernel(get("gemv_bf16_t2"), m, None, ParamLayout(specs, "gemv_bf16_t2"), 132))


def _buf(nbytes: int, ptr: int) -> DeviceBuffer:
    return DeviceBuffer(ptr, nbytes, "buf")


def test_launcher_grid_and_checks(launcher, monkeypatch):
    from inferno.kernels import launchers

    calls = []
    monkeypatch.setattr(launchers, "launch", lambda k, grid, block, params, smem, stream: calls.append(grid))
    w, x, y = _buf(1 << 16, 1 << 20), _buf(1 << 10, 1 << 24), _buf(1 << 10, (1 << 26) + 2)
    launcher(w, x, y, 97, 200, 2)
    assert calls == [(49, 1, 1)]  # 2 rows per CTA at T = 2: ceil(97 / 2)
    with pytest.raises(LaunchError, match="exceeds its 2"):
        launcher(w, x, y, 16, 64, 3)
    with pytest.raises(LaunchError, match="multiple of 8"):
        launcher(w, x, y, 16, 60, 1)
    with pytest.raises(LaunchError, match="bytes, the call needs"):
        launcher(w, x, y, 1024, 64, 1)
    with pytest.raises(LaunchError, match="aligned"):
        launcher(w, _buf(1 << 10, (1 << 24) + 8), y, 16, 64, 1)


@pytest.fixture(scope="module")
def epilogue_launchers(tmp_path_factory):
    """GemvBf16 launchers for gemv_bf16_t1_res and gemv_bf16_t1_swiglu built here (sm_90a)."""
    if not dsl_available():
        pytest.skip("CuTe DSL not installed")
    from inferno.cuda.params import ParamLayout, ParamSpec
    from inferno.kernels.cache import LoadedKernel

    root = tmp_path_factory.mktemp("gemv-bf16-epi")
    out = {}
    for name in ("gemv_bf16_t1_res", "gemv_bf16_t1_swiglu"):
        m = build_variant(get(name), "sm_90a", root)
        specs = [ParamSpec(p.name, p.kind, p.size, p.align, len(p.dyn_shape), len(p.dyn_stride)) for p in m.params]
        out[name] = gb.GemvBf16(LoadedKernel(get(name), m, None, ParamLayout(specs, name), 132))
    return out


def test_epilogue_launchers_grid_and_checks(epilogue_launchers, monkeypatch):
    from inferno.kernels import launchers

    calls = []
    monkeypatch.setattr(launchers, "launch", lambda k, grid, block, params, smem, stream: calls.append(grid))
    w, x, y, r = _buf(1 << 16, 1 << 20), _buf(1 << 10, 1 << 24), _buf(1 << 10, 1 << 26), _buf(1 << 10, 1 << 27)
    res, swi = epilogue_launchers["gemv_bf16_t1_res"], epilogue_launchers["gemv_bf16_t1_swiglu"]
    res(w, x, y, 97, 64, 1, r=r)
    swi(w, x, y, 98, 64, 1)
    assert calls == [(97, 1, 1), (49, 1, 1)]  # 1 output per CTA: N outputs, then N / 2 for swiglu
    with pytest.raises(LaunchError, match="pass r exactly"):
        res(w, x, y, 16, 64, 1)
    with pytest.raises(LaunchError, match="pass r exactly"):
        swi(w, x, y, 16, 64, 1, r=r)
    with pytest.raises(LaunchError, match="even row count"):
        swi(w, x, y, 15, 64, 1)


@pytest.fixture(scope="module")
def norm_launcher(tmp_path_factory):
    """A GemvBf16 launcher for gemv_bf16_t1_n built here (sm_90a), with a fake loaded module."""
    if not dsl_available():
        pytest.skip("CuTe DSL not installed")
    from inferno.cuda.params import ParamLayout, ParamSpec
    from inferno.kernels.cache import LoadedKernel

    name = gb.norm_variant_name()
    m = build_variant(get(name), "sm_90a", tmp_path_factory.mktemp("gemv-bf16-n"))
    specs = [ParamSpec(p.name, p.kind, p.size, p.align, len(p.dyn_shape), len(p.dyn_stride)) for p in m.params]
    return gb.GemvBf16(LoadedKernel(get(name), m, None, ParamLayout(specs, name), 132))


def test_norm_launcher_packs_nw_and_eps(norm_launcher, monkeypatch):
    from inferno.kernels import launchers

    calls = []
    monkeypatch.setattr(launchers, "launch",
                        lambda k, grid, block, params, smem, stream: calls.append((grid, params.raw("nw"),
                                                                                   params.raw("eps"))))
    w, x, nw, y = _buf(1 << 20, 1 << 20), _buf(1 << 14, 1 << 24), _buf(1 << 14, 1 << 25), _buf(1 << 10, 1 << 26)
    assert norm_launcher.norm
    norm_launcher(w, x, y, 96, 5120, norm=(nw, 1e-6))
    grid, raw_nw, raw_eps = calls[0]
    assert grid == (96, 1, 1)  # one weight row per CTA
    assert struct.unpack_from("<Qi", raw_nw) == (1 << 25, 5120)  # nw's address and its length K
    assert struct.unpack("<f", raw_eps)[0] == pytest.approx(1e-6)
    norm_launcher(w, x, y, 96, 4104, norm=(nw, 1))  # an int eps is a number too
    assert struct.unpack("<f", calls[1][2])[0] == 1.0


def test_norm_launcher_checks(norm_launcher, launcher, monkeypatch):
    from inferno.kernels import launchers

    monkeypatch.setattr(launchers, "launch", lambda *a: None)
    w, x, nw, y = _buf(1 << 20, 1 << 20), _buf(1 << 14, 1 << 24), _buf(1 << 14, 1 << 25), _buf(1 << 10, 1 << 26)
    with pytest.raises(LaunchError, match=r"pass norm=\(nw, eps\) exactly for a _n variant \(gemv_bf16_t1_n\)"):
        norm_launcher(w, x, y, 96, 5120)
    with pytest.raises(LaunchError, match=r"kernel gemv_bf16_t2: pass norm=\(nw, eps\) exactly"):
        launcher(w, x, y, 96, 5120, 1, norm=(nw, 1e-6))
    with pytest.raises(LaunchError, match="exceeds its 1"):
        norm_launcher(w, x, y, 96, 512, 2, norm=(nw, 1e-6))
    with pytest.raises(LaunchError, match="nw 'buf' has 16384 bytes, the call needs 16400"):
        norm_launcher(w, _buf(1 << 15, 1 << 24), y, 1, 8200, norm=(nw, 1e-6))
    with pytest.raises(LaunchError, match="nw 'buf' at 0x2000008 is not 16-byte aligned"):
        norm_launcher(w, x, y, 96, 512, norm=(_buf(1 << 14, (1 << 25) + 8), 1e-6))
    with pytest.raises(LaunchError, match="nw must be a DeviceBuffer"):
        norm_launcher(w, x, y, 96, 512, norm=(None, 1e-6))
    with pytest.raises(LaunchError, match="norm must be the pair"):
        norm_launcher(w, x, y, 96, 512, norm=nw)
    norm_launcher(w, x, y, 96, 512, norm=(nw, np.float32(1e-6)))  # a numpy float is a number too
    for eps in (0.0, -1e-6, float("nan"), float("inf"), True, "1e-6", None):
        with pytest.raises(LaunchError, match="eps must be a finite number > 0"):
            norm_launcher(w, x, y, 96, 512, norm=(nw, eps))
