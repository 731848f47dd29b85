"""Benchmark-only (tools/bench_stage_probe.py): how long every CTA of a decode GEMV takes to stage x.

A stream-K GEMV's CTAs (one per SM) all read the same x (10-34 KB, just written, in L2) right after
`griddepcontrol.wait`. This probe does only that: each thread issues all its 16-byte loads of x first,
sums them, then the CTA synchronises. With `replicas` R > 1 the CTA reads copy (CTA % R) of x, R copies
`stride` bytes apart: if 132 SMs reading the same L2 lines is what makes staging slow, R = 132 is faster.
With `ring` each warp first issues 2 stages of 2 KB cp.async weight loads from w (as the members do before
the wait), so DRAM requests are in flight while x is staged. Thread 0 of each CTA writes the nanoseconds
from the wait to the end of its staging barrier into out[CTA].
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute

from cute_kernels.gemv_mma import _ldx
from cute_kernels.gemv_mma_sk import _cp_async, _now

THREADS = 512
RING = 2048  # bytes a warp copies per ring stage


class StageProbe:
    """Stage nbytes of x (copy CTA % replicas) per CTA; grid = one CTA per SM."""

    def __init__(self, nbytes: int = 34816, replicas: int = 1, stride: int = 36864, ring: bool = False):
        if nbytes % 16 or stride % 16 or stride < nbytes:
            raise ValueError("nbytes and stride: multiples of 16, stride >= nbytes")
        self.nbytes, self.replicas, self.stride, self.ring = nbytes, replicas, stride, ring

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mOut: cute.Tensor, stream: cuda.CUstream):
        self.kernel(mX, mW, mOut).launch(grid=(132, 1, 1), block=(THREADS, 1, 1), stream=stream,
                                         min_blocks_per_mp=1, preferred_smem_carveout=-1)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mOut: cute.Tensor):
        smem = cutlass.memory.SmemAllocator()
        ring = smem.allocate_tensor(cutlass.Int32, cute.make_layout((THREADS // 32 * 2 * RING // 4,)),
                                    byte_alignment=16)
        sink = smem.allocate_tensor(cutlass.Int32, cute.make_layout((THREADS,)), byte_alignment=16)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane, warp = tidx % 32, tidx // 32
        if cutlass.const_expr(self.ring):  # the members' ring prologue: DRAM loads in flight during staging
            wb = mW.iterator.toint() + cutlass.Int64(bidx * (THREADS // 32) + warp) * (2 * RING)
            r0 = ring.iterator.toint() + warp * (2 * RING)
            for q in cutlass.range_constexpr(8):
                _cp_async(r0 + 512 * q + 16 * lane, wb + 512 * q + 16 * lane, 16)
            cute.arch.cp_async_commit_group()
        cute.arch.griddepcontrol_wait()
        t0 = _now()
        n16 = self.nbytes // 16
        base = mX.iterator.toint() + cutlass.Int64(bidx % self.replicas) * self.stride
        rounds = (n16 + THREADS - 1) // THREADS
        acc = cutlass.Int32(0)
        vals = []
        for i in cutlass.range_constexpr(rounds):
            idx = cutlass.min(tidx + THREADS * i, n16 - 1)
            vals.append(_ldx(base + cutlass.Int64(idx) * 16))
        for v in vals:
            acc = acc + (v[0] ^ v[1]) + (v[2] ^ v[3])
        sink[tidx] = acc  # the barrier below then waits for every load
        cute.arch.sync_threads()
        t1 = _now()
        cute.arch.griddepcontrol_launch_dependents()
        if cutlass.const_expr(self.ring):
            cute.arch.cp_async_wait_group(0)
        if tidx == 0:
            mOut[bidx] = cutlass.Int32(t1 - t0)
        if sink[(tidx + 1) % THREADS] == 0x7FFFFFFF:
            mOut[132 + bidx * THREADS + tidx] = acc
