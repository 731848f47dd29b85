"""POST /v1/chat/completions through the official `openai` SDK and raw httpx against a live server."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

import server_harness as h

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]},
    },
}
TOOL_REPLY = "Need the weather.</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"


def client(live: h.Live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_non_stream_reports_usage_with_reasoning_tokens():
    r = client(h.reference()).chat.completions.create(
        model=h.MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0, seed=1
    )
    assert r.object == "chat.completion" and r.model == h.MODEL_ID
    choice = r.choices[0]
    assert choice.finish_reason in ("length", "stop")
    u = r.usage
    assert u.completion_tokens <= 6 and u.total_tokens == u.prompt_tokens + u.completion_tokens
    # thinking is on by default: generation starts inside <think>, so every token so far is reasoning
    assert u.completion_tokens_details.reasoning_tokens == u.completion_tokens
    assert choice.message.model_extra.get("reasoning_content")


def test_greedy_is_deterministic_and_top_k_min_p_are_accepted():
    c = client(h.reference())
    kw = dict(model=h.MODEL_ID, messages=[{"role": "user", "content": "hello"}], max_completion_tokens=5, temperature=0)
    a = c.chat.completions.create(**kw, extra_body={"top_k": 5, "min_p": 0.1})
    b = c.chat.completions.create(**kw)
    assert a.choices[0].message.model_extra["reasoning_content"] == b.choices[0].message.model_extra["reasoning_content"]


def test_seed_makes_sampling_repeatable():
    c = client(h.reference())
    kw = dict(model=h.MODEL_ID, messages=[{"role": "user", "content": "seed"}], max_tokens=8, temperature=1.0, top_p=1.0, extra_body={"top_k": 0})
    runs = [c.chat.completions.create(**kw, seed=7).choices[0].message.model_extra["reasoning_content"] for _ in range(2)]
    assert runs[0] == runs[1]


def test_stream_chunks_and_include_usage():
    stream = client(h.reference()).chat.completions.create(
        model=h.MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=5, seed=1, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    text = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks if c.choices)
    assert text


def test_thinking_off_gives_content_only():
    h.scripted().script_text("Plain answer.")
    r = client(h.scripted()).chat.completions.create(
        model=h.MODEL_ID,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=20,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert r.choices[0].message.content == "Plain answer."
    assert r.choices[0].message.model_extra.get("reasoning_content") is None
    assert r.usage.completion_tokens_details.reasoning_tokens == 0
    assert r.choices[0].finish_reason == "stop"


def test_thinking_on_splits_reasoning_and_reasoning_effort_none_turns_it_off():
    live = h.scripted()
    live.script_text("I think.</think>\n\nThe answer.")
    r = client(live).chat.completions.create(model=h.MODEL_ID, messages=[{"role": "user", "content": "q"}], max_tokens=30)
    m = r.choices[0].message
    assert m.content == "The answer." and m.model_extra["reasoning_content"] == "I think."
    assert 0 < r.usage.completion_tokens_details.reasoning_tokens < r.usage.completion_tokens
    live.script_text("Direct.")
    r = client(live).chat.completions.create(model=h.MODEL_ID, messages=[{"role": "user", "content": "q"}], max_tokens=30, reasoning_effort="none")
    assert r.choices[0].message.content == "Direct."


def test_stop_string_ends_the_answer():
    live = h.scripted()
    live.script_text("one two STOP three")
    r = client(live).chat.completions.create(
        model=h.MODEL_ID, messages=[{"role": "user", "content": "q"}], max_tokens=30, stop=["STOP"],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert r.choices[0].message.content == "one two " and r.choices[0].finish_reason == "stop"


def test_tool_call_round_trip():
    live = h.scripted()
    c = client(live)
    live.script_text(TOOL_REPLY)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    r = c.chat.completions.create(model=h.MODEL_ID, messages=messages, tools=[WEATHER_TOOL], max_tokens=100)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}
    assert call.id.startswith("call_") and not choice.message.content

    live.script_text("Checked.</think>\n\nIt is sunny in Paris.")
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "sunny"})},
    ]
    r2 = c.chat.completions.create(model=h.MODEL_ID, messages=messages, tools=[WEATHER_TOOL], max_tokens=100)
    assert r2.choices[0].message.content == "It is sunny in Paris." and r2.choices[0].finish_reason == "stop"
    # the tool result reached the prompt
    assert "<tool_response>" in live.last_prompt()


def test_tool_call_streamed():
    live = h.scripted()
    live.script_text(TOOL_REPLY)
    chunks = list(client(live).chat.completions.create(
        model=h.MODEL_ID, messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER_TOOL], max_tokens=100, stream=True
    ))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(tc.index, tc.function.name) for tc in calls] == [(0, "get_weather")]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris", "days": 3}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # the raw <tool_call> markup never leaks into the streamed content
    assert "<tool_call>" not in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # the SDK's accumulating stream helper rebuilds the same call
    with client(live).chat.completions.stream(
        model=h.MODEL_ID, messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER_TOOL], max_tokens=100
    ) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_tool_choice_none_hides_tools_from_the_model():
    live = h.scripted()
    live.script_text(TOOL_REPLY)
    r = client(live).chat.completions.create(
        model=h.MODEL_ID, messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER_TOOL], tool_choice="none", max_tokens=100
    )
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    prompt = live.last_prompt()
    assert "get_weather" not in prompt.split("<|im_start|>assistant")[0]


def test_developer_role_becomes_system():
    live = h.scripted()
    live.script_text("ok")
    client(live).chat.completions.create(
        model=h.MODEL_ID, messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}], max_tokens=5
    )
    prompt = live.last_prompt()
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>")


def test_raw_httpx_content_parts_and_model_prefix():
    body = {"model": "org/" + h.MODEL_ID.upper(), "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 2}
    r = httpx.post(h.reference().url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_is_clamped_to_the_context(field):
    live = h.scripted()
    live.script_text("a " * 3000)
    r = httpx.post(live.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], field: 100000}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["total_tokens"] == live.deployment.max_context
    assert r.json()["choices"][0]["finish_reason"] == "length"
