"""The `.ninfer` container: writer round trips, v1 migration, and every structural corruption.

Files are built in tmp_path by ArtifactWriter, then hand-patched (prefix bytes, JSON directory
rewritten in place so the payload start stays put, or truncated).
"""

import json
import os
import struct

import numpy as np
import pytest

from inferno.artifact import formats as F
from inferno.artifact.container import (
    MAGIC,
    REVISION,
    ArtifactWriter,
    Identity,
    ResourceEntry,
    TensorEntry,
    open_artifact,
    rewrite_header_v1_to_v2,
)
from inferno.errors import ArtifactError, InfernoError

RS, CT, BS = "row-split-k128-v1", "contiguous-le-v1", "blockscale-k16-m128x4-v1"
IDENT = Identity("qwen3.6-27b", "groupwise-int")
RNG = np.random.default_rng(0)
TENSORS = {
    "text/layers/0/attention/query_key": (RNG.standard_normal((3, 200)).astype(np.float32),
                                          "Q4G64_F16S", RS),
    "text/layers/0/mlp/down": (RNG.standard_normal((4, 130)).astype(np.float32), "Q5G64_F16S", RS),
    "text/embedding": (RNG.standard_normal((2, 64)).astype(np.float32), "W8G32_F16S", RS),
    "text/layers/0/mlp/gate_up": (RNG.standard_normal((128, 64)).astype(np.float32), "NVFP4", BS),
    "text/norm": (RNG.standard_normal((5,)).astype(np.float32), "BF16", CT),
    "text/layers/0/gdn/a_log": (RNG.standard_normal((3,)).astype(np.float32), "FP32", CT),
    "draft/ids": (np.arange(4, dtype=np.int32), "I32", CT),
}
RESOURCES = {"frontend/tokenizer.json": b'{"v": 1}', "frontend/chat_template.jinja": b"{{ x }}"}


def build(path, tensors=TENSORS, resources=RESOURCES, identity=IDENT):
    plan = [(n, w.shape, f, lay) for n, (w, f, lay) in tensors.items()]
    with ArtifactWriter(path, identity, plan, [(n, len(b)) for n, b in resources.items()]) as wr:
        for n, (w, f, lay) in reversed(tensors.items()):  # any write order is fine
            wr.write_tensor(n, F.encode(f, lay, w))
        for n, b in resources.items():
            wr.write_resource(n, b)
    return path


@pytest.fixture
def art(tmp_path):
    return build(tmp_path / "model.ninfer")


def read_json(path):
    with open(path, "rb") as f:
        magic, n = struct.unpack("<8sQ", f.read(16))
        return magic, json.loads(f.read(n))


def patch_json(path, mutate=None, raw=None, magic=None):
    """Replace the directory in place (keeping the payload start) and optionally the magic.

    `mutate` edits the parsed root in place; `raw` gives the new directory bytes verbatim.
    """
    data = bytearray(path.read_bytes())
    n_old = struct.unpack_from("<Q", data, 8)[0]
    payload = -(-(16 + n_old) // 4096) * 4096
    if raw is None:
        root = json.loads(data[16:16 + n_old])
        mutate(root)
        raw = json.dumps(root, separators=(",", ":")).encode()
    assert 16 + len(raw) <= payload, "test directory must fit before the payload"
    head = struct.pack("<8sQ", magic or bytes(data[:8]), len(raw)) + raw
    data[:payload] = head + bytes(payload - len(head))
    path.write_bytes(bytes(data))


def expect(path, match, **kw):
    with pytest.raises(ArtifactError, match=match) as info:
        open_artifact(path, **kw)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(path))
    return msg


# --- round trip --------------------------------------------------------------------------------

def test_round_trip(art):
    with open_artifact(art) as a:
        assert a.revision == REVISION == 2 and a.identity == IDENT and a.model_id == "qwen3.6-27b"
        assert str(a.identity) == "qwen3.6-27b/groupwise-int"
        assert list(a.tensors) == list(TENSORS) and list(a.resources) == list(RESOURCES)
        assert a.payload_offset == 4096
        for name, (w, f, lay) in TENSORS.items():
            e = a.tensors[name]
            assert isinstance(e, TensorEntry) and e.shape == w.shape and e.format == f
            assert e.offset % 256 == 0 and e.bytes == F.packed_nbytes(f, lay, w.shape)
            view = a.tensor_bytes(name)
            assert isinstance(view, memoryview) and view.readonly and view.nbytes == e.bytes
            assert bytes(view) == F.encode(f, lay, w).tobytes()
            del view
        for name, b in RESOURCES.items():
            assert a.resource(name) == b
            assert isinstance(a.resources[name], ResourceEntry)
        with pytest.raises(ArtifactError, match="no tensor named 'nope'"):
            a.tensor_bytes("nope")
        with pytest.raises(ArtifactError, match="no resource"):
            a.resource("text/norm")
        last = a.objects[-1]
        assert os.path.getsize(art) == a.payload_offset + last.offset + last.bytes


def test_layout_on_disk(art):
    raw = art.read_bytes()
    assert raw[:8] == b"NINFER\x00\x02" and MAGIC == b"NINFER\0"
    n = struct.unpack_from("<Q", raw, 8)[0]
    root = json.loads(raw[16:16 + n])
    assert list(root) == ["identity", "objects"]
    assert root["identity"] == {"model_id": "qwen3.6-27b", "weights_id": "groupwise-int"}
    first = root["objects"][0]
    assert first == {"name": "frontend/tokenizer.json", "kind": "resource",
                     "encoding": "raw-bytes-v1", "offset": 0, "bytes": 8}
    t = root["objects"][2]
    assert list(t) == ["name", "kind", "shape", "format", "layout", "offset", "bytes"]
    assert t["offset"] == 256  # resources take 15 bytes; tensors align to 256
    assert not any(raw[16 + n:4096])
    assert raw[4096:4096 + 8] == b'{"v": 1}' and raw[4104:4111] == b"{{ x }}"


def test_view_survives_close(art):
    a = open_artifact(art)
    view = a.tensor_bytes("draft/ids")
    a.close()
    assert np.frombuffer(view, np.int32).tolist() == [0, 1, 2, 3]
    with pytest.raises(ArtifactError, match="closed"):
        a.tensor_bytes("draft/ids")


# --- writer ------------------------------------------------------------------------------------

def test_writer_leaves_nothing_on_error(tmp_path):
    path = tmp_path / "m.ninfer"
    with pytest.raises(RuntimeError):
        with ArtifactWriter(path, IDENT, [("t", (4,), "FP32", CT)], []) as wr:
            wr.write_tensor("t", np.zeros(4, np.float32))
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ArtifactError, match="never written"):
        with ArtifactWriter(path, IDENT, [("t", (4,), "FP32", CT), ("u", (1,), "I32", CT)], []) as wr:
            wr.write_tensor("t", np.zeros(4, np.float32))
    assert list(tmp_path.iterdir()) == []
    wr = ArtifactWriter(path, IDENT, [("t", (4,), "FP32", CT)], [])
    wr.abort()
    assert list(tmp_path.iterdir()) == []


def test_writer_refuses_misuse(tmp_path):
    path = tmp_path / "m.ninfer"
    wr = ArtifactWriter(path, IDENT, [("t", (4,), "FP32", CT)], [("r", 3)])
    with pytest.raises(ArtifactError, match="planned as 16 bytes, got 12"):
        wr.write_tensor("t", np.zeros(3, np.float32))
    with pytest.raises(ArtifactError, match="no planned tensor named 'r'"):
        wr.write_tensor("r", b"abc")
    with pytest.raises(ArtifactError, match="no planned resource named 'x'"):
        wr.write_resource("x", b"abc")
    wr.write_tensor("t", bytes(16))
    with pytest.raises(ArtifactError, match="already written"):
        wr.write_tensor("t", bytes(16))
    wr.abort()
    for tensors, resources, match in [
        ([("t", (4,), "FP16", CT)], [], "unknown tensor format"),
        ([("t", (4, 64), "Q4G64_F16S", CT)], [], "does not accept"),
        ([("t", (4,), "FP32", CT), ("t", (4,), "FP32", CT)], [], "planned twice"),
        ([], [("r", 0)], "positive size"),
        ([], [], "at least one object"),
    ]:
        with pytest.raises(ArtifactError, match=match):
            ArtifactWriter(path, IDENT, tensors, resources)
    assert list(tmp_path.iterdir()) == []


def test_writer_needs_an_existing_folder(tmp_path):
    with pytest.raises(ArtifactError, match="cannot create the output"):
        ArtifactWriter(tmp_path / "no" / "m.ninfer", IDENT, [("t", (4,), "FP32", CT)], [])


def test_identity_rules():
    assert Identity.parse("qwen3.6-35b-a3b/groupwise-int") == Identity("qwen3.6-35b-a3b", "groupwise-int")
    for bad in [("", "x"), ("a/b", "x"), ("a", "")]:
        with pytest.raises(ArtifactError):
            Identity(*bad)
    with pytest.raises(ArtifactError, match="model_id/weights_id"):
        Identity.parse("qwen3.6-27b")


# --- framing corruption ------------------------------------------------------------------------

def test_truncated_and_tiny_files(art, tmp_path):
    data = art.read_bytes()
    art.write_bytes(data[:-1])
    expect(art, "beyond the file")
    art.write_bytes(data[:3000])
    expect(art, "truncated")
    art.write_bytes(data[:10])
    expect(art, "shorter than the 16-byte")
    expect(tmp_path / "missing.ninfer", "cannot open")


def test_bad_magic_and_revision(art):
    data = bytearray(art.read_bytes())
    data[0] = ord("X")
    art.write_bytes(bytes(data))
    expect(art, "not a .ninfer file")
    data[0] = ord("N")
    data[7] = 3
    art.write_bytes(bytes(data))
    expect(art, "unsupported .ninfer revision 3")
    data[7] = 0
    art.write_bytes(bytes(data))
    expect(art, "unsupported .ninfer revision 0")


def test_json_length_rules(art):
    data = bytearray(art.read_bytes())
    struct.pack_into("<Q", data, 8, 0)
    art.write_bytes(bytes(data))
    expect(art, "length is 0")
    struct.pack_into("<Q", data, 8, len(data))
    art.write_bytes(bytes(data))
    expect(art, "truncated")


def test_metadata_padding_must_be_zero(art):
    data = bytearray(art.read_bytes())
    data[4095] = 1
    art.write_bytes(bytes(data))
    expect(art, "padding")


def test_json_text_rules(art):
    patch_json(art, raw=b'{"identity": \xff}')
    expect(art, "not valid UTF-8")
    patch_json(art, raw=b'{"identity": ')
    expect(art, "does not parse")
    patch_json(art, raw=b'{"objects": [], "objects": []}')
    expect(art, "repeats member 'objects'")
    patch_json(art, raw=b'{"identity": NaN}')
    expect(art, "non-JSON number NaN")
    patch_json(art, raw=b'[1, 2]')
    expect(art, "directory root must be a JSON object")


# --- closed schema -----------------------------------------------------------------------------

def obj(root, name):
    return next(o for o in root["objects"] if o["name"] == name)


QK = "text/layers/0/attention/query_key"
TOK = "frontend/tokenizer.json"


@pytest.mark.parametrize("mutate,match", [
    (lambda r: r.update(schema=2), "directory root has unknown member"),
    (lambda r: r.pop("identity"), "directory root lacks member"),
    (lambda r: r["identity"].update(revision="x"), "identity has unknown member"),
    (lambda r: r["identity"].pop("weights_id"), "identity lacks member"),
    (lambda r: r["identity"].update(model_id=3), "identity.model_id must be a nonempty string"),
    (lambda r: r["identity"].update(weights_id=""), "identity.weights_id must be a nonempty"),
    (lambda r: r.update(identity="qwen3.6-27b/groupwise-int"), "identity must be a JSON object"),
    (lambda r: r.update(objects=[]), "nonempty array"),
    (lambda r: r.update(objects={}), "nonempty array"),
    (lambda r: r["objects"].append(7), "object #9 must be a JSON object"),
    (lambda r: obj(r, QK).update(stride=[1]), f"tensor '{QK}' has unknown member"),
    (lambda r: obj(r, QK).pop("layout"), f"tensor '{QK}' lacks member"),
    (lambda r: obj(r, QK).update(encoding="raw-bytes-v1"), "unknown member"),
    (lambda r: obj(r, QK).update(shape="3x200"), "shape must be an array"),
    (lambda r: obj(r, QK).update(shape=[3, 0]), "shape dimension must be >= 1"),
    (lambda r: obj(r, QK).update(shape=[3, True]), "shape dimension must be an integer"),
    (lambda r: obj(r, QK).update(shape=[3, 200.0]), "shape dimension must be an integer"),
    (lambda r: obj(r, QK).update(offset=256.0), "offset must be an integer"),
    (lambda r: obj(r, QK).update(offset=-256), "offset must be >= 0"),
    (lambda r: obj(r, QK).update(offset=None), "offset must be an integer"),
    (lambda r: obj(r, QK).update(bytes=0), "bytes must be >= 1"),
    (lambda r: obj(r, QK).update(format="Q4G64"), "unknown tensor format 'Q4G64'"),
    (lambda r: obj(r, QK).update(layout="row-split-k64-v1"), "unknown tensor layout"),
    (lambda r: obj(r, QK).update(format="BF16"), "does not accept format BF16"),
    (lambda r: obj(r, QK).update(name=""), "name must be a nonempty string"),
    (lambda r: obj(r, QK).update(kind="weight"), "kind must be 'tensor' or 'resource'"),
    (lambda r: obj(r, TOK).update(shape=[8]), f"resource '{TOK}' has unknown member"),
    (lambda r: obj(r, TOK).pop("encoding"), "lacks member"),
    (lambda r: obj(r, TOK).update(encoding="gzip-v1"), "unknown encoding 'gzip-v1'"),
    (lambda r: obj(r, TOK).update(bytes="8"), "bytes must be an integer"),
    (lambda r: obj(r, QK).update(name=TOK), "appears twice"),
    (lambda r: obj(r, QK).update(shape=[3, 1, 200]), "rank-2"),
])
def test_closed_schema(art, mutate, match):
    patch_json(art, mutate)
    expect(art, match)


# --- spans -------------------------------------------------------------------------------------

def test_bytes_mismatch(art):
    def grow(r):
        o = obj(r, QK)
        o["bytes"] += 2
    patch_json(art, grow)
    msg = expect(art, "declares 538 bytes but Q4G64_F16S/row-split-k128-v1 of shape")
    assert QK in msg
    patch_json(art, lambda r: obj(r, QK).update(shape=[3, 300]))  # size of [3,256] pads differ
    expect(art, "needs")


def test_overlap_order_alignment_bounds(tmp_path):
    art = build(tmp_path / "model.ninfer")
    _, root = read_json(art)
    t1, t2 = root["objects"][2], root["objects"][3]
    patch_json(art, lambda r: r["objects"][3].update(offset=t1["offset"]))
    expect(art, f"tensor '{t2['name']}' overlaps or precedes '{t1['name']}' \\(offset 256 < 792\\)")
    art = build(tmp_path / "model.ninfer")
    patch_json(art, lambda r: r["objects"][3].update(offset=t2["offset"] + 16))
    expect(art, "offset 1040 is not a multiple of 256")
    art = build(tmp_path / "model.ninfer")

    def swap(r):
        r["objects"][2], r["objects"][3] = r["objects"][3], r["objects"][2]
    patch_json(art, swap)
    expect(art, f"tensor '{t1['name']}' overlaps or precedes '{t2['name']}'")


def test_offset_beyond_eof(art):
    patch_json(art, lambda r: r["objects"][-1].update(offset=r["objects"][-1]["offset"] + 4096))
    expect(art, "beyond the file")


def test_gaps_and_trailing_bytes_are_allowed(art):
    patch_json(art, lambda r: r["objects"][1].update(offset=20))  # a gap after a resource
    with open(art, "ab") as f:
        f.write(b"trailing")
    with open_artifact(art) as a:
        assert a.resources["frontend/chat_template.jinja"].offset == 20


# --- revision 1 and migration ------------------------------------------------------------------

def make_v1(path, tensors=TENSORS):
    build(path, tensors=tensors)

    patch_json(path, to_v1, magic=b"NINFER\x00\x01")
    return path


def to_v1(r):
    r["model_id"] = r.pop("identity")["model_id"]


V1_TENSORS = {k: v for k, v in TENSORS.items() if v[1] != "NVFP4"}


def test_v1_needs_opt_in(tmp_path):
    p = make_v1(tmp_path / "old.ninfer", V1_TENSORS)
    expect(p, "revision-1 artifact; convert its header to revision 2 with `inferno migrate ")
    with open_artifact(p, allow_v1=True) as a:
        assert a.revision == 1 and a.identity is None and a.model_id == "qwen3.6-27b"
        assert list(a.tensors) == list(V1_TENSORS)
    patch_json(p, lambda r: r.update(identity={"model_id": "a", "weights_id": "b"}))
    expect(p, "unknown member", allow_v1=True)


def test_v1_refuses_nvfp4(tmp_path):
    p = make_v1(tmp_path / "old.ninfer")
    expect(p, "not registered in revision 1", allow_v1=True)


def test_migrate_in_place(tmp_path):
    p = make_v1(tmp_path / "old.ninfer", V1_TENSORS)
    before = p.read_bytes()
    with open_artifact(p, allow_v1=True) as a:
        payload_start = a.payload_offset
    rewrite_header_v1_to_v2(p, IDENT)
    after = p.read_bytes()
    assert after[:8] == b"NINFER\x00\x02" and after[payload_start:] == before[payload_start:]
    with open_artifact(p) as a:
        assert a.identity == IDENT and list(a.tensors) == list(V1_TENSORS)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["old.ninfer"]
    with pytest.raises(ArtifactError, match="already revision 2"):
        rewrite_header_v1_to_v2(p, IDENT)


def test_migrate_by_copy_when_directory_grows_past_4096(tmp_path):
    p = build(tmp_path / "old.ninfer", tensors=V1_TENSORS, resources={"frontend/x": b"{}"})
    _, root = read_json(p)
    to_v1(root)
    # lengthen the resource name until the v1 directory ends exactly at 4096: v2 cannot fit
    name = "frontend/x" + "x" * (4096 - 16 - len(json.dumps(root, separators=(",", ":"))))
    build(p, tensors=V1_TENSORS, resources={name: b"{}"})
    with open_artifact(p) as a:
        payload = p.read_bytes()[a.payload_offset:]
    _, root = read_json(p)
    to_v1(root)
    raw = json.dumps(root, separators=(",", ":")).encode()
    assert 16 + len(raw) == 4096
    p.write_bytes(struct.pack("<8sQ", b"NINFER\x00\x01", len(raw)) + raw + payload)
    with open_artifact(p, allow_v1=True) as a:
        assert a.payload_offset == 4096
        old = {k: bytes(a.tensor_bytes(k)) for k in a.tensors}
        assert all(any(v) for v in old.values())
    rewrite_header_v1_to_v2(p, IDENT)
    with open_artifact(p) as a:
        assert a.payload_offset == 8192 and a.identity == IDENT
        assert {k: bytes(a.tensor_bytes(k)) for k in a.tensors} == old
        assert a.resource(name) == b"{}"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["old.ninfer"]


def test_migrate_recovers_from_interrupted_run(tmp_path):
    p = make_v1(tmp_path / "old.ninfer", V1_TENSORS)
    original = p.read_bytes()
    header = original[:4096]
    (tmp_path / "old.ninfer.v1-header").write_bytes(header)
    data = bytearray(original)
    data[16:40] = b"garbage from a crash...."  # a half-written header
    p.write_bytes(bytes(data))
    rewrite_header_v1_to_v2(p, IDENT)
    with open_artifact(p) as a:
        assert a.identity == IDENT
    assert not (tmp_path / "old.ninfer.v1-header").exists()


def test_migrate_refuses_other_model(tmp_path):
    p = make_v1(tmp_path / "old.ninfer", V1_TENSORS)
    with pytest.raises(ArtifactError, match="v1 model_id is 'qwen3.6-27b'"):
        rewrite_header_v1_to_v2(p, Identity("qwen3.6-35b-a3b", "groupwise-int"))
    assert p.read_bytes()[:8] == b"NINFER\x00\x01"


def test_errors_are_inferno_errors():
    assert issubclass(ArtifactError, InfernoError)
