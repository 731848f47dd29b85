"""The token-level generation loop of one request over an `Executor`.

`check_request` validates a request against the model before any work. `generate` then
prefills the prompt in chunks of `prefill_chunk` tokens (each `executor.prefill` call continues
the same state), samples, and steps one token at a time until an EOS / stop token, the token
limit, or cancellation. The state is released on every path, including an exception in the
executor and a consumer that stops iterating early. An executor that samples on the device
(`samples_on_device(params)` true: the GPU executor for greedy and top_k 1..64) takes the
request's uniform draws in `prefill_sample` / `step_sample` and returns tokens instead of logits;
one that can also queue steps (`queue_sample` / `take_sample`) gets the next step queued before the
host reads the current token, so the device never waits for the loop (a stop token then leaves one
queued step unused, dropped with the state).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Protocol

import numpy as np

from inferno.engine.errors import ContextLengthError, RequestError
from inferno.engine.params import GenerationRequest, GenerationStats, TokenEvent
from inferno.engine.sampling import Sampler
from inferno.model.executor import Executor


class Cancel(Protocol):
    """Anything with `is_set()`, e.g. `threading.Event`."""

    def is_set(self) -> bool: ...


def check_request(request: GenerationRequest, vocab: int, max_context: int) -> None:
    """Raise `RequestError` / `ContextLengthError` for a request the model cannot run."""
    n = len(request.prompt_ids)
    if n == 0:
        raise RequestError("the prompt is empty; give at least one token")
    for t in (*request.prompt_ids, *request.stop_token_ids):
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab:
            raise RequestError(f"token id {t!r} is outside the model's vocabulary [0, {vocab})")
    if n + request.max_new_tokens > max_context:
        raise ContextLengthError(
            f"prompt ({n} tokens) + max new tokens ({request.max_new_tokens}) = "
            f"{n + request.max_new_tokens} exceeds the context limit of {max_context}; "
            "shorten the prompt, lower the max new tokens, or raise the max context"
        )


def generate(
    executor: Executor,
    request: GenerationRequest,
    *,
    prefill_chunk: int,
    cancel: Cancel | None = None,
    lock: contextlib.AbstractContextManager | None = None,
    queue_s: float = 0.0,
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[TokenEvent]:
    """Yield one `TokenEvent` per generated token; the last one has `finish_reason` and `stats`.

    `lock` (if given) is held around every executor call, so several generations can share one
    executor from different threads. The caller validates the request first (`check_request`).
    """
    guard = lock if lock is not None else contextlib.nullcontext()
    stop_ids = frozenset(request.stop_token_ids)
    if not request.ignore_eos:
        stop_ids |= frozenset(executor.config.eos_token_ids)
    prompt = request.prompt_ids
    sampler = Sampler(request.sampling)
    device_draw = _device_draw(executor, request)
    started = clock()
    first_at = started
    produced = 0

    def stats() -> GenerationStats:
        end = clock()
        return GenerationStats(
            prompt_tokens=len(prompt),
            completion_tokens=produced,
            queue_s=queue_s,
            prefill_s=(first_at if produced else end) - started,
            decode_s=end - first_at if produced else 0.0,
        )

    def cancelled() -> bool:
        return cancel is not None and cancel.is_set()

    queue = device_draw is not None and hasattr(executor, "queue_sample")
    ahead = 0  # steps queued on the executor (`queue_sample`) whose tokens are not taken yet
    with guard:
        state = executor.new_state()
    try:
        logits = None
        for i in range(0, len(prompt), prefill_chunk):
            if cancelled():
                yield TokenEvent(None, "cancelled", stats())
                return
            chunk = prompt[i : i + prefill_chunk]
            with guard:
                if device_draw is not None and i + prefill_chunk >= len(prompt):
                    token = executor.prefill_sample(chunk, state, request.sampling, device_draw())
                else:
                    logits = executor.prefill(chunk, state)
        while True:
            if cancelled():
                yield TokenEvent(None, "cancelled", stats())
                return
            if device_draw is None:
                token = sampler.sample(logits)
            produced += 1
            if produced == 1:
                first_at = clock()
            if token in stop_ids:
                yield TokenEvent(token, "stop", stats())
                return
            if produced == request.max_new_tokens:
                yield TokenEvent(token, "length", stats())
                return
            yield TokenEvent(token)
            if cancelled():
                yield TokenEvent(None, "cancelled", stats())
                return
            with guard:
                if queue:  # keep one step queued beyond the one whose token is awaited, within the token limit
                    while ahead < 2 and produced + ahead < request.max_new_tokens:
                        executor.queue_sample(None if ahead else token, state, request.sampling, device_draw())
                        ahead += 1
                    token = executor.take_sample(state)
                    ahead -= 1
                elif device_draw is None:
                    logits = executor.step(token, state)
                else:
                    token = executor.step_sample(token, state, request.sampling, device_draw())
    finally:
        with guard:
            executor.release(state)


def _device_draw(executor: Executor, request: GenerationRequest) -> Callable[[], float] | None:
    """Where the executor samples `request` on the device (`samples_on_device`): the uniform draws
    for it, one per token from a generator seeded as `Sampler` seeds its own and drawn as it draws
    (none when greedy), so both paths pick the same tokens; else None (sample on the host)."""
    supports = getattr(executor, "samples_on_device", None)
    if supports is None or not supports(request.sampling):
        return None
    if request.sampling.greedy:
        return lambda: 0.0
    rng = np.random.default_rng(request.sampling.seed)
    return lambda: float(rng.random())
