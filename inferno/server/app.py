"""The starlette application: routes, API-key check, request size limit, CORS, error shapes.

Middleware order (outermost first): CORS (so browser preflights are answered without a key),
API key, body size limit, then the routes. Errors answer in the shape of the API the path
belongs to (`/v1/messages*` Anthropic, everything else OpenAI); an unexpected exception is
logged with its traceback on the server and answered 500 without one.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferno.server import anthropic_messages, models, openai_chat, openai_responses
from inferno.server.errors import ApiError, api_error, api_of_path
from inferno.server.service import Deployment

_OPEN_PATHS = ("/health",)


async def _send_error(scope: Scope, send: Send, error: ApiError) -> None:
    response = error.response(api_of_path(scope.get("path", "")))
    await response({"type": "http"}, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


class ApiKeyMiddleware:
    """401 unless the request carries the key (`Authorization: Bearer K` or `x-api-key: K`)."""

    def __init__(self, app: ASGIApp, api_key: str | None):
        self.app = app
        self.key = api_key.encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.key is None or scope["type"] != "http" or scope["path"] in _OPEN_PATHS:
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        given = headers.get(b"x-api-key")
        auth = headers.get(b"authorization", b"")
        if given is None and auth[:7].lower() == b"bearer ":
            given = auth[7:].strip()
        if given is None or not hmac.compare_digest(given, self.key):
            what = "missing" if given is None else "invalid"
            return await _send_error(scope, send, ApiError(401, f"{what} API key; send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'", code="invalid_api_key"))
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """413 for a request body over `max_bytes` (checked on Content-Length, and while reading)."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> ApiError:
        mib = self.max_bytes / (1 << 20)
        return ApiError(413, f"request body is larger than the server's limit of {mib:g} MiB; send less or raise --max-request-mib", code="request_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await _send_error(scope, send, self._too_large())
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await _send_error(scope, send, self._too_large())
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def health(request: Request) -> JSONResponse:
    running, waiting = request.app.state.deployment.pipeline.engine.load()
    return JSONResponse({"status": "ok", "model": request.app.state.deployment.model_id, "running": running, "waiting": waiting})


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    message = {404: f"no route {request.url.path}; see docs/serving.md for the endpoints", 405: f"method {request.method} is not allowed on {request.url.path}"}
    return ApiError(exc.status_code, message.get(exc.status_code, str(exc.detail))).response(api_of_path(request.url.path))


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    return api_error(exc).response(api_of_path(request.url.path))


def create_app(deployment: Deployment, *, api_key: str | None = None, max_request_bytes: int = 32 << 20, cors: Sequence[str] = ()) -> Starlette:
    """The ASGI app serving `deployment`."""
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models.list_models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", models.get_model, methods=["GET"]),
        Route("/v1/chat/completions", openai_chat.handle, methods=["POST"]),
        Route("/v1/responses", openai_responses.create, methods=["POST"]),
        Route("/v1/responses/input_tokens", openai_responses.input_tokens, methods=["POST"]),
        Route("/v1/responses/{response_id}", openai_responses.retrieve, methods=["GET"]),
        Route("/v1/responses/{response_id}", openai_responses.delete, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/input_items", openai_responses.input_items, methods=["GET"]),
        Route("/v1/messages", anthropic_messages.handle, methods=["POST"]),
        Route("/v1/messages/count_tokens", anthropic_messages.count_tokens, methods=["POST"]),
    ]
    middleware = []
    if cors:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(cors), allow_methods=["*"], allow_headers=["*"]))
    middleware += [Middleware(ApiKeyMiddleware, api_key=api_key), Middleware(BodyLimitMiddleware, max_bytes=max_request_bytes)]
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={HTTPException: _http_error, Exception: _server_error},
    )
    app.state.deployment = deployment
    return app
