"""CPU: the device sampling kernels build for every arch; launcher checks and argument packing;
the numpy model of the kernels (`reference_token`) equals the host `Sampler` with the same u; the
kernels' compare-exchange networks and pick arithmetic, run in numpy, equal a sort and the model."""

from types import SimpleNamespace

import numpy as np
import pytest

from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import DeviceBuffer
from inferno.cuda.params import TensorArg
from inferno.engine.params import SamplingParams
from inferno.engine.sampling import Sampler, candidate_distribution, draw
from inferno.kernels import sample_variants as sv
from inferno.kernels.build import build_variant, dsl_available
from inferno.kernels.registry import ARCHS
from inferno.kernels.sample_variants import (
    K_MAX, MAX_VOCAB, SAMPLE_PICK, SAMPLE_TOPK, DeviceSampler, device_supports, reference_candidates,
    reference_token, scratch_bytes,
)

dsl = pytest.mark.skipif(not dsl_available(), reason="the CuTe DSL is not installed")
VOCAB = 248320


@dsl
@pytest.mark.parametrize("arch", ARCHS)
def test_sample_kernels_build(tmp_path, arch):
    topk = build_variant(SAMPLE_TOPK, arch, tmp_path)
    pick = build_variant(SAMPLE_PICK, arch, tmp_path)
    for v in (SAMPLE_TOPK, SAMPLE_PICK):
        assert (tmp_path / arch / f"{v.name}.cubin").stat().st_size > 0
    assert topk.block == [512, 1, 1] and pick.block == [512, 1, 1]
    assert [(p.name, p.kind, p.dyn_shape) for p in topk.params] == [
        ("x", "tensor", ["N"]), ("counts", "tensor", ["N"]), ("part_v", "tensor", ["P"]),
        ("part_i", "tensor", ["P"]), ("presence", "f32", []), ("frequency", "f32", [])]
    assert [(p.name, p.kind) for p in pick.params] == [
        ("part_v", "tensor"), ("part_i", "tensor"), ("counts", "tensor"), ("out", "tensor"), ("top_k", "i32"),
        ("inv_t", "f32"), ("top_p", "f32"), ("min_p", "f32"), ("u", "f32")]
    assert topk.smem + pick.smem <= 2 * 48 * 1024  # no opt-in shared memory needed
    from cute_kernels import argmax, sample

    assert (sample.K_MAX, sample.SLICE) == (K_MAX, sv.SLICE)  # the launcher's sizes are the kernels'
    assert argmax.CTAS == sv.ARGMAX_CTAS


class _Layout:
    """Records the argument lists instead of packing them."""

    def __init__(self, calls):
        self.calls = calls

    def pack(self, args):
        self.calls.append(list(args))
        return args


def _loaded(variant, calls):
    names = [a.name for a in variant.args]
    params = [SimpleNamespace(name=n) for n in names]
    manifest = SimpleNamespace(params=params, grid=list(variant.grid), block=[512, 1, 1], smem=0)
    return SimpleNamespace(variant=variant, manifest=manifest, kernel=variant.name, layout=_Layout(calls))


@pytest.fixture
def sampler(monkeypatch):
    calls, launches = [], []
    monkeypatch.setattr(sv, "launch", lambda kernel, grid, block, args, smem, stream: launches.append((kernel, grid)))
    return DeviceSampler(_loaded(SAMPLE_TOPK, calls), _loaded(SAMPLE_PICK, calls)), calls, launches


def _buffers(n):
    return (DeviceBuffer(1 << 20, n * 2, "logits"), DeviceBuffer(1 << 24, n * 4, "counts"),
            DeviceBuffer(1 << 28, scratch_bytes(n), "scratch"), DeviceBuffer(1 << 30, 4, "out"))


def test_launcher_packs_both_kernels(sampler):
    s, calls, launches = sampler
    x, c, scratch, out = _buffers(VOCAB)
    p = SamplingParams(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, presence_penalty=0.5,
                       frequency_penalty=-0.25)
    s(x, c, scratch, out, VOCAB, p, 0.25)
    parts = 61 * K_MAX
    assert launches == [("sample_topk_bf16", (61, 1, 1)), ("sample_pick", (1, 1, 1))]
    assert scratch_bytes(VOCAB) == parts * 8
    pv, pi = TensorArg(scratch.ptr, (parts,)), TensorArg(scratch.ptr + parts * 4, (parts,))
    assert calls[0] == [TensorArg(x.ptr, (VOCAB,)), TensorArg(c.ptr, (VOCAB,)), pv, pi, 0.5, -0.25]
    assert calls[1] == [pv, pi, TensorArg(c.ptr, (VOCAB,)), TensorArg(out.ptr), 40, float(np.float32(1 / 0.7)),
                        0.9, 0.05, 0.25]
    calls.clear()
    s(x, c, scratch, out, VOCAB, SamplingParams(temperature=0.0, top_p=0.5), 0.0)  # greedy: top-1, no filters
    assert calls[1][4:] == [1, 1.0, 1.0, 0.0, 0.0]
    calls.clear()
    s(x, c, scratch, out, VOCAB, p, 1 - 1e-12)  # rounds to 1.0 in float32: kept below 1
    assert calls[1][-1] == float(np.nextafter(np.float32(1), np.float32(0)))


def test_argmax_launches_one_cluster(monkeypatch):
    """The argmax grid (ARGMAX_CTAS CTAs) is launched as one cluster; a one-CTA build as no cluster."""
    seen = []
    monkeypatch.setattr(sv, "launch",
                        lambda kernel, grid, block, args, smem, stream, cluster: seen.append((grid, cluster)))
    calls = []
    for grid in (list(sv.ARGMAX.grid), ["1", "1", "1"]):
        loaded = _loaded(sv.ARGMAX, calls)
        loaded.manifest.grid = grid
        sv.Argmax(loaded)(DeviceBuffer(1 << 20, VOCAB * 2, "x"), DeviceBuffer(1 << 24, 4, "out"), VOCAB)
    assert seen == [((sv.ARGMAX_CTAS, 1, 1),) * 2, ((1, 1, 1),) * 2]
    assert calls[0] == [TensorArg(1 << 20, (VOCAB,)), TensorArg(1 << 24)]


def test_launcher_refuses_bad_arguments(sampler):
    s, _, launches = sampler
    x, c, scratch, out = _buffers(VOCAB)
    ok = SamplingParams(top_k=20)
    for bad in (SamplingParams(top_k=0), SamplingParams(top_k=K_MAX + 1)):
        with pytest.raises(LaunchError, match="not supported on the device"):
            s(x, c, scratch, out, VOCAB, bad, 0.5)
    for n in (VOCAB - 4, MAX_VOCAB + 8):
        with pytest.raises(LaunchError, match="not supported on the device"):
            s(x, c, scratch, out, n, ok, 0.5)
    for u in (1.0, -0.1, True, "0.5"):
        with pytest.raises(LaunchError, match=r"u must be a uniform number in \[0, 1\)"):
            s(x, c, scratch, out, VOCAB, ok, u)
    small = DeviceBuffer(1 << 28, scratch_bytes(VOCAB) - 8, "scratch")
    with pytest.raises(LaunchError, match="scratch 'scratch' has"):
        s(x, c, small, out, VOCAB, ok, 0.5)
    with pytest.raises(LaunchError, match="counts 'counts' has"):
        s(x, DeviceBuffer(1 << 24, VOCAB * 2, "counts"), scratch, out, VOCAB, ok, 0.5)
    with pytest.raises(LaunchError, match="must be a DeviceBuffer"):
        s(x, c, scratch, 7, VOCAB, ok, 0.5)
    assert launches == []


def test_device_supports():
    assert device_supports(SamplingParams(temperature=0.0), VOCAB)
    assert device_supports(SamplingParams(top_k=1), VOCAB) and device_supports(SamplingParams(top_k=K_MAX), VOCAB)
    assert not device_supports(SamplingParams(), VOCAB)  # no top-k: the whole vocabulary, on the host
    assert not device_supports(SamplingParams(top_k=K_MAX + 1), VOCAB)
    assert not device_supports(SamplingParams(top_k=8), 8)  # top_k >= vocab means no filter
    assert not device_supports(SamplingParams(top_k=8), MAX_VOCAB + 8)


def _params(rng, case, top_p_one=False):
    """Case i: top_k (1, 2, 20, 64)[i % 4], greedy when i % 6 == 5; the rest drawn from rng."""
    return SamplingParams(
        temperature=0.0 if case % 6 == 5 else float(rng.choice([0.3, 0.7, 1.0, 1.5])),
        top_k=(1, 2, 20, 64)[case % 4],
        top_p=1.0 if top_p_one else float(rng.choice([0.5, 0.8, 0.9, 0.95, 0.999])),
        min_p=float(rng.choice([0.0, 0.0, 0.02, 0.1])),
        presence_penalty=float(rng.choice([0.0, 0.4, -0.3])), frequency_penalty=float(rng.choice([0.0, 0.3, 1.0])),
        seed=int(rng.integers(2**63)))


def test_model_matches_sampler_token_for_token():
    """Whole generations: the same seed, the same logits, the device model's tokens == Sampler's
    (top-p < 1 orders the candidates in both; the logits repeat with noise so penalties bite)."""
    rng = np.random.default_rng(1234)
    for case in range(12):
        vocab = int(rng.choice([VOCAB, 4104, 151936]))
        p = _params(rng, case)
        host, u_rng = Sampler(p), np.random.default_rng(p.seed)
        counts = np.zeros(vocab, np.int32)
        base = rng.normal(0, 3, vocab).astype(np.float32)
        for step in range(16):
            logits = base + rng.normal(0, 0.3, vocab).astype(np.float32)
            want = host.sample(logits)
            u = 0.0 if p.greedy else u_rng.random()
            got = reference_token(logits, counts, p, u)
            assert got == want, f"case {case} step {step} {p}: model {got}, Sampler {want}"
            counts[got] += 1
        assert {int(i): int(counts[i]) for i in np.flatnonzero(counts)} == host.counts


def test_model_matches_sampler_distribution_without_top_p():
    """top-p = 1: the same candidates and probabilities; Sampler draws in argpartition order, the
    model best first, so the token for one u matches Sampler's after sorting its candidates."""
    rng = np.random.default_rng(99)
    for case in range(40):
        p = _params(rng, case, top_p_one=True)
        if p.greedy:
            continue
        x = rng.normal(0, 3, VOCAB).astype(np.float32)
        ids, w = reference_candidates(x, np.zeros(VOCAB, np.int32), p)
        hid, hw = candidate_distribution(x, p)
        order = np.lexsort((hid, -hw))
        hid, hw = hid[order], hw[order]
        np.testing.assert_array_equal(ids, hid, err_msg=f"case {case} {p}")
        np.testing.assert_allclose(w / w.sum(), hw / hw.sum(), rtol=1e-5, atol=1e-9, err_msg=f"case {case} {p}")
        for u in rng.random(20):
            assert reference_token(x, np.zeros(VOCAB, np.int32), p, u) == int(hid[draw(hw, u)]), \
                f"case {case} {p} u={u}"


def test_model_ties_and_nan():
    """Equal logits go to the lower id at the top-k boundary; NaN logits are never drawn."""
    x = np.full(4096, -5.0, np.float32)
    x[[7, 300, 301, 2000]] = 3.0
    x[[5, 4000]] = np.nan
    zero = np.zeros(4096, np.int32)
    ids, _ = reference_candidates(x, zero, SamplingParams(top_k=3))
    assert ids.tolist() == [7, 300, 301]
    assert reference_token(x, zero, SamplingParams(temperature=0.0), 0.0) == 7
    assert reference_token(x, zero, SamplingParams(top_k=2, temperature=1.0), 0.999) == 300
    counts = zero.copy()
    counts[7] = 2  # frequency 1 -> 3 - 2 = 1 < 3: id 300 is now first
    assert reference_token(x, counts, SamplingParams(temperature=0.0, frequency_penalty=1.0), 0.0) == 300


# --- numpy emulation of the kernels' compare-exchange networks (cute_kernels/sample.py) -------------

def _before(va, ia, vb, ib):
    return (va > vb) | ((va == vb) & (ia < ib))


def _network(V, I, regs, run, stages):
    """The kernels' `_network` on one warp: V, I [32, regs], element e = lane * regs + r."""
    lane = np.arange(32)
    for size, stride in stages:
        for r in range(regs):
            e = lane * regs + r
            desc = (e & (run - 1) & size) == 0
            if stride < regs:
                if r & stride == 0:
                    b = r + stride
                    swap = desc == _before(V[:, b], I[:, b], V[:, r], I[:, r])
                    V[swap, r], V[swap, b] = V[swap, b].copy(), V[swap, r].copy()
                    I[swap, r], I[swap, b] = I[swap, b].copy(), I[swap, r].copy()
            else:
                m = stride // regs
                pv, pi = V[lane ^ m, r].copy(), I[lane ^ m, r].copy()
                keep_better = ((lane & m) == 0) == desc
                pb = _before(pv, pi, V[:, r], I[:, r])
                take = (pb | _before(V[:, r], I[:, r], pv, pi)) & (keep_better == pb)
                V[take, r], I[take, r] = pv[take], pi[take]


def _merge_tree(sV, sI, sample):
    """`_merge_tree`: LISTS sorted runs of K_MAX -> the best K_MAX in [0, K_MAX), warp by warp."""
    k, regs = sample.K_MAX, sample.MERGE_REGS
    lane = np.arange(32)
    lists = sample.LISTS
    for rnd in range(lists.bit_length() - 1):
        for j in range(lists >> (rnd + 1)):
            a = j * (k << (rnd + 1))
            b = a + (k << rnd)
            V, I = np.empty((32, regs), np.float32), np.empty((32, regs), np.int64)
            for r in range(regs):
                e = lane * regs + r
                va, ia, vb, ib = sV[a + e], sI[a + e], sV[b + k - 1 - e], sI[b + k - 1 - e]
                better = _before(vb, ib, va, ia)
                V[:, r], I[:, r] = np.where(better, vb, va), np.where(better, ib, ia)
            _network(V, I, regs, 2 * k, sample.MERGE_STAGES)
            sV[a:a + k], sI[a:a + k] = V.reshape(-1), I.reshape(-1)


def _emulate_topk(x, sample):
    """SampleTopK on penalised fp32 logits x [N]: the per-slice (values, ids), K_MAX each."""
    s, k = sample.SLICE, sample.K_MAX
    slices = -(-x.size // s)
    pad = np.full(slices * s, -np.inf, np.float32)
    pad[:x.size] = x
    ids = np.arange(slices * s, dtype=np.int64)
    ids[x.size:] = sample.PAD_ID
    pv, pi = [], []
    for b in range(slices):
        sV, sI = pad[b * s:(b + 1) * s].copy(), ids[b * s:(b + 1) * s].copy()
        for w in range(sample.WARPS):
            seg = slice(w * 32 * sample.REGS, (w + 1) * 32 * sample.REGS)
            V, I = sV[seg].reshape(32, sample.REGS).copy(), sI[seg].reshape(32, sample.REGS).copy()
            _network(V, I, sample.REGS, k, sample.sort_stages(sample.REGS, k))
            sV[seg], sI[seg] = V.reshape(-1), I.reshape(-1)
        _merge_tree(sV, sI, sample)
        pv.append(sV[:k])
        pi.append(sI[:k])
    return np.concatenate(pv), np.concatenate(pi)


def _emulate_pick(pv, pi, params, u, sample):
    """SamplePick: merge tree, then warp 0's weights / sums / ballots; returns the token."""
    s, k = sample.SLICE, sample.K_MAX
    sV = np.full(s, -np.inf, np.float32)
    sI = np.full(s, sample.PAD_ID, np.int64)
    sV[:pv.size], sI[:pi.size] = pv, pi
    _merge_tree(sV, sI, sample)
    top_k, inv_t, top_p, min_p = sv._device_scalars(params)
    top_p, min_p, u = np.float32(top_p), np.float32(min_p), np.float32(sv._u32(u))
    e = np.arange(k)
    with np.errstate(invalid="ignore", over="ignore"):
        w = np.where(e < top_k, np.exp((sV[:k] - sV[0]) * np.float32(inv_t)), np.float32(0)).astype(np.float32)
    total = np.float64(0)
    for j in range(k):
        total += np.float64(w[j])
    wn = (w * np.float32(1.0 / total)).astype(np.float32)
    cum = np.empty(k, np.float64)
    run = np.float64(0)
    for j in range(k):
        run += np.float64(wn[j])
        cum[j] = run
    kept = top_k
    if top_p < 1:
        kept = min(int(np.count_nonzero((e < top_k) & (cum < np.float64(top_p) * run))) + 1, top_k)
    n = int(np.count_nonzero((e < kept) & (wn >= min_p * wn[0])))
    last = max(n - 1, 0)
    pick = min(int(np.count_nonzero((e < n) & (cum <= np.float64(u) * cum[last]))), last)
    return int(sI[pick])


def _penalised(x, counts, params):
    pen = np.float32(params.presence_penalty) + np.float32(params.frequency_penalty) * counts.astype(np.float32)
    y = np.where(counts > 0, x - pen, x).astype(np.float32)
    y[np.isnan(y)] = -np.inf
    return y


@dsl
def test_emulated_networks_sort_like_lexsort():
    """The kernels' bitonic schedules (run in numpy) give each slice's best K_MAX by (value desc, id asc),
    with heavy ties (bf16-coarse values), -inf, and a partial last slice; the merge tree the global best."""
    from cute_kernels import sample

    rng = np.random.default_rng(5)
    for n, scale in ((4096 * 3 + 8, 3.0), (4104, 0.05), (8192, 0.0)):
        x = np.round(rng.normal(0, scale, n) * 4).astype(np.float32) / 4  # few distinct values: ties
        x[rng.choice(n, 50, replace=False)] = -np.inf
        pv, pi = _emulate_topk(x, sample)
        for b in range(-(-n // sample.SLICE)):
            lo, hi = b * sample.SLICE, min((b + 1) * sample.SLICE, n)
            order = np.lexsort((np.arange(lo, hi), -x[lo:hi]))[:sample.K_MAX] + lo
            got = pi[b * sample.K_MAX:(b + 1) * sample.K_MAX]
            np.testing.assert_array_equal(got[:order.size], order, err_msg=f"n={n} slice {b}")
        sV = np.full(sample.SLICE, -np.inf, np.float32)
        sI = np.full(sample.SLICE, sample.PAD_ID, np.int64)
        sV[:pv.size], sI[:pi.size] = pv, pi
        _merge_tree(sV, sI, sample)
        want = np.lexsort((np.arange(n), -x))[:sample.K_MAX]
        np.testing.assert_array_equal(sI[:sample.K_MAX], want, err_msg=f"n={n} merged")


@dsl
def test_emulated_kernels_match_the_model():
    """Both kernels emulated in numpy pick `reference_token`'s token over a grid of parameters and draws."""
    from cute_kernels import sample

    rng = np.random.default_rng(11)
    n = 3 * 4096 + 1000
    for case in range(24):
        p = _params(rng, case)
        x = rng.normal(0, 3, n).astype(np.float32)
        if case % 5 == 0:
            x = np.round(x)  # ties at the top-k boundary
        counts = np.zeros(n, np.int32)
        counts[rng.choice(n, 300, replace=False)] = rng.integers(1, 4, 300)
        pv, pi = _emulate_topk(_penalised(x, counts, p), sample)
        for u in (0.0, *rng.random(6)):
            assert _emulate_pick(pv, pi, p, u, sample) == reference_token(x, counts, p, u), f"case {case} {p} u={u}"
