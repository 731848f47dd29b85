"""The reference executor against transformers goldens (tools/make_goldens.py).

Each case re-synthesizes the checkpoint the goldens were made from (same preset and seed, the
safetensors hash must match), opens it with `open_model`, and compares logits with a max
relative error (max |diff| / max |golden|) of at most 1e-3: uncached prefill, cached decode,
and the MTP head (whose goldens come from an independent torch implementation).
"""

import hashlib
from pathlib import Path

import numpy as np
import pytest

from inferno.checkpoint.source import open_model
from inferno.checkpoint.synth import synthesize
from inferno.model.reference import ReferenceExecutor

FIXTURES = Path(__file__).parent / "fixtures" / "golden"
MAX_REL = 1e-3


@pytest.fixture(scope="module", params=["dense", "moe"])
def case(request, tmp_path_factory):
    path = FIXTURES / request.param / "golden.npz"
    if not path.is_file():
        pytest.skip(f"{path.relative_to(FIXTURES.parent.parent)} is absent; generate it with tools/make_goldens.py")
    with np.load(path) as z:
        golden = {k: z[k] for k in z.files}
    ckpt = synthesize(str(golden["synth_preset"]), tmp_path_factory.mktemp(request.param) / "ckpt",
                      seed=int(golden["synth_seed"]))
    digest = hashlib.sha256((ckpt / "model.safetensors").read_bytes()).hexdigest()
    assert digest == str(golden["safetensors_sha256"]), (
        "the synthesized checkpoint changed since the goldens were made; rerun tools/make_goldens.py"
    )
    source = open_model(ckpt)
    return golden, ReferenceExecutor(source.config, source.weights)


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_prefill_matches_transformers(case):
    golden, ex = case
    logits = ex.forward(golden["input_ids"], ex.new_state())
    assert rel_err(logits, golden["prefill_logits"]) <= MAX_REL


def test_cached_decode_matches_transformers(case):
    golden, ex = case
    ids, n = golden["input_ids"], int(golden["prompt_len"])
    state = ex.new_state()
    logits = [ex.prefill(ids[:n], state)]
    logits += [ex.step(int(t), state) for t in ids[n:-1]]
    logits = np.stack(logits)
    assert rel_err(logits, golden["decode_logits"]) <= MAX_REL
    np.testing.assert_array_equal(logits.argmax(-1), ids[n:])  # goldens keep top-1/top-2 margins >= 1e-2


def test_mtp_matches_independent_torch(case):
    golden, ex = case
    state = ex.new_state()
    hidden = ex.hidden(golden["input_ids"], state)
    assert rel_err(hidden[:-1], golden["mtp_hidden"]) <= MAX_REL
    positions = golden["mtp_positions"]
    assert np.array_equal(positions, np.arange(positions[0], positions[0] + len(positions)))
    out = ex.mtp(golden["mtp_hidden"], golden["mtp_token_ids"], int(positions[0]), state)
    assert rel_err(out.logits, golden["mtp_logits"]) <= MAX_REL
