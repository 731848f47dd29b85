"""Safetensors reader / streaming writer / sharded directories (inferno.checkpoint.safetensors)."""

import json
import struct

import ml_dtypes
import numpy as np
import pytest

from inferno.checkpoint.safetensors import (
    DTYPES,
    INDEX_FILE,
    SafetensorsDir,
    SafetensorsFile,
    SafetensorsWriter,
    TensorSpec,
    save_file,
    write_checkpoint,
)
from inferno.errors import ArtifactError


def _sample(dtype_name: str, shape, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = DTYPES[dtype_name]
    n = int(np.prod(shape))
    if dt == np.bool_:
        return rng.integers(0, 2, n).astype(bool).reshape(shape)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), n).astype(dt).reshape(shape)
    if dtype_name == "F8_E8M0":
        return (2.0 ** rng.integers(-8, 8, n)).astype(dt).reshape(shape)
    return rng.standard_normal(n).astype(np.float32).astype(dt).reshape(shape)


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_round_trip_every_dtype(tmp_path, dtype):
    tensors = {"m": _sample(dtype, (3, 5)), "v": _sample(dtype, (7,), 1), "s": _sample(dtype, (), 2),
               "e": _sample(dtype, (0, 4))}
    save_file(tmp_path / "t.safetensors", tensors, {"k": "v"})
    f = SafetensorsFile(tmp_path / "t.safetensors")
    assert f.metadata == {"k": "v"}
    assert sorted(f.names()) == sorted(tensors)
    for name, want in tensors.items():
        got = f.get(name)
        assert got.dtype == DTYPES[dtype] and got.shape == want.shape
        assert _bits(got) == _bits(want)
        assert f.info(name).dtype == dtype


def test_get_is_a_read_only_view_of_the_map(tmp_path):
    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    save_file(tmp_path / "t.safetensors", {"a": a})
    got = SafetensorsFile(tmp_path / "t.safetensors").get("a")
    assert not got.flags.writeable and not got.flags.owndata
    assert bytes(SafetensorsFile(tmp_path / "t.safetensors").raw("a")) == a.tobytes()


def test_interoperates_with_the_reference_library(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    tensors = {"f32": _sample("F32", (4, 3)), "f16": _sample("F16", (2,)), "i64": _sample("I64", (5,)),
               "u8": _sample("U8", (2, 2, 2)), "b": _sample("BOOL", (3,))}
    st.save_file(tensors, str(tmp_path / "ref.safetensors"), metadata={"format": "np"})
    f = SafetensorsFile(tmp_path / "ref.safetensors")
    assert f.metadata == {"format": "np"}
    assert all(_bits(f.get(n)) == _bits(a) for n, a in tensors.items())
    save_file(tmp_path / "ours.safetensors", tensors)
    back = st.load_file(str(tmp_path / "ours.safetensors"))
    assert all(_bits(back[n]) == _bits(a) for n, a in tensors.items())


def test_streaming_writer_takes_row_blocks(tmp_path):
    a = _sample("BF16", (10, 6))
    b = _sample("I32", (4,))
    path = tmp_path / "s.safetensors"
    with SafetensorsWriter(path, [("a", "BF16", (10, 6)), TensorSpec("b", "I32", (4,))]) as w:
        w.write("a", (a[i : i + 3] for i in range(0, 10, 3)))
        w.write("b", b)
    f = SafetensorsFile(path)
    assert _bits(f.get("a")) == _bits(a) and _bits(f.get("b")) == _bits(b)
    assert not path.with_name(path.name + ".partial").exists()


@pytest.mark.parametrize(
    "write",
    [
        lambda w: w.write("b", np.zeros(2, np.float32)),  # out of order
        lambda w: w.write("a", np.zeros((2, 3), np.float16)),  # wrong dtype
        lambda w: w.write("a", np.zeros((3, 2), np.float32)),  # wrong shape
        lambda w: w.write("a", [np.zeros((1, 3), np.float32)]),  # too few rows
        lambda w: w.write("a", [np.zeros((2, 4), np.float32)]),  # block does not fit
    ],
)
def test_writer_rejects_bad_writes_and_leaves_no_file(tmp_path, write):
    path = tmp_path / "w.safetensors"
    with pytest.raises(ArtifactError):
        with SafetensorsWriter(path, [("a", "F32", (2, 3)), ("b", "F32", (2,))]) as w:
            write(w)
    assert list(tmp_path.iterdir()) == []


def test_writer_refuses_to_close_with_a_tensor_missing(tmp_path):
    w = SafetensorsWriter(tmp_path / "w.safetensors", [("a", "F32", (2,)), ("b", "F32", (2,))])
    w.write("a", np.zeros(2, np.float32))
    with pytest.raises(ArtifactError, match="'b' was declared but never written"):
        w.close()
    assert list(tmp_path.iterdir()) == []


def test_writer_rejects_duplicate_names_and_unknown_dtypes(tmp_path):
    with pytest.raises(ArtifactError, match="twice"):
        SafetensorsWriter(tmp_path / "w.safetensors", [("a", "F32", (1,)), ("a", "F32", (1,))])
    with pytest.raises(ArtifactError, match="unsupported dtype"):
        SafetensorsWriter(tmp_path / "x.safetensors", [("a", "F4", (1,))])


def _write_raw(path, header: bytes, data: bytes = b"", length: int | None = None):
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)


def _header(entries: dict) -> bytes:
    return json.dumps(entries).encode()


GOOD = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}


@pytest.mark.parametrize(
    "make, why",
    [
        (lambda p: p.write_bytes(b"\x01\x00"), "too short"),
        (lambda p: _write_raw(p, _header(GOOD), b"\0" * 8, length=10**6), "exceeds the file"),
        (lambda p: _write_raw(p, b"{not json", b""), "not JSON"),
        (lambda p: _write_raw(p, b"[1, 2]", b""), "not a JSON object"),
        (lambda p: _write_raw(p, _header(GOOD), b"\0" * 4), "truncated"),
        (lambda p: _write_raw(p, _header(GOOD), b"\0" * 12), "truncated"),
        (lambda p: _write_raw(p, _header({"a": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 8]}}), b"\0" * 8),
         "unsupported dtype"),
        (lambda p: _write_raw(p, _header({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}), b"\0" * 8),
         "bad shape"),
        (lambda p: _write_raw(p, _header({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}), b"\0" * 8),
         "needs 12"),
        (lambda p: _write_raw(p, _header({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}), b"\0" * 8),
         "bad data_offsets"),
        (lambda p: _write_raw(p, _header({"a": GOOD["a"], "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}),
                              b"\0" * 12), "hole or overlap"),
        (lambda p: _write_raw(p, _header({"a": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}), b"\0" * 12),
         "hole or overlap"),
        (lambda p: _write_raw(p, _header({**GOOD, "__metadata__": {"k": 1}}), b"\0" * 8), "__metadata__"),
    ],
)
def test_corrupt_files_raise_one_line_artifact_errors(tmp_path, make, why):
    path = tmp_path / "bad.safetensors"
    make(path)
    with pytest.raises(ArtifactError, match=why) as e:
        SafetensorsFile(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_missing_file_and_missing_tensor(tmp_path):
    with pytest.raises(ArtifactError, match="cannot read"):
        SafetensorsFile(tmp_path / "nope.safetensors")
    save_file(tmp_path / "t.safetensors", {"a": np.zeros(1, np.float32)})
    with pytest.raises(ArtifactError, match="'b' is not in"):
        SafetensorsFile(tmp_path / "t.safetensors").get("b")


def _specs(n=6):
    return [TensorSpec(f"t{i}", "BF16", (4, 16)) for i in range(n)]  # 128 bytes each


def _produce(spec):
    i = int(spec.name[1:])
    return np.full(spec.shape, i, dtype=ml_dtypes.bfloat16)


def test_sharded_checkpoint_round_trip(tmp_path):
    progress = []
    paths = write_checkpoint(tmp_path, _specs(), _produce, max_shard_bytes=300,
                             progress=lambda done, total: progress.append((done, total)))
    assert [p.name for p in paths] == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert index["metadata"]["total_size"] == 6 * 128
    assert index["weight_map"]["t5"] == "model-00003-of-00003.safetensors"
    assert progress[-1] == (768, 768) and len(progress) == 6
    d = SafetensorsDir(tmp_path)
    assert sorted(d.names()) == [f"t{i}" for i in range(6)]
    assert all(float(d.get(f"t{i}")[3, 15]) == i for i in range(6))


def test_one_shard_is_model_safetensors_without_index(tmp_path):
    paths = write_checkpoint(tmp_path, _specs(2), _produce)
    assert [p.name for p in paths] == ["model.safetensors"]
    assert not (tmp_path / INDEX_FILE).exists()
    assert len(SafetensorsDir(tmp_path)) == 2


def test_directory_without_index_reads_every_file(tmp_path):
    save_file(tmp_path / "model.safetensors", {"a": np.zeros(1, np.float32)})
    save_file(tmp_path / "mtp.safetensors", {"mtp.fc.weight": np.ones(1, np.float32)})
    d = SafetensorsDir(tmp_path)
    assert sorted(d) == ["a", "mtp.fc.weight"] and d.get("mtp.fc.weight")[0] == 1


def test_directory_errors(tmp_path):
    with pytest.raises(ArtifactError, match="no \\*.safetensors"):
        SafetensorsDir(tmp_path)
    save_file(tmp_path / "a.safetensors", {"x": np.zeros(1, np.float32)})
    save_file(tmp_path / "b.safetensors", {"x": np.zeros(1, np.float32)})
    with pytest.raises(ArtifactError, match="in both"):
        SafetensorsDir(tmp_path)
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": {"x": "a.safetensors", "y": "c.safetensors"}}))
    with pytest.raises(ArtifactError, match="c.safetensors, which is missing"):
        SafetensorsDir(tmp_path)
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": {"x": "a.safetensors", "y": "a.safetensors"}}))
    with pytest.raises(ArtifactError, match="does not hold it"):
        SafetensorsDir(tmp_path)
    (tmp_path / INDEX_FILE).write_text("{oops")
    with pytest.raises(ArtifactError, match="not a valid safetensors index"):
        SafetensorsDir(tmp_path)
