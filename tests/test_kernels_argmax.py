"""CPU: the greedy argmax kernel builds for every arch; its manifest and launcher checks."""

import pytest

from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import DeviceBuffer
from inferno.kernels.build import build_variant, dsl_available
from inferno.kernels.registry import ARCHS
from inferno.kernels.sample_variants import ARGMAX, Argmax


@pytest.mark.skipif(not dsl_available(), reason="the CuTe DSL is not installed")
@pytest.mark.parametrize("arch", ARCHS)
def test_argmax_builds(tmp_path, arch):
    m = build_variant(ARGMAX, arch, tmp_path)
    assert (tmp_path / arch / "argmax_bf16.cubin").stat().st_size > 0
    assert m.block == [1024, 1, 1] and m.grid == ["8", "1", "1"]  # one cluster of 8 CTAs
    assert [(p.name, p.kind, p.dyn_shape) for p in m.params] == [("x", "tensor", ["N"]), ("out", "tensor", [])]


class _Loaded:
    """Just what the launcher reads before any driver call."""

    class variant:
        name = "argmax_bf16"


def test_argmax_launcher_refuses_bad_arguments():
    a = Argmax(_Loaded())
    x, out = DeviceBuffer(4096, 64, "x"), DeviceBuffer(8192, 4, "out")
    with pytest.raises(LaunchError, match="multiple of 8"):
        a(x, out, 12)
    with pytest.raises(LaunchError, match="has 64 bytes, the call needs 128"):
        a(x, out, 64)
    with pytest.raises(LaunchError, match="must be a DeviceBuffer"):
        a(x, 5, 8)
