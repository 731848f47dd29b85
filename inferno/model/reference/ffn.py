"""Feed-forward blocks: SwiGLU MLP and the Qwen3.5 MoE (softmax router, top-k, sigmoid-gated shared expert)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inferno.model.reference.norms import sigmoid, silu


@dataclass(frozen=True)
class MlpWeights:
    """Projections are stored transposed, `[in, out]`: `y = x @ w`."""

    gate_proj: np.ndarray  # [hidden, I]
    up_proj: np.ndarray  # [hidden, I]
    down_proj: np.ndarray  # [I, hidden]


@dataclass(frozen=True)
class MoeWeights:
    """Projections are stored transposed, `[..., in, out]`: `y = x @ w`."""

    router: np.ndarray  # [hidden, E]  (mlp.gate.weight)
    gate_up_proj: np.ndarray  # [E, hidden, 2I], gate columns first
    down_proj: np.ndarray  # [E, I, hidden]
    shared: MlpWeights
    shared_gate: np.ndarray  # [hidden, 1]
    top_k: int


def mlp(x: np.ndarray, w: MlpWeights) -> np.ndarray:
    """`down(silu(gate(x)) * up(x))` for `x` `[T, hidden]`."""
    return (silu(x @ w.gate_proj) * (x @ w.up_proj)) @ w.down_proj


def route(x: np.ndarray, router: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Softmax over all experts (fp32), top-k, renormalise. Returns (experts `[T, k]`, weights `[T, k]`)."""
    logits = x @ router
    logits = logits - logits.max(axis=-1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=-1, keepdims=True)
    experts = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(probs, experts, axis=-1)
    return experts, weights / weights.sum(axis=-1, keepdims=True)


def moe(x: np.ndarray, w: MoeWeights) -> np.ndarray:
    """Routed experts plus `sigmoid(shared_gate(x)) * shared_expert(x)` for `x` `[T, hidden]`."""
    experts, weights = route(x, w.router, w.top_k)
    inter = w.down_proj.shape[1]
    out = np.zeros_like(x)
    for e in np.unique(experts):
        rows, slots = np.nonzero(experts == e)  # a token picks an expert at most once
        gu = x[rows] @ w.gate_up_proj[e]
        h = silu(gu[:, :inter]) * gu[:, inter:]
        out[rows] += (h @ w.down_proj[e]) * weights[rows, slots, None]
    return out + sigmoid(x @ w.shared_gate) * mlp(x, w.shared)


def ffn(x: np.ndarray, w: MlpWeights | MoeWeights) -> np.ndarray:
    """The layer's FFN: dense MLP or MoE."""
    return moe(x, w) if isinstance(w, MoeWeights) else mlp(x, w)
