"""Greedy sampling: the index of the largest of N bf16 logits (the first one on ties).

One CTA of `threads` threads. Thread t scans 16-byte chunks t, t + threads, ... (8 logits each)
keeping its best (value, index) with a strict `>` (indices only grow, so it keeps the first of
equal values); warps then reduce with butterfly shuffles, preferring the larger value and, on
equal values, the smaller index, and warp 0 reduces the warps' winners from shared memory.
out[0] = the index (int32). N must be a multiple of 8. NaN logits are never picked.

A decode step's logits are at most a few hundred KiB, so one CTA reading them once is a few
microseconds; what it saves is the copy of the whole logits row to the host for greedy decode.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute

VEC = 8  # bf16 per 16-byte load


def _better(v, i, ov, oi):
    """Whether candidate (ov, oi) beats (v, i): larger value, or equal value with smaller index."""
    return (ov > v) | ((ov == v) & (oi < i))


class Argmax:
    """out[0] = argmax(x) over bf16 x [N] (first index of the maximum)."""

    def __init__(self, threads: int = 1024):
        if threads % 32 or not 32 <= threads <= 1024:
            raise ValueError("threads must be whole warps, 32..1024")
        self.threads = threads
        self.warps = threads // 32

    @cute.jit
    def __call__(self, mX: cute.Tensor, mOut: cute.Tensor, stream: cuda.CUstream):
        self.kernel(mX, mOut).launch(grid=(1, 1, 1), block=(self.threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mOut: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        cute.arch.griddepcontrol_wait()  # PDL: launched early, wait here for the previous kernel
        cute.arch.griddepcontrol_launch_dependents()
        warp = tidx // 32
        lane = tidx % 32
        chunks = cute.size(mX, mode=[0]) // VEC
        gX = cute.zipped_divide(mX, (VEC,))

        best = cutlass.Float32(-cutlass.Float32.inf)
        best_i = cutlass.Int32(0)
        rX = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
        for c in cutlass.range(tidx, chunks, self.threads):
            cute.autovec_copy(gX[None, c], rX)
            for j in cutlass.range_constexpr(VEC):
                v = rX[j].to(cutlass.Float32)
                if v > best:
                    best = v
                    best_i = c * VEC + j

        for k in range(5):  # unrolled at trace time
            ov = cute.arch.shuffle_sync_bfly(best, offset=1 << k)
            oi = cute.arch.shuffle_sync_bfly(best_i, offset=1 << k)
            if _better(best, best_i, ov, oi):
                best = ov
                best_i = oi

        smem = cutlass.memory.SmemAllocator()
        sV = smem.allocate_tensor(cutlass.Float32, cute.make_layout((32,)), byte_alignment=16)
        sI = smem.allocate_tensor(cutlass.Int32, cute.make_layout((32,)), byte_alignment=16)
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
            for k in range(5):
                ov = cute.arch.shuffle_sync_bfly(v, offset=1 << k)
                oi = cute.arch.shuffle_sync_bfly(i, offset=1 << k)
                if _better(v, i, ov, oi):
                    v = ov
                    i = oi
            if lane == 0:
                mOut[0] = i
