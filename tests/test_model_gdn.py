"""Gated DeltaNet pieces: chunked == recurrent delta rule, state carried across calls, conv state."""

import numpy as np
import pytest

from inferno.model.reference.gdn import causal_conv, chunked_delta_rule, recurrent_delta_rule
from inferno.model.reference.norms import l2_normalize

HEADS, DK, DV = 3, 128, 128


def _rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def _inputs(t, seed):
    rng = np.random.default_rng(seed)
    f32 = np.float32
    q = l2_normalize(rng.standard_normal((HEADS, t, DK)).astype(f32)) * f32(DK**-0.5)
    k = l2_normalize(rng.standard_normal((HEADS, t, DK)).astype(f32))
    v = rng.standard_normal((HEADS, t, DV)).astype(f32)
    g = -rng.uniform(0.0, 0.5, (HEADS, t)).astype(f32)
    beta = rng.uniform(0.0, 1.0, (HEADS, t)).astype(f32)
    state = (0.3 * rng.standard_normal((HEADS, DK, DV))).astype(f32)
    return q, k, v, g, beta, state


@pytest.mark.parametrize("t", [1, 63, 64, 65, 150])
def test_chunked_equals_recurrent_from_nonzero_state(t):
    q, k, v, g, beta, s0 = _inputs(t, seed=t)
    o_rec, s_rec = recurrent_delta_rule(q, k, v, g, beta, s0)
    o_chk, s_chk = chunked_delta_rule(q, k, v, g, beta, s0)
    assert o_chk.shape == (HEADS, t, DV) and s_chk.shape == (HEADS, DK, DV)
    assert _rel(o_chk, o_rec) < 1e-4 and _rel(s_chk, s_rec) < 1e-4
    assert np.abs(o_rec).max() > 0.01  # the comparison is not between near-zero outputs


def test_recurrent_step_is_the_delta_rule():
    q, k, v, g, beta, s0 = _inputs(1, seed=9)
    o, s = recurrent_delta_rule(q, k, v, g, beta, s0)
    for h in range(HEADS):
        decayed = s0[h] * np.exp(g[h, 0])
        want = decayed + np.outer(k[h, 0], beta[h, 0] * (v[h, 0] - k[h, 0] @ decayed))
        np.testing.assert_allclose(s[h], want, atol=1e-5)
        np.testing.assert_allclose(o[h, 0], q[h, 0] @ want, atol=1e-5)


def test_chunked_continues_from_carried_state():
    q, k, v, g, beta, s0 = _inputs(150, seed=3)
    o_all, s_all = chunked_delta_rule(q, k, v, g, beta, s0)
    o1, s1 = chunked_delta_rule(q[:, :70], k[:, :70], v[:, :70], g[:, :70], beta[:, :70], s0)
    o2, s2 = chunked_delta_rule(q[:, 70:], k[:, 70:], v[:, 70:], g[:, 70:], beta[:, 70:], s1)
    assert _rel(np.concatenate([o1, o2], axis=1), o_all) < 1e-4 and _rel(s2, s_all) < 1e-4


def test_causal_conv_carries_raw_inputs():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((10, 6)).astype(np.float32)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    zero = np.zeros((6, 3), np.float32)
    full, state = causal_conv(x, zero, w)
    np.testing.assert_array_equal(state, x[-3:].T)  # raw inputs, not activations
    # token t sees x[t-3..t], tap 3 on the current token
    np.testing.assert_allclose(full[5], (x[2:6] * w.T).sum(axis=0), rtol=1e-6)
    np.testing.assert_allclose(full[1], (x[0:2] * w[:, 2:].T).sum(axis=0), rtol=1e-6)
    _, s = causal_conv(x[:4], zero, w)
    for t in range(4, 10):
        out, s = causal_conv(x[t : t + 1], s, w)
        np.testing.assert_allclose(out[0], full[t], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(s, state)
