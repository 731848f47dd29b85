"""Sampler and SamplingParams on crafted logits."""

import numpy as np
import pytest

from inferno.engine import Sampler, SamplingError, SamplingParams
from inferno.engine.sampling import candidate_distribution, draw
from inferno.errors import InfernoError


def logits_of(probs):
    return np.log(np.asarray(probs, np.float64)).astype(np.float32)


PROBS = [0.05, 0.5, 0.15, 0.3]  # ranks: 1, 3, 2, 0


def test_greedy_is_argmax():
    rng = np.random.default_rng(0)
    for _ in range(50):
        x = rng.standard_normal(1000).astype(np.float32)
        assert Sampler(SamplingParams(temperature=0)).sample(x) == int(np.argmax(x))


def test_greedy_ignores_seed_and_filters():
    x = logits_of(PROBS)
    for seed in range(5):
        assert Sampler(SamplingParams(temperature=0, top_k=3, top_p=0.1, min_p=0.9, seed=seed)).sample(x) == 1


def test_top_k_keeps_the_k_most_likely():
    ids, _ = candidate_distribution(logits_of(PROBS), SamplingParams(top_k=2))
    assert sorted(ids.tolist()) == [1, 3]
    s = Sampler(SamplingParams(top_k=2, seed=1))
    assert {s.sample(logits_of(PROBS)) for _ in range(300)} == {1, 3}


@pytest.mark.parametrize(("top_p", "kept"), [(0.5, [1]), (0.8, [1, 3]), (0.81, [1, 3, 2]), (1.0, [1, 3, 2, 0])])
def test_top_p_keeps_smallest_prefix_reaching_mass(top_p, kept):
    ids, probs = candidate_distribution(logits_of(PROBS), SamplingParams(top_p=top_p))
    assert sorted(ids.tolist()) == sorted(kept)
    assert probs.sum() == pytest.approx(sum(PROBS[i] for i in kept), rel=1e-5)


def test_top_p_on_large_vocab_matches_full_sort():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(100_000) * 3).astype(np.float32)
    p = np.exp(x.astype(np.float64) - x.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    for top_p in (0.5, 0.9, 0.99):
        n = int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1
        ids, _ = candidate_distribution(x, SamplingParams(top_p=top_p))
        assert set(ids.tolist()) == set(order[:n].tolist())


def test_min_p_drops_tokens_below_fraction_of_max():
    ids, _ = candidate_distribution(logits_of(PROBS), SamplingParams(min_p=0.2))  # threshold 0.1
    assert sorted(ids.tolist()) == [1, 2, 3]
    ids, _ = candidate_distribution(logits_of(PROBS), SamplingParams(min_p=0.7))  # threshold 0.35
    assert ids.tolist() == [1]


def test_filters_compose_top_k_then_top_p():
    # Alone, top_p 0.82 needs {1, 3, 2} (0.5 + 0.3 < 0.82). After top_k=3 renormalises to
    # 0.526 / 0.316 / 0.158, the first two already reach it.
    ids, _ = candidate_distribution(logits_of(PROBS), SamplingParams(top_p=0.82))
    assert sorted(ids.tolist()) == [1, 2, 3]
    ids, _ = candidate_distribution(logits_of(PROBS), SamplingParams(top_k=3, top_p=0.82))
    assert sorted(ids.tolist()) == [1, 3]


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_sampling_matches_softmax(temperature):
    x = logits_of(PROBS)
    s = Sampler(SamplingParams(temperature=temperature, seed=7))
    n = 20000
    counts = np.bincount([s._choose(x) for _ in range(n)], minlength=4) / n
    want = np.exp(x / temperature)
    want /= want.sum()
    np.testing.assert_allclose(counts, want, atol=0.015)


def test_seeded_runs_are_reproducible_and_seeds_differ():
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal(500).astype(np.float32) for _ in range(40)]

    def run(seed):
        s = Sampler(SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=seed))
        return [s.sample(x) for x in xs]

    assert run(123) == run(123)
    assert run(123) != run(124)


def test_presence_penalty_applies_once_per_seen_token():
    s = Sampler(SamplingParams(temperature=0, presence_penalty=1.0))
    x = np.array([0.0, 2.0, 1.5, 0.0], np.float32)
    assert s.sample(x) == 1  # then token 1 scores 1.0 < 1.5
    assert s.sample(x) == 2  # token 2 scores 0.5, token 1 still 1.0 (presence not cumulative)
    assert s.sample(x) == 1
    np.testing.assert_allclose(s.penalised(x), [0.0, 1.0, 0.5, 0.0])


def test_frequency_penalty_grows_with_count():
    s = Sampler(SamplingParams(temperature=0, frequency_penalty=0.4))
    x = np.array([0.0, 1.0, 0.5], np.float32)
    assert [s.sample(x) for _ in range(4)] == [1, 1, 2, 1]  # 1.0, 0.6 > 0.5, 0.2 < 0.5, 0.2 > 0.1
    np.testing.assert_allclose(s.penalised(x), [0.0, 1.0 - 3 * 0.4, 0.5 - 0.4], atol=1e-6)


def test_negative_presence_penalty_encourages_repeats():
    s = Sampler(SamplingParams(temperature=0, presence_penalty=-1.0))
    x = np.array([1.0, 0.5], np.float32)
    assert [s.sample(x) for _ in range(3)] == [0, 0, 0]
    assert s.counts == {0: 3}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": 1.1}, "min_p"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"seed": -1}, "seed"),
        ({"seed": True}, "seed"),
    ],
)
def test_validation_names_the_field(kwargs, field):
    with pytest.raises(SamplingError, match=field) as info:
        SamplingParams(**kwargs)
    assert isinstance(info.value, InfernoError)
    assert "\n" not in str(info.value)


def test_boundary_values_are_valid():
    SamplingParams(temperature=0, top_k=0, top_p=1.0, min_p=1.0, presence_penalty=-2, frequency_penalty=2, seed=0)
    SamplingParams(seed=2**64 - 1)


def test_blocked_draw_matches_the_inverse_cdf():
    rng = np.random.default_rng(9)
    for n in (7, 1024, 1025, 5000, 248320):
        w = rng.random(n).astype(np.float32) ** 8
        c = np.cumsum(w, dtype=np.float64)
        for u in rng.random(200):
            want = min(int(np.searchsorted(c, u * c[-1], side="right")), n - 1)
            assert draw(w, u) == want
    w = np.zeros(3000, np.float32)
    w[2999] = 1.0  # all mass in the tail block
    assert draw(w, 0.0) == 2999 and draw(w, 0.999) == 2999


def test_large_vocab_sampling_follows_the_distribution():
    x = np.full(50_000, -30.0, np.float32)
    heavy = {3: 0.5, 20_000: 0.3, 49_999: 0.2}
    for i, p in heavy.items():
        x[i] = np.log(p)
    s = Sampler(SamplingParams(seed=4))
    n = 4000
    got = np.array([s._choose(x) for _ in range(n)])
    for i, p in heavy.items():
        assert abs((got == i).mean() - p) < 0.03
