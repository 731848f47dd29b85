"""Quantized decode GEMV on the live GPU vs the numpy model: every format, T = 1, 2, 4, 8 (and odd
T on wider variants), model shapes and a ragged one; fresh random inputs, poisoned outputs with a
guard tail. Large shapes are checked on a random sample of output columns (all are checked for
being written). Cubins come from $INFERNO_KERNEL_DIR (`python -m inferno.kernels.gemv_variants DIR`).
"""

import pytest

from inferno.artifact.formats import groupwise as gw
from inferno.cuda.copy import to_device
from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import device_alloc
from inferno.kernels import qlayout as ql
from inferno.kernels.gemv_variants import GemvQ, variant_name
from gemv_check import check_gemv

FORMATS = list(gw.SCHEMES)
GATE_UP, DOWN, QKV, RAGGED = (34816, 5120), (5120, 17408), (12288, 5120), (1002, 200)


_payloads: dict = {}


def _weights(device, fmt, n, k, rng):
    key = (fmt, n, k)
    if key not in _payloads:  # one weight upload per (format, shape) for the module
        pay = ql.random_payload(fmt, n, k, rng)
        _payloads[key] = (pay, to_device(None, pay, f"w {fmt}"))
    return _payloads[key]


def run_case(device, rng, fmt, epilogue, n, k, cols):
    kern = GemvQ.load(variant_name(fmt, epilogue, cols), device)
    pay, dw = _weights(device, fmt, n, k, rng)
    check_gemv(kern, dw, epilogue, n, k, cols, rng,
               lambda x, r, outs: ql.reference(fmt, pay, n, k, x, epilogue, r, outs))


@pytest.mark.parametrize("cols", [1, 2, 4, 8])
@pytest.mark.parametrize("n,k", [GATE_UP, DOWN, QKV, RAGGED])
@pytest.mark.parametrize("fmt", FORMATS)
def test_plain(device, rng, fmt, n, k, cols):
    run_case(device, rng, fmt, "plain", n, k, cols)


@pytest.mark.parametrize("cols", [1, 2, 4, 8])
@pytest.mark.parametrize("n,k", [GATE_UP, RAGGED])
@pytest.mark.parametrize("fmt", FORMATS)
def test_swiglu(device, rng, fmt, n, k, cols):
    run_case(device, rng, fmt, "swiglu", n, k, cols)


@pytest.mark.parametrize("cols", [1, 2, 4, 8])
@pytest.mark.parametrize("n,k", [DOWN, RAGGED])
@pytest.mark.parametrize("fmt", FORMATS)
def test_residual(device, rng, fmt, n, k, cols):
    run_case(device, rng, fmt, "residual", n, k, cols)


@pytest.mark.parametrize("cols", [3, 5, 7])
def test_fewer_columns_than_variant(device, rng, cols):
    run_case(device, rng, "Q5G64_F16S", "plain", *QKV, cols)
    run_case(device, rng, "Q4G64_F16S", "swiglu", *RAGGED, cols)


def test_launcher_refuses_bad_arguments(device):
    k = GemvQ.load("gemv_q4_t2", device)
    w, x, y = device_alloc(1 << 20, "w"), device_alloc(1 << 16, "x"), device_alloc(1 << 16, "y")
    try:
        with pytest.raises(LaunchError, match="exceeds its 2"):
            k(w, x, y, 64, 256, 3)
        with pytest.raises(LaunchError, match="multiple of 8"):
            k(w, x, y, 64, 260, 1)
        with pytest.raises(LaunchError, match="bytes, the call needs"):
            k(w, x, y, 8192, 256, 1)
        with pytest.raises(LaunchError, match="residual"):
            k(w, x, y, 64, 256, 1, r=x)
    finally:
        for b in (w, x, y):
            b.free()
