"""Same-run hardware limits and device timing, for benchmarks that report a ratio to the limit.

`time_ms` times device work with events around back-to-back calls; `copy_bandwidth` measures the
device-to-device copy rate (bytes read + bytes written), the ceiling for memory-bound kernels.
The matrix-rate ceiling needs a vendor GEMM and lives in tools/bench_kernels.py.
"""

from __future__ import annotations

import statistics
from typing import Callable

from inferno.cuda.copy import d2d, memset_d8
from inferno.cuda.memory import device_alloc
from inferno.cuda.stream import Event, Stream


def time_ms(fn: Callable[[], None], stream: Stream, warmup: int = 3, reps: int = 20, inner: int = 10) -> float:
    """Median device milliseconds per `fn()` (which enqueues work on `stream`).

    Each sample puts events around `inner` back-to-back calls, so the host's launch cost overlaps
    the GPU work as it does in a running engine instead of being timed as idle GPU.
    """
    for _ in range(warmup):
        fn()
    stream.synchronize()
    times = []
    for _ in range(reps):
        a, b = Event(), Event()
        a.record(stream)
        for _ in range(inner):
            fn()
        b.record(stream)
        b.synchronize()
        times.append(Event.elapsed_ms(a, b) / inner)
        a.close()
        b.close()
    return statistics.median(times)


def copy_bandwidth(stream: Stream, nbytes: int = 4 << 30) -> dict:
    """Device-to-device cuMemcpy rate: {"bytes" (read + written), "ms", "gbps"}."""
    src, dst = device_alloc(nbytes, "copy_src"), device_alloc(nbytes, "copy_dst")
    try:
        memset_d8(src, 0x3C)
        ms = time_ms(lambda: d2d(dst, src, nbytes, stream), stream, reps=10, inner=2)
    finally:
        src.free()
        dst.free()
    return {"bytes": 2 * nbytes, "ms": ms, "gbps": 2 * nbytes / ms / 1e6}
