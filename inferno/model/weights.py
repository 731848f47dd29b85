"""Weights: HF tensor names -> float32 numpy arrays, in one canonical naming.

Canonical names: text-model tensors under `model.language_model.` (checkpoints that use the
`model.` prefix are renamed), `lm_head.weight`, `mtp.*` and `model.visual.*` unchanged. MoE
experts are presented fused, as in the official layout:
`<layer>.mlp.experts.gate_up_proj` [E, 2I, H] (gate rows first) and
`<layer>.mlp.experts.down_proj` [E, H, I]; checkpoints that store per-expert
`<layer>.mlp.experts.{e}.{gate,up,down}_proj.weight` are fused on the way in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

import numpy as np

from inferno.errors import ArtifactError

TEXT_PREFIX = "model.language_model."
_KEEP_PREFIXES = (TEXT_PREFIX, "model.visual.", "lm_head.", "mtp.")
PER_EXPERT_NAME = re.compile(r"^(?P<base>.+\.mlp\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


@runtime_checkable
class Weights(Protocol):
    """Read-only access to a model's tensors by canonical HF name."""

    def names(self) -> list[str]: ...

    def __contains__(self, name: object) -> bool: ...

    def get(self, name: str) -> np.ndarray:
        """The tensor as float32 in its HF shape; `ArtifactError` naming it when absent."""
        ...


def canonical_name(name: str) -> str:
    """Map a checkpoint tensor name to its canonical name (`model.X` -> `model.language_model.X`)."""
    if name.startswith(_KEEP_PREFIXES):
        return name
    if name.startswith("model."):
        return TEXT_PREFIX + name[len("model.") :]
    return name


def missing_tensor(name: str) -> ArtifactError:
    """The error for a tensor a model needs but its checkpoint lacks."""
    return ArtifactError(f"tensor {name} is missing from the checkpoint; it is incomplete or not a Qwen3.5-family model")


def fuse_experts(per_expert: Mapping[int, Mapping[str, np.ndarray]], base: str) -> dict[str, np.ndarray]:
    """Fuse `{expert: {gate_proj, up_proj, down_proj}}` into the canonical `gate_up_proj` / `down_proj`."""
    count = max(per_expert) + 1
    gate_up, down = [], []
    for e in range(count):
        parts = per_expert.get(e, {})
        for proj in ("gate_proj", "up_proj", "down_proj"):
            if proj not in parts:
                raise missing_tensor(f"{base}.{e}.{proj}.weight")
        gate, up, dn = parts["gate_proj"], parts["up_proj"], parts["down_proj"]
        if gate.shape != up.shape or gate.ndim != 2 or dn.shape != gate.shape[::-1]:
            raise ArtifactError(
                f"tensors {base}.{e}.*_proj.weight have inconsistent shapes "
                f"{gate.shape}/{up.shape}/{dn.shape}; the checkpoint is damaged"
            )
        gate_up.append(np.concatenate([gate, up], axis=0))
        down.append(dn)
    shapes = {a.shape for a in gate_up}
    if len(shapes) != 1:
        raise ArtifactError(f"experts under {base} have different shapes {sorted(shapes)}; the checkpoint is damaged")
    return {f"{base}.gate_up_proj": np.stack(gate_up), f"{base}.down_proj": np.stack(down)}


class DictWeights:
    """`Weights` over an in-memory dict of numpy arrays (any float dtype, incl. ml_dtypes bf16)."""

    def __init__(self, tensors: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]]):
        items = tensors.items() if isinstance(tensors, Mapping) else tensors
        self._tensors: dict[str, np.ndarray] = {}
        experts: dict[str, dict[int, dict[str, np.ndarray]]] = {}
        for raw_name, array in items:
            name = canonical_name(raw_name)
            match = PER_EXPERT_NAME.match(name)
            if match:
                slot = experts.setdefault(match["base"], {}).setdefault(int(match["expert"]), {})
                if match["proj"] in slot:
                    raise ArtifactError(f"tensor {name} appears twice (under two prefixes); the checkpoint is ambiguous")
                slot[match["proj"]] = np.asarray(array)
            else:
                self._add(name, np.asarray(array))
        for base, per_expert in experts.items():
            for name, array in fuse_experts(per_expert, base).items():
                self._add(name, array)

    def _add(self, name: str, array: np.ndarray) -> None:
        if name in self._tensors:
            raise ArtifactError(f"tensor {name} appears twice (fused and per-expert, or under two prefixes); "
                                "the checkpoint is ambiguous")
        self._tensors[name] = array

    def names(self) -> list[str]:
        return sorted(self._tensors)

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def get(self, name: str) -> np.ndarray:
        try:
            array = self._tensors[name]
        except KeyError:
            raise missing_tensor(name) from None
        return array.astype(np.float32, copy=False)
