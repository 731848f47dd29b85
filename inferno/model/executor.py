"""The executor interface every model backend implements, and the explicit per-sequence state.

A `State` is one sequence: per full-attention layer the K/V of every token so far, per Gated
DeltaNet layer the conv state (raw pre-conv inputs of the last K-1 tokens) and the fp32
recurrent state, and the position of the next token. Executors never keep per-sequence data
anywhere else, so states can be created, run, and released independently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from inferno.model.config import ModelConfig


class KVCache:
    """Keys and values of one attention layer, `[T, n_kv_heads, head_dim]` each, growing with T."""

    def __init__(self, n_kv_heads: int, head_dim: int, capacity: int = 64):
        self._k = np.zeros((capacity, n_kv_heads, head_dim), np.float32)
        self._v = np.zeros_like(self._k)
        self.length = 0

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        """Append `[T, n_kv_heads, head_dim]` keys and values (post-norm, post-rope keys)."""
        end = self.length + k.shape[0]
        if end > self._k.shape[0]:
            capacity = max(end, 2 * self._k.shape[0])
            self._k = _grown(self._k, capacity)
            self._v = _grown(self._v, capacity)
        self._k[self.length : end] = k
        self._v[self.length : end] = v
        self.length = end

    @property
    def keys(self) -> np.ndarray:
        return self._k[: self.length]

    @property
    def values(self) -> np.ndarray:
        return self._v[: self.length]


def _grown(a: np.ndarray, capacity: int) -> np.ndarray:
    out = np.zeros((capacity, *a.shape[1:]), a.dtype)
    out[: a.shape[0]] = a
    return out


@dataclass
class GdnState:
    """State of one Gated DeltaNet layer: conv `[conv_dim, K-1]` and recurrent `[Hv, dk, dv]`, fp32."""

    conv: np.ndarray
    recurrent: np.ndarray


@dataclass
class MtpState:
    """The MTP head's own caches: one `KVCache` per MTP layer (draft positions are passed explicitly)."""

    kv: list[KVCache]


@dataclass
class State:
    """One sequence. `kv[i]` for attention layers, `gdn[i]` for GDN layers (i = layer index)."""

    kv: dict[int, KVCache]
    gdn: dict[int, GdnState]
    position: int = 0
    mtp: MtpState | None = None
    released: bool = field(default=False, repr=False)

    @classmethod
    def empty(cls, config: ModelConfig) -> State:
        """A new sequence: empty K/V, zero conv and recurrent states, position 0."""
        kv = {i: KVCache(config.n_kv_heads, config.head_dim) for i in config.attention_layers}
        gdn = {
            i: GdnState(
                conv=np.zeros((config.conv_dim, config.conv_kernel - 1), np.float32),
                recurrent=np.zeros((config.gdn_v_heads, config.gdn_k_dim, config.gdn_v_dim), np.float32),
            )
            for i in config.gdn_layers
        }
        mtp = None
        if config.mtp_layers:
            mtp = MtpState(kv=[KVCache(config.n_kv_heads, config.head_dim) for _ in range(config.mtp_layers)])
        return cls(kv=kv, gdn=gdn, mtp=mtp)


@runtime_checkable
class Executor(Protocol):
    """Runs the model token by token over explicit `State`s."""

    config: ModelConfig

    def new_state(self) -> State: ...

    def prefill(self, tokens: Sequence[int], state: State) -> np.ndarray:
        """Append `tokens` to the state's sequence; return the last token's logits, fp32 `[vocab]`."""
        ...

    def step(self, token: int, state: State) -> np.ndarray:
        """Append one token; return its logits, fp32 `[vocab]`."""
        ...

    def release(self, state: State) -> None: ...
