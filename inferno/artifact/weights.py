"""`ArtifactWeights`: the `Weights` view (HF names, float32, HF shapes) of an open `.ninfer` artifact.

Each HF tensor is rebuilt from the artifact tensors that hold its rows (undoing fusions, the
per-head q/gate split, the tap-major convolution and the expert flattening) through the same
`naming` rules the converter used, and dequantized to float32. Derived tensors (the draft head,
a tied output head) are not HF tensors and are not presented.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from inferno.artifact import formats
from inferno.artifact.container import Artifact
from inferno.artifact.identities import ExpectedTensor, IdentitySpec
from inferno.artifact.naming import hf_shapes, scatter, view_rows
from inferno.errors import ArtifactError
from inferno.model.config import ModelConfig
from inferno.model.weights import missing_tensor

_CACHE = 4  # decoded parents kept (a q_proj needs two parents, each shared with another tensor)


class ArtifactWeights:
    """`inferno.model.weights.Weights` over an artifact already checked against its identity."""

    def __init__(self, artifact: Artifact, spec: IdentitySpec, config: ModelConfig, expected: list[ExpectedTensor]):
        self.artifact = artifact
        self.spec = spec
        self.shapes = hf_shapes(config, spec.dflash)
        self._holders: dict[str, list[ExpectedTensor]] = {}
        for e in expected:
            for piece in e.rule.pieces:
                if not piece.derived and piece.hf in self.shapes:
                    holders = self._holders.setdefault(piece.hf, [])
                    if e not in holders:
                        holders.append(e)
        self._decoded: OrderedDict[str, np.ndarray] = OrderedDict()

    def names(self) -> list[str]:
        return sorted(self._holders)

    def __contains__(self, name: object) -> bool:
        return name in self._holders

    def decoded(self, e: ExpectedTensor) -> np.ndarray:
        """One artifact tensor dequantized to float32 in its stored shape (small LRU cache)."""
        value = self._decoded.get(e.name)
        if value is None:
            value = formats.decode(e.format, e.layout, self.artifact.tensor_bytes(e.name), e.shape)
            self._decoded[e.name] = value
            while len(self._decoded) > _CACHE:
                self._decoded.popitem(last=False)
        else:
            self._decoded.move_to_end(e.name)
        return value

    def get(self, name: str) -> np.ndarray:
        holders = self._holders.get(name)
        if holders is None:
            raise missing_tensor(name)
        shape = self.shapes[name]
        out = np.empty(shape, dtype=np.float32)
        rows = sum(scatter(e.rule, self.decoded(e), name, out, self.shapes) for e in holders)
        want = view_rows(holders[0].rule, shape)
        if rows != want:
            raise ArtifactError(f"{self.artifact.path}: tensor {name} is only partly held ({rows}/{want} rows)")
        return out
