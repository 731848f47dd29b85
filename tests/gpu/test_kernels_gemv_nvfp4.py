"""NVFP4 decode GEMV on the live GPU vs numpy (`formats.nvfp4` decode, float64 matmul): plain,
residual and SwiGLU epilogues, T = 1, 2, 4, 8 (and odd T), model shapes and ragged ones; fresh
random weights through the format's encoder, poisoned outputs with a guard tail. Large shapes
are checked on a random sample of output columns (all are checked for being written). A failure
names the epilogue, shape, T, the error, and the worst output (row, column, got, want).
"""

import numpy as np
import pytest

from inferno.artifact.formats import nvfp4
from inferno.cuda.copy import to_device
from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import device_alloc
from inferno.kernels.gemv_nvfp4_variants import GemvNvfp4, variant_name
from gemv_check import check_gemv

GATE_UP, DOWN = (34816, 5120), (5120, 17408)
RAGGED = [(384, 192), (128, 320), (640, 1088)]  # K / 32 not a multiple of the 128 threads


_payloads: dict = {}


def _weights(n, k, rng):
    if (n, k) not in _payloads:  # one encode + upload per shape for the module
        w = rng.standard_normal((n, k), np.float32) * rng.uniform(0.02, 0.2, (n, 1)).astype(np.float32)
        w[0, :16] = 0  # one all-zero block (scale +0)
        pay = nvfp4.encode(w)
        _payloads[(n, k)] = (pay, to_device(None, pay, "w nvfp4"))
    return _payloads[(n, k)]


def reference(pay, n, k, x, epilogue, r, outs):
    """float64 model: decode the rows the sampled outputs read, multiply, apply the epilogue."""
    codes, scales, d = nvfp4.unpack(pay.tobytes(), (n, k))
    m = n // 2 if epilogue == "swiglu" else n
    rows = np.r_[outs, outs + m] if epilogue == "swiglu" else outs
    w = nvfp4.dequantize(codes[rows], scales[rows], d).astype(np.float64)
    y = x.astype(np.float64) @ w.T
    if epilogue == "swiglu":
        g, u = y[:, :len(outs)], y[:, len(outs):]
        return g / (1 + np.exp(-g)) * u
    return y + r if epilogue == "residual" else y


def run_case(device, rng, epilogue, n, k, cols):
    kern = GemvNvfp4.load(variant_name(epilogue, cols), device)
    pay, dw = _weights(n, k, rng)
    check_gemv(kern, dw, epilogue, n, k, cols, rng, lambda x, r, outs: reference(pay, n, k, x, epilogue, r, outs))


@pytest.mark.parametrize("cols", [1, 2, 4, 8])
@pytest.mark.parametrize("n,k", [GATE_UP, DOWN, *RAGGED])
def test_plain(device, rng, n, k, cols):
    run_case(device, rng, "plain", n, k, cols)


@pytest.mark.parametrize("cols", [1, 2, 4, 8])
@pytest.mark.parametrize("n,k", [GATE_UP, RAGGED[0], RAGGED[2]])
def test_swiglu(device, rng, n, k, cols):
    run_case(device, rng, "swiglu", n, k, cols)


@pytest.mark.parametrize("cols", [1, 2, 4, 8])
@pytest.mark.parametrize("n,k", [DOWN, RAGGED[1], RAGGED[2]])
def test_residual(device, rng, n, k, cols):
    run_case(device, rng, "residual", n, k, cols)


@pytest.mark.parametrize("cols", [3, 5, 7])
def test_fewer_columns_than_variant(device, rng, cols):
    run_case(device, rng, "plain", *RAGGED[2], cols)
    run_case(device, rng, "swiglu", *RAGGED[0], cols)


def test_launcher_refuses_bad_arguments(device):
    k = GemvNvfp4.load("gemv_nvfp4_t2", device)
    w, x, y = device_alloc(1 << 20, "w"), device_alloc(1 << 16, "x"), device_alloc(1 << 16, "y")
    try:
        with pytest.raises(LaunchError, match="exceeds its 2"):
            k(w, x, y, 128, 256, 3)
        with pytest.raises(LaunchError, match="n % 128 == 0 and k % 64 == 0"):
            k(w, x, y, 128, 260, 1)
        with pytest.raises(LaunchError, match="bytes, the call needs"):
            k(w, x, y, 8192, 256, 1)
        with pytest.raises(LaunchError, match="residual"):
            k(w, x, y, 128, 256, 1, r=x)
    finally:
        for b in (w, x, y):
            b.free()
