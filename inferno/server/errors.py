"""API errors: one exception type, rendered in each API's own JSON error shape.

OpenAI: `{"error": {"message", "type", "param", "code"}}`.
Anthropic: `{"type": "error", "error": {"type", "message"}}`.

`api_error(exc)` maps any exception to an `ApiError`: Inferno's user errors keep their one-line
message (engine busy -> 429, queue timeout / shut down -> 503, everything else a user can cause
-> 400); anything else becomes a 500 whose message never carries a traceback.
"""

from __future__ import annotations

import logging
from typing import Literal

from starlette.responses import JSONResponse

from inferno.engine import EngineBusyError, EngineClosedError, QueueTimeoutError
from inferno.errors import InfernoError

Api = Literal["openai", "anthropic"]

log = logging.getLogger("inferno.server")

#: HTTP status -> Anthropic error type.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}

#: HTTP status -> OpenAI error type.
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "server_overloaded",
    500: "server_error",
    503: "server_overloaded",
}


class ApiError(Exception):
    """An HTTP error answer: status, one-line message, and the optional offending parameter."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self, api: Api) -> dict:
        if api == "anthropic":
            return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(self.status, "api_error"), "message": self.message}}
        return {
            "error": {
                "message": self.message,
                "type": _OPENAI_TYPES.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self, api: Api) -> JSONResponse:
        return JSONResponse(self.body(api), status_code=self.status)


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def api_error(exc: BaseException) -> ApiError:
    """The HTTP answer for an exception raised while serving a request."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, EngineBusyError):
        return ApiError(429, str(exc), code="server_overloaded")
    if isinstance(exc, QueueTimeoutError):
        return ApiError(503, str(exc), code="request_queue_timeout")
    if isinstance(exc, EngineClosedError):
        return ApiError(503, str(exc), code="server_shutting_down")
    if isinstance(exc, InfernoError):
        return ApiError(400, str(exc))
    log.error("unexpected error while serving a request", exc_info=exc)
    return ApiError(500, "internal server error; the server log has the details", code="internal_error")


def api_of_path(path: str) -> Api:
    """Which API's error shape a request path expects."""
    return "anthropic" if path.startswith("/v1/messages") else "openai"
