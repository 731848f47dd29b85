"""Streams open as soon as a lane takes the request (before the first token); a client that goes
away while its request waits or prefills frees the queue slot / lane at once; a request that
never gets a lane still answers 503."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

import server_harness as h

LONG = "word " * 100  # ~300 prompt tokens: ~75 prefill chunks, ~4 s on the slow-prefill server
USER = [{"role": "user", "content": LONG}]

APIS = [
    (
        "/v1/chat/completions",
        {"model": h.MODEL_ID, "messages": USER, "max_tokens": 50, "stream": True},
        [lambda d: d["choices"][0]["delta"] == {"role": "assistant", "content": ""}],
    ),
    (
        "/v1/responses",
        {"model": h.MODEL_ID, "input": LONG, "max_output_tokens": 50, "stream": True},
        [lambda d: d["type"] == "response.created", lambda d: d["type"] == "response.in_progress"],
    ),
    (
        "/v1/messages",
        {"model": h.MODEL_ID, "max_tokens": 50, "messages": USER, "stream": True},
        [lambda d: d["type"] == "message_start", lambda d: d["type"] == "ping"],
    ),
]


def _frames(response: httpx.Response, n: int) -> list[dict]:
    """The first `n` SSE data payloads."""
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            out.append(json.loads(line[6:]))
            if len(out) == n:
                break
    return out


def _short(live: h.Live) -> None:
    r = httpx.post(live.url + "/v1/chat/completions", json={"model": h.MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("path, body, opening", APIS, ids=["chat", "responses", "messages"])
def test_stream_opens_during_prefill_and_a_disconnect_there_frees_the_lane(path, body, opening):
    live = h.slow_prefill()
    assert live.idle()
    n_prompt = live.deployment.pipeline.count_tokens(USER)
    steps = live.executor.steps
    with httpx.stream("POST", live.url + path, json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        frames = _frames(r, len(opening))
        assert [check(f) for check, f in zip(opening, frames, strict=True)] == [True] * len(opening)
        state = live.executor.states[-1]
        assert len(state.tokens) < n_prompt  # the opening arrived while the prompt was still prefilling
    left = time.monotonic()
    assert live.idle(timeout=5)
    freed_in = time.monotonic() - left
    assert freed_in < 1.5, f"the lane was freed {freed_in:.2f} s after the disconnect"
    assert state.released and len(state.tokens) < n_prompt and live.executor.steps == steps  # prefill cut short
    _short(live)


def test_disconnect_while_queued_withdraws_the_request():
    live = h.slow_prefill()
    assert live.idle()
    before = len(live.executor.states)
    chat = {"model": h.MODEL_ID, "messages": USER, "max_tokens": 5, "stream": True}
    with httpx.stream("POST", live.url + "/v1/chat/completions", json=chat, timeout=30) as running:
        assert running.status_code == 200  # holds the only lane, prefilling for seconds
        with pytest.raises(httpx.TimeoutException):  # waits for the lane: no headers yet
            httpx.post(live.url + "/v1/chat/completions", json=chat, timeout=0.3)
        time.sleep(1.0)  # the server notices the disconnect and withdraws the waiting request
        assert len(live.executor.states) == before + 1
    assert live.idle(timeout=5)
    assert len(live.executor.states) == before + 1  # the withdrawn request never got a lane
    assert live.executor.all_released()
    _short(live)


def test_a_stream_that_never_gets_a_lane_still_answers_503():
    live = h.tight()
    gate = live.executor.gate
    gate.clear()
    result: dict[str, httpx.Response] = {}
    body = {"model": h.MODEL_ID, "messages": [{"role": "user", "content": "x"}], "max_tokens": 5}
    running = threading.Thread(target=lambda: result.setdefault("r", httpx.post(live.url + "/v1/chat/completions", json=body, timeout=30)))
    running.start()
    try:
        end = time.monotonic() + 5
        while live.deployment.pipeline.engine.load() != (1, 0):
            assert time.monotonic() < end, "the first request never started"
            time.sleep(0.01)
        r = httpx.post(live.url + "/v1/messages", json={**body, "stream": True}, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded_error"
    finally:
        gate.set()
        running.join(10)
    assert result["r"].status_code == 200
    assert live.idle()
