"""`TextPipeline`: messages (or a raw prompt) in, text events out, over an `Engine`.

messages + tools + thinking flag -> chat template -> token ids -> `Engine.generate` ->
incremental detokenizer -> reasoning / content split -> stop strings -> tool-call hold-back ->
`TextDelta(text, channel)` events, then one `Completion` (finish reason, full texts, tool calls,
usage, engine stats).

Rules:
- Stop strings apply to the answer (content channel) only, never to reasoning; text that could
  be the start of a stop string is held back until it is decided. A matched stop string and
  everything after it is dropped, the request is cancelled in the engine, and the finish
  reason is "stop".
- EOS / stop token ids end the output without adding text; they count as completion tokens.
- With tools, content from the first `<tool_call>` on is held and parsed at the end; when calls
  were found and the model stopped by itself, the finish reason is "tool_calls".
- `reasoning_tokens` counts generated tokens that arrived while the output was in the reasoning
  channel (the closing `</think>` included).
- `chat()` / `complete()` do all checks and queue the request before returning, so bad input,
  a full queue or a too-long prompt raise at the call (before a server sends any response);
  a queue timeout raises from the first `next()`. Setting `cancel` (from any thread, e.g. on a
  client disconnect) ends the stream with finish reason "cancelled"; `close()` (from the
  consuming thread) cancels the request and ends the stream at once.
- `TextStream.started` (a `threading.Event`) is set when an engine lane takes the request, before
  its prefill: a server can answer "running" without waiting for the first token.
- `chat_prompt()` renders and encodes a chat prompt once; `chat(..., prompt=...)` takes it as is.
- Streams are independent: one pipeline serves many concurrent requests (one thread each).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from inferno.engine import Engine, GenerationRequest, GenerationStats, SamplingParams, TokenEvent, resolve_sampling
from inferno.engine.generate import Cancel
from inferno.errors import NotBuiltError
from inferno.frontend.chat_template import ChatTemplate
from inferno.frontend.detokenizer import IncrementalDetokenizer
from inferno.frontend.reasoning import THINK, THINK_END, ReasoningSplitter, partial_suffix_len
from inferno.frontend.tokenizer import Tokenizer
from inferno.frontend.tool_calls import ToolCall, ToolCallStream

Channel = Literal["reasoning", "content"]
FinishReason = Literal["stop", "length", "tool_calls", "cancelled"]


@dataclass(frozen=True)
class TextDelta:
    """A piece of output text; concatenating the deltas of a channel gives its full text."""

    text: str
    channel: Channel


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Completion:
    """The end of a request: always the last event."""

    finish_reason: FinishReason
    content: str
    reasoning: str
    usage: Usage
    tool_calls: list[ToolCall] = field(default_factory=list)
    stop_string: str | None = None  # the stop string that ended the output, if one did
    stats: GenerationStats | None = None


Event = TextDelta | Completion


@dataclass(frozen=True)
class ChatPrompt:
    """A chat prompt as text (generation prompt included) and its token ids."""

    text: str
    ids: list[int]


class _StopMatcher:
    """Finds the first stop string in streamed text, holding back a possible partial match."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in stops if s)
        self._pending = ""

    def push(self, text: str) -> tuple[str, str | None]:
        """(text that is safe to release, the stop string matched or None)."""
        buf = self._pending + text
        hits = [(i, s) for s in self.stops if (i := buf.find(s)) >= 0]
        if hits:
            i, stop = min(hits)
            self._pending = ""
            return buf[:i], stop
        keep = partial_suffix_len(buf, self.stops) if self.stops else 0
        self._pending = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], None

    def flush(self) -> str:
        rest, self._pending = self._pending, ""
        return rest


class _AnyCancel:
    def __init__(self, *events: Cancel | None):
        self._events = [e for e in events if e is not None]

    def is_set(self) -> bool:
        return any(e.is_set() for e in self._events)


class TextStream:
    """Iterator of `TextDelta`s ending with one `Completion`; `close()` cancels the request."""

    def __init__(
        self,
        pipeline: TextPipeline,
        prompt_ids: list[int],
        request: GenerationRequest,
        *,
        split_reasoning: bool,
        in_reasoning: bool,
        stop: Sequence[str],
        tools: Sequence[Mapping[str, Any]] | None,
        cancel: Cancel | None,
    ):
        self.prompt_ids = prompt_ids
        self._stop_ids = frozenset(request.stop_token_ids)
        if not request.ignore_eos:
            self._stop_ids |= frozenset(pipeline.engine.executor.config.eos_token_ids)
        self._own_cancel = threading.Event()
        self._tokens = pipeline.engine.generate(request, cancel=_AnyCancel(cancel, self._own_cancel))
        self.started = self._tokens.started  # set when an engine lane takes the request
        self._detok = IncrementalDetokenizer(pipeline.tokenizer)
        self._splitter = ReasoningSplitter(in_reasoning) if split_reasoning else None
        self._stops = _StopMatcher(stop)
        self._tools = ToolCallStream(tools) if tools else None
        self._out: list[Event] = []
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._completion_tokens = 0
        self._reasoning_tokens = 0
        self._stop_string: str | None = None
        self._done = False

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> Event:
        while not self._out:
            if self._done:
                raise StopIteration
            self._advance(next(self._tokens))
        return self._out.pop(0)

    def close(self) -> None:
        """Cancel the request and drop what has not been read."""
        self._done = True
        self._out.clear()
        self._tokens.close()

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- token handling -----------------------------------------------------------------------

    def _advance(self, event: TokenEvent) -> None:
        if event.token_id is not None:
            self._completion_tokens += 1
            if self._splitter is not None and self._splitter.in_reasoning:
                self._reasoning_tokens += 1
            if not (event.finish_reason == "stop" and event.token_id in self._stop_ids):
                self._text(self._detok.push(event.token_id))
        if self._stop_string is not None:
            self._own_cancel.set()
            stats = event.stats if event.finish_reason is not None else self._drain()
            self._finish("stop", stats)
        elif event.finish_reason is not None:
            self._text(self._detok.flush())
            self._finish(event.finish_reason, event.stats)

    def _drain(self) -> GenerationStats | None:
        """After a stop string: read the engine's remaining events (tokens past the stop) for its stats."""
        for event in self._tokens:
            if event.finish_reason is not None:
                return event.stats
        return None

    def _text(self, text: str) -> None:
        if not text or self._stop_string is not None:
            return
        if self._splitter is None:
            self._answer(text)
            return
        reasoning, content = self._splitter.push(text)
        self._emit(reasoning, "reasoning")
        self._answer(content)

    def _answer(self, text: str) -> None:
        if not text or self._stop_string is not None:
            return
        released, self._stop_string = self._stops.push(text)
        self._show(released)

    def _show(self, text: str) -> None:
        if self._tools is not None:
            text = self._tools.push(text)
        self._emit(text, "content")

    def _emit(self, text: str, channel: Channel) -> None:
        if text:
            (self._reasoning if channel == "reasoning" else self._content).append(text)
            self._out.append(TextDelta(text, channel))

    def _finish(self, reason: str, stats: GenerationStats | None) -> None:
        if self._splitter is not None:
            reasoning, content = self._splitter.finish()
            self._emit(reasoning, "reasoning")
            self._answer(content)
        if self._stop_string is None:
            self._show(self._stops.flush())
        calls: list[ToolCall] = []
        if self._tools is not None:
            rest, calls = self._tools.finish()
            self._emit(rest, "content")
        if self._stop_string is not None:
            reason = "stop"
        if calls and reason == "stop":
            reason = "tool_calls"
        self._out.append(
            Completion(
                finish_reason=reason,  # type: ignore[arg-type]
                content="".join(self._content),
                reasoning="".join(self._reasoning),
                usage=Usage(len(self.prompt_ids), self._completion_tokens, self._reasoning_tokens),
                tool_calls=calls,
                stop_string=self._stop_string,
                stats=stats,
            )
        )
        self._done = True


_MEDIA_PARTS = frozenset({"image", "image_url", "input_image", "video", "video_url", "input_video"})


def _refuse_media(messages: Sequence[Mapping[str, Any]]) -> None:
    """Images and videos need the vision tower, which the text pipeline does not run yet."""
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, Sequence) and not isinstance(content, str):
            for part in content:
                if isinstance(part, Mapping) and part.get("type") in _MEDIA_PARTS:
                    raise NotBuiltError(
                        f"{part['type']} input is not built yet (text only for now); send text content parts"
                    )


def _opens_reasoning(prompt: str) -> bool:
    """True when the prompt ends inside an open think block."""
    return prompt.rfind(THINK) > prompt.rfind(THINK_END)


class TextPipeline:
    """Chat and raw-prompt generation as text events, for the CLI and the server."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        *,
        identity: str | None = None,
        generation_config: Mapping[str, Any] | None = None,
        sampling_defaults: Mapping[str, Any] | None = None,
        greedy: bool = False,
    ):
        """`sampling_defaults`: process-level overrides of the model presets (e.g. CLI flags);
        `greedy` forces temperature 0 for every request."""
        self.engine = engine
        self.tokenizer = tokenizer
        self.template = template
        self.identity = identity
        self.generation_config = dict(generation_config or {})
        self.sampling_defaults = dict(sampling_defaults or {})
        self.greedy = greedy

    @classmethod
    def from_resources(cls, engine: Engine, resources: Mapping[str, bytes], identity: str | None = None, **kw: Any) -> TextPipeline:
        """Tokenizer, chat template and generation_config from a model's resource files."""
        generation_config: dict = {}
        raw = resources.get("generation_config.json")
        if raw is not None:
            try:
                parsed = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                parsed = None
            generation_config = parsed if isinstance(parsed, dict) else {}
        return cls(
            engine,
            Tokenizer.from_resources(resources),
            ChatTemplate.from_resources(resources),
            identity=identity,
            generation_config=generation_config,
            **kw,
        )

    # -- prompts ------------------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        thinking: bool = True,
        preserve_thinking: bool = False,
        **template_kwargs: Any,
    ) -> str:
        """The chat prompt text (generation prompt included)."""
        return self.template.render(
            messages, tools, enable_thinking=thinking, preserve_thinking=preserve_thinking, **template_kwargs
        )

    def chat_prompt(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        thinking: bool = True,
        preserve_thinking: bool = False,
        **template_kwargs: Any,
    ) -> ChatPrompt:
        """The rendered and encoded chat prompt; raises for content the text pipeline cannot take."""
        _refuse_media(messages)
        text = self.render(messages, tools, thinking=thinking, preserve_thinking=preserve_thinking, **template_kwargs)
        return ChatPrompt(text, self.tokenizer.encode(text))

    def count_tokens(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None, **kw: Any) -> int:
        """Prompt tokens of a chat request (for token-count endpoints)."""
        return len(self.tokenizer.encode(self.render(messages, tools, **kw)))

    def sampling(self, thinking: bool, overrides: SamplingParams | Mapping[str, Any] | None = None) -> SamplingParams:
        """Model preset for the thinking mode < process defaults < `overrides` < greedy."""
        if isinstance(overrides, SamplingParams):
            return overrides
        return resolve_sampling(
            self.identity, thinking, self.generation_config, self.sampling_defaults, overrides, greedy=self.greedy
        )

    # -- generation ---------------------------------------------------------------------------

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        max_new_tokens: int,
        tools: Sequence[Mapping[str, Any]] | None = None,
        thinking: bool = True,
        preserve_thinking: bool = False,
        sampling: SamplingParams | Mapping[str, Any] | None = None,
        stop: Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
        cancel: Cancel | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        prompt: ChatPrompt | None = None,
    ) -> TextStream:
        """Generate an assistant reply to `messages` (OpenAI-style dicts).

        `prompt`: `chat_prompt(...)` of these same arguments, when the caller already has it
        (it is used as is, not rendered again).
        """
        if prompt is None:
            prompt = self.chat_prompt(
                messages, tools, thinking=thinking, preserve_thinking=preserve_thinking, **dict(template_kwargs or {})
            )
        ids = list(prompt.ids)
        stop_ids = tuple(dict.fromkeys((*stop_token_ids, *self.tokenizer.eos_ids)))
        request = GenerationRequest(ids, max_new_tokens, self.sampling(thinking, sampling), stop_ids)
        return TextStream(
            self,
            ids,
            request,
            split_reasoning=True,
            in_reasoning=_opens_reasoning(prompt.text),
            stop=stop,
            tools=tools,
            cancel=cancel,
        )

    def complete(
        self,
        prompt: str | Sequence[int],
        *,
        max_new_tokens: int,
        sampling: SamplingParams | Mapping[str, Any] | None = None,
        stop: Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
        split_reasoning: bool = False,
        cancel: Cancel | None = None,
    ) -> TextStream:
        """Continue a raw prompt (text, or token ids) with no chat template.

        Output is all content unless `split_reasoning`; it stops at the model's EOS ids and
        `stop_token_ids`. Sampling defaults are the non-thinking preset.
        """
        if isinstance(prompt, str):
            text, ids = prompt, self.tokenizer.encode(prompt)
        else:
            ids = list(prompt)
            text = self.tokenizer.decode(ids) if split_reasoning else ""
        request = GenerationRequest(ids, max_new_tokens, self.sampling(split_reasoning, sampling), tuple(stop_token_ids))
        return TextStream(
            self,
            ids,
            request,
            split_reasoning=split_reasoning,
            in_reasoning=_opens_reasoning(text),
            stop=stop,
            tools=None,
            cancel=cancel,
        )


def collect(stream: Iterator[Event]) -> Completion:
    """Run a stream to its end and return the `Completion`."""
    for event in stream:
        if isinstance(event, Completion):
            return event
    raise RuntimeError("the text stream ended without a Completion")
