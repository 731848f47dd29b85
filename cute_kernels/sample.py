"""Sampling on the device: top-k (k <= K_MAX) candidates, then temperature / top-p / min-p / draw.

Two kernels, launched back to back:

SampleTopK  grid (cdiv(N, SLICE),), THREADS threads. CTA b loads logits [b*SLICE, (b+1)*SLICE)
            (bf16, 16-byte chunks), applies the penalties on the fly in numpy's fp32 rounding
            (x -= presence + frequency * count where count > 0; NaN -> -inf), bitonic-sorts the
            slice in shared memory by (value descending, id ascending) and writes its first K_MAX
            (value, id) pairs to part_v / part_i [b*K_MAX ...]. Slots past N sort last.
SamplePick  one CTA: loads the P = grid * K_MAX partial pairs (P <= SLICE), sorts them the same
            way, and thread 0 runs the host `Sampler`'s arithmetic over the first top_k:
            w = exp((x - x_max) * inv_t) (fp32), normalised by an fp64 sum; top-p keeps the
            shortest prefix whose fp64 cumulative mass reaches top_p * total; min-p keeps
            w >= min_p * w_max; the draw is the first i whose fp64 cumulative sum exceeds
            u * total (clamped to the last kept). out[0] = the id; counts[id] += 1.

Greedy is top_k = 1. Ties go to the lower id everywhere.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute

VEC = 8  # bf16 per 16-byte load
K_MAX = 64  # candidates each slice contributes (the largest top_k on the device)
SLICE = 4096  # logits per SampleTopK CTA; also the most partial pairs SamplePick sorts
THREADS = 512
LOG_SLICE = SLICE.bit_length() - 1
PAD_ID = 0x7FFFFFFF  # id of padding slots: loses every tie


def _before(va, ia, vb, ib):
    """Whether (va, ia) sorts before (vb, ib): larger value, or equal value with smaller id."""
    return (va > vb) | ((va == vb) & (ia < ib))


@cute.jit
def _bitonic_sort(sV: cute.Tensor, sI: cute.Tensor, tidx: cutlass.Int32):
    """Sort SLICE (value, id) pairs in shared memory, best first; all THREADS threads take part."""
    for lg in cutlass.range_constexpr(1, LOG_SLICE + 1):
        size = 1 << lg
        for ls in cutlass.range_constexpr(lg):
            stride = size >> (ls + 1)
            for r in cutlass.range_constexpr(SLICE // 2 // THREADS):
                p = tidx + r * THREADS
                i = (p // stride) * (2 * stride) + p % stride
                j = i + stride
                va = sV[i]
                ia = sI[i]
                vb = sV[j]
                ib = sI[j]
                if (i & size) == 0:  # this run sorts best first
                    if _before(vb, ib, va, ia):
                        sV[i] = vb
                        sI[i] = ib
                        sV[j] = va
                        sI[j] = ia
                else:
                    if _before(va, ia, vb, ib):
                        sV[i] = vb
                        sI[i] = ib
                        sV[j] = va
                        sI[j] = ia
            cute.arch.sync_threads()


def _sort_buffers():
    smem = cutlass.memory.SmemAllocator()
    sV = smem.allocate_tensor(cutlass.Float32, cute.make_layout((SLICE,)), byte_alignment=16)
    sI = smem.allocate_tensor(cutlass.Int32, cute.make_layout((SLICE,)), byte_alignment=16)
    return smem, sV, sI


class SampleTopK:
    """Per-slice top-K_MAX of the penalised bf16 logits x [N] (N a multiple of 8)."""

    @cute.jit
    def __call__(self, mX: cute.Tensor, mCounts: cute.Tensor, mPV: cute.Tensor, mPI: cute.Tensor,
                 presence: cutlass.Float32, frequency: cutlass.Float32, stream: cuda.CUstream):
        slices = (cute.size(mX, mode=[0]) + SLICE - 1) // SLICE
        self.kernel(mX, mCounts, mPV, mPI, presence, frequency).launch(
            grid=(slices, 1, 1), block=(THREADS, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mCounts: cute.Tensor, mPV: cute.Tensor, mPI: cute.Tensor,
               presence: cutlass.Float32, frequency: cutlass.Float32):
        tidx, _, _ = cute.arch.thread_idx()
        cute.arch.griddepcontrol_wait()  # PDL: launched early, wait here for the previous kernel
        cute.arch.griddepcontrol_launch_dependents()
        bidx, _, _ = cute.arch.block_idx()
        chunks = cute.size(mX, mode=[0]) // VEC
        gX = cute.zipped_divide(mX, (VEC,))
        _, sV, sI = _sort_buffers()
        rX = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
        for r in cutlass.range_constexpr(SLICE // VEC // THREADS):
            t = tidx + r * THREADS  # chunk within the slice
            c = bidx * (SLICE // VEC) + t
            if c < chunks:
                cute.autovec_copy(gX[None, c], rX)
                for j in cutlass.range_constexpr(VEC):
                    v = rX[j].to(cutlass.Float32)
                    n = mCounts[c * VEC + j]
                    if n > 0:  # the product rounded once to fp32 (in fp64, so it is not fused into an FMA)
                        f = (frequency.to(cutlass.Float64) * n.to(cutlass.Float64)).to(cutlass.Float32)
                        v = v - (presence + f)
                    if v != v:
                        v = cutlass.Float32(-cutlass.Float32.inf)
                    sV[t * VEC + j] = v
                    sI[t * VEC + j] = c * VEC + j
            else:
                for j in cutlass.range_constexpr(VEC):
                    sV[t * VEC + j] = cutlass.Float32(-cutlass.Float32.inf)
                    sI[t * VEC + j] = cutlass.Int32(PAD_ID)
        cute.arch.sync_threads()
        _bitonic_sort(sV, sI, tidx)
        if tidx < K_MAX:
            mPV[bidx * K_MAX + tidx] = sV[tidx]
            mPI[bidx * K_MAX + tidx] = sI[tidx]


class SamplePick:
    """Merge the partial top-K_MAX lists part_v / part_i [P] and draw one token with u."""

    @cute.jit
    def __call__(self, mPV: cute.Tensor, mPI: cute.Tensor, mCounts: cute.Tensor, mOut: cute.Tensor,
                 top_k: cutlass.Int32, inv_t: cutlass.Float32, top_p: cutlass.Float32,
                 min_p: cutlass.Float32, u: cutlass.Float32, stream: cuda.CUstream):
        self.kernel(mPV, mPI, mCounts, mOut, top_k, inv_t, top_p, min_p, u).launch(
            grid=(1, 1, 1), block=(THREADS, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mPV: cute.Tensor, mPI: cute.Tensor, mCounts: cute.Tensor, mOut: cute.Tensor,
               top_k: cutlass.Int32, inv_t: cutlass.Float32, top_p: cutlass.Float32,
               min_p: cutlass.Float32, u: cutlass.Float32):
        tidx, _, _ = cute.arch.thread_idx()
        cute.arch.griddepcontrol_wait()  # PDL: launched early, wait here for the previous kernel
        cute.arch.griddepcontrol_launch_dependents()
        total = cute.size(mPV, mode=[0])
        smem, sV, sI = _sort_buffers()
        sW = smem.allocate_tensor(cutlass.Float32, cute.make_layout((K_MAX,)), byte_alignment=16)
        for r in cutlass.range_constexpr(SLICE // THREADS):
            t = tidx + r * THREADS
            if t < total:
                sV[t] = mPV[t]
                sI[t] = mPI[t]
            else:
                sV[t] = cutlass.Float32(-cutlass.Float32.inf)
                sI[t] = cutlass.Int32(PAD_ID)
        cute.arch.sync_threads()
        _bitonic_sort(sV, sI, tidx)
        if tidx == 0:
            top = sV[0]
            s = cutlass.Float64(0.0)
            for i in cutlass.range(top_k):
                w = cute.math.exp((sV[i] - top) * inv_t, fastmath=False)
                sW[i] = w
                s = s + w.to(cutlass.Float64)
            scale = (cutlass.Float64(1.0) / s).to(cutlass.Float32)
            for i in cutlass.range(top_k):
                sW[i] = sW[i] * scale
            kept = top_k
            if top_p < cutlass.Float32(1.0):
                mass = cutlass.Float64(0.0)
                for i in cutlass.range(top_k):
                    mass = mass + sW[i].to(cutlass.Float64)
                need = top_p.to(cutlass.Float64) * mass
                below = cutlass.Int32(0)
                run = cutlass.Float64(0.0)
                for i in cutlass.range(top_k):
                    run = run + sW[i].to(cutlass.Float64)
                    if run < need:
                        below = below + 1
                kept = below + 1
                if kept > top_k:
                    kept = top_k
            floor = min_p * sW[0]
            n = cutlass.Int32(0)
            for i in cutlass.range(kept):
                if sW[i] >= floor:
                    n = n + 1
            mass = cutlass.Float64(0.0)
            for i in cutlass.range(n):
                mass = mass + sW[i].to(cutlass.Float64)
            target = u.to(cutlass.Float64) * mass
            pick = cutlass.Int32(0)
            run = cutlass.Float64(0.0)
            for i in cutlass.range(n):
                run = run + sW[i].to(cutlass.Float64)
                if run <= target:
                    pick = pick + 1
            if pick > n - 1:
                pick = n - 1
            token = sI[pick]
            mOut[0] = token
            mCounts[token] = mCounts[token] + 1
