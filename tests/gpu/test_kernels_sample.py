"""The device sampler (top-k partials + pick) vs its numpy model on the live GPU: parameter grids on
fresh random bf16 logits with penalties, the on-device count update, and the draw frequencies."""

import time

import numpy as np
import pytest
from ml_dtypes import bfloat16

from inferno.cuda import Device, from_device, to_device
from inferno.engine.params import SamplingParams
from inferno.kernels.sample_variants import DeviceSampler, reference_candidates, reference_token, scratch_bytes

VOCAB = 248320


@pytest.fixture(scope="module")
def sampler():
    Device.open()
    return DeviceSampler.for_device()


class _Run:
    """Device buffers for one logits row; `draw` runs both kernels and reads the token back."""

    def __init__(self, sampler, x: np.ndarray, counts: np.ndarray):
        self.sampler, self.n = sampler, x.size
        self.x = to_device(None, x.astype(bfloat16).view(np.uint16), "logits")
        self.counts = to_device(None, counts.astype(np.int32), "counts")
        self.scratch = to_device(None, np.zeros(scratch_bytes(x.size) // 4, np.float32), "scratch")
        self.out = to_device(None, np.array([-7], np.int32), "out")  # poison

    def draw(self, params, u) -> int:
        self.sampler(self.x, self.counts, self.scratch, self.out, self.n, params, u)
        return int(from_device(self.out, np.int32, (1,))[0])

    def read_counts(self) -> np.ndarray:
        return from_device(self.counts, np.int32, (self.n,))

    def free(self):
        for b in (self.x, self.counts, self.scratch, self.out):
            b.free()


def _explain(x, counts, p, u, got):
    """Why a kernel token may differ from the model's: u or the top-p cut within rounding of a boundary."""
    ids, w = reference_candidates(x, counts, p)
    cum = np.cumsum(w, dtype=np.float64) / np.sum(w, dtype=np.float64)
    u_gap = float(np.min(np.abs(cum - np.float32(u))))
    wide = SamplingParams(temperature=p.temperature, top_k=p.top_k, seed=p.seed,
                          presence_penalty=p.presence_penalty, frequency_penalty=p.frequency_penalty)
    kids, kw = reference_candidates(x, counts, wide) if not p.greedy else (ids, w)
    kcum = np.cumsum(kw, dtype=np.float64) / np.sum(kw, dtype=np.float64)
    p_gap = float(np.min(np.abs(kcum - np.float32(p.top_p))))
    rounding = got in kids.tolist() and min(u_gap, p_gap) < 1e-5
    return rounding, f"u-boundary gap {u_gap:.2e}, top-p gap {p_gap:.2e}, kernel token in top-k: {got in kids.tolist()}"


def _logits_and_counts(rng, n):
    x = rng.normal(0, 3, n).astype(bfloat16).astype(np.float32)
    counts = np.zeros(n, np.int32)
    top = np.argsort(-x)[:40]
    counts[top[rng.random(40) < 0.5]] = rng.integers(1, 4)  # penalties on the likely tokens
    counts[rng.choice(n, 200, replace=False)] += rng.integers(1, 3, 200).astype(np.int32)
    return x, counts


@pytest.mark.parametrize("n", [VOCAB, 151936, 4104])
def test_sample_matches_model(sampler, n):
    rng = np.random.default_rng()
    grid = [(t, k, tp, mp, pen) for t in (0.0, 0.3, 0.8, 1.5) for k in (1, 20, 64) for tp in (0.8, 0.95, 1.0)
            for mp in (0.0, 0.1) for pen in ((0.0, 0.0), (0.5, 0.7), (-0.4, 0.2))]
    bad, rounded = [], []
    for t, k, tp, mp, (pres, freq) in grid:
        x, counts = _logits_and_counts(rng, n)
        p = SamplingParams(temperature=t, top_k=k, top_p=tp, min_p=mp, presence_penalty=pres, frequency_penalty=freq)
        run = _Run(sampler, x, counts)
        try:
            for u in (rng.random(), rng.random()):
                want = reference_token(x, counts, p, u)
                before = run.read_counts()
                got = run.draw(p, u)
                after = run.read_counts()
                if got != want:
                    ok, why = _explain(x, before, p, u, got)
                    (rounded if ok else bad).append(f"{p} u={u:.8f}: kernel {got}, model {want} ({why})")
                if not 0 <= got < n:
                    continue
                expect = before.copy()
                expect[got] += 1
                if not np.array_equal(after, expect):
                    diff = np.flatnonzero(after != expect)[:5]
                    bad.append(f"{p}: counts wrong after drawing {got} at ids {diff.tolist()}: "
                               f"{after[diff].tolist()} vs {expect[diff].tolist()}")
                counts = after
        finally:
            run.free()
    print(f"\nn={n}: {2 * len(grid)} draws, {len(bad)} wrong, {len(rounded)} within rounding of a boundary")
    for line in rounded[:5]:
        print("  rounding:", line)
    assert not bad and len(rounded) <= 2, "\n".join(bad[:10] + rounded[:5])


def test_sample_frequencies(sampler):
    """10k draws with fixed logits: every token equals the model's for its u, and the histogram fits
    the filtered distribution (chi-square, bins with expectation < 5 merged)."""
    rng = np.random.default_rng(2026)
    x = rng.normal(0, 3, VOCAB).astype(bfloat16).astype(np.float32)
    zero = np.zeros(VOCAB, np.int32)
    p = SamplingParams(temperature=0.8, top_k=64, top_p=0.95, min_p=0.01)
    ids, w = reference_candidates(x, zero, p)
    prob = w.astype(np.float64) / w.sum(dtype=np.float64)
    draws = 10_000
    us = rng.random(draws)
    run = _Run(sampler, x, zero)
    try:
        t0 = time.perf_counter()
        got = np.array([run.draw(p, u) for u in us])
        per_draw = (time.perf_counter() - t0) / draws
    finally:
        run.free()
    want = np.array([reference_token(x, zero, p, u) for u in us[:2000]])
    mismatch = np.flatnonzero(got[:2000] != want)
    pos = {int(t): i for i, t in enumerate(ids)}
    outside = [int(t) for t in got if int(t) not in pos]
    obs = np.bincount([pos[int(t)] for t in got if int(t) in pos], minlength=ids.size).astype(np.float64)
    exp = prob * draws
    big = exp >= 5
    o = np.append(obs[big], obs[~big].sum())
    e = np.append(exp[big], exp[~big].sum())
    keep = e > 0
    chi2 = float(np.sum((o[keep] - e[keep]) ** 2 / e[keep]))
    df = int(keep.sum()) - 1
    limit = df + 5 * np.sqrt(2 * df)
    print(f"\n{ids.size} candidates, chi2 {chi2:.1f} on {df} dof (limit {limit:.1f}), "
          f"{mismatch.size} of 2000 tokens differ from the model, {per_draw * 1e6:.1f} us per draw (with readback)")
    for i in range(min(8, ids.size)):
        print(f"  id {ids[i]:>6}: observed {int(obs[i]):>5}, expected {exp[i]:8.1f}")
    assert not outside, f"drew tokens outside the candidate set: {sorted(set(outside))[:10]}"
    assert mismatch.size <= 2, f"kernel vs model differ at draws {mismatch[:10].tolist()}: " \
                               f"{got[mismatch[:10]].tolist()} vs {want[mismatch[:10]].tolist()}"
    assert chi2 < limit, f"chi2 {chi2:.1f} > {limit:.1f}"
