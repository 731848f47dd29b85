"""CPU: the tiling policy of the residency plan (residency.tiling_mode / INFERNO_TILED: "head" keeps
only the output head in tile16-v1, "all" every groupwise-int matrix a decode GEMV reads), the
GEMV kinds it reports, the emulated executor in "all" mode against "head" mode (decode and prefill,
which dequantizes the tile16-v1 images), the tiled sizing of the profiler, and every launch of an
"all"-mode executor through the real launchers and manifests (the dry run of tests/test_gpu_launches.py)."""

from __future__ import annotations

import numpy as np
import pytest
from ml_dtypes import bfloat16
from test_gpu_launches import dry  # noqa: F401  (module fixture: the dry-run executor; uses `artifact` below)

from inferno.artifact import open_checked
from inferno.errors import InfernoError, UsageError
from inferno.kernels import qlayout as ql
from inferno.kernels.build import dsl_available
from inferno.kernels.gemv_variants import FORMATS
from inferno.kernels.tiled import tile, tiled_geometry
from inferno.model.gpu import GpuExecutor
from inferno.model.gpu import residency as R
from inferno.model.gpu.emulator import EmulatedOps
from inferno.model.gpu.merge import mixed_parts
from model_fixtures import artifact_inventory, tiny_groupwise_artifact


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return tiny_groupwise_artifact(tmp_path_factory.mktemp("tiled-residency"))


@pytest.fixture(scope="module")
def inventory(artifact):
    return artifact_inventory(artifact)


def _executor(artifact, mode: str) -> GpuExecutor:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(R.TILING_ENV, mode)
        return GpuExecutor(artifact, emulate=True, max_seqs=2, max_context=256, progress=False, prefill_chunk=64)


@pytest.fixture(scope="module")
def head(artifact):
    return _executor(artifact, "head")


@pytest.fixture(scope="module")
def tiled_all(artifact):
    return _executor(artifact, "all")


# --- the policy ---------------------------------------------------------------------------------


def test_tiling_mode_default_env_and_explicit(monkeypatch):
    monkeypatch.delenv(R.TILING_ENV, raising=False)
    assert R.tiling_mode() == R.TILING and R.TILING in R.TILING_MODES
    monkeypatch.setenv(R.TILING_ENV, "")
    assert R.tiling_mode() == R.TILING
    for mode in R.TILING_MODES:
        monkeypatch.setenv(R.TILING_ENV, f" {mode} ")
        assert R.tiling_mode() == mode
    monkeypatch.setenv(R.TILING_ENV, "all")
    assert R.tiling_mode("head") == "head"  # an explicit policy wins over the environment


@pytest.mark.parametrize("value", ["everything", "ALL", "1"])
def test_bad_tiling_value_names_the_two_policies(monkeypatch, inventory, value):
    monkeypatch.setenv(R.TILING_ENV, value)
    with pytest.raises(UsageError, match=r"INFERNO_TILED to 'head' or 'all'") as e:
        R.tiling_mode()
    assert isinstance(e.value, InfernoError) and "\n" not in str(e.value) and repr(value) in str(e.value)
    config, expected = inventory
    with pytest.raises(UsageError, match="unknown tiling policy"):
        R.plan_residency(config, expected, 1, 64)
    monkeypatch.delenv(R.TILING_ENV)
    with pytest.raises(UsageError, match="unknown tiling policy"):
        R.plan_residency(config, expected, 1, 64, tiling=value)


def _groupwise_gemv(p: R.Placement) -> bool:
    return p.fmt in FORMATS and R.gemv_epilogue(p.name) is not None


def test_plan_head_tiles_only_the_output_head(inventory):
    config, expected = inventory
    plan = R.plan_residency(config, expected, 1, 64, tiling="head")
    assert {p.name for p in plan.placements if p.stored == R.TILED} == {"text/output_head"}


def test_plan_all_tiles_every_groupwise_gemv_matrix(inventory):
    config, expected = inventory
    head = R.plan_residency(config, expected, 1, 64, tiling="head", merge=False)
    every = R.plan_residency(config, expected, 1, 64, tiling="all", merge=False)  # (merged: test_merge_proj.py)
    tiled = [p for p in every.placements if p.stored == R.TILED]
    # per layer q|k, v|z (or gate|v), output, gate_up, down; and the head
    assert len(tiled) == 5 * config.n_layers + 1
    for h, a in zip(head.placements, every.placements, strict=True):
        assert (h.name, h.fmt, h.shape, h.sources) == (a.name, a.fmt, a.shape, a.sources)
        if _groupwise_gemv(a):
            assert a.stored == R.TILED and a.nbytes == tiled_geometry(a.fmt, *a.shape).nbytes
        else:
            assert (a.stored, a.nbytes) == (h.stored, h.nbytes)  # norms, embedding, bf16 a|b: as they were
    assert every.prefill == head.prefill  # the bf16 scratch holds the same [N, K] matrices
    assert (head.tiling, every.tiling) == ("head", "all") and "tile16-v1: all" in every.summary()


def test_plan_reads_the_environment(monkeypatch, inventory):
    config, expected = inventory
    monkeypatch.setenv(R.TILING_ENV, "all")
    assert sum(p.stored == R.TILED for p in R.plan_residency(config, expected, 1, 64).placements) > 1
    monkeypatch.setenv(R.TILING_ENV, "head")
    assert sum(p.stored == R.TILED for p in R.plan_residency(config, expected, 1, 64).placements) == 1


def test_gemv_kinds_report_tiled_per_placement(inventory):
    config, expected = inventory
    kinds = {mode: R.gemv_kinds(R.plan_residency(config, expected, 1, 64, tiling=mode, merge=False).placements)
             for mode in R.TILING_MODES}  # (merged: the Q5 stacks of test_merge_proj.py)
    assert ("Q6G64_F16S", "plain", True) in kinds["head"]  # the head
    assert {(f, e) for f, e, t in kinds["head"] if t} == {("Q6G64_F16S", "plain")}
    assert all(t for f, e, t in kinds["all"] if f in FORMATS)
    assert {(f, e) for f, e, _ in kinds["head"]} == {(f, e) for f, e, _ in kinds["all"]}
    assert {"plain", "residual", "swiglu"} == {e for _, e, _ in kinds["all"]}


def test_all_mode_tiles_nvfp4_matrices(tmp_path):
    """Fusion plan "nvfp4" (NVFP4 layers, the fused input projections, a W8 head): "all" holds every NVFP4
    GEMV matrix in tile16-nvfp4-v1 (the fused projections as they are, one matrix a layer); "head" only
    the head; with the input projections split by rows (INFERNO_MERGE_PROJ=0) the row slices stay as
    they are."""
    from inferno.artifact.synth import synthesize_artifact

    path = tmp_path / "tiny-nvfp4.ninfer"
    synthesize_artifact("tiny-dense", path, weights_id="nvfp4", progress=False)
    a, spec, config, expected = open_checked(path)
    a.close()
    inv = {e.name: e for e in expected}
    head, every = (R.plan_residency(config, inv, 1, 64, spec.plan, tiling=mode) for mode in ("head", "all"))
    assert {p.name for p in head.placements if p.stored == R.TILED} == {"text/output_head"}
    assert {p.stored for p in head.placements if p.fmt == "NVFP4"} == {R.PAYLOAD}
    assert {p.stored for p in every.placements if p.fmt == "NVFP4"} == {R.TILED}
    assert [p.name for p in every.placements] == [p.name for p in head.placements]
    split = R.plan_residency(config, inv, 1, 64, spec.plan, tiling="all", merge=False)
    assert {p.stored for p in split.placements if p.fmt == "NVFP4"} == {R.TILED, R.ROWS}


# --- the emulated executor: "all" == "head" -------------------------------------------------------


def test_all_mode_equals_head_mode_token_for_token(head, tiled_all):
    """Prefill over two chunks (64 + 6 tokens: every matrix dequantized from its tile16-v1 image), then
    greedy decode (every GEMV on a tile16-v1 image): the same logits bit for bit as "head" mode."""
    assert sum(p.stored == R.TILED for p in tiled_all.plan.placements) > 1
    tokens = [(5 + 7 * i) % head.config.vocab for i in range(70)]
    sh, sa = head.new_state(), tiled_all.new_state()
    try:
        lh, la = head.prefill(tokens, sh), tiled_all.prefill(tokens, sa)
        for step in range(4):
            np.testing.assert_array_equal(la, lh, err_msg=f"step {step} (0 = prefill)")
            t = int(lh.argmax())
            lh, la = head.step(t, sh), tiled_all.step(t, sa)
        np.testing.assert_array_equal(la, lh)
        assert sh.position == sa.position == 74
    finally:
        head.release(sh)
        tiled_all.release(sa)


@pytest.mark.parametrize("mode", ["head", "all"])
def test_launches_follow_each_placements_storage(request, mode):
    """Every GEMV and every prefill dequant is told the storage of its weight (tiled exactly for the
    TILED placements); the GEMV kinds launched are the ones preloaded."""
    ex = request.getfixturevalue("tiled_all" if mode == "all" else "head")
    ops = ex.ops
    tiled_ptrs = {ex.weights[p.name].buf.ptr: p.stored == R.TILED for p in ex.plan.placements}
    tiled_ptrs |= {ex.weights[p.name].buf.ptr + offset: True for p in ex.plan.placements if p.q4_rows
                   for *_, offset, _ in mixed_parts(*p.shape, p.q4_rows)}  # a mixed stack: dequantised per image
    gemvs, dequants = [], []
    real_gemv, real_dequant = ops.gemv, ops.dequant

    def gemv(fmt, epilogue, w, *args, tiled=False, **kw):
        gemvs.append((fmt, epilogue, tiled, tiled_ptrs.get(w.ptr)))
        return real_gemv(fmt, epilogue, w, *args, tiled=tiled, **kw)

    def dequant(fmt, w, out, n, k, tiled=False):
        dequants.append((tiled, tiled_ptrs.get(w.ptr)))
        return real_dequant(fmt, w, out, n, k, tiled)

    ops.gemv, ops.dequant = gemv, dequant
    s = ex.new_state()
    try:
        ex.prefill(list(range(3, 13)), s)
        ex.step(3, s)
    finally:
        ex.release(s)
        del ops.gemv, ops.dequant
    assert gemvs and dequants
    assert all(tiled == stored for *_, tiled, stored in gemvs)
    assert all(tiled == stored for tiled, stored in dequants)
    assert all(tiled == (mode == "all") for tiled, _ in dequants)
    # deferred epilogues ("all": tensor-core GEMVs): the mixer outputs, the downs but the last and every merged
    # input projection (GDN and attention) accumulate
    prog, n = ex.program, ex.config.n_layers
    assert len(prog.accumulating) == (3 * n - 1 if mode == "all" else 0)
    assert {g[:3] for g in gemvs} == R.gemv_kinds(ex.plan.placements, prog.accumulating)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_emulated_dequant_reads_the_tile16_image(fmt):
    """EmulatedOps.dequant(tiled=True) on a tile16-v1 image (ragged N and K) equals the row-split decode."""
    n, k = 40, 200
    pay = ql.random_payload(fmt, n, k, np.random.default_rng(3))
    ops = EmulatedOps(1 << 20)
    image = tile(fmt, pay, n, k)
    w_tiled, w_rows = ops.alloc("tiled", image.nbytes), ops.alloc("rows", pay.nbytes)
    ops.upload(w_tiled, image)
    ops.upload(w_rows, pay)
    out = ops.alloc("out", n * k * 2)
    ops.dequant(fmt, w_tiled, out, n, k, tiled=True)
    got = ops.download(out, bfloat16, (n, k))
    np.testing.assert_array_equal(got, ql.dequant_rows(fmt, pay, n, k).astype(np.float32).astype(bfloat16))
    ops.dequant(fmt, w_rows, out, n, k)
    np.testing.assert_array_equal(ops.download(out, bfloat16, (n, k)), got)


def test_profile_sizes_tiled_dequant_by_the_image():
    from inferno.model.gpu.profile import RecordingOps, payload_nbytes

    rec = RecordingOps(None, None, None, None, None)
    buf = EmulatedOps(1 << 16).alloc("text/layers/3/mlp/down", 64)
    n, k = 1000, 200
    label, work = rec._w_dequant("Q5G64_F16S", buf, buf, n, k, tiled=True)
    image = tiled_geometry("Q5G64_F16S", n, k).nbytes
    assert image != payload_nbytes("Q5G64_F16S", n, k)
    assert work.fixed == image and work.bytes == image + n * k * 2 and "tile16-v1" in label and "mlp/down" in label
    label, work = rec._w_dequant("Q5G64_F16S", buf, buf, n, k)
    assert work.fixed == payload_nbytes("Q5G64_F16S", n, k) and "tile16-v1" not in label


# --- every launch of an "all"-mode executor through the real launchers (kernels built here) --------


@pytest.mark.slow
@pytest.mark.skipif(not dsl_available(), reason="the CuTe DSL is not installed (kernels cannot be built)")
def test_all_mode_launches_pass_the_launchers(dry, artifact, monkeypatch):  # noqa: F811
    """Decode and two prefill chunks of an "all"-mode executor on the dry-run ops: every groupwise-int
    GEMV is a tensor-core `gemv_mma_*` launch and every prefill dequant a `dequant_*_tiled` one, each
    packed by its real launcher (buffer sizes = the tile16-v1 images) with its real manifest."""
    _, launches = dry  # the fixture's patches are active while it lives
    monkeypatch.setenv(R.TILING_ENV, "all")
    ex = GpuExecutor(artifact, max_seqs=1, max_context=160, cuda_graph=False, progress=False, prefill_chunk=64)
    s = ex.new_state()
    try:
        launches.clear()
        ex.prefill(list(range(3, 73)), s)
        ex.step(5, s)
        names = [n for n, _ in launches]
        gemvs = [n for n in names if n.startswith("gemv") and not n.startswith("gemv_bf16")]
        dequants = [n for n in names if n.startswith("dequant")]
        assert gemvs and all(n.startswith("gemv_mma_") for n in gemvs), gemvs
        assert dequants and all(n.endswith("_tiled") for n in dequants), dequants
        c = ex.config
        per_layer = 3 + (1 if ex.plan.merge else 2)  # input projections (merged: one matrix), output, gate_up, down
        assert len(gemvs) == per_layer * c.n_layers + 2  # decode step + the prefill's decode head
        mixed = sum(p.q4_rows > 0 for p in ex.plan.placements)  # a mixed stack: one dequant per image
        assert len(dequants) == 2 * (per_layer * c.n_layers + mixed)  # two chunks
    finally:
        ex.release(s)
        ex.close()
