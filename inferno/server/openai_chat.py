"""POST /v1/chat/completions (OpenAI Chat Completions), streamed or not.

Extensions beyond OpenAI's fields: `top_k`, `min_p`, `chat_template_kwargs` (`enable_thinking`,
`preserve_thinking`, others passed to the template), and `reasoning_content` on messages and deltas.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferno.frontend.pipeline import Completion, TextDelta
from inferno.frontend.tool_calls import ToolCall
from inferno.server.errors import api_error, bad_request
from inferno.server.fields import get, json_body, positive_int, string_list, text_parts
from inferno.server.params import apply_tool_choice, function_tool, new_id, sampling_fields, thinking_from_effort
from inferno.server.service import Deployment, Generation
from inferno.server.sse import DONE, event, sse_response

SAMPLING = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "seed")
_ROLES = ("system", "developer", "user", "assistant", "tool")


def convert_messages(raw: Any) -> list[dict]:
    """OpenAI chat messages -> the chat template's messages (developer -> system, leading systems merged)."""
    if not isinstance(raw, list) or not raw:
        raise bad_request("'messages' must be a non-empty array of messages", "messages")
    out: list[dict] = []
    for i, m in enumerate(raw):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"'{p}' must be an object", p)
        role = m.get("role")
        if role not in _ROLES:
            raise bad_request(f"'{p}.role' must be one of {', '.join(_ROLES)}, got {role!r}", f"{p}.role")
        content = m.get("content")
        if role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": "" if content is None else text_parts(content, f"{p}.content", ("text", "refusal"))}
            reasoning = m.get("reasoning_content", m.get("reasoning"))
            if isinstance(reasoning, str):
                msg["reasoning_content"] = reasoning
            if m.get("tool_calls"):
                msg["tool_calls"] = _assistant_calls(m["tool_calls"], f"{p}.tool_calls")
        else:
            if content is None:
                raise bad_request(f"'{p}.content' is required", f"{p}.content")
            text = text_parts(content, f"{p}.content", ("text",))
            role = "system" if role == "developer" else role
            msg = {"role": role, "content": text}
            if role == "tool" and isinstance(m.get("tool_call_id"), str):
                msg["tool_call_id"] = m["tool_call_id"]
        if role == "system" and out and all(o["role"] == "system" for o in out):
            out[-1]["content"] += "\n\n" + msg["content"]
            continue
        out.append(msg)
    return out


def _assistant_calls(calls: Any, p: str) -> list[dict]:
    if not isinstance(calls, list):
        raise bad_request(f"'{p}' must be an array of tool calls", p)
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"'{p}[{j}]' must be {{id, type: function, function: {{name, arguments}}}}", f"{p}[{j}]")
        args = fn.get("arguments", "{}")
        if not isinstance(args, (str, dict)):
            raise bad_request(f"'{p}[{j}].function.arguments' must be a JSON object string", f"{p}[{j}].function.arguments")
        out.append({"id": c.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def convert_tools(body: dict) -> list[dict] | None:
    """`tools` + `tool_choice` -> the tools the model sees."""
    tools_raw = get(body, "tools", list, default=[])
    tools = []
    for i, t in enumerate(tools_raw):
        p = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(t.get("function"), dict):
            raise bad_request(f"'{p}' must be {{type: function, function: {{name, description, parameters}}}}", p)
        fn = t["function"]
        tools.append(function_tool(fn.get("name"), fn.get("description"), fn.get("parameters"), p))
    choice = body.get("tool_choice")
    name = None
    if choice is None:
        mode = "auto"
    elif choice in ("none", "auto", "required"):
        mode = choice
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict) and isinstance(choice["function"].get("name"), str):
        mode, name = "named", choice["function"]["name"]
    else:
        raise bad_request("'tool_choice' must be none, auto, required or {type: function, function: {name}}", "tool_choice")
    if mode in ("required", "named") and not tools:
        raise bad_request("'tool_choice' asks for a tool call but 'tools' is empty", "tool_choice")
    return apply_tool_choice(tools, mode, name, "tool_choice")


def _thinking(body: dict) -> tuple[bool, bool, dict]:
    """(thinking, preserve_thinking, other template kwargs)."""
    kwargs = dict(get(body, "chat_template_kwargs", dict, default={}))
    thinking = thinking_from_effort(body.get("reasoning_effort"), "reasoning_effort")
    enable = kwargs.pop("enable_thinking", None)
    if enable is not None:
        if not isinstance(enable, bool):
            raise bad_request("'chat_template_kwargs.enable_thinking' must be a boolean", "chat_template_kwargs.enable_thinking")
        thinking = enable
    preserve = kwargs.pop("preserve_thinking", False)
    if not isinstance(preserve, bool):
        raise bad_request("'chat_template_kwargs.preserve_thinking' must be a boolean", "chat_template_kwargs.preserve_thinking")
    return (True if thinking is None else thinking), preserve, kwargs


def _reject_unsupported(body: dict) -> None:
    if body.get("functions") is not None or body.get("function_call") is not None:
        raise bad_request("'functions' / 'function_call' are the deprecated forms; send 'tools' / 'tool_choice'", "functions")
    n = get(body, "n", int, default=1)
    if n != 1:
        raise bad_request(f"'n' must be 1 (one choice per request), got {n}", "n")
    if get(body, "logprobs", bool, default=False):
        raise bad_request("'logprobs' is not supported by this server", "logprobs")
    fmt = get(body, "response_format", dict, default={"type": "text"})
    if fmt.get("type") != "text":
        raise bad_request("'response_format' other than text is not supported (no constrained decoding)", "response_format")


def tool_call_json(call: ToolCall, index: int, with_index: bool) -> dict:
    out: dict[str, Any] = {"id": new_id("call_"), "type": "function", "function": {"name": call.name, "arguments": call.arguments_json()}}
    return {"index": index, **out} if with_index else out


def usage_json(done: Completion) -> dict:
    u = done.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
    }


def _finish(done: Completion) -> str:
    return "stop" if done.finish_reason == "cancelled" else done.finish_reason


async def handle(request: Request) -> Response:
    dep: Deployment = request.app.state.deployment
    gen: Generation | None = None
    try:
        body = await json_body(request)
        dep.check_model(body.get("model"))
        messages = convert_messages(body.get("messages"))
        tools = convert_tools(body)
        _reject_unsupported(body)
        thinking, preserve, kwargs = _thinking(body)
        max_tokens = positive_int(body, "max_completion_tokens") or positive_int(body, "max_tokens")
        stream = get(body, "stream", bool, default=False)
        include_usage = bool(get(get(body, "stream_options", dict, default={}), "include_usage", bool, default=False, param="stream_options.include_usage"))
        gen = await dep.start(
            messages,
            tools=tools,
            thinking=thinking,
            max_tokens=max_tokens,
            sampling=sampling_fields(body, SAMPLING),
            stop=string_list(body, "stop"),
            template_kwargs=kwargs,
            preserve_thinking=preserve,
        )
        meta = {"id": new_id("chatcmpl-"), "created": int(time.time()), "model": dep.model_id}
        if not stream:
            return JSONResponse(_reply(meta, await gen.complete(request)))
        await gen.running(request)  # the lane is ours: answer now, before the first token
    except Exception as exc:
        if gen is not None:
            gen.cancel()
        return api_error(exc).response("openai")
    return sse_response(_chunks(meta, gen, include_usage))


def _reply(meta: dict, done: Completion) -> dict:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": done.content if done.content or not done.tool_calls else None,
        "reasoning_content": done.reasoning or None,
    }
    if done.tool_calls:
        message["tool_calls"] = [tool_call_json(c, i, False) for i, c in enumerate(done.tool_calls)]
    return {
        **meta,
        "object": "chat.completion",
        "system_fingerprint": None,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": _finish(done)}],
        "usage": usage_json(done),
    }


async def _chunks(meta: dict, gen: Generation, include_usage: bool) -> AsyncIterator[bytes]:
    base = {**meta, "object": "chat.completion.chunk", "system_fingerprint": None}
    extra = {"usage": None} if include_usage else {}

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        return event({**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra})

    yield chunk({"role": "assistant", "content": ""})
    try:
        async for ev in gen.events():
            if isinstance(ev, TextDelta):
                yield chunk({"content": ev.text} if ev.channel == "content" else {"reasoning_content": ev.text})
            elif isinstance(ev, Completion):
                if ev.tool_calls:
                    yield chunk({"tool_calls": [tool_call_json(c, i, True) for i, c in enumerate(ev.tool_calls)]})
                yield chunk({}, _finish(ev))
                if include_usage:
                    yield event({**base, "choices": [], "usage": usage_json(ev)})
                break
    except Exception as exc:  # after the headers went out: report in-band
        yield event(api_error(exc).body("openai"))
    finally:
        gen.cancel()
    yield DONE
