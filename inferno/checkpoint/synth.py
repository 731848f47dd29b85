"""Synthetic HF checkpoints: `synthesize(preset, out, seed)` writes a Qwen3.5-family directory.

The directory looks like an official BF16 release: config.json, sharded safetensors with the
real tensor names, tokenizer.json / tokenizer_config.json (the frontend's tiny byte-level BPE
with the Qwen added tokens), chat_template.jinja, generation_config.json, and the image / video
preprocessor configs.

Weights are seeded and reproducible: tensor `name` draws from numpy PCG64 seeded with
(seed, crc32(name)), so a tensor's values do not depend on which other tensors exist. Every
parameter is random, including norm weights (a (1+w) norm gets w ~ N(0, 0.2), a plain-weight
norm w ~ N(1, 0.2)), and matrices are scaled 1/sqrt(fan_in), which keeps logits at std ~1.
Per-expert MoE tensors are slices of the fused ones, so both layouts describe the same model.

Fill: tiny presets draw every element. Full-size presets (`tiled_fill`) draw each tensor of
more than `TILE` elements as one seeded block of TILE values (TILE is prime, so rows do not
repeat with the row length) tiled over the tensor; smaller tensors are drawn whole. Tensors are
produced in row blocks and streamed to disk, so memory stays at a few blocks.
"""

from __future__ import annotations

import json
import os
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path

import ml_dtypes
import numpy as np

from inferno.checkpoint.layout import EXPERT_LAYOUTS, checkpoint_tensors
from inferno.checkpoint.presets import Preset, get_preset
from inferno.checkpoint.safetensors import TensorSpec, write_checkpoint
from inferno.errors import ArtifactError, UsageError
from inferno.frontend import tokenizer_build

BF16 = np.dtype(ml_dtypes.bfloat16)
TILE = 1_048_573  # largest prime below 2**20
BLOCK_ELEMS = 1 << 24  # elements per streamed row block (32 MiB of bf16)

Progress = Callable[[int, int], None]


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, zlib.crc32(name.encode())])))


def distribution(name: str, shape: tuple[int, ...]) -> tuple[str, float, float]:
    """(kind, a, b) for a tensor: ("normal", mean, std) or ("uniform", low, high)."""
    if name.endswith("linear_attn.A_log"):
        return "uniform", -3.0, 0.5  # decay rate exp(A_log) in [0.05, 1.65]: memory of a few to ~30 tokens
    if name.endswith("linear_attn.dt_bias"):
        return "normal", 0.0, 0.5
    if name.endswith("linear_attn.norm.weight"):
        return "normal", 1.0, 0.2  # gated norm: plain weight
    if name.startswith("model.visual."):
        if name.endswith(".bias"):
            return "normal", 0.0, 0.1
        if "norm" in name:
            return "normal", 1.0, 0.2  # LayerNorm: plain weight
        if name.endswith("pos_embed.weight"):
            return "normal", 0.0, 0.5
        return "normal", 0.0, float(np.prod(shape[1:])) ** -0.5
    if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        return "normal", 0.0, 0.2  # zero-centred RMSNorm: (1 + w)
    if name.endswith("embed_tokens.weight"):
        return "normal", 0.0, 1.0
    if name.endswith("conv1d.weight"):
        return "normal", 0.0, shape[-1] ** -0.5
    return "normal", 0.0, shape[-1] ** -0.5  # [.., out, in] matrices: 1/sqrt(fan_in)


def _draw(rng: np.random.Generator, kind: str, a: float, b: float, n: int) -> np.ndarray:
    if kind == "uniform":
        x = rng.random(n, dtype=np.float32) * np.float32(b - a) + np.float32(a)
    else:
        x = rng.standard_normal(n, dtype=np.float32) * np.float32(b) + np.float32(a)
    return x.astype(BF16)


def tensor_blocks(name: str, shape: tuple[int, ...], seed: int, tiled: bool) -> Iterator[np.ndarray]:
    """The BF16 values of one tensor as row blocks along axis 0 (one block for small tensors)."""
    kind, a, b = distribution(name, shape)
    rng = _rng(seed, name)
    n = int(np.prod(shape, dtype=np.int64))
    if not tiled or n <= TILE:
        yield _draw(rng, kind, a, b, n).reshape(shape)
        return
    tile = _draw(rng, kind, a, b, TILE)
    row = n // shape[0]
    rows_per_block = max(1, BLOCK_ELEMS // row)
    for r0 in range(0, shape[0], rows_per_block):
        r1 = min(shape[0], r0 + rows_per_block)
        start = (r0 * row) % TILE
        yield np.resize(np.roll(tile, -start), (r1 - r0) * row).reshape((r1 - r0, *shape[1:]))


class _Producer:
    """Produces each spec's data; per-expert tensors are sliced from the fused tensor of their layer."""

    def __init__(self, seed: int, tiled: bool, fused_shapes: dict[str, tuple[int, ...]]):
        self.seed, self.tiled = seed, tiled
        self.fused_shapes = fused_shapes
        self._cache: tuple[str, np.ndarray] | None = None

    def __call__(self, spec: TensorSpec):
        base, sep, rest = spec.name.partition(".mlp.experts.")
        if sep and rest[0].isdigit():
            expert, proj = rest.split(".")[:2]
            fused = self._fused(f"{base}.mlp.experts.{'down_proj' if proj == 'down_proj' else 'gate_up_proj'}")
            e = fused[int(expert)]
            if proj == "down_proj":
                return e
            half = e.shape[0] // 2
            return e[:half] if proj == "gate_proj" else e[half:]
        return tensor_blocks(spec.name, spec.shape, self.seed, self.tiled)

    def _fused(self, name: str) -> np.ndarray:
        if self._cache is None or self._cache[0] != name:
            self._cache = None
            shape = self.fused_shapes[name]
            self._cache = (name, np.concatenate(list(tensor_blocks(name, shape, self.seed, self.tiled))))
        return self._cache[1]


def _token_ids(vocab: int) -> dict[str, int]:
    first = tokenizer_build.first_added_id(vocab)
    return {content: first + i for i, (content, _) in enumerate(tokenizer_build.ADDED_TOKENS)}


def hf_config(preset: Preset, seed: int) -> dict:
    """config.json for a preset: the VLM layout with text_config and vision_config."""
    ids = _token_ids(preset.text["vocab_size"])
    text = dict(preset.text)
    text["bos_token_id"] = ids["<|endoftext|>"]
    text["eos_token_id"] = ids["<|endoftext|>"]
    text["pad_token_id"] = None
    text = dict(sorted(text.items()))
    arch = "Qwen3_5MoeForConditionalGeneration" if preset.moe else "Qwen3_5ForConditionalGeneration"
    return {
        "architectures": [arch],
        "image_token_id": ids["<|image_pad|>"],
        "inferno_synth": {"preset": preset.name, "seed": seed, "fill": "tiled" if preset.tiled_fill else "exact"},
        "model_type": "qwen3_5_moe" if preset.moe else "qwen3_5",
        "text_config": text,
        "tie_word_embeddings": text["tie_word_embeddings"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_config": preset.vision,
        "vision_end_token_id": ids["<|vision_end|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
    }


def generation_config(vocab: int) -> dict:
    """generation_config.json: both stop ids and Qwen's recommended sampling defaults."""
    ids = _token_ids(vocab)
    return {
        "bos_token_id": ids["<|endoftext|>"],
        "do_sample": True,
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "temperature": 1.0,
        "top_k": 20,
        "top_p": 0.95,
    }


def _processor_common(vision: dict) -> dict:
    return {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "merge_size": vision["spatial_merge_size"],
        "patch_size": vision["patch_size"],
        "processor_class": "Qwen3VLProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "temporal_patch_size": vision["temporal_patch_size"],
    }


def preprocessor_config(vision: dict) -> dict:
    """preprocessor_config.json (images): 256^2 to 4096^2 pixels, mean = std = 0.5."""
    return dict(
        sorted(
            {
                **_processor_common(vision),
                "image_processor_type": "Qwen2VLImageProcessorFast",
                "size": {"longest_edge": 16777216, "shortest_edge": 65536},
            }.items()
        )
    )


def video_preprocessor_config(vision: dict) -> dict:
    """video_preprocessor_config.json: 2 fps sampling, 4..768 frames."""
    return dict(
        sorted(
            {
                **_processor_common(vision),
                "do_sample_frames": True,
                "fps": 2,
                "max_frames": 768,
                "min_frames": 4,
                "size": {"longest_edge": 25165824, "shortest_edge": 4096},
                "video_processor_type": "Qwen3VLVideoProcessor",
            }.items()
        )
    )


def chat_template() -> str:
    """The Qwen3.5 chat template the frontend ships."""
    return resources.files("inferno.frontend").joinpath("templates/qwen3_5.jinja").read_text(encoding="utf-8")


def tensor_specs(preset: Preset, expert_layout: str = "fused") -> list[TensorSpec]:
    """Every tensor the preset's checkpoint holds, as BF16 specs in file order."""
    return [TensorSpec(n, "BF16", s) for n, s in checkpoint_tensors(preset.text, preset.vision, preset.moe, expert_layout)]


def _progress_printer(label: str) -> Progress:
    start = time.monotonic()
    last = [start]

    def report(done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - last[0] < 2.0:
            return
        last[0] = now
        rate = done / max(now - start, 1e-9) / 1e6
        print(f"{label}: {done / 1e9:.2f} / {total / 1e9:.2f} GB ({rate:.0f} MB/s)", file=sys.stderr, flush=True)

    return report


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_files(preset: Preset, out: Path, seed: int, expert_layout: str, progress: Progress | None,
                 shard_bytes: int) -> None:
    """The small files (config, tokenizer, template, preprocessors), then the weights."""
    vocab = preset.text["vocab_size"]
    _write_json(out / "config.json", hf_config(preset, seed))
    _write_json(out / "generation_config.json", generation_config(vocab))
    (out / "tokenizer.json").write_text(tokenizer_build.build_tiny_tokenizer(vocab), encoding="utf-8")
    _write_json(out / "tokenizer_config.json", tokenizer_build.build_tokenizer_config(vocab))
    (out / "chat_template.jinja").write_text(chat_template(), encoding="utf-8")
    _write_json(out / "preprocessor_config.json", preprocessor_config(preset.vision))
    _write_json(out / "video_preprocessor_config.json", video_preprocessor_config(preset.vision))

    specs = tensor_specs(preset, expert_layout)
    fused_shapes = {s.name: s.shape for s in tensor_specs(preset, "fused")} if expert_layout != "fused" else {}
    write_checkpoint(
        out,
        specs,
        _Producer(seed, preset.tiled_fill, fused_shapes),
        max_shard_bytes=shard_bytes,
        progress=progress,
    )


def synthesize(
    preset_name: str,
    out: str | os.PathLike,
    seed: int = 0,
    expert_layout: str = "fused",
    progress: Progress | None = None,
    shard_bytes: int | None = None,
) -> Path:
    """Write the preset's HF checkpoint directory to `out` (new or empty); return its path."""
    preset = get_preset(preset_name)
    if expert_layout not in EXPERT_LAYOUTS:
        raise UsageError(f"unknown expert layout {expert_layout!r}; choose one of: {', '.join(EXPERT_LAYOUTS)}")
    if expert_layout != "fused" and not preset.moe:
        raise UsageError(f"preset {preset.name} is dense; --expert-layout applies to MoE presets only")
    if not 0 <= seed < 2**63:
        raise UsageError(f"seed {seed} is out of range; use 0 <= seed < 2**63")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} already exists and is not an empty directory; pick a new output path")
    try:
        out.mkdir(parents=True, exist_ok=True)
        _write_files(preset, out, seed, expert_layout, progress, shard_bytes or preset.shard_bytes)
    except OSError as e:
        raise ArtifactError(f"cannot write {out}: {e.strerror or e}; free some space or pick another path") from None
    return out


def synthesize_with_progress(preset_name: str, out: str | os.PathLike, seed: int = 0, expert_layout: str = "fused") -> Path:
    """`synthesize` with a progress line on stderr every couple of seconds."""
    return synthesize(preset_name, out, seed, expert_layout, progress=_progress_printer(f"synth {preset_name}"))
