"""The generation loop over a toy executor: chunked prefill, stop rules, cancellation, release."""

import threading

import pytest

from fake_executor import FakeConfig, FakeExecutor, greedy_continuation
from inferno.engine import ContextLengthError, GenerationRequest, RequestError, SamplingParams
from inferno.engine.generate import check_request, generate

GREEDY = SamplingParams(temperature=0)


def run(executor, request, **kw):
    kw.setdefault("prefill_chunk", 4)
    return list(generate(executor, request, **kw))


def test_prefill_in_chunks_then_greedy_steps():
    ex = FakeExecutor()
    prompt = list(range(1, 11))
    events = run(ex, GenerationRequest(prompt, 5, GREEDY), prefill_chunk=4)
    assert ex.prefill_calls == [4, 4, 2]
    assert [e.token_id for e in events] == greedy_continuation(prompt, 5)
    assert [e.finish_reason for e in events] == [None] * 4 + ["length"]
    assert ex.steps == 4  # the last token is not fed back
    assert ex.all_released()


def test_chunk_larger_than_prompt_is_one_call():
    ex = FakeExecutor()
    run(ex, GenerationRequest([1, 2, 3], 1, GREEDY), prefill_chunk=1024)
    assert ex.prefill_calls == [3]


def test_stops_on_eos_and_counts_it():
    ex = FakeExecutor(next_token=lambda toks: 63 if len(toks) == 6 else 5)
    events = run(ex, GenerationRequest([1, 2, 3], 10, GREEDY))
    assert [e.token_id for e in events] == [5, 5, 5, 63]
    assert events[-1].finish_reason == "stop"
    assert events[-1].stats.completion_tokens == 4
    assert events[-1].stats.prompt_tokens == 3
    assert ex.all_released()


def test_ignore_eos_runs_to_the_limit_but_keeps_stop_ids():
    ex = FakeExecutor(next_token=lambda toks: 63 if len(toks) % 2 else 5)
    events = run(ex, GenerationRequest([1, 2], 6, GREEDY, ignore_eos=True))
    assert [e.token_id for e in events] == [5, 63, 5, 63, 5, 63]
    assert events[-1].finish_reason == "length"
    events = run(ex, GenerationRequest([1, 2], 6, GREEDY, stop_token_ids=[5], ignore_eos=True))
    assert [(e.token_id, e.finish_reason) for e in events] == [(5, "stop")]


def test_stops_on_request_stop_token_ids():
    ex = FakeExecutor(next_token=lambda toks: 9 if len(toks) == 4 else 7)
    events = run(ex, GenerationRequest([1, 2], 10, GREEDY, stop_token_ids=[9]))
    assert [(e.token_id, e.finish_reason) for e in events] == [(7, None), (7, None), (9, "stop")]


def test_context_limit_checked_before_any_work():
    with pytest.raises(ContextLengthError, match="exceeds the context limit of 16"):
        check_request(GenerationRequest(list(range(10)), 7), vocab=64, max_context=16)
    check_request(GenerationRequest(list(range(10)), 6), vocab=64, max_context=16)


def test_bad_prompts_rejected():
    with pytest.raises(RequestError, match="empty"):
        check_request(GenerationRequest([], 1), vocab=64, max_context=16)
    with pytest.raises(RequestError, match="outside the model's vocabulary"):
        check_request(GenerationRequest([1, 64], 1), vocab=64, max_context=16)
    with pytest.raises(RequestError, match="vocabulary"):
        check_request(GenerationRequest([1], 1, stop_token_ids=[-1]), vocab=64, max_context=16)
    with pytest.raises(RequestError, match="max_new_tokens"):
        GenerationRequest([1], 0)


def test_cancel_stops_with_cancelled_and_releases():
    ex = FakeExecutor()
    cancel = threading.Event()
    out = []
    for e in generate(ex, GenerationRequest([1, 2], 50, GREEDY), prefill_chunk=4, cancel=cancel):
        out.append(e)
        if len(out) == 3:
            cancel.set()
    assert [e.finish_reason for e in out] == [None, None, None, "cancelled"]
    assert out[-1].token_id is None
    assert out[-1].stats.completion_tokens == 3
    assert ex.all_released()


def test_cancel_before_start_does_no_prefill():
    ex = FakeExecutor()
    cancel = threading.Event()
    cancel.set()
    events = run(ex, GenerationRequest([1, 2, 3], 5), cancel=cancel)
    assert [e.finish_reason for e in events] == ["cancelled"]
    assert ex.prefill_calls == []
    assert ex.all_released()


def test_consumer_stopping_early_releases_state():
    ex = FakeExecutor()
    gen = generate(ex, GenerationRequest([1, 2], 50, GREEDY), prefill_chunk=4)
    next(gen)
    next(gen)
    gen.close()
    assert ex.all_released() and len(ex.states) == 1


def test_executor_error_propagates_and_releases():
    ex = FakeExecutor(fail_after=2)
    with pytest.raises(RuntimeError, match="executor failure"):
        run(ex, GenerationRequest([1, 2], 50, GREEDY))
    assert ex.all_released()


def test_lock_is_held_around_executor_calls():
    held = []

    class Recording:
        def __enter__(self):
            held.append("enter")

        def __exit__(self, *a):
            held.append("exit")

    ex = FakeExecutor()
    run(ex, GenerationRequest([1, 2, 3, 4, 5], 3, GREEDY), lock=Recording(), prefill_chunk=2)
    # new_state + 3 prefill chunks + 2 steps + release, each in its own enter/exit pair
    assert held == ["enter", "exit"] * 7


def test_sampled_generation_is_reproducible_with_seed():
    cfg = FakeConfig()

    class Flat(FakeExecutor):
        def logits(self, tokens):
            import numpy as np

            return np.random.default_rng(len(tokens)).standard_normal(cfg.vocab).astype(np.float32)

    def tokens(seed):
        req = GenerationRequest([1, 2, 3], 20, SamplingParams(temperature=1.0, seed=seed), stop_token_ids=())
        return [e.token_id for e in run(Flat(cfg), req) if e.token_id is not None]

    assert tokens(11) == tokens(11)
    assert tokens(11) != tokens(12)


def test_stats_follow_design_metrics():
    ticks = iter(range(100))
    ex = FakeExecutor()
    events = run(ex, GenerationRequest([1, 2, 3, 4], 5, GREEDY), clock=lambda: float(next(ticks)))
    st = events[-1].stats
    assert st.prompt_tokens == 4 and st.completion_tokens == 5
    assert st.prefill_s > 0 and st.decode_s > 0
    assert st.prefill_tok_s == pytest.approx(4 / st.prefill_s)
    assert st.decode_tok_s == pytest.approx(4 / st.decode_s)
