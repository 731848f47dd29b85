"""Benchmark-only timing probe (tools/bench_mlp_probe.py): an MLP's two stream-K GEMVs in one persistent
launch with nothing between them.

Phase A is the gate_up GEMV (swiglu, the RMSNorm folded into the x staging) writing act, phase B the down
GEMV (residual) reading act; each is `GemvMmaSK.body` with its own x staging and workspace, the cp.async
ring shared. There is NO synchronisation between the phases: a CTA stages act for phase B whether or not
the other CTAs have written it, so phase B's results are wrong. What the probe measures is the upper
bound of removing the kernel boundary between the two GEMVs (the flush chain, the grid's completion and
the next launch): the time of the pair as two launches minus this one.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute

from cute_kernels.gemv_mma_sk import GemvMmaSK


class MlpProbe:
    """gate_up (bits_a, swiglu, norm) then down (bits_b, residual), `warps` warps per CTA, one CTA per SM."""

    def __init__(self, bits_a: int, bits_b: int, stages_a: int, stages_b: int, warps: int = 16,
                 kmax_a: int = 8192, kmax_b: int = 18432):
        self.a = GemvMmaSK(bits_a, 64, 1, "swiglu", warps=warps, stages=stages_a, ctas=1, kmax=kmax_a, cpa=True,
                           norm=True)
        self.b = GemvMmaSK(bits_b, 64, 1, "residual", warps=warps, stages=stages_b, ctas=1, kmax=kmax_b, cpa=True)
        self.threads = 32 * warps

    @cute.jit
    def __call__(self, mWa: cute.Tensor, mX: cute.Tensor, mNw: cute.Tensor, eps, mAct: cute.Tensor,
                 mWb: cute.Tensor, mR: cute.Tensor, mY: cute.Tensor, mWsa: cute.Tensor, mWsb: cute.Tensor,
                 stream: cuda.CUstream):
        self.kernel(mWa, mX, mNw, eps, mAct, mWb, mR, mY, mWsa, mWsb).launch(
            grid=(132, 1, 1), block=(self.threads, 1, 1), stream=stream, min_blocks_per_mp=1,
            preferred_smem_carveout=-1)

    @cute.kernel
    def kernel(self, mWa: cute.Tensor, mX: cute.Tensor, mNw: cute.Tensor, eps, mAct: cute.Tensor,
               mWb: cute.Tensor, mR: cute.Tensor, mY: cute.Tensor, mWsa: cute.Tensor, mWsb: cute.Tensor):
        smem = cutlass.memory.SmemAllocator()
        ring = smem.allocate_tensor(cutlass.Int32, cute.make_layout((max(self.a.ring_bytes(), self.b.ring_bytes()) // 4,)),
                                    byte_alignment=16)
        self.a.body(mWa, mX, mR, mAct, mWsa, mNw, eps, smem, ring)
        self.b.body(mWb, mAct, mR, mY, mWsb, mNw, eps, smem, ring)
