"""`ModelConfig`: the Qwen3.5-family text-model description, parsed from a HF `config.json`.

Accepts the VLM layout (`qwen3_5` / `qwen3_5_moe` with `text_config` nested) and the text-only
layout (`qwen3_5_text` / `qwen3_5_moe_text`, flat). Normalises what transformers normalises:
`layer_types` derived from `full_attention_interval`, and rope fields given at the top level
(`rope_theta`, `partial_rotary_factor`, `rope_scaling`) folded into one set of rope fields.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferno.errors import ConfigError

DENSE_TYPES = ("qwen3_5", "qwen3_5_text")
MOE_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")
LAYER_KINDS = ("linear_attention", "full_attention")

# transformers' defaults for fields that official configs may omit.
_DEFAULT_PARTIAL_ROTARY = 0.25
_DEFAULT_MROPE_SECTION = (11, 11, 10)
_DEFAULT_FULL_ATTENTION_INTERVAL = 4
_DEFAULT_MAX_POSITION = 32768
_DEFAULT_RMS_EPS = 1e-6


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and constants of a Qwen3.5-family text model (dense or MoE)."""

    model_type: str
    is_moe: bool
    hidden: int
    n_layers: int
    layer_types: tuple[str, ...]
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    mrope_section: tuple[int, ...]
    mrope_interleaved: bool
    gdn_k_heads: int
    gdn_v_heads: int
    gdn_k_dim: int
    gdn_v_dim: int
    conv_kernel: int
    intermediate: int  # dense MLP width; 0 for MoE models
    n_experts: int  # 0 for dense models
    top_k: int
    moe_intermediate: int
    shared_intermediate: int
    vocab: int
    rms_eps: float
    max_position: int
    tie_embeddings: bool
    mtp_layers: int
    eos_token_ids: tuple[int, ...]
    vision: dict | None = None

    # ---- derived shapes -------------------------------------------------------------------
    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Indices of the gated full-attention layers."""
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @property
    def gdn_layers(self) -> tuple[int, ...]:
        """Indices of the Gated DeltaNet (linear attention) layers."""
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    @property
    def gdn_key_width(self) -> int:
        """Width of the q (and of the k) part of `in_proj_qkv`: gdn_k_heads * gdn_k_dim."""
        return self.gdn_k_heads * self.gdn_k_dim

    @property
    def gdn_value_width(self) -> int:
        """Width of the v part of `in_proj_qkv` and of `in_proj_z`: gdn_v_heads * gdn_v_dim."""
        return self.gdn_v_heads * self.gdn_v_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the GDN short convolution: [q | k | v]."""
        return 2 * self.gdn_key_width + self.gdn_value_width

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def from_hf(cls, config: Mapping[str, Any], generation_config: Mapping[str, Any] | None = None) -> ModelConfig:
        """Build from a parsed HF `config.json` (and optionally `generation_config.json`)."""
        if not isinstance(config, Mapping):
            raise ConfigError("config.json must hold a JSON object; re-export the checkpoint's config")
        return _parse(config, generation_config or {})

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        """Read `config.json` (and `generation_config.json` if present) from a checkpoint directory."""
        root = Path(path)
        config = _read_json(root / "config.json", required=True)
        generation = _read_json(root / "generation_config.json", required=False)
        return cls.from_hf(config, generation)


def _read_json(path: Path, required: bool) -> dict:
    if not path.is_file():
        if required:
            raise ConfigError(f"{path} not found; point at a HF checkpoint directory that has config.json")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}); fix or re-download it") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object; fix or re-download it")
    return data


class _Fields:
    """Typed access to config fields; errors name the field as written in config.json."""

    def __init__(self, data: Mapping[str, Any], prefix: str):
        self.data = data
        self.prefix = prefix

    def _name(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def raw(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def integer(self, key: str, default: int | None = None, minimum: int = 1) -> int:
        value = self.data.get(key)
        if value is None:
            if default is None:
                raise ConfigError(f"config field {self._name(key)} is missing; the checkpoint's config.json is incomplete")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config field {self._name(key)} must be an integer, got {value!r}")
        if value < minimum:
            raise ConfigError(f"config field {self._name(key)} must be >= {minimum}, got {value}")
        return value

    def number(self, key: str, default: float | None = None) -> float:
        value = self.data.get(key)
        if value is None:
            if default is None:
                raise ConfigError(f"config field {self._name(key)} is missing; the checkpoint's config.json is incomplete")
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"config field {self._name(key)} must be a positive number, got {value!r}")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(f"config field {self._name(key)} must be true or false, got {value!r}")
        return value


def _parse(top: Mapping[str, Any], generation: Mapping[str, Any]) -> ModelConfig:
    model_type = top.get("model_type")
    if model_type not in DENSE_TYPES + MOE_TYPES:
        raise ConfigError(
            f"config field model_type is {model_type!r}; Inferno supports "
            f"{', '.join(DENSE_TYPES + MOE_TYPES)} (Qwen3.5 / 3.6 / 3.8 checkpoints)"
        )
    is_moe = model_type in MOE_TYPES
    nested = top.get("text_config")
    if nested is not None:
        if not isinstance(nested, Mapping):
            raise ConfigError("config field text_config must be a JSON object")
        text, prefix = nested, "text_config."
    else:
        text, prefix = top, ""
    f = _Fields(text, prefix)

    if f.raw("hidden_act", "silu") != "silu":
        raise ConfigError(f"config field {prefix}hidden_act is {f.raw('hidden_act')!r}; only 'silu' is supported")
    if f.flag("attention_bias", False):
        raise ConfigError(f"config field {prefix}attention_bias is true; Qwen3.5 attention has no bias, check the checkpoint")
    if f.flag("mtp_use_dedicated_embeddings", False):
        raise ConfigError(f"config field {prefix}mtp_use_dedicated_embeddings is true; only shared MTP embeddings are supported")

    hidden = f.integer("hidden_size")
    n_layers = f.integer("num_hidden_layers")
    layer_types = _layer_types(f, n_layers)
    n_heads = f.integer("num_attention_heads")
    n_kv_heads = f.integer("num_key_value_heads")
    if n_heads % n_kv_heads:
        raise ConfigError(
            f"config fields {prefix}num_attention_heads ({n_heads}) must be a multiple of "
            f"{prefix}num_key_value_heads ({n_kv_heads})"
        )
    head_dim = f.integer("head_dim", default=hidden // n_heads if hidden % n_heads == 0 else None)
    rope = _rope(f, top, head_dim)

    gdn_k_heads = f.integer("linear_num_key_heads")
    gdn_v_heads = f.integer("linear_num_value_heads")
    if gdn_v_heads % gdn_k_heads:
        raise ConfigError(
            f"config fields {prefix}linear_num_value_heads ({gdn_v_heads}) must be a multiple of "
            f"{prefix}linear_num_key_heads ({gdn_k_heads})"
        )

    if is_moe:
        n_experts = f.integer("num_experts")
        top_k = f.integer("num_experts_per_tok")
        if top_k > n_experts:
            raise ConfigError(
                f"config field {prefix}num_experts_per_tok ({top_k}) exceeds {prefix}num_experts ({n_experts})"
            )
        moe_intermediate = f.integer("moe_intermediate_size")
        shared_intermediate = f.integer("shared_expert_intermediate_size")
        intermediate = 0
    else:
        intermediate = f.integer("intermediate_size")
        n_experts = top_k = moe_intermediate = shared_intermediate = 0

    tie = f.flag("tie_word_embeddings", False)
    if nested is not None:
        tie = tie or _Fields(top, "").flag("tie_word_embeddings", False)

    vision = top.get("vision_config")
    if vision is not None and not isinstance(vision, Mapping):
        raise ConfigError("config field vision_config must be a JSON object")

    return ModelConfig(
        model_type=model_type,
        is_moe=is_moe,
        hidden=hidden,
        n_layers=n_layers,
        layer_types=layer_types,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        rotary_dim=rope["rotary_dim"],
        rope_theta=rope["theta"],
        mrope_section=rope["mrope_section"],
        mrope_interleaved=rope["mrope_interleaved"],
        gdn_k_heads=gdn_k_heads,
        gdn_v_heads=gdn_v_heads,
        gdn_k_dim=f.integer("linear_key_head_dim"),
        gdn_v_dim=f.integer("linear_value_head_dim"),
        conv_kernel=f.integer("linear_conv_kernel_dim", default=4, minimum=2),
        intermediate=intermediate,
        n_experts=n_experts,
        top_k=top_k,
        moe_intermediate=moe_intermediate,
        shared_intermediate=shared_intermediate,
        vocab=f.integer("vocab_size"),
        rms_eps=f.number("rms_norm_eps", _DEFAULT_RMS_EPS),
        max_position=f.integer("max_position_embeddings", default=_DEFAULT_MAX_POSITION),
        tie_embeddings=tie,
        mtp_layers=f.integer("mtp_num_hidden_layers", default=0, minimum=0),
        eos_token_ids=_eos_ids(top, text if nested is not None else {}, generation),
        vision=dict(vision) if vision is not None else None,
    )


def _layer_types(f: _Fields, n_layers: int) -> tuple[str, ...]:
    if f.has("layer_types"):
        types = f.raw("layer_types")
        if not isinstance(types, list) or len(types) != n_layers:
            raise ConfigError(
                f"config field {f.prefix}layer_types must list one type per layer ({n_layers} layers)"
            )
        bad = sorted({t for t in types if t not in LAYER_KINDS}, key=str)
        if bad:
            raise ConfigError(
                f"config field {f.prefix}layer_types has unsupported entries {bad}; expected {' / '.join(LAYER_KINDS)}"
            )
        return tuple(types)
    interval = f.integer("full_attention_interval", default=_DEFAULT_FULL_ATTENTION_INTERVAL)
    return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers))


def _rope(f: _Fields, top: Mapping[str, Any], head_dim: int) -> dict:
    """Fold `rope_parameters` (transformers 5), `rope_scaling` and top-level rope fields together."""
    params: dict[str, Any] = {}
    for key in ("rope_scaling", "rope_parameters"):  # later wins, as in transformers' standardisation
        value = f.raw(key)
        if value is None:
            continue
        if not isinstance(value, Mapping):
            raise ConfigError(f"config field {f.prefix}{key} must be a JSON object")
        params.update(value)
    where = f"{f.prefix}rope_parameters"
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(f"config field {where}.rope_type is {rope_type!r}; only 'default' rope is supported")

    theta = params.get("rope_theta", f.raw("rope_theta", top.get("rope_theta")))
    if theta is None:
        raise ConfigError(f"config field {where}.rope_theta is missing; add it to config.json")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise ConfigError(f"config field {where}.rope_theta must be a positive number, got {theta!r}")

    factor = params.get("partial_rotary_factor", f.raw("partial_rotary_factor", _DEFAULT_PARTIAL_ROTARY))
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ConfigError(f"config field {where}.partial_rotary_factor must be in (0, 1], got {factor!r}")
    rotary_dim = int(head_dim * factor)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ConfigError(
            f"config field {where}.partial_rotary_factor gives {rotary_dim} rotary dims of head_dim {head_dim}; "
            "it must be a positive even number"
        )

    section = params.get("mrope_section", list(_DEFAULT_MROPE_SECTION))
    if (
        not isinstance(section, list)
        or len(section) != 3
        or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in section)
    ):
        raise ConfigError(f"config field {where}.mrope_section must be three non-negative integers, got {section!r}")
    if sum(section) != rotary_dim // 2:
        raise ConfigError(
            f"config field {where}.mrope_section {section} must sum to rotary_dim/2 = {rotary_dim // 2}"
        )
    interleaved = params.get("mrope_interleaved", True)
    if not isinstance(interleaved, bool):
        raise ConfigError(f"config field {where}.mrope_interleaved must be true or false, got {interleaved!r}")
    return {
        "theta": float(theta),
        "rotary_dim": rotary_dim,
        "mrope_section": tuple(section),
        "mrope_interleaved": interleaved,
    }


def _eos_ids(top: Mapping[str, Any], text: Mapping[str, Any], generation: Mapping[str, Any]) -> tuple[int, ...]:
    """Union of eos ids from generation_config, then the text config, then the top-level config."""
    ids: list[int] = []
    for source, name in ((generation, "generation_config"), (text, "text_config"), (top, "config")):
        value = source.get("eos_token_id")
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{name} field eos_token_id must be token ids, got {value!r}")
            if v not in ids:
                ids.append(v)
    return tuple(ids)
