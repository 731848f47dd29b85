"""Tiny random Qwen3.5 models for the model tests: real per-head dims, few layers, small hidden."""

from __future__ import annotations

import numpy as np

from inferno.checkpoint.layout import checkpoint_tensors
from inferno.model.config import ModelConfig
from inferno.model.weights import DictWeights


def tiny_hf_config(moe: bool = False, mtp: bool = True, layers: int = 4) -> dict:
    """A flat HF config.json dict: head_dim 256, GDN heads of 128, 64 rotary dims."""
    text = {
        "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text",
        "vocab_size": 320,
        "hidden_size": 64,
        "num_hidden_layers": layers,
        "full_attention_interval": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "linear_num_key_heads": 1,
        "linear_num_value_heads": 2,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "mtp_num_hidden_layers": 1 if mtp else 0,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1e7,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        "eos_token_id": 3,
    }
    if moe:
        text.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
    else:
        text["intermediate_size"] = 128
    return text


def tensor_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every text and MTP tensor of the model (canonical names, fused experts) with its HF shape."""
    dims = {
        "hidden_size": c.hidden, "vocab_size": c.vocab, "layer_types": list(c.layer_types),
        "tie_word_embeddings": c.tie_embeddings, "head_dim": c.head_dim, "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads, "linear_num_key_heads": c.gdn_k_heads,
        "linear_num_value_heads": c.gdn_v_heads, "linear_key_head_dim": c.gdn_k_dim,
        "linear_value_head_dim": c.gdn_v_dim, "linear_conv_kernel_dim": c.conv_kernel,
        "intermediate_size": c.intermediate, "num_experts": c.n_experts, "moe_intermediate_size": c.moe_intermediate,
        "shared_expert_intermediate_size": c.shared_intermediate, "mtp_num_hidden_layers": c.mtp_layers,
    }
    return dict(checkpoint_tensors(dims, None, c.is_moe))


def random_tensors(c: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights with logits of order 1: matrices ~ N(0, 1/fan_in), norms 0.2*N (+1 for the GDN norm)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in tensor_shapes(c).items():
        r = rng.standard_normal(shape).astype(np.float32)
        if name.endswith("A_log"):
            out[name] = rng.uniform(0.0, 2.0, shape).astype(np.float32)
        elif name.endswith("dt_bias"):
            out[name] = 0.5 * r
        elif name.endswith("linear_attn.norm.weight"):
            out[name] = 1.0 + 0.2 * r
        elif "norm" in name:
            out[name] = 0.2 * r
        else:
            out[name] = r / np.float32(np.sqrt(shape[-1]))
    return out


def tiny_model(moe: bool = False, seed: int = 0, mtp: bool = True, layers: int = 4) -> tuple[ModelConfig, DictWeights]:
    config = ModelConfig.from_hf(tiny_hf_config(moe=moe, mtp=mtp, layers=layers))
    return config, DictWeights(random_tensors(config, seed))


def tiny_groupwise_artifact(root):
    """The tiny dense model converted to a groupwise-int `.ninfer` under `root` (its path)."""
    from inferno.artifact.convert import convert
    from inferno.checkpoint.synth import synthesize

    return convert(synthesize("tiny-dense", root / "ckpt"), root / "tiny.ninfer", "groupwise-int", progress=False)


def artifact_inventory(path):
    """(config, {tensor name: inventory entry}) of an artifact."""
    from inferno.artifact import open_checked

    a, _spec, config, expected = open_checked(path)
    a.close()
    return config, {e.name: e for e in expected}
