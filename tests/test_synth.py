"""Synthetic checkpoints: presets, determinism, layout, goldens fingerprint, `inferno synth` CLI."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from inferno.checkpoint import synth
from inferno.checkpoint.layout import checkpoint_tensors
from inferno.checkpoint.presets import PRESETS, get_preset
from inferno.checkpoint.safetensors import SafetensorsFile
from inferno.errors import UsageError
from inferno.model.config import ModelConfig

GOLDEN = Path(__file__).parent / "fixtures" / "golden"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return synth.synthesize("tiny-dense", tmp_path_factory.mktemp("dense") / "ckpt", seed=0)


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return synth.synthesize("tiny-moe", tmp_path_factory.mktemp("moe") / "ckpt", seed=0)


def test_same_seed_same_bytes_other_seed_other_bytes(dense, tmp_path):
    again = synth.synthesize("tiny-dense", tmp_path / "again", seed=0)
    for f in sorted(p.name for p in dense.iterdir()):
        assert (dense / f).read_bytes() == (again / f).read_bytes(), f
    other = synth.synthesize("tiny-dense", tmp_path / "other", seed=1)
    assert _sha256(other / "model.safetensors") != _sha256(dense / "model.safetensors")


@pytest.mark.parametrize("case", ["dense", "moe"])
def test_golden_fixtures_match_what_synth_writes_now(case, tmp_path):
    with np.load(GOLDEN / case / "golden.npz") as z:
        preset, seed, digest = str(z["synth_preset"]), int(z["synth_seed"]), str(z["safetensors_sha256"])
    ckpt = synth.synthesize(preset, tmp_path / "c", seed=seed)
    assert _sha256(ckpt / "model.safetensors") == digest, (
        "synth output changed: regenerate the goldens with `python tools/make_goldens.py`"
    )


def test_tiny_dense_config(dense):
    raw = json.loads((dense / "config.json").read_text())
    assert raw["model_type"] == "qwen3_5" and raw["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    cfg = ModelConfig.from_dir(dense)
    assert (cfg.hidden, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (256, 4, 4, 2, 256)
    assert cfg.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert (cfg.rotary_dim, cfg.mrope_section, cfg.rope_theta) == (64, (11, 11, 10), 1e7)
    assert (cfg.gdn_k_heads, cfg.gdn_v_heads, cfg.gdn_k_dim, cfg.gdn_v_dim, cfg.conv_kernel) == (2, 4, 128, 128, 4)
    assert (cfg.intermediate, cfg.vocab, cfg.mtp_layers, cfg.is_moe) == (512, 2048, 1, False)
    assert raw["vision_config"]["out_hidden_size"] == cfg.hidden
    assert cfg.hidden % 128 == 0 and cfg.intermediate % 128 == 0


def test_tiny_moe_config(moe):
    raw = json.loads((moe / "config.json").read_text())
    assert raw["model_type"] == "qwen3_5_moe" and raw["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    cfg = ModelConfig.from_dir(moe)
    assert (cfg.is_moe, cfg.n_experts, cfg.top_k, cfg.moe_intermediate, cfg.shared_intermediate) == (True, 8, 2, 128, 128)
    f = SafetensorsFile(moe / "model.safetensors")
    assert f.info("mtp.layers.0.mlp.experts.gate_up_proj").shape == (8, 256, 256)
    assert f.info("model.language_model.layers.3.mlp.experts.down_proj").shape == (8, 256, 128)


def test_special_token_ids_agree_across_files(dense):
    tok = Tokenizer.from_file(str(dense / "tokenizer.json"))
    raw = json.loads((dense / "config.json").read_text())
    gen = json.loads((dense / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    assert raw["text_config"]["eos_token_id"] == tok.token_to_id("<|endoftext|>")
    assert raw["image_token_id"] == tok.token_to_id("<|image_pad|>")
    assert raw["vision_start_token_id"] == tok.token_to_id("<|vision_start|>")
    assert max(tok.get_vocab().values()) < raw["text_config"]["vocab_size"]
    template = (dense / "chat_template.jinja").read_text()
    assert "<|im_start|>" in template
    assert "chat_template" not in json.loads((dense / "tokenizer_config.json").read_text())
    pre = json.loads((dense / "preprocessor_config.json").read_text())
    assert (pre["patch_size"], pre["merge_size"], pre["temporal_patch_size"]) == (16, 2, 2)
    assert json.loads((dense / "video_preprocessor_config.json").read_text())["fps"] == 2


def test_every_tensor_is_bf16_and_randomised(dense):
    f = SafetensorsFile(dense / "model.safetensors")
    preset = get_preset("tiny-dense")
    assert [(n, s) for n, s in checkpoint_tensors(preset.text, preset.vision, False)] == [
        (n, f.info(n).shape) for n in f.names()
    ]
    for name in f.names():
        assert f.info(name).dtype == "BF16"
        a = f.get(name).astype(np.float32)
        kind, mean, std = synth.distribution(name, a.shape)
        assert len(np.unique(a)) > 1, name  # nothing left at a constant init
        if kind == "normal" and a.size >= 128:  # each at its own scale
            assert abs(a.std() - std) < 0.3 * std and abs(a.mean() - mean) < 0.3 * std + 0.02, name
    w = lambda n: f.get(n).astype(np.float32)  # noqa: E731
    assert abs(w("model.language_model.layers.0.input_layernorm.weight").mean()) < 0.1  # (1 + w) norms: w ~ N(0, .2)
    assert abs(w("model.language_model.layers.0.linear_attn.norm.weight").mean() - 1) < 0.1  # plain weight
    a_log = w("model.language_model.layers.0.linear_attn.A_log")
    assert a_log.min() >= -3 and a_log.max() <= 0.5
    q = w("model.language_model.layers.3.self_attn.q_proj.weight")
    assert abs(q.std() - 256**-0.5) < 0.01


def test_tensor_values_do_not_depend_on_other_tensors():
    a = next(synth.tensor_blocks("x.weight", (4, 8), 7, tiled=False))
    b = next(synth.tensor_blocks("x.weight", (4, 8), 7, tiled=True))
    assert a.tobytes() == b.tobytes()  # small tensors are drawn whole either way
    assert next(synth.tensor_blocks("y.weight", (4, 8), 7, tiled=False)).tobytes() != a.tobytes()


def test_tiled_fill_streams_bounded_row_blocks(monkeypatch):
    monkeypatch.setattr(synth, "BLOCK_ELEMS", 1 << 16)
    shape = (300, 1024)  # 307,200 elements < TILE: drawn whole
    assert len(list(synth.tensor_blocks("w", shape, 0, tiled=True))) == 1
    shape = (2100, 1024)  # > TILE: tiled, blocks of 64 rows
    blocks = list(synth.tensor_blocks("w", shape, 0, tiled=True))
    assert all(b.shape[1:] == (1024,) and b.shape[0] <= 64 for b in blocks)
    flat = np.concatenate(blocks).reshape(-1).astype(np.float32)
    assert flat.size == 2100 * 1024
    assert np.array_equal(flat[: synth.TILE], flat[synth.TILE : 2 * synth.TILE])  # the tile repeats ...
    assert not np.array_equal(flat[:1024], flat[1024:2048])  # ... but rows do not
    assert abs(flat.std() - 1024**-0.5) < 0.01
    again = np.concatenate(list(synth.tensor_blocks("w", shape, 0, tiled=True))).reshape(-1).astype(np.float32)
    assert np.array_equal(flat, again)


def test_full_size_layouts_match_the_published_tensor_counts():
    dense = synth.tensor_specs(PRESETS["qwen3.6-27b"])
    names = [s.name for s in dense]
    assert len(names) == 1199  # 851 text + 15 MTP + 333 vision, as in the Qwen3.8-27B index
    assert sum(n.startswith("model.language_model.") or n == "lm_head.weight" for n in names) == 851
    shapes = {s.name: s.shape for s in dense}
    assert shapes["model.language_model.layers.0.linear_attn.in_proj_qkv.weight"] == (10240, 5120)
    assert shapes["model.language_model.layers.3.self_attn.q_proj.weight"] == (12288, 5120)
    assert shapes["mtp.fc.weight"] == (5120, 10240)
    assert shapes["model.visual.merger.linear_fc2.weight"] == (5120, 4608)
    params = sum(int(np.prod(s.shape)) for s in dense if not s.name.startswith(("model.visual.", "mtp.")))
    assert 26.5e9 < params < 27.5e9
    moe = {s.name: s.shape for s in synth.tensor_specs(PRESETS["qwen3.6-35b-a3b"])}
    assert moe["model.language_model.layers.0.mlp.experts.gate_up_proj"] == (256, 1024, 2048)
    assert moe["model.language_model.layers.39.self_attn.k_proj.weight"] == (512, 2048)
    assert moe["model.visual.merger.linear_fc2.weight"] == (2048, 4608)


def test_per_expert_layout_slices_the_fused_tensors(moe, tmp_path):
    per = synth.synthesize("tiny-moe", tmp_path / "per", seed=0, expert_layout="per-expert")
    fused = SafetensorsFile(moe / "model.safetensors")
    split = SafetensorsFile(per / "model.safetensors")
    gu = fused.get("model.language_model.layers.1.mlp.experts.gate_up_proj")
    assert split.get("model.language_model.layers.1.mlp.experts.5.up_proj.weight").tobytes() == gu[5, 128:].tobytes()
    assert "model.language_model.layers.1.mlp.experts.gate_up_proj" not in split


def test_bad_arguments(tmp_path):
    with pytest.raises(UsageError, match="unknown preset"):
        synth.synthesize("tiny-huge", tmp_path / "a")
    with pytest.raises(UsageError, match="MoE presets only"):
        synth.synthesize("tiny-dense", tmp_path / "b", expert_layout="per-expert")
    with pytest.raises(UsageError, match="expert layout"):
        synth.synthesize("tiny-moe", tmp_path / "c", expert_layout="diagonal")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(UsageError, match="not an empty directory"):
        synth.synthesize("tiny-dense", tmp_path / "full")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "inferno", "synth", *args], capture_output=True, text=True)


def test_cli_writes_a_checkpoint(tmp_path):
    r = _cli("tiny-dense", str(tmp_path / "c"), "--seed", "3")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "c" / "config.json").read_text())["inferno_synth"]["seed"] == 3


@pytest.mark.parametrize(
    "args, message",
    [
        (["nope", "OUT"], "unknown preset 'nope'"),
        (["tiny-dense", "OUT", "--expert-layout", "per-expert"], "MoE presets only"),
        (["tiny-dense", "OUT", "--seed", "-1"], "seed -1 is out of range"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(tmp_path, args, message):
    r = _cli(*[str(tmp_path / "o") if a == "OUT" else a for a in args])
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and message in r.stderr and r.stderr.count("\n") == 1
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


@pytest.mark.parametrize(
    "name, numbers",
    [
        ("qwen3.6-27b", dict(hidden=5120, n_layers=64, n_heads=24, n_kv_heads=4, gdn_v_heads=48, intermediate=17408)),
        ("qwen3.6-35b-a3b", dict(hidden=2048, n_layers=40, n_heads=16, n_kv_heads=2, gdn_v_heads=32, n_experts=256,
                                 top_k=8, moe_intermediate=512, shared_intermediate=512)),
    ],
)
def test_full_size_configs(name, numbers):
    preset = PRESETS[name]
    cfg = ModelConfig.from_hf(synth.hf_config(preset, 0), synth.generation_config(preset.text["vocab_size"]))
    assert {k: getattr(cfg, k) for k in numbers} == numbers
    assert (cfg.vocab, cfg.head_dim, cfg.rotary_dim, cfg.gdn_k_heads, cfg.mtp_layers) == (248320, 256, 64, 16, 1)
    assert set(cfg.eos_token_ids) == {248044, 248046}
    raw = synth.hf_config(preset, 0)
    assert (raw["image_token_id"], raw["video_token_id"], raw["vision_start_token_id"]) == (248056, 248057, 248053)
    assert raw["vision_config"]["out_hidden_size"] == cfg.hidden


def test_cli_unwritable_output_exits_2(tmp_path):
    (tmp_path / "afile").write_text("")
    r = _cli("tiny-dense", str(tmp_path / "afile" / "sub"))
    assert r.returncode == 2 and r.stderr.startswith("error: cannot write") and r.stderr.count("\n") == 1
