"""`inferno serve` from the command line: flag errors, the not-built GPU path, and a real start."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
from conftest import gpu_available

NO_GPU_ONLY = pytest.mark.skipif(gpu_available(), reason="checks the refusal on a machine without a GPU")


def serve(*args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "inferno", "serve", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}, **kw,
    )


@pytest.mark.parametrize("args,code,words", [
    pytest.param(["--device", "cuda"], 2, "no NVIDIA GPU is visible", marks=NO_GPU_ONLY),
    (["--device", "tpu"], 2, "--device"),
    (["--max-concurrency", "9"], 2, "--max-concurrency"),
    (["--max-request-mib", "0"], 2, "--max-request-mib"),
    (["--port", "70000"], 2, "--port"),
    (["--prefill-chunk", "0"], 2, "--prefill-chunk takes 'auto' or a token count"),
])
def test_flag_errors(args, code, words):
    p = serve(*args)
    out, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    assert err.startswith("error: ") and words in err and "Traceback" not in err


def test_taken_port_is_a_clean_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        p = serve("--port", str(s.getsockname()[1]))
        _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and err.startswith("error: cannot listen on") and "Traceback" not in err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_demo_end_to_end(tmp_path):
    port = _free_port()
    p = serve("--port", str(port), "--api-key", "k", "--max-context", "256", env={"INFERNO_CACHE": str(tmp_path)})
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert p.poll() is None and time.monotonic() < end, "the server did not come up"
            time.sleep(0.1)
        auth = {"Authorization": "Bearer k"}
        models = httpx.get(url + "/v1/models", headers=auth).json()["data"]
        assert [m["id"] for m in models] == ["demo"] and models[0]["context_length"] == 256
        r = httpx.post(url + "/v1/chat/completions", headers=auth, timeout=60,
                       json={"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
    assert "RANDOM weights" in err and "Traceback" not in err
