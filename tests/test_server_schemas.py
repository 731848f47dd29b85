"""Every object and streaming event the server sends validates strictly against the SDKs' own types.

(The SDKs parse leniently at run time; `model_validate` here fails on a missing required field,
a wrong literal or a wrong type.)
"""

from __future__ import annotations

import json

import httpx
from anthropic.types import ErrorResponse, Message, MessageTokensCount, RawMessageStreamEvent
from openai.types import Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import InputTokenCountResponse, Response, ResponseItem, ResponseStreamEvent
from pydantic import TypeAdapter

import server_harness as h

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
REPLY = "Hmm.</think>\n\nLet me look.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"


def sse(live: h.Live, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", live.url + path, json=body, timeout=30) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]


def test_chat_completion_objects():
    live = h.scripted()
    live.script_text(REPLY)
    body = {"model": h.MODEL_ID, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}]}
    done = ChatCompletion.model_validate(httpx.post(live.url + "/v1/chat/completions", json=body).json())
    assert done.choices[0].finish_reason == "tool_calls"
    chunks = [ChatCompletionChunk.model_validate(c) for c in sse(live, "/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})]
    assert chunks[-1].usage is not None


def test_responses_objects_and_events():
    live = h.scripted()
    live.script_text(REPLY)
    body = {"model": h.MODEL_ID, "input": "x", "tools": [{"type": "function", "name": "get_weather", "parameters": PARAMS}]}
    r = Response.model_validate(httpx.post(live.url + "/v1/responses", json=body).json())
    assert [o.type for o in r.output] == ["reasoning", "message", "function_call"]
    events = TypeAdapter(list[ResponseStreamEvent]).validate_python(sse(live, "/v1/responses", {**body, "stream": True}))
    assert events[-1].type == "response.completed"
    items = httpx.get(f"{live.url}/v1/responses/{r.id}/input_items").json()
    TypeAdapter(list[ResponseItem]).validate_python(items["data"])
    count = httpx.post(live.url + "/v1/responses/input_tokens", json={"model": h.MODEL_ID, "input": "x"}).json()
    InputTokenCountResponse.model_validate(count)


def test_anthropic_objects_and_events():
    live = h.scripted()
    live.script_text(REPLY)
    body = {"model": h.MODEL_ID, "max_tokens": 100, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "get_weather", "input_schema": PARAMS}]}
    m = Message.model_validate(httpx.post(live.url + "/v1/messages", json=body).json())
    assert [b.type for b in m.content] == ["thinking", "text", "tool_use"]
    events = [e for e in sse(live, "/v1/messages", {**body, "stream": True}) if e["type"] != "ping"]
    TypeAdapter(list[RawMessageStreamEvent]).validate_python(events)
    MessageTokensCount.model_validate(httpx.post(live.url + "/v1/messages/count_tokens", json=body).json())
    ErrorResponse.model_validate(httpx.post(live.url + "/v1/messages", json={**body, "model": "nope"}).json())


def test_models_list():
    data = httpx.get(h.reference().url + "/v1/models").json()["data"]
    Model.model_validate(data[0])
    assert data[0]["inferno"]["default_sampling"]["thinking"]["temperature"] >= 0


SCRIPTS = ["Only thinking, never closed", "T.</think>\n\nThe answer.", REPLY, "T.</think>\n\n"]


def _shape_chat(m) -> tuple:
    calls = [(c.function.name, c.function.arguments) for c in (m.tool_calls or [])]
    return (m.content or "", m.model_extra.get("reasoning_content") or "", calls)


def test_stream_and_non_stream_agree():
    """The SDKs' stream accumulators rebuild exactly what the non-streamed reply holds."""
    import anthropic
    import openai

    live = h.scripted()
    oa = openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0)
    an = anthropic.Anthropic(base_url=live.url, api_key="x", max_retries=0)
    chat_tools = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}]
    resp_tools = [{"type": "function", "name": "get_weather", "parameters": PARAMS, "strict": False}]
    msg_tools = [{"name": "get_weather", "input_schema": PARAMS}]
    user = [{"role": "user", "content": "x"}]
    for script in SCRIPTS:
        live.script_text(script)
        plain = oa.chat.completions.create(model=h.MODEL_ID, messages=user, tools=chat_tools, max_tokens=100)
        with oa.chat.completions.stream(model=h.MODEL_ID, messages=user, tools=chat_tools, max_tokens=100) as s:
            streamed = s.get_final_completion()
        assert _shape_chat(plain.choices[0].message) == _shape_chat(streamed.choices[0].message), script
        assert plain.choices[0].finish_reason == streamed.choices[0].finish_reason

        def items(r):
            return [(o.type, getattr(o, "name", None), o.content[0].text if getattr(o, "content", None) else None) for o in r.output]

        plain = oa.responses.create(model=h.MODEL_ID, input="x", tools=resp_tools)
        with oa.responses.stream(model=h.MODEL_ID, input="x", tools=resp_tools) as s:
            streamed = s.get_final_response()
        assert items(plain) == items(streamed), script

        def blocks(m):
            return [(b.type, getattr(b, "text", None) or getattr(b, "thinking", None) or getattr(b, "input", None)) for b in m.content]

        plain = an.messages.create(model=h.MODEL_ID, max_tokens=100, messages=user, tools=msg_tools)
        with an.messages.stream(model=h.MODEL_ID, max_tokens=100, messages=user, tools=msg_tools) as s:
            streamed = s.get_final_message()
        assert blocks(plain) == blocks(streamed), script
        assert plain.stop_reason == streamed.stop_reason
