"""Tensor-core decode GEMV on the live GPU vs the numpy model: every format x epilogue, T = 1, 2, 5, 8,
the 27B shapes (gate_up, down, GDN value_z, the Q6 output head on sampled columns), a ragged one and
small odd ones; the benchmark's alternative kernel shapes; fresh random inputs, poisoned outputs with
a guard tail. The case runner is the CUDA-core GEMV
test's (`tests/gpu/test_kernels_gemv.py`), pointed at the mma launcher. Cubins come from
$INFERNO_KERNEL_DIR (`python -m inferno.kernels.gemv_mma_variants DIR`).
"""

import importlib.util
from pathlib import Path

import pytest

from inferno.artifact.formats import groupwise as gw
from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import device_alloc
from inferno.kernels import gemv_mma_variants as mv
from inferno.kernels.cache import load

_spec = importlib.util.spec_from_file_location("gemv_gpu_cases", Path(__file__).with_name("test_kernels_gemv.py"))
tg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tg)
device, rng = tg.device, tg.rng  # the shared fixtures

FORMATS = list(gw.SCHEMES)
GATE_UP, DOWN, VALUE_Z, HEAD, RAGGED = (34816, 5120), (5120, 17408), (12288, 5120), (248320, 5120), (1002, 200)
COLS = [1, 2, 5, 8]


@pytest.fixture(autouse=True)
def mma_launcher(monkeypatch):
    """Run the shared case runner with the tensor-core launcher and variant names."""
    monkeypatch.setattr(tg, "GemvQ", mv.GemvMma)
    monkeypatch.setattr(tg, "variant_name", mv.variant_name)


@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("n,k", [GATE_UP, DOWN, VALUE_Z, RAGGED])
@pytest.mark.parametrize("fmt", FORMATS)
def test_plain(device, rng, fmt, n, k, cols):
    tg.run_case(device, rng, fmt, "plain", n, k, cols)


@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("n,k", [GATE_UP, RAGGED])
@pytest.mark.parametrize("fmt", FORMATS)
def test_swiglu(device, rng, fmt, n, k, cols):
    tg.run_case(device, rng, fmt, "swiglu", n, k, cols)


@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("n,k", [DOWN, RAGGED])
@pytest.mark.parametrize("fmt", FORMATS)
def test_residual(device, rng, fmt, n, k, cols):
    tg.run_case(device, rng, fmt, "residual", n, k, cols)


@pytest.mark.parametrize("cols", [1, 8])
def test_output_head(device, rng, cols):
    tg.run_case(device, rng, "Q6G64_F16S", "plain", *HEAD, cols)


@pytest.mark.parametrize("n,k", [(16, 8), (17, 136), (40, 1000)])
def test_small_and_odd_shapes(device, rng, n, k):
    for fmt in FORMATS:
        tg.run_case(device, rng, fmt, "plain", n, k, 3)


# (tiles, warps, steps, stages) of the benchmark's alternatives (tools/bench_gemv.py MMA_TUNE).
SHAPES_OF_KERNEL = [(1, 4, 1, 3), (1, 4, 1, 6), (1, 4, 2, 4), (1, 8, 1, 4), (2, 4, 1, 4), (2, 4, 1, 6),
                    (2, 8, 1, 4), (1, 2, 1, 6)]


@pytest.mark.parametrize("shape", SHAPES_OF_KERNEL, ids=lambda c: "r{}_w{}_s{}_p{}".format(*c))
@pytest.mark.parametrize("fmt", FORMATS)
def test_other_kernel_shapes(device, rng, monkeypatch, fmt, shape):
    """The non-default tiles/warps/steps/stages (T = 1 builds) compute the same."""
    made = {}

    def name(f, epi, cols):
        v = mv.make_variant(f, epi, cols, *shape)
        made[v.name] = v
        return v.name

    class Shaped:
        @staticmethod
        def load(n, dev):
            return mv.GemvMma(load(made[n], dev))

    monkeypatch.setattr(tg, "GemvQ", Shaped)
    monkeypatch.setattr(tg, "variant_name", name)
    tg.run_case(device, rng, fmt, "plain", 300, 2048, 1)
    tg.run_case(device, rng, fmt, "swiglu", *RAGGED, 1)
    tg.run_case(device, rng, fmt, "residual", *RAGGED, 1)


def test_launcher_refuses_bad_arguments(device):
    k = mv.GemvMma.load("gemv_mma_q4_t1", device)
    w, x, y = device_alloc(1 << 20, "w"), device_alloc(1 << 16, "x"), device_alloc(1 << 16, "y")
    try:
        with pytest.raises(LaunchError, match="exceeds its 1"):
            k(w, x, y, 64, 256, 2)
        with pytest.raises(LaunchError, match="multiple of 8"):
            k(w, x, y, 64, 260, 1)
        with pytest.raises(LaunchError, match="bytes, the call needs"):
            k(w, x, y, 8192, 256, 1)
        with pytest.raises(LaunchError, match="residual"):
            k(w, x, y, 64, 256, 1, r=x)
    finally:
        for b in (w, x, y):
            b.free()
