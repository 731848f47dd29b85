"""Timed generations through the engine's loop: warm-up, repetitions, median and spread.

Each repetition is one request through `inferno.engine.generate` (the loop `inferno run` and the
server use): a fixed random prompt of P tokens prefilled in chunks, then greedy decoding of D
tokens with `ignore_eos`, so every repetition does exactly the same work. Its `GenerationStats`
give the seed metrics (DESIGN.md): prefill tok/s = P / prefill s, decode tok/s = (D - 1) /
decode s. The ratios compare them with the limits measured in the same run (`limits.py`) using
the byte and FLOP counts of `accounting.py`; without a measured limit a ratio is None.

Host overhead per decode step is measured in one more generation of the first case, through the
same loop, with a step timer watching the executor (`profile.host_overhead`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from inferno.bench.accounting import Accounting
from inferno.bench.clocks import ClockSampler
from inferno.bench.limits import Limits
from inferno.bench.profile import DECODE, KernelProfiler, StepTimer, host_overhead, kernel_rows
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


def time_generation(executor: Executor, prompt: Sequence[int], decode_tokens: int, prefill_chunk: int,
                    on_first_token: Callable[[], None] | None = None) -> GenerationStats:
    """One greedy request of exactly `decode_tokens` new tokens; its stats. `on_first_token` is
    called when the prefill's token arrives, before the first decode step."""
    request = GenerationRequest(prompt, decode_tokens, SamplingParams(temperature=0.0), ignore_eos=True)
    check_request(request, executor.config.vocab, executor.config.max_position)
    last = None
    for event in generate(executor, request, prefill_chunk=prefill_chunk):
        if last is None and on_first_token is not None:
            on_first_token()
        last = event
    if last is None or last.finish_reason != "length" or last.stats is None:
        raise RuntimeError(f"benchmark request ended with {last!r}, expected {decode_tokens} tokens")
    return last.stats


def run_case(executor: Executor, acct: Accounting, limits: Limits, prompt_tokens: int,
             settings: BenchSettings, log: Log, clocks: ClockSampler | None = None) -> dict:
    """Warm-up + repetitions at one prompt length; medians, spreads and ratios to the limits; with `clocks`, the
    GPU's clocks and power sampled over the timed repetitions (the run's `clocks`)."""
    prompt = prompt_ids(executor.config.vocab, prompt_tokens, settings.seed)
    d = settings.decode_tokens
    samples = []
    for i in range(settings.warmup):
        st = time_generation(executor, prompt, d, settings.prefill_chunk)
        log(f"  {prompt_tokens} + {d} tokens, warm-up {i + 1}/{settings.warmup}: prefill {st.prefill_tok_s:,.1f} "
            f"tok/s, decode {st.decode_tok_s:,.1f} tok/s")
    with clocks if clocks is not None else nullcontext():
        for i in range(settings.reps):
            st = time_generation(executor, prompt, d, settings.prefill_chunk)
            log(f"  {prompt_tokens} + {d} tokens, rep {i + 1}/{settings.reps}: prefill {st.prefill_tok_s:,.1f} "
                f"tok/s, decode {st.decode_tok_s:,.1f} tok/s")
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
        **({"clocks": clocks.summary()} if clocks is not None else {}),
    }


def profile_kernels(executor: Executor, limits: Limits, settings: BenchSettings, log: Log) -> dict:
    """The per-kernel table of one decode step (after the prompt) and one prefill chunk, run eagerly.

    Needs an executor that implements `KernelProfiler`; otherwise says it is not available.
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
    return {
        "available": True,
        "decode_step": {"context": p + 1, "device_s": sum(t.seconds for t in step),
                        "kernels": kernel_rows(step, limits.copy_gbps, limits.gemm_tflops)},
        "prefill_chunk": {"tokens": min(settings.prefill_chunk, p), "device_s": sum(t.seconds for t in chunk),
                          "kernels": kernel_rows(chunk, limits.copy_gbps, limits.gemm_tflops)},
    }


def measure_host_overhead(executor: Executor, settings: BenchSettings, timer: StepTimer | None,
                          timed_wall_s: float | None, log: Log) -> dict:
    """One more generation of the first case through the engine's loop with `timer` watching the
    executor: wall time per decode step, device time of the same steps, their difference and ratio,
    and the device's idle time between steps. `timed_wall_s`: the timed runs' median wall time per
    step, for comparison (the timer's own cost shows as the difference)."""
    if timer is None:
        return {"available": False, "reason": f"{type(executor).__name__} has no device step timer"}
    p, d = settings.prompt_tokens, settings.decode_tokens
    log(f"host overhead: one more {p} + {d} token generation with device events around every step")
    prompt = prompt_ids(executor.config.vocab, p, settings.seed)
    with timer(executor, d) as clock:
        def decode_begins() -> None:
            clock.phase = DECODE

        stats = time_generation(executor, prompt, d, settings.prefill_chunk, decode_begins)
    out = host_overhead(clock.spans, stats.completion_tokens - 1, stats.decode_s)
    return {**out, "prompt_tokens": p, "timed_wall_s_per_step": timed_wall_s,
            "cuda_graph": getattr(executor, "cuda_graph", None)}


def run_bench(executor: Executor, acct: Accounting, limits: Limits, settings: BenchSettings, log: Log,
              step_timer: StepTimer | None = None, clocks: ClockSampler | None = None) -> dict:
    """Every case (with `clocks`: each sampling the GPU's clocks over its timed repetitions), host overhead (with
    `step_timer`), then the kernel table if asked: the `runs`, `host_overhead` and `kernels` parts of the report."""
    runs = []
    for n in settings.cases:
        log(f"case: prompt {n} tokens, decode {settings.decode_tokens} tokens")
        runs.append(run_case(executor, acct, limits, n, settings, log, clocks))
    wall = runs[0]["decode"]["seconds"]["median"] / (settings.decode_tokens - 1)
    overhead = measure_host_overhead(executor, settings, step_timer, wall, log)
    kernels = profile_kernels(executor, limits, settings, log) if settings.kernel_table else None
    return {"runs": runs, "host_overhead": overhead, "kernels": kernels}
