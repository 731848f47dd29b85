"""Unit checks of reference pieces: interleaved M-RoPE layout, GQA causal attention, MoE routing, norms."""

import numpy as np

from inferno.model.config import ModelConfig
from inferno.model.reference.attention import causal_attention
from inferno.model.reference.ffn import route
from inferno.model.reference.norms import gated_rms_norm, rms_norm
from inferno.model.reference.rope import apply_rope, frequency_axes, rope_tables
from model_fixtures import tiny_hf_config

CONFIG = ModelConfig.from_hf(tiny_hf_config())


def test_interleaved_mrope_axes():
    axes = frequency_axes(CONFIG)  # mrope_section [11, 11, 10] over 32 frequencies
    assert list(np.nonzero(axes == 1)[0]) == list(range(1, 33, 3))
    assert list(np.nonzero(axes == 2)[0]) == list(range(2, 30, 3))
    assert list(np.nonzero(axes == 0)[0]) == sorted(set(range(32)) - set(range(1, 33, 3)) - set(range(2, 30, 3)))


def test_rope_tables_pick_the_axis_coordinate():
    cos3, _ = rope_tables(CONFIG, np.array([[5], [0], [0]]))
    cos1, _ = rope_tables(CONFIG, np.array([5]))
    t_freqs = frequency_axes(CONFIG) == 0
    np.testing.assert_allclose(cos3[0, :32][t_freqs], cos1[0, :32][t_freqs])
    assert np.all(cos3[0, :32][~t_freqs] == 1.0)  # H and W coordinates are 0
    text, _ = rope_tables(CONFIG, np.array([[7, 8]] * 3))
    np.testing.assert_array_equal(text, rope_tables(CONFIG, np.array([7, 8]))[0])


def test_apply_rope_rotates_half_pairs_of_the_rotary_slice_only():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, CONFIG.head_dim)).astype(np.float32)
    cos, sin = rope_tables(CONFIG, np.array([0, 1, 1000]))
    y = apply_rope(x, cos, sin)
    np.testing.assert_array_equal(y[..., CONFIG.rotary_dim :], x[..., CONFIG.rotary_dim :])
    np.testing.assert_allclose(y[0], x[0], atol=1e-6)  # position 0: identity
    half = CONFIG.rotary_dim // 2
    pair_norm = lambda a: a[..., :half] ** 2 + a[..., half : 2 * half] ** 2  # noqa: E731
    np.testing.assert_allclose(pair_norm(y), pair_norm(x), rtol=1e-4)
    # frequency 0 (theta^0 = 1) at position 1 rotates (x0, x32) by one radian
    c, s = np.cos(1.0), np.sin(1.0)
    np.testing.assert_allclose(y[1, :, 0], x[1, :, 0] * c - x[1, :, half] * s, rtol=1e-5)
    np.testing.assert_allclose(y[1, :, half], x[1, :, half] * c + x[1, :, 0] * s, rtol=1e-5)


def test_causal_gqa_attention_matches_a_loop():
    rng = np.random.default_rng(1)
    t, s, hq, hkv, d = 3, 7, 4, 2, 16
    q = rng.standard_normal((t, hq, d)).astype(np.float32)
    k = rng.standard_normal((s, hkv, d)).astype(np.float32)
    v = rng.standard_normal((s, hkv, d)).astype(np.float32)
    out = causal_attention(q, k, v, scale=d**-0.5)
    for i in range(t):
        visible = s - t + i + 1
        for h in range(hq):
            kv = h // (hq // hkv)
            w = np.exp(k[:visible, kv] @ q[i, h] * d**-0.5)
            np.testing.assert_allclose(out[i, h], (w / w.sum()) @ v[:visible, kv], rtol=1e-5, atol=1e-6)


def test_router_softmax_topk_renormalised():
    x = np.array([[1.0, 0.0]], np.float32)
    router = np.array([[3.0, 1.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0]], np.float32)  # [hidden, E]
    experts, weights = route(x, router, top_k=2)
    assert list(experts[0]) == [0, 2]
    np.testing.assert_allclose(weights[0], [np.e / (np.e + 1), 1 / (np.e + 1)], rtol=1e-6)


def test_norm_variants():
    x = np.array([[3.0, 4.0]], np.float32)  # rms = sqrt(12.5)
    w = np.array([0.5, -1.0], np.float32)
    r = np.sqrt(12.5)
    np.testing.assert_allclose(rms_norm(x, w, 0.0), [[3 / r * 1.5, 0.0]], rtol=1e-6)
    z = np.array([[0.0, 100.0]], np.float32)
    np.testing.assert_allclose(gated_rms_norm(x, z, w, 0.0), [[0.0, -4 / r * 100.0]], rtol=1e-5)
