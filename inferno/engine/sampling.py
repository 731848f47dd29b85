"""Next-token sampling in numpy, one `Sampler` per request.

Order of operations (as in HF / vLLM): penalties on the raw logits (over the tokens this
sampler has produced), then greedy argmax, or: top-k, temperature, top-p (smallest set of the
most likely tokens whose mass reaches top_p), min-p (drop tokens below min_p * p_max), and a
draw from the renormalised remainder with the request's own `numpy.random.Generator`. The same
seed and the same logits always give the same tokens.

Cost per token is a few O(vocab) float32 passes: top-k and top-p first narrow the candidates
with a cheap threshold (a real model's distribution is peaked), so a 248k vocabulary is only
partitioned or sorted in full when the distribution is nearly flat; the draw sums blocks of
the weights in float64 and scans one block.
"""

from __future__ import annotations

import numpy as np

from inferno.engine.params import SamplingParams

_TOP_K_MARGINS = (4.0, 8.0, 16.0, 32.0)  # logit distance below the max tried for top-k candidates
_NUCLEUS_FLOORS = (1e-2, 1e-4, 1e-6)  # weight floors (relative to the max) tried for top-p
_BLOCK = 1024  # block size of the two-level draw


class Sampler:
    """Picks tokens for one request and remembers them for the penalties."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self._rng = np.random.default_rng(params.seed)
        self._counts: dict[int, int] = {}

    @property
    def counts(self) -> dict[int, int]:
        """How often each token id has been produced so far."""
        return dict(self._counts)

    def sample(self, logits: np.ndarray) -> int:
        """Choose the next token from fp32 logits `[vocab]` and record it."""
        token = self._choose(self.penalised(logits))
        self._counts[token] = self._counts.get(token, 0) + 1
        return token

    def penalised(self, logits: np.ndarray) -> np.ndarray:
        """The logits minus presence and frequency penalties for the tokens produced so far."""
        x = np.asarray(logits, np.float32)
        if x.ndim != 1:
            raise ValueError(f"logits must be 1-D [vocab], got shape {x.shape}")
        p = self.params
        if not p.has_penalties or not self._counts:
            return x
        ids = np.fromiter(self._counts.keys(), np.int64, len(self._counts))
        counts = np.fromiter(self._counts.values(), np.float32, len(self._counts))
        out = x.copy()
        out[ids] -= np.float32(p.presence_penalty) + np.float32(p.frequency_penalty) * counts
        return out

    def _choose(self, x: np.ndarray) -> int:
        if self.params.greedy:
            return int(np.argmax(x))
        ids, weights = candidate_distribution(x, self.params)
        return int(ids[draw(weights, self._rng.random())])


def candidate_distribution(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Token ids that survive top-k / temperature / top-p / min-p, and their probabilities.

    Probabilities are relative to the top-k set (before top-p and min-p remove tokens); with
    top-p the ids come most likely first.
    """
    x = np.asarray(logits, np.float32)
    ids = top_k_ids(x, params.top_k)
    if ids is not None:  # best first, ties to the lower id: the device sampler's order
        ids = ids[np.lexsort((ids, -x[ids]))]
    sub = x if ids is None else x[ids]
    weights = np.exp((sub - sub.max()) * np.float32(1.0 / params.temperature))  # max weight is 1
    weights *= np.float32(1.0 / weights.sum(dtype=np.float64))
    if ids is None:
        ids = np.arange(x.size)
    if params.top_p < 1.0:
        ids, weights = _nucleus(ids, weights, params.top_p)
    if params.min_p > 0.0:
        keep = weights >= params.min_p * weights.max()
        ids, weights = ids[keep], weights[keep]
    return ids, weights


def top_k_ids(x: np.ndarray, k: int) -> np.ndarray | None:
    """Ids of the k largest logits (any order), or None when top-k keeps everything."""
    vocab = x.size
    if k <= 0 or k >= vocab:
        return None
    top = x.max()
    for margin in _TOP_K_MARGINS:
        cand = np.flatnonzero(x >= top - margin)
        if cand.size >= k:
            break
    else:
        cand = np.arange(vocab)
    if cand.size == k:
        return cand
    return cand[np.argpartition(x[cand], cand.size - k)[cand.size - k :]]


def _nucleus(ids: np.ndarray, weights: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The smallest most-likely prefix whose mass reaches `top_p` (weights sum to 1, max first)."""
    total = weights.sum(dtype=np.float64)
    need = top_p * total
    top = weights.max()
    pick = None
    for floor in _NUCLEUS_FLOORS:
        cand = np.flatnonzero(weights >= floor * top)
        if weights[cand].sum(dtype=np.float64) >= need:
            pick = cand
            break
    if pick is not None:
        ids, weights = ids[pick], weights[pick]
    order = np.lexsort((ids, -weights))  # most likely first; ties by token id
    ids, weights = ids[order], weights[order]
    cut = int(np.searchsorted(np.cumsum(weights, dtype=np.float64), need, side="left")) + 1
    return ids[:cut], weights[:cut]


def draw(weights: np.ndarray, u: float) -> int:
    """Index i with probability weights[i] / sum(weights), for a uniform u in [0, 1)."""
    n = weights.size
    if n <= _BLOCK:
        c = np.cumsum(weights, dtype=np.float64)
        return min(int(np.searchsorted(c, u * c[-1], side="right")), n - 1)
    full = n - n % _BLOCK
    sums = weights[:full].reshape(-1, _BLOCK).sum(axis=1, dtype=np.float64)
    if full < n:
        sums = np.append(sums, weights[full:].sum(dtype=np.float64))
    c = np.cumsum(sums)
    target = u * c[-1]
    b = min(int(np.searchsorted(c, target, side="right")), c.size - 1)
    rest = target - (c[b - 1] if b else 0.0)
    inner = np.cumsum(weights[b * _BLOCK : (b + 1) * _BLOCK], dtype=np.float64)
    return b * _BLOCK + min(int(np.searchsorted(inner, rest, side="right")), inner.size - 1)
