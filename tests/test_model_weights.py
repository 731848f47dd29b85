"""DictWeights: canonical names, fused experts, errors."""

import ml_dtypes
import numpy as np
import pytest

from inferno.errors import ArtifactError
from inferno.model.weights import DictWeights, Weights, canonical_name

P = "model.language_model.layers.0.mlp.experts"


def test_canonical_names():
    assert canonical_name("model.layers.0.mlp.up_proj.weight") == "model.language_model.layers.0.mlp.up_proj.weight"
    assert canonical_name("model.embed_tokens.weight") == "model.language_model.embed_tokens.weight"
    for kept in ("model.language_model.norm.weight", "lm_head.weight", "mtp.fc.weight", "model.visual.pos_embed.weight"):
        assert canonical_name(kept) == kept


def test_prefixes_and_dtype():
    w = DictWeights({"model.norm.weight": np.ones(4, ml_dtypes.bfloat16), "lm_head.weight": np.zeros((2, 4))})
    assert isinstance(w, Weights)
    assert w.names() == ["lm_head.weight", "model.language_model.norm.weight"]
    assert "model.language_model.norm.weight" in w and "model.norm.weight" not in w
    got = w.get("model.language_model.norm.weight")
    assert got.dtype == np.float32 and np.array_equal(got, np.ones(4))
    assert w.get("lm_head.weight").dtype == np.float32


def _per_expert(rng, experts=3, inter=5, hidden=4, prefix="model.layers.0.mlp.experts"):
    t = {}
    for e in range(experts):
        t[f"{prefix}.{e}.gate_proj.weight"] = rng.standard_normal((inter, hidden))
        t[f"{prefix}.{e}.up_proj.weight"] = rng.standard_normal((inter, hidden))
        t[f"{prefix}.{e}.down_proj.weight"] = rng.standard_normal((hidden, inter))
    return t


def test_per_expert_tensors_are_fused_gate_first():
    rng = np.random.default_rng(0)
    t = _per_expert(rng)
    w = DictWeights(t)
    assert w.names() == [f"{P}.down_proj", f"{P}.gate_up_proj"]
    gate_up, down = w.get(f"{P}.gate_up_proj"), w.get(f"{P}.down_proj")
    assert gate_up.shape == (3, 10, 4) and down.shape == (3, 4, 5)
    src = "model.layers.0.mlp.experts"
    for e in range(3):
        np.testing.assert_array_equal(gate_up[e, :5], t[f"{src}.{e}.gate_proj.weight"].astype(np.float32))
        np.testing.assert_array_equal(gate_up[e, 5:], t[f"{src}.{e}.up_proj.weight"].astype(np.float32))
        np.testing.assert_array_equal(down[e], t[f"{src}.{e}.down_proj.weight"].astype(np.float32))


def test_mtp_experts_are_fused_under_their_own_name():
    w = DictWeights(_per_expert(np.random.default_rng(1), prefix="mtp.layers.0.mlp.experts"))
    assert w.get("mtp.layers.0.mlp.experts.gate_up_proj").shape == (3, 10, 4)


def test_missing_expert_part_names_the_tensor():
    t = _per_expert(np.random.default_rng(2))
    del t["model.layers.0.mlp.experts.1.up_proj.weight"]
    with pytest.raises(ArtifactError, match=r"layers\.0\.mlp\.experts\.1\.up_proj\.weight"):
        DictWeights(t)


def test_missing_tensor_names_it():
    with pytest.raises(ArtifactError, match="lm_head.weight"):
        DictWeights({}).get("lm_head.weight")


def test_duplicates_are_rejected():
    with pytest.raises(ArtifactError, match="twice"):
        DictWeights({"model.norm.weight": np.ones(2), "model.language_model.norm.weight": np.ones(2)})
    t = _per_expert(np.random.default_rng(3))
    t[f"{P}.gate_up_proj"] = np.zeros((3, 10, 4))
    with pytest.raises(ArtifactError, match="twice"):
        DictWeights(t)
