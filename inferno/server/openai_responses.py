"""OpenAI Responses API: POST /v1/responses (streamed or not), GET/DELETE /v1/responses/{id},
GET /v1/responses/{id}/input_items, POST /v1/responses/input_tokens.

Input: a string or typed items (message, function_call, function_call_output, reasoning).
Output items: `reasoning` (the model's thinking as `reasoning_text` content), `message`
(`output_text`), `function_call`. Only function tools are given to the model; hosted tool types
(web_search, file_search, custom, ...) are ignored. `previous_response_id` continues a response
kept in the server's bounded in-memory store (`store: false` keeps nothing).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferno.frontend.pipeline import Completion, TextDelta
from inferno.server.errors import ApiError, api_error, bad_request
from inferno.server.fields import get, json_body, positive_int, text_parts
from inferno.server.params import apply_tool_choice, function_tool, new_id, sampling_fields, thinking_from_effort
from inferno.server.response_store import StoredResponse
from inferno.server.service import Deployment, Generation
from inferno.server.sse import event, sse_response

SAMPLING = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "seed")
_TEXT_PARTS = ("input_text", "output_text", "text")


# -- request -> conversation ------------------------------------------------------------------


def _text_of(value: Any, param: str) -> str:
    return text_parts(value, param, _TEXT_PARTS)


def convert_input(raw: Any) -> tuple[list[dict], list[dict]]:
    """(chat messages, input items with ids) for the `input` field."""
    if isinstance(raw, str):
        item = {"id": new_id("msg_"), "type": "message", "role": "user", "status": "completed", "content": [{"type": "input_text", "text": raw}]}
        return [{"role": "user", "content": raw}], [item]
    if not isinstance(raw, list) or not raw:
        raise bad_request("'input' must be a string or a non-empty array of input items", "input")
    messages: list[dict] = []
    items: list[dict] = []
    for i, it in enumerate(raw):
        p = f"input[{i}]"
        if not isinstance(it, dict):
            raise bad_request(f"'{p}' must be an object", p)
        kind = it.get("type", "message" if "role" in it else None)
        if kind == "message":
            role = it.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad_request(f"'{p}.role' must be user, system, developer or assistant, got {role!r}", f"{p}.role")
            text = _text_of(it.get("content"), f"{p}.content")
            if role == "assistant":
                last = _open_assistant(messages)
                last["content"] += text
            else:
                role = "system" if role == "developer" else role
                if role == "system" and messages and all(m["role"] == "system" for m in messages):
                    messages[-1]["content"] += "\n\n" + text
                else:
                    messages.append({"role": role, "content": text})
        elif kind == "function_call":
            name, args, call_id = it.get("name"), it.get("arguments", "{}"), it.get("call_id")
            if not isinstance(name, str) or not isinstance(args, str) or not isinstance(call_id, str):
                raise bad_request(f"'{p}' must have string 'name', 'arguments' and 'call_id'", p)
            _open_assistant(messages, calls=True).setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            )
        elif kind == "function_call_output":
            output = it.get("output")
            if not isinstance(it.get("call_id"), str):
                raise bad_request(f"'{p}.call_id' must be a string", f"{p}.call_id")
            messages.append({"role": "tool", "tool_call_id": it["call_id"], "content": _text_of(output, f"{p}.output")})
        elif kind == "reasoning":
            parts = it.get("content") or it.get("summary") or []
            text = "\n".join(x.get("text", "") for x in parts if isinstance(x, dict)) if isinstance(parts, list) else ""
            messages.append({"role": "assistant", "content": "", "reasoning_content": text})
        else:
            raise bad_request(f"'{p}.type' {kind!r} is not supported; use message, function_call, function_call_output or reasoning", f"{p}.type")
        items.append({"id": it.get("id") or new_id("item_"), **it} if kind != "message" else _message_item(it))
    return messages, items


def _message_item(it: dict) -> dict:
    content = it.get("content")
    if isinstance(content, str):
        kind = "output_text" if it.get("role") == "assistant" else "input_text"
        content = [{"type": kind, "text": content}]
    return {"id": it.get("id") or new_id("msg_"), "type": "message", "role": it["role"], "status": "completed", "content": content}


def _open_assistant(messages: list[dict], calls: bool = False) -> dict:
    """The assistant message to extend: the last one if it still takes content (or calls), else a new one."""
    if messages and messages[-1]["role"] == "assistant" and (calls or not messages[-1].get("tool_calls")):
        return messages[-1]
    messages.append({"role": "assistant", "content": ""})
    return messages[-1]


def convert_tools(body: dict) -> tuple[list[dict] | None, list[dict]]:
    """(tools the model sees, function tools as echoed in the response)."""
    raw = get(body, "tools", list, default=[])
    tools, echoed = [], []
    for i, t in enumerate(raw):
        if not isinstance(t, dict):
            raise bad_request(f"'tools[{i}]' must be an object", f"tools[{i}]")
        if t.get("type") != "function":
            continue  # hosted tools cannot run here
        tools.append(function_tool(t.get("name"), t.get("description"), t.get("parameters"), f"tools[{i}]"))
        echoed.append({"type": "function", "name": t["name"], "description": t.get("description"), "parameters": t.get("parameters"), "strict": t.get("strict", True)})
    choice = body.get("tool_choice", "auto")
    if choice in ("none", "auto", "required"):
        mode, name = choice, None
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        mode, name = "named", choice["name"]
    else:
        raise bad_request("'tool_choice' must be none, auto, required or {type: function, name}", "tool_choice")
    if mode in ("required", "named") and not tools:
        raise bad_request("'tool_choice' asks for a function call but 'tools' has no function tools", "tool_choice")
    return apply_tool_choice(tools, mode, name, "tool_choice"), echoed


def _conversation(dep: Deployment, body: dict) -> tuple[list[dict], list[dict], list[dict]]:
    """(messages for the template incl. instructions, messages to store, this request's input items)."""
    new, items = convert_input(body.get("input"))
    history: list[dict] = []
    prev_id = get(body, "previous_response_id", str)
    if prev_id is not None:
        prev = dep.store.get(prev_id)
        if prev is None:
            raise ApiError(404, f"previous response {prev_id!r} is not in the server's store (it keeps recent responses in memory only)", param="previous_response_id", code="response_not_found")
        history = [dict(m) for m in prev.messages]
    conversation = history + new
    instructions = get(body, "instructions", str)
    messages = [dict(m) for m in conversation]
    if instructions:
        if messages and messages[0]["role"] == "system":
            messages[0]["content"] = instructions + "\n\n" + messages[0]["content"]
        else:
            messages.insert(0, {"role": "system", "content": instructions})
    return messages, conversation, items


def _thinking(body: dict) -> bool:
    reasoning = get(body, "reasoning", dict, default={})
    thinking = thinking_from_effort(reasoning.get("effort"), "reasoning.effort")
    return True if thinking is None else thinking


# -- response objects ---------------------------------------------------------------------------


def _usage(done: Completion) -> dict:
    u = done.usage
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.total_tokens,
    }


def _reasoning_item(item_id: str, text: str, status: str) -> dict:
    return {"id": item_id, "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}] if text else [], "status": status}


def _output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message(item_id: str, text: str | None, status: str) -> dict:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": [] if text is None else [_output_text(text)]}


def _function_call(call: Any) -> dict:
    return {"id": new_id("fc_"), "type": "function_call", "call_id": new_id("call_"), "name": call.name, "arguments": call.arguments_json(), "status": "completed"}


class _Shell:
    """The response object around the output: fixed request fields, status and usage filled in at the end."""

    def __init__(self, dep: Deployment, body: dict, echoed_tools: list[dict]):
        self.id = new_id("resp_")
        reasoning = get(body, "reasoning", dict, default={})
        self.base = {
            "id": self.id,
            "object": "response",
            "created_at": int(time.time()),
            "model": dep.model_id,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "metadata": body.get("metadata") or {},
            "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "store": bool(body.get("store", True)),
            "temperature": body.get("temperature"),
            "text": {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": echoed_tools,
            "top_p": body.get("top_p"),
            "truncation": "disabled",
            "user": body.get("user"),
        }

    def build(self, status: str, output: list[dict], done: Completion | None = None) -> dict:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            **self.base,
            "status": status,
            "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
            "error": None,
            "incomplete_details": incomplete,
            "output": output,
            "usage": _usage(done) if done is not None else None,
        }


def _status(done: Completion) -> str:
    return "incomplete" if done.finish_reason == "length" else "completed"


def _final_output(done: Completion) -> list[dict]:
    status = "incomplete" if done.finish_reason == "length" else "completed"
    out = []
    if done.reasoning:
        out.append(_reasoning_item(new_id("rs_"), done.reasoning, status))
    if done.content or not done.tool_calls:
        out.append(_message(new_id("msg_"), done.content, status))
    out.extend(_function_call(c) for c in done.tool_calls)
    return out


def _save(dep: Deployment, shell: _Shell, response: dict, conversation: list[dict], items: list[dict], done: Completion) -> None:
    if not shell.base["store"]:
        return
    reply: dict[str, Any] = {"role": "assistant", "content": done.content}
    if done.reasoning:
        reply["reasoning_content"] = done.reasoning
    calls = [o for o in response["output"] if o["type"] == "function_call"]
    if calls:
        reply["tool_calls"] = [{"id": c["call_id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
    dep.store.put(StoredResponse(response, items, conversation + [reply]))


# -- handlers -----------------------------------------------------------------------------------


def _prepare(dep: Deployment, body: dict) -> tuple[list[dict], list[dict], list[dict], list[dict] | None, list[dict], bool]:
    dep.check_model(body.get("model"))
    for name, why in (("background", "background responses"), ("conversation", "server-side conversations; use previous_response_id"), ("prompt", "stored prompt templates")):
        if body.get(name):
            raise bad_request(f"'{name}' is not supported here ({why} are not implemented)", name)
    messages, conversation, items = _conversation(dep, body)
    tools, echoed = convert_tools(body)
    fmt = get(get(body, "text", dict, default={}), "format", dict, default={"type": "text"}, param="text.format")
    if fmt.get("type") != "text":
        raise bad_request("'text.format' other than text is not supported (no constrained decoding)", "text.format")
    return messages, conversation, items, tools, echoed, _thinking(body)


async def create(request: Request) -> Response:
    dep: Deployment = request.app.state.deployment
    gen: Generation | None = None
    try:
        body = await json_body(request)
        messages, conversation, items, tools, echoed, thinking = _prepare(dep, body)
        get(body, "store", bool)
        stream = get(body, "stream", bool, default=False)
        gen = await dep.start(
            messages,
            tools=tools,
            thinking=thinking,
            max_tokens=positive_int(body, "max_output_tokens"),
            sampling=sampling_fields(body, SAMPLING),
        )
        shell = _Shell(dep, body, echoed)
        if not stream:
            done = await gen.complete(request)
            response = shell.build(_status(done), _final_output(done), done)
            _save(dep, shell, response, conversation, items, done)
            return JSONResponse(response)
        await gen.running(request)  # the lane is ours: answer now, before the first token
    except Exception as exc:
        if gen is not None:
            gen.cancel()
        return api_error(exc).response("openai")
    return sse_response(_events(dep, shell, gen, conversation, items))


async def _events(dep: Deployment, shell: _Shell, gen: Generation, conversation: list[dict], items: list[dict]) -> AsyncIterator[bytes]:
    seq = 0
    output: list[dict] = []
    current: dict | None = None  # the open reasoning / message item
    texts: list[str] = []

    def emit(kind: str, **data: Any) -> bytes:
        nonlocal seq
        frame = event({"type": kind, "sequence_number": seq, **data}, kind)
        seq += 1
        return frame

    def close(status: str) -> list[bytes]:
        nonlocal current
        if current is None:
            return []
        text, idx, item_id = "".join(texts), len(output), current["id"]
        if current["type"] == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            item = _reasoning_item(item_id, text, status)
            frames = [emit("response.reasoning_text.done", item_id=item_id, output_index=idx, content_index=0, text=text)]
        else:
            part = _output_text(text)
            item = _message(item_id, text, status)
            frames = [emit("response.output_text.done", item_id=item_id, output_index=idx, content_index=0, text=text, logprobs=[])]
        frames.append(emit("response.content_part.done", item_id=item_id, output_index=idx, content_index=0, part=part))
        frames.append(emit("response.output_item.done", output_index=idx, item=item))
        output.append(item)
        current = None
        texts.clear()
        return frames

    def open_item(channel: str) -> list[bytes]:
        nonlocal current
        idx = len(output)
        if channel == "reasoning":
            current = _reasoning_item(new_id("rs_"), "", "in_progress")
            part = {"type": "reasoning_text", "text": ""}
        else:
            current = _message(new_id("msg_"), None, "in_progress")
            part = _output_text("")
        return [
            emit("response.output_item.added", output_index=idx, item=current),
            emit("response.content_part.added", item_id=current["id"], output_index=idx, content_index=0, part=part),
        ]

    yield emit("response.created", response=shell.build("in_progress", []))
    yield emit("response.in_progress", response=shell.build("in_progress", []))
    try:
        async for ev in gen.events():
            if isinstance(ev, TextDelta):
                kind = "reasoning" if ev.channel == "reasoning" else "message"
                if current is None or current["type"] != kind:
                    for f in close("completed") + open_item(ev.channel):
                        yield f
                texts.append(ev.text)
                name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
                extra = {} if kind == "reasoning" else {"logprobs": []}
                yield emit(name, item_id=current["id"], output_index=len(output), content_index=0, delta=ev.text, **extra)
            elif isinstance(ev, Completion):
                status = "incomplete" if ev.finish_reason == "length" else "completed"
                for f in close(status):
                    yield f
                if not ev.tool_calls and not any(o["type"] == "message" for o in output):
                    for f in open_item("content") + close(status):  # the answer is empty: still one message item
                        yield f
                for call in ev.tool_calls:
                    item, idx = _function_call(call), len(output)
                    yield emit("response.output_item.added", output_index=idx, item={**item, "arguments": "", "status": "in_progress"})
                    yield emit("response.function_call_arguments.delta", item_id=item["id"], output_index=idx, delta=item["arguments"])
                    yield emit("response.function_call_arguments.done", item_id=item["id"], output_index=idx, arguments=item["arguments"], name=item["name"])
                    yield emit("response.output_item.done", output_index=idx, item=item)
                    output.append(item)
                response = shell.build(_status(ev), output, ev)
                _save(dep, shell, response, conversation, items, ev)
                yield emit("response.completed" if status == "completed" else "response.incomplete", response=response)
                break
    except Exception as exc:  # after the headers went out: report in-band
        err = api_error(exc)
        yield emit("error", code=err.code, message=err.message, param=err.param)
    finally:
        gen.cancel()


async def input_tokens(request: Request) -> Response:
    dep: Deployment = request.app.state.deployment
    try:
        body = await json_body(request)
        messages, _, _, tools, _, thinking = _prepare(dep, body)
        n = await dep.count(messages, tools, thinking)
    except Exception as exc:
        return api_error(exc).response("openai")
    return JSONResponse({"object": "response.input_tokens", "input_tokens": n})


def _stored(request: Request) -> StoredResponse:
    rid = request.path_params["response_id"]
    found = request.app.state.deployment.store.get(rid)
    if found is None:
        raise ApiError(404, f"response {rid!r} is not in the server's store (it keeps recent responses in memory only)", code="response_not_found")
    return found


async def retrieve(request: Request) -> Response:
    try:
        return JSONResponse(_stored(request).response)
    except ApiError as e:
        return e.response("openai")


async def delete(request: Request) -> Response:
    try:
        rid = _stored(request).response["id"]
    except ApiError as e:
        return e.response("openai")
    request.app.state.deployment.store.delete(rid)
    return JSONResponse({"id": rid, "object": "response.deleted", "deleted": True})


async def input_items(request: Request) -> Response:
    try:
        items = list(_stored(request).input_items)
        q = request.query_params
        order = q.get("order", "desc")
        if order not in ("asc", "desc"):
            raise bad_request("'order' must be asc or desc", "order")
        try:
            limit = int(q.get("limit", "20"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 100:
            raise bad_request("'limit' must be an integer in 1..100", "limit")
    except ApiError as e:
        return e.response("openai")
    if order == "desc":
        items.reverse()
    after = q.get("after")
    if after is not None:
        ids = [it["id"] for it in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    return JSONResponse({
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    })
