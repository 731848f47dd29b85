"""OpenAI Responses API through the official `openai` SDK (typed events) and raw httpx."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

import server_harness as h

FN_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TOOL_REPLY = "Look it up.</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"


def client(live: h.Live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_non_stream_with_reasoning_and_message_items():
    live = h.scripted()
    live.script_text("Short thought.</think>\n\nHello there.")
    r = client(live).responses.create(model=h.MODEL_ID, input="hi", instructions="Be nice.")
    assert r.status == "completed" and r.object == "response"
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "Short thought."
    assert r.output_text == "Hello there."
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    prompt = live.last_prompt()
    assert prompt.startswith("<|im_start|>system\nBe nice.<|im_end|>")


def test_max_output_tokens_gives_incomplete():
    r = client(h.reference()).responses.create(model=h.MODEL_ID, input="hi", max_output_tokens=4, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 4


def test_stream_event_sequence_matches_the_sdk_types():
    live = h.scripted()
    live.script_text("Thinking.</think>\n\nStreamed answer.")
    events = list(client(live).responses.create(model=h.MODEL_ID, input=[{"role": "user", "content": "hi"}], stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    for kind in ("response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
                 "response.output_text.delta", "response.output_text.done", "response.content_part.done", "response.output_item.done"):
        assert kind in types, kind
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Streamed answer."
    done = events[-1].response
    assert done.output_text == "Streamed answer." and done.status == "completed"
    assert types.index("response.reasoning_text.delta") < types.index("response.output_text.delta")


def test_function_call_round_trip_with_previous_response_id():
    live = h.scripted()
    c = client(live)
    live.script_text(TOOL_REPLY)
    r1 = c.responses.create(model=h.MODEL_ID, input="Weather in Paris?", tools=[FN_TOOL])
    calls = [o for o in r1.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Paris"}

    live.script_text("Got it.</think>\n\nSunny.")
    r2 = c.responses.create(
        model=h.MODEL_ID,
        previous_response_id=r1.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"}],
        tools=[FN_TOOL],
    )
    assert r2.output_text == "Sunny." and r2.previous_response_id == r1.id
    prompt = live.last_prompt()
    assert "Weather in Paris?" in prompt and "<function=get_weather>" in prompt and "sunny, 21 C" in prompt


def test_function_call_streamed():
    live = h.scripted()
    live.script_text(TOOL_REPLY)
    events = list(client(live).responses.create(model=h.MODEL_ID, input="Weather?", tools=[FN_TOOL], stream=True))
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0].arguments) == {"city": "Paris"}
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["reasoning", "function_call"]
    assert events[-1].response.output[-1].type == "function_call"
    with client(live).responses.stream(model=h.MODEL_ID, input="Weather?", tools=[{**FN_TOOL, "strict": False}]) as stream:
        final = stream.get_final_response()
    assert [o.type for o in final.output] == ["reasoning", "function_call"]


def test_typed_input_items_with_manual_history():
    live = h.scripted()
    live.script_text("Done.")
    r = client(live).responses.create(
        model=h.MODEL_ID,
        reasoning={"effort": "none"},
        input=[
            {"role": "developer", "content": "Answer tersely."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "snow"},
        ],
        tools=[FN_TOOL],
    )
    assert r.output_text == "Done." and [o.type for o in r.output] == ["message"]
    prompt = live.last_prompt()
    assert "<parameter=city>\nOslo" in prompt and "<tool_response>\nsnow" in prompt
    assert prompt.endswith("<think>\n\n</think>\n\n")


def test_retrieve_input_items_delete():
    live = h.scripted()
    live.script_text("ok</think>\n\nStored.")
    c = client(live)
    r = c.responses.create(model=h.MODEL_ID, input="keep me")
    got = c.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == "Stored."
    items = c.responses.input_items.list(r.id)
    assert [i.type for i in items.data] == ["message"] and items.data[0].content[0].text == "keep me"
    c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model=h.MODEL_ID, input="again", previous_response_id=r.id)


def test_store_false_keeps_nothing():
    live = h.scripted()
    live.script_text("x")
    r = client(live).responses.create(model=h.MODEL_ID, input="forget me", store=False)
    assert httpx.get(f"{live.url}/v1/responses/{r.id}").status_code == 404


def test_input_tokens_equals_rendered_prompt_tokens():
    live = h.reference()
    r = client(live).responses.input_tokens.count(model=h.MODEL_ID, input="count these tokens", instructions="sys")
    pipeline = live.deployment.pipeline
    expected = len(pipeline.tokenizer.encode(pipeline.render([{"role": "system", "content": "sys"}, {"role": "user", "content": "count these tokens"}])))
    assert r.input_tokens == expected
