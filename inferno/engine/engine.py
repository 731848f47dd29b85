"""`Engine`: runs generation requests on one executor with 1..8 concurrent lanes.

Design (simple and correct first):
- One worker thread per lane. A lane takes the oldest waiting request, runs the whole
  generation loop for it (`inferno.engine.generate`) with its own executor `State`, then takes
  the next one.
- Every executor call (new_state / prefill chunk / step / release) holds one executor lock, so
  lanes interleave at chunk and token granularity on an executor that runs one call at a time
  (the numpy reference today). A batching GPU scheduler will replace the lock with one batched
  step per round; the request/stream interface stays.
- Admission is bounded: at most `max_concurrency` running plus `max_pending` waiting requests;
  beyond that `generate` raises `EngineBusyError` at once. A request that waits longer than
  `pending_timeout` seconds for a lane raises `QueueTimeoutError` from the stream instead.
- The final event (finish reason + stats) is delivered after the request's state is released
  and its lane is free again.
- `generate` validates the request before queueing it (context limit, token ids) and returns a
  `TokenStream`. Closing the stream (or setting the caller's `cancel` event, e.g. on a client
  disconnect) cancels the request: a waiting one never starts, a running one stops at the next
  chunk or token with finish reason "cancelled" and its state is released.
- `TokenStream.started` is set the moment a lane takes the request (before its prefill), so a
  caller can tell "still queued" from "running" without waiting for the first token.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque

from inferno.engine.errors import EngineBusyError, EngineClosedError, EngineConfigError, QueueTimeoutError
from inferno.engine.generate import Cancel, check_request, generate
from inferno.engine.params import GenerationRequest, TokenEvent
from inferno.model.executor import Executor

MAX_CONCURRENCY = 8
DEFAULT_PREFILL_CHUNK = 1024

_STARTED = object()  # queued by the lane when it takes the request
_POLL_S = 0.05  # how often a stream waiting for a lane checks its cancel event and deadline


class _Job:
    """A request and its hand-off between the caller's stream and a lane."""

    def __init__(self, request: GenerationRequest, cancel: Cancel | None):
        self.request = request
        self.user_cancel = cancel
        self.closed = threading.Event()  # the consumer closed its stream
        self.started = threading.Event()  # a lane took the request
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.enqueued_at = time.perf_counter()
        self._lock = threading.Lock()
        self._phase = "pending"  # -> "running" (a lane took it) | "dropped" (timed out / closed first)

    def is_set(self) -> bool:
        """Cancellation as seen by the generation loop."""
        return self.closed.is_set() or (self.user_cancel is not None and self.user_cancel.is_set())

    def claim(self) -> bool:
        with self._lock:
            if self._phase != "pending":
                return False
            self._phase = "running"
            return True

    def waiting(self) -> bool:
        """Still waiting for a lane; a cancelled waiting job is withdrawn here."""
        if self.is_set() and self.drop():
            self.events.put(TokenEvent(None, "cancelled"))
        return self._phase == "pending"

    def drop(self) -> bool:
        """Withdraw a job that no lane has taken yet; False when it is already running."""
        with self._lock:
            if self._phase != "pending":
                return False
            self._phase = "dropped"
            return True


class TokenStream:
    """Iterator over one request's `TokenEvent`s; closing it cancels the request."""

    def __init__(self, job: _Job, pending_timeout: float | None):
        self._job = job
        self.started = job.started  # set (from a lane's thread) when a lane takes the request
        self._deadline = None if pending_timeout is None else job.enqueued_at + pending_timeout
        self._started = False
        self._done = False

    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> TokenEvent:
        if self._done:
            raise StopIteration
        item = self._job.events.get() if self._started else self._wait_for_lane()
        if item is _STARTED:
            self._started = True
            item = self._job.events.get()
        if isinstance(item, BaseException):
            self._done = True
            raise item
        if item.finish_reason is not None:
            self._done = True
        return item

    def _wait_for_lane(self) -> object:
        """The first item from the lane; checks cancellation and the deadline while waiting."""
        job = self._job
        while True:
            wait = _POLL_S if self._deadline is None else min(_POLL_S, self._deadline - time.perf_counter())
            try:
                return job.events.get(timeout=max(0.0, wait))
            except queue.Empty:
                pass
            if job.is_set() and job.drop():
                return TokenEvent(None, "cancelled")
            if self._deadline is not None and time.perf_counter() >= self._deadline and job.drop():
                self._done = True
                waited = time.perf_counter() - job.enqueued_at
                raise QueueTimeoutError(
                    f"no generation lane became free within {waited:.1f} s; retry later "
                    "or start the server with a higher --max-concurrency or --pending-timeout"
                ) from None
            # else: still waiting, or a lane took it just now and its first item is on the way

    def close(self) -> None:
        """Stop the request (if still running) and drop its remaining events."""
        self._done = True
        self._job.drop()
        self._job.closed.set()

    def __enter__(self) -> TokenStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class Engine:
    """Token-level generation over one executor, thread-safe, with bounded admission."""

    def __init__(
        self,
        executor: Executor,
        max_concurrency: int = 1,
        *,
        max_pending: int = 16,
        pending_timeout: float | None = 30.0,
        max_context: int | None = None,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    ):
        if not 1 <= max_concurrency <= MAX_CONCURRENCY:
            raise EngineConfigError(f"max concurrency must be in 1..{MAX_CONCURRENCY}, got {max_concurrency}")
        if max_pending < 0:
            raise EngineConfigError(f"max pending requests must be >= 0, got {max_pending}")
        if pending_timeout is not None and pending_timeout <= 0:
            raise EngineConfigError(f"pending timeout must be > 0 seconds, got {pending_timeout}")
        if prefill_chunk < 1:
            raise EngineConfigError(f"prefill chunk must be >= 1 token, got {prefill_chunk}")
        limit = executor.config.max_position
        max_context = limit if max_context is None else max_context
        if not 2 <= max_context <= limit:
            raise EngineConfigError(f"max context must be in 2..{limit} (the model's max position), got {max_context}")
        self.executor = executor
        self.max_concurrency = max_concurrency
        self.max_pending = max_pending
        self.pending_timeout = pending_timeout
        self.max_context = max_context
        self.prefill_chunk = prefill_chunk
        self._executor_lock = threading.Lock()
        self._cond = threading.Condition()
        self._waiting: deque[_Job] = deque()
        self._running: set[_Job] = set()
        self._closed = False
        self._lanes = [
            threading.Thread(target=self._lane, name=f"inferno-lane-{i}", daemon=True) for i in range(max_concurrency)
        ]
        for t in self._lanes:
            t.start()

    def generate(self, request: GenerationRequest, cancel: Cancel | None = None) -> TokenStream:
        """Queue `request`; iterate the returned stream for its tokens.

        Raises at once (nothing queued): `RequestError` / `ContextLengthError` for a request the
        model cannot run, `EngineBusyError` when lanes and queue are full, `EngineClosedError`.
        """
        check_request(request, self.executor.config.vocab, self.max_context)
        job = _Job(request, cancel)
        with self._cond:
            if self._closed:
                raise EngineClosedError("the engine is shut down; start a new one")
            self._waiting = deque(j for j in self._waiting if j.waiting())
            if len(self._running) + len(self._waiting) >= self.max_concurrency + self.max_pending:
                raise EngineBusyError(
                    f"all {self.max_concurrency} lanes and {self.max_pending} queue slots are busy; retry later"
                )
            self._waiting.append(job)
            self._cond.notify()
        return TokenStream(job, self.pending_timeout)

    def load(self) -> tuple[int, int]:
        """(running, waiting) request counts right now."""
        with self._cond:
            return len(self._running), len(self._waiting)

    def close(self) -> None:
        """Refuse new requests, cancel waiting and running ones, and stop the lanes."""
        with self._cond:
            self._closed = True
            for job in self._waiting:
                if job.drop():
                    job.events.put(EngineClosedError("the engine was shut down before this request started"))
            self._waiting.clear()
            for job in self._running:
                job.closed.set()
            self._cond.notify_all()
        for t in self._lanes:
            if t is not threading.current_thread():
                t.join()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next_job(self) -> _Job | None:
        with self._cond:
            while True:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return None
                job = self._waiting.popleft()
                if job.claim():
                    self._running.add(job)
                    job.started.set()
                    return job

    def _lane(self) -> None:
        while (job := self._next_job()) is not None:
            job.events.put(_STARTED)
            final: TokenEvent | Exception | None = None
            try:
                events = generate(
                    self.executor,
                    job.request,
                    prefill_chunk=self.prefill_chunk,
                    cancel=job,
                    lock=self._executor_lock,
                    queue_s=time.perf_counter() - job.enqueued_at,
                )
                for event in events:
                    if event.finish_reason is None:
                        job.events.put(event)
                    else:
                        final = event  # delivered once the state is released
            except Exception as exc:  # handed to the consumer, who re-raises it
                final = exc
            finally:
                with self._cond:
                    self._running.discard(job)
                job.events.put(final)
