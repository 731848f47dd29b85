"""One decode-GEMV call on the live GPU checked against the numpy model: fresh random x (and r),
a poisoned output with a guard tail, sampled outputs on big shapes (the GPU GEMV tests share it)."""

from __future__ import annotations

import numpy as np

from inferno.cuda.copy import from_device, memset_d8, to_device
from inferno.cuda.memory import device_alloc
from inferno.kernels import qlayout as ql
from inferno.kernels.reference import BF16_TOL, bf16, rel_error

GUARD = 256
SAMPLE = 384


def check_gemv(kern, pay, dw, fmt: str, epilogue: str, n: int, k: int, cols: int, rng) -> None:
    """Run `kern(dw, x, y, n, k, cols, r=)` (dw: the device weights of row-split payload `pay`, in the
    layout `kern` reads) and assert its bf16 outputs against `qlayout.reference`."""
    m = n // 2 if epilogue == "swiglu" else n
    x = rng.standard_normal((cols, k), np.float32).astype(bf16)
    r = rng.standard_normal((cols, m), np.float32).astype(bf16) if epilogue == "residual" else None
    dx = to_device(None, x, "x")
    dr = to_device(None, r, "r") if r is not None else None
    out_bytes = cols * m * 2
    dy = device_alloc(out_bytes + GUARD, "y")
    memset_d8(dy, 0xFF)
    try:
        kern(dw, dx, dy, n, k, cols, r=dr)
        raw = from_device(dy, np.uint8, (out_bytes + GUARD,))
    finally:
        for b in (dx, dr, dy):
            if b is not None:
                b.free()
    y = raw[:out_bytes].view(bf16).reshape(cols, m).astype(np.float32)
    outs = np.arange(m) if m <= SAMPLE else np.unique(np.r_[0, m - 1, rng.choice(m, SAMPLE, replace=False)])
    want = ql.reference(fmt, pay, n, k, x.astype(np.float32), epilogue,
                        r[:, outs].astype(np.float32) if r is not None else None, outs)
    assert np.all(raw[out_bytes:] == 0xFF), "guard tail written"
    assert not np.isnan(y).any(), f"{int(np.isnan(y).sum())} outputs unwritten"
    err = rel_error(y[:, outs], want.astype(np.float32))
    assert err <= BF16_TOL, f"rel err {err:.2e}"
