"""The per-kernel timing hook an executor may offer to `inferno bench --kernel-table`.

An executor that implements `KernelProfiler` runs one decode step (or one prefill chunk)
EAGERLY, with device events around every launch, and returns one `KernelTime` per launch (or
per group of launches it chooses to merge, with `launches` > 1). The call has the same effect
on `state` as `step` / `prefill` (the token is appended), so the bench can continue or release
the state afterwards. `bytes` is what the kernel must move (read + written) and `flops` what it
must compute; give the one that bounds the kernel (or both), None for the other. The bench
turns them into a rate and a ratio to the same-run copy bandwidth / GEMM rate.

Host overhead is measured apart from the kernel table, on the executor as it normally runs
(graph replay): a step timer (`StepTimer`, e.g. `inferno.model.gpu.profile.step_spans`) gives the
device time of every decode step (`StepSpan`) of one generation through the engine's loop, and
`host_overhead` sets it against that generation's wall time per step.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class KernelTime:
    """Device time of one kernel launch (or `launches` merged launches) and its work."""

    kernel: str  # e.g. "gemv_q4 text/layers/0/mlp/gate_up"
    seconds: float
    bytes: int | None = None
    flops: int | None = None
    launches: int = 1


@runtime_checkable
class KernelProfiler(Protocol):
    """Optional executor extension: per-launch device times of one decode step / prefill chunk."""

    def profile_step(self, token: int, state) -> list[KernelTime]:
        """Like `step(token, state)`, run eagerly; the device time of each launch."""
        ...

    def profile_prefill(self, tokens: Sequence[int], state) -> list[KernelTime]:
        """Like `prefill(tokens, state)` for one chunk, run eagerly; the device time of each launch."""
        ...


def kernel_rows(times: list[KernelTime], copy_gbps: float | None, gemm_tflops: float | None) -> list[dict]:
    """JSON rows: kernel, seconds, bytes, flops, achieved GB/s and TFLOP/s, ratio to the limit.

    The ratio is the larger of (GB/s / copy GB/s) and (TFLOP/s / GEMM TFLOP/s) among those known:
    the limit the kernel is closest to. None when no limit was measured.
    """
    rows = []
    for t in times:
        gbps = t.bytes / t.seconds / 1e9 if t.bytes is not None and t.seconds > 0 else None
        tflops = t.flops / t.seconds / 1e12 if t.flops is not None and t.seconds > 0 else None
        ratios = []
        if gbps is not None and copy_gbps:
            ratios.append(("copy", gbps / copy_gbps))
        if tflops is not None and gemm_tflops:
            ratios.append(("gemm", tflops / gemm_tflops))
        limit, ratio = max(ratios, key=lambda r: r[1]) if ratios else (None, None)
        rows.append({"kernel": t.kernel, "launches": t.launches, "seconds": t.seconds, "bytes": t.bytes,
                     "flops": t.flops, "gbps": gbps, "tflops": tflops, "limit": limit, "ratio": ratio})
    return rows


@dataclass(frozen=True)
class StepSpan:
    """Device time of the work the host queued between two waits for the stream (one decode step),
    and how long the device sat idle since the previous span ended (None for the first)."""

    phase: str
    seconds: float
    idle_before: float | None


StepTimer = Callable[[Any, int], AbstractContextManager]
"""`timer(executor, reserve)` -> a context whose value has a settable `phase` and, after exit,
`spans: list[StepSpan]` (see `inferno.model.gpu.profile.step_spans`)."""

DECODE = "decode"


def host_overhead(spans: Sequence[StepSpan], steps: int, wall_s: float) -> dict:
    """Host overhead per decode step from one generation: `steps` decode steps took `wall_s` on the
    host clock (the engine loop's decode time), and `spans` (phase DECODE) are their device times.

    overhead per step = wall per step - device time per step; the ratio is to the wall time. The
    idle gaps between consecutive decode spans say where the device waited for the host.
    """
    decode = [s for s in spans if s.phase == DECODE]
    if steps < 1 or not decode:
        raise ValueError(f"no decode steps to measure ({steps} steps, {len(decode)} device spans)")
    wall = wall_s / steps
    device = sum(s.seconds for s in decode) / steps
    idle = [s.idle_before for s in decode[1:] if s.idle_before is not None]
    return {
        "available": True,
        "steps": steps,
        "device_spans": len(decode),
        "wall_s_per_step": wall,
        "device_s_per_step": device,
        "device_s_per_span": {"median": statistics.median(s.seconds for s in decode),
                              "min": min(s.seconds for s in decode), "max": max(s.seconds for s in decode)},
        "host_overhead_s_per_step": wall - device,
        "host_overhead_ratio": (wall - device) / wall if wall > 0 else None,
        "device_idle_between_steps_s": ({"mean": statistics.fmean(idle), "median": statistics.median(idle),
                                         "max": max(idle)} if idle else None),
    }
