"""GpuExecutor on the tiny dense artifact with every groupwise-int decode matrix in tile16-v1
(INFERNO_TILED=all: tensor-core GEMVs, prefill's `dequant_*_tiled`) against the same artifact in
"head" mode (only the output head tiled) and the numpy reference (needs a GPU).

Prefill is dequant + the same bf16 GEMMs in both modes, and the tiled dequant is exact, so the
prefill logits must be equal bit for bit; decode steps differ only by the GEMV's summation order
(tensor-core vs CUDA-core), so they are compared within the bf16 bound, fed the same tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

from inferno.artifact import model_source
from inferno.artifact.convert import convert
from inferno.checkpoint.synth import synthesize
from inferno.kernels.gemv_variants import FORMATS
from inferno.model.gpu import GpuExecutor
from inferno.model.gpu.diagnose import rms_rel
from inferno.model.gpu.prefill import prefill_formats
from inferno.model.gpu.residency import TILED, TILING_ENV, gemv_epilogue
from inferno.model.reference import ReferenceExecutor

LOGITS_RMS_REL = 0.03  # vs the fp32 reference, as tests/gpu/test_gpu_executor.py
MODES_RMS_REL = 0.02  # "all" vs "head": both bf16 launch sequences, GEMV summation order only
NEAR_TIE = 0.1
STEPS = 32


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-tiled")
    return convert(synthesize("tiny-dense", root / "ckpt"), root / "tiny.ninfer", "groupwise-int", progress=False)


@pytest.fixture(scope="module")
def reference(artifact):
    src = model_source(artifact)
    return ReferenceExecutor(src.config, src.weights)


def _executor(artifact, mode: str, graph: bool) -> GpuExecutor:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(TILING_ENV, mode)
        return GpuExecutor(artifact, max_seqs=2, max_context=2048, cuda_graph=graph, progress=False)


@pytest.fixture(scope="module", params=[True, False], ids=["graph", "eager"])
def pair(artifact, request):
    head, every = _executor(artifact, "head", request.param), _executor(artifact, "all", request.param)
    yield head, every
    head.close()
    every.close()


def test_all_mode_tiles_every_decode_matrix(pair):
    _, every = pair
    gemv = [p for p in every.plan.placements if p.fmt in FORMATS and gemv_epilogue(p.name) is not None]
    assert gemv and all(p.stored == TILED for p in gemv)
    assert all(every.weights[p.name].tiled for p in gemv)
    assert prefill_formats(every.plan) and all(tiled for _, tiled in prefill_formats(every.plan))


@pytest.mark.parametrize("length", [10, 100, 1100])  # one KV page; across pages; longer than a 1024-token chunk
def test_all_mode_matches_head_mode(pair, reference, length):
    head, every = pair
    tokens = [(5 + 7 * i) % head.config.vocab for i in range(length)]
    sh, sa, rs = head.new_state(), every.new_state(), reference.new_state()
    problems: list[str] = []
    try:
        lh, la, lr = head.prefill(tokens, sh), every.prefill(tokens, sa), reference.prefill(tokens, rs)
        if not np.array_equal(la, lh):
            problems.append(f"prefill logits differ (max abs {np.abs(la - lh).max():.3g}): the tiled dequant "
                            "is not exact")
        for step in range(STEPS):
            if problems:
                break
            err, ref_err = rms_rel(la, lh), rms_rel(la, lr)
            got, want = int(la.argmax()), int(lh.argmax())
            if err > MODES_RMS_REL:
                problems.append(f"step {step}: all vs head logits rms rel {err:.4f} > {MODES_RMS_REL}")
            if ref_err > LOGITS_RMS_REL:
                problems.append(f"step {step}: all vs reference logits rms rel {ref_err:.4f} > {LOGITS_RMS_REL}")
            if got != want and lh[want] - lh[got] > NEAR_TIE:
                problems.append(f"step {step}: all picked {got}, head {want} (margin {lh[want] - lh[got]:.3f})")
            lh, la, lr = head.step(want, sh), every.step(want, sa), reference.step(want, rs)
    finally:
        head.release(sh)
        every.release(sa)
    assert not problems, problems[0]
