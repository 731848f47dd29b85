"""Gated attention decode over the paged KV cache: split-K partials, then a gated combine.

AttnDecodeMma (the default: QK^T and PV on tensor cores, see its docstring), AttnDecodeFused (the
same with attn_prep's q/k norm + RoPE and the K/V append folded in), AttnDecodePipelined (the
previous default) and AttnDecode (the one before, kept as a baseline): one CTA per
(split s, kv head g, sequence b), 8 warps. The sequence's n = cdiv(lens[b], 64) pages are
cut into S splits of pps = cdiv(n, S) pages; CTA s walks pages s*pps .. min(n, (s+1)*pps) - 1 in
blocks of T tokens (CTAs past the end do nothing). The G query heads of kv head g share every K/V
read, so each KV byte is read once. AttnDecodePipelined and AttnDecode, per block:

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

AttnCombine (AttnCombineOnline, the default, in one pass): one CTA per (query head, sequence)
merges the used splits,

    o = sum_s 2^(lse_s - M) part_o_s / sum_s 2^(lse_s - M),   M = max_s lse_s,

(groups of 64 threads take every groups-th split and meet in smem), multiplies by sigmoid(gate[b, h, :])
(a [B, Hq, 256] view with dynamic row and head strides: the gate projection where its GEMV wrote
it) and writes bf16 out[b, h*256 : (h+1)*256].
lens[b] = 0 marks an idle batch lane: no CTA works on it and its output is 0.
"""

import math

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warp

from cute_kernels.sums import load_bf16, zero_f32

HEAD_DIM = 256
PAGE = 64
VEC = 8  # bf16 per 16-byte load
CHUNKS = HEAD_DIM // VEC  # 32 chunks per row
WARPS = 8
PRE_WAIT = 1  # fused decode: KV blocks issued before griddepcontrol.wait (the rest after q, k and v's loads)
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


def _rows_cols(t: cute.Tensor) -> cute.Tensor:
    """An mma.sync C fragment ((2, 2), MMA_M, MMA_N) viewed as [rows, cols] of this thread (rows g and
    g + 8 of each m16 tile, two adjacent columns of each n8 tile)."""
    lay = cute.make_layout(t.layout.shape)
    rc = cute.make_layout(((lay.shape[0][1], lay.shape[1]), (lay.shape[0][0], lay.shape[2])),
                          stride=((lay.stride[0][1], lay.stride[1]), (lay.stride[0][0], lay.stride[2])))
    return cute.make_tensor(t.iterator, cute.composition(t.layout, rc))


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


M_ROWS = 16  # mma.sync M: row h < G holds bf16 hi(q_h) (and P_h), row 8 + h the bf16 remainder lo
Q_STRIDE = HEAD_DIM + 8  # bf16 q rows 528 bytes apart: ldmatrix rows hit distinct 16-byte bank slots
P_STRIDE = 40  # bf16 P rows 80 bytes apart (same reason)
D_PARTS = 4  # QK: the 256 dims in 4 quarters of 64, one per warp pair


class AttnDecodeMma:
    """Split-K decode attention partials on tensor cores (mma.sync m16n8k16, bf16 in, fp32 acc).

    Same grid, work split, K/V pipeline (`stages` cp.async stages of 32 tokens, default two, all
    issued up front and each refilled with block i + stages as soon as block i is done;
    128B-swizzled so that ldmatrix is conflict-free; rows past lens zero-filled) and outputs as
    `AttnDecodePipelined`. The m16 A operand holds head h < G in row h as bf16 hi and in row 8 + h
    as the bf16 remainder lo (rows 8..15 would be padding anyway), for q once per CTA (kept as
    fragments) and for P every block, so q and P keep ~16 significant bits at no extra mma.
    Per block of 32 tokens:

        1. S = Q K^T: warp w computes the 16 x 16 tile of tokens 16 (w % 2).. and dims quarter
           w // 2 (4 k-steps, K fragments by ldmatrix from the stage), adds rows g and g + 8 (hi
           and lo, same thread) and writes its 8 x 16 partial scores to smem.
        2. Online softmax (base 2, fp32): warp h < G sums the 4 quarters of head h's 32 scores,
           scales by scale * log2 e, masks tokens past lens, updates m and l (fp32 p) and writes
           P = exp2(s - m) as bf16 hi / lo rows to smem.
        3. O = alpha O + P V: warps 2p and 2p + 1 share the 64 dims 64p.. (one swizzle atom column
           of V), warp 2p + j owning their n8 tiles j, j + 2, j + 4, j + 6 (acc 16 x 32 fp32, 16
           registers per thread; a 2-warp tiled MMA splits them), P by ldmatrix, V^T by
           ldmatrix.trans from the stage (2 k-steps).

    No cross-warp reduction of O: each warp writes its own dims of part_o = (O[h] + O[8 + h]) / l.
    Smem sub-tiles are only ever sliced at whole swizzle atoms: the CuTe DSL (4.8.1) lowers a slice
    inside an atom with its offset counted twice (tests/test_kernels_attn_ptx.py checks the PTX)."""

    def __init__(self, group: int, block: int = 32, ctas_per_sm: int = 2, stages: int = 2):
        if not 1 <= group <= WARPS:
            raise ValueError(f"group must be 1..{WARPS} (one softmax warp per query head)")
        if block != 32:
            raise ValueError("block must be 32 tokens (2 token halves x 4 dim quarters = 8 warps)")
        if not 2 <= stages <= 4:
            raise ValueError("stages must be 2..4")
        self.group = group
        self.block = block
        self.ctas_per_sm = ctas_per_sm
        self.stages = stages
        self.fused = False  # AttnDecodeFused: q/k norm + RoPE and the K/V append in the same kernel

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mLens: cute.Tensor, mPT: cute.Tensor, mKV: cute.Tensor,
                 mPO: cute.Tensor, mPL: cute.Tensor, scale: cutlass.Float32, stream: cuda.CUstream):
        splits = cute.size(mPL, mode=[2])
        hkv = cute.size(mQ, mode=[1]) // self.group
        b = cute.size(mQ, mode=[0])
        sKV_layout, g2s, tiled_mma, tiled_mma_o, storage = self._plan()
        self.kernel(mQ, mLens, mPT, mKV, mPO, mPL, scale, sKV_layout, g2s, tiled_mma, tiled_mma_o, storage).launch(
            grid=(splits, hkv, b), block=(THREADS, 1, 1), stream=stream,
            min_blocks_per_mp=self.ctas_per_sm, preferred_smem_carveout=-1,
        )

    def _plan(self):
        """The stage layout, the copy and MMA atoms and the shared-memory struct (traced in __call__)."""
        T = self.block
        dt = cutlass.BFloat16
        # 8 rows x 64 columns (128 bytes) per swizzle atom; [token, dim, stage].
        atom = cute.make_composed_layout(cute.make_swizzle(3, 3, 3), 0, cute.make_layout((8, 64), stride=(64, 1)))
        sKV_layout = cute.tile_to_shape(atom, (T, HEAD_DIM, self.stages), (0, 1, 2))
        kv_elems = cute.cosize(sKV_layout)

        @cute.struct
        class SharedStorage:
            sK: cute.struct.Align[cute.struct.MemRange[dt, kv_elems], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, kv_elems], 1024]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, M_ROWS * Q_STRIDE], 16]
            sP: cute.struct.Align[cute.struct.MemRange[dt, M_ROWS * P_STRIDE], 16]
            sS: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, D_PARTS * WARPS * T], 16]
            sAlpha: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, WARPS], 16]
            sM: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, WARPS], 16]
            sL: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, WARPS], 16]

        @cute.struct
        class FusedStorage:  # + the new token's K and V rows (bf16) before they go into their stage
            sK: cute.struct.Align[cute.struct.MemRange[dt, kv_elems], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, kv_elems], 1024]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, M_ROWS * Q_STRIDE], 16]
            sP: cute.struct.Align[cute.struct.MemRange[dt, M_ROWS * P_STRIDE], 16]
            sS: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, D_PARTS * WARPS * T], 16]
            sAlpha: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, WARPS], 16]
            sM: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, WARPS], 16]
            sL: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, WARPS], 16]
            sNew: cute.struct.Align[cute.struct.MemRange[dt, 2 * HEAD_DIM], 16]

        # 16-byte cp.async: 8 threads span one 128-byte atom row, 32 rows per pass.
        g2s = cute.make_tiled_copy_tv(
            cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dt, num_bits_per_copy=128),
            cute.make_layout((THREADS // 8, 8), stride=(8, 1)), cute.make_layout((1, 8)))
        # QK: one warp per tiled MMA, every warp on its own sub-tile (whole swizzle atoms apart).
        tiled_mma = cute.make_tiled_mma(warp.MmaF16BF16Op(dt, cutlass.Float32, (16, 8, 16)), (1, 1, 1),
                                        permutation_mnk=(16, 16, 16))
        # PV: a warp pair shares one 64-dim atom column of V, split by the thread partition (warp
        # 2p + j gets the n8 tiles j, j + 2, ..), never by slicing inside a swizzle atom (see _attend).
        tiled_mma_o = cute.make_tiled_mma(warp.MmaF16BF16Op(dt, cutlass.Float32, (16, 8, 16)), (1, 2, 1),
                                          permutation_mnk=(16, 64, 16))
        return sKV_layout, g2s, tiled_mma, tiled_mma_o, FusedStorage if self.fused else SharedStorage

    @cute.jit
    def _issue(self, g2s: cute.TiledCopy, mKV: cute.Tensor, sK: cute.Tensor, sV: cute.Tensor, coord: cute.Tensor,
               stage, page, blk, length, hkv, kvh, tidx):
        """cp.async the K and V rows < length of block `blk` (in page `page`) into stage `stage`;
        the other rows of the stage are zero-filled (a V row times P = 0 must not be NaN). Fused:
        the new token's row (length - 1) is neither copied nor filled (`_attend` writes it)."""
        T = self.block
        per_page = PAGE // T
        valid = length - blk * T
        cached = valid - 1 if self.fused else valid  # rows read from the pool
        thr = g2s.get_slice(tidx)
        tile_k = (page * 2 * hkv + kvh) * per_page + blk % per_page  # K rows of the block / T
        for kv in cutlass.range_constexpr(2):
            src = thr.partition_S(cute.local_tile(mKV, (T, HEAD_DIM), (tile_k + kv * hkv * per_page, 0)))
            dst = thr.partition_D((sK, sV)[kv][None, None, stage])
            for m in cutlass.range_constexpr(cute.size(dst.shape[1])):
                if coord[0, m, 0][0] < cached:
                    cute.copy(g2s, src[None, m, None], dst[None, m, None])
                else:
                    if coord[0, m, 0][0] >= valid:
                        dst[None, m, None].fill(0)

    @cute.jit
    def _prologue(self, g2s: cute.TiledCopy, mPT: cute.Tensor, mKV: cute.Tensor, sK: cute.Tensor, sV: cute.Tensor,
                  coord: cute.Tensor, p_begin, b_begin, b_end, length, hkv, kvh, seq, tidx, first: int = 0,
                  last: int | None = None):
        """Blocks b_begin + first .. b_begin + last - 1 (default: the stages' blocks) go out first, one
        commit group each (an empty group past the last block, so that group i always holds block
        b_begin + i)."""
        per_page = PAGE // self.block
        if cutlass.const_expr(first == 0):
            self._issue(g2s, mKV, sK, sV, coord, 0, mPT[seq, p_begin], b_begin, length, hkv, kvh, tidx)
            cute.arch.cp_async_commit_group()
        for st in cutlass.range_constexpr(max(first, 1), self.stages if last is None else last):
            if b_begin + st < b_end:
                self._issue(g2s, mKV, sK, sV, coord, st, mPT[seq, (b_begin + st) // per_page], b_begin + st,
                            length, hkv, kvh, tidx)
            cute.arch.cp_async_commit_group()

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mLens: cute.Tensor, mPT: cute.Tensor, mKV: cute.Tensor,
               mPO: cute.Tensor, mPL: cute.Tensor, scale: cutlass.Float32, sKV_layout: cute.ComposedLayout,
               g2s: cute.TiledCopy, tiled_mma: cute.TiledMma, tiled_mma_o: cute.TiledMma,
               SharedStorage: cutlass.Constexpr):
        dt = cutlass.BFloat16
        tidx, _, _ = cute.arch.thread_idx()
        split, kvh, seq = cute.arch.block_idx()
        G, T = self.group, self.block
        hkv = cute.size(mQ, mode=[1]) // G
        cute.arch.griddepcontrol_wait()  # PDL: launched early, wait here for the previous kernel
        cute.arch.griddepcontrol_launch_dependents()
        length = mLens[seq]
        p_begin, p_end, _ = _pages(length, cute.size(mPL, mode=[2]), split)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sK = storage.sK.get_tensor(sKV_layout)  # [token, dim, stage]
        sV = storage.sV.get_tensor(sKV_layout)
        sQ = storage.sQ.get_tensor(cute.make_layout((M_ROWS, HEAD_DIM), stride=(Q_STRIDE, 1)))

        if p_begin < p_end:
            b_begin = p_begin * (PAGE // T)
            b_end = cutlass.min(p_end * (PAGE // T), (length + T - 1) // T)
            coord = g2s.get_slice(tidx).partition_S(cute.make_identity_tensor((T, HEAD_DIM)))
            self._prologue(g2s, mPT, mKV, sK, sV, coord, p_begin, b_begin, b_end, length, hkv, kvh, seq, tidx)

            # q_h = hi + lo: bf16 hi in row h, the bf16 rounding of q - hi in row 8 + h (rows of heads
            # >= G zero), so S row h + S row 8 + h is q . k to ~2^-17 relative.
            rq = cute.make_rmem_tensor((1,), cutlass.Float32)
            rb = cute.make_rmem_tensor((1,), dt)
            for h in cutlass.range_constexpr(WARPS):
                if cutlass.const_expr(h < G):
                    rq[0] = mQ[seq, kvh * G + h, tidx]
                else:
                    rq[0] = cutlass.Float32(0.0)
                rb.store(rq.load().to(dt))
                sQ[h, tidx] = rb[0]
                rq.store(rq.load() - rb.load().to(cutlass.Float32))
                rb.store(rq.load().to(dt))
                sQ[WARPS + h, tidx] = rb[0]
            self._attend(mPT, mKV, mPO, mPL, storage, sKV_layout, g2s, tiled_mma, tiled_mma_o, coord, b_begin,
                         b_end, length, hkv, kvh, seq, split, scale, tidx, -1)

    @cute.jit
    def _attend(self, mPT: cute.Tensor, mKV: cute.Tensor, mPO: cute.Tensor, mPL: cute.Tensor, storage,
                sKV_layout: cute.ComposedLayout, g2s: cute.TiledCopy, tiled_mma: cute.TiledMma,
                tiled_mma_o: cute.TiledMma, coord: cute.Tensor, b_begin, b_end, length, hkv, kvh, seq, split,
                scale, tidx, new_blk):
        """The block loop of a CTA whose q (hi and lo rows) is in sQ and whose first `stages` blocks are
        issued, then its part_o / part_lse. Fused: block `new_blk` gets the new token's K and V row
        from sNew (written before the first barrier here)."""
        dt = cutlass.BFloat16
        wid = tidx // 32
        lane = tidx % 32
        G, T = self.group, self.block
        per_page = PAGE // T
        sK = storage.sK.get_tensor(sKV_layout)  # [token, dim, stage]
        sV = storage.sV.get_tensor(sKV_layout)
        sVt = cute.composition(sV, cute.make_layout((HEAD_DIM, T, self.stages),
                                                    stride=(T, 1, T * HEAD_DIM)))  # [dim, token, stage]
        sQ = storage.sQ.get_tensor(cute.make_layout((M_ROWS, HEAD_DIM), stride=(Q_STRIDE, 1)))
        sP = storage.sP.get_tensor(cute.make_layout((M_ROWS, T), stride=(P_STRIDE, 1)))
        sS = storage.sS.get_tensor(cute.make_layout((D_PARTS, WARPS, T), stride=(WARPS * T, T, 1)))
        sAlpha = storage.sAlpha.get_tensor(cute.make_layout((WARPS,)))
        sM = storage.sM.get_tensor(cute.make_layout((WARPS,)))
        sL = storage.sL.get_tensor(cute.make_layout((WARPS,)))

        # P rows of heads >= G stay zero and their alpha 1.
        rb = cute.make_rmem_tensor((1,), dt)
        rb[0] = cutlass.BFloat16(0.0)
        for h in cutlass.range_constexpr(G, WARPS):
            if tidx < T:
                sP[h, tidx] = rb[0]
                sP[WARPS + h, tidx] = rb[0]
        if tidx < WARPS:
            sAlpha[tidx] = cutlass.Float32(1.0)
        cute.arch.sync_threads()

        thr_mma = tiled_mma.get_slice(lane)
        ld_a = cute.make_tiled_copy_A(cute.make_copy_atom(warp.LdMatrix8x8x16bOp(False, 4), dt), tiled_mma)
        ld_b = cute.make_tiled_copy_B(cute.make_copy_atom(warp.LdMatrix8x8x16bOp(False, 4), dt), tiled_mma)
        thr_ld_a, thr_ld_b = (c.get_slice(lane) for c in (ld_a, ld_b))
        pair_t = tidx % 64  # thread of the PV warp pair
        thr_mma_o = tiled_mma_o.get_slice(pair_t)
        ld_p = cute.make_tiled_copy_A(cute.make_copy_atom(warp.LdMatrix8x8x16bOp(False, 4), dt), tiled_mma_o)
        ld_vt = cute.make_tiled_copy_B(cute.make_copy_atom(warp.LdMatrix8x8x16bOp(True, 4), dt), tiled_mma_o)
        thr_ld_p, thr_ld_vt = (c.get_slice(pair_t) for c in (ld_p, ld_vt))

        # QK: this warp's tokens half and dims quarter; its q fragments stay in registers.
        tq = wid % 2
        dq = wid // 2
        sQw = cute.local_tile(sQ, (M_ROWS, HEAD_DIM // D_PARTS), (0, dq))
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQw))
        cute.copy(ld_a, thr_ld_a.partition_S(sQw), thr_ld_a.retile(tSrQ))
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(
            cute.local_tile(sK[None, None, 0], (16, HEAD_DIM // D_PARTS), (tq, dq))))
        acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((M_ROWS, 16)), cutlass.Float32)
        acc_S_rc = _rows_cols(acc_S)  # [(row g, row g + 8), cols]: hi and lo of one head, one thread
        tScS = _rows_cols(thr_mma.partition_C(cute.make_identity_tensor((M_ROWS, 16))))
        # PV: this warp's 32 of the 64 dims (atom column wid // 2) of its pair.
        tOrP = thr_mma_o.make_fragment_A(thr_mma_o.partition_A(sP))
        tOrVt = thr_mma_o.make_fragment_B(thr_mma_o.partition_B(
            cute.local_tile(sVt[None, None, 0], (64, T), (wid // 2, 0))))
        acc_O = cute.make_rmem_tensor(thr_mma_o.partition_shape_C((M_ROWS, 64)), cutlass.Float32)
        acc_O.fill(0.0)
        acc_O_rc = _rows_cols(acc_O)
        tOcO = _rows_cols(thr_mma_o.partition_C(cute.make_identity_tensor((M_ROWS, 64))))
        rp = cute.make_rmem_tensor((1,), cutlass.Float32)
        rpb = cute.make_rmem_tensor((1,), dt)

        scale_log2 = scale * LOG2E
        m_run = cutlass.Float32(NEG_INF)
        l_run = cutlass.Float32(0.0)
        for blk in cutlass.range(b_begin, b_end, 1, unroll=1):
            stage = (blk - b_begin) % self.stages
            valid = length - blk * T
            page_next = mPT[seq, cutlass.min(blk + self.stages, b_end - 1) // per_page]
            cute.arch.cp_async_wait_group(self.stages - 1)  # block blk landed (later ones may be in flight)
            if cutlass.const_expr(self.fused):
                if blk == new_blk:  # the new token's row, skipped by _issue: from sNew, one dim per thread
                    sNew = storage.sNew.get_tensor(cute.make_layout((2, HEAD_DIM), stride=(HEAD_DIM, 1)))
                    sK[length - 1 - blk * T, tidx, stage] = sNew[0, tidx]
                    sV[length - 1 - blk * T, tidx, stage] = sNew[1, tidx]
            cute.arch.sync_threads()

            # 1. Partial S of this warp's 16 tokens over its 64 dims.
            sKw = cute.local_tile(sK[None, None, stage], (16, HEAD_DIM // D_PARTS), (tq, dq))
            cute.copy(ld_b, thr_ld_b.partition_S(sKw), thr_ld_b.retile(tSrK))
            acc_S.fill(0.0)
            for k in cutlass.range_constexpr(cute.size(tSrK.shape[2])):
                cute.gemm(tiled_mma, acc_S, tSrQ[None, None, k], tSrK[None, None, k], acc_S)
            for c in cutlass.range_constexpr(cute.size(acc_S_rc, mode=[1])):
                sS[dq, tScS[0, c][0], tq * 16 + tScS[0, c][1]] = acc_S_rc[0, c] + acc_S_rc[1, c]
            cute.arch.sync_threads()

            # 2. Online softmax (base 2), warp h < G for head h, lane = token.
            if wid < G:
                s = sS[0, wid, lane]
                for part in cutlass.range_constexpr(1, D_PARTS):
                    s = s + sS[part, wid, lane]
                s = s * scale_log2
                if lane >= valid:
                    s = cutlass.Float32(NEG_INF)
                m_new = cute.math.max(m_run, _warp_max(s))
                alpha = cute.math.exp2(m_run - m_new, fastmath=True)
                p = cute.math.exp2(s - m_new, fastmath=True)
                rp[0] = p
                rpb.store(rp.load().to(dt))  # P = hi + lo as for q: rows h and 8 + h
                sP[wid, lane] = rpb[0]
                rp.store(rp.load() - rpb.load().to(cutlass.Float32))
                rpb.store(rp.load().to(dt))
                sP[WARPS + wid, lane] = rpb[0]
                l_run = l_run * alpha + _warp_sum(p)
                m_run = m_new
                if lane == 0:
                    sAlpha[wid] = alpha
            cute.arch.sync_threads()

            # 3. O = alpha O + P V over this warp's 32 dims.
            cute.copy(ld_p, thr_ld_p.partition_S(sP), thr_ld_p.retile(tOrP))
            # The pair's atom column: a slice whole swizzle atoms in; the warp's tiles come from
            # the thread partition. A slice inside an atom (local_tile (32, T) at (wid, 0), dynamic
            # or static) reaches ldmatrix with its offset counted twice, once through the swizzle
            # and once more on the pointer (CuTe DSL 4.8.1, seen in the PTX): odd warps read
            # the wrong V rows.
            sVa = cute.local_tile(sVt[None, None, stage], (64, T), (wid // 2, 0))
            cute.copy(ld_vt, thr_ld_vt.partition_S(sVa), thr_ld_vt.retile(tOrVt))
            alpha_g = sAlpha[tOcO[0, 0][0]]  # rows g and g + 8 are one head's hi and lo parts
            for i in cutlass.range_constexpr(cute.size(acc_O)):
                acc_O[i] = acc_O[i] * alpha_g
            for k in cutlass.range_constexpr(cute.size(tOrP.shape[2])):
                cute.gemm(tiled_mma_o, acc_O, tOrP[None, None, k], tOrVt[None, None, k], acc_O)

            # Every warp is done with this stage (and sP, sAlpha): block blk + stages goes there.
            cute.arch.sync_threads()
            if blk + self.stages < b_end:
                self._issue(g2s, mKV, sK, sV, coord, stage, page_next, blk + self.stages, length, hkv, kvh, tidx)
            cute.arch.cp_async_commit_group()

        # part_o = O / l straight from the accumulators (rows < G), part_lse = m + log2 l.
        if wid < G:
            if lane == 0:
                sM[wid] = m_run
                sL[wid] = l_run
        cute.arch.sync_threads()
        row = tOcO[0, 0][0]
        if row < G:
            inv_l = 1.0 / sL[row]
            for c in cutlass.range_constexpr(cute.size(acc_O_rc, mode=[1])):
                dim = (wid // 2) * 64 + tOcO[0, c][1]
                mPO[seq, kvh * G + row, split, dim] = (acc_O_rc[0, c] + acc_O_rc[1, c]) * inv_l
        if tidx < G:
            mPL[seq, kvh * G + tidx, split] = sM[tidx] + cute.math.log2(sL[tidx], fastmath=False)


def _norm_rope(rX: cute.Tensor, rW: cute.Tensor, rCos: cute.Tensor, rSin: cute.Tensor, eps, partner_lanes: int,
               rY: cute.Tensor):
    """rY = rope(rmsnorm(rX; rW)) for one head held by a warp, 8 dims per lane (as AttnQkPrep): the
    zero-centred RMSNorm is one warp reduction; RoPE pairs lane l with lane l ^ partner_lanes, with
    the rotate-half sign folded into rSin (cos 1, sin 0 on lanes without rotary dims)."""
    x = rX.load().to(cutlass.Float32)
    ss = _warp_sum((x * x).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0))
    scale = cute.math.rsqrt(ss / HEAD_DIM + eps, fastmath=False)
    rY.store(x * scale * (rW.load().to(cutlass.Float32) + 1.0))
    for e in range(VEC):  # unrolled at trace time
        partner = cute.arch.shuffle_sync_bfly(rY[e], offset=partner_lanes)
        rY[e] = rY[e] * rCos[e] + partner * rSin[e]


class AttnDecodeFused(AttnDecodeMma):
    """`AttnDecodeMma` with the decode prep folded in: one launch from the q/k/v projections to the
    split-K partials (`attn_qk_prep` and the fp32 q scratch round trip are gone).

    Before `griddepcontrol.wait` (nothing there is written by the previous kernels: lens, the page
    table and positions come from the step buffer the host fills before the graph, the cache rows
    < lens - 1 from earlier steps) each CTA reads lens and its pages, issues its first `stages` K/V
    blocks, loads q_norm / k_norm and computes the RoPE cos / sin of the position. After it:

      * warp h < G normalises and RoPEs q head kvh * G + h from q_proj (lane l: dims 8l..8l+7, as
        AttnQkPrep) into the hi / lo rows of sQ; the split-0 CTA also writes it (fp32) to `q`.
      * the CTA of the last used split (the one whose pages hold token lens - 1) appends the new
        token: warp 7 normalises + RoPEs k, warp 6 takes v; both go to the cache row (bf16, as prep)
        and to sNew. Its K/V block copies skip that row, and `_attend` writes it into the stage from
        sNew, so no CTA reads the row from global memory in the step that writes it.

    Then the block loop and outputs of `AttnDecodeMma`. lens = 0: q is still computed (split 0
    writes it), nothing is cached and no split is used.

    `sums`: q_proj, k and v are fp32, the sums an accumulating projection GEMV left (a deferred epilogue),
    rounded to bf16 as its epilogue would round them; the combine zeroes them (every split reads q)."""

    def __init__(self, group: int, block: int = 32, ctas_per_sm: int = 2, stages: int = 2, rotary: int = 64,
                 sums: bool = False):
        super().__init__(group, block, ctas_per_sm, stages)
        if rotary not in (16, 32, 64, 128, 256):
            raise ValueError("rotary must be a power of two between 16 and 256")
        self.sums = sums
        self.fused = True
        self.rotary = rotary
        self.rot_lanes = rotary // VEC  # lanes holding rotary dims
        self.half_lanes = self.rot_lanes // 2  # butterfly distance to the rotate_half partner

    @cute.jit
    def __call__(self, mQP: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mQNorm: cute.Tensor,
                 mKNorm: cute.Tensor, mPos: cute.Tensor, mLens: cute.Tensor, mPT: cute.Tensor, mKV: cute.Tensor,
                 mQ: cute.Tensor, mPO: cute.Tensor, mPL: cute.Tensor, scale: cutlass.Float32, eps: cutlass.Float32,
                 theta: cutlass.Float32, stream: cuda.CUstream):
        splits = cute.size(mPL, mode=[2])
        hkv = cute.size(mQ, mode=[1]) // self.group
        b = cute.size(mQ, mode=[0])
        sKV_layout, g2s, tiled_mma, tiled_mma_o, storage = self._plan()
        self.kernel(mQP, mK, mV, mQNorm, mKNorm, mPos, mLens, mPT, mKV, mQ, mPO, mPL, scale, eps, theta, sKV_layout,
                    g2s, tiled_mma, tiled_mma_o, storage).launch(
            grid=(splits, hkv, b), block=(THREADS, 1, 1), stream=stream,
            min_blocks_per_mp=self.ctas_per_sm, preferred_smem_carveout=-1,
        )

    @cute.kernel
    def kernel(self, mQP: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mQNorm: cute.Tensor,
               mKNorm: cute.Tensor, mPos: cute.Tensor, mLens: cute.Tensor, mPT: cute.Tensor, mKV: cute.Tensor,
               mQ: cute.Tensor, mPO: cute.Tensor, mPL: cute.Tensor, scale: cutlass.Float32, eps: cutlass.Float32,
               theta: cutlass.Float32, sKV_layout: cute.ComposedLayout, g2s: cute.TiledCopy,
               tiled_mma: cute.TiledMma, tiled_mma_o: cute.TiledMma, SharedStorage: cutlass.Constexpr):
        dt = cutlass.BFloat16
        f32 = cutlass.Float32
        tidx, _, _ = cute.arch.thread_idx()
        split, kvh, seq = cute.arch.block_idx()
        wid = tidx // 32
        lane = tidx % 32
        G, T = self.group, self.block
        hkv = cute.size(mQ, mode=[1]) // G

        # --- before the PDL wait: only what the previous kernels do not write ---
        length = mLens[seq]
        p_begin, p_end, used = _pages(length, cute.size(mPL, mode=[2]), split)
        slot = cutlass.max(length - 1, 0)  # the new token's cache row
        slot_page = mPT[seq, slot // PAGE]
        b_begin = p_begin * (PAGE // T)
        b_end = cutlass.min(p_end * (PAGE // T), (length + T - 1) // T)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sK = storage.sK.get_tensor(sKV_layout)  # [token, dim, stage]
        sV = storage.sV.get_tensor(sKV_layout)
        sQ = storage.sQ.get_tensor(cute.make_layout((M_ROWS, HEAD_DIM), stride=(Q_STRIDE, 1)))
        sNew = storage.sNew.get_tensor(cute.make_layout((2, HEAD_DIM), stride=(HEAD_DIM, 1)))
        coord = g2s.get_slice(tidx).partition_S(cute.make_identity_tensor((T, HEAD_DIM)))
        if p_begin < p_end:  # PRE_WAIT blocks; the rest once q, k and v's loads are issued
            self._prologue(g2s, mPT, mKV, sK, sV, coord, p_begin, b_begin, b_end, length, hkv, kvh, seq, tidx,
                           0, min(PRE_WAIT, self.stages))

        rQW = cute.make_rmem_tensor((VEC,), dt)
        rKW = cute.make_rmem_tensor((VEC,), dt)
        cute.autovec_copy(cute.zipped_divide(mQNorm, (VEC,))[None, lane], rQW)
        cute.autovec_copy(cute.zipped_divide(mKNorm, (VEC,))[None, lane], rKW)
        # RoPE of this lane's 8 dims: y cos + partner sin', sin' = -sin on the first half of the
        # rotary lanes (the rotate_half sign), cos 1 and sin' 0 past the rotary dims.
        rCos = cute.make_rmem_tensor((VEC,), f32)
        rSin = cute.make_rmem_tensor((VEC,), f32)
        pos = f32(mPos[seq])
        log2_theta = cute.math.log2(theta, fastmath=False)
        half = self.rotary // 2
        for e in cutlass.range_constexpr(VEC):
            j = (lane * VEC + e) % half
            inv_freq = cute.math.exp2(f32(j) * (-2.0 / self.rotary) * log2_theta, fastmath=False)
            angle = pos * inv_freq
            c = cute.math.cos(angle, fastmath=False)
            s = cute.math.sin(angle, fastmath=False)
            if lane >= self.rot_lanes:
                c = f32(1.0)
                s = f32(0.0)
            if lane < self.half_lanes:
                s = -s
            rCos[e] = c
            rSin[e] = s

        cute.arch.griddepcontrol_wait()  # PDL: q_proj, k and v come from the projection GEMVs
        cute.arch.griddepcontrol_launch_dependents()
        fresh = split == used - 1  # this CTA's pages hold the new token (never true for lens = 0)
        # q, k and v as loaded (fp32 sums or bf16), every load issued before the prologue's rest
        raw = f32 if self.sums else dt
        rXr = cute.make_rmem_tensor((VEC,), raw)
        rNr = cute.make_rmem_tensor((VEC,), raw)
        if wid < G:
            cute.autovec_copy(cute.zipped_divide(mQP[seq, kvh * G + wid, None], (VEC,))[None, lane], rXr)
        if fresh:
            if wid == WARPS - 1:
                cute.autovec_copy(cute.zipped_divide(mK[seq, None], (VEC,))[None, kvh * CHUNKS + lane], rNr)
            if wid == WARPS - 2:
                cute.autovec_copy(cute.zipped_divide(mV[seq, None], (VEC,))[None, kvh * CHUNKS + lane], rNr)
        if cutlass.const_expr(PRE_WAIT < self.stages):  # behind q in the SM's queues, not ahead of it
            cute.arch.sync_warp()  # keeps ptxas from hoisting the copies above the loads
            if p_begin < p_end:
                self._prologue(g2s, mPT, mKV, sK, sV, coord, p_begin, b_begin, b_end, length, hkv, kvh, seq,
                               tidx, PRE_WAIT, self.stages)
        rX = cute.make_rmem_tensor((VEC,), dt)
        rN = cute.make_rmem_tensor((VEC,), dt)
        rX.store(rXr.load().to(dt))  # as a GEMV's epilogue rounds its sums (bf16: unchanged)
        rN.store(rNr.load().to(dt))

        # q_h = hi + lo (as AttnDecodeMma): bf16 hi in row h, the bf16 rounding of q - hi in row 8 + h,
        # rows of heads >= G zero.
        rY = cute.make_rmem_tensor((VEC,), f32)
        rHi = cute.make_rmem_tensor((VEC,), dt)
        rLo = cute.make_rmem_tensor((VEC,), dt)
        rHi.fill(0.0)
        rLo.fill(0.0)
        if wid < G:
            _norm_rope(rX, rQW, rCos, rSin, eps, self.half_lanes, rY)
            if split == 0:
                cute.autovec_copy(rY, cute.zipped_divide(mQ[seq, kvh * G + wid, None], (VEC,))[None, lane])
            rHi.store(rY.load().to(dt))
            rLo.store((rY.load() - rHi.load().to(f32)).to(dt))
        for e in cutlass.range_constexpr(VEC):
            sQ[wid, lane * VEC + e] = rHi[e]
            sQ[WARPS + wid, lane * VEC + e] = rLo[e]

        if fresh:
            row_k = (slot_page * 2 * hkv + kvh) * PAGE + slot % PAGE
            if wid == WARPS - 1:  # k: norm + RoPE, bf16 into the cache (as prep) and sNew
                _norm_rope(rN, rKW, rCos, rSin, eps, self.half_lanes, rY)
                rN.store(rY.load().to(dt))
                cute.autovec_copy(rN, cute.zipped_divide(mKV[row_k, None], (VEC,))[None, lane])
            if wid == WARPS - 2:  # v as projected
                cute.autovec_copy(rN, cute.zipped_divide(mKV[row_k + hkv * PAGE, None], (VEC,))[None, lane])
            if wid >= WARPS - 2:  # sNew row 0 = k (warp 7), row 1 = v (warp 6)
                for e in cutlass.range_constexpr(VEC):
                    sNew[WARPS - 1 - wid, lane * VEC + e] = rN[e]

        if p_begin < p_end:
            new_blk = cutlass.Int32(-1)
            if fresh:
                new_blk = b_end - 1
            self._attend(mPT, mKV, mPO, mPL, storage, sKV_layout, g2s, tiled_mma, tiled_mma_o, coord, b_begin,
                         b_end, length, hkv, kvh, seq, split, scale, tidx, new_blk)


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
    def __call__(self, mPO: cute.Tensor, mPL: cute.Tensor, mLens: cute.Tensor, mGate: cute.Tensor,
                 mOut: cute.Tensor, stream: cuda.CUstream):
        hq = cute.size(mPO, mode=[1])
        b = cute.size(mPO, mode=[0])
        self.kernel(mPO, mPL, mLens, mGate, mOut).launch(grid=(hq, b, 1), block=(self.threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mPO: cute.Tensor, mPL: cute.Tensor, mLens: cute.Tensor, mGate: cute.Tensor,
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
            cute.autovec_copy(cute.zipped_divide(mGate[seq, head, None], (4,))[None, col], rG)
            gate = 1.0 / (cute.math.exp2(rG.load().to(cutlass.Float32) * -LOG2E, fastmath=False) + 1.0)
            # wsum >= 1 when a split was used (the largest lse contributes 1); an idle lane writes 0.
            wsum = cute.math.max(wsum, cutlass.Float32(1.0))
            rY = cute.make_rmem_tensor((4,), cutlass.BFloat16)
            rY.store((rAcc.load() / wsum * gate).to(cutlass.BFloat16))
            cute.autovec_copy(rY, cute.zipped_divide(mOut[seq, None], (4,))[None, head * 64 + col])


class AttnCombineOnline:
    """`AttnCombine` in one pass: no separate sweep for the maximum lse.

    Group g (64 threads x 4 dims) loads `unroll` of its splits g, g + groups, ... at once (their lse
    and o together; indices clamped to the last used split, weights 0 past it) and keeps its own
    running maximum, rescaling its sums when the maximum grows; the groups meet in smem, each
    scaled by 2^(m_g - M) with M the largest group maximum. With 64 used splits and 8 groups of
    8-split loads a thread waits for memory once (plus the lens and gate loads).

    `early`: the lens and gate loads go out before `griddepcontrol.wait` (launched early behind the
    decode kernel, the CTA then waits only for the partials). Only for callers whose lens are not
    written by the kernels just before it (the host's step buffer) and whose gate was written at least
    two launches back (the gate GEMV before the decode kernel).

    `AttnCombineSums` (below) is the same with the gate from an accumulating GEMV's fp32 sums, which it zeroes."""

    sums = False  # AttnCombineSums: the gate fp32, the GEMV's sums zeroed

    def __init__(self, groups: int = 8, unroll: int = 8, early: bool = False):
        if groups not in (1, 2, 4, 8):
            raise ValueError("groups must be 1, 2, 4 or 8")
        self.groups = groups
        self.unroll = unroll
        self.early = early
        self.threads = 64 * groups

    @cute.jit
    def __call__(self, mPO: cute.Tensor, mPL: cute.Tensor, mLens: cute.Tensor, mGate: cute.Tensor,
                 mOut: cute.Tensor, stream: cuda.CUstream):
        hq = cute.size(mPO, mode=[1])
        b = cute.size(mPO, mode=[0])
        self.kernel(mPO, mPL, mLens, mGate, mOut).launch(grid=(hq, b, 1), block=(self.threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mPO: cute.Tensor, mPL: cute.Tensor, mLens: cute.Tensor, mGate: cute.Tensor,
               mOut: cute.Tensor):
        self.body(mPO, mPL, mLens, mGate, mOut, None)

    @cute.jit
    def body(self, mPO: cute.Tensor, mPL: cute.Tensor, mLens: cute.Tensor, mGate: cute.Tensor, mOut: cute.Tensor,
             zero):
        """The kernel; `zero` (sums): (q sums [B, Hq 256], k sums, v sums [B, Hkv 256]) to zero, or None."""
        tidx, _, _ = cute.arch.thread_idx()
        head, seq, _ = cute.arch.block_idx()
        grp = tidx // 64
        col = tidx % 64
        U = self.unroll
        if cutlass.const_expr(not self.early):
            cute.arch.griddepcontrol_wait()  # PDL: launched early, wait here for the previous kernel
            cute.arch.griddepcontrol_launch_dependents()
        rG = cute.make_rmem_tensor((4,), cutlass.BFloat16)
        if grp == 0:  # the gate does not depend on lens: its load goes out first
            load_bf16(cute.zipped_divide(mGate[seq, head, None], (4,))[None, col], rG, self.sums)
        _, _, used = _pages(mLens[seq], cute.size(mPL, mode=[2]), 0)
        if cutlass.const_expr(self.early):
            cute.arch.griddepcontrol_wait()  # the partials come from the decode kernel
            cute.arch.griddepcontrol_launch_dependents()
        if cutlass.const_expr(self.sums):  # everything the projection GEMV left for this layer has been read
            mQs, mKs, mVs = zero
            if grp == 0:  # the gate values this thread loaded
                zero_f32(cute.zipped_divide(mGate[seq, head, None], (4,))[None, col])
            if grp == 1:
                zero_f32(cute.zipped_divide(mQs[seq, None], (4,))[None, head * 64 + col])
            if head < cute.size(mKs, mode=[1]) // HEAD_DIM:
                if grp == 2:
                    zero_f32(cute.zipped_divide(mKs[seq, None], (4,))[None, head * 64 + col])
                if grp == 3:
                    zero_f32(cute.zipped_divide(mVs[seq, None], (4,))[None, head * 64 + col])

        smem = cutlass.memory.SmemAllocator()
        sAcc = smem.allocate_tensor(cutlass.Float32, cute.make_layout((self.groups, HEAD_DIM), stride=(HEAD_DIM, 1)),
                                    byte_alignment=16)
        sW = smem.allocate_tensor(cutlass.Float32, cute.make_layout((self.groups,)), byte_alignment=16)
        sM = smem.allocate_tensor(cutlass.Float32, cute.make_layout((self.groups,)), byte_alignment=16)

        rAcc = cute.make_rmem_tensor((4,), cutlass.Float32)
        rAcc.fill(0.0)
        rO = cute.make_rmem_tensor((4,), cutlass.Float32)
        rOs = cute.make_rmem_tensor((4, U), cutlass.Float32)
        rL = cute.make_rmem_tensor((U,), cutlass.Float32)
        wsum = cutlass.Float32(0.0)
        m_grp = cutlass.Float32(NEG_INF)
        for s0 in cutlass.range(grp, used, self.groups * U, unroll=1):
            for u in cutlass.range_constexpr(U):
                sc = cutlass.min(s0 + u * self.groups, used - 1)
                rL[u] = mPL[seq, head, sc]
                cute.autovec_copy(cute.zipped_divide(mPO[seq, head, sc, None], (4,))[None, col], rOs[None, u])
            # Clamped indices repeat a used split, so the plain maximum is the maximum of the used ones.
            m_new = m_grp
            for u in cutlass.range_constexpr(U):
                m_new = cute.math.max(m_new, rL[u])
            c = cute.math.exp2(m_grp - m_new, fastmath=False)  # 0 on the first step (m_grp = -inf)
            wsum = wsum * c
            rAcc.store(rAcc.load() * c)
            for u in cutlass.range_constexpr(U):
                w = cute.math.exp2(rL[u] - m_new, fastmath=False)
                if s0 + u * self.groups >= used:
                    w = cutlass.Float32(0.0)
                wsum = wsum + w
                rAcc.store(rAcc.load() + rOs[None, u].load() * w)
            m_grp = m_new
        cute.autovec_copy(rAcc, cute.zipped_divide(sAcc[grp, None], (4,))[None, col])
        if col == 0:
            sW[grp] = wsum
            sM[grp] = m_grp
        cute.arch.sync_threads()

        if grp == 0:
            top = sM[0]
            for g in cutlass.range_constexpr(1, self.groups):
                top = cute.math.max(top, sM[g])
            if top == NEG_INF:  # an idle lane (no split used): every group weight below is 0
                top = cutlass.Float32(0.0)
            f = cute.math.exp2(sM[0] - top, fastmath=False)
            rAcc.store(rAcc.load() * f)
            wsum = wsum * f
            for g in cutlass.range_constexpr(1, self.groups):
                f = cute.math.exp2(sM[g] - top, fastmath=False)  # 0 for a group without splits
                cute.autovec_copy(cute.zipped_divide(sAcc[g, None], (4,))[None, col], rO)
                rAcc.store(rAcc.load() + rO.load() * f)
                wsum = wsum + sW[g] * f
            gate = 1.0 / (cute.math.exp2(rG.load().to(cutlass.Float32) * -LOG2E, fastmath=False) + 1.0)
            # wsum >= 1 when a split was used (the largest lse contributes 1); an idle lane writes 0.
            wsum = cute.math.max(wsum, cutlass.Float32(1.0))
            rY = cute.make_rmem_tensor((4,), cutlass.BFloat16)
            rY.store((rAcc.load() / wsum * gate).to(cutlass.BFloat16))
            cute.autovec_copy(rY, cute.zipped_divide(mOut[seq, None], (4,))[None, head * 64 + col])


class AttnCombineSums(AttnCombineOnline):
    """`AttnCombineOnline` (early) after an accumulating projection GEMV: the gate is fp32, that GEMV's sums
    (rounded to bf16 as its epilogue would round them), and once the PDL wait returns (the decode kernel, the
    reader of q, k and v, has completed) the CTA of head h zeroes what the GEMV left for this layer: its gate (by
    the threads that loaded it), q head h, and for h < Hkv k and v head h, so the next accumulating GEMV adds
    into zeros."""

    sums = True

    def __init__(self, groups: int = 8, unroll: int = 8):
        if groups < 4:
            raise ValueError("groups must be 4 or 8 (the zeroing takes 4 groups of 64 threads)")
        super().__init__(groups, unroll, early=True)

    @cute.jit
    def __call__(self, mPO: cute.Tensor, mPL: cute.Tensor, mLens: cute.Tensor, mGate: cute.Tensor,
                 mOut: cute.Tensor, mQs: cute.Tensor, mKs: cute.Tensor, mVs: cute.Tensor, stream: cuda.CUstream):
        hq = cute.size(mPO, mode=[1])
        b = cute.size(mPO, mode=[0])
        self.kernel(mPO, mPL, mLens, mGate, mOut, mQs, mKs, mVs).launch(grid=(hq, b, 1), block=(self.threads, 1, 1),
                                                                     stream=stream)

    @cute.kernel
    def kernel(self, mPO: cute.Tensor, mPL: cute.Tensor, mLens: cute.Tensor, mGate: cute.Tensor,
               mOut: cute.Tensor, mQs: cute.Tensor, mKs: cute.Tensor, mVs: cute.Tensor):
        self.body(mPO, mPL, mLens, mGate, mOut, (mQs, mKs, mVs))
