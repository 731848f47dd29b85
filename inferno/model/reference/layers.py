"""One decoder layer: `h = x + mixer(norm(x)); out = h + ffn(norm(h))`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inferno.model.config import ModelConfig
from inferno.model.executor import GdnState, KVCache
from inferno.model.reference.attention import AttentionWeights, gated_attention
from inferno.model.reference.ffn import MlpWeights, MoeWeights, ffn
from inferno.model.reference.gdn import GdnWeights, gdn_layer
from inferno.model.reference.norms import rms_norm


@dataclass(frozen=True)
class LayerWeights:
    input_norm: np.ndarray  # [hidden], zero-centred
    post_attention_norm: np.ndarray  # [hidden], zero-centred
    mixer: AttentionWeights | GdnWeights
    ffn: MlpWeights | MoeWeights


def decoder_layer(
    x: np.ndarray,
    w: LayerWeights,
    config: ModelConfig,
    cache: KVCache | GdnState,
    positions: np.ndarray,
) -> np.ndarray:
    """Run one layer over `x` `[T, hidden]`, updating its cache (K/V or GDN state)."""
    h = rms_norm(x, w.input_norm, config.rms_eps)
    if isinstance(w.mixer, AttentionWeights):
        assert isinstance(cache, KVCache)
        h = gated_attention(h, w.mixer, config, cache, positions)
    else:
        assert isinstance(cache, GdnState)
        h = gdn_layer(h, w.mixer, config, cache)
    x = x + h
    return x + ffn(rms_norm(x, w.post_attention_norm, config.rms_eps), w.ffn)
