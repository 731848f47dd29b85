"""HF checkpoint (BF16 safetensors) -> `.ninfer` v2 artifact, one tensor at a time.

The identity registry decides the inventory and formats; `naming` builds each artifact tensor
from HF tensors (fusions, q/gate split, conv transpose, expert flattening). Groupwise tensors are
quantized in row blocks straight into their payload, so peak memory is about one source tensor
plus its encoding plus one block (27B: ~4 GB, at the 248320 x 5120 vocabulary matrices), far below the
model size. The output appears only when complete (atomic rename).

Two things NInfer derives from data we do not have, and what we do instead:
- `text/draft_head_token_ids`: NInfer ranks ids by a token-frequency corpus. Without one we
  take the special tokens plus the lowest other ids (BPE merge order: low ids are frequent
  pieces), stored in ascending id order.
- NVFP4 `input_scale_divisor` (activation calibration): stored as 1.0 (uncalibrated). Decode
  and our executors never read it.
"""

from __future__ import annotations

import json
import struct
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np

from inferno.artifact import formats
from inferno.artifact.container import ArtifactWriter, Identity
from inferno.artifact.formats import groupwise
from inferno.artifact.identities import (
    CONFIG_RESOURCE,
    FRONTEND_RESOURCES,
    ExpectedTensor,
    IdentitySpec,
    default_model_id,
    first_config_mismatch,
    lookup,
)
from inferno.artifact.naming import DFLASH, build, hf_shapes
from inferno.checkpoint.safetensors import DTYPES, SafetensorsDir, TensorInfo
from inferno.checkpoint.source import SafetensorsWeights
from inferno.errors import ArtifactError, UsageError
from inferno.model.config import ModelConfig
from inferno.model.weights import canonical_name

BLOCK_ELEMS = 1 << 24  # elements per quantization block (64 MiB of float32)


class Progress:
    """A one-line byte counter on stderr: `label  done/total MiB  pct  rate`."""

    def __init__(self, label: str, total: int, enabled: bool = True):
        self.label, self.total, self.done = label, max(total, 1), 0
        self.enabled = enabled
        self.start = self._last = time.monotonic()

    def advance(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and now - self._last > 0.5:
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        rate = self.done / max(now - self.start, 1e-9) / 2**20
        pct = 100.0 * self.done / self.total
        print(f"\r{self.label}  {self.done / 2**20:,.0f}/{self.total / 2**20:,.0f} MiB  {pct:5.1f}%  "
              f"{rate:,.0f} MiB/s", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            print(file=sys.stderr, flush=True)


class CheckpointSource:
    """Tensors of a checkpoint directory by canonical name, in their stored dtype.

    Names, shapes and fused per-expert banks come from the checkpoint reader
    (`SafetensorsWeights`). Stored tensors are *read* (not memory-mapped) so each one's memory is
    returned when the converter drops it: a map would keep every page it touched resident. With
    `prefix` (the DFlash drafter's own checkpoint) names are `prefix + stored name`.
    """

    def __init__(self, directory: str | Path, prefix: str = ""):
        files = SafetensorsDir(directory)
        self.weights = SafetensorsWeights(files)
        self.prefix = prefix
        self._where: dict[str, tuple[Path, int, TensorInfo]] = {}
        for f in files.files.values():
            with open(f.path, "rb") as fh:
                data_start = 8 + struct.unpack("<Q", fh.read(8))[0]
            for stored in f.names():
                self._where[canonical_name(stored)] = (f.path, data_start, f.info(stored))

    def _own(self, name: str) -> str | None:
        if not self.prefix:
            return name
        return name[len(self.prefix):] if name.startswith(self.prefix) else None

    def names(self) -> list[str]:
        return [self.prefix + n for n in self.weights.names()]

    def __contains__(self, name: str) -> bool:
        own = self._own(name)
        return own is not None and own in self.weights

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.weights.shape(self._own(name) or name))

    def get(self, name: str) -> np.ndarray:
        """A stored tensor in its dtype; a fused per-expert bank as float32."""
        own = self._own(name) or name
        where = self._where.get(own)
        if where is None:
            return self.weights.get(own)
        path, data_start, info = where
        dtype = DTYPES[info.dtype]
        count = info.nbytes // dtype.itemsize
        return np.fromfile(path, dtype=dtype, count=count, offset=data_start + info.begin).reshape(info.shape)


def token_domain(resources: Mapping[str, bytes], vocab: int) -> tuple[int, list[int]]:
    """(number of tokenizer-addressable ids, special ids) from tokenizer.json / tokenizer_config.json."""
    ids: set[int] = set()
    special: set[int] = set()
    name = "frontend/tokenizer.json"
    try:
        if name in resources:
            data = json.loads(resources[name])
            vocab_map = (data.get("model") or {}).get("vocab") or {}
            ids.update(int(v) for v in (vocab_map.values() if isinstance(vocab_map, dict) else []))
            for t in data.get("added_tokens") or []:
                ids.add(int(t["id"]))
                if t.get("special"):
                    special.add(int(t["id"]))
        name = "frontend/tokenizer_config.json"
        if name in resources:
            for key, t in (json.loads(resources[name]).get("added_tokens_decoder") or {}).items():
                ids.add(int(key))
                if isinstance(t, dict) and t.get("special"):
                    special.add(int(key))
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ArtifactError(f"{name.removeprefix('frontend/')} is not a valid tokenizer file ({e}); "
                            "copy it again from the HF repo") from None
    domain = min(vocab, max(ids) + 1) if ids else vocab
    return domain, sorted(i for i in special if i < domain)


def draft_ids(rows: int, domain: int, special: list[int]) -> np.ndarray:
    """Special ids plus the lowest other ids, `rows` in all, ascending (see the module docstring)."""
    if rows > domain:
        raise ArtifactError(f"the draft head needs {rows} token ids but the tokenizer has only {domain}")
    forced = set(special[:rows])
    rest = [i for i in range(domain) if i not in forced][: rows - len(forced)]
    return np.array(sorted(forced.union(rest)), dtype=np.int32)


def read_resources(hf_dir: Path, spec: IdentitySpec) -> dict[str, bytes]:
    """The frontend resources (and config.json for test identities) from the checkpoint folder."""
    out: dict[str, bytes] = {}
    for name in FRONTEND_RESOURCES:
        path = hf_dir / name.removeprefix("frontend/")
        if path.is_file():
            out[name] = path.read_bytes()
        elif not spec.is_test:
            raise ArtifactError(f"{path} is missing; {spec.name} artifacts carry it (copy it from the HF repo)")
    if spec.is_test:
        out[CONFIG_RESOURCE] = (hf_dir / "config.json").read_bytes()
    return {k: v for k, v in out.items() if v}


def encode_tensor(e: ExpectedTensor, value: np.ndarray) -> np.ndarray:
    """Encode a logical value; groupwise tensors in row blocks written straight into the payload."""
    if e.layout != formats.ROW_SPLIT:
        return formats.encode(e.format, e.layout, value)
    value = value.reshape(-1, value.shape[-1])
    rows, k = value.shape
    step = max(1, BLOCK_ELEMS // k)
    if rows <= step:
        return formats.encode(e.format, e.layout, value)
    blocks = (
        (r0, min(rows, r0 + step), formats.encode(e.format, e.layout, value[r0:r0 + step]))
        for r0 in range(0, rows, step)
    )
    return assemble_row_split(e.format, rows, k, blocks)


def assemble_row_split(fmt: str, rows: int, k: int, blocks: Iterable[tuple[int, int, np.ndarray]]) -> np.ndarray:
    """One row-split-k128-v1 payload from the payloads of its row blocks (first row, end row, bytes).

    A block of rows is itself a valid payload (storage-layouts.md §3.7): its three planes are
    copied to those rows' places in the parent's planes.
    """
    geo = groupwise.geometry(fmt, (rows, k))
    out = np.zeros(geo.nbytes, dtype=np.uint8)
    gpr = geo.groups_per_row
    widths = (geo.scheme.base_bytes * gpr, geo.scheme.high_bytes * gpr, 2 * gpr)
    for r0, r1, block in blocks:
        bg = groupwise.geometry(fmt, (r1 - r0, k))
        for dst, src, width in zip((geo.base_offset, geo.high_offset, geo.scale_offset),
                                   (bg.base_offset, bg.high_offset, bg.scale_offset), widths):
            if width:
                out[dst + r0 * width: dst + r1 * width] = block[src: src + (r1 - r0) * width]
    return out


def convert(
    hf_dir: str | Path,
    out: str | Path,
    weights_id: str,
    model_id: str | None = None,
    dflash_dir: str | Path | None = None,
    progress: bool = True,
) -> Path:
    """Convert the checkpoint in `hf_dir` to the artifact `out`; returns the path written."""
    hf_dir, out = Path(hf_dir), Path(out)
    if not hf_dir.is_dir():
        raise UsageError(f"{hf_dir} is not a directory; point at an HF checkpoint folder")
    if out.is_dir():
        raise UsageError(f"output {out} is a directory; give a file name ending in .ninfer")
    config = ModelConfig.from_dir(hf_dir)
    spec = lookup(model_id or default_model_id(config), weights_id)
    if spec.hf_config is not None:
        mismatch = first_config_mismatch(spec.builtin_config(), config)
        if mismatch:
            raise ArtifactError(f"{hf_dir} is not a {spec.model_id} checkpoint ({mismatch})")
    fetchers = {"base": CheckpointSource(hf_dir)}
    resources = read_resources(hf_dir, spec)
    if spec.is_test:
        config = _fit_test_config(config, fetchers["base"], resources)
    if spec.dflash is not None:
        if dflash_dir is None:
            raise UsageError(f"{spec.name} packs the DFlash drafter; pass its checkpoint with --dflash DIR")
        fetchers["dflash"] = CheckpointSource(dflash_dir, prefix=DFLASH)
    _check_sources(config, spec, fetchers)
    expected = spec.expected(config)
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
        bar = Progress(f"convert {out.name}", sum(sizes[e.name] for e in expected), progress)
        for e in expected:
            writer.write_tensor(e.name, _encoded(e, fetchers, ids))  # no payload outlives its write
            bar.advance(sizes[e.name])
        bar.close()
    return out


def _fit_test_config(config: ModelConfig, src: CheckpointSource, resources: dict[str, bytes]) -> ModelConfig:
    """Test identities follow what the checkpoint ships: a config that promises MTP or vision
    tensors the files lack (e.g. a transformers export) is stored with them switched off."""
    has_mtp = "mtp.fc.weight" in src
    has_vision = any(n.startswith("model.visual.") for n in src.names())
    if (config.mtp_layers == 0 or has_mtp) and (config.vision is None or has_vision):
        return config
    raw = json.loads(resources[CONFIG_RESOURCE])
    text = raw.get("text_config", raw)
    if config.mtp_layers and not has_mtp:
        text["mtp_num_hidden_layers"] = 0
    if config.vision is not None and not has_vision:
        raw.pop("vision_config", None)
    resources[CONFIG_RESOURCE] = (json.dumps(raw, indent=2) + "\n").encode("utf-8")
    generation = json.loads(resources.get("frontend/generation_config.json", b"{}"))
    return ModelConfig.from_hf(raw, generation)


def _encoded(e: ExpectedTensor, fetchers: Mapping[str, CheckpointSource], ids: np.ndarray) -> np.ndarray:
    try:
        return encode_tensor(e, _value(e, fetchers, ids))
    except ArtifactError as err:
        raise ArtifactError(f"{e.name} ({e.format}): {err}") from None


def _value(e: ExpectedTensor, fetchers: Mapping[str, CheckpointSource], ids: np.ndarray) -> np.ndarray:
    source = e.rule.source
    if source == "ids":
        return ids
    if source == "divisor":
        return np.ones((), dtype=np.float32)
    fetch: Callable[[str], np.ndarray] = fetchers[source].get
    return build(e.rule, fetch, ids)


def _check_sources(config: ModelConfig, spec: IdentitySpec, fetchers: Mapping[str, CheckpointSource]) -> None:
    """Every HF tensor the inventory needs exists with its expected shape (before any output)."""
    for name, shape in hf_shapes(config, spec.dflash).items():
        src = fetchers["dflash" if name.startswith(DFLASH) else "base"]
        if name not in src:
            raise ArtifactError(f"tensor {name} is missing from the checkpoint; {spec.name} needs it")
        got = src.shape(name)
        if got != shape:
            raise ArtifactError(f"tensor {name} has shape {list(got)}, expected {list(shape)} for this config")
