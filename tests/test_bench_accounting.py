"""Bytes per decode step and FLOPs per prefill token, checked against hand arithmetic.

27B groupwise-int figures: research/anchors.md §5.2 (bytes = N*K*bits/8 with 4.25 / 5.25 / 6.25 /
8.5 bits per weight; no row-split padding at these shapes).
"""

from __future__ import annotations

import pytest

from inferno.artifact.identities import lookup
from inferno.bench.accounting import StateDtypes, account, kv_bytes_per_token, kv_vector_bytes
from inferno.checkpoint.presets import get_preset
from inferno.errors import UsageError
from inferno.model.config import ModelConfig

BITS = {"Q4": 4.25, "Q5": 5.25, "Q6": 6.25, "W8": 8.5}


def q(n: int, k: int, fmt: str) -> int:
    bits = n * k * BITS[fmt]
    assert bits % 8 == 0
    return int(bits // 8)


def registered(identity: str, states: StateDtypes | None = None):
    spec = lookup(*identity.split("/"))
    config = spec.builtin_config()
    return config, account(config, spec.expected(config), states)


def tiny(preset: str, weights_id: str = "groupwise-int"):
    config = ModelConfig.from_hf({**get_preset(preset).text})
    spec = lookup(f"inferno-test-{preset}", weights_id)
    return config, account(config, spec.expected(config))


def test_27b_groupwise_weights_per_decode_step_match_hand_arithmetic():
    _, a = registered("qwen3.6-27b/groupwise-int")
    H, I, V = 5120, 17408, 248320
    ffn_layer = q(2 * I, H, "Q4") + q(H, I, "Q5")
    assert ffn_layer == 153_190_400  # 94.70 MB gate_up + 58.49 MB down
    assert set(a.ffn_bytes_per_layer.values()) == {ffn_layer} and len(a.ffn_bytes_per_layer) == 64
    attn_layer = q(7168, H, "Q4") + q(7168, H, "Q5") + q(H, 6144, "Q5") + 2 * 256 * 2  # + q/k norms
    gdn_layer = (q(4096, H, "Q4") + q(12288, H, "Q5") + q(H, 6144, "Q5")
                 + 2 * 48 * H * 2 + 4 * 10240 * 2 + 128 * 2 + 2 * 48 * 4)  # a, b, conv, norm BF16; A_log, dt_bias FP32
    head = q(V, H, "Q6")
    norms = 64 * 2 * H * 2 + H * 2
    embedding_row = q(1, H, "Q6")
    assert a.weight_bytes == {"embedding_row": embedding_row, "attention": 16 * attn_layer, "gdn": 48 * gdn_layer,
                              "ffn": 64 * ffn_layer, "norms": norms, "output_head": head}
    assert a.weights_per_step == 15_385_046_944
    assert round(a.weights_per_step / 1e9, 2) == 15.39 and abs(a.weights_per_step - 15.38e9) < 0.01e9
    assert round(a.weight_bytes["ffn"] / 1e9, 3) == 9.804


def test_38b_w8_endpoints_and_35b_moe_active_bytes():
    _, a = registered("qwen3.8-27b/groupwise-int")
    assert a.weight_bytes["output_head"] == q(248320, 5120, "W8") == 1_350_860_800
    assert round(a.weights_per_step / 1e9, 2) == 15.74  # anchors §5.2
    config, m = registered("qwen3.6-35b-a3b/groupwise-int")
    H, E, I = 2048, 256, 512
    routed_gate_up = q(E * 2 * I, H, "Q4") * 8 // E  # top-8 of 256
    routed_down = {layer: q(E * H, I, "Q6" if layer in (34, 38, 39) else "Q5") * 8 // E for layer in range(40)}
    shared = q(2 * 512, H, "W8") + q(H, 512, "W8")
    router = (E + 1) * H * 2
    for layer in range(40):
        assert m.ffn_bytes_per_layer[layer] == routed_gate_up + routed_down[layer] + shared + router
    assert round(m.weights_per_step / 1e9, 2) == 2.52  # anchors §5.3


def test_kv_and_gdn_state_bytes():
    config, _ = registered("qwen3.6-27b/groupwise-int")
    assert kv_bytes_per_token(config, "bf16") == 16 * 4 * 256 * 2 * 2 == 65_536
    assert kv_bytes_per_token(config, "int8") == 33_792  # 4 groups of 64 B + fp16 scale per vector
    assert kv_bytes_per_token(config, "fp6") == 25_600
    assert kv_bytes_per_token(config, "fp32") == 131_072
    assert kv_vector_bytes(100, "int8") == 2 * 66  # a partial group still takes a whole group
    with pytest.raises(UsageError):
        kv_vector_bytes(256, "fp4")
    _, a = registered("qwen3.6-27b/groupwise-int", StateDtypes("int8", "bf16", "fp32"))
    assert a.gdn_state_bytes == 48 * (48 * 128 * 128 * 4 + 3 * 10240 * 2)
    # at 128K context the INT8 KV read is ~4.43 GB (anchors §5.2)
    assert round(131072 * a.kv_bytes_per_token / 1e9, 2) == 4.43
    step = a.decode_step_bytes(131072)
    assert step == a.weights_per_step + 131073 * 33_792 + 2 * a.gdn_state_bytes


def test_decode_bytes_sum_the_steps_after_the_prefill():
    _, a = tiny("tiny-dense")
    p, n = 37, 9
    # completion token 1 comes from the prefill; step i feeds position p+i-1 and attends to p+i tokens
    assert a.decode_bytes(p, n) == sum(a.decode_step_bytes(p + i) for i in range(1, n))
    assert a.decode_bytes(p, 1) == 0
    with pytest.raises(UsageError):
        a.decode_step_bytes(0)


def test_tiny_dense_weights_match_the_artifact_sizes():
    config, a = tiny("tiny-dense")
    H, I, V, L = 256, 512, 2048, 4
    # tiny shapes: K=256 pads to 256 (no padding), K=512 no padding; q() holds whenever N*K*bits % 8 == 0
    ffn = q(2 * I, H, "Q4") + q(H, I, "Q5")
    assert a.ffn_bytes_per_layer == dict.fromkeys(range(L), ffn)
    assert a.weight_bytes["output_head"] == q(V, H, "Q6")
    assert a.weight_bytes["embedding_row"] == q(1, H, "Q6")
    # MTP, draft head and vision are not read by the decode step
    spec = lookup("inferno-test-tiny-dense", "groupwise-int")
    names = [e.name for e in spec.expected(config)]
    assert any(n.startswith("mtp/") for n in names) and "text/draft_head" in names


def test_prefill_flops_27b():
    config, a = registered("qwen3.6-27b/groupwise-int")
    H, I, V = 5120, 17408, 248320
    attn = 2 * (7168 * H + 7168 * H + H * 6144)
    gdn = 2 * (4096 * H + 12288 * H + 2 * 48 * H + H * 6144)
    ffn = 2 * (2 * I * H + H * I)
    assert a.matrix_flops_per_token == 16 * attn + 48 * gdn + 64 * ffn
    assert round(a.matrix_flops_per_token / 1e9, 1) == 48.7  # ~2 x 24.4 G active matrix weights
    assert a.head_flops == 2 * V * H
    conv = 48 * 2 * 4 * 10240
    recurrence = 48 * 7 * 48 * 128 * 128
    assert a.linear_flops_per_token == a.matrix_flops_per_token + conv + recurrence
    t, chunk = 7680, 1024
    attention = 16 * 4 * 24 * 256 * (t * (t + 1) // 2)
    assert a.attention_flops(0, t) == attention
    assert a.prefill_flops(t, chunk) == t * a.linear_flops_per_token + attention + 8 * a.head_flops
    # chunking does not change the attention work: two halves sum to the whole
    assert a.attention_flops(0, 100) + a.attention_flops(100, 50) == a.attention_flops(0, 150)


def test_moe_prefill_counts_only_the_active_experts():
    config, a = tiny("tiny-moe")
    H, E, K, I, S = 256, 8, 2, 128, 128
    mlp = 2 * ((E + 1) * H + (2 * I * H + H * I) * K + 2 * S * H + H * S)
    attn = 2 * (2 * 4 * 256 * H + 2 * 2 * 256 * H + H * 4 * 256)
    gdn = 2 * ((2 * 2 * 128 + 2 * 4 * 128) * H + 2 * 4 * H + H * 4 * 128)
    assert a.matrix_flops_per_token == 4 * mlp + attn + 3 * gdn


def test_summary_is_json_ready():
    import json

    _, a = tiny("tiny-dense")
    s = json.loads(json.dumps(a.summary(65)))
    assert s["weights_per_decode_step"]["total"] == a.weights_per_step
    assert s["decode_step_bytes_at_context"] == {"context": 65, "bytes": a.decode_step_bytes(65)}
    assert s["prefill_flops_per_token"]["attention_at_context"] == a.attention_flops(64, 1)
