"""Gated full attention: per-head [q | gate] projection, q/k norm, partial RoPE, GQA, sigmoid gate."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inferno.model.config import ModelConfig
from inferno.model.executor import KVCache
from inferno.model.reference.norms import rms_norm, sigmoid
from inferno.model.reference.rope import apply_rope, rope_tables


@dataclass(frozen=True)
class AttentionWeights:
    """Projections are stored transposed, `[in, out]`: `y = x @ w`."""

    q_proj: np.ndarray  # [hidden, n_heads * 2 * head_dim], per head [q | gate]
    k_proj: np.ndarray  # [hidden, n_kv_heads * head_dim]
    v_proj: np.ndarray  # [hidden, n_kv_heads * head_dim]
    o_proj: np.ndarray  # [n_heads * head_dim, hidden]
    q_norm: np.ndarray  # [head_dim], zero-centred
    k_norm: np.ndarray  # [head_dim], zero-centred


def gated_attention(
    x: np.ndarray, w: AttentionWeights, config: ModelConfig, cache: KVCache, positions: np.ndarray
) -> np.ndarray:
    """Attend `x` `[T, hidden]` (normed input) causally over the cache plus itself; appends K/V."""
    t = x.shape[0]
    hd, hq, hkv = config.head_dim, config.n_heads, config.n_kv_heads
    qg = (x @ w.q_proj).reshape(t, hq, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(t, hq * hd)
    k = (x @ w.k_proj).reshape(t, hkv, hd)
    v = (x @ w.v_proj).reshape(t, hkv, hd)
    q = rms_norm(q, w.q_norm, config.rms_eps)
    k = rms_norm(k, w.k_norm, config.rms_eps)
    cos, sin = rope_tables(config, positions)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    cache.append(k, v)
    o = causal_attention(q, cache.keys, cache.values, scale=hd**-0.5)
    o = o.reshape(t, hq * hd) * sigmoid(gate)
    return o @ w.o_proj


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """Softmax attention (fp32) of the last T of S positions. q `[T, Hq, d]`, k/v `[S, Hkv, d]` -> `[T, Hq, d]`.

    Query head h reads kv head h // (Hq / Hkv); query i sits at position S - T + i and sees keys 0..S-T+i.
    """
    t, hq, d = q.shape
    s, hkv, _ = k.shape
    group = hq // hkv
    qh = q.reshape(t, hkv, group, d).transpose(1, 2, 0, 3)  # [Hkv, g, T, d]
    scores = (qh @ k.transpose(1, 2, 0)[:, None]) * np.float32(scale)  # [Hkv, g, T, S]
    visible = np.arange(s)[None, :] <= (s - t + np.arange(t))[:, None]  # [T, S]
    scores = np.where(visible, scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    o = probs @ v.transpose(1, 0, 2)[:, None]  # [Hkv, g, T, d]
    return o.transpose(2, 0, 1, 3).reshape(t, hq, d)
