"""CPU: the GPU executor on a tiny NVFP4 artifact (fusion plan "nvfp4"). The residency plan keeps the
fused input projections as one matrix per layer (merged input projections; INFERNO_MERGE_PROJ=0 splits
them by rows into NVFP4 matrices of their own) and every NVFP4 GEMV matrix in tile16-nvfp4-v1 for the
tensor-core GEMV (INFERNO_TILED=head: the row-split CUDA-core GEMV); the emulated launch sequence
(numpy models of the kernels) matches the reference executor; every NVFP4 GEMV the decode path
launches passes the real launcher's checks against a real (sm_90a) manifest."""

from __future__ import annotations

import types

import numpy as np
import pytest

from inferno.artifact import open_checked
from inferno.artifact.formats import nvfp4
from inferno.artifact.synth import synthesize_artifact
from inferno.errors import NotBuiltError
from inferno.kernels.build import dsl_available
from inferno.model.gpu import GpuExecutor
from inferno.model.gpu.diagnose import layer_errors, report, rms_rel
from inferno.model.gpu.emulator import EmulatedOps
from inferno.kernels import tiled_nvfp4
from inferno.model.gpu.residency import ROWS, TILED, decode_weights, plan_residency, split_rows
from inferno.model.gpu.weights import host_image

LOGITS_RMS_REL = 0.03
NEAR_TIE = 0.1


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    path = tmp_path_factory.mktemp("nvfp4") / "tiny-nvfp4.ninfer"
    synthesize_artifact("tiny-dense", path, weights_id="nvfp4", progress=False)
    return path


@pytest.fixture(scope="module")
def opened(artifact):
    a, spec, config, expected = open_checked(artifact)
    yield a, spec, config, {e.name: e for e in expected}
    a.close()


@pytest.fixture(scope="module")
def reference(artifact):
    from inferno.artifact import model_source
    from inferno.model.reference import ReferenceExecutor

    src = model_source(artifact)
    return ReferenceExecutor(src.config, src.weights)


def test_plan_keeps_the_fused_projections_tiled(opened):
    a, spec, config, expected = opened
    plan = plan_residency(config, expected, 1, 128, spec.plan)
    assert [p.name for p in plan.placements] == [n for n, _, _ in decode_weights(config, "nvfp4", merge=True)]
    by_name = {p.name: p for p in plan.placements}
    for i, kind in enumerate(config.layer_types):
        pre = f"text/layers/{i}/"
        fused = pre + ("attention/query_key_gate_value" if kind == "full_attention" else "gdn/query_key_value_z")
        p, e = by_name[fused], expected[fused]
        assert (p.stored, p.fmt, p.sources, p.shape) == (TILED, "NVFP4", (fused,), tuple(e.shape))
        img = host_image(p, a, expected)
        assert img.nbytes == p.nbytes == tiled_nvfp4.tiled_geometry(*e.shape).nbytes
        assert tiled_nvfp4.untile(img, *e.shape).tobytes() == bytes(a.tensor_bytes(fused))
        assert not any(n.endswith(("/query_key", "/gate_value", "/value_z")) for n in by_name if n.startswith(pre))
    assert by_name["text/layers/0/mlp/gate_up"].stored == TILED


def test_plan_splits_the_fused_projections_by_rows(opened):
    a, spec, config, expected = opened
    assert spec.plan == "nvfp4"
    plan = plan_residency(config, expected, 1, 128, spec.plan, merge=False)
    assert [p.name for p in plan.placements] == [n for n, _, _ in decode_weights(config, "nvfp4")]
    by_name = {p.name: p for p in plan.placements}
    for i, kind in enumerate(config.layer_types):
        pre = f"text/layers/{i}/"
        if kind == "full_attention":
            fused, halves = pre + "attention/query_key_gate_value", ("attention/query_key", "attention/gate_value")
        else:
            fused, halves = pre + "gdn/query_key_value_z", ("gdn/query_key", "gdn/value_z")
        e = expected[fused]
        assert e.format == "NVFP4"
        parts = [by_name[pre + h] for h in halves]
        assert [p.stored for p in parts] == [ROWS, ROWS] and all(p.sources == (fused,) for p in parts)
        assert parts[0].rows == (0, parts[1].rows[0]) and parts[1].rows[1] == e.shape[0]
        whole = nvfp4.decode(a.tensor_bytes(fused), e.shape)
        for p in parts:
            assert p.fmt == "NVFP4" and p.rows == split_rows(config, p.name)
            img = host_image(p, a, expected)
            assert img.nbytes == p.nbytes == nvfp4.geometry(p.shape).nbytes
            np.testing.assert_array_equal(nvfp4.decode(img.tobytes(), p.shape), whole[p.rows[0]:p.rows[1]])
    for name in ("mlp/gate_up", "mlp/down"):
        assert by_name[f"text/layers/0/{name}"].fmt == "NVFP4"


def test_unsplittable_rows_are_refused(opened):
    a, spec, config, expected = opened
    import dataclasses

    bad = dict(expected)
    name = next(n for n in expected if n.endswith("gdn/query_key_value_z"))
    e = expected[name]
    bad[name] = dataclasses.replace(e, shape=(e.shape[0] - 128, e.shape[1]))
    with pytest.raises(NotBuiltError, match="cannot be split off"):
        plan_residency(config, bad, 1, 128, spec.plan, merge=False)
    with pytest.raises(NotBuiltError, match="input projections need"):
        plan_residency(config, bad, 1, 128, spec.plan)
    with pytest.raises(NotBuiltError, match="fusion plans split, nvfp4"):
        plan_residency(config, expected, 1, 128, "fused-everything")


@pytest.fixture(scope="module")
def emulated(artifact):
    return GpuExecutor(artifact, emulate=True, max_seqs=2, max_context=256, progress=False)


@pytest.mark.parametrize("length", [10, 100])
def test_emulated_greedy_matches_reference(emulated, reference, length):
    ex, ref = emulated, reference
    tokens = [(5 + 7 * i) % ex.config.vocab for i in range(length)]
    rs, gs = ref.new_state(), ex.new_state()
    try:
        lr, lg = ref.prefill(tokens, rs), ex.prefill(tokens, gs)
        for step in range(8):
            assert rms_rel(lg, lr) < LOGITS_RMS_REL, f"step {step}: logits rms rel {rms_rel(lg, lr):.4f}"
            got, want = int(lg.argmax()), int(lr.argmax())
            assert got == want or lr[want] - lr[got] <= NEAR_TIE, f"step {step}: picked {got}, reference {want}"
            lr, lg = ref.step(got, rs), ex.step(got, gs)
    finally:
        ex.release(gs)


def test_emulated_layers_match_reference(emulated, reference):
    errors, logits = layer_errors(emulated, reference, [(3 + 11 * i) % 2048 for i in range(40)])
    assert all(e.mixer < 0.03 and e.residual < 0.02 for e in errors) and logits < LOGITS_RMS_REL, \
        report(errors, logits)


@pytest.mark.skipif(not dsl_available(), reason="the CuTe DSL is not installed (kernels cannot be built)")
def test_nvfp4_gemv_launches_pass_the_launcher(artifact, tmp_path, monkeypatch):
    """Each NVFP4 GEMV of a decode step (row-split: INFERNO_TILED=head) goes through GemvNvfp4 with the
    built manifest (launch recorded)."""
    from inferno.cuda.params import PackedParams, ParamLayout, ParamSpec
    from inferno.kernels import cache
    from inferno.kernels import gemv_nvfp4_variants as gf
    from inferno.kernels.manifest import Manifest

    launches: list[tuple[str, tuple]] = []

    def record(kernel, grid, block, params, smem=0, stream=None, cluster=None):
        m = kernel.manifest
        assert isinstance(params, PackedParams) and list(params.layout.sizes) == [p.size for p in m.params]
        assert list(block) == m.block and smem == m.smem
        launches.append((kernel.name, tuple(grid)))

    def load(v):
        cache.ensure_built(v, "sm_90a", tmp_path)
        m = Manifest.read(tmp_path / "sm_90a" / f"{v.name}.json")
        specs = [ParamSpec(p.name, p.kind, p.size, p.align, len(p.dyn_shape) if p.kind == "tensor" else 0,
                           len(p.dyn_stride)) for p in m.params]
        return cache.LoadedKernel(v, m, types.SimpleNamespace(name=v.name, manifest=m), ParamLayout(specs, v.name), 132)

    launchers: dict[str, gf.GemvNvfp4] = {}
    real_gemv = EmulatedOps.gemv

    def gemv(self, fmt, epilogue, w, x, y, n, k, r=None, tiled=False, **kw):
        if fmt == "NVFP4":
            name = gf.variant_name(epilogue, 1)
            if name not in launchers:
                launchers[name] = gf.GemvNvfp4(load(gf.gemv_nvfp4_variant(name)))
            launchers[name](w, x, y, n, k, 1, r=r)
        real_gemv(self, fmt, epilogue, w, x, y, n, k, r, tiled, **kw)

    monkeypatch.setattr(gf, "launch", record)
    monkeypatch.setattr(EmulatedOps, "gemv", gemv)
    monkeypatch.setenv("INFERNO_TILED", "head")
    ex = GpuExecutor(artifact, emulate=True, max_seqs=1, max_context=64, progress=False)
    s = ex.new_state()
    try:
        ex.step(5, s)
    finally:
        ex.release(s)
    c = ex.config
    assert len(launches) == 4 * c.n_layers, launches  # per layer: the fused input projections, output, gate_up, down
    outs = {"gemv_nvfp4_t1_swiglu": c.intermediate, "gemv_nvfp4_t1_res": c.hidden}
    for name, grid in launches:
        assert grid[0] >= 1 and (name not in outs or grid[0] == -(-outs[name] // (2 if "swiglu" in name else 4)))


@pytest.mark.skipif(not dsl_available(), reason="the CuTe DSL is not installed (kernels cannot be built)")
def test_cuda_ops_resolves_the_nvfp4_gemv(tmp_path, monkeypatch):
    """CudaOps picks GemvNvfp4 for row-split NVFP4 weights, GemvMmaNvfp4 for tile16-nvfp4-v1 ones and GemvQ
    for the groupwise ones (no device needed)."""
    from inferno.kernels import cache
    from inferno.kernels.gemv_mma_nvfp4_variants import GemvMmaNvfp4
    from inferno.kernels.gemv_nvfp4_variants import GemvNvfp4
    from inferno.kernels.gemv_variants import GemvQ
    from inferno.kernels.manifest import Manifest
    from inferno.model.gpu.ops import CudaOps

    def load(v, device=None, root=None):
        cache.ensure_built(v, "sm_90a", tmp_path)
        m = Manifest.read(tmp_path / "sm_90a" / f"{v.name}.json")
        return cache.LoadedKernel(v, m, None, None, 132)

    monkeypatch.setattr(cache, "load", load)
    ops = CudaOps.__new__(CudaOps)
    ops.device, ops._gemv = types.SimpleNamespace(arch="sm_90a"), {}
    ops.preload_gemv({("NVFP4", "swiglu", False), ("NVFP4", "residual", False), ("W8G32_F16S", "plain", False)})
    assert isinstance(ops._gemv_launcher("NVFP4", "swiglu"), GemvNvfp4)
    assert ops._gemv_launcher("NVFP4", "residual").name == "gemv_nvfp4_t1_res"
    assert isinstance(ops._gemv_launcher("W8G32_F16S", "plain"), GemvQ)
    assert sorted(ops._gemv) == ["gemv_nvfp4_t1_res", "gemv_nvfp4_t1_swiglu", "gemv_w8_t1"]
    assert isinstance(ops._gemv_launcher("NVFP4", "plain", tiled=True), GemvMmaNvfp4)


# ---- mixed NVFP4 + BF16 (the published qwen3.6-27b/nvfp4 keeps some matrices BF16) ------------------


@pytest.fixture(scope="module")
def mixed_identity():
    """The tiny nvfp4 identity with the 27B's BF16 exceptions applied through the identity's own
    format rule (`nvfp4_dense`): the first attention layer's input projections and output, and
    GDN layer 0's output, stay BF16. Registered for the module (synth and open both check it)."""
    import dataclasses

    from inferno.artifact import identities
    from inferno.artifact.synth import ModelConfig, preset_resources

    config = ModelConfig.from_hf(preset_resources("tiny-dense", 0)[0])
    attn = config.attention_layers[0]
    key = f"{identities.TEST_PREFIX}tiny-dense/nvfp4"
    spec = dataclasses.replace(identities.REGISTRY[key], assign=identities.nvfp4_dense(
        frozenset({attn}), frozenset({attn}), frozenset({config.gdn_layers[0]})))
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(identities.REGISTRY, key, spec)
        yield attn, config.gdn_layers[0]


@pytest.fixture(scope="module")
def mixed_artifact(mixed_identity, tmp_path_factory):
    path = tmp_path_factory.mktemp("nvfp4-mixed") / "tiny-nvfp4-mixed.ninfer"
    synthesize_artifact("tiny-dense", path, weights_id="nvfp4", progress=False)
    return path


@pytest.fixture(scope="module")
def mixed_reference(mixed_artifact):
    from inferno.artifact import model_source
    from inferno.model.reference import ReferenceExecutor

    src = model_source(mixed_artifact)
    return ReferenceExecutor(src.config, src.weights)


def test_mixed_plan_keeps_the_bf16_matrices(mixed_identity, mixed_artifact):
    attn, gdn = mixed_identity
    a, spec, config, expected = open_checked(mixed_artifact)
    a.close()
    plan = plan_residency(config, {e.name: e for e in expected}, 1, 128, spec.plan)
    fmt = {p.name: p.fmt for p in plan.placements}
    bf16 = {f"text/layers/{attn}/attention/{m}" for m in ("query_key_gate_value", "output")}  # fused inputs: one
    bf16.add(f"text/layers/{gdn}/gdn/output")
    gemv = {n for n in fmt if n.endswith(("query_key", "gate_value", "value_z", "output", "mlp/down", "mlp/gate_up"))
            and n.startswith("text/layers/")}
    assert {n for n in gemv if fmt[n] == "BF16"} == bf16
    assert all(fmt[n] == "NVFP4" for n in gemv - bf16)


def test_mixed_emulated_greedy_matches_reference(mixed_artifact, mixed_reference):
    ex = GpuExecutor(mixed_artifact, emulate=True, max_seqs=1, max_context=256, progress=False)
    ref = mixed_reference
    tokens = [(5 + 7 * i) % ex.config.vocab for i in range(40)]
    rs, gs = ref.new_state(), ex.new_state()
    try:
        lr, lg = ref.prefill(tokens, rs), ex.prefill(tokens, gs)
        for step in range(8):
            assert rms_rel(lg, lr) < LOGITS_RMS_REL, f"step {step}: logits rms rel {rms_rel(lg, lr):.4f}"
            got, want = int(lg.argmax()), int(lr.argmax())
            assert got == want or lr[want] - lr[got] <= NEAR_TIE, f"step {step}: picked {got}, reference {want}"
            lr, lg = ref.step(got, rs), ex.step(got, gs)
    finally:
        ex.release(gs)


@pytest.mark.skipif(not dsl_available(), reason="the CuTe DSL is not installed (kernels cannot be built)")
def test_cuda_ops_resolves_the_bf16_gemv(tmp_path, monkeypatch):
    """CudaOps picks GemvBf16 with the matching epilogue for BF16 weights (no device needed)."""
    from inferno.kernels import cache
    from inferno.kernels.gemv_bf16_variants import GemvBf16
    from inferno.kernels.manifest import Manifest
    from inferno.model.gpu.ops import CudaOps

    def load(v, device=None, root=None):
        cache.ensure_built(v, "sm_90a", tmp_path)
        m = Manifest.read(tmp_path / "sm_90a" / f"{v.name}.json")
        return cache.LoadedKernel(v, m, None, None, 132)

    monkeypatch.setattr(cache, "load", load)
    ops = CudaOps.__new__(CudaOps)
    ops.device, ops._gemv = types.SimpleNamespace(arch="sm_90a"), {}
    ops.preload_gemv({("BF16", "plain", False), ("BF16", "residual", False), ("NVFP4", "plain", False)})
    assert isinstance(ops._gemv_launcher("BF16", "residual"), GemvBf16)
    assert ops._gemv_launcher("BF16", "plain").name == "gemv_bf16_t1"
    assert sorted(ops._gemv) == ["gemv_bf16_t1", "gemv_bf16_t1_res", "gemv_nvfp4_t1"]


@pytest.mark.skipif(not dsl_available(), reason="the CuTe DSL is not installed (kernels cannot be built)")
def test_mixed_bf16_gemv_launches_pass_the_launcher(mixed_identity, mixed_artifact, tmp_path, monkeypatch):
    """Each BF16 GEMV of a mixed decode step goes through GemvBf16 with the built manifest (launch recorded)."""
    from inferno.cuda.params import ParamLayout, ParamSpec
    from inferno.kernels import cache, launchers
    from inferno.kernels import gemv_bf16_variants as gb
    from inferno.kernels.manifest import Manifest
    from inferno.kernels.registry import get

    launches: list[tuple[str, tuple]] = []
    built: dict[str, gb.GemvBf16] = {}

    def launcher(name: str) -> gb.GemvBf16:
        if name not in built:
            v = get(name)
            cache.ensure_built(v, "sm_90a", tmp_path)
            m = Manifest.read(tmp_path / "sm_90a" / f"{name}.json")
            specs = [ParamSpec(p.name, p.kind, p.size, p.align, len(p.dyn_shape) if p.kind == "tensor" else 0,
                               len(p.dyn_stride)) for p in m.params]
            kernel = types.SimpleNamespace(name=name)
            built[name] = gb.GemvBf16(cache.LoadedKernel(v, m, kernel, ParamLayout(specs, name), 132))
        return built[name]

    real_gemv = EmulatedOps.gemv

    def gemv(self, fmt, epilogue, w, x, y, n, k, r=None, tiled=False, **kw):
        if fmt == "BF16":
            launcher(gb.variant_name(1, epilogue))(w, x, y, n, k, 1, r=r)
        real_gemv(self, fmt, epilogue, w, x, y, n, k, r, tiled, **kw)

    monkeypatch.setattr(launchers, "launch", lambda k, grid, block, params, smem, stream: launches.append(
        (k.name, tuple(grid))))
    monkeypatch.setattr(EmulatedOps, "gemv", gemv)
    ex = GpuExecutor(mixed_artifact, emulate=True, max_seqs=1, max_context=64, progress=False)
    s = ex.new_state()
    try:
        ex.step(5, s)
    finally:
        ex.release(s)
    c = ex.config
    q_width = c.n_heads * c.head_dim
    # attention layer: the fused query_key | gate_value (plain), output (residual); GDN layer 0: output (residual)
    assert sorted(launches) == sorted([("gemv_bf16_t1", (2 * (q_width + c.n_kv_heads * c.head_dim), 1, 1))]
                                      + [("gemv_bf16_t1_res", (c.hidden, 1, 1))] * 2), launches
