"""Anthropic Messages API: POST /v1/messages (streamed or not) and POST /v1/messages/count_tokens.

Content blocks: text, tool_use / tool_result, thinking (sent back as the assistant turn's
reasoning; redacted_thinking is dropped). `thinking: {type: enabled|disabled}` switches the
model's thinking; with no `thinking` field the model thinks (its default). `budget_tokens` is
accepted but not enforced. Only custom tools (name + input_schema) are given to the model.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferno.frontend.pipeline import Completion, TextDelta
from inferno.server.errors import api_error, bad_request
from inferno.server.fields import get, json_body, positive_int, string_list
from inferno.server.params import apply_tool_choice, function_tool, new_id, sampling_fields
from inferno.server.service import Deployment, Generation
from inferno.server.sse import event, sse_response

SAMPLING = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "seed")


def _block_text(blocks: Any, param: str) -> str:
    """Text of a string or a list of text blocks (tool_result content, system)."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise bad_request(f"'{param}' must be a string or a list of text blocks", param)
    out = []
    for i, b in enumerate(blocks):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            kind = b.get("type") if isinstance(b, dict) else None
            hint = "; this deployment takes text only (no vision)" if kind in ("image", "document") else ""
            raise bad_request(f"'{param}[{i}]' must be a text block{hint}", f"{param}[{i}]")
        out.append(b["text"])
    return "\n".join(out)


def convert_messages(body: dict) -> list[dict]:
    """system + messages -> the chat template's messages."""
    out: list[dict] = []
    system = body.get("system")
    if system is not None:
        text = _block_text(system, "system")
        if text:
            out.append({"role": "system", "content": text})
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_request("'messages' must be a non-empty array of messages", "messages")
    for i, m in enumerate(raw):
        p = f"messages.{i}"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise bad_request(f"'{p}' must be an object with role user or assistant", p)
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise bad_request(f"'{p}.content' must be a string or an array of content blocks", f"{p}.content")
        if m["role"] == "assistant":
            out.append(_assistant(content, f"{p}.content"))
        else:
            out.extend(_user(content, f"{p}.content"))
    return out


def _assistant(blocks: list, p: str) -> dict:
    msg: dict[str, Any] = {"role": "assistant", "content": ""}
    for j, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            msg["content"] += b["text"]
        elif kind == "thinking" and isinstance(b.get("thinking"), str):
            msg["reasoning_content"] = msg.get("reasoning_content", "") + b["thinking"]
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use" and isinstance(b.get("name"), str) and isinstance(b.get("input", {}), dict):
            msg.setdefault("tool_calls", []).append({"id": b.get("id"), "type": "function", "function": {"name": b["name"], "arguments": b.get("input", {})}})
        else:
            raise bad_request(f"'{p}.{j}' must be a text, thinking or tool_use block (tool_use needs name and an input object)", f"{p}.{j}")
    return msg


def _user(blocks: list, p: str) -> list[dict]:
    """A user turn's blocks in order: runs of text become user messages, each tool_result a tool message."""
    out: list[dict] = []
    for j, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            if out and out[-1]["role"] == "user":
                out[-1]["content"] += "\n" + b["text"]
            else:
                out.append({"role": "user", "content": b["text"]})
        elif kind == "tool_result":
            text = _block_text(b.get("content", ""), f"{p}.{j}.content")
            if b.get("is_error"):
                text = f"Error: {text}"
            out.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": text})
        elif kind in ("image", "document"):
            raise bad_request(f"'{p}.{j}' is {kind} content; this deployment takes text only (no vision)", f"{p}.{j}")
        else:
            raise bad_request(f"'{p}.{j}' must be a text or tool_result block", f"{p}.{j}")
    return out


def convert_tools(body: dict) -> list[dict] | None:
    raw = get(body, "tools", list, default=[])
    tools = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict):
            raise bad_request(f"'tools.{i}' must be an object", f"tools.{i}")
        if t.get("type", "custom") != "custom":
            continue  # server tools (web search, bash, ...) cannot run here
        if not isinstance(t.get("input_schema"), dict):
            raise bad_request(f"'tools.{i}.input_schema' must be a JSON schema object", f"tools.{i}.input_schema")
        tools.append(function_tool(t.get("name"), t.get("description"), t["input_schema"], f"tools.{i}"))
    choice = get(body, "tool_choice", dict, default={"type": "auto"})
    mode = choice.get("type")
    if mode not in ("auto", "any", "tool", "none"):
        raise bad_request("'tool_choice.type' must be auto, any, tool or none", "tool_choice.type")
    name = None
    if mode == "tool":
        name = choice.get("name")
        if not isinstance(name, str):
            raise bad_request("'tool_choice.name' must name a tool", "tool_choice.name")
    if mode in ("any", "tool") and not tools:
        raise bad_request("'tool_choice' asks for a tool call but 'tools' is empty", "tool_choice")
    return apply_tool_choice(tools, {"any": "required", "tool": "named"}.get(mode, mode), name, "tool_choice")


def _thinking(body: dict) -> bool:
    spec = get(body, "thinking", dict)
    if spec is None:
        return True
    kind = spec.get("type")
    if kind not in ("enabled", "disabled", "adaptive"):
        raise bad_request("'thinking.type' must be enabled, disabled or adaptive", "thinking.type")
    return kind != "disabled"


def _prepare(dep: Deployment, body: dict) -> tuple[list[dict], list[dict] | None, bool]:
    dep.check_model(body.get("model"))
    return convert_messages(body), convert_tools(body), _thinking(body)


def _stop_reason(done: Completion) -> str:
    if done.finish_reason == "length":
        return "max_tokens"
    if done.finish_reason == "tool_calls":
        return "tool_use"
    return "stop_sequence" if done.stop_string is not None else "end_turn"


def _usage(input_tokens: int, output_tokens: int) -> dict:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def _tool_use(call: Any) -> dict:
    return {"type": "tool_use", "id": new_id("toolu_"), "name": call.name, "input": call.arguments}


async def handle(request: Request) -> Response:
    dep: Deployment = request.app.state.deployment
    gen: Generation | None = None
    try:
        body = await json_body(request)
        messages, tools, thinking = _prepare(dep, body)
        max_tokens = positive_int(body, "max_tokens", required=True)
        stream = get(body, "stream", bool, default=False)
        gen = await dep.start(
            messages,
            tools=tools,
            thinking=thinking,
            max_tokens=max_tokens,
            sampling=sampling_fields(body, SAMPLING),
            stop=string_list(body, "stop_sequences", limit=64),
        )
        meta = {"id": new_id("msg_"), "type": "message", "role": "assistant", "model": dep.model_id}
        if not stream:
            done = await gen.complete(request)
            content: list[dict] = []
            if done.reasoning:
                content.append({"type": "thinking", "thinking": done.reasoning, "signature": ""})
            if done.content or not done.tool_calls:
                content.append({"type": "text", "text": done.content})
            content.extend(_tool_use(c) for c in done.tool_calls)
            return JSONResponse({
                **meta,
                "content": content,
                "stop_reason": _stop_reason(done),
                "stop_sequence": done.stop_string,
                "usage": _usage(done.usage.prompt_tokens, done.usage.completion_tokens),
            })
        await gen.running(request)  # the lane is ours: answer now, before the first token
    except Exception as exc:
        if gen is not None:
            gen.cancel()
        return api_error(exc).response("anthropic")
    return sse_response(_events(meta, gen))


async def _events(meta: dict, gen: Generation) -> AsyncIterator[bytes]:
    def emit(kind: str, **data: Any) -> bytes:
        return event({"type": kind, **data}, kind)

    def stop(index: int, kind: str | None) -> list[bytes]:
        """Close a block; a thinking block gets its (empty) signature first, as Anthropic's stream does."""
        sig = [emit("content_block_delta", index=index, delta={"type": "signature_delta", "signature": ""})] if kind == "thinking" else []
        return [*sig, emit("content_block_stop", index=index)]

    start = {**meta, "content": [], "stop_reason": None, "stop_sequence": None, "usage": _usage(gen.prompt_tokens, 0)}
    yield emit("message_start", message=start)
    yield emit("ping")
    index = -1
    current: str | None = None  # "thinking" | "text"
    had_text = False
    try:
        async for ev in gen.events():
            if isinstance(ev, TextDelta):
                kind = "thinking" if ev.channel == "reasoning" else "text"
                if current != kind:
                    if current is not None:
                        for frame in stop(index, current):
                            yield frame
                    index, current = index + 1, kind
                    had_text = had_text or kind == "text"
                    block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {"type": "text", "text": ""}
                    yield emit("content_block_start", index=index, content_block=block)
                delta = {"type": "thinking_delta", "thinking": ev.text} if kind == "thinking" else {"type": "text_delta", "text": ev.text}
                yield emit("content_block_delta", index=index, delta=delta)
            elif isinstance(ev, Completion):
                if current is not None:
                    for frame in stop(index, current):
                        yield frame
                if not had_text and not ev.tool_calls:  # an empty answer still has one text block
                    index += 1
                    yield emit("content_block_start", index=index, content_block={"type": "text", "text": ""})
                    yield emit("content_block_stop", index=index)
                for call in ev.tool_calls:
                    index += 1
                    block = _tool_use(call)
                    yield emit("content_block_start", index=index, content_block={**block, "input": {}})
                    yield emit("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": json.dumps(call.arguments, ensure_ascii=False)})
                    yield emit("content_block_stop", index=index)
                yield emit(
                    "message_delta",
                    delta={"stop_reason": _stop_reason(ev), "stop_sequence": ev.stop_string},
                    usage={"input_tokens": ev.usage.prompt_tokens, "output_tokens": ev.usage.completion_tokens},
                )
                yield emit("message_stop")
                break
    except Exception as exc:  # after the headers went out: report in-band
        yield emit("error", error=api_error(exc).body("anthropic")["error"])
    finally:
        gen.cancel()


async def count_tokens(request: Request) -> Response:
    dep: Deployment = request.app.state.deployment
    try:
        body = await json_body(request)
        messages, tools, thinking = _prepare(dep, body)
        n = await dep.count(messages, tools, thinking)
    except Exception as exc:
        return api_error(exc).response("anthropic")
    return JSONResponse({"input_tokens": n})
