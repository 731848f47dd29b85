"""The RMSNorms folded into the decode GEMVs (`Ops.folds_norm`, the `_n` kernels) on the emulated
GPU executor: the same logits bit for bit as separate norm launches, one launch fewer per folded norm."""

import numpy as np
import pytest

from inferno.model.gpu.executor import GpuExecutor
from inferno.model.gpu.ops import FOLD_NORM_ENV
from model_fixtures import tiny_groupwise_artifact


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return tiny_groupwise_artifact(tmp_path_factory.mktemp("norm-fold"))


def _executor(artifact, fold: bool) -> GpuExecutor:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(FOLD_NORM_ENV, "1" if fold else "0")
        return GpuExecutor(artifact, emulate=True, max_seqs=1, max_context=128, progress=False, prefill_chunk=64)


def _step(ex, token, state):
    """(logits, launches, rmsnorm launches) of one decode step."""
    ops, calls = ex.ops, []
    real = ops.rmsnorm

    def rmsnorm(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    ops.rmsnorm = rmsnorm
    before = ops.launches
    try:
        logits = ex.step(token, state)
    finally:
        del ops.rmsnorm
    return logits, ops.launches - before, len(calls)


def test_folded_norms_match_separate_norms(artifact):
    folded, separate = _executor(artifact, True), _executor(artifact, False)
    c = folded.config
    tokens = [(3 + 5 * i) % c.vocab for i in range(20)]
    sf, ss = folded.new_state(), separate.new_state()
    try:
        lf, ls = folded.prefill(tokens, sf), separate.prefill(tokens, ss)
        for step in range(3):
            np.testing.assert_array_equal(lf, ls, err_msg=f"step {step} (0 = prefill)")
            t = int(ls.argmax())
            (lf, nf, normf), (ls, ns, norms) = _step(folded, t, sf), _step(separate, t, ss)
        np.testing.assert_array_equal(lf, ls)
        assert norms == 2 * c.n_layers + 1  # input, post-attention per layer, final
        assert normf == 1  # the final norm (the prefill writes it for the head too)
        assert ns - nf == norms - normf
    finally:
        folded.release(sf)
        separate.release(ss)
        folded.close()
        separate.close()
