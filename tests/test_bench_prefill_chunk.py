"""`--prefill-chunk auto|N` (inferno/bench/prefill_chunk.py): the flag's parsing and the sizing rule
(the largest of 1024..8192 tokens, capped at the longest prompt, whose residency plan fits)."""

from __future__ import annotations

import pytest

from inferno.artifact.identities import lookup
from inferno.bench.prefill_chunk import (
    CANDIDATES,
    auto_prefill_chunk,
    candidates,
    gpu_prefill_chunk,
    parse_prefill_chunk,
)
from inferno.checkpoint.presets import get_preset
from inferno.errors import UsageError
from inferno.model.config import ModelConfig
from inferno.model.gpu.residency import HEADROOM, plan_residency

GiB = 2**30


@pytest.mark.parametrize("text, want", [("auto", None), ("AUTO", None), (" auto ", None), ("1", 1), ("2048", 2048),
                                        ("4_096", 4096), (8192, 8192), ("65535", 65535)])
def test_parse(text, want):
    assert parse_prefill_chunk(text) == want


@pytest.mark.parametrize("text", ["0", "-1", "65536", "abc", "1.5", "", "1e3", "2k", "²"])
def test_parse_rejects_with_one_line(text):
    with pytest.raises(UsageError) as e:
        parse_prefill_chunk(text)
    assert "--prefill-chunk takes 'auto' or a token count 1..65535" in str(e.value) and "\n" not in str(e.value)


def test_candidates_are_powers_of_two_capped_at_the_longest_prompt():
    assert CANDIDATES == (1024, 2048, 4096, 8192)
    assert candidates(None) == (8192, 4096, 2048, 1024)
    assert candidates(7936) == (7936, 4096, 2048, 1024)  # 7,680 prompt + 256 decode: one chunk, not 8,192
    assert candidates(3000) == (3000, 2048, 1024)
    assert candidates(500) == (500,)
    assert candidates(1 << 20) == (8192, 4096, 2048, 1024)


def test_auto_takes_the_largest_that_fits():
    def need(chunk: int) -> int:  # a fixed part and a per-token workspace
        return 10_000 + 3 * chunk

    assert auto_prefill_chunk(need, need(8192)) == 8192
    assert auto_prefill_chunk(need, need(8192) - 1) == 4096
    assert auto_prefill_chunk(need, need(2048) + 5) == 2048
    assert auto_prefill_chunk(need, need(1024)) == 1024
    assert auto_prefill_chunk(need, 0) == 1024  # nothing fits: the smallest, the executor names what does not fit
    assert auto_prefill_chunk(need, None) == 1024  # no device budget (reference executor)
    assert auto_prefill_chunk(need, need(3000), longest=3000) == 3000
    assert auto_prefill_chunk(need, None, longest=300) == 300


@pytest.fixture(scope="module")
def q27():
    config = ModelConfig.from_hf({**get_preset("qwen3.6-27b").text})
    spec = lookup("qwen3.6-27b", "nvfp4")
    return config, spec.expected(config), spec.plan


def test_gpu_rule_on_the_27b_plan(q27):
    """The full-size 27B (nvfp4 identity): the prefill buffers grow with the chunk, and the rule takes
    the largest chunk whose whole plan plus headroom fits the free bytes it is given."""
    config, expected, fusion = q27
    inventory = {e.name: e for e in expected}
    ctx = 7680 + 256

    def need(chunk: int) -> int:
        return plan_residency(config, inventory, 1, ctx, fusion, chunk).arena_bytes + HEADROOM

    needs = [need(c) for c in (1024, 2048, 4096, ctx)]
    assert needs == sorted(needs) and needs[-1] - needs[0] > GiB  # ~0.6 GiB -> ~2.5 GiB of prefill buffers
    assert gpu_prefill_chunk(config, expected, fusion, 1, ctx, 140 * GiB) == ctx  # an H200: the prompt in one chunk
    assert gpu_prefill_chunk(config, expected, fusion, 1, ctx, needs[-1] - 1) == 4096
    assert gpu_prefill_chunk(config, expected, fusion, 1, ctx, needs[1]) == 2048
    assert gpu_prefill_chunk(config, expected, fusion, 1, ctx, needs[0] - 1) == 1024  # does not fit at all
    assert gpu_prefill_chunk(config, expected, fusion, 1, 100_000, 140 * GiB) == 8192
    assert gpu_prefill_chunk(config, expected, fusion, 1, 600, None) == 600
