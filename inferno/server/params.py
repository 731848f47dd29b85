"""Request parameters shared by the three APIs: sampling fields, thinking switches, tool choice."""

from __future__ import annotations

import secrets
from typing import Any

from inferno.engine import SamplingParams
from inferno.server.errors import bad_request
from inferno.server.fields import get

#: reasoning effort values that switch thinking off; every other known value keeps it on.
_EFFORT_OFF = ("none", "minimal")
_EFFORTS = (*_EFFORT_OFF, "low", "medium", "high", "xhigh")


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def sampling_fields(body: dict, names: tuple[str, ...]) -> dict[str, Any]:
    """The sampling fields among `names` that the body sets, checked by `SamplingParams` (400)."""
    kinds = {"top_k": (int,), "seed": (int,)}
    out = {n: get(body, n, *kinds.get(n, (float,))) for n in names}
    out = {n: v for n, v in out.items() if v is not None}
    if out.get("top_k") == -1:  # the common "no top-k" spelling
        out["top_k"] = 0
    try:
        SamplingParams(**out)
    except Exception as e:
        raise bad_request(str(e), next((n for n in out if n in str(e)), None)) from None
    return out


def thinking_from_effort(effort: Any, param: str) -> bool | None:
    """Thinking on/off from a reasoning-effort value (None when not given)."""
    if effort is None:
        return None
    if effort not in _EFFORTS:
        raise bad_request(f"'{param}' must be one of {', '.join(_EFFORTS)}, got {effort!r}", param)
    return effort not in _EFFORT_OFF


def function_tool(name: Any, description: Any, parameters: Any, param: str) -> dict:
    """A tool in the chat template's shape: {type: function, function: {name, description, parameters}}."""
    if not isinstance(name, str) or not name:
        raise bad_request(f"'{param}' needs a non-empty string 'name'", param)
    if parameters is not None and not isinstance(parameters, dict):
        raise bad_request(f"'{param}' parameters must be a JSON schema object", param)
    spec: dict[str, Any] = {"name": name}
    if isinstance(description, str) and description:
        spec["description"] = description
    spec["parameters"] = parameters if parameters is not None else {"type": "object", "properties": {}}
    return {"type": "function", "function": spec}


def apply_tool_choice(tools: list[dict], mode: str, name: str | None, param: str) -> list[dict] | None:
    """The tools the model sees for a tool choice: none hides them, a named choice shows only that one.

    auto / required show all of them; decoding is not constrained, so "required" and a named
    choice make a call likely but not certain (docs/serving.md).
    """
    if not tools or mode == "none":
        return None
    if name is None:
        return tools
    chosen = [t for t in tools if t["function"]["name"] == name]
    if not chosen:
        raise bad_request(f"'{param}' names tool {name!r}, which is not among the request's tools", param)
    return chosen
