"""What the HTTP handlers share: the deployment (pipeline + settings) and the thread/asyncio bridge.

Generation is synchronous (numpy executor behind `Engine` lanes), so each request's `TextStream`
is read by a worker thread that hands events to the event loop through an `asyncio.Queue`.
Cancelling (client disconnect, a handler task cancelled) sets the request's cancel event: the
engine stops the request at its next prefill chunk or token and frees the lane. The client's
connection is watched from the moment the request is queued: by `Generation` while it waits for
a lane and through a non-streamed generation, and by the streaming response once that started.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio.to_thread
from starlette.requests import Request

from inferno.engine import ContextLengthError, Engine
from inferno.engine.engine import DEFAULT_PREFILL_CHUNK
from inferno.frontend.pipeline import Completion, Event, TextPipeline, TextStream
from inferno.server.errors import ApiError
from inferno.server.response_store import ResponseStore

_END = object()
_START_POLL_S = 0.05  # how often a request waiting for a lane checks whether one took it (as the engine does)


@dataclass
class Deployment:
    """One served model and the server's settings."""

    pipeline: TextPipeline
    model_id: str
    aliases: tuple[str, ...] = ()
    default_max_tokens: int = 1024
    accept_any_model: bool = False
    executor_name: str = "reference"
    kv_dtype: str = "fp32"
    created: int = 0
    store: ResponseStore = field(default_factory=ResponseStore)

    @property
    def max_context(self) -> int:
        return self.pipeline.engine.max_context

    def check_model(self, requested: Any) -> None:
        """404 unless `requested` names this model (see docs/serving.md for the rule)."""
        if requested is None or requested == "" or self.accept_any_model:
            return
        if not isinstance(requested, str):
            raise ApiError(400, "'model' must be a string", param="model")
        names = {n.lower() for n in (self.model_id, *self.aliases)}
        wanted = requested.strip().lower()
        if wanted not in names and wanted.rsplit("/", 1)[-1] not in names:
            raise ApiError(
                404,
                f"model {requested!r} is not served here; use {self.model_id!r} (GET /v1/models lists it)",
                param="model",
                code="model_not_found",
            )

    async def count(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None, thinking: bool) -> int:
        """Tokens of the rendered prompt (in a worker thread: long prompts take a while to encode)."""
        return await anyio.to_thread.run_sync(lambda: self.pipeline.count_tokens(messages, tools, thinking=thinking))

    async def start(self, messages: Sequence[Mapping[str, Any]], **kw: Any) -> Generation:
        """Queue a chat generation (see `open`); rendering and encoding run in a worker thread."""
        stream, cancel = await anyio.to_thread.run_sync(lambda: self.open(messages, **kw))
        return Generation(stream, cancel)

    def open(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None,
        thinking: bool,
        max_tokens: int | None,
        sampling: Mapping[str, Any],
        stop: Sequence[str] = (),
        template_kwargs: Mapping[str, Any] | None = None,
        preserve_thinking: bool = False,
    ) -> tuple[TextStream, threading.Event]:
        """Queue a chat generation; raises (before any response is sent) for bad input or a full queue.

        `max_tokens` None means the server default; either is clamped to the context left after
        the prompt, and a prompt that leaves no room answers 400.
        """
        kw = dict(template_kwargs or {})
        prompt = self.pipeline.chat_prompt(messages, tools, thinking=thinking, preserve_thinking=preserve_thinking, **kw)
        room = self.max_context - len(prompt.ids)
        if room < 1:
            raise ContextLengthError(
                f"the prompt has {len(prompt.ids)} tokens but the context limit is {self.max_context}; "
                "shorten the conversation or start the server with a larger --max-context"
            )
        limit = min(max_tokens or self.default_max_tokens, room)
        cancel = threading.Event()
        stream = self.pipeline.chat(
            messages,
            max_new_tokens=limit,
            tools=tools,
            thinking=thinking,
            preserve_thinking=preserve_thinking,
            sampling=dict(sampling),
            stop=stop,
            cancel=cancel,
            template_kwargs=kw,
            prompt=prompt,
        )
        return stream, cancel


def build_deployment(
    source: Any,
    executor: Any,
    *,
    model_id: str | None = None,
    max_context: int | None = None,
    max_concurrency: int = 1,
    max_pending: int = 16,
    pending_timeout: float | None = 30.0,
    default_max_tokens: int = 1024,
    accept_any_model: bool = False,
    store_records: int = 256,
    executor_name: str = "reference",
    kv_dtype: str = "fp32",
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
) -> Deployment:
    """An `Engine` over `executor` and a `Deployment` for the opened model `source` (`ModelSource`)."""
    engine = Engine(
        executor,
        max_concurrency,
        max_pending=max_pending,
        pending_timeout=pending_timeout,
        max_context=max_context,
        prefill_chunk=prefill_chunk,
    )
    pipeline = TextPipeline.from_resources(engine, source.resources, source.identity)
    base = source.identity.split("/", 1)[0]
    aliases = tuple(dict.fromkeys(a for a in (base, source.identity, Path(source.path).stem) if a))
    return Deployment(
        pipeline,
        model_id or base,
        aliases=aliases,
        default_max_tokens=default_max_tokens,
        accept_any_model=accept_any_model,
        executor_name=executor_name,
        kv_dtype=kv_dtype,
        created=int(time.time()),
        store=ResponseStore(store_records),
    )


async def _disconnect(request: Request) -> None:
    """Returns when the client has disconnected (the request body must have been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Generation:
    """One queued request: its events on the asyncio side, cancellable from there."""

    def __init__(self, stream: TextStream, cancel: threading.Event):
        self.stream = stream
        self.prompt_tokens = len(stream.prompt_ids)
        self._cancel = cancel
        self._queue: asyncio.Queue = asyncio.Queue()
        self._early: asyncio.Future | None = None  # the first item, when it came while waiting for a lane
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._produce, name="inferno-request", daemon=True)
        self._thread.start()

    def _put(self, item: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone (server shutting down)
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def _produce(self) -> None:
        try:
            for event in self.stream:
                self._put(event)
        except BaseException as exc:  # handed to the handler, which answers with the API's error shape
            self._put(exc)
        finally:
            self.stream.close()
            self._put(_END)

    def cancel(self) -> None:
        self._cancel.set()

    async def next(self) -> Event | None:
        """The next event (None after the Completion); re-raises the generation's exception."""
        if self._early is not None:
            item, self._early = self._early.result(), None
        else:
            item = await self._queue.get()
        if item is _END:
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    async def events(self) -> AsyncIterator[Event]:
        """All events up to the Completion; cancels the request if the consumer stops early."""
        try:
            while (event := await self.next()) is not None:
                yield event
                if isinstance(event, Completion):
                    return
        finally:
            self.cancel()

    async def running(self, request: Request | None = None) -> None:
        """Wait until an engine lane takes the request (before any response is sent, so that a
        request that never gets a lane still answers with its HTTP status: a queue timeout raises
        here); cancels on error or when the client disconnects meanwhile."""
        await self._watch(self._lane_taken(), request)

    async def complete(self, request: Request | None = None) -> Completion:
        """Run to the end; cancels on error or when the client disconnects meanwhile."""
        try:
            return await self._watch(self._last(), request)
        finally:
            self.cancel()

    async def _lane_taken(self) -> None:
        """Until the stream's `started` is set or its first item arrives (an error raises)."""
        getter = asyncio.ensure_future(self._queue.get())
        try:
            while not getter.done() and not self.stream.started.is_set():
                await asyncio.wait({getter}, timeout=_START_POLL_S)
        finally:
            if getter.done() and not getter.cancelled():
                self._early = getter
            else:
                getter.cancel()
        if self._early is not None and isinstance(item := self._early.result(), BaseException):
            self._early = None
            raise item

    async def _watch(self, work: Awaitable[Any], request: Request | None) -> Any:
        """Await `work`, raising 499 as soon as the client disconnects; cancels the request on any error."""
        waiter = asyncio.ensure_future(work)
        gone = asyncio.ensure_future(_disconnect(request)) if request is not None else None
        try:
            await asyncio.wait({waiter} if gone is None else {waiter, gone}, return_when=asyncio.FIRST_COMPLETED)
            if waiter.done():
                return waiter.result()
            raise ApiError(499, "client disconnected")
        except BaseException:
            self.cancel()
            raise
        finally:
            for task in (waiter, gone):
                if task is not None and not task.done():
                    task.cancel()

    async def _last(self) -> Completion:
        async for event in self.events():
            if isinstance(event, Completion):
                return event
        raise ApiError(500, "generation ended without a result; the server log has the details")
