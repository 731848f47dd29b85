"""The closed registry of artifact identities (`model_id/weights_id`) and their exact inventories.

Published identities (NInfer README at troed/ninfer `b4babc2`; inventories from
`docs/maintainer/qwen3.6-27b-artifact.md`, `qwen3.8-27b-artifact.md`,
`qwen3.6-35b-a3b-artifact.md`):

  qwen3.6-27b/groupwise-int     17,495,365,888 B  1118 tensors  plan "split"
  qwen3.6-27b/nvfp4             18,324,064,000 B  1301 tensors  plan "nvfp4"
  qwen3.8-27b/groupwise-int     18,210,531,328 B  1118 tensors  plan "split", W8 endpoints
  qwen3.6-35b-a3b/groupwise-int 22,783,246,080 B   934 tensors  plan "moe" + DFlash

Where the model configuration lives: a v2 artifact carries no dimensions (artifact-container.md
§10 excludes them); the identity implies them. Registered identities therefore use the built-in
HF configs below. TEST identities (`inferno-test-*`, never published) describe any Qwen3.5-family
shape: their artifacts carry the checkpoint's `config.json` as resource `frontend/config.json`,
and their expected inventory is generated from it with the same rules as their registered twin.

Every inventory is generated from a config by `naming.tensor_rules` plus a per-identity format
assignment; nothing is a hand-typed list.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from inferno.artifact import formats
from inferno.artifact.naming import DFlashShape, TensorRule, input_divisor_name, tensor_rules
from inferno.errors import ArtifactError, ConfigError
from inferno.model.config import ModelConfig

BF16, FP32, I32 = "BF16", "FP32", "I32"
Q4, Q5, Q6, W8, NVFP4 = "Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S", "NVFP4"

FRONTEND_RESOURCES = (
    "frontend/tokenizer.json",
    "frontend/tokenizer_config.json",
    "frontend/chat_template.jinja",
    "frontend/generation_config.json",
    "frontend/preprocessor_config.json",
    "frontend/video_preprocessor_config.json",
)
CONFIG_RESOURCE = "frontend/config.json"
DRAFT_ROWS = 131072
TEST_PREFIX = "inferno-test-"

_VISION = {
    "depth": 27, "hidden_size": 1152, "num_heads": 16, "intermediate_size": 4304,
    "hidden_act": "gelu_pytorch_tanh", "patch_size": 16, "temporal_patch_size": 2,
    "spatial_merge_size": 2, "in_channels": 3, "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [],
}
_ROPE = {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
         "mrope_section": [11, 11, 10], "mrope_interleaved": True}
_COMMON_TEXT = {
    "head_dim": 256, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
    "vocab_size": 248320, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
    "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
    "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
    "rope_parameters": _ROPE, "eos_token_id": 248044,
}
_TOP_IDS = {"image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
            "vision_end_token_id": 248054, "eos_token_id": 248046, "tie_word_embeddings": False}

CONFIG_27B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", **_TOP_IDS,
    "text_config": {**_COMMON_TEXT, "model_type": "qwen3_5_text", "hidden_size": 5120,
                    "num_hidden_layers": 64, "num_attention_heads": 24, "num_key_value_heads": 4,
                    "linear_num_value_heads": 48, "intermediate_size": 17408},
    "vision_config": {**_VISION, "model_type": "qwen3_5_vision", "out_hidden_size": 5120},
}
"""Qwen3.6-27B = Qwen3.8-27B text/vision dimensions (research/qwen35-architecture.md §2)."""

CONFIG_35B_A3B = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe", **_TOP_IDS,
    "text_config": {**_COMMON_TEXT, "model_type": "qwen3_5_moe_text", "hidden_size": 2048,
                    "num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2,
                    "linear_num_value_heads": 32, "num_experts": 256, "num_experts_per_tok": 8,
                    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512},
    "vision_config": {**_VISION, "model_type": "qwen3_5_moe_vision", "out_hidden_size": 2048},
}
"""Qwen3.6-35B-A3B dimensions (research/qwen35-architecture.md §2)."""

DFLASH_35B = DFlashShape(layers=6, hidden=2048, n_heads=32, n_kv_heads=8, head_dim=128,
                         intermediate=6144, n_features=8)
"""z-lab/Qwen3.6-35B-A3B-DFlash as packed into the 35B artifact (§2 of its artifact reference)."""

# ---------------------------------------------------------------------------------------------
# Format assignments: rule -> format

_COMMON_FORMATS = {
    "norm": BF16, "conv": BF16, "gdn_ab": BF16, "router": BF16, "a_log": FP32, "dt_bias": FP32,
    "draft_head": Q4, "draft_ids": I32, "mtp_matrix": W8, "dflash_matrix": W8,
    "vision_in": Q4, "vision_out": Q5, "vision_patch": Q6, "vision_merger": W8, "vision_direct": BF16,
    "divisor": FP32,
}

FormatRule = Callable[[TensorRule, ModelConfig], str]


def _table(table: Mapping[str, str]) -> FormatRule:
    full = {**_COMMON_FORMATS, **table}
    return lambda rule, config: full[rule.role]


def groupwise_dense(endpoints: str) -> FormatRule:
    """27B groupwise-int (endpoints Q6) and 3.8-27B (endpoints W8): 27b-artifact.md §3.1."""
    return _table({
        "embedding": endpoints, "output_head": endpoints, "attn_qk": Q4, "attn_gv": Q5, "attn_out": Q5,
        "gdn_qk": Q4, "gdn_vz": Q5, "gdn_out": Q5, "mlp_gate_up": Q4, "mlp_down": Q5,
    })


def nvfp4_dense(attn_in_bf16: frozenset[int], attn_out_bf16: frozenset[int], gdn_out_bf16: frozenset[int]) -> FormatRule:
    """27B nvfp4 (27b-artifact.md §13.3): text matrices NVFP4 except the listed BF16 layers.

    A matrix whose shape the NVFP4 layout cannot hold (N % 128, K % 64; only in test shapes)
    is stored BF16.
    """
    base = _table({"embedding": W8, "output_head": W8})
    bf16_layers = {"attn_qkgv": attn_in_bf16, "attn_out": attn_out_bf16, "gdn_out": gdn_out_bf16}

    def assign(rule: TensorRule, config: ModelConfig) -> str:
        if rule.role in ("attn_qkgv", "attn_out", "gdn_qkvz", "gdn_out", "mlp_gate_up", "mlp_down"):
            if rule.layer in bf16_layers.get(rule.role, ()):
                return BF16
            n, k = rule.shape
            return NVFP4 if n % 128 == 0 and k % 64 == 0 else BF16
        return base(rule, config)

    return assign


def groupwise_moe(q6_down_layers: Callable[[ModelConfig], frozenset[int]]) -> FormatRule:
    """35B-A3B groupwise-int (35b-a3b-artifact.md §3.1, §5.4)."""
    base = _table({
        "embedding": W8, "output_head": Q6, "attn_qkgv": W8, "attn_out": W8, "gdn_qkvz": W8, "gdn_out": W8,
        "shared_gate_up": W8, "shared_down": W8, "routed_gate_up": Q4,
    })

    def assign(rule: TensorRule, config: ModelConfig) -> str:
        if rule.role == "routed_down":
            return Q6 if rule.layer in q6_down_layers(config) else Q5
        return base(rule, config)

    return assign


def layout_for(fmt: str) -> str:
    if fmt in (BF16, FP32, I32):
        return formats.CONTIGUOUS
    return formats.BLOCKSCALE if fmt == NVFP4 else formats.ROW_SPLIT


# ---------------------------------------------------------------------------------------------
# Identities


@dataclass(frozen=True)
class ExpectedTensor:
    """One tensor of an identity's inventory, with the rule that builds it from HF tensors."""

    name: str
    shape: tuple[int, ...]
    format: str
    layout: str
    rule: TensorRule


@dataclass(frozen=True)
class IdentitySpec:
    """One registered artifact identity: fusion plan, format assignment, published facts."""

    model_id: str
    weights_id: str
    plan: str
    assign: FormatRule
    hf_config: Mapping | None = None  # built-in config (registered); None: from frontend/config.json
    dflash: DFlashShape | None = None
    published_bytes: int | None = None
    sha256: str | None = None
    v1_sha256: str | None = None  # the published v1 file that `inferno migrate` accepts
    tensor_count: int | None = None

    @property
    def name(self) -> str:
        return f"{self.model_id}/{self.weights_id}"

    @property
    def is_test(self) -> bool:
        return self.model_id.startswith(TEST_PREFIX)

    @property
    def resources(self) -> tuple[str, ...]:
        """Resources the artifact must hold (test identities: also any of the six frontend files)."""
        return (CONFIG_RESOURCE,) if self.is_test else FRONTEND_RESOURCES

    def draft_rows(self, config: ModelConfig) -> int:
        """Rows of the optimized draft head: 131072 (registered); half the vocab rows, at most 131072 (test)."""
        return DRAFT_ROWS if not self.is_test else max(1, min(DRAFT_ROWS, config.vocab // 2))

    def builtin_config(self) -> ModelConfig:
        if self.hf_config is None:
            raise ArtifactError(f"{self.name} has no built-in config; its artifact carries {CONFIG_RESOURCE}")
        return ModelConfig.from_hf(self.hf_config)

    def expected(self, config: ModelConfig) -> list[ExpectedTensor]:
        """The complete tensor inventory, in writer order, for this identity and config."""
        out: list[ExpectedTensor] = []
        for rule in tensor_rules(config, self.plan, self.draft_rows(config), self.dflash):
            fmt = self.assign(rule, config)
            out.append(ExpectedTensor(rule.name, rule.shape, fmt, layout_for(fmt), rule))
            divisor = input_divisor_name(rule.name) if fmt == NVFP4 else None
            if divisor is not None:
                drule = TensorRule(divisor, (), "divisor", rule.layer, (), source="divisor")
                out.append(ExpectedTensor(divisor, (), FP32, formats.CONTIGUOUS, drule))
        return out


_FULL_ATTN_27B = tuple(range(3, 64, 4))

REGISTRY: dict[str, IdentitySpec] = {
    s.name: s
    for s in (
        IdentitySpec(
            "qwen3.6-27b", "groupwise-int", "split", groupwise_dense(Q6), CONFIG_27B,
            published_bytes=17_495_365_888, tensor_count=1118,
            sha256="7b51600ffd10632b9660f56085efdd9b751d79733ad32036a652234b64bebe7b",
            v1_sha256="74fac75f3a6b7ab7b52e08c36969c7a33a8ba23465910eccd72d195adb497127",
        ),
        IdentitySpec(
            "qwen3.6-27b", "nvfp4", "nvfp4",
            nvfp4_dense(frozenset(_FULL_ATTN_27B[:6]), frozenset(_FULL_ATTN_27B[:2]), frozenset({4})),
            CONFIG_27B, published_bytes=18_324_064_000, tensor_count=1301,
            sha256="bce5f00d066c0f20f1317bf1fdcb458264cf95837c3b1f3fbec163694627893a",
        ),
        IdentitySpec(
            "qwen3.8-27b", "groupwise-int", "split", groupwise_dense(W8), CONFIG_27B,
            published_bytes=18_210_531_328, tensor_count=1118,
            sha256="eec39564993d6e9c7d5e383382a760f093465c9d163ec9a1bd6b80199514bf3e",
        ),
        IdentitySpec(
            "qwen3.6-35b-a3b", "groupwise-int", "moe", groupwise_moe(lambda c: frozenset({34, 38, 39})),
            CONFIG_35B_A3B, dflash=DFLASH_35B, published_bytes=22_783_246_080, tensor_count=934,
            sha256="1fb9ea0b5b8561e49d9604115ec89e5d9f2b6f6434e32c37c57fffd480a325d2",
            v1_sha256="5194407dd6d3092b8c2f81ce41e014b50ca0d6f1ba4e5d8c1492b8652bfa267f",
        ),
        # TEST identities: synthetic artifacts only, shapes from frontend/config.json.
        IdentitySpec(TEST_PREFIX + "tiny-dense", "groupwise-int", "split", groupwise_dense(Q6)),
        IdentitySpec(TEST_PREFIX + "tiny-dense", "nvfp4", "nvfp4", nvfp4_dense(frozenset(), frozenset(), frozenset())),
        IdentitySpec(TEST_PREFIX + "tiny-moe", "groupwise-int", "moe",
                     groupwise_moe(lambda c: frozenset({c.n_layers - 1}))),
    )
}


def lookup(model_id: str, weights_id: str) -> IdentitySpec:
    """The registered identity, or ArtifactError listing the known ones."""
    spec = REGISTRY.get(f"{model_id}/{weights_id}")
    if spec is None:
        known = ", ".join(REGISTRY)
        raise ArtifactError(f"unknown artifact identity {model_id}/{weights_id}; Inferno knows {known}")
    return spec


def parse_identity(text: str) -> IdentitySpec:
    """`model_id/weights_id` (split at the last '/') -> its spec."""
    model_id, sep, weights_id = text.rpartition("/")
    if not sep or not model_id or not weights_id:
        raise ArtifactError(f"identity {text!r} must be model_id/weights_id, e.g. qwen3.6-27b/groupwise-int")
    return lookup(model_id, weights_id)


def default_model_id(config: ModelConfig) -> str:
    """The model_id a checkpoint converts to when none is given (3.8-27B must be named)."""
    for model_id, hf in (("qwen3.6-27b", CONFIG_27B), ("qwen3.6-35b-a3b", CONFIG_35B_A3B)):
        if first_config_mismatch(ModelConfig.from_hf(hf), config) is None:
            return model_id
    return TEST_PREFIX + ("tiny-moe" if config.is_moe else "tiny-dense")


_SHAPE_FIELDS = (
    "is_moe", "hidden", "n_layers", "layer_types", "n_heads", "n_kv_heads", "head_dim", "gdn_k_heads",
    "gdn_v_heads", "gdn_k_dim", "gdn_v_dim", "conv_kernel", "intermediate", "n_experts", "moe_intermediate",
    "shared_intermediate", "vocab", "tie_embeddings", "mtp_layers",
)


def first_config_mismatch(expected: ModelConfig, actual: ModelConfig) -> str | None:
    """'field: expected X, got Y' for the first shape-defining field that differs, else None."""
    for name in _SHAPE_FIELDS:
        a, b = getattr(expected, name), getattr(actual, name)
        if a != b:
            if name == "layer_types":
                return "layer_types differ"
            return f"{name}: expected {a}, got {b}"
    if (expected.vision is None) != (actual.vision is None):
        return f"vision: expected {'a vision tower' if expected.vision else 'none'}"
    return None


def config_from_resources(spec: IdentitySpec, resources: Mapping[str, bytes]) -> ModelConfig:
    """The ModelConfig of an artifact: built-in (registered) or its frontend/config.json (test)."""
    generation = _json_resource(resources, "frontend/generation_config.json", required=False)
    if spec.hf_config is not None:
        return ModelConfig.from_hf(spec.hf_config, generation)
    config = _json_resource(resources, CONFIG_RESOURCE, required=True)
    try:
        return ModelConfig.from_hf(config, generation)
    except ConfigError as e:
        raise ArtifactError(f"{CONFIG_RESOURCE} of this {spec.name} artifact: {e}") from None


def _json_resource(resources: Mapping[str, bytes], name: str, required: bool) -> dict:
    if name not in resources:
        if required:
            raise ArtifactError(f"artifact lacks resource {name}; re-convert it with `inferno convert`")
        return {}
    try:
        value = json.loads(bytes(resources[name]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ArtifactError(f"artifact resource {name} is not valid JSON ({e}); re-convert the artifact") from None
    if not isinstance(value, dict):
        raise ArtifactError(f"artifact resource {name} must hold a JSON object; re-convert the artifact")
    return value


def check_inventory(spec: IdentitySpec, config: ModelConfig, tensors: Mapping, resources: Mapping) -> list[ExpectedTensor]:
    """Refuse, naming the first mismatch, unless the artifact holds exactly the identity's inventory.

    `tensors`: name -> entry with .shape/.format/.layout; `resources`: name -> anything.
    """
    expected = spec.expected(config)
    where = f"for {spec.name}"
    for e in expected:
        t = tensors.get(e.name)
        if t is None:
            raise ArtifactError(f"tensor {e.name} is missing {where}; the artifact is incomplete, re-convert it")
        if tuple(t.shape) != e.shape:
            raise ArtifactError(f"tensor {e.name} has shape {list(t.shape)}, expected {list(e.shape)} {where}")
        if t.format != e.format or t.layout != e.layout:
            raise ArtifactError(
                f"tensor {e.name} is {t.format}/{t.layout}, expected {e.format}/{e.layout} {where}"
            )
    names = {e.name for e in expected}
    extra = [n for n in tensors if n not in names]
    if extra:
        raise ArtifactError(f"tensor {extra[0]} is not part of {spec.name} ({len(extra)} unexpected tensors)")
    for name in spec.resources:
        if name not in resources:
            raise ArtifactError(f"resource {name} is missing {where}; re-convert the artifact")
    allowed = set(spec.resources) | (set(FRONTEND_RESOURCES) if spec.is_test else set())
    extra = [n for n in resources if n not in allowed]
    if extra:
        raise ArtifactError(f"resource {extra[0]} is not part of {spec.name}")
    return expected
