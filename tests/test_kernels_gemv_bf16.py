"""bf16 GEMV on the CPU: the variant table, cubin builds for sm_90a and sm_120a (16-byte weight
loads in the PTX), and the launcher's checks, packing and grid with the driver's launch recorded."""

import re

import pytest

from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import DeviceBuffer
from inferno.kernels import gemv_bf16_variants as gb
from inferno.kernels.build import build_variant, dsl_available
from inferno.kernels.registry import get

needs_dsl = pytest.mark.skipif(not dsl_available(), reason="CuTe DSL not installed")


def test_variant_table():
    assert [v.name for v in gb.GEMV_BF16_VARIANTS] == [f"gemv_bf16_t{t}{e}" for e in ("", "_res", "_swiglu")
                                                       for t in (1, 2, 4, 8)]
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
    assert gb.make_variant(1, rows=2).name == "gemv_bf16_t1_r2_n128_u2"


@needs_dsl
@pytest.mark.parametrize("name,arch", [("gemv_bf16_t1", "sm_90a"), ("gemv_bf16_t8", "sm_90a"),
                                       ("gemv_bf16_t1", "sm_120a"), ("gemv_bf16_t2", "sm_120a"),
                                       ("gemv_bf16_t1_res", "sm_90a"), ("gemv_bf16_t1_swiglu", "sm_90a"),
                                       ("gemv_bf16_t8_swiglu", "sm_120a")])
def test_builds(name, arch, tmp_path):
    v = get(name)
    m = build_variant(v, arch, tmp_path)
    assert (tmp_path / arch / f"{name}.cubin").stat().st_size > 1000
    outs = v.config["rows"] // (2 if name.endswith("_swiglu") else 1)
    assert m.block == [gb.THREADS, 1, 1] and m.grid == [f"cdiv(M, {outs})", "1", "1"]
    assert [p.name for p in m.params] == (["w", "x", "r", "y"] if name.endswith("_res") else ["w", "x", "y"])


@needs_dsl
@pytest.mark.parametrize("name", ["gemv_bf16_t1", "gemv_bf16_t4", "gemv_bf16_t1_res", "gemv_bf16_t2_swiglu"])
def test_loads_are_16_bytes(name, tmp_path):
    """Every weight and x load in the PTX is a 16-byte vector load; the residual epilogue adds one
    2-byte load (its r element)."""
    import importlib

    from inferno.kernels import build

    cutlass, cute, cuda, fake = build._import_dsl()
    v = get(name)
    kernel = getattr(importlib.import_module(v.source), v.cls)(**v.config)
    compiled = cute.compile(kernel, *build._fake_args(v, cutlass, cute, cuda, fake),
                            options=f"--gpu-arch sm_90a --keep-ptx --dump-dir {tmp_path}")
    loads = re.findall(r"ld\.global\S*", compiled.__ptx__)
    scalar = [ld for ld in loads if ".v4." not in ld]
    assert loads and len(scalar) == (1 if name.endswith("_res") else 0), loads
    assert all(ld.endswith("16") for ld in scalar), scalar


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
