"""`inferno run`: generate a reply to one prompt and stream it to the terminal.

stdout gets the answer text as it is produced (and parsed tool calls as JSON lines at the end);
stderr gets loading progress, the reasoning (dimmed on a terminal, marked otherwise) and the
counts and timings (prefill tok/s = prompt tokens / prefill s; decode tok/s = (completion
tokens - 1) / decode s). With no TARGET it runs the built-in demo: the tiny-dense synthetic
preset with random weights, synthesized once into the cache directory.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from inferno.cli.common import check_device, demo_model, load_model
from inferno.errors import UsageError

DEMO_PROMPT = "Write a short poem about fire."


def read_messages(path: str) -> tuple[list[dict], list[dict] | None]:
    """A JSON file holding a list of messages, or {"messages": [...], "tools": [...]}."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise UsageError(f"cannot read --messages file {path}: {e.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"--messages file {path} is not valid JSON ({e}); give a JSON list of messages") from None
    tools = None
    if isinstance(data, dict):
        tools = data.get("tools")
        data = data.get("messages")
    if not isinstance(data, list) or not data:
        raise UsageError(f"--messages file {path} must hold a non-empty JSON list of messages or {{\"messages\": [...]}}")
    if tools is not None and not isinstance(tools, list):
        raise UsageError(f"\"tools\" in {path} must be a JSON list of tool definitions")
    return data, tools


class _Reasoning:
    """Writes reasoning deltas to stderr: dimmed on a terminal, between markers otherwise."""

    def __init__(self, stream):
        self.stream = stream
        self.tty = stream.isatty()
        self.open = False

    def write(self, text: str) -> None:
        if not self.open:
            self.stream.write("\x1b[2m" if self.tty else "[reasoning]\n")
            self.open = True
        self.stream.write(text)
        self.stream.flush()

    def close(self) -> None:
        if self.open:
            self.stream.write("\x1b[0m\n" if self.tty else "\n[/reasoning]\n")
            self.stream.flush()
            self.open = False


def run(
    target: Optional[str] = typer.Argument(None, help="HF checkpoint directory or .ninfer file (none: random-weight demo)"),
    prompt: Optional[str] = typer.Option(None, "--prompt", "-p", help="user message (raw text with --raw); - reads stdin"),
    messages: Optional[str] = typer.Option(None, "--messages", help="JSON file: a list of messages, or {messages, tools}"),
    max_new: int = typer.Option(128, "--max-new", help="most tokens to generate"),
    max_context: int = typer.Option(2048, "--max-context", help="prompt + new tokens limit"),
    prefill_chunk: str = typer.Option(
        "auto", "--prefill-chunk",
        help="prompt tokens per prefill call: auto (GPU: the largest of 1024..8192 that fits; CPU: 1024) or N"),
    greedy: bool = typer.Option(False, "--greedy", help="always take the most likely token"),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="default: the model's preset"),
    top_p: Optional[float] = typer.Option(None, "--top-p"),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="0 disables"),
    min_p: Optional[float] = typer.Option(None, "--min-p"),
    presence_penalty: Optional[float] = typer.Option(None, "--presence-penalty"),
    frequency_penalty: Optional[float] = typer.Option(None, "--frequency-penalty"),
    seed: Optional[int] = typer.Option(None, "--seed", help="fixed sampling seed (default: random)"),
    stop: Optional[list[str]] = typer.Option(None, "--stop", help="stop string (repeatable)"),
    stop_token_id: Optional[list[int]] = typer.Option(None, "--stop-token-id", help="stop token id (repeatable)"),
    no_thinking: bool = typer.Option(False, "--no-thinking", help="answer without a reasoning block"),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda"),
    no_cuda_graph: bool = typer.Option(False, "--no-cuda-graph", help="GPU executor: no CUDA graph decode (no effect on the reference)"),
    raw: bool = typer.Option(False, "--raw", help="no chat template: continue the prompt text as is"),
) -> None:
    """Generate a reply to one prompt, streamed to stdout."""
    sampling = {
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": min_p,
        "presence_penalty": presence_penalty,
        "frequency_penalty": frequency_penalty,
        "seed": seed,
    }
    chunk = _check_flags(device, prompt, messages, raw, max_new, max_context, prefill_chunk, sampling)
    tools = None
    if prompt == "-":
        prompt = sys.stdin.read()
    if messages is not None:
        chat, tools = read_messages(messages)
    else:
        if prompt is None:
            if target is not None:
                raise UsageError("give --prompt TEXT or --messages FILE")
            prompt = DEMO_PROMPT
        chat = [{"role": "user", "content": prompt}]

    from inferno.engine import Engine
    from inferno.frontend.pipeline import TextPipeline

    source, executor, chunk = _load(target, device, max_context, not no_cuda_graph, chunk)
    with Engine(executor, max_context=max_context, prefill_chunk=chunk) as engine:
        pipeline = TextPipeline.from_resources(
            engine, source.resources, source.identity, sampling_defaults=sampling, greedy=greedy
        )
        limits = dict(max_new_tokens=max_new, stop=stop or (), stop_token_ids=stop_token_id or ())
        if raw:
            stream = pipeline.complete(prompt, **limits)
        else:
            stream = pipeline.chat(chat, tools=tools, thinking=not no_thinking, **limits)
        done = _print_stream(stream)
    if done is not None:
        _report(done)


def _log(msg: str) -> None:
    print(f"inferno: {msg}", file=sys.stderr, flush=True)


def _check_flags(device, prompt, messages, raw, max_new, max_context, prefill_chunk, sampling) -> int | None:
    """Flag errors before anything is loaded; the prefill chunk (None: auto)."""
    from inferno.bench.prefill_chunk import parse_prefill_chunk
    from inferno.engine import SamplingParams

    check_device(device)
    if prompt is not None and messages is not None:
        raise UsageError("give either --prompt or --messages, not both")
    if raw and messages is not None:
        raise UsageError("--raw takes --prompt text; --messages needs the chat template")
    for flag, value, low in (("--max-new", max_new, 1), ("--max-context", max_context, 2)):
        if value < low:
            raise UsageError(f"{flag} must be >= {low}, got {value}")
    SamplingParams(**{k: v for k, v in sampling.items() if v is not None})  # range errors
    return parse_prefill_chunk(prefill_chunk)


def _load(target: str | None, device: str, max_context: int, cuda_graph: bool, prefill_chunk: int | None):
    """Open the model (the demo when no target) and build its executor; (source, executor, prefill chunk)."""
    if target is None:
        _log("no model given: running the built-in demo, a tiny model with RANDOM weights, so its text is gibberish")
        path = demo_model(_log)
    else:
        path = Path(target)
    t0 = time.perf_counter()
    _log(f"loading {path} ...")
    loaded = load_model(path, device, max_seqs=1, max_context=max_context, cuda_graph=cuda_graph, log=_log,
                        prefill_chunk=prefill_chunk)
    _log(f"loaded {loaded.source.identity} on the {loaded.kind} executor in {time.perf_counter() - t0:.1f} s")
    return loaded.source, loaded.executor, loaded.prefill_chunk


def _print_stream(stream):
    """Answer text to stdout as it comes, reasoning to stderr; returns the Completion."""
    from inferno.frontend.pipeline import Completion

    reasoning = _Reasoning(sys.stderr)
    done = None
    try:
        for event in stream:
            if isinstance(event, Completion):
                done = event
            elif event.channel == "reasoning":
                reasoning.write(event.text)
            else:
                reasoning.close()
                sys.stdout.write(event.text)
                sys.stdout.flush()
    finally:
        stream.close()
        reasoning.close()
    return done


def _report(done) -> None:
    """Tool calls (JSON lines) to stdout; counts and speeds to stderr."""
    if done.content and not done.content.endswith("\n"):
        sys.stdout.write("\n")
    for call in done.tool_calls:
        sys.stdout.write(json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False) + "\n")
    sys.stdout.flush()
    u, st = done.usage, done.stats
    timing = ""
    if st is not None:
        timing = (
            f"; prefill {st.prefill_s:.2f} s ({st.prefill_tok_s:.1f} tok/s)"
            f", decode {st.decode_s:.2f} s ({st.decode_tok_s:.1f} tok/s)"
        )
    _log(
        f"{u.prompt_tokens} prompt + {u.completion_tokens} completion tokens "
        f"({u.reasoning_tokens} reasoning), finish: {done.finish_reason}{timing}"
    )
