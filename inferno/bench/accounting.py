"""What one decode step must move and what one prefill token must compute, from the artifact.

Decode (batch 1, no speculation) reads every text weight once per step: each tensor's stored
bytes (`inferno.artifact.formats.packed_nbytes`, so the format's scales and padding count), one
row of the embedding table, and for MoE layers the `top_k` of `n_experts` routed experts. The
MTP head, draft head, vision tower and DFlash drafter are not read. On top come the KV cache
(every cached token of every attention layer read once, the new token's K/V written once) and
the GDN state (conv and recurrent state of every GDN layer read and written back).

Prefill FLOPs are the model math: 2*N*K per matrix row-vector product (routed experts: top_k of
them), the depthwise conv, attention's QK^T and PV over the causal context, and the GDN
recurrence (7*dk*dv per value head: decay, k^T S, rank-1 update, q S). The output head runs
once per prefill call (only the last token's logits are needed). Elementwise work (norms,
activations, RoPE, gates) is left out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from inferno.artifact.formats import packed_nbytes
from inferno.artifact.identities import ExpectedTensor
from inferno.errors import UsageError
from inferno.model.config import ModelConfig

KV_DTYPES = ("fp32", "bf16", "int8", "fp6")
"""KV cache element types: fp32 (numpy reference), bf16, int8 and fp6 in groups of 64 with an fp16 scale."""

STATE_DTYPES = {"fp32": 4, "bf16": 2}
KV_GROUP = 64
_KV_GROUP_BYTES = {"int8": KV_GROUP + 2, "fp6": KV_GROUP * 6 // 8 + 2}

# Tensor groups for the per-step breakdown (anchors.md §5.2 uses the same split).
EMBEDDING, ATTENTION, GDN, FFN, NORMS, HEAD = "embedding_row", "attention", "gdn", "ffn", "norms", "output_head"
GROUPS = (EMBEDDING, ATTENTION, GDN, FFN, NORMS, HEAD)

_MATRIX_ROLES = frozenset({
    "attn_qk", "attn_gv", "attn_qkgv", "attn_out", "gdn_qk", "gdn_vz", "gdn_qkvz", "gdn_ab", "gdn_out",
    "mlp_gate_up", "mlp_down", "router", "shared_gate_up", "shared_down", "routed_gate_up", "routed_down",
})
_ROUTED_ROLES = frozenset({"routed_gate_up", "routed_down"})


def kv_vector_bytes(dim: int, kv_dtype: str) -> int:
    """Bytes of one stored K (or V) head vector of `dim` elements."""
    if kv_dtype == "fp32":
        return 4 * dim
    if kv_dtype == "bf16":
        return 2 * dim
    if kv_dtype in _KV_GROUP_BYTES:
        return math.ceil(dim / KV_GROUP) * _KV_GROUP_BYTES[kv_dtype]
    raise UsageError(f"unknown KV dtype {kv_dtype!r}; choose one of {', '.join(KV_DTYPES)}")


def kv_bytes_per_token(config: ModelConfig, kv_dtype: str) -> int:
    """KV bytes one token takes over all attention layers (K and V)."""
    return len(config.attention_layers) * config.n_kv_heads * 2 * kv_vector_bytes(config.head_dim, kv_dtype)


def _state_bytes(dtype: str) -> int:
    try:
        return STATE_DTYPES[dtype]
    except KeyError:
        raise UsageError(f"unknown state dtype {dtype!r}; choose one of {', '.join(STATE_DTYPES)}") from None


def gdn_state_bytes(config: ModelConfig, conv_dtype: str = "bf16", recurrent_dtype: str = "fp32") -> int:
    """GDN state of one sequence over all GDN layers (conv [K-1, conv_dim] + recurrent [Hv, dk, dv])."""
    conv = (config.conv_kernel - 1) * config.conv_dim * _state_bytes(conv_dtype)
    recurrent = config.gdn_v_heads * config.gdn_k_dim * config.gdn_v_dim * _state_bytes(recurrent_dtype)
    return len(config.gdn_layers) * (conv + recurrent)


def _group(e: ExpectedTensor) -> str | None:
    """The breakdown group of a tensor read by the decode step, or None when decode does not read it."""
    name = e.name
    if name == "text/token_embedding":
        return EMBEDDING
    if name == "text/output_head":
        return HEAD
    if name == "text/final_norm":
        return NORMS
    if not name.startswith("text/layers/"):
        return None  # draft head, MTP, vision, DFlash
    part = name.split("/", 3)[3]
    if part.startswith("attention/"):
        return ATTENTION
    if part.startswith("gdn/"):
        return GDN
    if part.startswith(("mlp/", "moe/")):
        return FFN
    return NORMS  # input_norm, post_attention_norm


@dataclass(frozen=True)
class StateDtypes:
    """How an executor stores a sequence's state: KV elements, GDN conv state, GDN recurrent state."""

    kv: str = "bf16"
    conv: str = "bf16"
    recurrent: str = "fp32"


@dataclass(frozen=True)
class Accounting:
    """Bytes per decode step and FLOPs per prefill token of one model (see the module docstring)."""

    config: ModelConfig
    weight_bytes: dict[str, int]  # per group (GROUPS), bytes read per decode step
    ffn_bytes_per_layer: dict[int, int]
    matrix_flops_per_token: int  # 2*N*K over the layers' matrices (routed experts: active only)
    head_flops: int  # the output head, once per prefill call
    states: StateDtypes = field(default_factory=StateDtypes)

    @property
    def weights_per_step(self) -> int:
        return sum(self.weight_bytes.values())

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.config, self.states.kv)

    @property
    def gdn_state_bytes(self) -> int:
        """GDN state of one sequence; a decode step reads and writes all of it."""
        return gdn_state_bytes(self.config, self.states.conv, self.states.recurrent)

    def decode_step_bytes(self, context: int) -> int:
        """Bytes moved by the decode step whose token attends to `context` cached tokens (itself included).

        Weights once, K/V of `context` tokens read, the new token's K/V written, GDN state read + written.
        """
        if context < 1:
            raise UsageError(f"a decode step attends to at least 1 token, got context {context}")
        return self.weights_per_step + (context + 1) * self.kv_bytes_per_token + 2 * self.gdn_state_bytes

    def decode_bytes(self, prompt_tokens: int, completion_tokens: int) -> int:
        """Bytes of all decode steps after a prefill of `prompt_tokens` that produced `completion_tokens`.

        The first completion token comes from the prefill; step i (1..n-1) feeds the token at
        position prompt + i - 1, which attends to prompt + i tokens.
        """
        steps = completion_tokens - 1
        if steps < 1:
            return 0
        contexts = steps * prompt_tokens + steps * (steps + 1) // 2
        per_step = self.weights_per_step + self.kv_bytes_per_token + 2 * self.gdn_state_bytes
        return steps * per_step + contexts * self.kv_bytes_per_token

    def attention_flops(self, start: int, tokens: int) -> int:
        """QK^T + PV FLOPs of `tokens` new tokens at positions start.. over their causal context."""
        c = self.config
        keys = tokens * start + tokens * (tokens + 1) // 2  # sum of (position + 1)
        return len(c.attention_layers) * 4 * c.n_heads * c.head_dim * keys

    @property
    def linear_flops_per_token(self) -> int:
        """Context-independent FLOPs of one token: matrices, depthwise conv, GDN recurrence."""
        c = self.config
        conv = len(c.gdn_layers) * 2 * c.conv_kernel * c.conv_dim
        recurrence = len(c.gdn_layers) * 7 * c.gdn_v_heads * c.gdn_k_dim * c.gdn_v_dim
        return self.matrix_flops_per_token + conv + recurrence

    def prefill_flops(self, tokens: int, chunk: int) -> int:
        """FLOPs of a prefill of `tokens` prompt tokens from an empty sequence, in calls of `chunk` tokens."""
        calls = math.ceil(tokens / chunk)
        return tokens * self.linear_flops_per_token + self.attention_flops(0, tokens) + calls * self.head_flops

    def summary(self, context: int) -> dict:
        """JSON-ready numbers: bytes per decode step at `context`, FLOPs per prefill token at `context`."""
        return {
            "weights_per_decode_step": {"total": self.weights_per_step, **self.weight_bytes},
            "ffn_bytes_per_layer": sorted(set(self.ffn_bytes_per_layer.values())),
            "kv_dtype": self.states.kv,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "gdn_state": {"conv": self.states.conv, "recurrent": self.states.recurrent,
                          "bytes": self.gdn_state_bytes, "read_and_written_per_step": 2 * self.gdn_state_bytes},
            "decode_step_bytes_at_context": {"context": context, "bytes": self.decode_step_bytes(context)},
            "prefill_flops_per_token": {
                "linear": self.linear_flops_per_token,
                "matrices": self.matrix_flops_per_token,
                "attention_at_context": self.attention_flops(context - 1, 1),
                "output_head_per_call": self.head_flops,
            },
        }


def _stored_bytes(e: ExpectedTensor) -> int:
    return packed_nbytes(e.format, e.layout, e.shape)


def account(config: ModelConfig, inventory: Iterable[ExpectedTensor], states: StateDtypes | None = None) -> Accounting:
    """The `Accounting` of a model from its artifact inventory (`IdentitySpec.expected(config)`)."""
    weight_bytes = dict.fromkeys(GROUPS, 0)
    ffn: dict[int, int] = {}
    matrix_flops = 0
    head_flops = 0
    for e in inventory:
        group = _group(e)
        if group is None:
            continue
        nbytes = _stored_bytes(e)
        share = 1.0
        if e.rule.role in _ROUTED_ROLES:
            share = config.top_k / config.n_experts
            nbytes = nbytes * config.top_k // config.n_experts
        elif group == EMBEDDING:
            nbytes = math.ceil(nbytes / e.shape[0])  # one row
        weight_bytes[group] += nbytes
        if group == FFN and e.rule.layer is not None:
            ffn[e.rule.layer] = ffn.get(e.rule.layer, 0) + nbytes
        if e.rule.role in _MATRIX_ROLES:
            matrix_flops += round(2 * e.shape[0] * e.shape[1] * share)
        elif group == HEAD:
            head_flops = 2 * e.shape[0] * e.shape[1]
    return Accounting(config, weight_bytes, ffn, matrix_flops, head_flops, states or StateDtypes())
