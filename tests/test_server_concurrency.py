"""Concurrent requests, and client disconnects that cancel the generation and free its lane."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx

import server_harness as h


def test_concurrent_requests_across_apis():
    live = h.reference()
    bodies = [
        ("/v1/chat/completions", {"model": h.MODEL_ID, "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 4}) for i in range(3)
    ] + [
        ("/v1/messages", {"model": h.MODEL_ID, "max_tokens": 4, "messages": [{"role": "user", "content": "m"}]}),
        ("/v1/responses", {"model": h.MODEL_ID, "input": "r", "max_output_tokens": 4}),
    ]
    with ThreadPoolExecutor(len(bodies)) as pool:
        results = list(pool.map(lambda pb: httpx.post(live.url + pb[0], json=pb[1], timeout=120), bodies))
    assert [r.status_code for r in results] == [200] * len(bodies)
    assert results[0].json()["usage"]["completion_tokens"] == 4
    assert live.idle()


def _steps_settle(live: h.Live, timeout: float = 5.0) -> int:
    """The executor's step count once it stops growing."""
    end = time.monotonic() + timeout
    last = live.executor.steps
    while time.monotonic() < end:
        time.sleep(10 * h.SLOW_DELAY)
        now = live.executor.steps
        if now == last:
            return now
        last = now
    raise AssertionError("the executor kept stepping")


def test_disconnect_mid_stream_cancels_and_the_next_request_succeeds():
    live = h.slow()
    body = {"model": h.MODEL_ID, "messages": [{"role": "user", "content": "go"}], "max_tokens": 1000, "stream": True}
    before = live.executor.steps
    with httpx.stream("POST", live.url + "/v1/chat/completions", json=body, timeout=30) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen >= 5:
                break
    assert live.idle(), "the lane was not freed"
    generated = _steps_settle(live) - before
    assert 1 <= generated < 500  # stopped early, far from 1000 tokens
    assert live.executor.all_released()

    r = httpx.post(live.url + "/v1/messages", json={"model": h.MODEL_ID, "max_tokens": 3, "messages": [{"role": "user", "content": "again"}]}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["output_tokens"] == 3


def test_disconnect_during_non_stream_request_cancels_it():
    live = h.slow()
    before = live.executor.steps
    body = {"model": h.MODEL_ID, "input": "go", "max_output_tokens": 1000}
    try:
        httpx.post(live.url + "/v1/responses", json=body, timeout=0.3)
    except httpx.TimeoutException:
        pass
    else:
        raise AssertionError("the request should have outlived the client timeout")
    assert live.idle(), "the lane was not freed"
    assert _steps_settle(live) - before < 500
    assert live.executor.all_released()
