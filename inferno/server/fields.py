"""Reading request bodies: JSON parsing and typed field access that answers 400 with the field name."""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.requests import Request

from inferno.server.errors import bad_request

_TYPE_NAMES = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "an array", dict: "an object"}


async def json_body(request: Request) -> dict:
    """The request body as a JSON object (400 otherwise)."""
    raw = await request.body()
    if not raw:
        raise bad_request("the request body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON ({e}); send a JSON object") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _matches(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def get(body: dict, name: str, *kinds: type, default: Any = None, required: bool = False, param: str | None = None) -> Any:
    """`body[name]` checked against `kinds`; `default` when absent or null (400 if `required`)."""
    param = param or name
    value = body.get(name)
    if value is None:
        if required:
            raise bad_request(f"'{param}' is required", param)
        return default
    if not any(_matches(value, k) for k in kinds):
        wanted = " or ".join(_TYPE_NAMES[k] for k in kinds)
        raise bad_request(f"'{param}' must be {wanted}, got {json.dumps(value)[:60]}", param)
    return value


def positive_int(body: dict, name: str, *, required: bool = False, param: str | None = None) -> int | None:
    value = get(body, name, int, required=required, param=param)
    if value is not None and value < 1:
        raise bad_request(f"'{param or name}' must be >= 1, got {value}", param or name)
    return value


def string_list(body: dict, name: str, *, limit: int = 16) -> list[str]:
    """A string or a list of strings (stop sequences)."""
    value = get(body, name, str, list, default=[])
    items = [value] if isinstance(value, str) else value
    if not all(isinstance(s, str) for s in items):
        raise bad_request(f"'{name}' must be a string or a list of strings", name)
    if len(items) > limit:
        raise bad_request(f"'{name}' takes at most {limit} strings, got {len(items)}", name)
    return [s for s in items if s]


def text_parts(content: Any, param: str, text_types: tuple[str, ...]) -> str:
    """Text of a content field: a string, or a list of text parts (other parts answer 400)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"'{param}' must be a string or a list of content parts", param)
    out = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in text_types and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif kind in ("image", "image_url", "input_image", "input_file", "file", "document", "input_audio"):
            raise bad_request(f"'{param}[{i}]' is {kind} content; this deployment takes text only (no vision)", f"{param}[{i}]")
        else:
            raise bad_request(f"'{param}[{i}]' must be a content part of type {' or '.join(text_types)} with a 'text' string", f"{param}[{i}]")
    return "".join(out)
