"""Every curl example in docs/serving.md runs as written against a live server and prints JSON or SSE.

The examples run on the scripted test server (same tokenizer, template, engine and HTTP code as
a real deployment; the executor answers a fixed text), with the doc's port replaced by the
server's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import server_harness as h

DOC = Path(__file__).resolve().parent.parent / "docs" / "serving.md"
DOC_URL = "http://127.0.0.1:8000"


def curl_blocks() -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    return [b for b in blocks if b.lstrip().startswith("curl ")]


def test_the_doc_has_curl_examples_for_every_api():
    text = "\n".join(curl_blocks())
    for path in ("/v1/models", "/v1/chat/completions", "/v1/responses", "/v1/responses/input_tokens", "/v1/messages", "/v1/messages/count_tokens", "/health"):
        assert DOC_URL + path in text, path


def check_output(out: str) -> None:
    out = out.strip()
    if out.startswith("{"):
        json.loads(out)
        return
    data = [line[6:] for line in out.splitlines() if line.startswith("data: ")]
    assert data, f"neither JSON nor SSE: {out[:200]!r}"
    for payload in data:
        if payload != "[DONE]":
            assert "error" not in json.loads(payload), payload


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def _id(block: str) -> str:
    path = re.search(r"127\.0\.0\.1:8000(\S*)", block)
    return (path.group(1) if path else "?") + (" stream" if '"stream": true' in block else "")


@pytest.mark.parametrize("block", curl_blocks(), ids=_id)
def test_curl_example_runs(block):
    live = h.scripted()
    live.script_text("A thought.</think>\n\nHello from the docs.")
    assert DOC_URL in block
    command = block.replace(DOC_URL, live.url)
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr + done.stdout
    check_output(done.stdout)
