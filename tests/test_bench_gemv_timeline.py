"""tools/bench_gemv.py's pause detector for the stream-K timeline (block arrivals pooled over warps)."""

import importlib.util
from pathlib import Path

import numpy as np

spec = importlib.util.spec_from_file_location("bench_gemv", Path(__file__).parents[1] / "tools" / "bench_gemv.py")
bench_gemv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_gemv)


def test_longest_lull_finds_a_pause_of_every_warp():
    rng = np.random.default_rng(0)
    steady = np.round(rng.uniform(1.0, 25.0, 40_000) / 0.256) * 0.256  # arrivals on the timer's 0.256 us steps
    assert bench_gemv.longest_lull(steady) < 0.3
    paused = steady[(steady < 19.0) | (steady > 20.0)]  # nobody's block arrives for 1 us
    assert 1.0 <= bench_gemv.longest_lull(paused) < 1.3


def test_longest_lull_ignores_the_tails_and_tiny_inputs():
    a = np.concatenate([[0.0], np.arange(5.0, 15.0, 0.256).repeat(50), [40.0]])  # stragglers past 5 / 95 %
    assert bench_gemv.longest_lull(a) < 0.3
    assert bench_gemv.longest_lull(np.array([3.0])) == 0.0
