"""Anthropic Messages API through the official `anthropic` SDK and raw httpx."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

import server_harness as h

TOOL = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]},
}
TOOL_REPLY = "Call the tool.</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"


def client(live: h.Live) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0, timeout=60)


def test_non_stream_text_and_usage():
    r = client(h.reference()).messages.create(model=h.MODEL_ID, max_tokens=5, messages=[{"role": "user", "content": "hi"}], thinking={"type": "disabled"})
    assert r.type == "message" and r.role == "assistant" and r.model == h.MODEL_ID
    assert r.stop_reason in ("max_tokens", "end_turn")
    assert [b.type for b in r.content] == ["text"]
    assert r.usage.output_tokens <= 5 and r.usage.input_tokens > 0


def test_thinking_blocks_and_system_blocks():
    live = h.scripted()
    live.script_text("Reasoning here.</think>\n\nFinal.")
    r = client(live).messages.create(
        model=h.MODEL_ID, max_tokens=50, system=[{"type": "text", "text": "You are terse."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}], thinking={"type": "enabled", "budget_tokens": 1024},
    )
    assert [b.type for b in r.content] == ["thinking", "text"]
    assert r.content[0].thinking == "Reasoning here." and r.content[1].text == "Final."
    assert r.stop_reason == "end_turn"
    assert live.last_prompt().startswith("<|im_start|>system\nYou are terse.<|im_end|>")


def test_thinking_disabled_renders_an_empty_think_block():
    live = h.scripted()
    live.script_text("Plain.")
    r = client(live).messages.create(model=h.MODEL_ID, max_tokens=20, messages=[{"role": "user", "content": "hi"}], thinking={"type": "disabled"})
    assert [b.type for b in r.content] == ["text"] and r.content[0].text == "Plain."
    assert live.last_prompt().endswith("<think>\n\n</think>\n\n")


def test_stop_sequences():
    live = h.scripted()
    live.script_text("alpha END beta")
    r = client(live).messages.create(model=h.MODEL_ID, max_tokens=20, messages=[{"role": "user", "content": "hi"}], stop_sequences=["END"], thinking={"type": "disabled"})
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == "END" and r.content[0].text == "alpha "


def test_stream_event_sequence():
    live = h.scripted()
    live.script_text("Think.</think>\n\nStreamed.")
    with client(live).messages.stream(model=h.MODEL_ID, max_tokens=50, messages=[{"role": "user", "content": "hi"}]) as stream:
        events = list(stream)
        final = stream.get_final_message()
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop"
    raw = [t for t in types if t in ("message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop")]
    assert raw.count("content_block_start") == raw.count("content_block_stop") == 2
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[1].text == "Streamed." and final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0


def test_raw_stream_has_ping_and_message_delta_usage():
    live = h.scripted()
    live.script_text("x</think>\n\ny")
    body = {"model": h.MODEL_ID, "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", live.url + "/v1/messages", json=body, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        all_lines = list(r.iter_lines())
    lines = [line for line in all_lines if line.startswith("event: ")]
    data_lines = [line for line in all_lines if line.startswith("data: ")]
    names = [line[7:] for line in lines]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    datas = [json.loads(line[6:]) for line in data_lines]
    deltas = [d["delta"]["type"] for d in datas if d["type"] == "content_block_delta"]
    assert "signature_delta" in deltas and deltas.index("signature_delta") < deltas.index("text_delta")


def test_tool_use_round_trip():
    live = h.scripted()
    c = client(live)
    live.script_text(TOOL_REPLY)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    r = c.messages.create(model=h.MODEL_ID, max_tokens=200, messages=messages, tools=[TOOL])
    assert r.stop_reason == "tool_use"
    assert [b.type for b in r.content] == ["thinking", "text", "tool_use"]
    use = r.content[-1]
    assert use.name == "get_weather" and use.input == {"city": "Paris", "days": 2} and use.id.startswith("toolu_")

    live.script_text("Ok.</think>\n\nSunny, 20 C.")
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in r.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "sunny 20C"}]}]},
    ]
    r2 = c.messages.create(model=h.MODEL_ID, max_tokens=200, messages=messages, tools=[TOOL])
    assert r2.content[-1].text == "Sunny, 20 C." and r2.stop_reason == "end_turn"
    prompt = live.last_prompt()
    assert "<tool_response>\nsunny 20C\n</tool_response>" in prompt and "<parameter=days>\n2" in prompt


def test_tool_results_keep_their_order_with_text():
    live = h.scripted()
    live.script_text("ok")
    messages = [
        {"role": "user", "content": "Check both."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}},
                                          {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "snow"},
            {"type": "tool_result", "tool_use_id": "t2", "content": "no such city", "is_error": True},
            {"type": "text", "text": "Summarise."},
        ]},
    ]
    r = client(live).messages.create(model=h.MODEL_ID, max_tokens=20, messages=messages, tools=[TOOL])
    assert r.content[-1].type in ("text", "thinking")
    prompt = live.last_prompt()
    snow, err, summary = (prompt.index(s) for s in ("<tool_response>\nsnow", "<tool_response>\nError: no such city", "Summarise."))
    assert snow < err < summary


def test_tool_use_streamed():
    live = h.scripted()
    live.script_text(TOOL_REPLY)
    with client(live).messages.stream(model=h.MODEL_ID, max_tokens=200, messages=[{"role": "user", "content": "Weather?"}], tools=[TOOL]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert final.content[-1].type == "tool_use" and final.content[-1].input == {"city": "Paris", "days": 2}


@pytest.mark.parametrize("thinking", [None, {"type": "enabled", "budget_tokens": 2000}, {"type": "disabled"}])
def test_count_tokens_equals_rendered_prompt(thinking):
    live = h.scripted()
    kw = {} if thinking is None else {"thinking": thinking}
    messages = [{"role": "user", "content": "How many tokens is this?"}]
    r = client(live).messages.count_tokens(model=h.MODEL_ID, system="Be exact.", messages=messages, tools=[TOOL], **kw)
    p = live.deployment.pipeline
    chat = [{"role": "system", "content": "Be exact."}, *messages]
    tools = [{"type": "function", "function": {"name": TOOL["name"], "description": TOOL["description"], "parameters": TOOL["input_schema"]}}]
    on = thinking is None or thinking["type"] == "enabled"
    assert r.input_tokens == len(p.tokenizer.encode(p.render(chat, tools, thinking=on)))
    # and generation sees the same prompt length
    g = client(live).messages.create(model=h.MODEL_ID, max_tokens=1, system="Be exact.", messages=messages, tools=[TOOL], **kw)
    assert g.usage.input_tokens == r.input_tokens
