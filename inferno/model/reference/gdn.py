"""Gated DeltaNet (linear attention) layer: short causal conv, gated delta rule, gated RMSNorm.

The delta rule has two forms that compute the same thing: `recurrent_delta_rule` (one token at
a time; decode) and `chunked_delta_rule` (chunks of 64 with a triangular solve per chunk, as in
transformers' `torch_chunk_gated_delta_rule`; prefill). Both continue from a carried state.
Head-major layout: q/k `[Hv, T, dk]` (already expanded from key heads), v `[Hv, T, dv]`,
g/beta `[Hv, T]`, state `[Hv, dk, dv]`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inferno.model.config import ModelConfig
from inferno.model.executor import GdnState
from inferno.model.reference.norms import gated_rms_norm, l2_normalize, sigmoid, silu, softplus

CHUNK = 64


@dataclass(frozen=True)
class GdnWeights:
    """Projections are stored transposed, `[in, out]`: `y = x @ w`."""

    in_proj_qkv: np.ndarray  # [hidden, conv_dim]: columns [q | k | v]
    in_proj_z: np.ndarray  # [hidden, Hv * dv]
    in_proj_b: np.ndarray  # [hidden, Hv]
    in_proj_a: np.ndarray  # [hidden, Hv]
    conv: np.ndarray  # [conv_dim, K] (conv1d.weight squeezed); tap K-1 multiplies the current token
    a_log: np.ndarray  # [Hv]
    dt_bias: np.ndarray  # [Hv]
    norm: np.ndarray  # [dv], plain weight
    out_proj: np.ndarray  # [Hv * dv, hidden]


def causal_conv(x: np.ndarray, conv_state: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal conv of `x` `[T, C]` after the carried raw inputs `conv_state` `[C, K-1]`.

    Returns (conv output `[T, C]` before activation, new conv state: the last K-1 raw inputs).
    """
    t = x.shape[0]
    k = weight.shape[1]
    xin = np.concatenate([conv_state.T, x], axis=0)  # [K-1+T, C]
    out = np.zeros_like(x)
    for tap in range(k):
        out += xin[tap : tap + t] * weight[:, tap]
    return out, np.ascontiguousarray(xin[xin.shape[0] - (k - 1) :].T)


def recurrent_delta_rule(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Token-by-token gated delta rule. Returns (output `[Hv, T, dv]`, final state)."""
    s = state.astype(np.float32, copy=True)
    out = np.empty(v.shape, np.float32)
    decay = np.exp(g)
    for t in range(q.shape[1]):
        s *= decay[:, t, None, None]
        kt = k[:, t]
        predicted = np.einsum("hk,hkv->hv", kt, s)
        delta = (v[:, t] - predicted) * beta[:, t, None]
        s += kt[:, :, None] * delta[:, None, :]
        out[:, t] = np.einsum("hk,hkv->hv", q[:, t], s)
    return out, s


def chunked_delta_rule(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
    chunk: int = CHUNK,
) -> tuple[np.ndarray, np.ndarray]:
    """Chunked gated delta rule (UT transform per chunk). Returns (output `[Hv, T, dv]`, final state)."""
    heads, t, _ = k.shape
    dv = v.shape[-1]
    pad = -t % chunk
    if pad:  # zero-padded tail steps have g = 0 and beta = 0: they leave the state unchanged
        q, k, v = (np.pad(a, ((0, 0), (0, pad), (0, 0))) for a in (q, k, v))
        g, beta = (np.pad(a, ((0, 0), (0, pad))) for a in (g, beta))
    n = (t + pad) // chunk
    q, k, v = (a.reshape(heads, n, chunk, -1) for a in (q, k, v))
    g, beta = g.reshape(heads, n, chunk), beta.reshape(heads, n, chunk)

    cum = np.cumsum(g, axis=-1)  # [H, N, C] log-decay from the chunk start through step i
    lower = np.tril(np.ones((chunk, chunk), bool))
    with np.errstate(under="ignore"):
        pair_decay = np.exp(np.where(lower, cum[..., :, None] - cum[..., None, :], -np.inf))  # [H,N,C,C]
        k_beta = k * beta[..., None]
        v_beta = v * beta[..., None]
        # (I + L) with L the strictly-lower part of (k_beta k^T) * decay; solve for new values and decayed keys
        system = np.tril((k_beta @ k.swapaxes(-1, -2)) * pair_decay, -1) + np.eye(chunk, dtype=np.float32)
        rhs = np.concatenate([v_beta, k_beta * np.exp(cum)[..., None]], axis=-1)
        solved = np.linalg.solve(system, rhs)
        new_values, decayed_keys = solved[..., :dv], solved[..., dv:]
        intra = (q @ k.swapaxes(-1, -2)) * pair_decay  # lower incl. diagonal
        q_decayed = q * np.exp(cum)[..., None]
        k_to_end = k * np.exp(cum[..., -1:] - cum)[..., None]
        chunk_decay = np.exp(cum[..., -1])  # [H, N]

    s = state.astype(np.float32, copy=True)
    out = np.empty((heads, n, chunk, dv), np.float32)
    for i in range(n):
        fresh = new_values[:, i] - decayed_keys[:, i] @ s
        out[:, i] = q_decayed[:, i] @ s + intra[:, i] @ fresh
        s = s * chunk_decay[:, i, None, None] + k_to_end[:, i].swapaxes(-1, -2) @ fresh
    return out.reshape(heads, n * chunk, dv)[:, :t], s


def gdn_layer(x: np.ndarray, w: GdnWeights, config: ModelConfig, state: GdnState) -> np.ndarray:
    """Gated DeltaNet mixer for `x` `[T, hidden]` (normed input); updates `state` in place.

    One token uses the recurrent form, longer inputs the chunked form (as transformers does).
    """
    t = x.shape[0]
    hk, hv = config.gdn_k_heads, config.gdn_v_heads
    dk, dv = config.gdn_k_dim, config.gdn_v_dim
    kw = config.gdn_key_width

    conv_out, state.conv = causal_conv(x @ w.in_proj_qkv, state.conv, w.conv)
    mixed = silu(conv_out)
    q = mixed[:, :kw].reshape(t, hk, dk)
    k = mixed[:, kw : 2 * kw].reshape(t, hk, dk)
    v = mixed[:, 2 * kw :].reshape(t, hv, dv)

    beta = sigmoid(x @ w.in_proj_b)  # [T, Hv]
    g = -np.exp(w.a_log) * softplus(x @ w.in_proj_a + w.dt_bias)  # [T, Hv], <= 0

    q = l2_normalize(q) * np.float32(dk**-0.5)
    k = l2_normalize(k)
    group = hv // hk  # value head j reads key head j // group
    q, k = (np.repeat(a, group, axis=1).transpose(1, 0, 2) for a in (q, k))
    v = v.transpose(1, 0, 2)
    rule = recurrent_delta_rule if t == 1 else chunked_delta_rule
    o, state.recurrent = rule(q, k, v, g.T, beta.T, state.recurrent)

    z = (x @ w.in_proj_z).reshape(t, hv, dv)
    o = gated_rms_norm(o.transpose(1, 0, 2), z, w.norm, config.rms_eps)
    return o.reshape(t, hv * dv) @ w.out_proj
