"""ModelConfig.from_hf / from_dir: layouts, normalisation, and bad configs."""

import copy
import json

import pytest

from inferno.errors import ConfigError
from inferno.model.config import ModelConfig
from model_fixtures import tiny_hf_config

ROPE = {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10], "mrope_interleaved": True}


def official_27b() -> dict:
    """The Qwen3.6-27B config.json shape: VLM layout, text_config nested (research note §2)."""
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "tie_word_embeddings": False,
        "eos_token_id": 248046,
        "text_config": {
            "model_type": "qwen3_5_text", "hidden_size": 5120, "num_hidden_layers": 64,
            "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
            "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "intermediate_size": 17408,
            "vocab_size": 248320, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
            "full_attention_interval": 4, "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
            "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
            "eos_token_id": 248044, "rope_parameters": dict(ROPE),
        },
        "vision_config": {"depth": 27, "hidden_size": 1152, "out_hidden_size": 5120},
    }


def official_35b_a3b() -> dict:
    cfg = official_27b()
    cfg["model_type"] = "qwen3_5_moe"
    t = cfg["text_config"]
    t.update(model_type="qwen3_5_moe_text", hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
             num_key_value_heads=2, linear_num_value_heads=32, num_experts=256, num_experts_per_tok=8,
             moe_intermediate_size=512, shared_expert_intermediate_size=512)
    del t["intermediate_size"]
    cfg["vision_config"]["out_hidden_size"] = 2048
    return cfg


def test_nested_dense_27b():
    c = ModelConfig.from_hf(official_27b(), {"eos_token_id": [248046, 248044]})
    assert c.model_type == "qwen3_5" and not c.is_moe
    assert (c.hidden, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim) == (5120, 64, 24, 4, 256)
    assert c.rotary_dim == 64 and c.rope_theta == 1e7 and c.mrope_section == (11, 11, 10) and c.mrope_interleaved
    assert (c.gdn_k_heads, c.gdn_v_heads, c.gdn_k_dim, c.gdn_v_dim, c.conv_kernel) == (16, 48, 128, 128, 4)
    assert c.conv_dim == 10240 and c.gdn_value_width == 6144
    assert c.attention_layers == tuple(range(3, 64, 4)) and len(c.gdn_layers) == 48
    assert c.intermediate == 17408 and c.n_experts == 0
    assert c.vocab == 248320 and c.rms_eps == 1e-6 and c.max_position == 262144
    assert not c.tie_embeddings and c.mtp_layers == 1
    assert c.eos_token_ids == (248046, 248044)
    assert c.vision["out_hidden_size"] == 5120


def test_nested_moe_35b():
    c = ModelConfig.from_hf(official_35b_a3b())
    assert c.is_moe and c.model_type == "qwen3_5_moe"
    assert (c.n_experts, c.top_k, c.moe_intermediate, c.shared_intermediate, c.intermediate) == (256, 8, 512, 512, 0)
    assert c.conv_dim == 8192 and len(c.attention_layers) == 10
    assert c.eos_token_ids == (248044, 248046)  # text_config first, then top level


def test_flat_text_config_and_from_dir(tmp_path):
    flat = tiny_hf_config(moe=True)
    (tmp_path / "config.json").write_text(json.dumps(flat))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 3]}))
    c = ModelConfig.from_dir(tmp_path)
    assert c.model_type == "qwen3_5_moe_text" and c.is_moe and c.vision is None
    assert c.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert c.eos_token_ids == (7, 3)
    assert c == ModelConfig.from_hf(flat, {"eos_token_id": [7, 3]})


def test_layer_types_explicit_and_derived():
    cfg = tiny_hf_config(layers=6)
    cfg["full_attention_interval"] = 2
    assert ModelConfig.from_hf(cfg).attention_layers == (1, 3, 5)
    del cfg["full_attention_interval"]
    assert ModelConfig.from_hf(cfg).attention_layers == (3,)  # transformers' default interval 4
    cfg["layer_types"] = ["full_attention"] + ["linear_attention"] * 5
    assert ModelConfig.from_hf(cfg).attention_layers == (0,)


def test_old_top_level_rope_fields():
    cfg = tiny_hf_config()
    del cfg["rope_parameters"]
    cfg.update(rope_theta=5e6, partial_rotary_factor=0.5, rope_scaling={"type": "default", "mrope_section": [22, 22, 20]})
    c = ModelConfig.from_hf(cfg)
    assert c.rope_theta == 5e6 and c.rotary_dim == 128 and c.mrope_section == (22, 22, 20)
    # rope_parameters without partial_rotary_factor: transformers' default 0.25 (or a top-level value)
    cfg = tiny_hf_config()
    del cfg["rope_parameters"]["partial_rotary_factor"]
    assert ModelConfig.from_hf(cfg).rotary_dim == 64


def test_tied_embeddings_from_either_level():
    cfg = official_27b()
    cfg["text_config"]["tie_word_embeddings"] = True
    assert ModelConfig.from_hf(cfg).tie_embeddings
    cfg = official_27b()
    cfg["tie_word_embeddings"] = True
    assert ModelConfig.from_hf(cfg).tie_embeddings


def _mutate(path, value):
    def apply(cfg):
        node = cfg
        for key in path[:-1]:
            node = node[key]
        if value is KeyError:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return apply


BAD = [
    (("model_type",), "qwen3_next", "model_type"),
    (("model_type",), KeyError, "model_type"),
    (("text_config", "hidden_size"), KeyError, "text_config.hidden_size"),
    (("text_config", "hidden_size"), "5120", "text_config.hidden_size"),
    (("text_config", "num_hidden_layers"), 0, "text_config.num_hidden_layers"),
    (("text_config", "num_key_value_heads"), 5, "num_key_value_heads"),
    (("text_config", "linear_num_value_heads"), 40, "linear_num_value_heads"),
    (("text_config", "layer_types"), ["linear_attention"] * 3, "text_config.layer_types"),
    (("text_config", "layer_types"), ["sliding_attention"] * 64, "text_config.layer_types"),
    (("text_config", "rope_parameters", "mrope_section"), [11, 11, 11], "mrope_section"),
    (("text_config", "rope_parameters", "rope_type"), "yarn", "rope_type"),
    (("text_config", "rope_parameters", "rope_theta"), -1, "rope_theta"),
    (("text_config", "rope_parameters", "partial_rotary_factor"), 2.0, "partial_rotary_factor"),
    (("text_config", "hidden_act"), "gelu", "hidden_act"),
    (("text_config", "attention_bias"), True, "attention_bias"),
    (("text_config", "intermediate_size"), KeyError, "intermediate_size"),
    (("text_config", "rms_norm_eps"), "tiny", "rms_norm_eps"),
    (("text_config", "mtp_use_dedicated_embeddings"), True, "mtp_use_dedicated_embeddings"),
    (("text_config",), [1, 2], "text_config"),
    (("eos_token_id",), "eos", "eos_token_id"),
]


@pytest.mark.parametrize("path,value,field", BAD, ids=[f"{'.'.join(p)}={v!r}" for p, v, _ in BAD])
def test_bad_configs_name_the_field(path, value, field):
    cfg = copy.deepcopy(official_27b())
    _mutate(path, value)(cfg)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        ModelConfig.from_hf(cfg)


def test_bad_moe_fields():
    cfg = official_35b_a3b()
    cfg["text_config"]["num_experts_per_tok"] = 300
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        ModelConfig.from_hf(cfg)
    cfg = official_35b_a3b()
    del cfg["text_config"]["moe_intermediate_size"]
    with pytest.raises(ConfigError, match="moe_intermediate_size"):
        ModelConfig.from_hf(cfg)


def test_not_a_dict_and_missing_dir(tmp_path):
    with pytest.raises(ConfigError):
        ModelConfig.from_hf([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="config.json"):
        ModelConfig.from_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_dir(tmp_path)
