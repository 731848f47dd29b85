"""Device sampling through the engine on the GPU executor (needs a GPU): a seeded sampled
generation equals the same generation sampled on the host from the downloaded logits.

Both paths read the same bf16 logits from the same head GEMV; they differ only in the sampling
arithmetic (u as float32, top_p / min_p as float32, the kernel's exp), so a mismatch is allowed
only where it is a detected near tie: the draw, the top-p cut or the min-p floor within EPS of a
candidate's boundary. The first mismatch is printed with the candidates around it.

The kernels alone on edge cases: each slice's partial list against numpy's sort of the penalised
logits (long runs of ties, -inf, NaN, partial last slices) with the token against the numpy model,
and the argmax cluster with the maximum at every CTA's first and last element.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from ml_dtypes import bfloat16

from inferno.artifact.convert import convert
from inferno.checkpoint.synth import synthesize
from inferno.engine.generate import generate
from inferno.engine.params import GenerationRequest, SamplingParams
from inferno.cuda import Device, from_device, to_device
from inferno.cuda.copy import h2d
from inferno.kernels.sample_variants import (
    ARGMAX_CTAS, K_MAX, SLICE, Argmax, DeviceSampler, reference_candidates, reference_token, scratch_bytes,
)
from inferno.model.gpu import GpuExecutor

TOKENS = 32
EPS = 1e-4  # relative distance to a boundary that counts as a near tie
PARAMS = [
    SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, presence_penalty=1.5, seed=1234),
    SamplingParams(temperature=1.3, top_k=64, top_p=0.95, frequency_penalty=0.4, seed=7),
    SamplingParams(temperature=0.0, presence_penalty=1.0, frequency_penalty=0.5),
]


class HostOnly:
    """The executor protocol of `ex` without `samples_on_device` (generate samples on the host); keeps the logits."""

    def __init__(self, ex: GpuExecutor):
        self.ex, self.config, self.logits = ex, ex.config, []

    def new_state(self):
        return self.ex.new_state()

    def prefill(self, tokens, state):
        self.logits.append(self.ex.prefill(tokens, state))
        return self.logits[-1]

    def step(self, token, state):
        self.logits.append(self.ex.step(token, state))
        return self.logits[-1]

    def release(self, state):
        self.ex.release(state)


@pytest.fixture(scope="module", params=[True, False], ids=["graph", "eager"])
def ex(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-sample")
    art = convert(synthesize("tiny-dense", root / "ckpt"), root / "tiny.ninfer", "groupwise-int", progress=False)
    ex = GpuExecutor(art, max_seqs=2, max_context=512, cuda_graph=request.param, prefill_chunk=64)
    yield ex
    ex.close()


def run(executor, params: SamplingParams) -> list[int]:
    vocab = executor.config.vocab
    req = GenerationRequest([(5 + 7 * i) % vocab for i in range(100)], TOKENS, params, ignore_eos=True)
    return [e.token_id for e in generate(executor, req, prefill_chunk=64) if e.token_id is not None]


def near_tie(logits: np.ndarray, counts: np.ndarray, params: SamplingParams, u: float) -> str | None:
    """Why the two samplers may pick differently at this step (a boundary within EPS), or None."""
    ids, w = reference_candidates(logits, counts, params)
    if params.greedy:
        pen = np.float32(params.presence_penalty) + np.float32(params.frequency_penalty) * counts.astype(np.float32)
        top = np.sort(np.where(counts > 0, logits - pen, logits))
        return f"top two penalised logits {top[-1]} / {top[-2]}" if top[-1] - top[-2] <= EPS * abs(top[-1]) else None
    cum = np.cumsum(w, dtype=np.float64) / np.sum(w, dtype=np.float64)
    if np.any(np.abs(cum - u) <= EPS):
        return f"u {u} within {EPS} of a cumulative weight {cum}"
    _, full = reference_candidates(logits, counts, dataclasses.replace(params, top_p=1.0, min_p=0.0))
    fcum = np.cumsum(full, dtype=np.float64)
    if params.top_p < 1 and np.any(np.abs(fcum / fcum[-1] - params.top_p) <= EPS):
        return f"top-p {params.top_p} within {EPS} of a cumulative mass"
    if params.min_p > 0 and np.any(np.abs(full - params.min_p * full[0]) <= EPS * full[0]):
        return f"min-p floor within {EPS} of a weight"
    return None


@pytest.mark.parametrize("params", PARAMS, ids=["topk20-p0.9-minp-presence", "topk64-p0.95-frequency", "greedy-pen"])
def test_device_sampling_equals_host_sampling(ex, params):
    assert ex.samples_on_device(params)
    device = run(ex, params)
    host_ex = HostOnly(ex)
    host = run(host_ex, params)
    assert len(device) == len(host) == TOKENS
    if device == host:
        return
    i = next(k for k, (a, b) in enumerate(zip(device, host)) if a != b)
    rng = np.random.default_rng(params.seed)
    us = [0.0 if params.greedy else rng.random() for _ in range(i + 1)]
    counts = np.zeros(ex.config.vocab, np.int32)
    np.add.at(counts, host[:i], 1)
    logits = host_ex.logits[i]
    ids, w = reference_candidates(logits, counts, params)
    print(f"first mismatch at token {i}: device {device[i]}, host {host[i]}; u {us[i]}; device candidates "
          f"{list(zip(ids.tolist(), np.round(w, 5).tolist()))}; logits of the two "
          f"{logits[device[i]]} / {logits[host[i]]}")
    why = near_tie(logits, counts, params, us[i])
    assert why is not None, f"device and host sampling differ at token {i} without a near tie"
    print(f"allowed: near tie ({why})")


# --- the kernels alone on edge-case logits (partial lists, ties, -inf / NaN, argmax cluster edges) --------

def _upload(x: np.ndarray, counts: np.ndarray):
    return (to_device(None, x.astype(bfloat16).view(np.uint16), "logits"), to_device(None, counts, "counts"),
            to_device(None, np.zeros(scratch_bytes(x.size) // 4, np.float32), "scratch"),
            to_device(None, np.array([-7], np.int32), "out"))


@pytest.fixture(scope="module")
def kernels():
    Device.open()
    return DeviceSampler.for_device(), Argmax.for_device()


@pytest.mark.parametrize("n", [248320, 4104, 8200])
def test_partial_lists_with_ties_and_nan(kernels, n):
    """Every slice's 64 (value, id) pairs equal numpy's lexsort of the penalised logits (coarse values:
    long runs of ties; -inf, NaN, penalties), and the token equals `reference_token` for several params."""
    sampler, _ = kernels
    rng = np.random.default_rng(n)
    x = np.round(rng.normal(0, 2, n)).astype(np.float32)  # ~10 distinct values: ties everywhere
    x[rng.choice(n, 40, replace=False)] = -np.inf
    x[rng.choice(n, 40, replace=False)] = np.nan
    counts = np.zeros(n, np.int32)
    counts[rng.choice(n, 500, replace=False)] = rng.integers(1, 4, 500)
    cases = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, top_k=64, top_p=0.95, min_p=0.05,
                                                              presence_penalty=0.5, frequency_penalty=0.25),
             SamplingParams(temperature=1.5, top_k=7, frequency_penalty=1.0)]
    bufs = _upload(x, counts)
    try:
        for p in cases:
            pen = np.float32(p.presence_penalty) + np.float32(p.frequency_penalty) * counts.astype(np.float32)
            y = np.where(counts > 0, x - pen, x).astype(np.float32)
            y[np.isnan(y)] = -np.inf
            for u in (0.0, 0.31415, 0.77777):
                h2d(bufs[1], counts)  # the kernel counts its token: start each draw from the same counts
                sampler(*bufs, n, p, u)
                got = int(from_device(bufs[3], np.int32, (1,))[0])
                assert got == reference_token(x, counts, p, u), f"n={n} {p} u={u}"
            slices = -(-n // SLICE)
            part = from_device(bufs[2], np.int32, (2, slices * K_MAX))
            for b in range(slices):
                lo, hi = b * SLICE, min((b + 1) * SLICE, n)
                want = np.lexsort((np.arange(lo, hi), -y[lo:hi]))[:K_MAX] + lo
                ids = part[1, b * K_MAX:b * K_MAX + want.size]
                np.testing.assert_array_equal(ids, want, err_msg=f"n={n} {p} slice {b} ids")
                np.testing.assert_array_equal(part[0, b * K_MAX:b * K_MAX + want.size].view(np.float32), y[want],
                                              err_msg=f"n={n} {p} slice {b} values")
    finally:
        for buf in bufs:
            buf.free()


@pytest.mark.parametrize("n", [8, 64, 248320, 151936])
def test_argmax_cluster_edges(kernels, n):
    """The maximum at each CTA's first / last chunk, NaN everywhere else near it, all -inf: np.argmax
    over the non-NaN values (first index of the maximum; all -inf -> 0)."""
    _, argmax = kernels
    chunks = n // 8
    per = -(-chunks // ARGMAX_CTAS)
    spots = sorted({min(i, n - 1) for r in range(ARGMAX_CTAS) for i in (r * per * 8, (r * per + per) * 8 - 1)})
    rng = np.random.default_rng(n)
    rows = []
    for s in spots:
        x = rng.normal(0, 1, n).astype(np.float32)
        x[s] = 30.0
        x[max(s - 3, 0):s] = np.nan
        rows.append((x, s))
    tie = rng.normal(0, 1, n).astype(np.float32)
    tie[[n - 1, n // 2, n // 3]] = 30.0
    rows.append((tie, min(n // 3, n // 2)))
    rows.append((np.full(n, -np.inf, np.float32), 0))
    out = to_device(None, np.array([-7], np.int32), "out")
    try:
        for x, want in rows:
            xd = to_device(None, x.astype(bfloat16).view(np.uint16), "logits")
            try:
                argmax(xd, out, n)
                got = int(from_device(out, np.int32, (1,))[0])
            finally:
                xd.free()
            assert got == want, f"n={n}: kernel {got}, want {want}"
    finally:
        out.free()
