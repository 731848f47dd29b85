"""`open_model` on HF checkpoint directories (inferno.checkpoint.source)."""

import json
import shutil

import numpy as np
import pytest

import inferno.artifact
from inferno.checkpoint.safetensors import SafetensorsDir, SafetensorsFile, save_file
from inferno.checkpoint.source import ModelSource, SafetensorsWeights, open_model
from inferno.checkpoint.synth import synthesize
from inferno.errors import ArtifactError
from inferno.model.weights import Weights

TEXT = "model.language_model."


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return synthesize("tiny-dense", tmp_path_factory.mktemp("d") / "tiny-dense", seed=0)


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return synthesize("tiny-moe", tmp_path_factory.mktemp("m") / "tiny-moe", seed=0)


def test_open_dense(dense):
    src = open_model(dense)
    assert isinstance(src, ModelSource) and isinstance(src.weights, Weights)
    assert src.identity == "tiny-dense" and src.path == dense
    assert src.config.hidden == 256 and not src.config.is_moe
    assert src.config.eos_token_ids == tuple(json.loads((dense / "generation_config.json").read_text())["eos_token_id"])
    assert set(src.resources) >= {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                  "generation_config.json", "config.json", "preprocessor_config.json"}
    assert src.resources["chat_template.jinja"] == (dense / "chat_template.jinja").read_bytes()
    w = src.weights
    emb = w.get(TEXT + "embed_tokens.weight")
    assert emb.dtype == np.float32 and emb.shape == (2048, 256)
    stored = SafetensorsFile(dense / "model.safetensors").get(TEXT + "embed_tokens.weight")
    assert np.array_equal(emb, stored.astype(np.float32))
    raw = w.stored(TEXT + "embed_tokens.weight")
    assert raw.dtype == stored.dtype and not raw.flags.writeable and not raw.flags.owndata
    assert w.shape(TEXT + "embed_tokens.weight") == (2048, 256)
    assert "mtp.fc.weight" in w and "model.visual.pos_embed.weight" in w and "lm_head.weight" in w
    with pytest.raises(ArtifactError, match="missing"):
        w.get(TEXT + "layers.9.mlp.up_proj.weight")


def test_open_moe_presents_fused_experts(moe):
    w = open_model(moe).weights
    gu = w.get(TEXT + "layers.0.mlp.experts.gate_up_proj")
    assert gu.shape == (8, 256, 256) and gu.dtype == np.float32
    assert w.get("mtp.layers.0.mlp.experts.down_proj").shape == (8, 256, 128)


def test_per_expert_checkpoint_reads_as_the_fused_one(moe, tmp_path):
    per = synthesize("tiny-moe", tmp_path / "per", seed=0, expert_layout="per-expert")
    a, b = open_model(moe).weights, open_model(per).weights
    assert a.names() == b.names()
    for name in (TEXT + "layers.2.mlp.experts.gate_up_proj", TEXT + "layers.2.mlp.experts.down_proj",
                 "mtp.layers.0.mlp.experts.gate_up_proj"):
        assert b.shape(name) == a.shape(name)
        assert np.array_equal(a.get(name), b.get(name))


def _rewrite(src_dir, dst_dir, rename=lambda n: n, drop=(), reshape=None):
    """Copy a checkpoint with renamed / dropped / replaced tensors."""
    shutil.copytree(src_dir, dst_dir, ignore=shutil.ignore_patterns("*.safetensors"))
    f = SafetensorsFile(src_dir / "model.safetensors")
    tensors = {rename(n): np.array(f.get(n)) for n in f.names() if n not in drop}
    if reshape:
        tensors[reshape[0]] = np.zeros(reshape[1], tensors[reshape[0]].dtype)
    save_file(dst_dir / "model.safetensors", tensors)
    return dst_dir


def test_model_prefix_is_normalised(dense, tmp_path):
    d = _rewrite(dense, tmp_path / "c", rename=lambda n: "model." + n[len(TEXT):] if n.startswith(TEXT) else n)
    assert "model.embed_tokens.weight" in SafetensorsDir(d)
    w = open_model(d).weights
    assert TEXT + "embed_tokens.weight" in w and "model.embed_tokens.weight" not in w
    assert np.array_equal(w.get(TEXT + "norm.weight"), open_model(dense).weights.get(TEXT + "norm.weight"))


def test_missing_or_misshapen_tensor_is_reported(dense, tmp_path):
    d = _rewrite(dense, tmp_path / "a", drop={TEXT + "layers.1.linear_attn.A_log"})
    with pytest.raises(ArtifactError, match="layers.1.linear_attn.A_log is missing"):
        open_model(d)
    d = _rewrite(dense, tmp_path / "b", reshape=(TEXT + "layers.3.self_attn.k_proj.weight", (256, 256)))
    with pytest.raises(ArtifactError, match=r"k_proj.weight has shape \[256, 256\], config.json implies \[512, 256\]"):
        open_model(d)


def test_checkpoint_without_mtp_opens(dense, tmp_path):
    f = SafetensorsFile(dense / "model.safetensors")
    d = _rewrite(dense, tmp_path / "c", drop={n for n in f.names() if n.startswith("mtp.")})
    assert "mtp.fc.weight" not in open_model(d).weights


def test_ambiguous_names_are_refused(dense, tmp_path):
    d = _rewrite(dense, tmp_path / "c")
    save_file(d / "extra.safetensors", {"model.norm.weight": np.zeros(256, np.float32)})
    with pytest.raises(ArtifactError, match="appears twice"):
        SafetensorsWeights(SafetensorsDir(d))


def test_bad_paths(tmp_path):
    with pytest.raises(ArtifactError, match="does not exist; expected an HF checkpoint directory"):
        open_model(tmp_path / "nowhere")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ArtifactError, match="neither a directory nor a .ninfer file"):
        open_model(tmp_path / "weights.bin")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtifactError, match="has no config.json"):
        open_model(tmp_path / "empty")


def test_config_without_weights(dense, tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    shutil.copy(dense / "config.json", d / "config.json")
    with pytest.raises(ArtifactError, match="no \\*.safetensors"):
        open_model(d)


def test_ninfer_files_go_to_the_artifact_layer(tmp_path, monkeypatch):
    path = tmp_path / "m.ninfer"
    path.write_bytes(b"")
    seen = []
    monkeypatch.setattr(inferno.artifact, "model_source", lambda p: seen.append(p) or "artifact-source", raising=False)
    assert open_model(path) == "artifact-source" and seen == [path]


def test_sharded_checkpoint_opens_like_the_single_file(dense, tmp_path):
    sharded = synthesize("tiny-dense", tmp_path / "sharded", seed=0, shard_bytes=2 * 1024 * 1024)
    files = sorted(p.name for p in sharded.glob("*.safetensors"))
    assert len(files) > 3 and files[0].startswith("model-00001-of-")
    assert (sharded / "model.safetensors.index.json").is_file()
    a, b = open_model(dense).weights, open_model(sharded).weights
    assert a.names() == b.names()
    assert all(np.array_equal(a.get(n), b.get(n)) for n in a.names())
