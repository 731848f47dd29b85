"""Norms and elementwise activations (fp32)."""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """Zero-centred RMSNorm over the last axis: `x / rms(x) * (1 + weight)` (Qwen3_5RMSNorm)."""
    x = x.astype(np.float32, copy=False)
    scale = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))
    return x * scale * (np.float32(1.0) + weight)


def gated_rms_norm(x: np.ndarray, gate: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """GDN output norm: `weight * x / rms(x) * silu(gate)`, plain (not 1 + w) weight, norm then gate."""
    x = x.astype(np.float32, copy=False)
    scale = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))
    return weight * (x * scale) * silu(gate)


def l2_normalize(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """`x / sqrt(sum(x^2) + eps)` over the last axis (FLA / HF `l2norm`)."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + np.float32(eps))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function, stable for large |x|."""
    return np.float32(0.5) * (np.float32(1.0) + np.tanh(np.float32(0.5) * x))


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


def softplus(x: np.ndarray) -> np.ndarray:
    """`log(1 + exp(x))`, exact for large x (torch uses x itself above 20)."""
    return np.logaddexp(np.float32(0.0), x).astype(np.float32, copy=False)
