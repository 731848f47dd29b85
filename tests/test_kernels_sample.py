"""CPU: the device sampling kernels build for every arch; launcher checks and argument packing;
the numpy model of the kernels (`reference_token`) equals the host `Sampler` with the same u."""

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
    from cute_kernels import sample

    assert (sample.K_MAX, sample.SLICE) == (K_MAX, sv.SLICE)  # the launcher's sizes are the kernels'


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
