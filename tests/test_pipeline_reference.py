"""Engine + TextPipeline over the real numpy reference executor on the tiny synthetic preset."""

import threading

import numpy as np
import pytest

from inferno.checkpoint.source import open_model
from inferno.checkpoint.synth import synthesize
from inferno.engine import Engine, GenerationRequest, SamplingParams
from inferno.frontend.pipeline import TextPipeline, collect
from inferno.model.reference import ReferenceExecutor


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    source = open_model(synthesize("tiny-dense", tmp_path_factory.mktemp("m") / "tiny-dense", seed=5))
    return source, ReferenceExecutor(source.config, source.weights)


def manual_greedy(executor, prompt, n):
    state = executor.new_state()
    logits = executor.prefill(prompt, state)
    out = []
    for _ in range(n):
        t = int(np.argmax(logits))
        out.append(t)
        logits = executor.step(t, state)
    executor.release(state)
    return out


def test_chunked_concurrent_generation_matches_a_plain_greedy_loop(model):
    source, executor = model
    prompts = [[5, 17, 300, 42, 7, 9, 11], [1000, 3, 3, 3, 250]]
    want = [manual_greedy(executor, p, 6) for p in prompts]
    got: dict[int, list[int]] = {}
    greedy = SamplingParams(temperature=0)
    with Engine(executor, max_concurrency=2, prefill_chunk=3) as engine:

        def consume(i):
            req = GenerationRequest(prompts[i], 6, greedy, stop_token_ids=())
            got[i] = [e.token_id for e in engine.generate(req) if e.token_id is not None]

        threads = [threading.Thread(target=consume, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for i in range(2):
        # a stop at an EOS id may end it early; the tokens produced must agree
        assert got[i] == want[i][: len(got[i])] and got[i]


def test_chat_on_the_tiny_model(model):
    source, executor = model
    with Engine(executor) as engine:
        pipe = TextPipeline.from_resources(engine, source.resources, source.identity)
        done = collect(pipe.chat([{"role": "user", "content": "Hello"}], max_new_tokens=5, sampling={"seed": 1}))
        again = collect(pipe.chat([{"role": "user", "content": "Hello"}], max_new_tokens=5, sampling={"seed": 1}))
    assert done.usage.completion_tokens <= 5 and done.finish_reason in ("length", "stop")
    assert (done.reasoning, done.content) == (again.reasoning, again.content)
    assert done.usage.prompt_tokens == pipe.count_tokens([{"role": "user", "content": "Hello"}])
