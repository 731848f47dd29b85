"""Sampling on the device: top-k (k <= K_MAX) candidates, then temperature / top-p / min-p / draw.

Two kernels, launched back to back:

SampleTopK  grid (cdiv(N, SLICE),), THREADS threads. CTA b loads logits [b*SLICE, (b+1)*SLICE)
            (bf16, one 16-byte chunk and its 8 counts a thread, into registers, every load issued
            before the first use), applies the penalties in numpy's fp32 rounding (x -= presence
            + frequency * count where count > 0; NaN -> -inf), then each warp bitonic-sorts its
            256 values in registers (shuffles across lanes) into four runs of K_MAX, the runs go
            to shared memory, and a merge tree (`_merge_tree`) keeps the best K_MAX of pairs of
            runs until one is left: written to part_v / part_i [b*K_MAX ...]. Slots past N sort
            last.
SamplePick  one CTA: loads the P = grid * K_MAX partial pairs (P <= SLICE: up to 64 sorted runs,
            the rest padding), the same merge tree leaves the best K_MAX, and warp 0 runs the
            host `Sampler`'s arithmetic over the first top_k: w = exp((x - x_max) * inv_t)
            (fp32), normalised by an fp64 sum; top-p keeps the shortest prefix whose fp64
            cumulative mass reaches top_p * total; min-p keeps w >= min_p * w_max; the draw is the
            first i whose fp64 cumulative sum exceeds u * total (clamped to the last kept). The
            sums run in the host's order (every lane adds the 64 weights in sequence; weights
            past top_k are 0, which changes no sum); the counts are warp ballots.
            out[0] = the id; counts[id] += 1.

Order everywhere: larger value first, equal values by smaller id (ids are unique, padding ids
equal and last). Greedy is top_k = 1.

The compare-exchange schedules (`sort_stages`, `MERGE_STAGES`) and layouts are plain Python so
that tests/test_kernels_sample.py can run the same network in numpy.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute

VEC = 8  # bf16 per 16-byte load
K_MAX = 64  # candidates each slice contributes (the largest top_k on the device)
SLICE = 4096  # logits per SampleTopK CTA; also the most partial pairs SamplePick merges
THREADS = 512
WARPS = THREADS // 32
REGS = SLICE // THREADS  # values a lane sorts in SampleTopK (element e = lane * REGS + r of its warp)
LISTS = SLICE // K_MAX  # sorted runs of K_MAX the merge tree starts from
MERGE_REGS = K_MAX // 32  # values a lane holds while merging (element e = lane * MERGE_REGS + r)
PAD_ID = 0x7FFFFFFF  # id of padding slots: loses every tie


def sort_stages(regs: int, run: int) -> list[tuple[int, int]]:
    """The (size, stride) compare-exchange stages of a bitonic sort of runs of `run` elements."""
    stages = []
    size = 2
    while size <= run:
        stride = size // 2
        while stride:
            stages.append((size, stride))
            stride //= 2
        size *= 2
    return stages


# the last level of a sort of runs of 2 * K_MAX: a bitonic merge (strides 32 .. 1), every element best first
MERGE_STAGES = tuple((2 * K_MAX, K_MAX >> s) for s in range(1, K_MAX.bit_length()))


def _before(va, ia, vb, ib):
    """Whether (va, ia) sorts before (vb, ib): larger value, or equal value with smaller id."""
    return (va > vb) | ((va == vb) & (ia < ib))


@cute.jit
def _ce_regs(rV: cute.Tensor, rI: cute.Tensor, a: cutlass.Constexpr, b: cutlass.Constexpr, desc):
    """Compare-exchange registers a < b of this lane: a gets the better (desc) or the worse one."""
    va = rV[a]
    ia = rI[a]
    vb = rV[b]
    ib = rI[b]
    if desc == _before(vb, ib, va, ia):  # equal keys swap harmlessly
        rV[a] = vb
        rI[a] = ib
        rV[b] = va
        rI[b] = ia


@cute.jit
def _ce_lanes(rV: cute.Tensor, rI: cute.Tensor, r: cutlass.Constexpr, m: cutlass.Constexpr, lane, desc):
    """Compare-exchange register r with the same register of lane ^ m; the lane holding the lower
    element keeps the better one in a desc run, the worse one otherwise."""
    v = rV[r]
    i = rI[r]
    pv = cute.arch.shuffle_sync_bfly(v, offset=m)
    pi = cute.arch.shuffle_sync_bfly(i, offset=m)
    keep_better = ((lane & m) == 0) == desc
    partner_better = _before(pv, pi, v, i)
    if (partner_better | _before(v, i, pv, pi)) & (keep_better == partner_better):
        rV[r] = pv
        rI[r] = pi


def _network(rV: cute.Tensor, rI: cute.Tensor, lane, regs: int, run: int, stages) -> None:
    """Run the compare-exchange `stages` ((size, stride) pairs of a bitonic sort of runs of `run`) over
    the warp's 32 * regs values, element e = lane * regs + r; every run ends up sorted best first."""
    for size, stride in stages:  # unrolled at trace time
        for r in range(regs):
            e = lane * regs + r
            desc = (e & (run - 1) & size) == 0  # the run of `size` this element is in sorts best first
            if stride < regs:
                if (r & stride) == 0:
                    _ce_regs(rV, rI, r, r + stride, desc)
            else:
                _ce_lanes(rV, rI, r, stride // regs, lane, desc)


@cute.jit
def _merge(sV: cute.Tensor, sI: cute.Tensor, a, b, lane):
    """One warp: the best K_MAX of the sorted runs at sV/sI [a, a + K_MAX) and [b, b + K_MAX), sorted,
    into [a, a + K_MAX). (best of A[e] and B[K_MAX-1-e] is a bitonic sequence holding the best K_MAX.)"""
    rV = cute.make_rmem_tensor((MERGE_REGS,), cutlass.Float32)
    rI = cute.make_rmem_tensor((MERGE_REGS,), cutlass.Int32)
    for r in cutlass.range_constexpr(MERGE_REGS):
        e = lane * MERGE_REGS + r
        va = sV[a + e]
        ia = sI[a + e]
        vb = sV[b + K_MAX - 1 - e]
        ib = sI[b + K_MAX - 1 - e]
        if _before(vb, ib, va, ia):
            va = vb
            ia = ib
        rV[r] = va
        rI[r] = ia
    _network(rV, rI, lane, MERGE_REGS, 2 * K_MAX, MERGE_STAGES)
    for r in cutlass.range_constexpr(MERGE_REGS):
        e = lane * MERGE_REGS + r
        sV[a + e] = rV[r]
        sI[a + e] = rI[r]


@cute.jit
def _merge_tree(sV: cute.Tensor, sI: cute.Tensor, warp, lane):
    """LISTS sorted runs of K_MAX in sV/sI -> the best K_MAX, sorted, in [0, K_MAX). Round k merges
    run pairs 2^(k+1) * j and 2^(k+1) * j + 2^k, one warp a pair. Starts and ends with a CTA barrier."""
    cute.arch.sync_threads()
    for rnd in cutlass.range_constexpr(LISTS.bit_length() - 1):
        merges = LISTS >> (rnd + 1)
        for j0 in cutlass.range_constexpr(0, merges, WARPS):
            j = j0 + warp
            if j < merges:
                a = j * (K_MAX << (rnd + 1))
                _merge(sV, sI, a, a + (K_MAX << rnd), lane)
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
        warp = tidx // 32
        lane = tidx % 32
        chunks = cute.size(mX, mode=[0]) // VEC
        gX = cute.zipped_divide(mX, (VEC,))
        _, sV, sI = _sort_buffers()
        rX = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
        rV = cute.make_rmem_tensor((REGS,), cutlass.Float32)
        rI = cute.make_rmem_tensor((REGS,), cutlass.Int32)
        rC = cute.make_rmem_tensor((VEC,), cutlass.Int32)
        c = bidx * THREADS + tidx  # this thread's chunk: warp element e = lane * REGS + r is id c * VEC + r
        if c < chunks:
            cute.autovec_copy(gX[None, c], rX)  # every load issued before the first use
            cute.autovec_copy(cute.zipped_divide(mCounts, (VEC,))[None, c], rC)
            for j in cutlass.range_constexpr(VEC):
                v = rX[j].to(cutlass.Float32)
                n = rC[j]
                if n > 0:  # the product rounded once to fp32 (in fp64, so it is not fused into an FMA)
                    f = (frequency.to(cutlass.Float64) * n.to(cutlass.Float64)).to(cutlass.Float32)
                    v = v - (presence + f)
                if v != v:
                    v = cutlass.Float32(-cutlass.Float32.inf)
                rV[j] = v
                rI[j] = c * VEC + j
        else:
            for j in cutlass.range_constexpr(VEC):
                rV[j] = cutlass.Float32(-cutlass.Float32.inf)
                rI[j] = cutlass.Int32(PAD_ID)
        _network(rV, rI, lane, REGS, K_MAX, sort_stages(REGS, K_MAX))  # 4 sorted runs of K_MAX a warp
        for r in cutlass.range_constexpr(REGS):  # the warp's 4 runs are LISTS 4 * warp .. 4 * warp + 3
            sV[tidx * REGS + r] = rV[r]
            sI[tidx * REGS + r] = rI[r]
        _merge_tree(sV, sI, warp, lane)
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
        warp = tidx // 32
        lane = tidx % 32
        total = cute.size(mPV, mode=[0])
        smem, sV, sI = _sort_buffers()
        sW = smem.allocate_tensor(cutlass.Float32, cute.make_layout((K_MAX,)), byte_alignment=16)
        sN = smem.allocate_tensor(cutlass.Float32, cute.make_layout((K_MAX,)), byte_alignment=16)
        sC = smem.allocate_tensor(cutlass.Float64, cute.make_layout((K_MAX,)), byte_alignment=16)
        rV = cute.make_rmem_tensor((SLICE // THREADS,), cutlass.Float32)
        rI = cute.make_rmem_tensor((SLICE // THREADS,), cutlass.Int32)
        for r in cutlass.range_constexpr(SLICE // THREADS):  # every load issued before the first use
            rV[r] = cutlass.Float32(-cutlass.Float32.inf)
            rI[r] = cutlass.Int32(PAD_ID)
            if tidx + r * THREADS < total:
                rV[r] = mPV[tidx + r * THREADS]
                rI[r] = mPI[tidx + r * THREADS]
        for r in cutlass.range_constexpr(SLICE // THREADS):
            sV[tidx + r * THREADS] = rV[r]
            sI[tidx + r * THREADS] = rI[r]
        _merge_tree(sV, sI, warp, lane)
        if warp == 0:
            # weights w = exp((x - x_max) / T) of the first top_k (0 past them), e = lane + 32 * h
            top = sV[0]
            for h in cutlass.range_constexpr(K_MAX // 32):
                e = lane + 32 * h
                w = cutlass.Float32(0.0)
                if e < top_k:
                    w = cute.math.exp((sV[e] - top) * inv_t, fastmath=False)
                sW[e] = w
            cute.arch.sync_warp()
            s = cutlass.Float64(0.0)
            for j in cutlass.range(K_MAX, unroll_full=True):  # every lane: the fp64 sum in the host's order
                s = s + sW[j].to(cutlass.Float64)
            scale = (cutlass.Float64(1.0) / s).to(cutlass.Float32)
            for h in cutlass.range_constexpr(K_MAX // 32):
                sN[lane + 32 * h] = sW[lane + 32 * h] * scale
            cute.arch.sync_warp()
            run = cutlass.Float64(0.0)
            for j in cutlass.range(K_MAX, unroll_full=True):  # the cumulative sums, in order; lane 0 keeps them
                run = run + sN[j].to(cutlass.Float64)
                if lane == 0:
                    sC[j] = run
            cute.arch.sync_warp()
            mass = run
            wn0 = sN[lane]
            wn1 = sN[lane + 32]
            cum0 = sC[lane]
            cum1 = sC[lane + 32]
            # top-p: the shortest prefix whose cumulative mass reaches top_p * mass
            kept = top_k
            if top_p < cutlass.Float32(1.0):
                need = top_p.to(cutlass.Float64) * mass
                below = (cute.arch.popc(cute.arch.vote_ballot_sync((lane < top_k) & (cum0 < need)))
                         + cute.arch.popc(cute.arch.vote_ballot_sync((lane + 32 < top_k) & (cum1 < need))))
                kept = below + 1
                if kept > top_k:
                    kept = top_k
            # min-p: the kept weights >= min_p * w_max
            floor = min_p * sN[0]
            n = (cute.arch.popc(cute.arch.vote_ballot_sync((lane < kept) & (wn0 >= floor)))
                 + cute.arch.popc(cute.arch.vote_ballot_sync((lane + 32 < kept) & (wn1 >= floor))))
            last = n - 1
            if last < 0:  # no weight is a number (every logit -inf): take the first candidate
                last = 0
            target = u.to(cutlass.Float64) * sC[last]
            pick = (cute.arch.popc(cute.arch.vote_ballot_sync((lane < n) & (cum0 <= target)))
                    + cute.arch.popc(cute.arch.vote_ballot_sync((lane + 32 < n) & (cum1 <= target))))
            if pick > last:
                pick = last
            if lane == 0:
                token = sI[pick]
                mOut[0] = token
                mCounts[token] = mCounts[token] + 1
