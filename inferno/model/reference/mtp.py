"""The multi-token-prediction (MTP) head.

For draft position p: `u = fc([norm_e(embed(token[p+1])), norm_h(hidden[p])])`, one gated
full-attention decoder layer at rope position p with its own K/V cache, then `mtp.norm`; the
result goes through the shared lm head and predicts token p+2. `hidden[p]` is the target model's
final-normed hidden state (the lm head input); for further draft steps it is the previous MTP
output (after `mtp.norm`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inferno.model.config import ModelConfig
from inferno.model.executor import KVCache
from inferno.model.reference.layers import LayerWeights, decoder_layer
from inferno.model.reference.norms import rms_norm


@dataclass(frozen=True)
class MtpWeights:
    fc: np.ndarray  # [2 * hidden, hidden] (transposed): input = [embedding | hidden]
    pre_fc_norm_embedding: np.ndarray  # [hidden]
    pre_fc_norm_hidden: np.ndarray  # [hidden]
    norm: np.ndarray  # [hidden]
    layers: tuple[LayerWeights, ...]


def mtp_hidden(
    embedded: np.ndarray,
    hidden: np.ndarray,
    w: MtpWeights,
    config: ModelConfig,
    layer: int,
    cache: KVCache,
    positions: np.ndarray,
) -> np.ndarray:
    """MTP output hidden states `[T, hidden]` (after `mtp.norm`) from next-token embeddings and hidden states."""
    e = rms_norm(embedded, w.pre_fc_norm_embedding, config.rms_eps)
    h = rms_norm(hidden, w.pre_fc_norm_hidden, config.rms_eps)
    u = np.concatenate([e, h], axis=-1) @ w.fc
    u = decoder_layer(u, w.layers[layer], config, cache, positions)
    return rms_norm(u, w.norm, config.rms_eps)
