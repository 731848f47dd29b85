"""How many prompt tokens one prefill call takes: the `--prefill-chunk auto|N` rule.

Every prefill chunk dequantizes every weight matrix again before its GEMM (about 33 ms a chunk
on the 27B), so fewer, larger chunks prefill faster; but the prefill workspace (activations of
every chunk token, `inferno.model.gpu.residency.prefill_buffers`) grows with the chunk. `auto`
takes the largest of 1024, 2048, 4096 and 8192 tokens, each capped at the longest prompt the
executor can be given (its max context), whose whole residency plan (weights, KV cache, GDN
state, workspace, prefill buffers, headroom) fits the free device memory. When not even 1024
fits, 1024: the executor then says what does not fit and which flag helps. Without a device
memory budget (the numpy reference executor) `auto` is 1024.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from inferno.errors import UsageError

if TYPE_CHECKING:  # light to import: the CLI modules import this one at start-up
    from inferno.artifact.identities import ExpectedTensor
    from inferno.model.config import ModelConfig

AUTO = "auto"
CANDIDATES = (1024, 2048, 4096, 8192)  # tokens, smallest first
NO_BUDGET_CHUNK = CANDIDATES[0]


def parse_prefill_chunk(value: str | int) -> int | None:
    """'auto' -> None (choose with `auto_prefill_chunk`); 'N' -> N. UsageError for anything else."""
    from inferno.model.gpu.residency import MAX_PREFILL_CHUNK

    text = str(value).strip().lower().replace("_", "")
    if text == AUTO:
        return None
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_PREFILL_CHUNK:
        raise UsageError(f"--prefill-chunk takes 'auto' or a token count 1..{MAX_PREFILL_CHUNK}, got {value!r}")
    return int(text)


def candidates(longest: int | None) -> tuple[int, ...]:
    """The chunk sizes `auto` may take, largest first: CANDIDATES capped at `longest` tokens."""
    cap = CANDIDATES[-1] if longest is None else max(1, longest)
    return tuple(sorted({min(c, cap) for c in CANDIDATES}, reverse=True))


def auto_prefill_chunk(need: Callable[[int], int], free: int | None, longest: int | None = None) -> int:
    """The largest candidate chunk whose device need `need(chunk)` (bytes, headroom included) fits in
    `free` bytes; the smallest candidate when none fits or `free` is None (no budget to fit)."""
    sizes = candidates(longest)
    if free is None:
        return sizes[-1]
    return next((c for c in sizes if need(c) <= free), sizes[-1])


def gpu_prefill_chunk(config: ModelConfig, expected: Iterable[ExpectedTensor], fusion: str, max_seqs: int,
                      max_context: int, free: int | None) -> int:
    """`auto` for the GPU executor: residency plans of `config` (artifact inventory `expected`, fusion
    plan `fusion`) for `max_seqs` sequences of `max_context` tokens, against `free` device bytes."""
    from inferno.model.gpu.residency import HEADROOM, plan_residency

    inventory = {e.name: e for e in expected}

    def need(chunk: int) -> int:
        return plan_residency(config, inventory, max_seqs, max_context, fusion, chunk).arena_bytes + HEADROOM

    return auto_prefill_chunk(need, free, max_context)
