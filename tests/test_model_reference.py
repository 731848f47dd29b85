"""ReferenceExecutor: incremental runs agree with one long prefill, MTP caching, state and input errors."""

import numpy as np
import pytest

from inferno.errors import ArtifactError, UsageError
from inferno.model.config import ModelConfig
from inferno.model.executor import Executor
from inferno.model.reference import ReferenceExecutor
from inferno.model.weights import DictWeights
from model_fixtures import random_tensors, tiny_hf_config, tiny_model

T = 150  # three GDN chunks


@pytest.fixture(scope="module", params=["dense", "moe"])
def executor(request):
    config, weights = tiny_model(moe=request.param == "moe", seed=11)
    return ReferenceExecutor(config, weights)


@pytest.fixture(scope="module")
def tokens(executor):
    return np.random.default_rng(5).integers(0, executor.config.vocab, T)


@pytest.fixture(scope="module")
def full_logits(executor, tokens):
    return executor.forward(tokens, executor.new_state())


def _rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_protocol_and_shapes(executor, tokens, full_logits):
    assert isinstance(executor, Executor)
    assert full_logits.shape == (T, executor.config.vocab) and full_logits.dtype == np.float32
    assert 0.3 < full_logits.std() < 3  # random weights sized for logits of order 1
    state = executor.new_state()
    last = executor.prefill(tokens, state)
    assert last.shape == (executor.config.vocab,) and state.position == T
    assert _rel(last, full_logits[-1]) < 1e-6


def test_prefill_then_steps_equals_one_prefill(executor, tokens, full_logits):
    state = executor.new_state()
    first = executor.forward(tokens[:100], state)
    assert _rel(first, full_logits[:100]) < 1e-5
    steps = np.stack([executor.step(int(t), state) for t in tokens[100:]])
    assert state.position == T
    assert _rel(steps, full_logits[100:]) < 1e-4


@pytest.mark.parametrize("split", [1, 64, 70])
def test_prefill_in_two_chunks_equals_one_prefill(executor, tokens, full_logits, split):
    state = executor.new_state()
    a = executor.forward(tokens[:split], state)
    b = executor.forward(tokens[split:], state)
    assert _rel(np.concatenate([a, b]), full_logits) < 1e-4


def test_states_are_independent(executor, tokens, full_logits):
    s1, s2 = executor.new_state(), executor.new_state()
    executor.prefill(tokens[:20], s1)
    executor.prefill(tokens[:40], s2)  # interleaved use of another state does not disturb s1
    out = executor.forward(tokens[20:40], s1)
    assert _rel(out, full_logits[20:40]) < 1e-4


def test_state_layout(executor, tokens):
    c = executor.config
    state = executor.new_state()
    executor.prefill(tokens[:10], state)
    for i in c.attention_layers:
        assert state.kv[i].keys.shape == (10, c.n_kv_heads, c.head_dim)
    for i in c.gdn_layers:
        assert state.gdn[i].conv.shape == (c.conv_dim, c.conv_kernel - 1)
        assert state.gdn[i].recurrent.shape == (c.gdn_v_heads, c.gdn_k_dim, c.gdn_v_dim)
        assert state.gdn[i].recurrent.dtype == np.float32


def test_mtp_incremental_equals_batched(executor, tokens):
    state = executor.new_state()
    hidden = executor.hidden(tokens[:40], state)
    np.testing.assert_allclose(executor.logits(hidden[-1]), executor.forward(tokens[:40], executor.new_state())[-1],
                               rtol=1e-6, atol=1e-6)
    batched = executor.mtp(hidden[:39], tokens[1:40], 0, state)
    assert batched.logits.shape == (39, executor.config.vocab) and batched.hidden.shape == (39, executor.config.hidden)
    state2 = executor.new_state()
    executor.mtp(hidden[:20], tokens[1:21], 0, state2)
    rest = [executor.mtp(hidden[p], [tokens[p + 1]], p, state2).logits[0] for p in range(20, 39)]
    assert _rel(np.stack(rest), batched.logits[20:]) < 1e-4
    # a second draft step feeds the MTP output back at the next position
    nxt = executor.mtp(batched.hidden[-1], [int(batched.logits[-1].argmax())], 39, state)
    assert nxt.logits.shape == (1, executor.config.vocab) and np.isfinite(nxt.logits).all()


def test_mtp_depends_on_both_inputs(executor, tokens):
    state = executor.new_state()
    hidden = executor.hidden(tokens[:8], state)
    base = executor.mtp(hidden, tokens[1:9], 0, executor.new_state()).logits
    other_tok = executor.mtp(hidden, (tokens[1:9] + 1) % executor.config.vocab, 0, executor.new_state()).logits
    other_hid = executor.mtp(hidden[::-1], tokens[1:9], 0, executor.new_state()).logits
    assert np.abs(base - other_tok).max() > 0.1 and np.abs(base - other_hid).max() > 0.1


def test_per_expert_layout_gives_the_same_model():
    config, _ = tiny_model(moe=True)
    fused = random_tensors(config, seed=2)
    split = {}
    for name, a in fused.items():
        base, _, proj = name.rpartition(".")
        if base.endswith("mlp.experts"):
            hf_base = base.replace("model.language_model.", "model.")
            for e in range(a.shape[0]):
                if proj == "down_proj":
                    split[f"{hf_base}.{e}.down_proj.weight"] = a[e]
                else:
                    half = a.shape[1] // 2
                    split[f"{hf_base}.{e}.gate_proj.weight"] = a[e, :half]
                    split[f"{hf_base}.{e}.up_proj.weight"] = a[e, half:]
        else:
            split[name] = a
    ids = [5, 9, 200, 17, 3]
    ref = ReferenceExecutor(config, DictWeights(fused))
    ex = ReferenceExecutor(config, DictWeights(split))
    np.testing.assert_array_equal(ex.forward(ids, ex.new_state()), ref.forward(ids, ref.new_state()))


def test_tied_embeddings_use_the_embedding_as_head():
    cfg = tiny_hf_config(mtp=False)
    cfg["tie_word_embeddings"] = True
    config = ModelConfig.from_hf(cfg)
    tensors = random_tensors(config, seed=4)
    assert "lm_head.weight" not in tensors
    ex = ReferenceExecutor(config, DictWeights(tensors))
    state = ex.new_state()
    hidden = ex.hidden([1, 2, 3], state)
    np.testing.assert_allclose(ex.logits(hidden), hidden @ tensors["model.language_model.embed_tokens.weight"].T,
                               rtol=1e-5, atol=1e-5)
    assert not ex.has_mtp
    with pytest.raises(ArtifactError, match="MTP"):
        ex.mtp(hidden, [1, 2, 3], 0, state)


def test_missing_and_misshaped_tensors():
    config, _ = tiny_model()
    tensors = random_tensors(config)
    name = "model.language_model.layers.3.self_attn.k_norm.weight"
    broken = dict(tensors)
    del broken[name]
    with pytest.raises(ArtifactError, match=name.replace(".", r"\.")):
        ReferenceExecutor(config, DictWeights(broken))
    broken = dict(tensors)
    broken[name] = np.zeros(128, np.float32)
    with pytest.raises(ArtifactError, match=r"k_norm\.weight has shape \[128\]"):
        ReferenceExecutor(config, DictWeights(broken))


def test_bad_tokens_and_released_state(executor):
    state = executor.new_state()
    with pytest.raises(UsageError, match="at least one token"):
        executor.prefill([], state)
    with pytest.raises(UsageError, match="outside the vocabulary"):
        executor.prefill([1, executor.config.vocab], state)
    with pytest.raises(UsageError, match="outside the vocabulary"):
        executor.step(-1, state)
    executor.release(state)
    with pytest.raises(UsageError, match="released"):
        executor.step(1, state)
