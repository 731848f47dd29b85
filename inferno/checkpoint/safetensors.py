"""Safetensors files: a zero-copy reader, a streaming writer, and sharded checkpoint directories.

Format (https://github.com/huggingface/safetensors): 8-byte little-endian header length N, N bytes
of JSON `{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}`
(space-padded), then the data buffer; offsets are relative to the buffer, tensors are C-order,
little-endian, and cover the buffer without holes or overlaps.

Reading maps the file and hands out read-only numpy views (no copy). Writing declares every
(name, dtype, shape) up front, so the header is final before the first byte of data, then takes
tensors one at a time, each whole or as row blocks, so a writer never holds more than one block.
A sharded checkpoint is `model-0000k-of-0000n.safetensors` files plus
`model.safetensors.index.json` (`{"metadata": {"total_size": bytes}, "weight_map": {name: file}}`).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from inferno.errors import ArtifactError

DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_NAMES_BY_DTYPE = {dt: name for name, dt in DTYPES.items()}

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MAX_HEADER_BYTES = 100 * 1024 * 1024
DEFAULT_SHARD_BYTES = 5 * 1024**3


def dtype_name(dtype: np.dtype | type) -> str:
    """The safetensors dtype string for a numpy dtype (raises ArtifactError for unsupported ones)."""
    dt = np.dtype(dtype)
    if dt.byteorder == ">":
        dt = dt.newbyteorder("<")
    try:
        return _NAMES_BY_DTYPE[dt]
    except KeyError:
        raise ArtifactError(f"numpy dtype {dt} has no safetensors equivalent; convert it first") from None


@dataclass(frozen=True)
class TensorInfo:
    """One header entry: dtype string, shape, and [begin, end) in the data buffer."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def _nbytes(dtype: str, shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype].itemsize


class SafetensorsFile:
    """A memory-mapped safetensors file; `get(name)` returns a read-only zero-copy numpy view."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < 8:
                    raise self._bad(f"{size} bytes is too short for a header")
                (n,) = struct.unpack("<Q", f.read(8))
                if n > min(size - 8, MAX_HEADER_BYTES):
                    raise self._bad(f"header length {n} exceeds the file ({size} bytes)")
                raw = f.read(n)
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size > 8 + n else None
        except OSError as e:
            raise ArtifactError(f"cannot read {self.path}: {e.strerror or e}") from None
        self._data_start = 8 + n
        self.metadata, self.tensors = self._parse_header(raw, size - self._data_start)

    def _bad(self, why: str) -> ArtifactError:
        return ArtifactError(f"{self.path} is not a valid safetensors file ({why}); re-download or re-create it")

    def _parse_header(self, raw: bytes, data_size: int) -> tuple[dict[str, str], dict[str, TensorInfo]]:
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise self._bad(f"header is not JSON: {e}") from None
        if not isinstance(header, dict):
            raise self._bad("header is not a JSON object")
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise self._bad("__metadata__ must map strings to strings")
        tensors: dict[str, TensorInfo] = {}
        for name, entry in header.items():
            tensors[name] = self._parse_entry(name, entry)
        end = 0
        for name, info in sorted(tensors.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
            if info.begin != end:
                raise self._bad(f"tensor {name!r} starts at {info.begin}, expected {end} (hole or overlap)")
            end = info.end
        if end != data_size:
            raise self._bad(f"tensors cover {end} data bytes but the file holds {data_size} (truncated, or trailing bytes)")
        return metadata, tensors

    def _parse_entry(self, name: str, entry: object) -> TensorInfo:
        if not isinstance(entry, dict):
            raise self._bad(f"entry {name!r} is not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in DTYPES:
            raise self._bad(f"tensor {name!r} has unsupported dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise self._bad(f"tensor {name!r} has a bad shape {shape!r}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise self._bad(f"tensor {name!r} has bad data_offsets {offsets!r}")
        info = TensorInfo(dtype, tuple(shape), offsets[0], offsets[1])
        if info.nbytes != _nbytes(dtype, shape):
            raise self._bad(f"tensor {name!r} spans {info.nbytes} bytes but {dtype}{list(shape)} needs {_nbytes(dtype, shape)}")
        return info

    def names(self) -> list[str]:
        return list(self.tensors)

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def __len__(self) -> int:
        return len(self.tensors)

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise ArtifactError(f"tensor {name!r} is not in {self.path}") from None

    def get(self, name: str) -> np.ndarray:
        """The tensor as stored (dtype and shape from the header), a read-only view of the map."""
        info = self.info(name)
        dt = DTYPES[info.dtype]
        if info.nbytes == 0:
            return np.zeros(info.shape, dt)
        arr = np.frombuffer(self._map, dt, info.nbytes // dt.itemsize, self._data_start + info.begin)
        return arr.reshape(info.shape)

    def raw(self, name: str) -> memoryview:
        """The tensor's bytes, zero-copy."""
        info = self.info(name)
        if info.nbytes == 0:
            return memoryview(b"")
        start = self._data_start + info.begin
        return memoryview(self._map)[start : start + info.nbytes]


@dataclass(frozen=True)
class TensorSpec:
    """A tensor to be written: name, safetensors dtype string, shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return _nbytes(self.dtype, self.shape)


def _spec(s: TensorSpec | tuple) -> TensorSpec:
    if isinstance(s, TensorSpec):
        spec = s
    else:
        name, dtype, shape = s
        spec = TensorSpec(name, dtype if isinstance(dtype, str) else dtype_name(dtype), tuple(int(d) for d in shape))
    if spec.dtype not in DTYPES:
        raise ArtifactError(f"tensor {spec.name!r}: unsupported dtype {spec.dtype!r}; use one of {', '.join(DTYPES)}")
    return spec


def header_bytes(specs: Sequence[TensorSpec], metadata: dict[str, str] | None = None) -> bytes:
    """The length prefix plus the JSON header (space-padded to 8 bytes) for tensors laid out in order."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for s in specs:
        if s.name in header or s.name == "__metadata__":
            raise ArtifactError(f"tensor name {s.name!r} is used twice")
        header[s.name] = {"dtype": s.dtype, "shape": list(s.shape), "data_offsets": [offset, offset + s.nbytes]}
        offset += s.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


class SafetensorsWriter:
    """Writes one safetensors file tensor by tensor, in the declared order.

    ```
    with SafetensorsWriter(path, [("w", "BF16", (4, 8))]) as w:
        w.write("w", array)                 # whole, or
        w.write("w", iter_of_row_blocks)    # blocks along axis 0
    ```
    The file is written to `path + ".partial"` and renamed on a clean close; an error (or a
    tensor left unwritten) removes it.
    """

    def __init__(self, path: str | os.PathLike, specs: Iterable[TensorSpec | tuple], metadata: dict[str, str] | None = None):
        self.path = Path(path)
        self.specs = [_spec(s) for s in specs]
        self._tmp = self.path.with_name(self.path.name + ".partial")
        self._next = 0
        self._file = open(self._tmp, "wb")
        self._file.write(header_bytes(self.specs, metadata))

    def write(self, name: str, data: np.ndarray | Iterable[np.ndarray]) -> None:
        """Write the next declared tensor: one array, or an iterable of row blocks (axis 0)."""
        if self._next >= len(self.specs):
            raise ArtifactError(f"tensor {name!r} was not declared for {self.path}")
        spec = self.specs[self._next]
        if name != spec.name:
            raise ArtifactError(f"tensors must be written in declared order: expected {spec.name!r}, got {name!r}")
        dt = DTYPES[spec.dtype]
        blocks = [data] if isinstance(data, np.ndarray) else data
        rows = 0
        for block in blocks:
            block = np.asarray(block)
            if block.dtype != dt:
                raise ArtifactError(f"tensor {name!r}: got {block.dtype}, declared {spec.dtype}")
            if isinstance(data, np.ndarray):
                if block.shape != spec.shape:
                    raise ArtifactError(f"tensor {name!r}: got shape {block.shape}, declared {spec.shape}")
                rows = spec.shape[0] if spec.shape else 1
            else:
                if not spec.shape or block.shape[1:] != spec.shape[1:]:
                    raise ArtifactError(f"tensor {name!r}: block shape {block.shape} does not fit {spec.shape}")
                rows += block.shape[0]
            self._file.write(np.ascontiguousarray(block).reshape(-1).view(np.uint8).data)
        if rows != (spec.shape[0] if spec.shape else 1):
            raise ArtifactError(f"tensor {name!r}: wrote {rows} rows, declared {spec.shape}")
        self._next += 1

    def close(self) -> None:
        """Finish the file; raise if a declared tensor was not written."""
        if self._file.closed:
            return
        self._file.close()
        if self._next != len(self.specs):
            self._tmp.unlink(missing_ok=True)
            raise ArtifactError(f"{self.path}: tensor {self.specs[self._next].name!r} was declared but never written")
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        """Drop the partial file."""
        self._file.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def save_file(path: str | os.PathLike, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Write a dict of arrays to one safetensors file."""
    specs = [TensorSpec(n, dtype_name(a.dtype), tuple(a.shape)) for n, a in tensors.items()]
    with SafetensorsWriter(path, specs, metadata) as w:
        for name, arr in tensors.items():
            w.write(name, arr)


def plan_shards(specs: Sequence[TensorSpec], max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> list[list[TensorSpec]]:
    """Split specs, in order, into shards of at most max_shard_bytes (a larger tensor gets its own)."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for s in specs:
        if shards[-1] and size + s.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += s.nbytes
    return shards


def shard_file_names(n: int) -> list[str]:
    """HF shard names: one shard is `model.safetensors`, else `model-0000k-of-0000n.safetensors`."""
    if n == 1:
        return [SINGLE_FILE]
    return [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]


def write_checkpoint(
    directory: str | os.PathLike,
    specs: Sequence[TensorSpec | tuple],
    produce,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    metadata: dict[str, str] | None = None,
    progress=None,
) -> list[Path]:
    """Write tensors into a (sharded) safetensors checkpoint directory, one tensor at a time.

    `produce(spec)` returns the tensor's data (an array, or an iterable of row blocks); it is called
    in spec order, so only one tensor (or block) is alive at a time. `progress(done_bytes, total)`
    is called after each tensor. Writes `model.safetensors.index.json` when there is more than one
    shard. Returns the shard paths.
    """
    directory = Path(directory)
    specs = [_spec(s) for s in specs]
    shards = plan_shards(specs, max_shard_bytes)
    files = shard_file_names(len(shards))
    total = sum(s.nbytes for s in specs)
    done = 0
    paths = []
    for fname, shard in zip(files, shards):
        with SafetensorsWriter(directory / fname, shard, {"format": "pt", **(metadata or {})}) as w:
            for s in shard:
                w.write(s.name, produce(s))
                done += s.nbytes
                if progress is not None:
                    progress(done, total)
        paths.append(directory / fname)
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": total},
            "weight_map": {s.name: f for f, shard in zip(files, shards) for s in shard},
        }
        (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return paths


class SafetensorsDir:
    """All tensors of a checkpoint directory, by name, across its safetensors files.

    With `model.safetensors.index.json` the index decides which files belong (and every name it
    lists must be in its file); without one, every `*.safetensors` file in the directory counts
    (e.g. `model.safetensors` plus a separate `mtp.safetensors`). A name in two files is an error.
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.files: dict[str, SafetensorsFile] = {}
        self._where: dict[str, SafetensorsFile] = {}
        index_path = self.directory / INDEX_FILE
        if index_path.is_file():
            weight_map = self._read_index(index_path)
            names = sorted(set(weight_map.values()))
        else:
            weight_map = None
            names = sorted(p.name for p in self.directory.glob("*.safetensors"))
        if not names:
            raise ArtifactError(f"{self.directory} holds no *.safetensors files; point at an HF checkpoint directory")
        for fname in names:
            path = self.directory / fname
            if not path.is_file():
                raise ArtifactError(f"{index_path} lists {fname}, which is missing; download the whole checkpoint")
            sf = SafetensorsFile(path)
            self.files[fname] = sf
            for name in sf.tensors:
                if name in self._where:
                    raise ArtifactError(f"tensor {name!r} is in both {self._where[name].path.name} and {fname}")
                self._where[name] = sf
        if weight_map is not None:
            for name, fname in weight_map.items():
                if self._where.get(name) is not self.files[fname]:
                    raise ArtifactError(f"{index_path} puts {name!r} in {fname}, but that file does not hold it")

    def _read_index(self, path: Path) -> dict[str, str]:
        try:
            index = json.loads(path.read_text())
            weight_map = index["weight_map"]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise ArtifactError(f"{path} is not a valid safetensors index ({e}); re-download it") from None
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and "/" not in v for k, v in weight_map.items()
        ):
            raise ArtifactError(f"{path}: weight_map must map tensor names to file names in the directory")
        return weight_map

    def names(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def __len__(self) -> int:
        return len(self._where)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def info(self, name: str) -> TensorInfo:
        return self._file(name).info(name)

    def get(self, name: str) -> np.ndarray:
        """The stored tensor (zero-copy view)."""
        return self._file(name).get(name)

    def _file(self, name: str) -> SafetensorsFile:
        try:
            return self._where[name]
        except KeyError:
            raise ArtifactError(f"tensor {name!r} is not in the checkpoint {self.directory}") from None
