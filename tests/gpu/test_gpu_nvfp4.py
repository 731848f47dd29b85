"""GpuExecutor on a tiny NVFP4 artifact (fusion plan "nvfp4") vs the numpy reference executor.

The decode path multiplies by the NVFP4 matrices with the tensor-core NVFP4 GEMV (gemv_mma_nvfp4_*,
the matrices in tile16-nvfp4-v1, the fused input projections one matrix a layer); prefill
dequantises them (dequant_nvfp4_tiled) for its GEMMs.
Self-diagnosing: a failing comparison prints the first mismatching step, then every layer's mixer
and residual-stream error vs the reference, for the GPU and for the numpy emulation of the same
launch sequence (GPU bad but emulation good: a kernel's numerics; both bad: the wiring), and the
NVFP4 GEMV alone on a layer's gate_up matrix vs numpy. A second artifact mixes NVFP4 and BF16
matrices the way the published qwen3.6-27b/nvfp4 does (BF16 attention input/output projections of
one layer, a BF16 GDN output): its BF16 matrices run on the bf16 GEMV (plain and residual).
"""

from __future__ import annotations

import numpy as np
import pytest

from inferno.artifact import model_source
from inferno.artifact.synth import synthesize_artifact
from inferno.model.gpu import GpuExecutor
from inferno.model.gpu.diagnose import layer_errors, report, rms_rel
from inferno.model.reference import ReferenceExecutor

LOGITS_RMS_REL = 0.03  # as tests/gpu/test_gpu_executor.py (emulation measures ~0.010 on this artifact)
NEAR_TIE = 0.1  # a greedy pick may differ from the reference's only where its logits are this close
STEPS = 32
MAX_CONTEXT = 512


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu-nvfp4") / "tiny-nvfp4.ninfer"
    synthesize_artifact("tiny-dense", path, weights_id="nvfp4")
    return path


@pytest.fixture(scope="module")
def reference(artifact):
    src = model_source(artifact)
    return ReferenceExecutor(src.config, src.weights)


@pytest.fixture(scope="module")
def graph_ex(artifact):
    ex = GpuExecutor(artifact, max_seqs=2, max_context=MAX_CONTEXT, cuda_graph=True, progress=False)
    yield ex
    ex.close()


def prompt_of(length: int, vocab: int) -> list[int]:
    return [(5 + 7 * i) % vocab for i in range(length)]


def gemv_check(ex: GpuExecutor) -> str:
    """The NVFP4 swiglu GEMV of layer 0 alone on the device vs numpy (decode of the uploaded payload)."""
    from ml_dtypes import bfloat16

    from inferno.artifact.formats import nvfp4
    from inferno.kernels.tiled import tiled_geometry, untile

    w = ex.weights["text/layers/0/mlp/gate_up"]
    n, k = w.shape
    x = (np.random.default_rng(1).standard_normal(k) * 0.5).astype(bfloat16)
    ws = ex.program.ws
    ex.ops.upload(ws["normed"], x)
    ex.ops.gemv("NVFP4", "swiglu", w.buf, ws["normed"], ws["act"], n, k, tiled=w.tiled)
    got = ex.ops.download(ws["act"], bfloat16, (n // 2,)).astype(np.float64)
    pay = ex.ops.download(w.buf, np.uint8, (tiled_geometry("NVFP4", n, k).nbytes if w.tiled else
                                            nvfp4.geometry((n, k)).nbytes,))
    if w.tiled:
        pay = untile("NVFP4", pay, n, k)
    y = nvfp4.decode(pay.tobytes(), (n, k)).astype(np.float64) @ x.astype(np.float64)
    g, u = y[: n // 2], y[n // 2:]
    want = g / (1 + np.exp(-g)) * u
    return f"NVFP4 swiglu GEMV alone (layer 0 gate_up {n}x{k}): rms rel error {rms_rel(got, want):.4f}"


def diagnose(artifact, ref: ReferenceExecutor, ex: GpuExecutor, tokens: list[int]) -> str:
    emu = GpuExecutor(artifact, max_seqs=1, max_context=len(tokens) + 1, emulate=True, progress=False)
    gpu = report(*layer_errors(ex, ref, tokens))
    emulated = report(*layer_errors(emu, ref, tokens))
    return (f"GPU vs reference at position {len(tokens) - 1}:\n{gpu}\nemulation vs reference:\n{emulated}\n"
            f"{gemv_check(ex)}")


def test_decode_uses_the_nvfp4_gemv(graph_ex):
    from inferno.model.gpu.residency import gemv_kinds

    kinds = gemv_kinds(graph_ex.plan.placements)
    # every NVFP4 matrix in tile16-nvfp4-v1, on the tensor-core GEMV
    assert {("NVFP4", "plain", True), ("NVFP4", "residual", True), ("NVFP4", "swiglu", True)} <= kinds, kinds
    assert {"gemv_mma_nvfp4_t1", "gemv_mma_nvfp4_t1_res", "gemv_mma_nvfp4_t1_swiglu"} <= set(graph_ex.ops._gemv), \
        sorted(graph_ex.ops._gemv)


def run_greedy(artifact, ref: ReferenceExecutor, ex: GpuExecutor, length: int) -> None:
    """32 free-running greedy steps; every pick must be the reference's argmax on the same sequence
    (or a near-tie there), and the logits within the bf16 bound."""
    tokens = prompt_of(length, ex.config.vocab)
    rs, gs = ref.new_state(), ex.new_state()
    problems: list[str] = []
    exact = 0
    try:
        lr, lg = ref.prefill(tokens, rs), ex.prefill(tokens, gs)
        for step in range(STEPS):
            err = rms_rel(lg, lr)
            got, want = int(lg.argmax()), int(lr.argmax())
            exact += got == want
            if err > LOGITS_RMS_REL:
                problems.append(f"step {step}: logits rms rel error {err:.4f} > {LOGITS_RMS_REL} "
                                f"(max abs {np.abs(lg - lr).max():.4f})")
            if got != want and lr[want] - lr[got] > NEAR_TIE:
                problems.append(f"step {step}: GPU picked {got}, reference {want} (reference margin "
                                f"{lr[want] - lr[got]:.3f})")
            if problems:
                break
            tokens.append(got)
            lr, lg = ref.step(got, rs), ex.step(got, gs)
    finally:
        ex.release(gs)
    print(f"prompt {length}: {exact}/{STEPS} greedy picks identical to the reference's")
    if problems:
        pytest.fail(f"first mismatch: {problems[0]}\n" + diagnose(artifact, ref, ex, tokens))


@pytest.mark.parametrize("length", [10, 100])
def test_greedy_tokens_match_reference(artifact, reference, graph_ex, length):
    run_greedy(artifact, reference, graph_ex, length)


def test_graph_equals_eager(artifact, graph_ex):
    eager = GpuExecutor(artifact, max_seqs=1, max_context=MAX_CONTEXT, cuda_graph=False, progress=False)
    tokens = prompt_of(40, graph_ex.config.vocab)
    out = []
    try:
        for ex in (graph_ex, eager):
            s = ex.new_state()
            try:
                logits = [ex.prefill(tokens, s)]
                for _ in range(8):
                    logits.append(ex.step(int(logits[-1].argmax()), s))
            finally:
                ex.release(s)
            out.append(np.stack(logits))
    finally:
        eager.close()
    diff = np.abs(out[0] - out[1]).max(axis=1)
    assert not (diff > 0).any(), f"graph and eager logits differ first at step {int(np.argmax(diff > 0))}"


@pytest.fixture(scope="module")
def mixed_artifact(tmp_path_factory):
    """The tiny nvfp4 identity with the 27B's kind of BF16 exceptions, through the identity's own
    rule (`nvfp4_dense`): the first attention layer's input projections and output, and GDN layer
    0's output, stay BF16. Registered for the module (synth and open both check it)."""
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
        path = tmp_path_factory.mktemp("gpu-nvfp4-mixed") / "tiny-nvfp4-mixed.ninfer"
        synthesize_artifact("tiny-dense", path, weights_id="nvfp4")
        yield path


def test_mixed_bf16_nvfp4_greedy_matches_reference(mixed_artifact):
    """32 greedy steps on the mixed artifact; the BF16 matrices go through gemv_bf16_t1[_res]."""
    src = model_source(mixed_artifact)
    ref = ReferenceExecutor(src.config, src.weights)
    ex = GpuExecutor(mixed_artifact, max_seqs=1, max_context=MAX_CONTEXT, cuda_graph=True, progress=False)
    try:
        from inferno.model.gpu.residency import gemv_kinds

        kinds = gemv_kinds(ex.plan.placements)
        assert {("BF16", "plain", False), ("BF16", "residual", False), ("NVFP4", "swiglu", True)} <= kinds, kinds
        assert "gemv_bf16_t1_res" in ex.ops._gemv, sorted(ex.ops._gemv)  # plain ones: `_n` where the norm folds
        assert {"gemv_bf16_t1", "gemv_bf16_t1_n"} & set(ex.ops._gemv), sorted(ex.ops._gemv)
        for length in (10, 100):
            run_greedy(mixed_artifact, ref, ex, length)
    finally:
        ex.close()
