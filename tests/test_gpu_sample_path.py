"""Device sampling wired through the GPU executor and the engine, on the emulated executor.

`generate` over an executor with `samples_on_device` draws the request's uniform numbers itself and
takes tokens from `prefill_sample` / `step_sample` (the emulator runs the kernels' numpy model,
`reference_token`); the tokens must equal the host `Sampler`'s on the same executor's logits.
The last test runs `step_sample` through CudaOps with recorded launches (test_gpu_launches' executor).
"""

from __future__ import annotations

import pytest

from inferno.artifact.convert import convert
from inferno.checkpoint.synth import synthesize
from inferno.engine.generate import generate
from inferno.engine.params import GenerationRequest, SamplingParams
from inferno.kernels.build import dsl_available
from inferno.model.gpu import GpuExecutor
from test_gpu_launches import artifact, dry  # noqa: F401  (the recorded-launch executor)

SAMPLED = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, presence_penalty=1.5, seed=1234)


class HostOnly:
    """The executor protocol of `ex` without `samples_on_device`: generate samples on the host."""

    def __init__(self, ex: GpuExecutor):
        self.ex, self.config = ex, ex.config

    def new_state(self):
        return self.ex.new_state()

    def prefill(self, tokens, state):
        return self.ex.prefill(tokens, state)

    def step(self, token, state):
        return self.ex.step(token, state)

    def release(self, state):
        self.ex.release(state)


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    root = tmp_path_factory.mktemp("sample-path")
    art = convert(synthesize("tiny-dense", root / "ckpt"), root / "tiny.ninfer", "groupwise-int", progress=False)
    return GpuExecutor(art, emulate=True, max_seqs=2, max_context=192, prefill_chunk=16, progress=False)


def tokens(executor, params: SamplingParams, n: int = 24, prompt_len: int = 40) -> list[int]:
    vocab = executor.config.vocab
    req = GenerationRequest([(3 + 11 * i) % vocab for i in range(prompt_len)], n, params, ignore_eos=True)
    return [e.token_id for e in generate(executor, req, prefill_chunk=16) if e.token_id is not None]


def test_device_sampling_matches_the_host_sampler(emulated):
    assert emulated.samples_on_device(SAMPLED)
    launches = emulated.ops.launches
    device = tokens(emulated, SAMPLED)
    assert emulated.ops.launches > launches
    host = tokens(HostOnly(emulated), SAMPLED)
    assert len(device) == 24
    assert device == host
    assert len(set(device)) > 3  # really sampled, and the presence penalty spreads the picks


def test_device_greedy_with_penalties_matches_the_host(emulated):
    params = SamplingParams(temperature=0.0, presence_penalty=1.0, frequency_penalty=0.5)
    assert emulated.samples_on_device(params)
    assert tokens(emulated, params, prompt_len=5) == tokens(HostOnly(emulated), params, prompt_len=5)


def test_counts_start_from_zero_for_each_state(emulated):
    """A second generation of the same seeded request (reusing the first's slot) gives the same tokens."""
    assert tokens(emulated, SAMPLED, n=8) == tokens(emulated, SAMPLED, n=8)


def test_unsupported_params_stay_on_the_host(emulated):
    wide = SamplingParams(top_k=0, seed=3)
    assert not emulated.samples_on_device(wide)
    s = emulated.new_state()
    try:
        with pytest.raises(Exception, match="not sampled on the device"):
            emulated.prefill_sample([1, 2], s, wide, 0.5)
    finally:
        emulated.release(s)
    assert tokens(emulated, wide, n=6) == tokens(HostOnly(emulated), wide, n=6)


@pytest.mark.skipif(not dsl_available(), reason="the CuTe DSL is not installed (kernels cannot be built)")
def test_device_sampler_launches_pass_the_launchers(dry):
    """`step_sample` on CudaOps (launches recorded, memory emulated): both sampling kernels, right grids."""
    ex, launches = dry
    s = ex.new_state()
    try:
        ex.prefill([3, 4, 5], s)
        launches.clear()
        assert ex.step_sample(9, s, SAMPLED, 0.25) >= 0
        slices = -(-ex.config.vocab // 4096)
        assert launches[-2:] == [("sample_topk_bf16", (slices, 1, 1)), ("sample_pick", (1, 1, 1))]
    finally:
        ex.release(s)
