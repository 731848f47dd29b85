"""Request-level data of the engine: sampling parameters, generation requests, token events.

`SamplingParams` validates its ranges on construction (`SamplingError`, one line naming the
field and the accepted range). Temperature 0 means greedy (argmax); `top_k` 0, `top_p` 1 and
`min_p` 0 disable their filters; penalties follow OpenAI's definition over the generated tokens
(logit -= presence * [count > 0] + frequency * count).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from inferno.engine.errors import RequestError, SamplingError

FinishReason = Literal["stop", "length", "cancelled"]

_PENALTY_RANGE = (-2.0, 2.0)
_MAX_SEED = 2**64 - 1


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SamplingError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SamplingError(f"{name} must be an integer, got {value!r}")
    return value


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token. Defaults sample the model's full distribution at temperature 1."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        t = _number("temperature", self.temperature)
        if t < 0:
            raise SamplingError(f"temperature must be >= 0 (0 = greedy), got {t}")
        if _integer("top_k", self.top_k) < 0:
            raise SamplingError(f"top_k must be >= 0 (0 = no top-k filter), got {self.top_k}")
        p = _number("top_p", self.top_p)
        if not 0 < p <= 1:
            raise SamplingError(f"top_p must be in (0, 1] (1 = no nucleus filter), got {p}")
        m = _number("min_p", self.min_p)
        if not 0 <= m <= 1:
            raise SamplingError(f"min_p must be in [0, 1] (0 = no min-p filter), got {m}")
        lo, hi = _PENALTY_RANGE
        for name in ("presence_penalty", "frequency_penalty"):
            v = _number(name, getattr(self, name))
            if not lo <= v <= hi:
                raise SamplingError(f"{name} must be in [{lo}, {hi}], got {v}")
        if self.seed is not None and not 0 <= _integer("seed", self.seed) <= _MAX_SEED:
            raise SamplingError(f"seed must be in [0, 2**64), got {self.seed}")

    @property
    def greedy(self) -> bool:
        """True when the next token is the argmax of the (penalised) logits."""
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


@dataclass(frozen=True)
class GenerationRequest:
    """Token-level request: continue `prompt_ids` by at most `max_new_tokens` tokens.

    Generation stops at the model's EOS ids (from its config; not with `ignore_eos`, e.g. for
    benchmarks that need a fixed length) and at `stop_token_ids`; the stop token is reported
    (and counted) but is the last one.
    """

    prompt_ids: Sequence[int]
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", tuple(self.prompt_ids))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise RequestError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")


@dataclass(frozen=True)
class GenerationStats:
    """Counts and timings of one finished request (DESIGN.md seed metrics).

    `prefill_s` runs from the start of prefill to the first sampled token; `decode_s` from there
    to the last token. `queue_s` is the wait for a lane.
    """

    prompt_tokens: int
    completion_tokens: int
    queue_s: float
    prefill_s: float
    decode_s: float

    @property
    def prefill_tok_s(self) -> float:
        """Prompt tokens / prefill seconds."""
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        """(Completion tokens - 1) / decode seconds."""
        n = self.completion_tokens - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0


@dataclass(frozen=True)
class TokenEvent:
    """One generated token, or the end of the request.

    The last event carries `finish_reason` and `stats`; its `token_id` is the final token
    (the EOS / stop token for "stop", the last counted token for "length") or None when no
    token came with the end ("cancelled").
    """

    token_id: int | None
    finish_reason: FinishReason | None = None
    stats: GenerationStats | None = None
