"""`inferno serve`: an HTTP server speaking OpenAI Chat Completions + Responses and Anthropic Messages.

With no TARGET it serves the same built-in demo as `inferno run` (tiny random-weight model).
See docs/serving.md for the endpoints and examples.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from inferno.bench.prefill_chunk import parse_prefill_chunk
from inferno.cli.common import check_device, demo_model, load_model
from inferno.errors import UsageError


def serve(
    target: Optional[str] = typer.Argument(None, help="HF checkpoint directory or .ninfer file (none: random-weight demo)"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0 for all interfaces)"),
    port: int = typer.Option(8000, "--port", help="TCP port"),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="INFERNO_API_KEY", help="require this key (Bearer or x-api-key)"),
    model_id: Optional[str] = typer.Option(None, "--model-id", help="model name clients use (default: the artifact's model_id / dir name)"),
    accept_any_model: bool = typer.Option(False, "--accept-any-model", help="answer whatever 'model' a request names"),
    max_context: int = typer.Option(8192, "--max-context", help="prompt + new tokens limit per request"),
    max_concurrency: int = typer.Option(1, "--max-concurrency", help="requests generated at once (1..8)"),
    max_pending: int = typer.Option(16, "--max-pending", help="requests that may wait for a lane; more answer 429"),
    pending_timeout: float = typer.Option(30.0, "--pending-timeout", help="seconds a request may wait for a lane; then 503"),
    max_request_mib: float = typer.Option(32.0, "--max-request-mib", help="largest request body; larger answer 413"),
    default_max_tokens: int = typer.Option(1024, "--default-max-tokens", help="new tokens when a request gives no limit"),
    response_store: int = typer.Option(256, "--response-store-max-records", help="Responses API results kept for previous_response_id"),
    cors: Optional[list[str]] = typer.Option(None, "--cors", help="allowed browser origin (repeatable; * for any)"),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda"),
    prefill_chunk: str = typer.Option(
        "auto", "--prefill-chunk",
        help="prompt tokens per prefill call: auto (GPU: the largest of 1024..8192 that fits; CPU: 1024) or N"),
    log_level: str = typer.Option("info", "--log-level", help="uvicorn log level"),
) -> None:
    """Serve a model over HTTP (OpenAI and Anthropic APIs)."""

    def log(msg: str) -> None:
        print(f"inferno: {msg}", file=sys.stderr, flush=True)

    check_device(device)
    chunk = parse_prefill_chunk(prefill_chunk)
    for flag, value, low, high in (
        ("--port", port, 0, 65535),
        ("--max-concurrency", max_concurrency, 1, 8),
        ("--max-pending", max_pending, 0, 100000),
        ("--max-context", max_context, 2, 1 << 24),
        ("--default-max-tokens", default_max_tokens, 1, 1 << 24),
        ("--response-store-max-records", response_store, 0, 1 << 20),
    ):
        if not low <= value <= high:
            raise UsageError(f"{flag} must be in {low}..{high}, got {value}")
    if not max_request_mib > 0:
        raise UsageError(f"--max-request-mib must be > 0, got {max_request_mib}")
    if not pending_timeout > 0:
        raise UsageError(f"--pending-timeout must be > 0 seconds, got {pending_timeout}")

    sock = _listen(host, port)  # before loading: a taken port fails fast
    import uvicorn

    from inferno.server.app import create_app
    from inferno.server.service import build_deployment

    if target is None:
        log("no model given: serving the built-in demo, a tiny model with RANDOM weights, so its text is gibberish")
        path = demo_model(log)
        model_id = model_id or "demo"
    else:
        path = Path(target)
    t0 = time.perf_counter()
    log(f"loading {path} ...")
    loaded = load_model(path, device, max_seqs=max_concurrency, max_context=max_context, cuda_graph=True, log=log,
                        prefill_chunk=chunk)
    source, executor = loaded.source, loaded.executor
    limit = source.config.max_position
    if max_context > limit:
        log(f"--max-context {max_context} is above the model's {limit} positions; using {limit}")
        max_context = limit
    deployment = build_deployment(
        source,
        executor,
        model_id=model_id,
        max_context=max_context,
        max_concurrency=max_concurrency,
        max_pending=max_pending,
        pending_timeout=pending_timeout,
        default_max_tokens=default_max_tokens,
        accept_any_model=accept_any_model,
        store_records=response_store,
        executor_name=loaded.kind,
        kv_dtype="bf16" if loaded.kind == "gpu" else "fp32",
        prefill_chunk=loaded.prefill_chunk,
    )
    log(f"loaded {source.identity} on the {loaded.kind} executor in {time.perf_counter() - t0:.1f} s; serving it as {deployment.model_id!r}")
    app = create_app(deployment, api_key=api_key, max_request_bytes=int(max_request_mib * (1 << 20)), cors=cors or ())
    port = sock.getsockname()[1]
    log(f"listening on http://{host}:{port} (OpenAI: /v1/chat/completions, /v1/responses; Anthropic: /v1/messages)")
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5))
    try:
        server.run(sockets=[sock])
    finally:
        deployment.pipeline.engine.close()


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or a UsageError saying why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port} ({e.strerror or e}); choose another --port or --host") from None
