"""`ReferenceExecutor`: the whole model in fp32 numpy, the ground truth for every other executor."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from inferno.errors import ArtifactError, UsageError
from inferno.model.config import ModelConfig
from inferno.model.executor import State
from inferno.model.reference.layers import decoder_layer
from inferno.model.reference.loader import ModelWeights, load_model_weights
from inferno.model.reference.mtp import mtp_hidden
from inferno.model.reference.norms import rms_norm
from inferno.model.weights import Weights


@dataclass(frozen=True)
class MtpOutput:
    logits: np.ndarray  # [T, vocab]: predictions for the tokens two places after each input position
    hidden: np.ndarray  # [T, hidden]: MTP hidden states (after mtp.norm), the input of the next draft step


class ReferenceExecutor:
    """Runs a Qwen3.5-family model (dense or MoE) on explicit `State`s, fp32 numpy.

    Besides the `Executor` protocol: `forward` (all logits), `hidden` (final-normed hidden
    states, the lm-head input), `logits`, and the MTP head (`mtp`).
    """

    def __init__(self, config: ModelConfig, weights: Weights):
        self.config = config
        self.model: ModelWeights = load_model_weights(config, weights)

    # ---- Executor protocol --------------------------------------------------------------------
    def new_state(self) -> State:
        return State.empty(self.config)

    def prefill(self, tokens: Sequence[int], state: State) -> np.ndarray:
        """Append `tokens`; logits of the last one, `[vocab]`."""
        return self.logits(self.hidden(tokens, state)[-1:])[0]

    def step(self, token: int, state: State) -> np.ndarray:
        """Append one token; its logits, `[vocab]`."""
        return self.prefill([token], state)

    def release(self, state: State) -> None:
        """Drop the state's caches; it cannot be used afterwards."""
        state.kv.clear()
        state.gdn.clear()
        state.mtp = None
        state.released = True

    # ---- reference extras ---------------------------------------------------------------------
    def forward(self, tokens: Sequence[int], state: State, all_logits: bool = True) -> np.ndarray:
        """Append `tokens`; logits `[T, vocab]` of every token, or `[vocab]` of the last."""
        hidden = self.hidden(tokens, state)
        return self.logits(hidden) if all_logits else self.logits(hidden[-1:])[0]

    def hidden(self, tokens: Sequence[int], state: State) -> np.ndarray:
        """Append `tokens`; their final-normed hidden states `[T, hidden]` (the lm-head input)."""
        ids = self._token_ids(tokens)
        if state.released:
            raise UsageError("this sequence state was released; create a new one with new_state()")
        positions = np.arange(state.position, state.position + ids.shape[0])
        x = self.model.embed[ids]
        for i, layer in enumerate(self.model.layers):
            cache = state.kv[i] if i in state.kv else state.gdn[i]
            x = decoder_layer(x, layer, self.config, cache, positions)
        state.position += ids.shape[0]
        return rms_norm(x, self.model.norm, self.config.rms_eps)

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """LM head: `[..., hidden]` -> `[..., vocab]`."""
        return hidden @ self.model.lm_head

    @property
    def has_mtp(self) -> bool:
        """Whether the checkpoint carries an MTP head."""
        return self.model.mtp is not None

    def mtp(
        self, hidden: np.ndarray, next_tokens: Sequence[int], position: int, state: State, step: int = 0
    ) -> MtpOutput:
        """One MTP draft step over T consecutive positions starting at `position`.

        `hidden[i]` is the hidden state at position `position + i` (the target's final-normed
        hidden state, or the previous step's `MtpOutput.hidden`) and `next_tokens[i]` the token
        at the position after it. Appends to the MTP layer's K/V in `state`; MTP layer
        `step % mtp_layers` is used. `logits[i]` predicts the token at `position + i + 2`.
        """
        w = self.model.mtp
        if w is None or state.mtp is None:
            raise ArtifactError("this checkpoint has no MTP head (mtp.* tensors); run without MTP drafting")
        ids = self._token_ids(next_tokens)
        hidden = np.asarray(hidden, np.float32).reshape(-1, self.config.hidden)
        if hidden.shape[0] != ids.shape[0]:
            raise UsageError(f"MTP needs one hidden state per token, got {hidden.shape[0]} and {ids.shape[0]}")
        layer = step % len(w.layers)
        positions = np.arange(position, position + ids.shape[0])
        out = mtp_hidden(self.model.embed[ids], hidden, w, self.config, layer, state.mtp.kv[layer], positions)
        return MtpOutput(logits=self.logits(out), hidden=out)

    def _token_ids(self, tokens: Sequence[int]) -> np.ndarray:
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise UsageError("no tokens to run; the prompt must have at least one token")
        bad = ids[(ids < 0) | (ids >= self.config.vocab)]
        if bad.size:
            raise UsageError(f"token id {int(bad[0])} is outside the vocabulary (0..{self.config.vocab - 1})")
        return ids
