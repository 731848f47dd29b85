"""The `.ninfer` container: strict reader (revision 2, and 1 on request) and atomic writer.

File = 16-byte prefix (magic `NINFER\\0` + revision byte, little-endian u64 JSON length), the
UTF-8 JSON directory, zero padding to the next 4096-byte boundary (the payload start), then
payloads at their payload-relative offsets. Source: NInfer `docs/maintainer/artifact-container.md`
(v1 at Neroued/ninfer 5ea3242, v2 at troed/ninfer d02d42a); our summary: docs/artifact-format.md.
"""

from __future__ import annotations

import json
import mmap
import os
import secrets
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inferno.artifact.formats import RESOURCE_ENCODINGS, TENSOR_ALIGNMENT, packed_nbytes
from inferno.artifact.formats.registry import V1_FORMATS, V1_LAYOUTS
from inferno.errors import ArtifactError

MAGIC, REVISION = b"NINFER\0", 2
PREFIX = struct.Struct("<8sQ")
PAYLOAD_ALIGNMENT = 4096

_ROOT_V2 = frozenset({"identity", "objects"})
_ROOT_V1 = frozenset({"model_id", "objects"})
_IDENTITY = frozenset({"model_id", "weights_id"})
_TENSOR = frozenset({"name", "kind", "shape", "format", "layout", "offset", "bytes"})
_RESOURCE = frozenset({"name", "kind", "encoding", "offset", "bytes"})


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


@dataclass(frozen=True)
class TensorEntry:
    """One tensor object: logical shape, format, layout, payload-relative span."""

    name: str
    shape: tuple[int, ...]
    format: str
    layout: str
    offset: int
    bytes: int


@dataclass(frozen=True)
class ResourceEntry:
    """One required resource (e.g. `frontend/tokenizer.json`): encoding and span."""

    name: str
    encoding: str
    offset: int
    bytes: int


@dataclass(frozen=True)
class Identity:
    """The hierarchical artifact identity; `str()` gives `model_id/weights_id`."""

    model_id: str
    weights_id: str

    def __post_init__(self) -> None:
        for field, value in (("model_id", self.model_id), ("weights_id", self.weights_id)):
            if not isinstance(value, str) or not value or "/" in value:
                raise ArtifactError(f"identity {field} must be a nonempty string without '/', got {value!r}")

    def __str__(self) -> str:
        return f"{self.model_id}/{self.weights_id}"

    @classmethod
    def parse(cls, text: str) -> Identity:
        """`model_id/weights_id` -> Identity."""
        model_id, sep, weights_id = text.partition("/")
        if not sep:
            raise ArtifactError(f"identity {text!r} must be written model_id/weights_id")
        return cls(model_id, weights_id)


Entry = TensorEntry | ResourceEntry


# ---------------------------------------------------------------------------------------------
# Directory parsing and validation


class _Checker:
    """Raises one-line ArtifactErrors that name the file, the object and the rule."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, what: str) -> ArtifactError:
        return ArtifactError(f"{self.path}: {what}")

    def members(self, value: Any, expected: frozenset[str], where: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(f"{where} must be a JSON object, got {type(value).__name__}")
        missing, extra = sorted(expected - value.keys()), sorted(value.keys() - expected)
        if missing:
            raise self.fail(f"{where} lacks member(s) {', '.join(missing)}")
        if extra:
            raise self.fail(f"{where} has unknown member(s) {', '.join(extra)}")
        return value

    def string(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(f"{where} must be a nonempty string, got {value!r}")
        return value

    def integer(self, value: Any, where: str, minimum: int) -> int:
        if type(value) is not int:
            raise self.fail(f"{where} must be an integer, got {value!r}")
        if value < minimum:
            raise self.fail(f"{where} must be >= {minimum}, got {value}")
        return value


def _parse_json(chk: _Checker, raw: bytes) -> Any:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
        out: dict = {}
        for key, val in pairs:
            if key in out:
                raise chk.fail(f"JSON directory repeats member {key!r}")
            out[key] = val
        return out

    def no_constants(name: str) -> Any:
        raise chk.fail(f"JSON directory holds the non-JSON number {name}")

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise chk.fail(f"JSON directory is not valid UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constants)
    except json.JSONDecodeError as exc:
        raise chk.fail(f"JSON directory does not parse: {exc.msg} at char {exc.pos}") from None


def _parse_directory(chk: _Checker, root: Any, revision: int) -> tuple[Identity | None, str, list[Entry]]:
    if revision == 2:
        root = chk.members(root, _ROOT_V2, "directory root")
        ident = chk.members(root["identity"], _IDENTITY, "identity")
        model_id = chk.string(ident["model_id"], "identity.model_id")
        weights_id = chk.string(ident["weights_id"], "identity.weights_id")
        try:
            identity: Identity | None = Identity(model_id, weights_id)
        except ArtifactError as exc:
            raise chk.fail(str(exc)) from None
    else:
        root = chk.members(root, _ROOT_V1, "directory root")
        model_id = chk.string(root["model_id"], "model_id")
        identity = None
    objects = root["objects"]
    if not isinstance(objects, list) or not objects:
        raise chk.fail("directory 'objects' must be a nonempty array")
    entries: list[Entry] = []
    seen: set[str] = set()
    for i, obj in enumerate(objects):
        entry = _parse_object(chk, obj, i, revision)
        if entry.name in seen:
            raise chk.fail(f"object name {entry.name!r} appears twice (names must be unique)")
        seen.add(entry.name)
        entries.append(entry)
    return identity, model_id, entries


def _parse_object(chk: _Checker, obj: Any, index: int, revision: int) -> Entry:
    where = f"object #{index}"
    if not isinstance(obj, dict):
        raise chk.fail(f"{where} must be a JSON object, got {type(obj).__name__}")
    kind = obj.get("kind")
    if isinstance(obj.get("name"), str) and obj["name"]:
        where = f"{kind if kind in ('tensor', 'resource') else 'object'} {obj['name']!r}"
    if kind == "tensor":
        chk.members(obj, _TENSOR, where)
        name = chk.string(obj["name"], f"{where} name")
        shape_raw = obj["shape"]
        if not isinstance(shape_raw, list):
            raise chk.fail(f"{where} shape must be an array, got {shape_raw!r}")
        shape = tuple(chk.integer(d, f"{where} shape dimension", 1) for d in shape_raw)
        fmt = chk.string(obj["format"], f"{where} format")
        layout = chk.string(obj["layout"], f"{where} layout")
        offset = chk.integer(obj["offset"], f"{where} offset", 0)
        nbytes = chk.integer(obj["bytes"], f"{where} bytes", 1)
        if revision == 1 and (fmt not in V1_FORMATS or layout not in V1_LAYOUTS):
            raise chk.fail(f"{where}: {fmt}/{layout} is not registered in revision 1")
        try:
            want = packed_nbytes(fmt, layout, shape)
        except ArtifactError as exc:
            raise chk.fail(f"{where}: {exc}") from None
        if nbytes != want:
            raise chk.fail(f"{where} declares {nbytes} bytes but {fmt}/{layout} of shape {list(shape)} "
                           f"needs {want}")
        return TensorEntry(name, shape, fmt, layout, offset, nbytes)
    if kind == "resource":
        chk.members(obj, _RESOURCE, where)
        name = chk.string(obj["name"], f"{where} name")
        encoding = chk.string(obj["encoding"], f"{where} encoding")
        if encoding not in RESOURCE_ENCODINGS:
            raise chk.fail(f"{where} has unknown encoding {encoding!r} (registered: "
                           f"{', '.join(RESOURCE_ENCODINGS)})")
        offset = chk.integer(obj["offset"], f"{where} offset", 0)
        nbytes = chk.integer(obj["bytes"], f"{where} bytes", 1)
        return ResourceEntry(name, encoding, offset, nbytes)
    raise chk.fail(f"{where} kind must be 'tensor' or 'resource', got {kind!r}")


def _alignment(entry: Entry) -> int:
    if isinstance(entry, TensorEntry):
        return TENSOR_ALIGNMENT
    return RESOURCE_ENCODINGS[entry.encoding]


def _check_spans(chk: _Checker, entries: list[Entry], payload_bytes: int) -> None:
    cursor = 0
    previous = None
    for e in entries:
        kind = "tensor" if isinstance(e, TensorEntry) else "resource"
        align = _alignment(e)
        if e.offset < cursor:
            raise chk.fail(f"{kind} {e.name!r} overlaps or precedes {previous!r} "
                           f"(offset {e.offset} < {cursor})")
        if e.offset % align:
            raise chk.fail(f"{kind} {e.name!r} offset {e.offset} is not a multiple of {align}")
        end = e.offset + e.bytes
        if end > payload_bytes:
            raise chk.fail(f"{kind} {e.name!r} ends at payload byte {end}, beyond the file's "
                           f"{payload_bytes} payload bytes (truncated file?)")
        cursor, previous = end, e.name


# ---------------------------------------------------------------------------------------------
# Reader


class Artifact:
    """A validated, memory-mapped `.ninfer` file. Close it (or use `with`) to release the map."""

    def __init__(self, path: Path, revision: int, identity: Identity | None, model_id: str,
                 entries: list[Entry], payload_offset: int, file_size: int,
                 file: Any, mapping: mmap.mmap | None):
        self.path = path
        self.revision = revision
        self.identity = identity
        self.model_id = model_id
        self.objects: list[Entry] = entries
        self.tensors: dict[str, TensorEntry] = {e.name: e for e in entries if isinstance(e, TensorEntry)}
        self.resources: dict[str, ResourceEntry] = {e.name: e for e in entries
                                                    if isinstance(e, ResourceEntry)}
        self.payload_offset = payload_offset
        self.file_size = file_size
        self._file = file
        self._map = mapping

    def _span(self, entry: Entry) -> memoryview:
        if self._map is None:
            raise ArtifactError(f"{self.path}: artifact is closed")
        start = self.payload_offset + entry.offset
        return memoryview(self._map)[start:start + entry.bytes]

    def tensor_bytes(self, name: str) -> memoryview:
        """Zero-copy read-only view of a tensor's payload (valid until `close`)."""
        entry = self.tensors.get(name)
        if entry is None:
            raise ArtifactError(f"{self.path}: no tensor named {name!r} (list them with `inferno inspect`)")
        return self._span(entry)

    def resource(self, name: str) -> bytes:
        """A copy of a resource's bytes."""
        entry = self.resources.get(name)
        if entry is None:
            raise ArtifactError(f"{self.path}: no resource named {name!r} (list them with `inferno inspect`)")
        return bytes(self._span(entry))

    def close(self) -> None:
        """Unmap and close. A still-referenced tensor view keeps the map alive until released."""
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # exported views outlive us; the map closes when they are released
            self._map = None
        self._file.close()

    def __enter__(self) -> Artifact:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        who = str(self.identity) if self.identity else self.model_id
        return (f"Artifact({str(self.path)!r}, v{self.revision}, {who}, "
                f"{len(self.tensors)} tensors, {len(self.resources)} resources)")


def _read_directory(chk: _Checker, f: Any, allow_v1: bool) -> tuple[int, Any, int, int]:
    size = os.fstat(f.fileno()).st_size
    prefix = f.read(PREFIX.size)
    if len(prefix) < PREFIX.size:
        raise chk.fail(f"file is {size} bytes, shorter than the 16-byte .ninfer prefix (truncated?)")
    magic, json_bytes = PREFIX.unpack(prefix)
    if magic[:7] != MAGIC:
        raise chk.fail(f"not a .ninfer file (magic {magic[:7]!r}, expected {MAGIC!r})")
    revision = magic[7]
    if revision not in (1, 2):
        raise chk.fail(f"unsupported .ninfer revision {revision} (this Inferno reads revision 2)")
    if revision == 1 and not allow_v1:
        raise chk.fail(f"revision-1 artifact; convert its header to revision 2 with "
                       f"`inferno migrate {chk.path}`")
    if json_bytes == 0:
        raise chk.fail("JSON directory length is 0")
    metadata_end = PREFIX.size + json_bytes
    payload_offset = _align(metadata_end, PAYLOAD_ALIGNMENT)
    if payload_offset > size:
        raise chk.fail(f"JSON directory ({json_bytes} bytes) and its padding need {payload_offset} "
                       f"bytes but the file has {size} (truncated?)")
    raw = f.read(json_bytes)
    padding = f.read(payload_offset - metadata_end)
    if any(padding):
        raise chk.fail(f"metadata padding before the payload at {payload_offset} is not zero")
    return revision, _parse_json(chk, raw), payload_offset, size


def open_artifact(path: str | os.PathLike, *, allow_v1: bool = False) -> Artifact:
    """Open and fully validate the directory of a `.ninfer` file (payloads stay on disk, mapped).

    Revision 1 (root `model_id` + objects, no NVFP4) is refused unless `allow_v1`.
    Every violation raises ArtifactError naming the file, the object and the rule.
    """
    path = Path(path)
    chk = _Checker(path)
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot open ({exc.strerror})") from None
    try:
        revision, root, payload_offset, size = _read_directory(chk, f, allow_v1)
        identity, model_id, entries = _parse_directory(chk, root, revision)
        _check_spans(chk, entries, size - payload_offset)
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except BaseException:
        f.close()
        raise
    return Artifact(path, revision, identity, model_id, entries, payload_offset, size, f, mapping)


# ---------------------------------------------------------------------------------------------
# Writer


def _directory_json(root: dict) -> bytes:
    return json.dumps(root, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _entry_json(e: Entry) -> dict:
    if isinstance(e, TensorEntry):
        return {"name": e.name, "kind": "tensor", "shape": list(e.shape), "format": e.format,
                "layout": e.layout, "offset": e.offset, "bytes": e.bytes}
    return {"name": e.name, "kind": "resource", "encoding": e.encoding, "offset": e.offset,
            "bytes": e.bytes}


def plan(tensors: list[tuple[str, tuple[int, ...], str, str]],
         resources: list[tuple[str, int]]) -> list[Entry]:
    """Offsets for resources (first, as NInfer writes them) then tensors, each at the first
    aligned position after the previous object."""
    entries: list[Entry] = []
    names: set[str] = set()
    cursor = 0

    def claim(name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ArtifactError(f"object names must be nonempty strings, got {name!r}")
        if name in names:
            raise ArtifactError(f"object name {name!r} is planned twice")
        names.add(name)

    for name, nbytes in resources:
        claim(name)
        if type(nbytes) is not int or nbytes <= 0:
            raise ArtifactError(f"resource {name!r} must have a positive size, got {nbytes!r}")
        entries.append(ResourceEntry(name, "raw-bytes-v1", cursor, nbytes))
        cursor += nbytes
    for name, shape, fmt, layout in tensors:
        claim(name)
        shape = tuple(shape)
        try:
            nbytes = packed_nbytes(fmt, layout, shape)
        except ArtifactError as exc:
            raise ArtifactError(f"tensor {name!r}: {exc}") from None
        offset = _align(cursor, TENSOR_ALIGNMENT)
        entries.append(TensorEntry(name, shape, fmt, layout, offset, nbytes))
        cursor = offset + nbytes
    if not entries:
        raise ArtifactError("an artifact needs at least one object")
    return entries


class ArtifactWriter:
    """Write a v2 artifact: plan all objects up front, then write each payload (any order).

    The file appears at `path` only on `commit()` (temp file in the same folder, fsync, atomic
    rename); `abort()` or an exception inside `with` removes the temp file and leaves nothing.
    """

    def __init__(self, path: str | os.PathLike, identity: Identity,
                 tensors: list[tuple[str, tuple[int, ...], str, str]],
                 resources: list[tuple[str, int]]):
        if not isinstance(identity, Identity):
            raise ArtifactError(f"identity must be an Identity, got {identity!r}")
        self.path = Path(path)
        self.identity = identity
        self.objects = plan(tensors, resources)
        self._by_name = {e.name: e for e in self.objects}
        directory = _directory_json({
            "identity": {"model_id": identity.model_id, "weights_id": identity.weights_id},
            "objects": [_entry_json(e) for e in self.objects],
        })
        self.payload_offset = _align(PREFIX.size + len(directory), PAYLOAD_ALIGNMENT)
        self.file_size = self.payload_offset + max(e.offset + e.bytes for e in self.objects)
        self._written: set[str] = set()
        self._done = False
        try:
            fd, self._tmp = _create_temp(self.path, 0o666)
        except OSError as exc:
            raise ArtifactError(f"{self.path}: cannot create the output ({exc.strerror}); "
                                "check that its folder exists and is writable") from None
        self._f = os.fdopen(fd, "w+b")
        try:
            self._f.write(PREFIX.pack(MAGIC + bytes([REVISION]), len(directory)))
            self._f.write(directory)
            self._f.truncate(self.file_size)  # gaps and padding read as zeros
        except BaseException:
            self.abort()
            raise

    def _put(self, name: str, kind: type, data: Any) -> None:
        if self._done:
            raise ArtifactError(f"{self.path}: writer is already committed or aborted")
        entry = self._by_name.get(name)
        if not isinstance(entry, kind):
            raise ArtifactError(f"{self.path}: no planned {kind.__name__[:-5].lower()} named {name!r}")
        if name in self._written:
            raise ArtifactError(f"{self.path}: {name!r} was already written")
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        view = memoryview(data).cast("B")
        if view.nbytes != entry.bytes:
            raise ArtifactError(f"{self.path}: {name!r} is planned as {entry.bytes} bytes, got {view.nbytes}")
        self._f.seek(self.payload_offset + entry.offset)
        self._f.write(view)
        self._written.add(name)

    def write_tensor(self, name: str, data: bytes | memoryview | np.ndarray) -> None:
        """Write a tensor's encoded payload (exactly its planned `bytes`)."""
        self._put(name, TensorEntry, data)

    def write_resource(self, name: str, data: bytes) -> None:
        """Write a resource's bytes (exactly its planned size)."""
        self._put(name, ResourceEntry, data)

    def commit(self) -> None:
        """Check every object was written, fsync, and atomically rename into place."""
        if self._done:
            raise ArtifactError(f"{self.path}: writer is already committed or aborted")
        missing = [e.name for e in self.objects if e.name not in self._written]
        if missing:
            self.abort()
            raise ArtifactError(f"{self.path}: {len(missing)} planned object(s) never written, "
                                f"first {missing[0]!r}; nothing was saved")
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            if self.path.is_dir():
                raise ArtifactError(f"{self.path}: is a directory; give a file name ending in .ninfer")
            os.replace(self._tmp, self.path)
            _fsync_dir(self.path.parent)
        except BaseException:
            self.abort()
            raise
        self._done = True

    def abort(self) -> None:
        """Discard the temp file; nothing appears at `path`."""
        self._done = True
        self._f.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> ArtifactWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            if not self._done:
                self.abort()
        elif not self._done:
            self.commit()


def _create_temp(path: Path, mode: int) -> tuple[int, Path]:
    """A new hidden file beside `path` (same filesystem, so os.replace is atomic)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.partial")
    return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode), tmp


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# v1 -> v2 header migration

_BACKUP_SUFFIX = ".v1-header"


def rewrite_header_v1_to_v2(path: str | os.PathLike, identity: Identity) -> None:
    """Turn a revision-1 artifact into revision 2 with `identity`; payload bytes are untouched.

    When the v2 directory fits before the existing payload start (the normal case: it grows by
    the `weights_id` member only), the header is rewritten in place: the old header is saved to
    `PATH.v1-header` (fsync) first and restored if anything fails; a crash mid-write leaves
    that file, and the next call restores it before retrying. Otherwise the file is copied to
    a temp file with the new header and renamed over the old one atomically.
    """
    path = Path(path)
    if not isinstance(identity, Identity):
        raise ArtifactError(f"identity must be an Identity, got {identity!r}")
    backup = path.with_name(path.name + _BACKUP_SUFFIX)
    if backup.exists():
        _restore_header(path, backup)
    with open_artifact(path, allow_v1=True) as art:
        if art.revision != 1:
            raise ArtifactError(f"{path}: already revision {art.revision} ({art.identity}); nothing to migrate")
        if identity.model_id != art.model_id:
            raise ArtifactError(f"{path}: v1 model_id is {art.model_id!r}, not {identity.model_id!r}; "
                                "pick the identity of this model")
        entries, old_payload, size = art.objects, art.payload_offset, art.file_size
    directory = _directory_json({
        "identity": {"model_id": identity.model_id, "weights_id": identity.weights_id},
        "objects": [_entry_json(e) for e in entries],
    })
    new_payload = _align(PREFIX.size + len(directory), PAYLOAD_ALIGNMENT)
    header = PREFIX.pack(MAGIC + bytes([REVISION]), len(directory)) + directory
    header += bytes(new_payload - len(header))
    if new_payload == old_payload:
        _rewrite_in_place(path, backup, header)
    else:
        _rewrite_by_copy(path, header, old_payload, size)
    with open_artifact(path) as check:
        if check.identity != identity or check.objects != entries:
            raise ArtifactError(f"{path}: migrated directory does not read back as written")


def _restore_header(path: Path, backup: Path) -> None:
    old = backup.read_bytes()
    if len(old) < PREFIX.size or old[:8] != MAGIC + b"\x01" or len(old) % PAYLOAD_ALIGNMENT:
        raise ArtifactError(f"{backup}: not a saved v1 header; inspect it, then delete it to proceed")
    with open(path, "r+b") as f:
        f.write(old)
        f.flush()
        os.fsync(f.fileno())
    backup.unlink()
    _fsync_dir(path.parent)


def _rewrite_in_place(path: Path, backup: Path, header: bytes) -> None:
    with open(path, "rb") as f:
        old = f.read(len(header))
    with open(backup, "xb") as b:
        b.write(old)
        b.flush()
        os.fsync(b.fileno())
    _fsync_dir(path.parent)
    try:
        with open(path, "r+b") as f:
            f.seek(PREFIX.size)
            f.write(header[PREFIX.size:])  # directory + padding first, then the prefix
            f.flush()
            os.fsync(f.fileno())
            f.seek(0)
            f.write(header[:PREFIX.size])
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        _restore_header(path, backup)
        raise
    backup.unlink()
    _fsync_dir(path.parent)


def _rewrite_by_copy(path: Path, header: bytes, old_payload: int, size: int) -> None:
    fd, tmp = _create_temp(path, os.stat(path).st_mode & 0o777)
    try:
        with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
            out.write(header)
            src.seek(old_payload)
            total, done, chunk = size - old_payload, 0, 64 << 20
            while block := src.read(chunk):
                out.write(block)
                done += len(block)
                if total > (1 << 30):
                    print(f"\rmigrate: copied {done >> 20} / {total >> 20} MiB", end="", file=sys.stderr)
            if total > (1 << 30):
                print(file=sys.stderr)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
