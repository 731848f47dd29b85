"""Benchmark-only (tools/bench_mlp_probe.py): an MLP's two stream-K GEMVs chained in one persistent launch,
each warp moving from gate_up to down on its own.

Phase A is the gate_up GEMV (swiglu, the RMSNorm folded into the x staging) writing act; phase B the down
GEMV (residual) reading act. Between them no grid or CTA barrier: a unit's finishing warp in phase A stores
its 16 act values and bumps the ready counter of act's 128-value slice it belongs to (`GemvMmaSK.signal`:
every lane's release fence, one relaxed count); a warp entering phase B waits (acquire polls) only for the
slices its own run of down reads, stages just those (`await_ready`: x per warp, from L2) and streams on.
The last CTA to leave resets the counters (one more word counts the CTAs out), so the next launch finds them
zero. Every CTA of the grid (one per SM) is resident at once, so a waiting warp never blocks a producer.
Results are those of the two launches (a GPU test compares them); the launch is a benchmark of the chain,
not yet an executor member.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute

from cute_kernels.gemv_mma_sk import GemvMmaSK, _count_acq_rel


class MlpChain:
    """gate_up (bits_a, swiglu, norm) then down (bits_b, residual), `warps` warps per CTA, one CTA per SM;
    `ready`: int32 [K_down / 128 + 1], zero before the first launch (the launch leaves it zero)."""

    def __init__(self, bits_a: int, bits_b: int, stages_a: int, stages_b: int, warps: int = 16,
                 kmax_a: int = 8192, kmax_b: int = 18432):
        self.a = GemvMmaSK(bits_a, 64, 1, "swiglu", warps=warps, stages=stages_a, ctas=1, kmax=kmax_a, cpa=True,
                           norm=True, signal=True)
        self.b = GemvMmaSK(bits_b, 64, 1, "residual", warps=warps, stages=stages_b, ctas=1, kmax=kmax_b, cpa=True,
                           await_ready=True)
        self.threads = 32 * warps

    @cute.jit
    def __call__(self, mWa: cute.Tensor, mX: cute.Tensor, mNw: cute.Tensor, eps, mAct: cute.Tensor,
                 mWb: cute.Tensor, mR: cute.Tensor, mY: cute.Tensor, mWsa: cute.Tensor, mWsb: cute.Tensor,
                 mReady: cute.Tensor, stream: cuda.CUstream):
        self.kernel(mWa, mX, mNw, eps, mAct, mWb, mR, mY, mWsa, mWsb, mReady).launch(
            grid=(132, 1, 1), block=(self.threads, 1, 1), stream=stream, min_blocks_per_mp=1,
            preferred_smem_carveout=-1)

    @cute.kernel
    def kernel(self, mWa: cute.Tensor, mX: cute.Tensor, mNw: cute.Tensor, eps, mAct: cute.Tensor,
               mWb: cute.Tensor, mR: cute.Tensor, mY: cute.Tensor, mWsa: cute.Tensor, mWsb: cute.Tensor,
               mReady: cute.Tensor):
        smem = cutlass.memory.SmemAllocator()
        ring = smem.allocate_tensor(cutlass.Int32, cute.make_layout((max(self.a.ring_bytes(), self.b.ring_bytes()) // 4,)),
                                    byte_alignment=16)
        self.a.body(mWa, mX, mR, mAct, mWsa, mNw, eps, smem, ring, mReady)
        self.b.body(mWb, mAct, mR, mY, mWsb, mNw, eps, smem, ring, mReady)
        # the last CTA out zeroes the counters (every other CTA is past its waits)
        cute.arch.sync_threads()
        tidx, _, _ = cute.arch.thread_idx()
        nctas, _, _ = cute.arch.grid_dim()
        if tidx == 0:
            n = cute.size(mReady, mode=[0])
            out = mReady.iterator.toint() + 4 * (n - 1)
            if _count_acq_rel(out, 1) == nctas - 1:
                for i in cutlass.range(n, unroll=1):
                    mReady[i] = 0
