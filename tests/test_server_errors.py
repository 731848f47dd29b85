"""Bad input answers 4xx in the shape of each API; auth, body limit, CORS, overload, 500 without a traceback."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

import server_harness as h

CHAT = "/v1/chat/completions"
RESP = "/v1/responses"
MSGS = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
USER = [{"role": "user", "content": "hi"}]


def chat(**kw):
    return {"model": h.MODEL_ID, "messages": USER, "max_tokens": 2, **kw}


def resp(**kw):
    return {"model": h.MODEL_ID, "input": "hi", "max_output_tokens": 2, **kw}


def msgs(**kw):
    return {"model": h.MODEL_ID, "max_tokens": 2, "messages": USER, **kw}


def without(body: dict, key: str) -> dict:
    return {k: v for k, v in body.items() if k != key}


CASES = [
    # (name, path, body (dict, or raw str), status)
    ("chat-not-json", CHAT, "{not json", 400),
    ("chat-array-body", CHAT, "[1, 2]", 400),
    ("chat-empty-body", CHAT, "", 400),
    ("chat-no-messages", CHAT, without(chat(), "messages"), 400),
    ("chat-empty-messages", CHAT, chat(messages=[]), 400),
    ("chat-messages-string", CHAT, chat(messages="hi"), 400),
    ("chat-bad-role", CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), 400),
    ("chat-no-content", CHAT, chat(messages=[{"role": "user"}]), 400),
    ("chat-image", CHAT, chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]), 400),
    ("chat-unknown-model", CHAT, chat(model="gpt-4o"), 404),
    ("chat-n-2", CHAT, chat(n=2), 400),
    ("chat-negative-temperature", CHAT, chat(temperature=-1), 400),
    ("chat-string-temperature", CHAT, chat(temperature="hot"), 400),
    ("chat-top-p-zero", CHAT, chat(top_p=0), 400),
    ("chat-float-top-k", CHAT, chat(top_k=1.5), 400),
    ("chat-min-p-above-one", CHAT, chat(min_p=2), 400),
    ("chat-presence-penalty", CHAT, chat(presence_penalty=5), 400),
    ("chat-negative-seed", CHAT, chat(seed=-1), 400),
    ("chat-max-tokens-zero", CHAT, chat(max_tokens=0), 400),
    ("chat-max-tokens-string", CHAT, chat(max_tokens="10"), 400),
    ("chat-stream-string", CHAT, chat(stream="yes"), 400),
    ("chat-tools-string", CHAT, chat(tools="x"), 400),
    ("chat-tool-without-function", CHAT, chat(tools=[{"type": "function"}]), 400),
    ("chat-bad-tool-choice", CHAT, chat(tool_choice="sometimes"), 400),
    ("chat-required-without-tools", CHAT, chat(tool_choice="required"), 400),
    ("chat-named-unknown-tool", CHAT, chat(tools=[{"type": "function", "function": {"name": "a"}}], tool_choice={"type": "function", "function": {"name": "b"}}), 400),
    ("chat-json-schema-format", CHAT, chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}), 400),
    ("chat-legacy-functions", CHAT, chat(functions=[{"name": "f", "parameters": {}}]), 400),
    ("chat-logprobs", CHAT, chat(logprobs=True), 400),
    ("chat-stop-not-strings", CHAT, chat(stop=[1]), 400),
    ("chat-enable-thinking-string", CHAT, chat(chat_template_kwargs={"enable_thinking": "yes"}), 400),
    ("chat-bad-reasoning-effort", CHAT, chat(reasoning_effort="max"), 400),
    ("chat-late-system", CHAT, chat(messages=[*USER, {"role": "system", "content": "late"}]), 400),
    ("chat-bad-tool-arguments", CHAT, chat(messages=[*USER, {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}}]}]), 400),
    ("chat-prompt-too-long", CHAT, chat(messages=[{"role": "user", "content": "word " * 3000}]), 400),
    ("resp-no-input", RESP, without(resp(), "input"), 400),
    ("resp-input-number", RESP, resp(input=5), 400),
    ("resp-unknown-item", RESP, resp(input=[{"type": "computer_call_output", "call_id": "x"}]), 400),
    ("resp-output-without-call-id", RESP, resp(input=[{"type": "function_call_output", "output": "x"}]), 400),
    ("resp-unknown-previous", RESP, resp(previous_response_id="resp_nope"), 404),
    ("resp-max-output-zero", RESP, resp(max_output_tokens=0), 400),
    ("resp-bad-effort", RESP, resp(reasoning={"effort": "ultra"}), 400),
    ("resp-json-format", RESP, resp(text={"format": {"type": "json_object"}}), 400),
    ("resp-unknown-model", RESP, resp(model="gpt-5"), 404),
    ("resp-background", RESP, resp(background=True), 400),
    ("resp-conversation", RESP, resp(conversation="conv_1"), 400),
    ("resp-input-tokens-no-input", RESP + "/input_tokens", {"model": h.MODEL_ID}, 400),
    ("msgs-no-max-tokens", MSGS, without(msgs(), "max_tokens"), 400),
    ("msgs-no-messages", MSGS, without(msgs(), "messages"), 400),
    ("msgs-system-role", MSGS, msgs(messages=[{"role": "system", "content": "x"}]), 400),
    ("msgs-image-block", MSGS, msgs(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]), 400),
    ("msgs-bad-thinking", MSGS, msgs(thinking={"type": "maybe"}), 400),
    ("msgs-any-without-tools", MSGS, msgs(tool_choice={"type": "any"}), 400),
    ("msgs-tool-without-schema", MSGS, msgs(tools=[{"name": "x"}]), 400),
    ("msgs-negative-temperature", MSGS, msgs(temperature=-0.5), 400),
    ("msgs-unknown-model", MSGS, msgs(model="claude-opus-4-1"), 404),
    ("msgs-not-json", MSGS, "{", 400),
    ("msgs-bad-tool-use", MSGS, msgs(messages=[*USER, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "input": {}}]}]), 400),
    ("count-no-messages", COUNT, {"model": h.MODEL_ID}, 400),
    ("count-unknown-model", COUNT, {"model": "nope", "messages": USER}, 404),
]


def check_shape(r: httpx.Response, api: str) -> None:
    body = r.json()
    assert "Traceback" not in r.text
    if api == "anthropic":
        assert body["type"] == "error" and isinstance(body["error"]["type"], str) and body["error"]["message"]
    else:
        assert isinstance(body["error"]["message"], str) and body["error"]["message"] and "type" in body["error"]


@pytest.mark.parametrize("name,path,body,status", CASES, ids=[c[0] for c in CASES])
def test_bad_input(name, path, body, status):
    url = h.reference().url + path
    if isinstance(body, str):
        r = httpx.post(url, content=body.encode(), headers={"content-type": "application/json"}, timeout=30)
    else:
        r = httpx.post(url, json=body, timeout=30)
    assert r.status_code == status, r.text
    check_shape(r, "anthropic" if path.startswith("/v1/messages") else "openai")


def test_prompt_too_long_names_the_context():
    r = httpx.post(h.reference().url + CHAT, json=chat(messages=[{"role": "user", "content": "word " * 3000}]), timeout=30)
    assert "context limit is 512" in r.json()["error"]["message"]


@pytest.mark.parametrize("method,path,status", [
    ("GET", "/v1/responses/resp_missing", 404),
    ("DELETE", "/v1/responses/resp_missing", 404),
    ("GET", "/v1/responses/resp_missing/input_items", 404),
    ("GET", "/v1/models/other-model", 404),
    ("POST", "/v1/completions-nope", 404),
    ("GET", CHAT, 405),
    ("GET", "/v1/messages/nope", 404),
])
def test_unknown_routes_and_ids(method, path, status):
    r = httpx.request(method, h.reference().url + path, timeout=30)
    assert r.status_code == status
    check_shape(r, "anthropic" if path.startswith("/v1/messages") else "openai")


def test_api_key():
    url = h.guarded().url
    assert httpx.get(url + "/health").status_code == 200
    r = httpx.get(url + "/v1/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {h.API_KEY}"}).status_code == 200
    r = httpx.post(url + COUNT, json={"model": h.MODEL_ID, "messages": USER})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(url + COUNT, json={"model": h.MODEL_ID, "messages": USER}, headers={"x-api-key": h.API_KEY})
    assert r.status_code == 200 and r.json()["input_tokens"] > 0


def test_body_limit():
    url = h.guarded().url
    auth = {"Authorization": f"Bearer {h.API_KEY}"}
    big = chat(messages=[{"role": "user", "content": "x" * (2 * h.BODY_LIMIT)}])
    r = httpx.post(url + CHAT, json=big, headers=auth)
    assert r.status_code == 413
    check_shape(r, "openai")
    r = httpx.post(url + MSGS, json=msgs(messages=[{"role": "user", "content": "x" * (2 * h.BODY_LIMIT)}]), headers=auth)
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"

    def chunks():  # no Content-Length: the limit is enforced while reading
        for _ in range(10):
            yield b"x" * 1000

    r = httpx.post(url + CHAT, content=chunks(), headers={**auth, "content-type": "application/json"})
    assert r.status_code == 413


def test_cors_preflight():
    r = httpx.options(h.guarded().url + CHAT, headers={"Origin": h.CORS_ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == h.CORS_ORIGIN


def test_executor_failure_is_a_500_without_traceback():
    live = h.scripted()
    live.script_text("a b c d e f")
    live.executor.fail_after = live.executor.steps
    try:
        r = httpx.post(live.url + CHAT, json=chat(max_tokens=10), timeout=30)
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert "executor failure" not in r.text and "Traceback" not in r.text
        r = httpx.post(live.url + MSGS, json=msgs(max_tokens=10), timeout=30)
        assert r.status_code == 500 and r.json()["error"]["type"] == "api_error"
        live.executor.fail_after = live.executor.steps + 2  # fails after the stream has started
        with httpx.stream("POST", live.url + CHAT, json=chat(max_tokens=10, stream=True), timeout=30) as s:
            text = s.read().decode()
        assert s.status_code == 200 and '"server_error"' in text and text.endswith("data: [DONE]\n\n")
    finally:
        live.executor.fail_after = None
    assert httpx.post(live.url + CHAT, json=chat(max_tokens=3), timeout=30).status_code == 200


def test_full_queue_answers_429_and_queue_timeout_503():
    live = h.tight()
    gate = live.executor.gate
    gate.clear()
    results: dict[str, httpx.Response] = {}

    def call(key: str, path: str, body: dict) -> None:
        results[key] = httpx.post(live.url + path, json=body, timeout=30)

    running = threading.Thread(target=call, args=("running", CHAT, chat(max_tokens=5)))
    running.start()
    try:
        assert _wait(lambda: live.deployment.pipeline.engine.load() == (1, 0))
        waiting = threading.Thread(target=call, args=("waiting", MSGS, msgs(max_tokens=5)))
        waiting.start()
        assert _wait(lambda: live.deployment.pipeline.engine.load() == (1, 1))
        rejected = httpx.post(live.url + CHAT, json=chat(max_tokens=5), timeout=30)
        assert rejected.status_code == 429 and rejected.json()["error"]["code"] == "server_overloaded"
        waiting.join(10)
        assert results["waiting"].status_code == 503
        assert results["waiting"].json()["error"]["type"] == "overloaded_error"
    finally:
        gate.set()
        running.join(10)
    assert results["running"].status_code == 200
    assert live.idle()


def _wait(cond, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return False
