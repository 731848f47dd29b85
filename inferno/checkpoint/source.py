"""`open_model(path)`: one way in for HF checkpoint directories and `.ninfer` artifacts.

A directory is an HF checkpoint: `config.json` (parsed by `ModelConfig.from_dir`), the
safetensors files (lazy: nothing is read until a tensor is asked for), and the small resource
files beside them. A `.ninfer` file goes to `inferno.artifact.model_source`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inferno.checkpoint.layout import mtp_tensors, text_tensors
from inferno.checkpoint.safetensors import SafetensorsDir
from inferno.errors import ArtifactError
from inferno.model.config import ModelConfig
from inferno.model.weights import PER_EXPERT_NAME, Weights, canonical_name, fuse_experts, missing_tensor

#: The small files of a model (configs, tokenizer, chat template, preprocessors), read as resources.
RESOURCE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
)

_EXPECTED = "an HF checkpoint directory (config.json + *.safetensors) or a .ninfer file"


@dataclass
class ModelSource:
    """A model opened for inference: its config, weights, resource files and identity."""

    config: ModelConfig
    weights: Weights
    resources: dict[str, bytes]
    identity: str
    path: Path


class SafetensorsWeights:
    """`Weights` over an HF safetensors directory, read lazily (fp32 copies on `get`).

    Names are canonical (`inferno.model.weights.canonical_name`); per-expert MoE tensors are
    presented fused and fused on demand. `stored(name)` gives a stored tensor as is (zero-copy).
    """

    def __init__(self, files: SafetensorsDir):
        self.files = files
        self._direct: dict[str, str] = {}  # canonical -> stored name
        self._experts: dict[str, dict[int, dict[str, str]]] = {}  # fused base -> expert -> proj -> stored
        for stored in files.names():
            name = canonical_name(stored)
            match = PER_EXPERT_NAME.match(name)
            if match:
                slot = self._experts.setdefault(match["base"], {}).setdefault(int(match["expert"]), {})
                if match["proj"] in slot:
                    raise self._twice(name)
                slot[match["proj"]] = stored
            else:
                if name in self._direct:
                    raise self._twice(name)
                self._direct[name] = stored
        for base in self._experts:
            for fused in (f"{base}.gate_up_proj", f"{base}.down_proj"):
                if fused in self._direct:
                    raise self._twice(fused)

    @staticmethod
    def _twice(name: str) -> ArtifactError:
        return ArtifactError(f"tensor {name} appears twice (fused and per-expert, or under two prefixes); "
                             "the checkpoint is ambiguous")

    def names(self) -> list[str]:
        fused = [f"{b}.{p}" for b in self._experts for p in ("gate_up_proj", "down_proj")]
        return sorted([*self._direct, *fused])

    def __contains__(self, name: object) -> bool:
        return name in self._direct or self._expert_base(name) is not None

    def _expert_base(self, name: object) -> str | None:
        if not isinstance(name, str):
            return None
        for suffix in (".gate_up_proj", ".down_proj"):
            if name.endswith(suffix) and name[: -len(suffix)] in self._experts:
                return name[: -len(suffix)]
        return None

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's HF shape, from the headers only."""
        if name in self._direct:
            return self.files.info(self._direct[name]).shape
        base = self._expert_base(name)
        if base is None:
            raise missing_tensor(name)
        per = self._experts[base]
        first = per[min(per)]
        if "gate_proj" not in first or "down_proj" not in first:
            raise missing_tensor(f"{base}.{min(per)}.gate_proj.weight")
        i, h = self.files.info(first["gate_proj"]).shape
        n = max(per) + 1
        return (n, 2 * i, h) if name.endswith("gate_up_proj") else (n, h, i)

    def stored(self, name: str) -> np.ndarray:
        """A non-fused tensor in its stored dtype, zero-copy."""
        if name not in self._direct:
            raise missing_tensor(name)
        return self.files.get(self._direct[name])

    def get(self, name: str) -> np.ndarray:
        if name in self._direct:
            return self.files.get(self._direct[name]).astype(np.float32)
        base = self._expert_base(name)
        if base is None:
            raise missing_tensor(name)
        per = {e: {p: self.files.get(s) for p, s in projs.items()} for e, projs in self._experts[base].items()}
        return fuse_experts(per, base)[name].astype(np.float32)


def _hf_dims(cfg: ModelConfig) -> dict:
    """The HF config fields that `layout` needs, from a parsed ModelConfig."""
    return {
        "hidden_size": cfg.hidden,
        "vocab_size": cfg.vocab,
        "layer_types": list(cfg.layer_types),
        "tie_word_embeddings": cfg.tie_embeddings,
        "head_dim": cfg.head_dim,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "linear_num_key_heads": cfg.gdn_k_heads,
        "linear_num_value_heads": cfg.gdn_v_heads,
        "linear_key_head_dim": cfg.gdn_k_dim,
        "linear_value_head_dim": cfg.gdn_v_dim,
        "linear_conv_kernel_dim": cfg.conv_kernel,
        "intermediate_size": cfg.intermediate,
        "num_experts": cfg.n_experts,
        "moe_intermediate_size": cfg.moe_intermediate,
        "shared_expert_intermediate_size": cfg.shared_intermediate,
        "mtp_num_hidden_layers": cfg.mtp_layers,
    }


def check_weights(cfg: ModelConfig, weights: SafetensorsWeights, where: Path) -> None:
    """Every text-model tensor the config implies is present with its shape (MTP too, if shipped)."""
    dims = _hf_dims(cfg)
    expected = text_tensors(dims, cfg.is_moe)
    if any(n.startswith("mtp.") for n in weights.names()):
        expected += mtp_tensors(dims, cfg.is_moe)
    for name, shape in expected:
        if name not in weights:
            raise ArtifactError(
                f"{where}: tensor {name} is missing; the checkpoint is incomplete or does not match its config.json"
            )
        got = weights.shape(name)
        if got != shape:
            raise ArtifactError(f"{where}: tensor {name} has shape {list(got)}, config.json implies {list(shape)}")


def read_resources(directory: Path) -> dict[str, bytes]:
    """The model's small files (tokenizer, template, configs) by file name."""
    return {name: (directory / name).read_bytes() for name in RESOURCE_FILES if (directory / name).is_file()}


def open_hf_dir(directory: Path) -> ModelSource:
    """Open an HF checkpoint directory (config is checked against the tensor headers)."""
    if not (directory / "config.json").is_file():
        raise ArtifactError(f"{directory} has no config.json; expected {_EXPECTED}")
    cfg = ModelConfig.from_dir(directory)
    weights = SafetensorsWeights(SafetensorsDir(directory))
    check_weights(cfg, weights, directory)
    return ModelSource(cfg, weights, read_resources(directory), directory.resolve().name, directory)


def open_model(path: str | Path) -> ModelSource:
    """Open an HF checkpoint directory or a `.ninfer` artifact."""
    p = Path(path)
    if not p.exists():
        raise ArtifactError(f"{p} does not exist; expected {_EXPECTED}")
    if p.is_dir():
        return open_hf_dir(p)
    if p.suffix == ".ninfer":
        from inferno.artifact import model_source

        return model_source(p)
    raise ArtifactError(f"{p} is neither a directory nor a .ninfer file; expected {_EXPECTED}")
