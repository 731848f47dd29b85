"""Gated attention decode over the paged KV cache: split-K partials, then a gated combine.

AttnDecodePipelined (the default) and AttnDecode (the previous kernel, kept as a baseline): one
CTA per (split s, kv head g, sequence b), 8 warps. The sequence's n = cdiv(lens[b], 64) pages are
cut into S splits of pps = cdiv(n, S) pages; CTA s walks pages s*pps .. min(n, (s+1)*pps) - 1 in
blocks of T tokens (CTAs past the end do nothing). The G query heads of kv head g share every K/V
read, so each KV byte is read once. Per block:

    1. QK: thread t takes token t // (256/T) and its 16-byte K chunks t % (256/T) + i * 256/T
       (a warp reads whole 128- or 64-byte runs of each row), widens each chunk to fp32 once,
       dots it with the G queries in smem (pre-scaled by scale*log2 e) and sums the partial dots
       of a token with shuffles. Tokens past lens score -inf and are not loaded.
    2. Online softmax (base 2): warp h < G updates head h's running max m and sum l and writes
       p = exp2(s - m) and the rescale factor alpha to smem.
    3. PV: lane c owns 16-byte chunk c (dims 8c..8c+7) of the V rows of the warp's T/8 tokens
       (512 contiguous bytes per load): acc[h] = alpha[h] acc[h] + sum p v, fp32. V rows past lens
       count as zeros.
    At the end the 8 warps' accumulators are summed in smem and the split writes
    part_o[b, h, s, :] = acc / l and part_lse[b, h, s] = m + log2(l) (fp32).

AttnDecode loads each block's K (then V) from global memory straight into registers, so a CTA has
one block's K or V in flight at a time; AttnDecodePipelined double-buffers K and V in shared
memory with cp.async (see its docstring).

AttnCombine: one CTA per (query head, sequence) merges the used splits,

    o = sum_s 2^(lse_s - M) part_o_s / sum_s 2^(lse_s - M),   M = max_s lse_s,

(groups of 64 threads take every groups-th split and meet in smem), multiplies by sigmoid(gate)
(the gate half of the head's [q | gate] projection row) and writes bf16 out[b, h*256 : (h+1)*256].
lens[b] = 0 marks an idle batch lane: no CTA works on it and its output is 0.
"""

import math

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync

HEAD_DIM = 256
PAGE = 64
VEC = 8  # bf16 per 16-byte load
CHUNKS = HEAD_DIM // VEC  # 32 chunks per row
WARPS = 8
THREADS = 32 * WARPS
LOG2E = math.log2(math.e)
NEG_INF = -math.inf


def _warp_sum(x):
    for i in range(5):  # unrolled at trace time (helpers are not preprocessed)
        x = x + cute.arch.shuffle_sync_bfly(x, offset=1 << i)
    return x


def _warp_max(x):
    for i in range(5):
        x = cute.math.max(x, cute.arch.shuffle_sync_bfly(x, offset=1 << i))
    return x


def _pages(length, splits, split):
    """First page, end page (exclusive) of `split`, and the splits in use, for a sequence of `length`."""
    n_pages = (length + PAGE - 1) // PAGE
    pps = cutlass.max((n_pages + splits - 1) // splits, 1)  # lens = 0 (an idle lane): no splits used
    begin = split * pps
    return begin, cutlass.min(begin + pps, n_pages), (n_pages + pps - 1) // pps


class AttnDecode:
    """Split-K decode attention partials for `group` query heads per kv head (head_dim 256).

    `block` tokens (32 or 64) are loaded and scored per step; `ctas_per_sm` > 1 caps the
    registers so that many CTAs share an SM."""

    def __init__(self, group: int, block: int = PAGE, ctas_per_sm: int = 1):
        if not 1 <= group <= WARPS:
            raise ValueError(f"group must be 1..{WARPS} (one softmax warp per query head)")
        if block not in (32, 64):
            raise ValueError("block must be 32 or 64 tokens")
        self.group = group
        self.block = block
        self.ctas_per_sm = ctas_per_sm
        self.tpt = THREADS // block  # QK: threads per token
        self.cpt = CHUNKS // self.tpt  # QK: 16-byte chunks per thread
        self.tpw = block // WARPS  # PV: tokens per warp
        self.spl = block // 32  # softmax: scores per lane

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mLens: cute.Tensor, mPT: cute.Tensor, mKV: cute.Tensor,
                 mPO: cute.Tensor, mPL: cute.Tensor, scale: cutlass.Float32, stream: cuda.CUstream):
        splits = cute.size(mPL, mode=[2])
        hkv = cute.size(mQ, mode=[1]) // self.group
        b = cute.size(mQ, mode=[0])
        if cutlass.const_expr(self.ctas_per_sm > 1):
            self.kernel(mQ, mLens, mPT, mKV, mPO, mPL, scale).launch(
                grid=(splits, hkv, b), block=(THREADS, 1, 1), stream=stream,
                min_blocks_per_mp=self.ctas_per_sm, preferred_smem_carveout=-1,
            )
        else:
            self.kernel(mQ, mLens, mPT, mKV, mPO, mPL, scale).launch(
                grid=(splits, hkv, b), block=(THREADS, 1, 1), stream=stream
            )

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mLens: cute.Tensor, mPT: cute.Tensor, mKV: cute.Tensor,
               mPO: cute.Tensor, mPL: cute.Tensor, scale: cutlass.Float32):
        tidx, _, _ = cute.arch.thread_idx()
        split, kvh, seq = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        G, T = self.group, self.block
        per_page = PAGE // T
        hkv = cute.size(mQ, mode=[1]) // G
        cute.arch.griddepcontrol_wait()  # PDL: launched early, wait here for the previous kernel
        cute.arch.griddepcontrol_launch_dependents()
        length = mLens[seq]
        p_begin, p_end, _ = _pages(length, cute.size(mPL, mode=[2]), split)

        smem = cutlass.memory.SmemAllocator()
        # q row h: dims 8c..8c+3 at 4c, dims 8c+4..8c+7 at 128 + 4c, so the 8 threads of a token,
        # reading chunks c..c+7 as two 16-byte loads each, hit 8 distinct bank quads per load.
        sQ = smem.allocate_tensor(cutlass.Float32,
                                  cute.make_layout((G, (4, 2, CHUNKS)), stride=(HEAD_DIM, (1, HEAD_DIM // 2, 4))),
                                  byte_alignment=16)
        sS = smem.allocate_tensor(cutlass.Float32, cute.make_layout((G, T), stride=(T, 1)), byte_alignment=16)
        sP = smem.allocate_tensor(cutlass.Float32, cute.make_layout((T, G), stride=(G, 1)), byte_alignment=16)
        sRed = smem.allocate_tensor(cutlass.Float32, cute.make_layout((WARPS, HEAD_DIM), stride=(HEAD_DIM, 1)),
                                    byte_alignment=16)
        sAlpha = smem.allocate_tensor(cutlass.Float32, cute.make_layout((G,)), byte_alignment=16)
        sM = smem.allocate_tensor(cutlass.Float32, cute.make_layout((G,)), byte_alignment=16)
        sL = smem.allocate_tensor(cutlass.Float32, cute.make_layout((G,)), byte_alignment=16)

        if p_begin < p_end:
            q_scale = scale * LOG2E
            for h in cutlass.range_constexpr(G):
                sQ[h, tidx] = mQ[seq, kvh * G + h, tidx] * q_scale
            cute.arch.sync_threads()

            t_qk = tidx // self.tpt
            part = tidx % self.tpt
            rK = cute.make_rmem_tensor((VEC, self.cpt), cutlass.BFloat16)
            rV = cute.make_rmem_tensor((VEC, self.tpw), cutlass.BFloat16)
            rQ = cute.make_rmem_tensor((VEC,), cutlass.Float32)
            rAcc = cute.make_rmem_tensor((VEC, G), cutlass.Float32)
            rAcc.fill(0.0)
            m_run = cutlass.Float32(NEG_INF)
            l_run = cutlass.Float32(0.0)

            # Blocks of T tokens from the split's first page to its last token.
            b_end = cutlass.min(p_end * per_page, (length + T - 1) // T)
            for blk in cutlass.range(p_begin * per_page, b_end, 1):
                page = mPT[seq, blk // per_page]
                valid = length - blk * T
                row_k = (page * 2 * hkv + kvh) * PAGE + (blk % per_page) * T
                row_v = row_k + hkv * PAGE

                # 1. QK: this thread's K chunks part, part + tpt, ... of token t_qk; each chunk is
                #    widened once for all G heads, then the tpt partial dots are summed by shuffles.
                rK.fill(0.0)  # also keeps rK from being carried across blocks
                if t_qk < valid:
                    gK = cute.zipped_divide(mKV[row_k + t_qk, None], (VEC,))
                    for j in cutlass.range_constexpr(self.cpt):
                        cute.autovec_copy(gK[None, j * self.tpt + part], rK[None, j])
                dots = [cutlass.Float32(0.0)] * G
                for j in cutlass.range_constexpr(self.cpt):
                    kf = rK[None, j].load().to(cutlass.Float32)
                    for h in cutlass.range_constexpr(G):
                        cute.autovec_copy(cute.zipped_divide(sQ[h, None], (VEC,))[None, j * self.tpt + part], rQ)
                        prod = kf * rQ.load()
                        dots[h] = dots[h] + prod.reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0),
                                                        reduction_profile=0)
                for h in cutlass.range_constexpr(G):
                    dot = dots[h]
                    for k in cutlass.range_constexpr(self.tpt.bit_length() - 1):
                        dot = dot + cute.arch.shuffle_sync_bfly(dot, offset=1 << k)
                    if t_qk >= valid:
                        dot = cutlass.Float32(NEG_INF)
                    if part == 0:
                        sS[h, t_qk] = dot
                cute.arch.sync_threads()

                # V loads go out before the softmax so their latency overlaps it.
                rV.fill(0.0)
                for i in cutlass.range_constexpr(self.tpw):
                    if warp * self.tpw + i < valid:
                        gV = cute.zipped_divide(mKV[row_v + warp * self.tpw + i, None], (VEC,))
                        cute.autovec_copy(gV[None, lane], rV[None, i])

                # 2. Online softmax (base 2), one warp per query head.
                if warp < G:
                    block_max = sS[warp, lane]
                    for e in cutlass.range_constexpr(1, self.spl):
                        block_max = cute.math.max(block_max, sS[warp, lane + 32 * e])
                    m_new = cute.math.max(m_run, _warp_max(block_max))
                    alpha = cute.math.exp2(m_run - m_new, fastmath=True)
                    p_sum = cutlass.Float32(0.0)
                    for e in cutlass.range_constexpr(self.spl):
                        p = cute.math.exp2(sS[warp, lane + 32 * e] - m_new, fastmath=True)
                        sP[lane + 32 * e, warp] = p
                        p_sum = p_sum + p
                    l_run = l_run * alpha + _warp_sum(p_sum)
                    m_run = m_new
                    if lane == 0:
                        sAlpha[warp] = alpha
                cute.arch.sync_threads()

                # 3. acc = alpha acc + P V over this warp's tokens (each V chunk widened once).
                for h in cutlass.range_constexpr(G):
                    rAcc[None, h].store(rAcc[None, h].load() * sAlpha[h])
                for i in cutlass.range_constexpr(self.tpw):
                    vf = rV[None, i].load().to(cutlass.Float32)
                    for h in cutlass.range_constexpr(G):
                        rAcc[None, h].store(rAcc[None, h].load() + vf * sP[warp * self.tpw + i, h])

            # Sum the warps' accumulators per head; write the normalised partial and its lse.
            if warp < G:
                if lane == 0:
                    sM[warp] = m_run
                    sL[warp] = l_run
            for h in cutlass.range_constexpr(G):
                cute.autovec_copy(rAcc[None, h], cute.zipped_divide(sRed[warp, None], (VEC,))[None, lane])
                cute.arch.sync_threads()
                total = sRed[0, tidx]
                for w in cutlass.range_constexpr(1, WARPS):
                    total = total + sRed[w, tidx]
                l_h = sL[h]
                mPO[seq, kvh * G + h, split, tidx] = total / l_h
                if tidx == 0:
                    mPL[seq, kvh * G + h, split] = sM[h] + cute.math.log2(l_h, fastmath=False)
                cute.arch.sync_threads()


class AttnDecodePipelined:
    """Split-K decode attention partials, K/V staged through shared memory with cp.async.

    Same grid, work split, numerics and outputs as `AttnDecode`. Two stages of `block` tokens of K
    and V (block KiB each): while block i is scored and accumulated from one stage, block i + 1 is
    in flight to the other; block i + 2 is issued into the first as soon as every warp is done
    with it. A CTA keeps one to two blocks (32-64 KiB at block 32) of loads outstanding, two CTAs
    per SM about twice that (~26 KiB per SM covers HBM latency at full rate on H200)."""

    def __init__(self, group: int, block: int = 32, ctas_per_sm: int = 2):
        if not 1 <= group <= WARPS:
            raise ValueError(f"group must be 1..{WARPS} (one softmax warp per query head)")
        if block not in (32, 64):
            raise ValueError("block must be 32 or 64 tokens")
        self.group = group
        self.block = block
        self.ctas_per_sm = ctas_per_sm
        self.tpt = THREADS // block  # QK: threads per token
        self.cpt = CHUNKS // self.tpt  # QK: 16-byte chunks per thread
        self.tpw = block // WARPS  # PV: tokens per warp
        self.spl = block // 32  # softmax: scores per lane
        self.rpt = block // WARPS  # cp.async: rows (of K, and of V) per warp per block

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mLens: cute.Tensor, mPT: cute.Tensor, mKV: cute.Tensor,
                 mPO: cute.Tensor, mPL: cute.Tensor, scale: cutlass.Float32, stream: cuda.CUstream):
        splits = cute.size(mPL, mode=[2])
        hkv = cute.size(mQ, mode=[1]) // self.group
        b = cute.size(mQ, mode=[0])
        g2s = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), cutlass.BFloat16,
                                  num_bits_per_copy=128)
        self.kernel(mQ, mLens, mPT, mKV, mPO, mPL, scale, g2s).launch(
            grid=(splits, hkv, b), block=(THREADS, 1, 1), stream=stream,
            min_blocks_per_mp=self.ctas_per_sm, preferred_smem_carveout=-1,
        )

    @cute.jit
    def _issue(self, g2s: cute.CopyAtom, mKV: cute.Tensor, sKV: cute.Tensor, stage, page, blk, length, hkv, kvh,
               warp, lane):
        """cp.async the K and V rows < length of block `blk` (in page `page`) into stage `stage`:
        warp w copies rows w, w + 8, ... (512 contiguous bytes per row, lane = 16-byte chunk)."""
        per_page = PAGE // self.block
        valid = length - blk * self.block
        row_k = (page * 2 * hkv + kvh) * PAGE + (blk % per_page) * self.block
        for kv in cutlass.range_constexpr(2):
            for i in cutlass.range_constexpr(self.rpt):
                tok = warp + WARPS * i
                if tok < valid:
                    src = cute.zipped_divide(mKV[row_k + kv * hkv * PAGE + tok, None], (VEC,))
                    dst = cute.zipped_divide(sKV[kv, stage, tok, None], (VEC,))
                    cute.copy(g2s, src[None, lane], dst[None, lane])

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mLens: cute.Tensor, mPT: cute.Tensor, mKV: cute.Tensor,
               mPO: cute.Tensor, mPL: cute.Tensor, scale: cutlass.Float32, g2s: cute.CopyAtom):
        tidx, _, _ = cute.arch.thread_idx()
        split, kvh, seq = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        G, T = self.group, self.block
        per_page = PAGE // T
        hkv = cute.size(mQ, mode=[1]) // G
        cute.arch.griddepcontrol_wait()  # PDL: launched early, wait here for the previous kernel
        cute.arch.griddepcontrol_launch_dependents()
        length = mLens[seq]
        p_begin, p_end, _ = _pages(length, cute.size(mPL, mode=[2]), split)

        smem = cutlass.memory.SmemAllocator()
        # K and V stages: [kv, stage, token, dim] bf16, rows of 512 bytes.
        sKV = smem.allocate_tensor(cutlass.BFloat16,
                                   cute.make_layout((2, 2, T, HEAD_DIM), stride=(2 * T * HEAD_DIM, T * HEAD_DIM,
                                                                                HEAD_DIM, 1)),
                                   byte_alignment=128)
        sQ = smem.allocate_tensor(cutlass.Float32,
                                  cute.make_layout((G, (4, 2, CHUNKS)), stride=(HEAD_DIM, (1, HEAD_DIM // 2, 4))),
                                  byte_alignment=16)
        sS = smem.allocate_tensor(cutlass.Float32, cute.make_layout((G, T), stride=(T, 1)), byte_alignment=16)
        sP = smem.allocate_tensor(cutlass.Float32, cute.make_layout((T, G), stride=(G, 1)), byte_alignment=16)
        sAlpha = smem.allocate_tensor(cutlass.Float32, cute.make_layout((G,)), byte_alignment=16)
        sM = smem.allocate_tensor(cutlass.Float32, cute.make_layout((G,)), byte_alignment=16)
        sL = smem.allocate_tensor(cutlass.Float32, cute.make_layout((G,)), byte_alignment=16)
        # The final 8-warp reduction reuses the K stages (8 x 256 fp32 = 8 KiB <= 2 x T x 512 bytes).
        sRed = cute.make_tensor(cute.recast_ptr(sKV.iterator, dtype=cutlass.Float32),
                                cute.make_layout((WARPS, HEAD_DIM), stride=(HEAD_DIM, 1)))

        if p_begin < p_end:
            b_begin = p_begin * per_page
            b_end = cutlass.min(p_end * per_page, (length + T - 1) // T)
            # Blocks b_begin and b_begin + 1 go out first, one commit group each (an empty group
            # when there is no second block, so that group i always holds block b_begin + i).
            self._issue(g2s, mKV, sKV, 0, mPT[seq, p_begin], b_begin, length, hkv, kvh, warp, lane)
            cute.arch.cp_async_commit_group()
            if b_begin + 1 < b_end:
                self._issue(g2s, mKV, sKV, 1, mPT[seq, (b_begin + 1) // per_page], b_begin + 1, length, hkv, kvh,
                            warp, lane)
            cute.arch.cp_async_commit_group()

            q_scale = scale * LOG2E
            for h in cutlass.range_constexpr(G):
                sQ[h, tidx] = mQ[seq, kvh * G + h, tidx] * q_scale

            t_qk = tidx // self.tpt
            part = tidx % self.tpt
            rK = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
            rV = cute.make_rmem_tensor((VEC, self.tpw), cutlass.BFloat16)
            rQ = cute.make_rmem_tensor((VEC,), cutlass.Float32)
            rAcc = cute.make_rmem_tensor((VEC, G), cutlass.Float32)
            rAcc.fill(0.0)
            m_run = cutlass.Float32(NEG_INF)
            l_run = cutlass.Float32(0.0)

            for blk in cutlass.range(b_begin, b_end, 1, unroll=1):
                stage = (blk - b_begin) % 2
                valid = length - blk * T
                # The page of block blk + 2 (issued at the end of this step) is read now, so its
                # latency hides behind the work on block blk.
                page_next = mPT[seq, cutlass.min(blk + 2, b_end - 1) // per_page]
                # Block blk has landed: all but the newest group (block blk + 1, still in flight) are
                # complete for this thread, and for everyone after the barrier.
                cute.arch.cp_async_wait_group(1)
                cute.arch.sync_threads()

                # 1. QK: as in AttnDecode, from shared memory; rows past lens were never copied and
                #    score -inf whatever the stage holds.
                sK = cute.zipped_divide(sKV[0, stage, t_qk, None], (VEC,))
                dots = [cutlass.Float32(0.0)] * G
                for j in cutlass.range_constexpr(self.cpt):
                    cute.autovec_copy(sK[None, j * self.tpt + part], rK)
                    kf = rK.load().to(cutlass.Float32)
                    for h in cutlass.range_constexpr(G):
                        cute.autovec_copy(cute.zipped_divide(sQ[h, None], (VEC,))[None, j * self.tpt + part], rQ)
                        prod = kf * rQ.load()
                        dots[h] = dots[h] + prod.reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0),
                                                        reduction_profile=0)
                for h in cutlass.range_constexpr(G):
                    dot = dots[h]
                    for k in cutlass.range_constexpr(self.tpt.bit_length() - 1):
                        dot = dot + cute.arch.shuffle_sync_bfly(dot, offset=1 << k)
                    if t_qk >= valid:
                        dot = cutlass.Float32(NEG_INF)
                    if part == 0:
                        sS[h, t_qk] = dot
                cute.arch.sync_threads()

                # 2. Online softmax (base 2), one warp per query head.
                if warp < G:
                    block_max = sS[warp, lane]
                    for e in cutlass.range_constexpr(1, self.spl):
                        block_max = cute.math.max(block_max, sS[warp, lane + 32 * e])
                    m_new = cute.math.max(m_run, _warp_max(block_max))
                    alpha = cute.math.exp2(m_run - m_new, fastmath=True)
                    p_sum = cutlass.Float32(0.0)
                    for e in cutlass.range_constexpr(self.spl):
                        p = cute.math.exp2(sS[warp, lane + 32 * e] - m_new, fastmath=True)
                        sP[lane + 32 * e, warp] = p
                        p_sum = p_sum + p
                    l_run = l_run * alpha + _warp_sum(p_sum)
                    m_run = m_new
                    if lane == 0:
                        sAlpha[warp] = alpha
                cute.arch.sync_threads()

                # 3. acc = alpha acc + P V over this warp's tokens; rows past lens count as zeros.
                rV.fill(0.0)
                for i in cutlass.range_constexpr(self.tpw):
                    if warp * self.tpw + i < valid:
                        sV = cute.zipped_divide(sKV[1, stage, warp * self.tpw + i, None], (VEC,))
                        cute.autovec_copy(sV[None, lane], rV[None, i])
                for h in cutlass.range_constexpr(G):
                    rAcc[None, h].store(rAcc[None, h].load() * sAlpha[h])
                for i in cutlass.range_constexpr(self.tpw):
                    vf = rV[None, i].load().to(cutlass.Float32)
                    for h in cutlass.range_constexpr(G):
                        rAcc[None, h].store(rAcc[None, h].load() + vf * sP[warp * self.tpw + i, h])

                # Every warp is done with this stage (and with sP, sAlpha): block blk + 2 goes there.
                cute.arch.sync_threads()
                if blk + 2 < b_end:
                    self._issue(g2s, mKV, sKV, stage, page_next, blk + 2, length, hkv, kvh, warp, lane)
                cute.arch.cp_async_commit_group()

            # Sum the warps' accumulators per head; write the normalised partial and its lse. Only
            # empty copy groups are outstanding, so sRed may overlay the stages.
            if warp < G:
                if lane == 0:
                    sM[warp] = m_run
                    sL[warp] = l_run
            for h in cutlass.range_constexpr(G):
                cute.autovec_copy(rAcc[None, h], cute.zipped_divide(sRed[warp, None], (VEC,))[None, lane])
                cute.arch.sync_threads()
                total = sRed[0, tidx]
                for w in cutlass.range_constexpr(1, WARPS):
                    total = total + sRed[w, tidx]
                l_h = sL[h]
                mPO[seq, kvh * G + h, split, tidx] = total / l_h
                if tidx == 0:
                    mPL[seq, kvh * G + h, split] = sM[h] + cute.math.log2(l_h, fastmath=False)
                cute.arch.sync_threads()


class AttnCombine:
    """Merge split-K partials of each (query head, sequence), gate with sigmoid, write bf16.

    64 * `groups` threads: group g (64 threads, 4 dims each) merges splits g, g + groups, ...
    (`unroll` of them per loop step, their loads issued together) against the maximum lse of all
    used splits; the groups' sums meet in shared memory."""

    def __init__(self, groups: int = 8, unroll: int = 4):
        if groups not in (1, 2, 4, 8):
            raise ValueError("groups must be 1, 2, 4 or 8")
        self.groups = groups
        self.unroll = unroll
        self.threads = 64 * groups

    @cute.jit
    def __call__(self, mPO: cute.Tensor, mPL: cute.Tensor, mLens: cute.Tensor, mQG: cute.Tensor,
                 mOut: cute.Tensor, stream: cuda.CUstream):
        hq = cute.size(mPO, mode=[1])
        b = cute.size(mPO, mode=[0])
        self.kernel(mPO, mPL, mLens, mQG, mOut).launch(grid=(hq, b, 1), block=(self.threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mPO: cute.Tensor, mPL: cute.Tensor, mLens: cute.Tensor, mQG: cute.Tensor,
               mOut: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        head, seq, _ = cute.arch.block_idx()
        grp = tidx // 64
        col = tidx % 64
        warps = self.threads // 32
        cute.arch.griddepcontrol_wait()  # PDL: launched early, wait here for the previous kernel
        cute.arch.griddepcontrol_launch_dependents()
        _, _, used = _pages(mLens[seq], cute.size(mPL, mode=[2]), 0)

        smem = cutlass.memory.SmemAllocator()
        sTop = smem.allocate_tensor(cutlass.Float32, cute.make_layout((warps,)), byte_alignment=16)
        sAcc = smem.allocate_tensor(cutlass.Float32, cute.make_layout((self.groups, HEAD_DIM), stride=(HEAD_DIM, 1)),
                                    byte_alignment=16)
        sW = smem.allocate_tensor(cutlass.Float32, cute.make_layout((self.groups,)), byte_alignment=16)

        # M = max lse over the used splits (every thread reads a strided share, then a block max).
        top = cutlass.Float32(NEG_INF)
        for s in cutlass.range(tidx, used, self.threads, unroll=1):
            top = cute.math.max(top, mPL[seq, head, s])
        top = _warp_max(top)
        if tidx % 32 == 0:
            sTop[tidx // 32] = top
        cute.arch.sync_threads()
        top = sTop[0]
        for w in cutlass.range_constexpr(1, warps):
            top = cute.math.max(top, sTop[w])

        rAcc = cute.make_rmem_tensor((4,), cutlass.Float32)
        rAcc.fill(0.0)
        rO = cute.make_rmem_tensor((4,), cutlass.Float32)
        rOs = cute.make_rmem_tensor((4, self.unroll), cutlass.Float32)
        rL = cute.make_rmem_tensor((self.unroll,), cutlass.Float32)
        wsum = cutlass.Float32(0.0)
        # `unroll` splits per step, all loads first (indices clamped to the last used split, so no
        # branch separates them), then their weights (0 past the used splits).
        U = self.unroll
        for s0 in cutlass.range(grp, used, self.groups * U, unroll=1):
            for u in cutlass.range_constexpr(U):
                sc = cutlass.min(s0 + u * self.groups, used - 1)
                rL[u] = mPL[seq, head, sc]
                cute.autovec_copy(cute.zipped_divide(mPO[seq, head, sc, None], (4,))[None, col], rOs[None, u])
            for u in cutlass.range_constexpr(U):
                w = cute.math.exp2(rL[u] - top, fastmath=False)
                if s0 + u * self.groups >= used:
                    w = cutlass.Float32(0.0)
                wsum = wsum + w
                rAcc.store(rAcc.load() + rOs[None, u].load() * w)
        cute.autovec_copy(rAcc, cute.zipped_divide(sAcc[grp, None], (4,))[None, col])
        if col == 0:
            sW[grp] = wsum
        cute.arch.sync_threads()

        if grp == 0:
            for g in cutlass.range_constexpr(1, self.groups):
                cute.autovec_copy(cute.zipped_divide(sAcc[g, None], (4,))[None, col], rO)
                rAcc.store(rAcc.load() + rO.load())
                wsum = wsum + sW[g]
            rG = cute.make_rmem_tensor((4,), cutlass.BFloat16)
            cute.autovec_copy(cute.zipped_divide(mQG[seq, None], (4,))[None, (head * 2 + 1) * 64 + col], rG)
            gate = 1.0 / (cute.math.exp2(rG.load().to(cutlass.Float32) * -LOG2E, fastmath=False) + 1.0)
            # wsum >= 1 when a split was used (the largest lse contributes 1); an idle lane writes 0.
            wsum = cute.math.max(wsum, cutlass.Float32(1.0))
            rY = cute.make_rmem_tensor((4,), cutlass.BFloat16)
            rY.store((rAcc.load() / wsum * gate).to(cutlass.BFloat16))
            cute.autovec_copy(rY, cute.zipped_divide(mOut[seq, None], (4,))[None, head * 64 + col])
