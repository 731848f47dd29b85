"""Errors raised by the engine for requests it cannot take.

All derive from `InfernoError` (one-line message that says what to do). The server maps them to
its API error shapes: `SamplingError` and `ContextLengthError` are bad requests (HTTP 400),
`EngineBusyError` means every lane and queue slot is taken (HTTP 429, code `server_overloaded`),
`QueueTimeoutError` means the request waited too long for a lane (HTTP 503, code
`request_queue_timeout`), `EngineClosedError` means the engine was shut down (HTTP 503).
"""

from inferno.errors import InfernoError


class EngineError(InfernoError):
    """Base class of the engine's user-facing errors."""


class SamplingError(EngineError):
    """A sampling parameter out of range."""


class ContextLengthError(EngineError):
    """Prompt plus requested new tokens do not fit in the context limit."""


class EngineBusyError(EngineError):
    """All lanes are busy and the pending queue is full."""


class QueueTimeoutError(EngineError):
    """The request waited longer than the pending timeout without getting a lane."""


class EngineClosedError(EngineError):
    """The engine has been closed and takes no more requests."""


class RequestError(EngineError):
    """A malformed token-level request (empty prompt, token id outside the vocabulary)."""


class EngineConfigError(EngineError):
    """An engine setting out of range (concurrency, queue, context, prefill chunk)."""
