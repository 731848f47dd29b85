"""`inferno run` end to end (subprocess) on the tiny synthetic presets with the reference executor."""

import json
import os
import re
import subprocess
import sys

import pytest

from inferno.checkpoint.synth import synthesize
from conftest import gpu_available

NO_GPU_ONLY = pytest.mark.skipif(gpu_available(), reason="checks the refusal on a machine without a GPU")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("inferno-cache")


def inferno(*args, cache, stdin=""):
    env = {**os.environ, "INFERNO_CACHE": str(cache)}
    return subprocess.run(
        [sys.executable, "-m", "inferno", "run", *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def stats_line(stderr):
    return [line for line in stderr.splitlines() if "completion tokens" in line][-1]


def test_demo_synthesizes_once_and_runs(cache):
    first = inferno("--max-new", 6, "--seed", 1, cache=cache)
    assert first.returncode == 0, first.stderr
    assert "RANDOM weights" in first.stderr and "synthesizing the demo model" in first.stderr
    assert "numpy reference" in first.stderr
    assert (cache / "demo.ninfer").is_file()
    assert not any(p.name.startswith("demo.tmp") for p in cache.iterdir())
    # thinking is on by default: reasoning goes to stderr between markers, the answer to stdout
    m = re.search(r"(\d+) completion tokens \((\d+) reasoning\), finish: (\w+)", stats_line(first.stderr))
    completion, reasoning, finish = int(m[1]), int(m[2]), m[3]
    assert completion == 6 or finish == "stop"
    assert 0 < reasoning <= completion
    assert "[reasoning]\n" in first.stderr and "[/reasoning]" in first.stderr
    assert (first.stdout == "") == (reasoning == completion)
    again = inferno("--max-new", 6, "--seed", 1, cache=cache)
    assert again.returncode == 0 and "synthesizing" not in again.stderr
    assert again.stdout == first.stdout


def test_greedy_no_thinking_streams_content_and_reports_speed(cache):
    a = inferno("--prompt", "Hello", "--max-new", 8, "--greedy", "--no-thinking", cache=cache)
    b = inferno("--prompt", "-", "--max-new", 8, "--greedy", "--no-thinking", "--prefill-chunk", 3, cache=cache, stdin="Hello")
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout  # the prompt from stdin, prefilled in chunks of 3, gives the same tokens
    line = stats_line(a.stderr)
    assert "(0 reasoning)" in line and "prefill" in line and "tok/s" in line and "decode" in line


def test_seeds_change_sampled_text(cache):
    a = inferno("--max-new", 12, "--seed", 1, "--no-thinking", "--temperature", 1.5, "--top-k", 0, "--top-p", 1, cache=cache)
    b = inferno("--max-new", 12, "--seed", 2, "--no-thinking", "--temperature", 1.5, "--top-k", 0, "--top-p", 1, cache=cache)
    assert a.returncode == b.returncode == 0
    assert a.stdout != b.stdout


def test_explicit_target_raw_prompt_and_messages_file(cache, tmp_path):
    model = synthesize("tiny-moe", tmp_path / "tiny-moe", seed=3)
    raw = inferno(model, "--raw", "--prompt", "Once upon a time", "--max-new", 4, "--greedy", cache=cache)
    assert raw.returncode == 0, raw.stderr
    assert "loaded tiny-moe" in raw.stderr and "RANDOM" not in raw.stderr
    msgs = tmp_path / "messages.json"
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    msgs.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}], "tools": [tool]}))
    chat = inferno(model, "--messages", msgs, "--max-new", 4, "--stop", "x", "--stop", "y", cache=cache)
    assert chat.returncode == 0, chat.stderr
    assert "completion tokens" in chat.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        pytest.param(["--device", "cuda"], 2, "no NVIDIA GPU is visible", marks=NO_GPU_ONLY),
        (["--device", "tpu"], 2, "--device must be one of"),
        (["--top-p", "3"], 2, "top_p must be in (0, 1]"),
        (["--temperature", "-1"], 2, "temperature must be >= 0"),
        (["--max-new", "0"], 2, "--max-new must be >= 1"),
        (["--prefill-chunk", "0"], 2, "--prefill-chunk takes 'auto' or a token count 1..65535"),
        (["--prefill-chunk", "big"], 2, "--prefill-chunk takes 'auto' or a token count 1..65535"),
        (["--prompt", "a", "--messages", "m.json"], 2, "either --prompt or --messages"),
        (["--messages", "/nonexistent.json"], 2, "cannot read --messages file"),
        (["/nonexistent-model", "--prompt", "hi"], 2, "does not exist"),
        (["--max-new", "100", "--max-context", "64"], 2, "exceeds the context limit of 64"),
    ],
)
def test_bad_input_is_one_error_line(cache, args, code, message):
    r = inferno(*args, cache=cache)
    assert r.returncode == code
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], r.stderr
    assert "Traceback" not in r.stderr
