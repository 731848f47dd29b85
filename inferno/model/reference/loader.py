"""Pull a model's tensors out of a `Weights` once, as fp32, shape-checked against the config."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inferno.errors import ArtifactError
from inferno.model.config import ModelConfig
from inferno.model.reference.attention import AttentionWeights
from inferno.model.reference.ffn import MlpWeights, MoeWeights
from inferno.model.reference.gdn import GdnWeights
from inferno.model.reference.layers import LayerWeights
from inferno.model.reference.mtp import MtpWeights
from inferno.model.weights import TEXT_PREFIX, Weights

MTP_PREFIX = "mtp."


@dataclass(frozen=True)
class ModelWeights:
    embed: np.ndarray  # [vocab, hidden]
    norm: np.ndarray  # [hidden]
    lm_head: np.ndarray  # [hidden, vocab], transposed (the embedding's transpose when tied)
    layers: tuple[LayerWeights, ...]
    mtp: MtpWeights | None  # None when the config has no MTP layers or the checkpoint no `mtp.*` tensors


class _Reader:
    def __init__(self, weights: Weights):
        self.weights = weights

    def take(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        array = np.ascontiguousarray(self.weights.get(name), dtype=np.float32)
        if array.shape != shape:
            raise ArtifactError(
                f"tensor {name} has shape {list(array.shape)} but the config needs {list(shape)}; "
                "the checkpoint does not match its config.json"
            )
        return array

    def linear(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A `[..., out, in]` projection, returned transposed and contiguous (`[..., in, out]`): `y = x @ w`."""
        return np.ascontiguousarray(self.take(name, shape).swapaxes(-1, -2))


def load_model_weights(config: ModelConfig, weights: Weights) -> ModelWeights:
    """All tensors the reference executor needs, fp32. Missing or mis-shaped tensors raise `ArtifactError`."""
    r = _Reader(weights)
    h, vocab = config.hidden, config.vocab
    embed = r.take(f"{TEXT_PREFIX}embed_tokens.weight", (vocab, h))
    lm_head = np.ascontiguousarray(embed.T) if config.tie_embeddings else r.linear("lm_head.weight", (vocab, h))
    layers = tuple(
        _layer(r, config, f"{TEXT_PREFIX}layers.{i}.", config.layer_types[i]) for i in range(config.n_layers)
    )
    has_mtp = config.mtp_layers > 0 and f"{MTP_PREFIX}fc.weight" in weights
    mtp = _mtp(r, config) if has_mtp else None
    return ModelWeights(
        embed=embed, norm=r.take(f"{TEXT_PREFIX}norm.weight", (h,)), lm_head=lm_head, layers=layers, mtp=mtp
    )


def _layer(r: _Reader, config: ModelConfig, p: str, kind: str) -> LayerWeights:
    h = config.hidden
    mixer = _attention(r, config, p + "self_attn.") if kind == "full_attention" else _gdn(r, config, p + "linear_attn.")
    return LayerWeights(
        input_norm=r.take(p + "input_layernorm.weight", (h,)),
        post_attention_norm=r.take(p + "post_attention_layernorm.weight", (h,)),
        mixer=mixer,
        ffn=_moe(r, config, p + "mlp.") if config.is_moe else _mlp(r, config, p + "mlp.", config.intermediate),
    )


def _attention(r: _Reader, c: ModelConfig, p: str) -> AttentionWeights:
    h, hd = c.hidden, c.head_dim
    return AttentionWeights(
        q_proj=r.linear(p + "q_proj.weight", (c.n_heads * 2 * hd, h)),
        k_proj=r.linear(p + "k_proj.weight", (c.n_kv_heads * hd, h)),
        v_proj=r.linear(p + "v_proj.weight", (c.n_kv_heads * hd, h)),
        o_proj=r.linear(p + "o_proj.weight", (h, c.n_heads * hd)),
        q_norm=r.take(p + "q_norm.weight", (hd,)),
        k_norm=r.take(p + "k_norm.weight", (hd,)),
    )


def _gdn(r: _Reader, c: ModelConfig, p: str) -> GdnWeights:
    h, hv = c.hidden, c.gdn_v_heads
    return GdnWeights(
        in_proj_qkv=r.linear(p + "in_proj_qkv.weight", (c.conv_dim, h)),
        in_proj_z=r.linear(p + "in_proj_z.weight", (c.gdn_value_width, h)),
        in_proj_b=r.linear(p + "in_proj_b.weight", (hv, h)),
        in_proj_a=r.linear(p + "in_proj_a.weight", (hv, h)),
        conv=r.take(p + "conv1d.weight", (c.conv_dim, 1, c.conv_kernel))[:, 0, :].copy(),
        a_log=r.take(p + "A_log", (hv,)),
        dt_bias=r.take(p + "dt_bias", (hv,)),
        norm=r.take(p + "norm.weight", (c.gdn_v_dim,)),
        out_proj=r.linear(p + "out_proj.weight", (h, c.gdn_value_width)),
    )


def _mlp(r: _Reader, c: ModelConfig, p: str, inter: int) -> MlpWeights:
    h = c.hidden
    return MlpWeights(
        gate_proj=r.linear(p + "gate_proj.weight", (inter, h)),
        up_proj=r.linear(p + "up_proj.weight", (inter, h)),
        down_proj=r.linear(p + "down_proj.weight", (h, inter)),
    )


def _moe(r: _Reader, c: ModelConfig, p: str) -> MoeWeights:
    h, e, inter = c.hidden, c.n_experts, c.moe_intermediate
    return MoeWeights(
        router=r.linear(p + "gate.weight", (e, h)),
        gate_up_proj=r.linear(p + "experts.gate_up_proj", (e, 2 * inter, h)),
        down_proj=r.linear(p + "experts.down_proj", (e, h, inter)),
        shared=_mlp(r, c, p + "shared_expert.", c.shared_intermediate),
        shared_gate=r.linear(p + "shared_expert_gate.weight", (1, h)),
        top_k=c.top_k,
    )


def _mtp(r: _Reader, c: ModelConfig) -> MtpWeights:
    h = c.hidden
    return MtpWeights(
        fc=r.linear(MTP_PREFIX + "fc.weight", (h, 2 * h)),
        pre_fc_norm_embedding=r.take(MTP_PREFIX + "pre_fc_norm_embedding.weight", (h,)),
        pre_fc_norm_hidden=r.take(MTP_PREFIX + "pre_fc_norm_hidden.weight", (h,)),
        norm=r.take(MTP_PREFIX + "norm.weight", (h,)),
        layers=tuple(_layer(r, c, f"{MTP_PREFIX}layers.{i}.", "full_attention") for i in range(c.mtp_layers)),
    )
