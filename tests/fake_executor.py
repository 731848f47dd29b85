"""A deterministic toy `Executor` for engine and pipeline tests (no model, no weights).

The logits peak at `next_token(tokens so far)`, so greedy decoding is predictable. It checks
the protocol's rules (no use of a released state, every state released) and records what the
engine asked of it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class FakeConfig:
    vocab: int = 64
    eos_token_ids: tuple[int, ...] = (63,)
    max_position: int = 4096


@dataclass
class FakeState:
    tokens: list[int] = field(default_factory=list)
    n_prompt: int = 0  # tokens given by prefill (all prefills precede the steps)
    released: bool = False


def default_next(tokens: Sequence[int], vocab: int) -> int:
    """A token that depends on the whole sequence; never the last id (the default EOS)."""
    return (sum(tokens) * 7 + len(tokens)) % (vocab - 1)


class FakeExecutor:
    def __init__(
        self,
        config: FakeConfig | None = None,
        next_token: Callable[[Sequence[int]], int] | None = None,
        delay: float = 0.0,
        gate: threading.Event | None = None,
        fail_after: int | None = None,
        script: Sequence[int] | None = None,
    ):
        """`script`: the tokens to produce in order (then the first EOS id), whatever the prompt."""
        self.config = config or FakeConfig()
        self.next_token = next_token or (lambda toks: default_next(toks, self.config.vocab))
        self.script = None if script is None else list(script)
        self.delay = delay
        self.gate = gate  # step() waits for it
        self.fail_after = fail_after  # step() raises after this many steps
        self.prefill_calls: list[int] = []
        self.steps = 0
        self.states: list[FakeState] = []
        self._active = 0
        self.max_active_calls = 0
        self._lock = threading.Lock()

    def _enter(self) -> None:
        with self._lock:
            self._active += 1
            self.max_active_calls = max(self.max_active_calls, self._active)

    def _exit(self) -> None:
        with self._lock:
            self._active -= 1

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        out = np.full(self.config.vocab, -5.0, np.float32)
        out[self.next_token(tokens)] = 5.0
        return out

    def _logits_for(self, state: FakeState) -> np.ndarray:
        if self.script is None:
            return self.logits(state.tokens)
        i = len(state.tokens) - state.n_prompt
        out = np.full(self.config.vocab, -5.0, np.float32)
        out[self.script[i] if i < len(self.script) else self.config.eos_token_ids[0]] = 5.0
        return out

    def new_state(self) -> FakeState:
        state = FakeState()
        self.states.append(state)
        return state

    def prefill(self, tokens: Sequence[int], state: FakeState) -> np.ndarray:
        assert not state.released, "prefill on a released state"
        self._enter()
        try:
            self.prefill_calls.append(len(tokens))
            state.tokens.extend(tokens)
            state.n_prompt = len(state.tokens)
            time.sleep(self.delay)
            return self._logits_for(state)
        finally:
            self._exit()

    def step(self, token: int, state: FakeState) -> np.ndarray:
        assert not state.released, "step on a released state"
        if self.gate is not None:
            assert self.gate.wait(10), "test gate never opened"
        self._enter()
        try:
            self.steps += 1
            if self.fail_after is not None and self.steps > self.fail_after:
                raise RuntimeError("executor failure")
            state.tokens.append(token)
            time.sleep(self.delay)
            return self._logits_for(state)
        finally:
            self._exit()

    def release(self, state: FakeState) -> None:
        assert not state.released, "state released twice"
        state.released = True

    def all_released(self) -> bool:
        return all(s.released for s in self.states)


def greedy_continuation(prompt: Sequence[int], n: int, vocab: int = 64) -> list[int]:
    """What greedy decoding of the default fake yields for `prompt` (n tokens, no EOS logic)."""
    toks = list(prompt)
    out = []
    for _ in range(n):
        t = default_next(toks, vocab)
        out.append(t)
        toks.append(t)
    return out
