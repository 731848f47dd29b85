"""Live test servers for tests/test_server_*.py: real uvicorn on 127.0.0.1 in a thread, one per kind.

- `reference()`: the tiny-dense preset (random weights) on the numpy reference executor, 2 lanes.
- `scripted()`: the same tokenizer and template, but a `FakeExecutor` that emits whatever token
  sequence a test sets with `script_text(...)` (the random model never writes a tool call by
  itself, so tool-call round trips script the model's output; everything above the executor
  — engine, pipeline, parsers, HTTP — is the real code).
- `slow()`: a scripted executor that takes `SLOW_DELAY` s per token, for cancellation tests.
- `slow_prefill()`: one lane, prompts prefilled in chunks of `PREFILL_CHUNK` tokens that take
  `PREFILL_DELAY` s each (a long prompt is a long prefill), for streams that open before the
  first token and disconnects during the prefill.
- `tight()`: one lane, one queue slot and a short queue wait, with a gate on the executor's
  steps, for the 429 / 503 answers.
- `guarded()`: the reference deployment behind an API key, a 4 KiB body limit and CORS.

Servers start once per test process and live until it exits.
"""

from __future__ import annotations

import functools
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from fake_executor import FakeConfig, FakeExecutor
from inferno.checkpoint.source import open_model
from inferno.checkpoint.synth import synthesize
from inferno.model.reference import ReferenceExecutor
from inferno.server.app import create_app
from inferno.server.service import Deployment, build_deployment

MODEL_ID = "demo"
API_KEY = "test-key-123"
BODY_LIMIT = 4096
CORS_ORIGIN = "https://app.example"
SLOW_DELAY = 0.01
PREFILL_CHUNK = 4
PREFILL_DELAY = 0.05


@dataclass
class Live:
    deployment: Deployment
    port: int
    executor: object

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def script_text(self, text: str) -> None:
        """Make the scripted executor answer `text` (then EOS), whatever the prompt."""
        self.executor.script = self.deployment.pipeline.tokenizer.encode(text)

    def last_prompt(self) -> str:
        """The prompt text of the scripted executor's latest request."""
        state = self.executor.states[-1]
        return self.deployment.pipeline.tokenizer.decode(list(state.tokens[: state.n_prompt]))

    def idle(self, timeout: float = 10.0) -> bool:
        """Wait until the engine has no running or waiting request."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.deployment.pipeline.engine.load() == (0, 0):
                return True
            time.sleep(0.02)
        return False


@functools.cache
def model_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="inferno-server-test-")) / "demo"
    synthesize("tiny-dense", path, seed=0)
    return path


def _serve(deployment: Deployment, executor: object, **app_kw) -> Live:
    app = create_app(deployment, **app_kw)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    end = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > end or not thread.is_alive():
            raise RuntimeError("test server did not start")
        time.sleep(0.01)
    return Live(deployment, sock.getsockname()[1], executor)


class SlowPrefillExecutor(FakeExecutor):
    """A `FakeExecutor` whose every prefill call takes `PREFILL_DELAY` s more."""

    def prefill(self, tokens, state):
        time.sleep(PREFILL_DELAY)
        return super().prefill(tokens, state)


def _fake(delay: float = 0.0, executor_type: type[FakeExecutor] = FakeExecutor, **kw) -> tuple[Deployment, FakeExecutor]:
    source = open_model(model_dir())
    cfg = source.config
    executor = executor_type(FakeConfig(vocab=cfg.vocab, eos_token_ids=cfg.eos_token_ids, max_position=4096), script=[], delay=delay)
    kw = {"max_context": 1024, "pending_timeout": 5.0, **kw}
    return build_deployment(source, executor, model_id=MODEL_ID, **kw), executor


@functools.cache
def _reference_deployment() -> tuple[Deployment, ReferenceExecutor]:
    source = open_model(model_dir())
    executor = ReferenceExecutor(source.config, source.weights)
    return build_deployment(source, executor, model_id=MODEL_ID, max_context=512, max_concurrency=2, default_max_tokens=16), executor


@functools.cache
def reference() -> Live:
    return _serve(*_reference_deployment())


@functools.cache
def guarded() -> Live:
    return _serve(*_reference_deployment(), api_key=API_KEY, max_request_bytes=BODY_LIMIT, cors=[CORS_ORIGIN])


@functools.cache
def scripted() -> Live:
    return _serve(*_fake())


@functools.cache
def slow() -> Live:
    deployment, executor = _fake(delay=SLOW_DELAY)
    live = _serve(deployment, executor)
    live.script_text("a " * 2000)
    return live


@functools.cache
def slow_prefill() -> Live:
    live = _serve(*_fake(executor_type=SlowPrefillExecutor, prefill_chunk=PREFILL_CHUNK))
    live.script_text("c " * 20)
    return live


@functools.cache
def tight() -> Live:
    """One lane, one queue slot, 0.5 s queue wait; its executor's steps wait for `executor.gate`."""
    deployment, executor = _fake(max_pending=1, pending_timeout=0.5)
    executor.gate = threading.Event()
    executor.gate.set()
    live = _serve(deployment, executor)
    live.script_text("b " * 50)
    return live
