"""Which GEMVs leave their epilogue to the kernel after them (inferno/model/gpu/ops.py): the shape rules the
GPU and the emulator share, and the $INFERNO_DEFER switch."""

from inferno.kernels import gemv_mma_variants as M
from inferno.model.gpu.ops import DEFER_ENV, accumulates_inputs_shape, defers_residual_shape

Q4, Q5, Q6, W8 = "Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"


def test_residual_chains_need_tensor_core_writers_and_folding_readers(monkeypatch):
    monkeypatch.delenv(DEFER_ENV, raising=False)
    swiglu, inputs = [(Q4, "swiglu", True)], [(Q5, "plain", True), ("BF16", "plain", False)]
    assert defers_residual_shape(Q5, True, 6144, swiglu, 5120) and defers_residual_shape(Q5, True, 17408, inputs, 5120)
    assert not defers_residual_shape(Q5, False, 6144, swiglu, 5120)  # the row-split layout: no accumulate member
    assert not defers_residual_shape(W8, True, 6144, swiglu, 5120)
    assert not defers_residual_shape(Q5, True, 6144, [(W8, "plain", True)], 5120)
    assert not defers_residual_shape(Q5, True, 6144, [("BF16", "swiglu", False)], 5120)
    assert not defers_residual_shape(Q5, True, 6144, [], 5120)
    assert not defers_residual_shape(Q5, True, M.KMAX + 128, swiglu, 5120)
    assert not defers_residual_shape(Q5, True, 6144, swiglu, M.NORM_KMAX + 128)
    monkeypatch.setenv(DEFER_ENV, "0")
    assert not defers_residual_shape(Q5, True, 6144, swiglu, 5120)


def test_gdn_inputs_accumulate(monkeypatch):
    """Tiled Q4-Q6 stacks accumulate for gdn_conv_step_sums (every stream-K member takes a whole SM:
    test_kernels_gemv_mma.py::test_stream_k_members_fill_an_sm); W8, row-split and K past NORM_KMAX do not."""
    monkeypatch.delenv(DEFER_ENV, raising=False)
    assert all(accumulates_inputs_shape(f, True, 5120) for f in (Q4, Q5, Q6))
    assert not accumulates_inputs_shape(Q5, False, 5120) and not accumulates_inputs_shape(W8, True, 5120)
    assert not accumulates_inputs_shape(Q5, True, M.NORM_KMAX + 128)
    monkeypatch.setenv(DEFER_ENV, "0")
    assert not accumulates_inputs_shape(Q5, True, 5120)
