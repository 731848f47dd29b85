"""Synthetic checkpoint presets: the HF `config.json` each `inferno synth PRESET` writes.

Tiny presets keep the real per-head geometry (attention head_dim 256 with 64 rotary dims and
mrope_section [11, 11, 10]; GDN key/value head dim 128; conv kernel 4) and shrink everything else:

| field | tiny-dense | tiny-moe |
|---|---|---|
| hidden / layers | 256 / 4 ([lin, lin, lin, full]) | same |
| attention q / kv heads | 4 / 2 (GQA 2) | same |
| GDN key / value heads | 2 / 4 (2 value heads per key head) | same |
| FFN | dense, intermediate 512 | 8 experts top-2, expert 128, shared 128 |
| vocab | 2048 (Qwen added tokens at 1984..2016) | same |
| MTP layers | 1 (dense MLP) | 1 (MoE block) |
| vision | depth 2, hidden 32, 2 heads, intermediate 64, 16 positions, out 256 | same |

Two heads per group on both mixers, so an engine that maps value head j to key head j % Hk
(instead of j // (Hv/Hk)), or query head h to kv head h % Hkv, fails the goldens.

Full-size presets carry the published Qwen3.6 numbers (research note qwen35-architecture §2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferno.errors import UsageError

ROPE = {
    "mrope_interleaved": True,
    "mrope_section": [11, 11, 10],
    "rope_type": "default",
    "rope_theta": 10000000,
    "partial_rotary_factor": 0.25,
}


@dataclass(frozen=True)
class Preset:
    """A synthetic model: its text and vision config (HF field names) and how to fill weights."""

    name: str
    moe: bool
    text: dict
    vision: dict
    tiled_fill: bool = False  # big presets: a per-tensor random block tiled over the tensor
    shard_bytes: int = 5 * 1024**3
    description: str = field(default="", compare=False)


def _layer_types(n_layers: int, interval: int = 4) -> list[str]:
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]


def _text(moe: bool, **numbers) -> dict:
    text = {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "dtype": "bfloat16",
        "full_attention_interval": 4,
        "head_dim": 256,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 262144,
        "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text",
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-06,
        "rope_parameters": dict(ROPE),
        "tie_word_embeddings": False,
        "use_cache": True,
    }
    if moe:
        text["output_router_logits"] = False
        text["router_aux_loss_coef"] = 0.001
    text.update(numbers)
    text["layer_types"] = _layer_types(text["num_hidden_layers"])
    return dict(sorted(text.items()))


def _vision(moe: bool, **numbers) -> dict:
    vision = {
        "deepstack_visual_indexes": [],
        "hidden_act": "gelu_pytorch_tanh",
        "in_channels": 3,
        "initializer_range": 0.02,
        "model_type": "qwen3_5_moe_vision" if moe else "qwen3_5_vision",
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    vision.update(numbers)
    return dict(sorted(vision.items()))


_TINY = dict(
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    vocab_size=2048,
)
_TINY_VISION = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, num_position_embeddings=16, out_hidden_size=256)
_FULL_VISION = dict(depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304, num_position_embeddings=2304)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "tiny-dense",
            moe=False,
            text=_text(False, intermediate_size=512, **_TINY),
            vision=_vision(False, **_TINY_VISION),
            description="tiny dense Qwen3.5 (real head dims), ~14 MB",
        ),
        Preset(
            "tiny-moe",
            moe=True,
            text=_text(
                True,
                num_experts=8,
                num_experts_per_tok=2,
                moe_intermediate_size=128,
                shared_expert_intermediate_size=128,
                **_TINY,
            ),
            vision=_vision(True, **_TINY_VISION),
            description="tiny MoE Qwen3.5 (8 experts top-2), ~19 MB",
        ),
        Preset(
            "qwen3.6-27b",
            moe=False,
            text=_text(
                False,
                hidden_size=5120,
                num_hidden_layers=64,
                num_attention_heads=24,
                num_key_value_heads=4,
                linear_num_key_heads=16,
                linear_num_value_heads=48,
                intermediate_size=17408,
                vocab_size=248320,
            ),
            vision=_vision(False, out_hidden_size=5120, **_FULL_VISION),
            tiled_fill=True,
            description="Qwen3.6-27B shapes, random weights, ~56 GB",
        ),
        Preset(
            "qwen3.6-35b-a3b",
            moe=True,
            text=_text(
                True,
                hidden_size=2048,
                num_hidden_layers=40,
                num_attention_heads=16,
                num_key_value_heads=2,
                linear_num_key_heads=16,
                linear_num_value_heads=32,
                num_experts=256,
                num_experts_per_tok=8,
                moe_intermediate_size=512,
                shared_expert_intermediate_size=512,
                vocab_size=248320,
            ),
            vision=_vision(True, out_hidden_size=2048, **_FULL_VISION),
            tiled_fill=True,
            description="Qwen3.6-35B-A3B shapes, random weights, ~72 GB",
        ),
    )
}


def get_preset(name: str) -> Preset:
    """The preset called `name`; UsageError listing the choices otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UsageError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}") from None
