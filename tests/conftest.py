"""Shared pytest setup: GPU tests skip cleanly on machines without an NVIDIA GPU."""

import functools
import os
import sys

# Shared helpers (fake_executor, model_fixtures, server_harness) import by plain module name;
# test modules themselves load with --import-mode=importlib, so tests/ and tests/gpu/ may share names.
sys.path.insert(0, os.path.dirname(__file__))

# One BLAS thread: the tiny-model tests are latency-bound and CI has 2 shared cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest


@functools.cache
def gpu_available() -> bool:
    """True when the CUDA driver loads and sees at least one device."""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        return False
    try:
        (err,) = cu.cuInit(0)
        if err != cu.CUresult.CUDA_SUCCESS:
            return False
        err, n = cu.cuDeviceGetCount()
        return err == cu.CUresult.CUDA_SUCCESS and n > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def kernel_builds(tmp_path_factory):
    """build(variants, archs) -> one kernel directory for the whole session holding current cubins of those
    (variant, arch) pairs: a variant several modules need is compiled once (2 cores: builds dominate the suite)."""
    root = tmp_path_factory.mktemp("kernels")

    def build(variants, archs) -> "os.PathLike":
        pytest.importorskip("cutlass.cute", reason="CuTe DSL not installed (pip install -e '.[kernels]')")
        from inferno.kernels.build import build_pairs
        from inferno.kernels.cache import stale_reason

        stale = {(v.name, a): (v, a) for a in archs for v in variants if a in v.archs and stale_reason(v, a, root)}
        build_pairs(list(stale.values()), root, progress=None, jobs=os.cpu_count() or 1)
        return root

    return build
