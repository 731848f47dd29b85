"""bf16 decode GEMV on the live GPU vs numpy: T = 1, 2, 4, 8 (and odd T on wider variants), the
GDN a|b projection shape, a large shape and ragged ones; fresh random inputs, poisoned outputs
with a guard tail. Failures name what went wrong (unwritten outputs, guard overwrite, the worst
row and column). Cubins come from $INFERNO_KERNEL_DIR (`inferno kernels build --only gemv_bf16_t1 ...`).
"""

import numpy as np
import pytest

from inferno.cuda.copy import from_device, memset_d8, to_device
from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import device_alloc
from inferno.kernels.gemv_bf16_variants import GemvBf16
from inferno.kernels.reference import BF16_TOL, bf16, rel_error

AB, HEAD, RAGGED, TINY = (96, 5120), (12288, 5120), (1003, 200), (5, 8)
GUARD = 256


def _describe(y: np.ndarray, want: np.ndarray) -> str:
    """Where the output is furthest from the reference."""
    diff = np.abs(y.astype(np.float64) - want)
    t, row = np.unravel_index(int(np.nanargmax(np.where(np.isnan(diff), np.inf, diff))), diff.shape)
    bad = int((diff > 0.02 * (np.abs(want) + 1)).sum())
    return f"worst at column t={t}, row {row}: got {y[t, row]}, want {want[t, row]:.5g}; {bad} outputs off"


def run_case(device, rng, n: int, k: int, cols: int, variant_cols: int | None = None,
             epilogue: str = "plain") -> None:
    kern = GemvBf16.load(variant_cols or cols, device, epilogue)
    m = n // 2 if epilogue == "swiglu" else n
    w = (rng.standard_normal((n, k), np.float32) * 0.05).astype(bf16)
    x = rng.standard_normal((cols, k), np.float32).astype(bf16)
    r = rng.standard_normal((cols, m), np.float32).astype(bf16)
    dw, dx = to_device(None, w, "w"), to_device(None, x, "x")
    dr = to_device(None, r, "r") if epilogue == "residual" else None
    out_bytes = cols * m * 2
    dy = device_alloc(out_bytes + GUARD, "y")
    memset_d8(dy, 0xFF)  # bf16 0xFFFF is a NaN: any output left unwritten shows
    try:
        kern(dw, dx, dy, n, k, cols, r=dr)
        raw = from_device(dy, np.uint8, (out_bytes + GUARD,))
    finally:
        for b in (dw, dx, dy, dr):
            if b is not None:
                b.free()
    where = f"{kern.name} n={n} k={k} cols={cols}"
    y = raw[:out_bytes].view(bf16).reshape(cols, m).astype(np.float32)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    if epilogue == "residual":
        want = want + r.astype(np.float64)
    elif epilogue == "swiglu":
        gate, up = want[:, :m], want[:, m:]
        want = gate / (1.0 + np.exp(-gate)) * up
    guard = np.flatnonzero(raw[out_bytes:] != 0xFF)
    assert guard.size == 0, f"{where}: {guard.size} guard bytes past the output written (first at +{guard[0]})"
    unwritten = np.argwhere(np.isnan(y))
    assert unwritten.size == 0, f"{where}: {len(unwritten)} outputs unwritten, first (t, row) {tuple(unwritten[0])}"
    err = rel_error(y, want.astype(np.float32))
    assert err <= BF16_TOL, f"{where}: rel err {err:.2e}; {_describe(y, want)}"


@pytest.mark.parametrize("cols", [1, 2, 4, 8])
@pytest.mark.parametrize("n,k", [AB, HEAD, RAGGED, TINY])
def test_gemv_bf16(device, rng, n, k, cols):
    run_case(device, rng, n, k, cols)


@pytest.mark.parametrize("epilogue", ["residual", "swiglu"])
@pytest.mark.parametrize("cols", [1, 2, 4, 8])
@pytest.mark.parametrize("n,k", [AB, (2002, 200), (6, 8)])
def test_gemv_bf16_epilogues(device, rng, n, k, cols, epilogue):
    run_case(device, rng, n, k, cols, epilogue=epilogue)


@pytest.mark.parametrize("epilogue", ["residual", "swiglu"])
def test_epilogues_fewer_columns_than_variant(device, rng, epilogue):
    run_case(device, rng, 2002, 200, 3, 4, epilogue)
    run_case(device, rng, 2002, 200, 5, 8, epilogue)


@pytest.mark.parametrize("cols,variant", [(3, 4), (5, 8), (7, 8), (1, 8)])
def test_fewer_columns_than_variant(device, rng, cols, variant):
    run_case(device, rng, *RAGGED, cols, variant)
    run_case(device, rng, *AB, cols, variant)


def _time_us(fn, reps: int = 50) -> float:
    from inferno.cuda import Event

    fn()  # warm (module load, first launch)
    start, end = Event(), Event()
    try:
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return Event.elapsed_ms(start, end) * 1e3 / reps
    finally:
        start.close()
        end.close()


def test_faster_than_the_one_row_gemm_on_the_ab_projection(device, rng):
    """The decode a|b projection ([2 Hv, hidden] = [96, 5120]) used to run on the tiled GEMM with
    one row; the GEMV must beat it (prints both times and the GEMV's bandwidth)."""
    from inferno.kernels.cache import load
    from inferno.kernels.launchers import Gemm
    from inferno.kernels.registry import get

    n, k = AB
    gemv, gemm = GemvBf16.load(1, device), Gemm(load(get("gemm_simt"), device))
    w = to_device(None, rng.standard_normal((n, k), np.float32).astype(bf16), "w")
    x = to_device(None, rng.standard_normal((1, k), np.float32).astype(bf16), "x")
    y = device_alloc(n * 2, "y")
    try:
        t_gemv = _time_us(lambda: gemv(w, x, y, n, k, 1))
        t_gemm = _time_us(lambda: gemm(x, w, y, 1, n, k))
    finally:
        for b in (w, x, y):
            b.free()
    gbps = (n * k + k + n) * 2 / t_gemv / 1e3
    print(f"\na|b projection {n}x{k}: gemv_bf16_t1 {t_gemv:.1f} us ({gbps:.0f} GB/s), gemm_simt M=1 {t_gemm:.1f} us")
    assert t_gemv < t_gemm, f"gemv_bf16_t1 {t_gemv:.1f} us is not faster than gemm_simt with one row {t_gemm:.1f} us"


def test_launcher_refuses_bad_arguments(device):
    k = GemvBf16.load(2, device)
    w, x, y = device_alloc(1 << 16, "w"), device_alloc(1 << 12, "x"), device_alloc(1 << 12, "y")
    try:
        with pytest.raises(LaunchError, match="exceeds its 2"):
            k(w, x, y, 16, 64, 3)
        with pytest.raises(LaunchError, match="multiple of 8"):
            k(w, x, y, 16, 60, 1)
        with pytest.raises(LaunchError, match="bytes, the call needs"):
            k(w, x, y, 1024, 64, 1)
    finally:
        for b in (w, x, y):
            b.free()
