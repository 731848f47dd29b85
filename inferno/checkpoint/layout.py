"""The HF tensor layout of a Qwen3.5-family checkpoint: every (name, shape) a config implies.

Names and shapes follow the official BF16 checkpoints (research note qwen35-architecture §4):
text under `model.language_model.`, vision under `model.visual.`, `lm_head.weight` (absent when
embeddings are tied), and the MTP module under `mtp.`. MoE experts are listed fused
(`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I]) or per expert
(`mlp.experts.{e}.{gate,up,down}_proj.weight`).
"""

from __future__ import annotations

from collections.abc import Mapping

TEXT = "model.language_model."
VISUAL = "model.visual."
EXPERT_LAYOUTS = ("fused", "per-expert")

Shape = tuple[int, ...]


def _attention(p: str, t: Mapping) -> list[tuple[str, Shape]]:
    h, hd = t["hidden_size"], t["head_dim"]
    nq, nkv = t["num_attention_heads"], t["num_key_value_heads"]
    return [
        (p + "self_attn.q_proj.weight", (2 * nq * hd, h)),  # per head [q | gate]
        (p + "self_attn.k_proj.weight", (nkv * hd, h)),
        (p + "self_attn.v_proj.weight", (nkv * hd, h)),
        (p + "self_attn.o_proj.weight", (h, nq * hd)),
        (p + "self_attn.q_norm.weight", (hd,)),
        (p + "self_attn.k_norm.weight", (hd,)),
    ]


def _gdn(p: str, t: Mapping) -> list[tuple[str, Shape]]:
    h = t["hidden_size"]
    hk, hv = t["linear_num_key_heads"], t["linear_num_value_heads"]
    dk, dv = t["linear_key_head_dim"], t["linear_value_head_dim"]
    conv_dim = 2 * hk * dk + hv * dv
    return [
        (p + "linear_attn.in_proj_qkv.weight", (conv_dim, h)),
        (p + "linear_attn.in_proj_z.weight", (hv * dv, h)),
        (p + "linear_attn.in_proj_b.weight", (hv, h)),
        (p + "linear_attn.in_proj_a.weight", (hv, h)),
        (p + "linear_attn.conv1d.weight", (conv_dim, 1, t["linear_conv_kernel_dim"])),
        (p + "linear_attn.A_log", (hv,)),
        (p + "linear_attn.dt_bias", (hv,)),
        (p + "linear_attn.norm.weight", (dv,)),
        (p + "linear_attn.out_proj.weight", (h, hv * dv)),
    ]


def _ffn(p: str, t: Mapping, moe: bool, expert_layout: str) -> list[tuple[str, Shape]]:
    h = t["hidden_size"]
    if not moe:
        i = t["intermediate_size"]
        return [(p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)), (p + "mlp.down_proj.weight", (h, i))]
    e, i, s = t["num_experts"], t["moe_intermediate_size"], t["shared_expert_intermediate_size"]
    out = [(p + "mlp.gate.weight", (e, h))]
    if expert_layout == "fused":
        out += [(p + "mlp.experts.gate_up_proj", (e, 2 * i, h)), (p + "mlp.experts.down_proj", (e, h, i))]
    else:
        for x in range(e):
            q = f"{p}mlp.experts.{x}."
            out += [(q + "gate_proj.weight", (i, h)), (q + "up_proj.weight", (i, h)), (q + "down_proj.weight", (h, i))]
    out += [
        (p + "mlp.shared_expert.gate_proj.weight", (s, h)),
        (p + "mlp.shared_expert.up_proj.weight", (s, h)),
        (p + "mlp.shared_expert.down_proj.weight", (h, s)),
        (p + "mlp.shared_expert_gate.weight", (1, h)),
    ]
    return out


def _layer(p: str, t: Mapping, kind: str, moe: bool, expert_layout: str) -> list[tuple[str, Shape]]:
    h = t["hidden_size"]
    mixer = _attention(p, t) if kind == "full_attention" else _gdn(p, t)
    norms = [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
    return norms + mixer + _ffn(p, t, moe, expert_layout)


def text_tensors(text: Mapping, moe: bool, expert_layout: str = "fused") -> list[tuple[str, Shape]]:
    """Embedding, decoder layers, final norm, and lm_head (unless tied)."""
    h, v = text["hidden_size"], text["vocab_size"]
    out = [(TEXT + "embed_tokens.weight", (v, h))]
    for i, kind in enumerate(text["layer_types"]):
        out += _layer(f"{TEXT}layers.{i}.", text, kind, moe, expert_layout)
    out.append((TEXT + "norm.weight", (h,)))
    if not text.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (v, h)))
    return out


def mtp_tensors(text: Mapping, moe: bool, expert_layout: str = "fused") -> list[tuple[str, Shape]]:
    """The MTP head: fc over [norm(embedding), norm(hidden)], full-attention layers, final norm."""
    n = text.get("mtp_num_hidden_layers", 0)
    if not n:
        return []
    h = text["hidden_size"]
    out = [
        ("mtp.fc.weight", (h, 2 * h)),
        ("mtp.pre_fc_norm_embedding.weight", (h,)),
        ("mtp.pre_fc_norm_hidden.weight", (h,)),
    ]
    for i in range(n):
        out += _layer(f"mtp.layers.{i}.", text, "full_attention", moe, expert_layout)
    out.append(("mtp.norm.weight", (h,)))
    return out


def vision_tensors(vision: Mapping) -> list[tuple[str, Shape]]:
    """Patch embedding (Conv3d), learned positions, ViT blocks, and the 2x2 patch merger."""
    c = vision["hidden_size"]
    ff = vision["intermediate_size"]
    tp, ps, m = vision["temporal_patch_size"], vision["patch_size"], vision["spatial_merge_size"]
    merged = c * m * m
    out = [
        (VISUAL + "patch_embed.proj.weight", (c, vision["in_channels"], tp, ps, ps)),
        (VISUAL + "patch_embed.proj.bias", (c,)),
        (VISUAL + "pos_embed.weight", (vision["num_position_embeddings"], c)),
    ]
    for i in range(vision["depth"]):
        b = f"{VISUAL}blocks.{i}."
        out += [
            (b + "norm1.weight", (c,)),
            (b + "norm1.bias", (c,)),
            (b + "attn.qkv.weight", (3 * c, c)),
            (b + "attn.qkv.bias", (3 * c,)),
            (b + "attn.proj.weight", (c, c)),
            (b + "attn.proj.bias", (c,)),
            (b + "norm2.weight", (c,)),
            (b + "norm2.bias", (c,)),
            (b + "mlp.linear_fc1.weight", (ff, c)),
            (b + "mlp.linear_fc1.bias", (ff,)),
            (b + "mlp.linear_fc2.weight", (c, ff)),
            (b + "mlp.linear_fc2.bias", (c,)),
        ]
    out += [
        (VISUAL + "merger.norm.weight", (c,)),
        (VISUAL + "merger.norm.bias", (c,)),
        (VISUAL + "merger.linear_fc1.weight", (merged, merged)),
        (VISUAL + "merger.linear_fc1.bias", (merged,)),
        (VISUAL + "merger.linear_fc2.weight", (vision["out_hidden_size"], merged)),
        (VISUAL + "merger.linear_fc2.bias", (vision["out_hidden_size"],)),
    ]
    return out


def checkpoint_tensors(text: Mapping, vision: Mapping | None, moe: bool, expert_layout: str = "fused") -> list[tuple[str, Shape]]:
    """Every tensor of a checkpoint, in file order: text model, MTP, vision tower."""
    if expert_layout not in EXPERT_LAYOUTS:
        raise ValueError(f"expert_layout must be one of {EXPERT_LAYOUTS}")
    out = text_tensors(text, moe, expert_layout) + mtp_tensors(text, moe, expert_layout)
    if vision is not None:
        out += vision_tensors(vision)
    return out
