"""Sampling presets per model family / thinking mode, generation_config fallback, override order."""

import pytest

from inferno.engine import SamplingError, SamplingParams
from inferno.engine.presets import family_of, model_defaults, resolve_sampling


@pytest.mark.parametrize(
    ("identity", "family"),
    [
        ("qwen3.6-27b/groupwise-int", "qwen3.6-27b"),
        ("qwen3.6-27b/nvfp4", "qwen3.6-27b"),
        ("qwen3.8-27b/groupwise-int", "qwen3.8-27b"),
        ("qwen3.6-35b-a3b/groupwise-int", "qwen3.6-35b-a3b"),
        ("Qwen3.6-35B-A3B", "qwen3.6-35b-a3b"),  # an HF dir name
        ("tiny-dense", None),
        ("", None),
        (None, None),
    ],
)
def test_family_of(identity, family):
    assert family_of(identity) == family


def fields(p: SamplingParams):
    return (p.temperature, p.top_p, p.top_k, p.min_p, p.presence_penalty, p.frequency_penalty)


@pytest.mark.parametrize("model", ["qwen3.6-27b/groupwise-int", "qwen3.8-27b/groupwise-int"])
def test_27b_presets(model):
    assert fields(resolve_sampling(model, True)) == (1.0, 0.95, 20, 0.0, 0.0, 0.0)
    assert fields(resolve_sampling(model, False)) == (0.7, 0.80, 20, 0.0, 1.5, 0.0)


def test_35b_thinking_has_presence_penalty():
    assert fields(resolve_sampling("qwen3.6-35b-a3b/groupwise-int", True)) == (1.0, 0.95, 20, 0.0, 1.5, 0.0)
    assert fields(resolve_sampling("qwen3.6-35b-a3b/groupwise-int", False)) == (0.7, 0.80, 20, 0.0, 1.5, 0.0)


def test_presets_win_over_generation_config():
    gc = {"temperature": 0.2, "top_k": 5}
    assert resolve_sampling("qwen3.6-27b/nvfp4", True, gc).temperature == 1.0


def test_unknown_model_uses_generation_config():
    gc = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.9, "eos_token_id": [1, 2]}
    p = resolve_sampling("tiny-dense", True, gc)
    assert (p.temperature, p.top_k, p.top_p) == (0.6, 20, 0.9)
    assert resolve_sampling("tiny-dense", True, {**gc, "do_sample": False}).greedy


def test_unknown_model_without_generation_config_uses_plain_defaults():
    assert resolve_sampling("tiny-dense", False) == SamplingParams()
    assert model_defaults("tiny-dense", True, {"temperature": "hot", "top_k": True}) == {}


def test_override_layers_in_order_and_greedy_last():
    p = resolve_sampling(
        "qwen3.6-27b/groupwise-int",
        False,
        None,
        {"temperature": 0.5, "top_k": 40, "seed": 3},  # process flags
        {"temperature": 0.9, "top_k": None},  # request fields (None = not given)
    )
    assert (p.temperature, p.top_k, p.seed, p.presence_penalty) == (0.9, 40, 3, 1.5)
    assert resolve_sampling("qwen3.6-27b", True, None, {"temperature": 0.9}, greedy=True).temperature == 0.0


def test_bad_override_values_are_sampling_errors():
    with pytest.raises(SamplingError, match="top_p"):
        resolve_sampling("qwen3.6-27b", True, None, {"top_p": 2})
    with pytest.raises(KeyError):
        resolve_sampling("qwen3.6-27b", True, None, {"nucleus": 0.5})
