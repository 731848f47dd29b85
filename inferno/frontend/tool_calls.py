"""Parse Qwen3.5 XML tool calls out of model output.

The model writes (after optional text):

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

Values are text; they are converted with the tool's JSON schema (integer, number, boolean, object,
array, null) and stay strings when they do not parse. Malformed output never raises: whatever
cannot be read as a call stays in the content text.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferno.frontend.reasoning import partial_suffix_len

TOOL_CALL = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
FUNCTION = "<function="
FUNCTION_END = "</function>"
PARAMETER = "<parameter="
PARAMETER_END = "</parameter>"

_OPENERS = (TOOL_CALL, FUNCTION)
_NAME = re.compile(r"<function=([^>\n]*)>")
_PARAM = re.compile(r"<parameter=([^>\n]*)>")


@dataclass
class ToolCall:
    """One parsed call: the function name and its arguments (already typed by the schema)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def arguments_json(self) -> str:
        """Arguments as a JSON object string (the OpenAI wire form)."""
        return json.dumps(self.arguments, ensure_ascii=False)


def _tool_schemas(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, dict]:
    """Function name -> JSON schema of its parameters (OpenAI, flat or Anthropic tool shapes)."""
    schemas: dict[str, dict] = {}
    for tool in tools or ():
        if not isinstance(tool, Mapping):
            continue
        spec = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
        name = spec.get("name")
        if not isinstance(name, str):
            continue
        params = spec.get("parameters", spec.get("input_schema"))
        schemas[name] = dict(params) if isinstance(params, Mapping) else {}
    return schemas


def _schema_types(schema: Any) -> list[str]:
    """The JSON types a property schema allows (from type, type lists, anyOf/oneOf, enum)."""
    if not isinstance(schema, Mapping):
        return []
    kind = schema.get("type")
    types: list[str] = []
    if isinstance(kind, str):
        types.append(kind)
    elif isinstance(kind, list):
        types.extend(k for k in kind if isinstance(k, str))
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or ():
            types.extend(_schema_types(sub))
    if not types and isinstance(schema.get("enum"), list):
        types.extend(sorted({_json_type(v) for v in schema["enum"]}))
    return types


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return "string"


def _parse_literal(text: str) -> Any:
    """JSON, else a Python literal (models sometimes write {'a': 1}); raises ValueError."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise ValueError(text) from None


def _convert(text: str, schema: Any) -> Any:
    """The parameter value `text` typed by its property schema; the string when nothing fits."""
    types = _schema_types(schema)
    stripped = text.strip()
    for kind in types:
        if kind == "string":
            continue
        if kind == "null" and stripped.lower() in ("null", "none"):
            return None
        if kind == "boolean" and stripped.lower() in ("true", "false"):
            return stripped.lower() == "true"
        if kind in ("integer", "number", "object", "array"):
            try:
                value = _parse_literal(stripped)
            except ValueError:
                continue
            got = _json_type(value)
            if kind == "integer" and got == "number" and float(value).is_integer():
                return int(value)
            if got == kind or (kind == "number" and got == "integer"):
                return value
            if kind == "object" and isinstance(value, dict):
                return value
            if kind == "array" and isinstance(value, (list, tuple)):
                return list(value)
    return text


def _parse_json_call(block: str, schemas: dict[str, dict], strict_names: bool) -> ToolCall | None:
    """The older Qwen form `{"name": ..., "arguments": {...}}` inside `<tool_call>`, if so."""
    try:
        data = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    name, arguments = data["name"].strip(), data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return None
    if not name or not isinstance(arguments, dict) or (strict_names and name not in schemas):
        return None
    return ToolCall(name, arguments)


def _parse_block(block: str, schemas: dict[str, dict], strict_names: bool) -> ToolCall | None:
    """One call from the text after `<tool_call>` (or from `<function=`); None if unreadable."""
    match = _NAME.search(block)
    if match is None:
        return _parse_json_call(block, schemas, strict_names)
    name = match.group(1).strip()
    if not name or (strict_names and name not in schemas):
        return None
    if block[: match.start()].strip():
        return None  # garbage between <tool_call> and <function=...>
    body = block[match.end() :]
    end = body.find(FUNCTION_END)
    if end >= 0:
        if body[end + len(FUNCTION_END) :].strip():
            return None  # text after </function> inside the call
        body = body[:end]
    properties = schemas.get(name, {}).get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    arguments: dict[str, Any] = {}
    params = list(_PARAM.finditer(body))
    if not params and body.strip():
        return None
    for i, param in enumerate(params):
        key = param.group(1).strip()
        if not key:
            return None
        stop = params[i + 1].start() if i + 1 < len(params) else len(body)
        value = body[param.end() : stop]
        closing = value.find(PARAMETER_END)
        if closing >= 0:
            value = value[:closing]
        if value.startswith("\n"):
            value = value[1:]
        if value.endswith("\n"):
            value = value[:-1]
        arguments[key] = _convert(value, properties.get(key))
    return ToolCall(name, arguments)


def _find_opener(text: str, pos: int) -> tuple[int, str] | None:
    """Position and tag of the first `<tool_call>` or bare `<function=` at or after `pos`."""
    found = [(i, tag) for tag in _OPENERS if (i := text.find(tag, pos)) >= 0]
    return min(found) if found else None


def _skip_close(text: str, pos: int) -> int:
    """`pos`, moved past a `</tool_call>` that follows it (after whitespace)."""
    rest = text[pos:].lstrip()
    if rest.startswith(TOOL_CALL_END):
        return len(text) - len(rest) + len(TOOL_CALL_END)
    return pos


def _segments(text: str) -> list[tuple[int, int, int, int]]:
    """(start, body_start, body_end, next) for each call-shaped part of `text`.

    A `<tool_call>` body runs to its `</tool_call>`, else to the next `<tool_call>`, else to
    the end; a bare `<function=...>` block runs to its `</function>` (or the same limits).
    """
    spans = []
    pos = 0
    while (opener := _find_opener(text, pos)) is not None:
        start, tag = opener
        body_start = start + len(TOOL_CALL) if tag == TOOL_CALL else start
        limit = text.find(TOOL_CALL, body_start)
        limit = len(text) if limit < 0 else limit
        close = text.find(TOOL_CALL_END, body_start, limit)
        if tag == FUNCTION:
            fend = text.find(FUNCTION_END, body_start, limit)
            if fend >= 0:
                body_end = fend + len(FUNCTION_END)
                nxt = _skip_close(text, body_end)
            else:
                body_end = nxt = close if close >= 0 else limit
        elif close >= 0:
            body_end, nxt = close, close + len(TOOL_CALL_END)
        else:
            body_end = nxt = limit
        spans.append((start, body_start, body_end, nxt))
        pos = max(nxt, body_start + 1)
    return spans


def parse_tool_calls(
    text: str, tools: Sequence[Mapping[str, Any]] | None = None
) -> tuple[str, list[ToolCall]]:
    """Split `text` into `(content, calls)`.

    With `tools`, only calls to those functions count (others stay text) and values are typed
    by their schemas; without, any function name is accepted and values stay strings.
    """
    schemas = _tool_schemas(tools)
    strict = tools is not None
    calls: list[ToolCall] = []
    pieces: list[str] = []
    pos = 0
    for start, body_start, body_end, nxt in _segments(text):
        block = text[body_start:body_end]
        call = _parse_block(block, schemas, strict)
        if call is None and block.strip():
            continue  # unreadable: stays in the content text
        pieces.append(text[pos:start])
        pos = nxt
        if call is not None:
            calls.append(call)
        # else: an empty call (a doubled opener) is dropped
    if not calls:
        return text, []
    pieces.append(text[pos:])
    content = "\n\n".join(piece.strip() for piece in pieces if piece.strip())
    return content, calls


class ToolCallStream:
    """Holds back streamed content once a tool call may be starting.

    `push(delta)` returns the text that is safe to show now; from the first `<tool_call>`
    (or `<function=`) on, everything is held and `finish()` parses it into calls. Trailing
    whitespace, and a suffix that could begin an opening tag, wait for the next delta.
    """

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None):
        self._tools = tools
        self._pending = ""  # undecided tail: whitespace and/or a partial opening tag
        self._gap = ""  # whitespace between the shown text and the first opener
        self._held = ""  # text from the first opener on
        self.started = False

    def push(self, delta: str) -> str:
        """Add a content delta; return the text that can be shown now."""
        if self.started:
            self._held += delta
            return ""
        text = self._pending + delta
        opener = _find_opener(text, 0)
        if opener is not None:
            before = text[: opener[0]]
            shown = before.rstrip()
            self._gap = before[len(shown) :]
            self._held = text[opener[0] :]
            self._pending = ""
            self.started = True
            return shown
        keep = partial_suffix_len(text, _OPENERS)
        shown = text[: len(text) - keep].rstrip()
        self._pending = text[len(shown) :]
        return shown

    def finish(self) -> tuple[str, list[ToolCall]]:
        """End of output: the rest of the content text, and the parsed calls."""
        if not self.started:
            rest, self._pending = self._pending, ""
            return rest, []
        content, calls = parse_tool_calls(self._held, self._tools)
        self._held = ""
        return (self._gap + content if content else ""), calls
