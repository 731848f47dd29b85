"""numpy references for the kernels (fp32 math on bf16 inputs), and the bf16 error measure."""

from __future__ import annotations

import ml_dtypes
import numpy as np

bf16 = ml_dtypes.bfloat16


def f32(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float32)


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """y = x * rsqrt(mean(x^2) + eps) * (1 + w), fp32, on the last axis."""
    xf = f32(x)
    scale = 1.0 / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + np.float32(eps))
    return xf * scale * (1.0 + f32(w))


def add_rmsnorm(x: np.ndarray, r: np.ndarray, w: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(h, y): h = bf16(x + r); y = rmsnorm(h)."""
    h = (f32(x) + f32(r)).astype(bf16)
    return f32(h), rmsnorm(h, w, eps)


def silu_mul(gu: np.ndarray) -> np.ndarray:
    g, u = np.split(f32(gu), 2, axis=-1)
    return g / (1.0 + np.exp(-g)) * u


def embedding(ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    out = np.zeros((len(ids), table.shape[1]), np.float32)
    ok = (ids >= 0) & (ids < table.shape[0])
    out[ok] = f32(table[ids[ok]])
    return out


def gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A @ B^T in float64 (the reference), returned as fp32."""
    return (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.float32)


def rel_error(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref|| (inf when out has a NaN/inf)."""
    o, r = f32(out).astype(np.float64), f32(ref).astype(np.float64)
    if not np.all(np.isfinite(o)):
        return float("inf")
    denom = np.linalg.norm(r)
    return float(np.linalg.norm(o - r) / (denom if denom else 1.0))


# bf16 keeps 8 significant bits: a single rounding is <= 2^-9 relative; allow a few roundings.
BF16_TOL = 1e-2
