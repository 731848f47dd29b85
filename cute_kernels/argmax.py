"""Greedy sampling: the index of the largest of N bf16 logits (the first one on ties).

One cluster of CTAS CTAs of `threads` threads. CTA r scans the r-th contiguous run of 16-byte
chunks (8 logits each); thread t takes chunks t, t + threads, ... of that run, UNROLL loads in
flight, keeping its best (value, index) with a strict `>` (indices only grow, so it keeps the first
of equal values). Warps reduce with butterfly shuffles, preferring the larger value and, on equal
values, the smaller index; warp 0 reduces the warps' winners from shared memory, and thread 0 of
every CTA stores its CTA's winner into CTA 0's shared memory (DSMEM); after a cluster barrier warp 0
of CTA 0 reduces the CTAS winners the same way. out[0] = the index (int32). N must be a multiple
of 8. NaN logits are never picked.

Spreading the read over CTAS SMs (a cluster: one launch, no global workspace, no atomics) is what
makes it fast: one SM alone reads a 500 KB logits row at a fraction of the memory bandwidth.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

VEC = 8  # bf16 per 16-byte load
CTAS = 8  # CTAs of the cluster (the portable maximum)
UNROLL = 4  # chunk loads each thread keeps in flight


def _better(v, i, ov, oi):
    """Whether candidate (ov, oi) beats (v, i): larger value, or equal value with smaller index."""
    return (ov > v) | ((ov == v) & (oi < i))


@dsl_user_op
def _st_cluster(addr, rank, val, *, loc=None, ip=None):
    """st.shared::cluster of one 32-bit value at local smem address `addr` mapped into CTA `rank`."""
    ptx, reg = ("f32", "f") if isinstance(val, cutlass.Float32) else ("b32", "r")
    operands = [cutlass.Int32(addr).ir_value(loc=loc, ip=ip), cutlass.Int32(rank).ir_value(loc=loc, ip=ip),
                val.ir_value(loc=loc, ip=ip)]
    asm = f"{{\n\t.reg .b32 ra;\n\tmapa.shared::cluster.u32 ra, $0, $1;\n\tst.shared::cluster.{ptx} [ra], $2;\n\t}}"
    llvm.inline_asm(None, operands, asm, f"r,r,{reg}", has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


@cute.jit
def _warp_best(v: cutlass.Float32, i: cutlass.Int32):
    """The warp's best (value, index) in every lane (butterfly shuffles)."""
    for k in range(5):  # unrolled at trace time
        ov = cute.arch.shuffle_sync_bfly(v, offset=1 << k)
        oi = cute.arch.shuffle_sync_bfly(i, offset=1 << k)
        if _better(v, i, ov, oi):
            v = ov
            i = oi
    return v, i


class Argmax:
    """out[0] = argmax(x) over bf16 x [N] (first index of the maximum); grid (CTAS,), cluster (CTAS,)."""

    def __init__(self, threads: int = 1024):
        if threads % 32 or not 32 <= threads <= 1024:
            raise ValueError("threads must be whole warps, 32..1024")
        self.threads = threads
        self.warps = threads // 32

    @cute.jit
    def __call__(self, mX: cute.Tensor, mOut: cute.Tensor, stream: cuda.CUstream):
        self.kernel(mX, mOut).launch(grid=(CTAS, 1, 1), block=(self.threads, 1, 1), cluster=(CTAS, 1, 1),
                                     stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mOut: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        rank, _, _ = cute.arch.block_idx()  # the grid is one cluster: block index = rank in it
        cute.arch.cluster_arrive_relaxed()  # paired with the wait before the DSMEM stores
        cute.arch.griddepcontrol_wait()  # PDL: launched early, wait here for the previous kernel
        cute.arch.griddepcontrol_launch_dependents()
        warp = tidx // 32
        lane = tidx % 32
        chunks = cute.size(mX, mode=[0]) // VEC
        per = (chunks + CTAS - 1) // CTAS
        begin = rank * per
        end = cutlass.min(begin + per, chunks)
        gX = cute.zipped_divide(mX, (VEC,))

        best = cutlass.Float32(-cutlass.Float32.inf)
        best_i = cutlass.Int32(0)
        rX = [cute.make_rmem_tensor((VEC,), cutlass.BFloat16) for _ in range(UNROLL)]
        for c0 in cutlass.range(begin + tidx, end, self.threads * UNROLL):
            for u in cutlass.range_constexpr(UNROLL):  # the loads first, so UNROLL are in flight
                if c0 + u * self.threads < end:
                    cute.autovec_copy(gX[None, c0 + u * self.threads], rX[u])
            for u in cutlass.range_constexpr(UNROLL):
                c = c0 + u * self.threads
                if c < end:
                    for j in cutlass.range_constexpr(VEC):
                        v = rX[u][j].to(cutlass.Float32)
                        if v > best:
                            best = v
                            best_i = c * VEC + j

        best, best_i = _warp_best(best, best_i)
        smem = cutlass.memory.SmemAllocator()
        sV = smem.allocate_tensor(cutlass.Float32, cute.make_layout((32,)), byte_alignment=16)
        sI = smem.allocate_tensor(cutlass.Int32, cute.make_layout((32,)), byte_alignment=16)
        sCV = smem.allocate_tensor(cutlass.Float32, cute.make_layout((CTAS,)), byte_alignment=16)
        sCI = smem.allocate_tensor(cutlass.Int32, cute.make_layout((CTAS,)), byte_alignment=16)
        if lane == 0:
            sV[warp] = best
            sI[warp] = best_i
        cute.arch.sync_threads()
        if warp == 0:
            v = cutlass.Float32(-cutlass.Float32.inf)
            i = cutlass.Int32(0)
            if lane < self.warps:
                v = sV[lane]
                i = sI[lane]
            best, best_i = _warp_best(v, i)
        cute.arch.cluster_wait()  # every CTA of the cluster has started: CTA 0's smem may be written
        if tidx == 0:
            _st_cluster((sCV.iterator + rank).toint(), 0, best)
            _st_cluster((sCI.iterator + rank).toint(), 0, best_i)
        cute.arch.cluster_arrive()  # release: the stores above are seen by CTA 0 after its wait
        cute.arch.cluster_wait()
        if rank == 0:
            if warp == 0:
                v = cutlass.Float32(-cutlass.Float32.inf)
                i = cutlass.Int32(0)
                if lane < CTAS:
                    v = sCV[lane]
                    i = sCI[lane]
                v, i = _warp_best(v, i)
                if lane == 0:
                    mOut[0] = i
