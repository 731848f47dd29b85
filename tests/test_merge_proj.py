"""The merged decode input projections (inferno/model/gpu/merge.py, residency `MERGED_INPUTS`): a
layer's groupwise-int input projections stacked by rows in the wider format are the same values bit
for bit; a Q4 half of whole tiles over a Q5 one (a mixed stack) keeps its rows as a Q4 tile16-v1 image
ahead of the Q5 image; the plan merges them only where it can (switch, fusion plan, formats, tiling),
sizes mixed stacks by their two images and the workspace for the merged layout; the emulated executor
gives the same logits bit for bit with one GEMV launch fewer per layer (decode) and, for widened stacks,
one dequant fewer per layer (prefill)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from ml_dtypes import bfloat16

from inferno.artifact import open_checked
from inferno.artifact.formats import groupwise
from inferno.artifact.identities import lookup
from inferno.errors import ArtifactError, UsageError
from inferno.kernels.gemv_mma_variants import ACCUMULATE
from inferno.kernels.tiled import mixed_nbytes, mixed_offset, tile, tiled_geometry, untile
from inferno.model.gpu.emulator import EmulatedOps
from inferno.model.gpu.executor import GpuExecutor
from inferno.model.gpu.merge import merged_format, mixed_image, mixed_parts, mixed_q4_rows, stack_rows, widen
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


# ---- the mixed stack ---------------------------------------------------------------------------------------
def test_mixed_only_for_a_q4_part_of_whole_tiles_over_a_q5_part():
    assert mixed_q4_rows([Q4, Q5], [(32, 256), (40, 256)]) == 32
    for formats, shapes in (([Q4, Q5], [(24, 256), (40, 256)]),  # not whole tiles: widened
                            ([Q4, Q6], [(32, 256), (40, 256)]), ([Q5, Q4], [(32, 256), (32, 256)]),
                            ([Q4, Q4], [(32, 256), (32, 256)]), ([Q4, Q5], [(32, 256), (32, 128)]),
                            ([Q4, Q5, Q5], [(32, 256), (32, 256), (32, 256)]), ([Q4, Q5], [(0, 256), (32, 256)]),
                            ([Q4, Q5], [(32, 256), (0, 256)])):
        assert mixed_q4_rows(formats, shapes) == 0, (formats, shapes)


@pytest.mark.parametrize("q4_rows, q5_rows, k", [(16, 24, 128), (32, 40, 192), (48, 16, 256)])
def test_mixed_image_is_each_part_tiled_q4_first(q4_rows, q5_rows, k):
    rng = np.random.default_rng(q4_rows + k)
    n, q4, q5 = q4_rows + q5_rows, _random_payload(rng, Q4, q4_rows, k), _random_payload(rng, Q5, q5_rows, k)
    image = mixed_image([q4, q5], n, k, q4_rows)
    a, b = tile(Q4, q4, q4_rows, k), tile(Q5, q5, q5_rows, k)
    pad = -a.size % groupwise.PLANE_ALIGN
    np.testing.assert_array_equal(image, np.concatenate([a, np.zeros(pad, np.uint8), b]))
    assert mixed_offset(q4_rows, k) == a.size + pad
    assert image.size == mixed_nbytes(n, k, q4_rows) == a.size + pad + b.size
    assert mixed_parts(n, k, q4_rows) == ((Q4, 0, q4_rows, 0, a.size), (Q5, q4_rows, q5_rows, a.size + pad, b.size))
    if (q4_rows, k) == (16, 128):
        assert pad > 0  # a Q4 image of 16 x 128 is 1088 bytes


@pytest.mark.parametrize("epilogue", ["plain", ACCUMULATE])
def test_emulated_gemv_reads_a_mixed_stack_as_the_widened_one(epilogue):
    """The emulator's GEMV over a mixed stack's image (q4_rows) gives what it gives over the widened stack, bit for
    bit, and that is the product with the parts' decoded values."""
    rng = np.random.default_rng(3)
    q4_rows, q5_rows, k = 48, 80, 320
    n, q4, q5 = q4_rows + q5_rows, _random_payload(rng, Q4, q4_rows, k), _random_payload(rng, Q5, q5_rows, k)
    _, stacked, _ = stack_rows([(Q4, q4, (q4_rows, k)), (Q5, q5, (q5_rows, k))])
    ops = EmulatedOps(1 << 22)
    images = {"mixed": mixed_image([q4, q5], n, k, q4_rows), "widened": tile(Q5, stacked, n, k)}
    x = ops.alloc("x", k * 2)
    xv = rng.standard_normal(k).astype(np.float32)
    ops.upload(x, xv.astype(bfloat16))
    y0 = rng.standard_normal(n).astype(np.float32)
    out = {}
    for name, image in images.items():
        w, y = ops.alloc(name, image.size), ops.alloc(f"y {name}", n * 4)
        ops.upload(w, image)
        ops.upload(y, y0)
        ops.gemv(Q5, epilogue, w, x, y, n, k, tiled=True, q4_rows=q4_rows if name == "mixed" else 0)
        out[name] = ops.download(y, np.float32 if epilogue == ACCUMULATE else bfloat16, (n,)).astype(np.float32)
    np.testing.assert_array_equal(out["mixed"], out["widened"])
    values = np.concatenate([groupwise.decode(Q4, q4, (q4_rows, k)), groupwise.decode(Q5, q5, (q5_rows, k))])
    want = values.astype(np.float64) @ xv.astype(bfloat16).astype(np.float64)
    want = want + y0 if epilogue == ACCUMULATE else want
    np.testing.assert_allclose(out["mixed"], want, rtol=1e-2, atol=1e-2 * float(np.abs(want).max()))


def test_profile_counts_a_mixed_stack_by_its_images():
    from inferno.model.gpu.profile import RecordingOps

    rec = RecordingOps(None, None, None, None, None)
    buf = EmulatedOps(1 << 16).alloc("text/layers/0/gdn/query_key_value_z", 64)
    n, k = 1536, 256
    _, mixed = rec._w_gemv(Q5, "plain", buf, buf, buf, n, k, tiled=True, q4_rows=512)
    _, widened = rec._w_gemv(Q5, "plain", buf, buf, buf, n, k, tiled=True)
    assert mixed.fixed == mixed_nbytes(n, k, 512) and widened.fixed == tiled_geometry(Q5, n, k).nbytes
    assert widened.bytes - mixed.bytes == widened.fixed - mixed.fixed == 512 * 4 * 8  # Q5's high plane of 512 rows


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
        assert p.q4_rows == src[0].shape[0] and src[0].format == Q4  # tiny-dense: every stack is mixed
        assert p.nbytes == mixed_nbytes(*p.shape, p.q4_rows) < tiled_geometry(p.fmt, *p.shape).nbytes
        assert not names & {f"text/layers/{i}/{h}" for h in halves}
    assert f"merged input projections: {config.n_layers} of {config.n_layers} layers" in plan.summary()


@pytest.mark.parametrize("change", ["rows", "format"])
def test_plan_widens_stacks_that_are_not_mixed(inventory, change):
    """A Q4 half that is not whole tiles, or a Q6 other half: the stack is widened (q4_rows 0), as before."""
    config, expected = inventory
    name = "text/layers/0/gdn/" + ("query_key" if change == "rows" else "value_z")
    e = expected[name]
    other = (dataclasses.replace(e, shape=(e.shape[0] - 8, e.shape[1])) if change == "rows"
             else dataclasses.replace(e, format=Q6))
    plan = plan_residency(config, {**expected, name: other}, 1, 64, merge=True)
    by = {p.name: p for p in plan.placements}
    p = by["text/layers/0/gdn/query_key_value_z"]
    assert p.merged and p.q4_rows == 0 and p.nbytes == tiled_geometry(p.fmt, *p.shape).nbytes
    assert p.fmt == (Q5 if change == "rows" else Q6)
    assert by["text/layers/1/gdn/query_key_value_z"].q4_rows > 0


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
    # mixed stacks: the Q4 halves (4096 GDN rows, 7168 attention rows) stay Q4, so the stacks take the halves'
    # bytes; widened, each would gain a Q5 high plane (8 bytes per group of 64), ~199 MB
    assert {p.q4_rows for p in merged.placements if p.merged} == {4096, 7168}
    assert merged.weight_bytes == separate.weight_bytes
    widened = sum(tiled_geometry(p.fmt, *p.shape).nbytes - p.nbytes for p in merged.placements if p.merged)
    assert widened == (48 * 4096 + 16 * 7168) * 80 * 8
    assert merged.workspace["mix_in"] == 16384 * BF16 and merged.prefill["weight"] == separate.prefill["weight"]


# ---- upload and the emulated executor ---------------------------------------------------------------------
def test_uploaded_image_is_the_stack(artifact, inventory):
    config, expected = inventory
    plan = plan_residency(config, expected, 1, 64, merge=True)
    a, *_ = open_checked(artifact)
    try:
        for p in (p for p in plan.placements if p.merged):
            image = host_image(p, a, expected)
            assert image.nbytes == p.nbytes and p.q4_rows  # tiny-dense: mixed stacks
            np.testing.assert_array_equal(image, mixed_image([a.tensor_bytes(s) for s in p.sources], *p.shape,
                                                             p.q4_rows))
            k = p.shape[1]
            got = np.concatenate([groupwise.decode(f, untile(f, image[off:off + size], rows, k), (rows, k))
                                  for f, _, rows, off, size in mixed_parts(*p.shape, p.q4_rows)])
            want = np.concatenate([groupwise.decode(expected[s].format, a.tensor_bytes(s), expected[s].shape)
                                   for s in p.sources])
            np.testing.assert_array_equal(got, want)
    finally:
        a.close()


def _executor(artifact, merge: bool, mixed: bool = True) -> GpuExecutor:
    """The emulated executor; `mixed=False`: every merged stack widened (as for halves that are not mixed)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(MERGE_ENV, "1" if merge else "0")
        if not mixed:
            mp.setattr("inferno.model.gpu.merge.mixed_q4_rows", lambda formats, shapes: 0)
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


@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "widened"])
def test_merged_matches_separate_bit_for_bit_with_fewer_launches(artifact, mixed):
    merged, separate = _executor(artifact, True, mixed), _executor(artifact, False)
    c = merged.config
    assert sum(p.q4_rows > 0 for p in merged.plan.placements) == (c.n_layers if mixed else 0)
    tokens = [(7 + 3 * i) % c.vocab for i in range(20)]
    sm, ss = merged.new_state(), separate.new_state()
    try:
        (lm, nm, gm, dm), (ls, ns, gs, ds) = (_counted(merged, lambda: merged.prefill(tokens, sm)),
                                              _counted(separate, lambda: separate.prefill(tokens, ss)))
        np.testing.assert_array_equal(lm, ls, err_msg="prefill")
        fewer = 0 if mixed else c.n_layers  # widened: one dequant fewer per layer; mixed: one per image
        assert ds - dm == fewer and ns - nm == fewer
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
