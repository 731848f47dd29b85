"""Every kernel vs numpy on the live GPU: fresh random inputs, poisoned outputs, ragged shapes.

Cubins come from the kernel cache ($INFERNO_KERNEL_DIR); on a machine without the DSL they must
have been built beforehand (`inferno kernels build --arch <gpu arch> --out $INFERNO_KERNEL_DIR`).
"""

import pytest

from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import device_alloc
from inferno.kernels import selfcheck as sc
from inferno.kernels.launchers import launcher
from inferno.kernels.registry import variants


def _kernel(device, name):
    if name not in {v.name for v in variants(device.arch)}:
        pytest.skip(f"{name} does not build for {device.arch}")
    return launcher(name, device)


def _assert(res: sc.CheckResult):
    assert res.unwritten == 0, res.line()
    assert res.guard_ok, res.line()
    assert res.rel_err <= res.tol, res.line()


@pytest.mark.parametrize("name,rows,n", [
    ("rmsnorm_1k", 130, 256), ("rmsnorm_1k", 3, 1024), ("rmsnorm_1k", 5, 72), ("rmsnorm_1k", 1, 256),
    ("rmsnorm_1k", 4000, 256), ("rmsnorm_5k", 1, 5120), ("rmsnorm_5k", 7, 5120), ("rmsnorm_5k", 5, 264),
    ("rmsnorm_5k", 3000, 5120), ("rmsnorm_8k", 33, 8192), ("rmsnorm_8k", 300, 4096), ("rmsnorm_8k", 1, 8),
    ("rmsnorm_16k", 3, 16384), ("rmsnorm_16k", 9, 5120), ("rmsnorm_16k", 1000, 12000),
])
def test_rmsnorm(device, rng, name, rows, n):
    _assert(sc.check_rmsnorm(_kernel(device, name), rows, n, rng))


@pytest.mark.parametrize("name,rows,n", [
    ("add_rmsnorm_5k", 1, 5120), ("add_rmsnorm_5k", 7, 5120), ("add_rmsnorm_5k", 2500, 5120),
    ("add_rmsnorm_8k", 2, 8192), ("add_rmsnorm_8k", 65, 136), ("add_rmsnorm_8k", 1100, 6144),
])
def test_add_rmsnorm(device, rng, name, rows, n):
    _assert(sc.check_add_rmsnorm(_kernel(device, name), rows, n, rng))


def test_rmsnorm_picks_the_narrowest_width(device):
    from inferno.kernels.launchers import AddRMSNorm, RMSNorm

    assert RMSNorm.for_width(256, device).name == "rmsnorm_1k"
    assert RMSNorm.for_width(5120, device).name == "rmsnorm_5k"
    assert RMSNorm.for_width(5128, device).name == "rmsnorm_8k"
    assert AddRMSNorm.for_width(5120, device).name == "add_rmsnorm_5k"
    with pytest.raises(LaunchError, match="no rmsnorm kernel holds rows of 20000"):
        RMSNorm.for_width(20000, device)


@pytest.mark.parametrize("rows,inter", [(1, 17408), (3, 17408), (17, 520), (2, 8)])
def test_silu_mul(device, rng, rows, inter):
    _assert(sc.check_silu_mul(_kernel(device, "silu_mul"), rows, inter, rng))


@pytest.mark.parametrize("tokens,vocab,hidden", [(1, 1000, 5120), (9, 1000, 5120), (37, 50, 2056)])
def test_embedding(device, rng, tokens, vocab, hidden):
    _assert(sc.check_embedding(_kernel(device, "embedding"), tokens, vocab, hidden, rng))


@pytest.mark.parametrize("name,m,n,k", [
    ("gemm_wgmma", 256, 512, 256), ("gemm_wgmma", 1000, 1000, 264), ("gemm_wgmma", 7, 136, 72),
    ("gemm_wgmma", 1, 5120, 5120), ("gemm_wgmma", 300, 256, 1032), ("gemm_wgmma", 129, 257 + 7, 8),
    ("gemm_simt", 128, 192, 256), ("gemm_simt", 100, 72, 40), ("gemm_simt", 1, 520, 1024),
])
def test_gemm(device, rng, name, m, n, k):
    _assert(sc.check_gemm(_kernel(device, name), m, n, k, rng))


def test_launcher_refuses_bad_arguments(device):
    k = _kernel(device, "rmsnorm_8k")
    x = device_alloc(4 * 5120 * 2, "x")
    w = device_alloc(5120 * 2, "w")
    try:
        with pytest.raises(LaunchError, match="multiple of 8"):
            k(x, w, x, 4, 5121)
        with pytest.raises(LaunchError, match="exceeds its maximum"):
            k(x, w, x, 1, 8200)
        with pytest.raises(LaunchError, match="bytes, the call needs"):
            k(x, w, x, 5, 5120)
        with pytest.raises(LaunchError, match="must be a DeviceBuffer"):
            k(x.ptr, w, x, 4, 5120)
        with pytest.raises(LaunchError, match="must be an int"):
            k(x, w, x, 4.0, 5120)
        with pytest.raises(LaunchError, match="eps"):
            k(x, w, x, 4, 5120, eps="small")
        g = _kernel(device, "gemm_wgmma" if device.arch == "sm_90a" else "gemm_simt")
        with pytest.raises(LaunchError, match="multiple of 8"):
            g(x, x, x, 4, 4, 5)
    finally:
        x.free()
        w.free()
