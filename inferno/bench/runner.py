"""Timed generations through the engine's loop: warm-up, repetitions, median and spread.

Each repetition is one request through `inferno.engine.generate` (the loop `inferno run` and the
server use): a fixed random prompt of P tokens prefilled in chunks, then greedy decoding of D
tokens with `ignore_eos`, so every repetition does exactly the same work. Its `GenerationStats`
give the seed metrics (DESIGN.md): prefill tok/s = P / prefill s, decode tok/s = (D - 1) /
decode s. The ratios compare them with the limits measured in the same run (`limits.py`) using
the byte and FLOP counts of `accounting.py`; without a measured limit a ratio is None.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from inferno.bench.accounting import Accounting
from inferno.bench.limits import Limits
from inferno.bench.profile import KernelProfiler, kernel_rows
from inferno.engine.generate import check_request, generate
from inferno.engine.params import GenerationRequest, GenerationStats, SamplingParams
from inferno.errors import UsageError
from inferno.model.executor import Executor

Log = Callable[[str], None]


@dataclass(frozen=True)
class BenchSettings:
    """What to measure: one case per prompt length in `cases` (the prompt tokens, then the contexts)."""

    prompt_tokens: int
    decode_tokens: int
    contexts: tuple[int, ...] = ()
    reps: int = 3
    warmup: int = 1
    prefill_chunk: int = 1024
    seed: int = 0
    kernel_table: bool = False

    def __post_init__(self) -> None:
        for flag, value, low in (("--prompt-tokens", self.prompt_tokens, 1), ("--decode-tokens", self.decode_tokens, 2),
                                 ("--reps", self.reps, 1), ("--warmup", self.warmup, 0),
                                 ("--prefill-chunk", self.prefill_chunk, 1)):
            if value < low:
                raise UsageError(f"{flag} must be >= {low}, got {value}")
        for c in self.contexts:
            if c < 1:
                raise UsageError(f"--contexts takes positive token counts, got {c}")

    @property
    def cases(self) -> tuple[int, ...]:
        """Prompt lengths to run, in order, without repeats."""
        return tuple(dict.fromkeys((self.prompt_tokens, *self.contexts)))

    @property
    def max_tokens(self) -> int:
        """Longest sequence any case needs (prompt + decode)."""
        return max(self.cases) + self.decode_tokens


def spread(values: Sequence[float]) -> dict:
    """Median, min, max, sample standard deviation (0 for one value) and count."""
    vals = [float(v) for v in values]
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals),
            "stdev": statistics.stdev(vals) if len(vals) > 1 else 0.0, "n": len(vals)}


def prompt_ids(vocab: int, n: int, seed: int) -> list[int]:
    """A fixed pseudo-random prompt of `n` token ids (the same for every repetition)."""
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def time_generation(executor: Executor, prompt: Sequence[int], decode_tokens: int, prefill_chunk: int) -> GenerationStats:
    """One greedy request of exactly `decode_tokens` new tokens; its stats."""
    request = GenerationRequest(prompt, decode_tokens, SamplingParams(temperature=0.0), ignore_eos=True)
    check_request(request, executor.config.vocab, executor.config.max_position)
    last = None
    for event in generate(executor, request, prefill_chunk=prefill_chunk):
        last = event
    if last is None or last.finish_reason != "length" or last.stats is None:
        raise RuntimeError(f"benchmark request ended with {last!r}, expected {decode_tokens} tokens")
    return last.stats


def run_case(executor: Executor, acct: Accounting, limits: Limits, prompt_tokens: int,
             settings: BenchSettings, log: Log) -> dict:
    """Warm-up + repetitions at one prompt length; medians, spreads and ratios to the limits."""
    prompt = prompt_ids(executor.config.vocab, prompt_tokens, settings.seed)
    d = settings.decode_tokens
    samples = []
    total = settings.warmup + settings.reps
    for i in range(total):
        warm = i < settings.warmup
        which = f"warm-up {i + 1}/{settings.warmup}" if warm else f"rep {i + 1 - settings.warmup}/{settings.reps}"
        st = time_generation(executor, prompt, d, settings.prefill_chunk)
        log(f"  {prompt_tokens} + {d} tokens, {which}: prefill {st.prefill_tok_s:,.1f} tok/s, "
            f"decode {st.decode_tok_s:,.1f} tok/s")
        if i >= settings.warmup:
            samples.append(st)
    prefill_tok_s = spread([s.prefill_tok_s for s in samples])
    decode_tok_s = spread([s.decode_tok_s for s in samples])
    prefill_s = spread([s.prefill_s for s in samples])
    decode_s = spread([s.decode_s for s in samples])

    flops = acct.prefill_flops(prompt_tokens, settings.prefill_chunk)
    tflops = flops / prefill_s["median"] / 1e12 if prefill_s["median"] > 0 else None
    dbytes = acct.decode_bytes(prompt_tokens, d)
    gbps = dbytes / decode_s["median"] / 1e9 if decode_s["median"] > 0 else None
    roofline = (d - 1) / (dbytes / (limits.copy_gbps * 1e9)) if limits.copy_gbps else None
    return {
        "prompt_tokens": prompt_tokens,
        "decode_tokens": d,
        "prefill": {"tok_s": prefill_tok_s, "seconds": prefill_s},
        "decode": {"tok_s": decode_tok_s, "seconds": decode_s},
        "prefill_flops": flops,
        "prefill_tflops": tflops,
        "prefill_mma_ratio": tflops / limits.gemm_tflops if tflops is not None and limits.gemm_tflops else None,
        "decode_bytes_per_step": dbytes / (d - 1),
        "decode_gbps": gbps,
        "decode_roofline_tok_s": roofline,
        "decode_roofline_ratio": decode_tok_s["median"] / roofline if roofline else None,
        "samples": [{"prefill_s": s.prefill_s, "decode_s": s.decode_s, "completion_tokens": s.completion_tokens}
                    for s in samples],
    }


def profile_kernels(executor: Executor, limits: Limits, settings: BenchSettings, decode_step_wall_s: float | None,
                    log: Log) -> dict:
    """The per-kernel table of one decode step (after the prompt) and one prefill chunk.

    Needs an executor that implements `KernelProfiler`; otherwise says it is not available.
    Host overhead per decode step = wall time per step in the timed runs - device time of the
    profiled step (the sum of its kernels).
    """
    if not isinstance(executor, KernelProfiler):
        return {"available": False,
                "reason": f"{type(executor).__name__} has no per-kernel timing hooks (profile_step / profile_prefill)"}
    p = settings.prompt_tokens
    prompt = prompt_ids(executor.config.vocab, p + 1, settings.seed)
    log(f"kernel table: one decode step at context {p + 1}, one prefill chunk of {min(settings.prefill_chunk, p)} tokens")
    state = executor.new_state()
    try:
        for i in range(0, p, settings.prefill_chunk):
            executor.prefill(prompt[i:min(i + settings.prefill_chunk, p)], state)
        step = executor.profile_step(prompt[p], state)
    finally:
        executor.release(state)
    state = executor.new_state()
    try:
        chunk = executor.profile_prefill(prompt[:min(settings.prefill_chunk, p)], state)
    finally:
        executor.release(state)
    device_s = sum(t.seconds for t in step)
    return {
        "available": True,
        "decode_step": {"context": p + 1, "device_s": device_s,
                        "kernels": kernel_rows(step, limits.copy_gbps, limits.gemm_tflops)},
        "prefill_chunk": {"tokens": min(settings.prefill_chunk, p), "device_s": sum(t.seconds for t in chunk),
                          "kernels": kernel_rows(chunk, limits.copy_gbps, limits.gemm_tflops)},
        "decode_step_wall_s": decode_step_wall_s,
        "host_overhead_s_per_step": decode_step_wall_s - device_s if decode_step_wall_s is not None else None,
        "cuda_graph": getattr(executor, "cuda_graph", None),
    }


def run_bench(executor: Executor, acct: Accounting, limits: Limits, settings: BenchSettings, log: Log) -> dict:
    """Every case, then the kernel table if asked; the `runs` and `kernels` parts of the report."""
    runs = []
    for n in settings.cases:
        log(f"case: prompt {n} tokens, decode {settings.decode_tokens} tokens")
        runs.append(run_case(executor, acct, limits, n, settings, log))
    kernels = None
    if settings.kernel_table:
        wall = runs[0]["decode"]["seconds"]["median"] / (settings.decode_tokens - 1)
        kernels = profile_kernels(executor, limits, settings, wall, log)
    return {"runs": runs, "kernels": kernels}
