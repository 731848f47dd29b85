"""Launch-configuration and TMA-request validation, which runs before any driver call (no GPU needed)."""

from types import SimpleNamespace

import pytest

from inferno.cuda.errors import LaunchError
from inferno.cuda.launch import Launch, launch
from inferno.cuda.module import Kernel
from inferno.cuda.params import ParamSpec, pack_params
from inferno.cuda.tma import validate_tiled


def fake_kernel(sizes=(8, 4)):
    lib = SimpleNamespace(device=SimpleNamespace(max_smem_per_block_optin=232448), name="lib")
    k = Kernel(handle=None, name="add_one", library=lib)
    k._param_sizes = list(sizes)  # what cuFuncGetParamInfo would report
    return k


PARAMS = [ParamSpec("x", "ptr"), ParamSpec("n", "u32")]


@pytest.mark.parametrize("grid,block,match", [
    ((0,), (128,), "grid"), ((1, 1, 1, 1), (128,), "1-3 dimensions"), ((1.5,), (128,), "grid must be"),
    ((2**31,), (128,), "grid"), ((1, 65536), (128,), "grid"), ((1,), (2048,), "block"),
    ((1,), (32, 32, 2), "more than 1024"), ((1,), (1, 1, 65), "block"),
])
def test_bad_grid_and_block(grid, block, match):
    k = fake_kernel()
    with pytest.raises(LaunchError, match=match) as e:
        launch(k, grid, block, pack_params(PARAMS, [0, 1]))
    assert "kernel add_one" in str(e.value)


def test_large_dynamic_smem_needs_the_attribute_first():
    with pytest.raises(LaunchError, match=r"set_max_dynamic_smem\(100000\)"):
        launch(fake_kernel(), 1, 128, pack_params(PARAMS, [0, 1]), smem=100_000)


def test_cluster_must_divide_grid():
    with pytest.raises(LaunchError, match="not a multiple of cluster"):
        Launch(fake_kernel(), (3, 1), (128,), pack_params(PARAMS, [0, 1]), cluster=(2, 1))


def test_packed_layout_must_match_the_kernel():
    k = fake_kernel(sizes=(8, 4, 4))
    with pytest.raises(LaunchError, match=r"takes 3 parameters of sizes \[8, 4, 4\].*have 2 of sizes \[8, 4\]"):
        launch(k, 1, 128, pack_params(PARAMS, [0, 1], kernel="add_one"))


def test_params_must_be_packed():
    with pytest.raises(LaunchError, match="PackedParams"):
        launch(fake_kernel(), 1, 128, [0, 1])


GOOD = dict(dtype="bf16", ptr=1 << 20, dims=[4096, 1000], strides_bytes=[8192], box=[64, 128], swizzle=128,
            elem_strides=None, l2_promo=128, oob_fill="none")


def test_valid_tma_request_passes():
    assert validate_tiled(**GOOD) == 2


@pytest.mark.parametrize("change,match", [
    (dict(dtype="f8"), "unknown dtype"), (dict(ptr=(1 << 20) + 8), "16-byte aligned"),
    (dict(strides_bytes=[8200]), "multiples of 16"), (dict(strides_bytes=[]), "give 1 byte strides"),
    (dict(box=[64]), "box must have 2"), (dict(box=[64, 512]), "1..256"),
    (dict(box=[4, 128], swizzle=0), "multiple of 16 bytes"), (dict(swizzle=48), "swizzle must be"),
    (dict(box=[128, 64]), "exceeds the 128B swizzle span"), (dict(elem_strides=[1, 9]), "elem_strides"),
    (dict(dims=[0, 10]), "each dim"), (dict(l2_promo=32), "l2_promo"), (dict(oob_fill="zero"), "oob_fill"),
    (dict(dims=[1] * 6, strides_bytes=[16] * 5, box=[8] * 6), "rank must be 1..5"),
])
def test_bad_tma_requests(change, match):
    with pytest.raises(LaunchError, match=match):
        validate_tiled(**{**GOOD, **change})
