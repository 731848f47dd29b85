"""One decode-GEMV call on the live GPU checked against a numpy reference: fresh random x (and r),
a poisoned output with a guard tail, sampled outputs on big shapes (the GPU GEMV tests share it)."""

from __future__ import annotations

import numpy as np

from inferno.cuda.copy import from_device, memset_d8, to_device
from inferno.cuda.memory import device_alloc
from inferno.kernels.reference import BF16_TOL, bf16, rel_error

GUARD = 256
SAMPLE = 384


def rms_normed(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """bf16 zero-centred RMSNorm of the rows of x (fp32 math, as cute_kernels/rmsnorm.py)."""
    xf = x.astype(np.float32)
    rs = np.float32(1.0) / np.sqrt((xf * xf).sum(-1, keepdims=True) / np.float32(x.shape[-1]) + np.float32(eps))
    return (xf * rs * (w.astype(np.float32) + np.float32(1.0))).astype(bf16)


def check_gemv(kern, dw, epilogue: str, n: int, k: int, cols: int, rng, reference, norm: bool = False) -> None:
    """Run `kern(dw, x, y, n, k, cols, r=)` on fresh x (and r) and assert its bf16 outputs against
    `reference(x, r[:, outs], outs)` (float, [cols, len(outs)]) on the outputs `outs` it samples.
    `norm`: the kernel RMS-norms x (a fresh weight, `norm=(weight, eps)`); the reference gets the normed x."""
    m = n // 2 if epilogue == "swiglu" else n
    x = rng.standard_normal((cols, k), np.float32).astype(bf16)
    r = rng.standard_normal((cols, m), np.float32).astype(bf16) if epilogue == "residual" else None
    nw = (rng.standard_normal(k, np.float32) * 0.2).astype(bf16) if norm else None
    if norm:
        x = (x.astype(np.float32) * 4 + 1).astype(bf16)  # not unit RMS, not zero mean
    dx = to_device(None, x, "x")
    dr = to_device(None, r, "r") if r is not None else None
    dnw = to_device(None, nw, "nw") if norm else None
    out_bytes = cols * m * 2
    dy = device_alloc(out_bytes + GUARD, "y")
    memset_d8(dy, 0xFF)  # bf16 0xFFFF is a NaN: an unwritten output shows
    try:
        kern(dw, dx, dy, n, k, cols, r=dr, **({"norm": (dnw, 1e-6)} if norm else {}))
        raw = from_device(dy, np.uint8, (out_bytes + GUARD,))
    finally:
        for b in (dx, dr, dy, dnw):
            if b is not None:
                b.free()
    if norm:
        x = rms_normed(x, nw, 1e-6)
    y = raw[:out_bytes].view(bf16).reshape(cols, m).astype(np.float32)
    outs = np.arange(m) if m <= SAMPLE else np.unique(np.r_[0, m - 1, rng.choice(m, SAMPLE, replace=False)])
    want = np.asarray(reference(x.astype(np.float32), r[:, outs].astype(np.float32) if r is not None else None,
                                outs), np.float64)
    what = f"{getattr(kern, 'name', type(kern).__name__)} {epilogue} [{n}, {k}] T={cols}"
    assert np.all(raw[out_bytes:] == 0xFF), f"{what}: guard tail written"
    bad = np.argwhere(np.isnan(y))
    assert not len(bad), f"{what}: {len(bad)} outputs unwritten, first (t, o) = {tuple(bad[0])}"
    got = y[:, outs]
    err = rel_error(got, want.astype(np.float32))
    t, j = np.unravel_index(np.argmax(np.abs(got - want)), got.shape)
    assert err <= BF16_TOL, (f"{what}: rel err {err:.2e}; worst t={t} o={outs[j]}: got {got[t, j]:.5g}, "
                             f"want {want[t, j]:.5g}")
