"""NInfer tensor names <-> HF tensor names, per architecture and fusion plan.

An artifact tensor (e.g. `text/layers/3/attention/query_key`) is a row-wise concatenation of
*pieces*; each piece is a set of rows of one HF tensor (viewed 2-D as [rows, -1]) or, for the GDN
convolution, its tap-major transpose. The same table builds artifact tensors from a checkpoint
(convert) and rebuilds HF tensors from an artifact (ArtifactWeights), so the two cannot disagree.

Fusion plans (NInfer `docs/maintainer/qwen3.6-27b-artifact.md` §3.2/§5/§11, §13.3 and
`qwen3.6-35b-a3b-artifact.md` §3.2/§5/§12):
  "split" (27B groupwise-int, 3.8-27B): attention `query_key` [q,k] + `gate_value` [gate,v];
          GDN `query_key` (in_proj_qkv rows [0, 2*Kw)) + `value_z` [v,z]; `a_projection`,
          `b_projection` separate; dense `mlp/gate_up` [gate,up].
  "nvfp4" (27B nvfp4): attention `query_key_gate_value` [q,k,gate,v]; GDN `query_key_value_z`
          [q,k,v,z]; a/b separate.
  "moe"   (35B-A3B): as "nvfp4" plus GDN `a_b_projection` [a,b] and the MoE block.
The HF q_proj stores, per head, [query_head_dim, gate_head_dim] rows; pieces split those halves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from inferno.model.config import ModelConfig

TEXT = "model.language_model."
VISUAL = "model.visual."
DFLASH = "dflash."  # HF-style names we give the DFlash drafter's tensors
HEAD = "lm_head.weight"

PLANS = ("split", "nvfp4", "moe")


@dataclass(frozen=True)
class Piece:
    """Rows of one HF tensor that become consecutive rows of an artifact tensor.

    `rows`: None = all rows; ("range", a, b); ("half", n_heads, head_dim, which) = the query
    (which=0) or gate (which=1) half of each head of a q_proj; ("ids",) = the draft-head id list.
    `op`: "rows" or "conv" ([C, 1, K] -> [K, C]). `derived`: built from the HF tensor but not
    used to rebuild it (draft head, tied output head).
    """

    hf: str
    rows: tuple | None = None
    op: str = "rows"
    derived: bool = False

    def row_index(self, hf_rows: int, ids: np.ndarray | None = None) -> np.ndarray | slice:
        """Indices into the HF tensor's 2-D row view that this piece takes, in order."""
        if self.rows is None:
            return slice(0, hf_rows)
        kind = self.rows[0]
        if kind == "range":
            return slice(self.rows[1], self.rows[2])
        if kind == "half":
            _, heads, dim, which = self.rows
            base = np.arange(heads)[:, None] * (2 * dim) + which * dim
            return (base + np.arange(dim)[None, :]).reshape(-1)
        if kind == "ids":
            if ids is None:
                raise ValueError("draft-head piece needs the id list")
            return ids
        raise ValueError(f"unknown row selector {self.rows!r}")

    def n_rows(self, hf_rows: int, ids: np.ndarray | None = None) -> int:
        index = self.row_index(hf_rows, ids)
        if isinstance(index, slice):
            return index.stop - index.start
        return len(index)


@dataclass(frozen=True)
class TensorRule:
    """One artifact tensor: name, stored shape, role (for the format assignment) and pieces."""

    name: str
    shape: tuple[int, ...]
    role: str
    layer: int | None = None
    pieces: tuple[Piece, ...] = field(default=())
    source: str = "base"  # "base" | "dflash" | "ids" (draft id map) | "divisor" (NVFP4 input divisor)


@dataclass(frozen=True)
class DFlashShape:
    """The DFlash drafter's dimensions (35B-A3B: 6 layers, 32/8 heads x 128, MLP 6144, 8 features)."""

    layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    n_features: int


# ---------------------------------------------------------------------------------------------
# HF shapes


def hf_shapes(config: ModelConfig, dflash: DFlashShape | None = None) -> dict[str, tuple[int, ...]]:
    """Every HF tensor the artifact draws from (canonical names) -> its shape."""
    c = config
    H = c.hidden
    s: dict[str, tuple[int, ...]] = {
        TEXT + "embed_tokens.weight": (c.vocab, H),
        TEXT + "norm.weight": (H,),
    }
    if not c.tie_embeddings:
        s[HEAD] = (c.vocab, H)
    for layer in range(c.n_layers):
        p = f"{TEXT}layers.{layer}."
        s[p + "input_layernorm.weight"] = (H,)
        s[p + "post_attention_layernorm.weight"] = (H,)
        if c.layer_types[layer] == "full_attention":
            s.update(_attn_shapes(c, p + "self_attn."))
        else:
            kw, vw = c.gdn_key_width, c.gdn_value_width
            g = p + "linear_attn."
            s[g + "in_proj_qkv.weight"] = (2 * kw + vw, H)
            s[g + "in_proj_z.weight"] = (vw, H)
            s[g + "in_proj_a.weight"] = (c.gdn_v_heads, H)
            s[g + "in_proj_b.weight"] = (c.gdn_v_heads, H)
            s[g + "conv1d.weight"] = (c.conv_dim, 1, c.conv_kernel)
            s[g + "A_log"] = (c.gdn_v_heads,)
            s[g + "dt_bias"] = (c.gdn_v_heads,)
            s[g + "norm.weight"] = (c.gdn_v_dim,)
            s[g + "out_proj.weight"] = (H, vw)
        s.update(_mlp_shapes(c, p + "mlp."))
    if c.mtp_layers:
        s["mtp.fc.weight"] = (H, 2 * H)
        for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            s[f"mtp.{n}.weight"] = (H,)
        m = "mtp.layers.0."
        s[m + "input_layernorm.weight"] = (H,)
        s[m + "post_attention_layernorm.weight"] = (H,)
        s.update(_attn_shapes(c, m + "self_attn."))
        s.update(_mlp_shapes(c, m + "mlp."))
    if c.vision is not None:
        s.update(_vision_shapes(c))
    if dflash is not None:
        s.update(dflash_shapes(dflash))
    return s


def _attn_shapes(c: ModelConfig, a: str) -> dict[str, tuple[int, ...]]:
    H, d = c.hidden, c.head_dim
    return {
        a + "q_proj.weight": (2 * c.n_heads * d, H),
        a + "k_proj.weight": (c.n_kv_heads * d, H),
        a + "v_proj.weight": (c.n_kv_heads * d, H),
        a + "o_proj.weight": (H, c.n_heads * d),
        a + "q_norm.weight": (d,),
        a + "k_norm.weight": (d,),
    }


def _mlp_shapes(c: ModelConfig, m: str) -> dict[str, tuple[int, ...]]:
    H = c.hidden
    if not c.is_moe:
        return {
            m + "gate_proj.weight": (c.intermediate, H),
            m + "up_proj.weight": (c.intermediate, H),
            m + "down_proj.weight": (H, c.intermediate),
        }
    E, I, S = c.n_experts, c.moe_intermediate, c.shared_intermediate
    return {
        m + "gate.weight": (E, H),
        m + "experts.gate_up_proj": (E, 2 * I, H),
        m + "experts.down_proj": (E, H, I),
        m + "shared_expert.gate_proj.weight": (S, H),
        m + "shared_expert.up_proj.weight": (S, H),
        m + "shared_expert.down_proj.weight": (H, S),
        m + "shared_expert_gate.weight": (1, H),
    }


@dataclass(frozen=True)
class VisionShape:
    depth: int
    hidden: int
    intermediate: int
    in_channels: int
    temporal_patch: int
    patch: int
    merge: int
    positions: int
    out_hidden: int

    @property
    def patch_input(self) -> int:
        return self.in_channels * self.temporal_patch * self.patch * self.patch

    @property
    def merged(self) -> int:
        return self.hidden * self.merge * self.merge


def vision_shape(c: ModelConfig) -> VisionShape:
    v = c.vision or {}
    return VisionShape(
        depth=int(v.get("depth", 27)),
        hidden=int(v.get("hidden_size", 1152)),
        intermediate=int(v.get("intermediate_size", 4304)),
        in_channels=int(v.get("in_channels", 3)),
        temporal_patch=int(v.get("temporal_patch_size", 2)),
        patch=int(v.get("patch_size", 16)),
        merge=int(v.get("spatial_merge_size", 2)),
        positions=int(v.get("num_position_embeddings", 2304)),
        out_hidden=int(v.get("out_hidden_size", c.hidden)),
    )


def _vision_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    v = vision_shape(c)
    s: dict[str, tuple[int, ...]] = {
        VISUAL + "patch_embed.proj.weight": (v.hidden, v.in_channels, v.temporal_patch, v.patch, v.patch),
        VISUAL + "patch_embed.proj.bias": (v.hidden,),
        VISUAL + "pos_embed.weight": (v.positions, v.hidden),
    }
    for b in range(v.depth):
        p = f"{VISUAL}blocks.{b}."
        s[p + "attn.qkv.weight"] = (3 * v.hidden, v.hidden)
        s[p + "attn.qkv.bias"] = (3 * v.hidden,)
        s[p + "attn.proj.weight"] = (v.hidden, v.hidden)
        s[p + "attn.proj.bias"] = (v.hidden,)
        s[p + "mlp.linear_fc1.weight"] = (v.intermediate, v.hidden)
        s[p + "mlp.linear_fc1.bias"] = (v.intermediate,)
        s[p + "mlp.linear_fc2.weight"] = (v.hidden, v.intermediate)
        s[p + "mlp.linear_fc2.bias"] = (v.hidden,)
        for n in ("norm1", "norm2"):
            s[f"{p}{n}.weight"] = (v.hidden,)
            s[f"{p}{n}.bias"] = (v.hidden,)
    m = VISUAL + "merger."
    s[m + "linear_fc1.weight"] = (v.merged, v.merged)
    s[m + "linear_fc1.bias"] = (v.merged,)
    s[m + "linear_fc2.weight"] = (v.out_hidden, v.merged)
    s[m + "linear_fc2.bias"] = (v.out_hidden,)
    s[m + "norm.weight"] = (v.hidden,)
    s[m + "norm.bias"] = (v.hidden,)
    return s


def dflash_shapes(d: DFlashShape) -> dict[str, tuple[int, ...]]:
    H = d.hidden
    s: dict[str, tuple[int, ...]] = {
        DFLASH + "fc.weight": (H, d.n_features * H),
        DFLASH + "hidden_norm.weight": (H,),
        DFLASH + "norm.weight": (H,),
    }
    for layer in range(d.layers):
        p = f"{DFLASH}layers.{layer}."
        s[p + "input_layernorm.weight"] = (H,)
        s[p + "post_attention_layernorm.weight"] = (H,)
        s[p + "self_attn.q_proj.weight"] = (d.n_heads * d.head_dim, H)
        s[p + "self_attn.k_proj.weight"] = (d.n_kv_heads * d.head_dim, H)
        s[p + "self_attn.v_proj.weight"] = (d.n_kv_heads * d.head_dim, H)
        s[p + "self_attn.o_proj.weight"] = (H, d.n_heads * d.head_dim)
        s[p + "self_attn.q_norm.weight"] = (d.head_dim,)
        s[p + "self_attn.k_norm.weight"] = (d.head_dim,)
        s[p + "mlp.gate_proj.weight"] = (d.intermediate, H)
        s[p + "mlp.up_proj.weight"] = (d.intermediate, H)
        s[p + "mlp.down_proj.weight"] = (H, d.intermediate)
    return s


# ---------------------------------------------------------------------------------------------
# Artifact tensor rules


def tensor_rules(
    config: ModelConfig, plan: str, draft_rows: int, dflash: DFlashShape | None = None
) -> list[TensorRule]:
    """The artifact's tensors in writer order (formats are assigned by the identity registry)."""
    if plan not in PLANS:
        raise ValueError(f"unknown fusion plan {plan!r}")
    c = config
    H = c.hidden
    rules: list[TensorRule] = [_copy("text/token_embedding", TEXT + "embed_tokens.weight", (c.vocab, H), "embedding")]
    for layer in range(c.n_layers):
        rules += _layer_rules(c, plan, layer)
    head_src = TEXT + "embed_tokens.weight" if c.tie_embeddings else HEAD
    rules.append(_copy("text/final_norm", TEXT + "norm.weight", (H,), "norm"))
    rules.append(
        TensorRule("text/output_head", (c.vocab, H), "output_head", None, (Piece(head_src, derived=c.tie_embeddings),))
    )
    rules.append(TensorRule("text/draft_head", (draft_rows, H), "draft_head", None, (Piece(head_src, ("ids",), derived=True),)))
    rules.append(TensorRule("text/draft_head_token_ids", (draft_rows,), "draft_ids", None, (), source="ids"))
    if c.mtp_layers:
        rules += _mtp_rules(c, plan)
    if c.vision is not None:
        rules += _vision_rules(c)
    if dflash is not None:
        rules += _dflash_rules(dflash)
    return rules


def _copy(name: str, hf: str, shape: tuple[int, ...], role: str, layer: int | None = None) -> TensorRule:
    return TensorRule(name, shape, role, layer, (Piece(hf),))


def _attention_rules(c: ModelConfig, fused: bool, prefix: str, hf: str, layer: int | None) -> list[TensorRule]:
    """input projections (+ norms and output) of a gated attention block: prefix 'text/layers/L/'."""
    H, d = c.hidden, c.head_dim
    q, kv = c.n_heads * d, c.n_kv_heads * d
    a = hf + "self_attn."
    query = Piece(a + "q_proj.weight", ("half", c.n_heads, d, 0))
    gate = Piece(a + "q_proj.weight", ("half", c.n_heads, d, 1))
    key, value = Piece(a + "k_proj.weight"), Piece(a + "v_proj.weight")
    if fused:
        inputs = [TensorRule(prefix + "attention/query_key_gate_value", (2 * q + 2 * kv, H), "attn_qkgv", layer,
                             (query, key, gate, value))]
    else:
        inputs = [
            TensorRule(prefix + "attention/query_key", (q + kv, H), "attn_qk", layer, (query, key)),
            TensorRule(prefix + "attention/gate_value", (q + kv, H), "attn_gv", layer, (gate, value)),
        ]
    return [
        _copy(prefix + "input_norm", hf + "input_layernorm.weight", (H,), "norm", layer),
        *inputs,
        _copy(prefix + "attention/query_norm", a + "q_norm.weight", (d,), "norm", layer),
        _copy(prefix + "attention/key_norm", a + "k_norm.weight", (d,), "norm", layer),
        _copy(prefix + "attention/output", a + "o_proj.weight", (H, q), "attn_out", layer),
        _copy(prefix + "post_attention_norm", hf + "post_attention_layernorm.weight", (H,), "norm", layer),
    ]


def _gdn_rules(c: ModelConfig, plan: str, prefix: str, hf: str, layer: int) -> list[TensorRule]:
    H = c.hidden
    kw, vw, hv = c.gdn_key_width, c.gdn_value_width, c.gdn_v_heads
    g = hf + "linear_attn."
    qkv = g + "in_proj_qkv.weight"
    z = Piece(g + "in_proj_z.weight")
    a, b = Piece(g + "in_proj_a.weight"), Piece(g + "in_proj_b.weight")
    out = [
        _copy(prefix + "input_norm", hf + "input_layernorm.weight", (H,), "norm", layer),
        _copy(prefix + "gdn/a_log", g + "A_log", (hv,), "a_log", layer),
        _copy(prefix + "gdn/dt_bias", g + "dt_bias", (hv,), "dt_bias", layer),
        TensorRule(prefix + "gdn/convolution", (c.conv_kernel, c.conv_dim), "conv", layer, (Piece(g + "conv1d.weight", op="conv"),)),
    ]
    if plan == "moe":
        out.append(TensorRule(prefix + "gdn/a_b_projection", (2 * hv, H), "gdn_ab", layer, (a, b)))
    else:
        out.append(TensorRule(prefix + "gdn/a_projection", (hv, H), "gdn_ab", layer, (a,)))
        out.append(TensorRule(prefix + "gdn/b_projection", (hv, H), "gdn_ab", layer, (b,)))
    if plan == "split":
        out.append(TensorRule(prefix + "gdn/query_key", (2 * kw, H), "gdn_qk", layer, (Piece(qkv, ("range", 0, 2 * kw)),)))
        out.append(TensorRule(prefix + "gdn/value_z", (2 * vw, H), "gdn_vz", layer,
                              (Piece(qkv, ("range", 2 * kw, 2 * kw + vw)), z)))
    else:
        out.append(TensorRule(prefix + "gdn/query_key_value_z", (2 * kw + 2 * vw, H), "gdn_qkvz", layer, (Piece(qkv), z)))
    out.append(_copy(prefix + "gdn/norm", g + "norm.weight", (c.gdn_v_dim,), "norm", layer))
    out.append(_copy(prefix + "gdn/output", g + "out_proj.weight", (H, vw), "gdn_out", layer))
    out.append(_copy(prefix + "post_attention_norm", hf + "post_attention_layernorm.weight", (H,), "norm", layer))
    return out


def _mlp_rules(c: ModelConfig, prefix: str, hf: str, layer: int | None) -> list[TensorRule]:
    H = c.hidden
    m = hf + "mlp."
    if not c.is_moe:
        I = c.intermediate
        return [
            TensorRule(prefix + "mlp/gate_up", (2 * I, H), "mlp_gate_up", layer,
                       (Piece(m + "gate_proj.weight"), Piece(m + "up_proj.weight"))),
            _copy(prefix + "mlp/down", m + "down_proj.weight", (H, I), "mlp_down", layer),
        ]
    E, I, S = c.n_experts, c.moe_intermediate, c.shared_intermediate
    return [
        TensorRule(prefix + "moe/router_shared_gate", (E + 1, H), "router", layer,
                   (Piece(m + "gate.weight"), Piece(m + "shared_expert_gate.weight"))),
        _copy(prefix + "moe/routed_gate_up", m + "experts.gate_up_proj", (E * 2 * I, H), "routed_gate_up", layer),
        _copy(prefix + "moe/routed_down", m + "experts.down_proj", (E * H, I), "routed_down", layer),
        TensorRule(prefix + "moe/shared_gate_up", (2 * S, H), "shared_gate_up", layer,
                   (Piece(m + "shared_expert.gate_proj.weight"), Piece(m + "shared_expert.up_proj.weight"))),
        _copy(prefix + "moe/shared_down", m + "shared_expert.down_proj.weight", (H, S), "shared_down", layer),
    ]


def _layer_rules(c: ModelConfig, plan: str, layer: int) -> list[TensorRule]:
    prefix, hf = f"text/layers/{layer}/", f"{TEXT}layers.{layer}."
    if c.layer_types[layer] == "full_attention":
        mixer = _attention_rules(c, plan != "split", prefix, hf, layer)
    else:
        mixer = _gdn_rules(c, plan, prefix, hf, layer)
    return mixer + _mlp_rules(c, prefix, hf, layer)


def _mtp_rules(c: ModelConfig, plan: str) -> list[TensorRule]:
    H = c.hidden
    attn = _attention_rules(c, True, "mtp/layer/", "mtp.layers.0.", None)
    return [
        _copy("mtp/input_projection", "mtp.fc.weight", (H, 2 * H), "mtp_matrix"),
        _copy("mtp/embedding_norm", "mtp.pre_fc_norm_embedding.weight", (H,), "norm"),
        _copy("mtp/hidden_norm", "mtp.pre_fc_norm_hidden.weight", (H,), "norm"),
        *[_as_mtp(r) for r in attn],
        *[_as_mtp(r) for r in _mlp_rules(c, "mtp/layer/", "mtp.layers.0.", None)],
        _copy("mtp/final_norm", "mtp.norm.weight", (H,), "norm"),
    ]


def _as_mtp(rule: TensorRule) -> TensorRule:
    """MTP tensors: every matrix is an `mtp_matrix`; norms and the router stay BF16."""
    role = rule.role if rule.role in ("norm", "router") else "mtp_matrix"
    return TensorRule(rule.name, rule.shape, role, None, rule.pieces)


def _vision_rules(c: ModelConfig) -> list[TensorRule]:
    v = vision_shape(c)
    rules = [
        _copy("vision/patch_embedding", VISUAL + "patch_embed.proj.weight", (v.hidden, v.patch_input), "vision_patch"),
        _copy("vision/patch_embedding_bias", VISUAL + "patch_embed.proj.bias", (v.hidden,), "vision_direct"),
        _copy("vision/position_embedding", VISUAL + "pos_embed.weight", (v.positions, v.hidden), "vision_direct"),
    ]
    for b in range(v.depth):
        p, hf = f"vision/layers/{b}/", f"{VISUAL}blocks.{b}."
        rules += [
            _copy(p + "attention/qkv", hf + "attn.qkv.weight", (3 * v.hidden, v.hidden), "vision_in"),
            _copy(p + "attention/qkv_bias", hf + "attn.qkv.bias", (3 * v.hidden,), "vision_direct"),
            _copy(p + "attention/output", hf + "attn.proj.weight", (v.hidden, v.hidden), "vision_out"),
            _copy(p + "attention/output_bias", hf + "attn.proj.bias", (v.hidden,), "vision_direct"),
            _copy(p + "mlp/fc1", hf + "mlp.linear_fc1.weight", (v.intermediate, v.hidden), "vision_in"),
            _copy(p + "mlp/fc1_bias", hf + "mlp.linear_fc1.bias", (v.intermediate,), "vision_direct"),
            _copy(p + "mlp/fc2", hf + "mlp.linear_fc2.weight", (v.hidden, v.intermediate), "vision_out"),
            _copy(p + "mlp/fc2_bias", hf + "mlp.linear_fc2.bias", (v.hidden,), "vision_direct"),
            _copy(p + "norm1/weight", hf + "norm1.weight", (v.hidden,), "vision_direct"),
            _copy(p + "norm1/bias", hf + "norm1.bias", (v.hidden,), "vision_direct"),
            _copy(p + "norm2/weight", hf + "norm2.weight", (v.hidden,), "vision_direct"),
            _copy(p + "norm2/bias", hf + "norm2.bias", (v.hidden,), "vision_direct"),
        ]
    m = VISUAL + "merger."
    rules += [
        _copy("vision/merger/fc1", m + "linear_fc1.weight", (v.merged, v.merged), "vision_merger"),
        _copy("vision/merger/fc1_bias", m + "linear_fc1.bias", (v.merged,), "vision_direct"),
        _copy("vision/merger/fc2", m + "linear_fc2.weight", (v.out_hidden, v.merged), "vision_merger"),
        _copy("vision/merger/fc2_bias", m + "linear_fc2.bias", (v.out_hidden,), "vision_direct"),
        _copy("vision/merger/norm/weight", m + "norm.weight", (v.hidden,), "vision_direct"),
        _copy("vision/merger/norm/bias", m + "norm.bias", (v.hidden,), "vision_direct"),
    ]
    return rules


def _dflash_rules(d: DFlashShape) -> list[TensorRule]:
    H = d.hidden
    q, kv = d.n_heads * d.head_dim, d.n_kv_heads * d.head_dim

    def copy(name: str, hf: str, shape: tuple[int, ...], role: str) -> TensorRule:
        return TensorRule(name, shape, role, None, (Piece(DFLASH + hf),), source="dflash")

    rules = [
        copy("dflash/feature_projection", "fc.weight", (H, d.n_features * H), "dflash_matrix"),
        copy("dflash/context_norm", "hidden_norm.weight", (H,), "norm"),
    ]
    for layer in range(d.layers):
        p, hf = f"dflash/layers/{layer}/", f"layers.{layer}."
        a = DFLASH + hf + "self_attn."
        m = DFLASH + hf + "mlp."
        rules += [
            copy(p + "input_norm", hf + "input_layernorm.weight", (H,), "norm"),
            TensorRule(p + "attention/query_key_value", (q + 2 * kv, H), "dflash_matrix", None,
                       (Piece(a + "q_proj.weight"), Piece(a + "k_proj.weight"), Piece(a + "v_proj.weight")), "dflash"),
            copy(p + "attention/query_norm", hf + "self_attn.q_norm.weight", (d.head_dim,), "norm"),
            copy(p + "attention/key_norm", hf + "self_attn.k_norm.weight", (d.head_dim,), "norm"),
            copy(p + "attention/output", hf + "self_attn.o_proj.weight", (H, q), "dflash_matrix"),
            copy(p + "post_attention_norm", hf + "post_attention_layernorm.weight", (H,), "norm"),
            TensorRule(p + "mlp/gate_up", (2 * d.intermediate, H), "dflash_matrix", None,
                       (Piece(m + "gate_proj.weight"), Piece(m + "up_proj.weight")), "dflash"),
            copy(p + "mlp/down", hf + "mlp.down_proj.weight", (H, d.intermediate), "dflash_matrix"),
        ]
    rules.append(copy("dflash/final_norm", "norm.weight", (H,), "norm"))
    return rules


# ---------------------------------------------------------------------------------------------
# NVFP4 site-level input divisors (27B nvfp4 artifact §13.4)

_DIVISOR_SITES = {
    "attention/query_key_gate_value": "attention/input_projection",
    "attention/output": "attention/output_projection",
    "gdn/query_key_value_z": "gdn/input_projection",
    "gdn/output": "gdn/output_projection",
    "mlp/gate_up": "mlp/gate_up_projection",
    "mlp/down": "mlp/down_projection",
}


def input_divisor_name(matrix: str) -> str | None:
    """The `input_scale_divisor` scalar that follows an NVFP4 text matrix, or None."""
    if not matrix.startswith("text/layers/"):
        return None
    _, _, layer, suffix = matrix.split("/", 3)
    site = _DIVISOR_SITES.get(suffix)
    return None if site is None else f"text/layers/{layer}/{site}/input_scale_divisor"


# ---------------------------------------------------------------------------------------------
# Building and unbuilding values


def _view(array: np.ndarray, rule: TensorRule) -> np.ndarray:
    """An HF tensor as rows of the artifact tensor's last dimension (1-D tensors stay 1-D)."""
    return array.reshape(-1, rule.shape[-1]) if len(rule.shape) >= 2 else array


def build(rule: TensorRule, fetch, ids: np.ndarray | None = None) -> np.ndarray:
    """The artifact tensor's logical value from HF tensors (`fetch(name) -> array`), HF dtype kept."""
    parts = []
    for piece in rule.pieces:
        src = fetch(piece.hf)
        if piece.op == "conv":
            parts.append(np.ascontiguousarray(src[:, 0, :].T))
            continue
        view = _view(src, rule)
        parts.append(view[piece.row_index(view.shape[0], ids)])
    value = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
    return value.reshape(rule.shape)


def scatter(rule: TensorRule, value: np.ndarray, hf: str, out: np.ndarray,
            shapes: dict[str, tuple[int, ...]]) -> int:
    """Write the rows of HF tensor `hf` held by `rule` (artifact value `value`) into `out`.

    `out` has `hf`'s shape; `shapes` gives every HF tensor's shape. Returns the number of rows of
    `hf` (in the artifact's row view) written, 0 if the rule holds none.
    """
    flat = _view(value, rule)
    target = _view(out, rule)
    offset = written = 0
    for piece in rule.pieces:
        if piece.derived:  # only ever the sole piece of its rule (draft head, tied output head)
            continue
        if piece.op == "conv":
            if piece.hf == hf:
                out[:, 0, :] = value.T
                written += out.shape[0]
            continue
        hf_rows = view_rows(rule, shapes[piece.hf])
        n = piece.n_rows(hf_rows)
        if piece.hf == hf:
            target[piece.row_index(hf_rows)] = flat[offset:offset + n]
            written += n
        offset += n
    return written


def view_rows(rule: TensorRule, hf_shape: tuple[int, ...]) -> int:
    """Rows of an HF tensor in the row view that `rule` uses."""
    if any(p.op == "conv" for p in rule.pieces):
        return hf_shape[0]
    return int(np.prod(hf_shape)) // rule.shape[-1] if len(rule.shape) >= 2 else hf_shape[0]
