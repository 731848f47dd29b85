"""Chat templates: render a conversation into the prompt text the model was trained on.

Templates are Jinja, rendered in a sandbox with the helpers HF chat templates expect
(`raise_exception`, an HF-compatible `tojson`, loop controls, `strftime_now`). Inferno ships its
own Qwen3.5 template (`templates/qwen3_5.jinja`); a checkpoint's own template is used when it
has one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from importlib import resources as importlib_resources
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from inferno.errors import InfernoError

BUILTIN_TEMPLATE = "qwen3_5.jinja"


class ChatTemplateError(InfernoError):
    """A conversation the chat template refuses, or a template that does not work."""


class _TemplateRaised(Exception):
    """Raised by `raise_exception(...)` inside a template."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """`tojson` as HF chat templates see it: plain json.dumps, keys in order, no HTML escaping."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def builtin_template_source() -> str:
    """The text of Inferno's own Qwen3.5 chat template."""
    path = importlib_resources.files("inferno.frontend") / "templates" / BUILTIN_TEMPLATE
    return path.read_text(encoding="utf-8")


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _normalise_call(call: Any) -> Any:
    """Give a tool call's arguments as a mapping (OpenAI sends them as a JSON string)."""
    if not isinstance(call, Mapping):
        raise ChatTemplateError("each tool call must be an object with a function name")
    call = dict(call)
    target = call
    if isinstance(call.get("function"), Mapping):
        target = call["function"] = dict(call["function"])
    args = target.get("arguments")
    if isinstance(args, str):
        if not args.strip():
            target["arguments"] = {}
        else:
            try:
                parsed = json.loads(args)
            except json.JSONDecodeError:
                parsed = None
            if not isinstance(parsed, dict):
                raise ChatTemplateError(
                    f"arguments of tool call {target.get('name')!r} are not a JSON object; "
                    "send them as a JSON object string"
                )
            target["arguments"] = parsed
    return call


def _normalise(messages: Any) -> list[dict]:
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        raise ChatTemplateError("messages must be a list of {role, content} objects")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ChatTemplateError(f"message {i} must be an object with a string 'role'")
        message = dict(message)
        calls = message.get("tool_calls")
        if isinstance(calls, Sequence) and not isinstance(calls, (str, bytes)):
            message["tool_calls"] = [_normalise_call(call) for call in calls]
        out.append(message)
    return out


class ChatTemplate:
    """A compiled chat template."""

    def __init__(self, source: str):
        self.source = source
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(
                f"chat template does not compile (line {e.lineno}: {_one_line(e.message or e)}); "
                "fix the template"
            ) from None

    @classmethod
    def builtin(cls) -> ChatTemplate:
        """Inferno's own Qwen3.5 template."""
        return cls(builtin_template_source())

    @classmethod
    def from_resources(cls, resources: Mapping[str, bytes]) -> ChatTemplate:
        """The checkpoint's template (chat_template.jinja, else tokenizer_config's), else ours."""
        if "chat_template.jinja" in resources:
            return cls(resources["chat_template.jinja"].decode("utf-8"))
        raw = resources.get("tokenizer_config.json")
        if raw is not None:
            try:
                config = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise ChatTemplateError(
                    "tokenizer_config.json is not valid JSON; repair or replace it"
                ) from None
            found = config.get("chat_template") if isinstance(config, dict) else None
            if isinstance(found, list):  # [{name, template}, ...]: take the default one
                named = {t.get("name"): t.get("template") for t in found if isinstance(t, dict)}
                found = named.get("default")
            if isinstance(found, str) and found.strip():
                return cls(found)
        return cls.builtin()

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
        preserve_thinking: bool = False,
        **extra: Any,
    ) -> str:
        """The prompt text for `messages` (OpenAI-style dicts; content a string or part list)."""
        if tools is not None and (
            not isinstance(tools, Sequence) or isinstance(tools, (str, bytes))
        ):
            raise ChatTemplateError("tools must be a list of tool definitions")
        context = dict(extra)
        context.update(
            messages=_normalise(messages),
            tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt,
            enable_thinking=enable_thinking,
            preserve_thinking=preserve_thinking,
        )
        try:
            return self._template.render(**context)
        except _TemplateRaised as e:
            raise ChatTemplateError(_one_line(str(e))) from None
        except jinja2.TemplateError as e:
            raise ChatTemplateError(
                f"chat template failed: {_one_line(str(e))}; check the messages' shape"
            ) from None
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
            raise ChatTemplateError(
                f"chat template failed on these messages ({type(e).__name__}: {_one_line(str(e))})"
            ) from None
