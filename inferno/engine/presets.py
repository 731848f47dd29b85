"""Default sampling per model family and thinking mode, and the override order.

Resolution, lowest priority first (as NInfer's server documents it):
1. the family preset for the model identity and the request's thinking mode; a model with no
   preset uses its artifact's `generation_config.json` (temperature, top_k, top_p, min_p,
   presence/frequency penalty; `do_sample: false` means greedy), else `SamplingParams()`;
2. each override mapping in order (process flags, then request fields); None values are skipped;
3. `greedy=True` finally forces temperature 0.

Family presets (Qwen's published recommendations, as registered in NInfer):
27B (3.6 and 3.8) thinking 1.0 / 0.95 / 20 / 0 / 0 (temperature / top_p / top_k / min_p /
presence penalty), non-thinking 0.7 / 0.80 / 20 / 0 / 1.5; 35B-A3B the same except a thinking
presence penalty of 1.5. Frequency penalty 0 everywhere.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from inferno.engine.params import SamplingParams

_THINKING = {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "presence_penalty": 0.0}
_NON_THINKING = {"temperature": 0.7, "top_p": 0.80, "top_k": 20, "min_p": 0.0, "presence_penalty": 1.5}

#: model_id prefix -> (thinking preset, non-thinking preset)
FAMILY_PRESETS: dict[str, tuple[dict[str, float], dict[str, float]]] = {
    "qwen3.6-27b": (_THINKING, _NON_THINKING),
    "qwen3.8-27b": (_THINKING, _NON_THINKING),
    "qwen3.6-35b-a3b": ({**_THINKING, "presence_penalty": 1.5}, _NON_THINKING),
}

_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams))
_GENERATION_CONFIG_FIELDS = ("temperature", "top_k", "top_p", "min_p", "presence_penalty", "frequency_penalty")


def family_of(identity: str | None) -> str | None:
    """The preset family of an identity (`model_id/weights_id` or a checkpoint dir name), if any."""
    if not identity:
        return None
    model_id = identity.split("/", 1)[0].strip().lower()
    for family in sorted(FAMILY_PRESETS, key=len, reverse=True):
        if model_id.startswith(family):
            return family
    return None


def model_defaults(identity: str | None, thinking: bool, generation_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Sampling fields this model uses when nothing overrides them."""
    family = family_of(identity)
    if family is not None:
        return dict(FAMILY_PRESETS[family][0 if thinking else 1])
    out: dict[str, Any] = {}
    gc = generation_config or {}
    for name in _GENERATION_CONFIG_FIELDS:
        value = gc.get(name)
        if name == "top_k" and isinstance(value, int) and not isinstance(value, bool):
            out[name] = max(value, 0)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = float(value)
    if gc.get("do_sample") is False:
        out["temperature"] = 0.0
    return out


def resolve_sampling(
    identity: str | None,
    thinking: bool,
    generation_config: Mapping[str, Any] | None = None,
    *overrides: Mapping[str, Any] | None,
    greedy: bool = False,
) -> SamplingParams:
    """`SamplingParams` from the model's defaults and the override layers (see module doc)."""
    fields = model_defaults(identity, thinking, generation_config)
    for layer in overrides:
        for name, value in (layer or {}).items():
            if name not in _FIELDS:
                raise KeyError(f"unknown sampling field {name!r}; expected one of {_FIELDS}")
            if value is not None:
                fields[name] = value
    if greedy:
        fields["temperature"] = 0.0
    return SamplingParams(**fields)
