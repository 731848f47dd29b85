"""The merged decode input projections (inferno/model/gpu/merge.py, residency `MERGED_INPUTS`): a
layer's groupwise-int input projections stacked by rows in the wider format are the same values bit
for bit; the plan merges them only where it can (switch, fusion plan, formats, tiling) and sizes the
workspace for the merged layout; the emulated executor gives the same logits bit for bit with one
GEMV launch fewer per layer (decode) and one dequant fewer per layer (prefill)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from inferno.artifact import open_checked
from inferno.artifact.formats import groupwise
from inferno.artifact.identities import lookup
from inferno.errors import ArtifactError, UsageError
from inferno.kernels.tiled import tiled_geometry, untile
from inferno.model.gpu.executor import GpuExecutor
from inferno.model.gpu.merge import merged_format, stack_rows, widen
from inferno.model.gpu.residency import (
    ALIGN, BF16, MERGE_ENV, MERGED_INPUTS, TILED, merge_mode, merged_layers, plan_residency, workspace_buffers,
)
from inferno.model.gpu.weights import host_image
from model_fixtures import artifact_inventory, tiny_groupwise_artifact

Q4, Q5, Q6 = "Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S"


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return tiny_groupwise_artifact(tmp_path_factory.mktemp("merge-proj"))


@pytest.fixture(scope="module")
def inventory(artifact):
    return artifact_inventory(artifact)


def _random_payload(rng, fmt: str, n: int, k: int) -> np.ndarray:
    s = groupwise.SCHEMES[fmt]
    codes = rng.integers(s.qmin, s.qmax + 1, (n, k), dtype=np.int8)
    scales = (rng.random((n, -(-k // s.group))) + 0.01).astype(np.float16)
    return groupwise.pack(fmt, codes, scales)


# ---- the stack ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("parts", [((Q4, 24), (Q5, 40)), ((Q5, 16), (Q4, 8)), ((Q5, 7), (Q5, 9)),
                                   ((Q4, 5), (Q6, 11)), ((Q4, 3), (Q4, 13))])
@pytest.mark.parametrize("k", [192, 256])
def test_stack_is_the_parts_codes_and_scales(parts, k):
    rng = np.random.default_rng(len(parts) * k)
    payloads = [(fmt, _random_payload(rng, fmt, n, k), (n, k)) for fmt, n in parts]
    fmt, payload, shape = stack_rows(payloads)
    assert fmt == max((f for f, _ in parts), key=lambda f: groupwise.SCHEMES[f].bits)
    assert shape == (sum(n for _, n in parts), k)
    unpacked = [groupwise.unpack(f, p, s) for f, p, s in payloads]
    want = groupwise.pack(fmt, np.concatenate([c for c, _ in unpacked]), np.concatenate([s for _, s in unpacked]))
    np.testing.assert_array_equal(payload, want)  # the format's own layout of the stacked codes
    values = np.concatenate([groupwise.decode(f, p, s) for f, p, s in payloads])
    np.testing.assert_array_equal(groupwise.decode(fmt, payload, shape), values)  # the same values, bit for bit


def test_widen_keeps_the_values_and_refuses_to_narrow():
    rng = np.random.default_rng(1)
    q4 = _random_payload(rng, Q4, 16, 128)
    for dst in (Q4, Q5, Q6):
        np.testing.assert_array_equal(groupwise.decode(dst, widen(Q4, dst, q4, (16, 128)), (16, 128)),
                                      groupwise.decode(Q4, q4, (16, 128)))
    with pytest.raises(ArtifactError, match="cannot narrow"):
        widen(Q5, Q4, _random_payload(rng, Q5, 16, 128), (16, 128))


def test_only_q4_to_q6_of_one_width_stack():
    assert merged_format([Q4, Q5]) == Q5 and merged_format([Q6, Q4]) == Q6
    for bad in (["W8G32_F16S", Q4], ["NVFP4", Q5], ["BF16"], []):
        with pytest.raises(ArtifactError, match="cannot stack"):
            merged_format(bad)
    rng = np.random.default_rng(2)
    with pytest.raises(ArtifactError, match="different widths"):
        stack_rows([(Q4, _random_payload(rng, Q4, 16, 128), (16, 128)), (Q5, _random_payload(rng, Q5, 16, 256),
                                                                        (16, 256))])


# ---- the plan ----------------------------------------------------------------------------------------------
def test_plan_merges_every_layer_input_projection(inventory):
    config, expected = inventory
    plan = plan_residency(config, expected, 1, 64, merge=True)
    names = {p.name for p in plan.placements}
    for i, kind in enumerate(config.layer_types):
        stack, halves = MERGED_INPUTS["attention" if kind == "full_attention" else "gdn"]
        p = next(p for p in plan.placements if p.name == f"text/layers/{i}/{stack}")
        src = [expected[f"text/layers/{i}/{h}"] for h in halves]
        assert p.merged and p.stored == TILED and p.sources == tuple(e.name for e in src)
        assert p.fmt == merged_format([e.format for e in src])
        assert p.shape == (sum(e.shape[0] for e in src), config.hidden)
        assert p.nbytes == tiled_geometry(p.fmt, *p.shape).nbytes
        assert not names & {f"text/layers/{i}/{h}" for h in halves}
    assert f"merged input projections: {config.n_layers} of {config.n_layers} layers" in plan.summary()


def test_switch_tiling_and_fusion_keep_them_separate(inventory, monkeypatch):
    config, expected = inventory
    monkeypatch.setenv(MERGE_ENV, "0")
    assert merge_mode() is False and merge_mode(True) is True
    off = plan_residency(config, expected, 1, 64)
    assert not off.merge and not any(p.merged for p in off.placements)
    assert "text/layers/0/gdn/query_key" in {p.name for p in off.placements}
    monkeypatch.setenv(MERGE_ENV, "1")
    assert plan_residency(config, expected, 1, 64).merge
    monkeypatch.setenv(MERGE_ENV, "yes")
    with pytest.raises(UsageError, match=f"{MERGE_ENV} must be 0"):
        plan_residency(config, expected, 1, 64)
    monkeypatch.delenv(MERGE_ENV)
    assert merge_mode() is True  # the default
    # only tiled Q4-Q6 halves of the "split" plan merge
    assert not any(p.merged for p in plan_residency(config, expected, 1, 64, tiling="head").placements)
    assert merged_layers(config, expected, "nvfp4", "all", True) == frozenset()
    name = "text/layers/1/gdn/value_z"
    w8 = {**expected, name: dataclasses.replace(expected[name], format="W8G32_F16S")}  # W8 stays row-split
    assert merged_layers(config, w8, "split", "all", True) == frozenset(range(config.n_layers)) - {1}


def test_workspace_holds_the_merged_attention_layout(inventory):
    config, expected = inventory
    c = config
    qw, kvw = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    gdn = c.conv_dim + c.gdn_value_width
    merged = plan_residency(c, expected, 1, 64, merge=True).workspace
    assert merged["mix_in"] == max(gdn, 2 * (qw + kvw)) * BF16 and merged["gate_value"] == ALIGN
    separate = plan_residency(c, expected, 1, 64, merge=False).workspace
    assert separate["mix_in"] == max(gdn, qw + kvw) * BF16 and separate["gate_value"] == (qw + kvw) * BF16
    some = workspace_buffers(c, 1, 1, 1, merged_attention=len(c.attention_layers) - 1)
    assert some["gate_value"] == (qw + kvw) * BF16  # an attention layer still writes gate | v apart


def test_27b_merged_shapes():
    spec = lookup("qwen3.6-27b", "groupwise-int")
    config = spec.builtin_config()
    expected = {e.name: e for e in spec.expected(config)}
    merged = plan_residency(config, expected, 1, 4096, merge=True)
    separate = plan_residency(config, expected, 1, 4096, merge=False)
    by = {p.name: p for p in merged.placements}
    assert (by["text/layers/0/gdn/query_key_value_z"].fmt, by["text/layers/0/gdn/query_key_value_z"].shape) == \
        (Q5, (16384, 5120))
    assert (by["text/layers/3/attention/query_key_gate_value"].fmt,
            by["text/layers/3/attention/query_key_gate_value"].shape) == (Q5, (14336, 5120))
    assert sum(p.merged for p in merged.placements) == 64
    # the Q4 halves gain a Q5 high plane (8 bytes per group of 64): 4096 GDN rows, 7168 attention rows
    grow = (48 * 4096 + 16 * 7168) * 80 * 8
    assert abs(merged.weight_bytes - separate.weight_bytes - grow) < 64 * 2 * 256
    assert merged.workspace["mix_in"] == 16384 * BF16 and merged.prefill["weight"] == separate.prefill["weight"]


# ---- upload and the emulated executor ---------------------------------------------------------------------
def test_uploaded_image_is_the_stack(artifact, inventory):
    config, expected = inventory
    plan = plan_residency(config, expected, 1, 64, merge=True)
    a, *_ = open_checked(artifact)
    try:
        for p in (p for p in plan.placements if p.merged):
            image = host_image(p, a, expected)
            got = groupwise.decode(p.fmt, untile(p.fmt, image, *p.shape), p.shape)
            want = np.concatenate([groupwise.decode(expected[s].format, a.tensor_bytes(s), expected[s].shape)
                                   for s in p.sources])
            np.testing.assert_array_equal(got, want)
    finally:
        a.close()


def _executor(artifact, merge: bool) -> GpuExecutor:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(MERGE_ENV, "1" if merge else "0")
        return GpuExecutor(artifact, emulate=True, max_seqs=1, max_context=128, progress=False, prefill_chunk=64)


def _counted(ex, fn):
    """(result, launches, gemv launches, dequant launches) of fn()."""
    ops, calls = ex.ops, {"gemv": 0, "dequant": 0}
    for name in calls:
        real = getattr(ops, name)

        def counting(*args, _real=real, _name=name, **kw):
            calls[_name] += 1
            return _real(*args, **kw)

        setattr(ops, name, counting)
    before = ops.launches
    try:
        out = fn()
    finally:
        for name in calls:
            delattr(ops, name)
    return out, ops.launches - before, calls["gemv"], calls["dequant"]


def test_merged_matches_separate_bit_for_bit_with_fewer_launches(artifact):
    merged, separate = _executor(artifact, True), _executor(artifact, False)
    c = merged.config
    tokens = [(7 + 3 * i) % c.vocab for i in range(20)]
    sm, ss = merged.new_state(), separate.new_state()
    try:
        (lm, nm, gm, dm), (ls, ns, gs, ds) = (_counted(merged, lambda: merged.prefill(tokens, sm)),
                                              _counted(separate, lambda: separate.prefill(tokens, ss)))
        np.testing.assert_array_equal(lm, ls, err_msg="prefill")
        assert ds - dm == c.n_layers and ns - nm == c.n_layers  # one dequant fewer per layer
        for step in range(3):
            t = int(ls.argmax())
            (lm, nm, gm, _), (ls, ns, gs, _) = (_counted(merged, lambda: merged.step(t, sm)),
                                                _counted(separate, lambda: separate.step(t, ss)))
            np.testing.assert_array_equal(lm, ls, err_msg=f"step {step}")
            assert gs - gm == c.n_layers and ns - nm == c.n_layers  # one GEMV fewer per layer
    finally:
        merged.release(sm)
        separate.release(ss)
        merged.close()
        separate.close()
