"""`inferno convert | inspect | verify | migrate` through the real entry point (`inferno.cli.app.main`).

Exit codes: 0 success / verified, 1 valid but not the published bytes (verify), 2 every user
error with one `error: ...` line and no traceback.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import sys

import numpy as np
import pytest

from inferno.artifact import formats, identities
from inferno.artifact.container import ArtifactWriter, Identity, open_artifact
from inferno.artifact.synth import synthesize_artifact
from inferno.checkpoint.synth import synthesize
from inferno.cli.app import main

DENSE = "inferno-test-tiny-dense/groupwise-int"


def cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["inferno", *map(str, args)])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    code = exit_info.value.code
    return (0 if code is None else code), out, err


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return synthesize("tiny-dense", tmp_path_factory.mktemp("ck") / "tiny-dense")


@pytest.fixture
def artifact(ckpt, tmp_path, monkeypatch, capsys):
    out = tmp_path / "dense.ninfer"
    code, _, err = cli(monkeypatch, capsys, "convert", ckpt, "-o", out, "--weights", "groupwise-int")
    assert code == 0 and "wrote" in err and out.is_file()
    return out


def _error_line(code: int, err: str) -> str:
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err
    return lines[0]


def test_convert_inspect_verify(artifact, monkeypatch, capsys):
    code, out, _ = cli(monkeypatch, capsys, "inspect", artifact)
    assert code == 0
    assert f"identity    {DENSE}" in out and "Q4G64_F16S" in out and "frontend/tokenizer.json" in out
    assert "hidden 256, 4 layers (3 GDN + 1 attention)" in out and "inventory matches the TEST identity" in out
    code, out, err = cli(monkeypatch, capsys, "verify", artifact)
    assert code == 0 and "no published hash" in out and "verdict     OK" in out and "sha256" in err
    code, out, _ = cli(monkeypatch, capsys, "inspect", artifact, "--tensors")
    assert code == 0 and re.search(r"text/layers/3/attention/query_key +\[1536, 256\] +Q4G64_F16S", out)


def test_verify_against_a_published_record(artifact, monkeypatch, capsys):
    import hashlib

    digest = hashlib.sha256(artifact.read_bytes()).hexdigest()
    size = artifact.stat().st_size
    spec = identities.REGISTRY[DENSE]
    for published, sha, want_code, want in (
        (size, digest, 0, "OK: this is the published"),
        (size, "0" * 64, 1, "same size, different bytes"),
        (size + 4096, digest, 1, "DIFFERS from the published"),
    ):
        monkeypatch.setitem(identities.REGISTRY, DENSE,
                            dataclasses.replace(spec, published_bytes=published, sha256=sha))
        code, out, _ = cli(monkeypatch, capsys, "verify", artifact, "-q")
        assert code == want_code and want in out, out


def _write(path, identity: Identity, tensors, resources: dict[str, bytes]):
    with ArtifactWriter(path, identity, tensors, list((n, len(b)) for n, b in resources.items())) as w:
        for name, data in resources.items():
            w.write_resource(name, data)
        for name, shape, fmt, layout in tensors:
            w.write_tensor(name, np.zeros(formats.packed_nbytes(fmt, layout, shape), dtype=np.uint8))
    return path


def _tiny_inventory(artifact):
    with open_artifact(artifact) as art:
        resources = {n: art.resource(n) for n in art.resources}
        tensors = [(t.name, t.shape, t.format, t.layout) for t in art.tensors.values()]
    return tensors, resources


@pytest.mark.parametrize("case, message", [
    ("unknown identity", "unknown artifact identity qwen9-1b/groupwise-int"),
    ("missing tensor", "tensor text/layers/2/mlp/down is missing"),
    ("shape mismatch", r"tensor text/final_norm has shape \[128\], expected \[256\]"),
    ("wrong format", "text/layers/0/gdn/output is Q4G64_F16S/row-split-k128-v1, expected Q5G64_F16S"),
    ("extra tensor", "tensor text/bonus is not part of"),
    ("truncated", "dense.ninfer"),
    ("not an artifact", "not-an-artifact.ninfer"),
])
@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_corrupt_or_mismatched_artifacts_exit_2(artifact, tmp_path, monkeypatch, capsys, case, message, command):
    tensors, resources = _tiny_inventory(artifact)
    bad = tmp_path / "bad.ninfer"
    ident = Identity("inferno-test-tiny-dense", "groupwise-int")
    if case == "unknown identity":
        _write(bad, Identity("qwen9-1b", "groupwise-int"), tensors, resources)
    elif case == "missing tensor":
        _write(bad, ident, [t for t in tensors if t[0] != "text/layers/2/mlp/down"], resources)
    elif case == "shape mismatch":
        _write(bad, ident, [(n, (128,) if n == "text/final_norm" else s, f, la) for n, s, f, la in tensors], resources)
    elif case == "wrong format":
        _write(bad, ident, [(n, s, "Q4G64_F16S" if n == "text/layers/0/gdn/output" else f, la)
                            for n, s, f, la in tensors], resources)
    elif case == "extra tensor":
        _write(bad, ident, [*tensors, ("text/bonus", (4,), "BF16", formats.CONTIGUOUS)], resources)
    elif case == "truncated":
        bad = tmp_path / "dense.ninfer"
        data = artifact.read_bytes()
        artifact.unlink()
        bad.write_bytes(data[: len(data) - 1000])
    else:
        bad = tmp_path / "not-an-artifact.ninfer"
        bad.write_bytes(b"GGUF" + bytes(5000))
    code, _, err = cli(monkeypatch, capsys, command, bad)
    assert re.search(message, _error_line(code, err))


def _make_v1(v2_path, v1_path, model_id: str | None = None):
    """A revision-1 file with the same objects and payload (as NInfer published before v2)."""
    with open_artifact(v2_path) as art:
        objects = []
        for o in art.objects:
            if o.name in art.tensors:
                objects.append({"name": o.name, "kind": "tensor", "shape": list(o.shape), "format": o.format,
                                "layout": o.layout, "offset": o.offset, "bytes": o.bytes})
            else:
                objects.append({"name": o.name, "kind": "resource", "encoding": o.encoding, "offset": o.offset,
                                "bytes": o.bytes})
        directory = json.dumps({"model_id": model_id or art.identity.model_id, "objects": objects},
                               separators=(",", ":")).encode()
        payload = v2_path.read_bytes()[art.payload_offset:]
    head = struct.pack("<8sQ", b"NINFER\0\x01", len(directory)) + directory
    head += bytes(-len(head) % 4096)
    v1_path.write_bytes(head + payload)
    return v1_path


def test_migrate_v1_to_v2(artifact, tmp_path, monkeypatch, capsys):
    v1 = _make_v1(artifact, tmp_path / "old.ninfer")
    code, _, err = cli(monkeypatch, capsys, "verify", v1)
    assert "inferno migrate" in _error_line(code, err)
    code, _, err = cli(monkeypatch, capsys, "migrate", v1, "--model-id", "qwen3.6-27b")
    assert "holds model_id 'inferno-test-tiny-dense'" in _error_line(code, err)
    code, _, err = cli(monkeypatch, capsys, "migrate", v1)
    assert code == 0 and f"as {DENSE}" in err
    code, out, _ = cli(monkeypatch, capsys, "verify", v1, "-q")
    assert code == 0 and "verdict     OK" in out
    with open_artifact(v1) as a, open_artifact(artifact) as b:
        assert a.objects == b.objects and a.identity == b.identity
    code, _, err = cli(monkeypatch, capsys, "migrate", v1)
    assert code == 0 and "already version 2" in err
    unknown = _make_v1(artifact, tmp_path / "unknown.ninfer", model_id="qwen9-1b")
    code, _, err = cli(monkeypatch, capsys, "migrate", unknown)
    assert "unknown artifact identity qwen9-1b/groupwise-int" in _error_line(code, err)


def test_convert_errors_exit_2(ckpt, tmp_path, monkeypatch, capsys):
    code, _, err = cli(monkeypatch, capsys, "convert", ckpt, "-o", tmp_path / "x.bin")
    assert "must end in .ninfer" in _error_line(code, err)
    code, _, err = cli(monkeypatch, capsys, "convert", ckpt, "-o", tmp_path / "x.ninfer", "--weights", "q8")
    assert "unknown artifact identity inferno-test-tiny-dense/q8" in _error_line(code, err)
    code, _, err = cli(monkeypatch, capsys, "convert", tmp_path, "-o", tmp_path / "x.ninfer")
    assert "config.json" in _error_line(code, err)
    assert not list(tmp_path.glob("*.ninfer*"))


def test_migrate_checks_the_published_v1_hash(artifact, tmp_path, monkeypatch, capsys):
    import hashlib

    v1 = _make_v1(artifact, tmp_path / "old.ninfer")
    spec = identities.REGISTRY[DENSE]
    monkeypatch.setitem(identities.REGISTRY, DENSE, dataclasses.replace(spec, v1_sha256="0" * 64))
    code, _, err = cli(monkeypatch, capsys, "migrate", v1, "-q")
    assert "is not the published v1" in _error_line(code, err) and "--no-hash" in err
    digest = hashlib.sha256(v1.read_bytes()).hexdigest()
    monkeypatch.setitem(identities.REGISTRY, DENSE, dataclasses.replace(spec, v1_sha256=digest))
    code, _, err = cli(monkeypatch, capsys, "migrate", v1, "-q")
    assert code == 0 and "migrated" in err


def test_synthetic_artifact_verifies(tmp_path, monkeypatch, capsys):
    out = synthesize_artifact("tiny-moe", tmp_path / "moe.ninfer", progress=False)
    code, stdout, _ = cli(monkeypatch, capsys, "verify", out, "-q")
    assert code == 0 and "inferno-test-tiny-moe/groupwise-int" in stdout
