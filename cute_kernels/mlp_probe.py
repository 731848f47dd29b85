"""Benchmark-only (tools/bench_mlp_probe.py): an MLP's two stream-K GEMVs in one persistent launch.

Phase A is the gate_up GEMV (swiglu, the RMSNorm folded into the x staging) writing act, phase B the down
GEMV (residual) reading act; each is `GemvMmaSK.body` with its own x staging and workspace, the cp.async
ring shared, one CTA per SM (every CTA of the grid resident at once). `mode`:

* "nosync": NO synchronisation between the phases: a CTA stages act for phase B (after all its warps are
  done with phase A) whether or not the other CTAs have written it, so phase B's results are wrong. The
  time of the pair as two launches minus this one bounds what removing the kernel boundary can save.
* "nosync_ws": the same with each warp staging only its own run's part of act (`GemvMmaSK.wstage`) and
  starting down as soon as its own gate_up run is done: the bound for warps moving on one by one.
* "chain": correct results with no grid or CTA barrier. A unit's finishing warp in phase A stores its 16
  act values and bumps the ready counter of act's 128-value slice (`GemvMmaSK.signal`: every lane's release
  fence, one relaxed count); a warp entering phase B waits (acquire polls) only for the slices its own run
  reads, stages just those from L2 and streams on (`await_ready`). The last CTA out zeroes the counters.

`ready` (every mode takes it; "chain" uses it): int32 [ceil(K_down / 128) + 1], zero before the first launch.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute

from cute_kernels.gemv_mma_sk import GemvMmaSK, _count

MODES = ("nosync", "nosync_ws", "chain")


class MlpProbe:
    """gate_up (bits_a, swiglu, norm) then down (bits_b, residual), `warps` warps per CTA, one CTA per SM."""

    def __init__(self, bits_a: int, bits_b: int, stages_a: int, stages_b: int, warps: int = 16,
                 kmax_a: int = 8192, kmax_b: int = 18432, mode: str = "nosync"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        chain = mode == "chain"
        self.chain = chain
        self.a = GemvMmaSK(bits_a, 64, 1, "swiglu", warps=warps, stages=stages_a, ctas=1, kmax=kmax_a, cpa=True,
                           norm=True, signal=chain)
        self.b = GemvMmaSK(bits_b, 64, 1, "residual", warps=warps, stages=stages_b, ctas=1, kmax=kmax_b, cpa=True,
                           wstage=mode == "nosync_ws", await_ready=chain)
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
        ready = mReady if self.chain else None
        self.a.body(mWa, mX, mR, mAct, mWsa, mNw, eps, smem, ring, ready)
        self.b.body(mWb, mAct, mR, mY, mWsb, mNw, eps, smem, ring, ready)
        if cutlass.const_expr(self.chain):  # the last CTA out zeroes the counters (every other CTA is past its waits)
            cute.arch.sync_threads()
            tidx, _, _ = cute.arch.thread_idx()
            nctas, _, _ = cute.arch.grid_dim()
            if tidx == 0:
                n = cute.size(mReady, mode=[0])
                if _count(mReady.iterator.toint() + 4 * (n - 1), 1, "acq_rel") == nctas - 1:
                    for i in cutlass.range(n, unroll=1):
                        mReady[i] = 0
