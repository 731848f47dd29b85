"""Synthetic artifacts written directly (random codes): valid, deterministic, numerically sane."""

from __future__ import annotations

import numpy as np
import pytest

from inferno.artifact import formats, model_source
from inferno.artifact.synth import random_nvfp4, random_row_split, synthesize_artifact
from inferno.errors import UsageError
from inferno.model.reference.executor import ReferenceExecutor


@pytest.mark.parametrize("preset, weights_id", [("tiny-dense", "groupwise-int"), ("tiny-dense", "nvfp4"),
                                                ("tiny-moe", "groupwise-int")])
def test_synthetic_artifact_runs(tmp_path, preset, weights_id):
    path = synthesize_artifact(preset, tmp_path / "a.ninfer", weights_id, progress=False)
    again = synthesize_artifact(preset, tmp_path / "b.ninfer", weights_id, progress=False)
    assert path.read_bytes() == again.read_bytes()
    src = model_source(path)
    assert src.identity == f"inferno-test-{preset}/{weights_id}"
    ex = ReferenceExecutor(src.config, src.weights)
    logits = ex.forward([1, 2, 3, 4], ex.new_state())
    assert np.all(np.isfinite(logits)) and 0.2 < logits.std() < 5


@pytest.mark.parametrize("fmt, shape", [("Q4G64_F16S", (64, 256)), ("Q5G64_F16S", (8, 4304)),
                                        ("Q6G64_F16S", (16, 1536)), ("W8G32_F16S", (32, 128))])
def test_random_row_split_is_valid_with_the_asked_spread(fmt, shape):
    payload = random_row_split(fmt, shape, 0.02, np.random.default_rng(0))
    values = formats.decode(fmt, formats.ROW_SPLIT, payload, shape)  # checks padding and code ranges
    assert 0.015 < values.std() < 0.025


def test_random_nvfp4_is_valid_with_the_asked_spread():
    payload = random_nvfp4((256, 512), 0.02, np.random.default_rng(0))
    values = formats.decode("NVFP4", formats.BLOCKSCALE, payload, (256, 512))
    assert 0.015 < values.std() < 0.025


def test_synth_refuses_other_outputs(tmp_path):
    with pytest.raises(UsageError, match=".ninfer"):
        synthesize_artifact("tiny-dense", tmp_path / "x.bin")
