"""numpy emulation of what cute_kernels/gdn_prefill.py (GdnChunk) computes, step by step.

Same chunk algebra (R = beta (v - exp(G) k S), one triangular solve for v_new, Kd = k exp(G_last - G))
and, with `round_bf16`, the same bf16 roundings of the tensor-core operands (q, k, S, A, v_new, Kd).
The CPU tests check the algebra against A1's reference (exact without rounding) and measure the
error the roundings cost; the GPU tests compare the kernel with the reference and print its
distance to this emulation, which separates "kernel bug" from "expected bf16 error".
"""

from __future__ import annotations

import numpy as np

from inferno.kernels.reference import bf16
from inferno.model.reference.norms import gated_rms_norm, l2_normalize, sigmoid, softplus

CHUNK = 64


def _r(x: np.ndarray, on: bool) -> np.ndarray:
    return x.astype(bf16).astype(np.float32) if on else x.astype(np.float32)


def inputs_to_heads(qkv, a, b, a_log, dt_bias, hk: int, hv: int, d: int = 128):
    """Kernel inputs -> head-major fp32 q, k (normalised, q scaled), v, g, beta as the reference takes them."""
    f = np.asarray(qkv, np.float32)
    t = f.shape[0]
    q = l2_normalize(f[:, : hk * d].reshape(t, hk, d)) * np.float32(d**-0.5)
    k = l2_normalize(f[:, hk * d: 2 * hk * d].reshape(t, hk, d))
    v = f[:, 2 * hk * d: 2 * hk * d + hv * d].reshape(t, hv, d)
    q, k = (np.repeat(x, hv // hk, axis=1).transpose(1, 0, 2) for x in (q, k))
    g = (-np.exp(a_log) * softplus(np.asarray(a, np.float32) + dt_bias)).T  # [Hv, T]
    beta = sigmoid(np.asarray(b, np.float32)).T
    return q, k, v.transpose(1, 0, 2), g.astype(np.float32), beta.astype(np.float32)


def chunk_kernel(q, k, v, g, beta, state, round_bf16: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's chunk loop on head-major inputs (q/k/v [H, T, d], g/beta [H, T], state [H, dk, dv]).

    Returns (o [H, T, dv] before the gated norm, final fp32 state)."""
    h, t, _ = q.shape
    s = state.astype(np.float32, copy=True)
    out = np.empty(v.shape, np.float32)
    lower = np.tril(np.ones((CHUNK, CHUNK), bool))
    for t0 in range(0, t, CHUNK):
        n = min(CHUNK, t - t0)
        pad = ((0, 0), (0, CHUNK - n), (0, 0))
        qc, kc = (_r(np.pad(x[:, t0:t0 + n], pad), round_bf16) for x in (q, k))
        vc = np.pad(v[:, t0:t0 + n], pad)
        gc = np.pad(g[:, t0:t0 + n], ((0, 0), (0, CHUNK - n)))
        bc = np.pad(beta[:, t0:t0 + n], ((0, 0), (0, CHUNK - n)))
        cum = np.cumsum(gc, axis=1)  # [H, C]
        diff = np.minimum(cum[:, :, None] - cum[:, None, :], 0.0)
        dmat = np.where(lower, np.exp(diff), 0.0).astype(np.float32)
        sb = _r(s, round_bf16)
        a_mat = _r((qc @ kc.swapaxes(1, 2)) * dmat, round_bf16)
        l_mat = np.tril(bc[:, :, None] * (kc @ kc.swapaxes(1, 2)) * dmat, -1)
        r = bc[:, :, None] * (vc - np.exp(cum)[:, :, None] * (kc @ sb))
        eye = np.eye(CHUNK, dtype=np.float32)
        vn = _r(np.linalg.solve(l_mat + eye, r).astype(np.float32), round_bf16)
        o = np.exp(cum)[:, :, None] * (qc @ sb) + a_mat @ vn
        out[:, t0:t0 + n] = o[:, :n]
        kd = _r(kc * np.exp(cum[:, -1:] - cum)[:, :, None], round_bf16)
        s = s * np.exp(cum[:, -1])[:, None, None] + kd.swapaxes(1, 2) @ vn
    return out, s


def gated_out(o: np.ndarray, z: np.ndarray, norm_w: np.ndarray, eps: float) -> np.ndarray:
    """Gated RMSNorm of o [H, T, dv] with z [T, H*dv] -> [T, H*dv] fp32."""
    h, t, dv = o.shape
    y = gated_rms_norm(o.transpose(1, 0, 2), np.asarray(z, np.float32).reshape(t, h, dv),
                       np.asarray(norm_w, np.float32), eps)
    return y.reshape(t, h * dv)
