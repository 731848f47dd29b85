"""Synthetic `.ninfer` artifacts written directly: random codes and scales, no HF intermediate.

`synthesize_artifact("qwen3.6-27b", "out.ninfer")` writes a full-size artifact of a registered
identity (or of a TEST identity for the tiny presets) tensor by tensor, streaming: peak memory is
about one encoded tensor. Values are random but numerically sane (each tensor's values have about
the spread the synthetic HF checkpoint would give it, `inferno.checkpoint.synth.distribution`):
- Q4/Q5/Q6/W8: uniform random codes (W8 never -128), binary16 group scales jittered around
  std * sqrt(3) / qmax; physical padding zero as the layout requires.
- NVFP4: uniform random E2M1 codes, E4M3 scales in [16, 30], matrix divisor set for that std.
- BF16/FP32: normal or uniform draws; the draft-head id map and NVFP4 input divisors as in convert.
Resources are the synthetic checkpoint's (tokenizer, template, configs), plus config.json for TEST
identities.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np

from inferno.artifact import formats
from inferno.artifact.container import ArtifactWriter, Identity
from inferno.artifact.convert import Progress, assemble_row_split, draft_ids, token_domain
from inferno.artifact.formats import groupwise
from inferno.artifact.identities import (
    CONFIG_RESOURCE,
    ExpectedTensor,
    default_model_id,
    first_config_mismatch,
    lookup,
)
from inferno.artifact.naming import hf_shapes
from inferno.errors import ArtifactError, UsageError
from inferno.model.config import ModelConfig

BLOCK_ELEMS = 1 << 24
_E2M1_RMS = float(np.sqrt(np.mean(np.array([0, .5, 1, 1.5, 2, 3, 4, 6]) ** 2)))
_E4M3_16_TO_30 = np.arange(88, 96, dtype=np.uint8)  # E4M3FN words of 16, 18, ..., 30
_QMAX = {"Q4G64_F16S": 7, "Q5G64_F16S": 15, "Q6G64_F16S": 31, "W8G32_F16S": 127}


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, zlib.crc32(name.encode())])))


def _spread(e: ExpectedTensor, shapes: dict[str, tuple[int, ...]]) -> tuple[str, float, float]:
    """The value distribution of the tensor's first HF source (checkpoint synth's choice)."""
    from inferno.checkpoint.synth import distribution

    hf = e.rule.pieces[0].hf if e.rule.pieces else e.name
    return distribution(hf, shapes.get(hf, e.shape))


def _std(kind: str, a: float, b: float) -> float:
    return b if kind == "normal" else max(abs(a), abs(b)) / np.sqrt(3.0)


def random_row_split(fmt: str, shape: tuple[int, ...], std: float, rng: np.random.Generator) -> np.ndarray:
    """A valid row-split-k128-v1 payload of random codes whose values have about `std` spread."""
    rows, k = shape
    qmax = _QMAX[fmt]
    geo = groupwise.geometry(fmt, shape)
    groups = rows * geo.groups_per_row
    scale = std * np.sqrt(3.0) / qmax
    if k == geo.k_pad:  # no padding lanes: every byte of the code planes is free
        out = np.zeros(geo.nbytes, dtype=np.uint8)
        for off, n in ((geo.base_offset, geo.base_bytes), (geo.high_offset, geo.high_bytes)):
            for s in range(0, n, BLOCK_ELEMS):
                m = min(BLOCK_ELEMS, n - s)
                out[off + s: off + s + m] = np.frombuffer(rng.bytes(m), dtype=np.uint8)
        if fmt == "W8G32_F16S":
            base = out[: geo.base_bytes]
            base[base == 0x80] = 0
        scales = (rng.uniform(0.5, 1.5, groups) * scale).astype("<f2")
        out[geo.scale_offset:] = scales.view(np.uint8)
        return out
    step = max(1, BLOCK_ELEMS // k)
    ng = -(-k // geo.scheme.group)

    def blocks():
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            codes = rng.integers(-qmax, qmax + 1, size=(r1 - r0, k), dtype=np.int8)
            scales = (rng.uniform(0.5, 1.5, (r1 - r0, ng)) * scale).astype(np.float16)
            yield r0, r1, groupwise.pack(fmt, codes, scales)

    return assemble_row_split(fmt, rows, k, blocks())


def random_nvfp4(shape: tuple[int, ...], std: float, rng: np.random.Generator) -> np.ndarray:
    """A valid blockscale-k16-m128x4-v1 payload of random E2M1 codes with about `std` spread."""
    from inferno.artifact.formats import nvfp4

    geo = nvfp4.geometry(shape)
    out = np.zeros(geo.nbytes, dtype=np.uint8)
    out[: geo.code_bytes] = np.frombuffer(rng.bytes(geo.code_bytes), dtype=np.uint8)
    out[geo.scale_offset: geo.scale_offset + geo.scale_bytes] = rng.choice(_E4M3_16_TO_30, geo.scale_bytes)
    divisor = np.float32(23.0 * _E2M1_RMS / std)
    out[geo.divisor_offset:] = np.frombuffer(divisor.astype("<f4").tobytes(), dtype=np.uint8)
    return out


def random_payload(e: ExpectedTensor, shapes: dict[str, tuple[int, ...]], seed: int, ids: np.ndarray) -> np.ndarray:
    """The payload bytes of one expected tensor."""
    if e.rule.source == "ids":
        return formats.encode(e.format, e.layout, ids)
    if e.rule.source == "divisor":
        return formats.encode(e.format, e.layout, np.ones((), dtype=np.float32))
    rng = _rng(seed, e.name)
    kind, a, b = _spread(e, shapes)
    if e.layout == formats.ROW_SPLIT:
        return random_row_split(e.format, e.shape, _std(kind, a, b), rng)
    if e.layout == formats.BLOCKSCALE:
        return random_nvfp4(e.shape, _std(kind, a, b), rng)
    n = int(np.prod(e.shape, dtype=np.int64))
    if kind == "uniform":
        x = rng.uniform(a, b, n).astype(np.float32)
    else:
        x = (rng.standard_normal(n, dtype=np.float32) * np.float32(b) + np.float32(a))
    words = x.astype(ml_dtypes.bfloat16) if e.format == "BF16" else x
    return formats.encode(e.format, e.layout, words.reshape(e.shape))


def preset_resources(preset_name: str, seed: int) -> tuple[dict, dict[str, bytes]]:
    """(HF config.json dict, frontend resources) of a checkpoint-synth preset."""
    from inferno.checkpoint import synth as ck
    from inferno.checkpoint.presets import get_preset
    from inferno.frontend import tokenizer_build

    preset = get_preset(preset_name)
    vocab = preset.text["vocab_size"]
    config = ck.hf_config(preset, seed)

    def js(d: dict) -> bytes:
        return (json.dumps(d, indent=2, ensure_ascii=False) + "\n").encode("utf-8")

    resources = {
        "frontend/tokenizer.json": tokenizer_build.build_tiny_tokenizer(vocab).encode("utf-8"),
        "frontend/tokenizer_config.json": js(tokenizer_build.build_tokenizer_config(vocab)),
        "frontend/chat_template.jinja": ck.chat_template().encode("utf-8"),
        "frontend/generation_config.json": js(ck.generation_config(vocab)),
        "frontend/preprocessor_config.json": js(ck.preprocessor_config(preset.vision)),
        "frontend/video_preprocessor_config.json": js(ck.video_preprocessor_config(preset.vision)),
    }
    return config, resources


def synthesize_artifact(
    preset: str,
    out: str | os.PathLike,
    weights_id: str = "groupwise-int",
    model_id: str | None = None,
    seed: int = 0,
    progress: bool = True,
) -> Path:
    """Write a synthetic artifact of the checkpoint-synth `preset` (e.g. qwen3.6-27b) to `out`."""
    out = Path(out)
    if out.suffix != ".ninfer" or out.is_dir():
        raise UsageError(f"output {out} must be a file name ending in .ninfer")
    hf, resources = preset_resources(preset, seed)
    generation = json.loads(resources["frontend/generation_config.json"])
    config = ModelConfig.from_hf(hf, generation)
    spec = lookup(model_id or default_model_id(config), weights_id)
    if spec.hf_config is not None:
        mismatch = first_config_mismatch(spec.builtin_config(), config)
        if mismatch:
            raise ArtifactError(f"preset {preset} does not have the shapes of {spec.model_id} ({mismatch})")
    if spec.is_test:
        resources[CONFIG_RESOURCE] = (json.dumps(hf, indent=2) + "\n").encode("utf-8")
    expected = spec.expected(config)
    shapes = hf_shapes(config, spec.dflash)
    domain, special = token_domain(resources, config.vocab)
    ids = draft_ids(spec.draft_rows(config), domain, special)
    writer = ArtifactWriter(
        out, Identity(spec.model_id, spec.weights_id),
        tensors=[(e.name, e.shape, e.format, e.layout) for e in expected],
        resources=[(name, len(data)) for name, data in resources.items()],
    )
    with writer:
        for name, data in resources.items():
            writer.write_resource(name, data)
        sizes = {o.name: o.bytes for o in writer.objects}
        bar = Progress(f"synth {out.name}", sum(sizes[e.name] for e in expected), progress)
        for e in expected:
            writer.write_tensor(e.name, random_payload(e, shapes, seed, ids))
            bar.advance(sizes[e.name])
        bar.close()
    return out
