"""Queued device sampling (`queue_sample` / `take_sample`) through the engine, on the emulated executor.

`generate` keeps the next decode step queued before it reads the current token; the tokens must be the
ones the one-step-at-a-time path (`step_sample`) gives, for greedy and sampled requests, with a stop
token mid-way (one queued step is then dropped with the state) and with two requests interleaved on
one executor (each step's input is its own state's last sample, not the other's).
"""

from __future__ import annotations

import pytest

from inferno.artifact.convert import convert
from inferno.checkpoint.synth import synthesize
from inferno.engine.generate import generate
from inferno.engine.params import GenerationRequest, SamplingParams
from inferno.errors import UsageError
from inferno.model.gpu import GpuExecutor

SAMPLED = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, presence_penalty=1.5, seed=77)
GREEDY = SamplingParams(temperature=0.0)


class OneStep:
    """`ex` without `queue_sample`: generate takes one `step_sample` at a time."""

    def __init__(self, ex: GpuExecutor):
        self.ex, self.config = ex, ex.config

    def __getattr__(self, name):
        if name in ("queue_sample", "take_sample"):
            raise AttributeError(name)
        return getattr(self.ex, name)


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    root = tmp_path_factory.mktemp("queued")
    art = convert(synthesize("tiny-dense", root / "ckpt"), root / "tiny.ninfer", "groupwise-int", progress=False)
    return GpuExecutor(art, emulate=True, max_seqs=2, max_context=192, prefill_chunk=16, progress=False)


def request(ex, params, n=20, prompt_len=30, stop=()) -> GenerationRequest:
    vocab = ex.config.vocab
    return GenerationRequest([(5 + 7 * i) % vocab for i in range(prompt_len)], n, params, ignore_eos=True,
                             stop_token_ids=tuple(stop))


def run(ex, req) -> tuple[list[int], str]:
    events = list(generate(ex, req, prefill_chunk=16))
    return [e.token_id for e in events if e.token_id is not None], events[-1].finish_reason


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_queued_steps_match_one_step_at_a_time(emulated, params):
    queued, why = run(emulated, request(emulated, params))
    single, _ = run(OneStep(emulated), request(emulated, params))
    assert why == "length" and len(queued) == 20
    assert queued == single
    assert not emulated._queued  # nothing left behind


class Counting:
    """`ex`, counting its queued steps."""

    def __init__(self, ex: GpuExecutor):
        self.ex, self.config, self.queued = ex, ex.config, 0

    def queue_sample(self, *args):
        self.queued += 1
        return self.ex.queue_sample(*args)

    def __getattr__(self, name):
        return getattr(self.ex, name)


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_requests_queue_no_step_past_the_limit(emulated, n):
    free = emulated.states.slots.available
    counting = Counting(emulated)
    got, why = run(counting, request(emulated, SAMPLED, n=n))
    assert (len(got), why) == (n, "length")
    assert counting.queued == n - 1  # the last token is never fed back
    assert got == run(OneStep(emulated), request(emulated, SAMPLED, n=n))[0]
    assert emulated.states.slots.available == free


def test_a_stop_token_drops_the_queued_step(emulated):
    full, _ = run(emulated, request(emulated, GREEDY, n=12))
    stop = full[5]
    first = full.index(stop)
    got, why = run(emulated, request(emulated, GREEDY, n=12, stop=[stop]))
    assert why == "stop" and got == full[:first + 1]
    assert not emulated._queued
    assert run(emulated, request(emulated, GREEDY, n=12))[0] == full  # the slot is clean for the next one


def test_two_requests_interleaved(emulated):
    a_req, b_req = request(emulated, SAMPLED, n=10), request(emulated, GREEDY, n=10, prompt_len=17)
    a_alone, b_alone = run(emulated, a_req)[0], run(emulated, b_req)[0]
    a_gen, b_gen = generate(emulated, a_req, prefill_chunk=16), generate(emulated, b_req, prefill_chunk=16)
    a, b = [], []
    for ea, eb in zip(a_gen, b_gen):
        a.append(ea.token_id)
        b.append(eb.token_id)
    assert a == a_alone and b == b_alone


def test_misuse_is_refused(emulated):
    st = emulated.new_state()
    try:
        with pytest.raises(UsageError, match="nothing was sampled"):
            emulated.queue_sample(None, st, GREEDY, 0.0)
        with pytest.raises(UsageError, match="no step of this state is queued"):
            emulated.take_sample(st)
        with pytest.raises(UsageError, match="not sampled on the device"):
            emulated.queue_sample(3, st, SamplingParams(top_k=0, seed=1), 0.5)
        emulated.prefill_sample([1, 2, 3], st, GREEDY, 0.0)
        emulated.queue_sample(None, st, GREEDY, 0.0)
        emulated.queue_sample(None, st, GREEDY, 0.0)
        with pytest.raises(UsageError, match="queued already"):
            emulated.queue_sample(None, st, GREEDY, 0.0)
        first = emulated.take_sample(st)
        assert 0 <= first < emulated.config.vocab
    finally:
        emulated.release(st)
    assert not emulated._queued


def test_every_queued_wait_is_released(emulated, monkeypatch):
    """Each queued step's wait (a CUDA event on the GPU) is run once: taken, or dropped with the state."""
    full, _ = run(emulated, request(emulated, GREEDY, n=12))
    made, waited = [], []

    def marker():
        i = len(made)
        made.append(i)
        return lambda: waited.append(i)

    monkeypatch.setattr(emulated.ops, "marker", marker)
    got, why = run(emulated, request(emulated, GREEDY, n=12, stop=[full[5]]))
    # tokens 2.. come from queued steps; one more step was queued past the stop token
    assert why == "stop" and len(made) == full.index(full[5]) + 1
    assert sorted(waited) == made
