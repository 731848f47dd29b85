"""Gated DeltaNet decode: one fused recurrent step per (value head, sequence).

For sequence b (state slot s = slots[b]) and value head j (key head kh = j // (Hv / Hk)):

    q, k   = l2norm(qkv[b, q/k of kh]) (eps 1e-6);  q *= dk^-0.5;  v = qkv[b, v of j]
    g      = -exp(A_log[j]) * softplus(a[b, j] + dt_bias[j]);   beta = sigmoid(b[b, j])
    S      = state[s, j]                                    (fp32 [dk, dv])
    S'     = e^g S + outer(k, u),  u = beta (v - e^g k^T S)   (decay, then the delta rule)
    o      = q^T S' = e^g q^T S + (q . k) u
    out    = norm_w * o * rsqrt(mean(o^2) + eps) * silu(z[b, j])        (gated RMSNorm, bf16)

Both reductions over dk (k^T S and q^T S) come from one pass over S, so the state is read once
and written once, with 16-byte accesses. Layouts: qkv [B, 2*Hk*dk + Hv*dv] bf16 (the conv
output: q | k | v), z and out [B, Hv*dv] bf16, a and b [B, Hv] bf16 (any row stride), A_log and
dt_bias [Hv] fp32, norm_w [dv] bf16, state [slots * Hv, dk, dv] fp32 (slot-major, compact),
slots [B] int32. Hk is read from the qkv width.

GdnStep: one CTA per (head, sequence): grid = (Hv, B). `warps` warps split the dk rows; lane l
owns columns 4l..4l+3 of each of its rows (dv = 128), so a warp reads each state row as 512
contiguous bytes and the CTA keeps the whole 64 KiB head state in registers between the read
and the write.

GdnConvStep: the causal conv (+ SiLU, window shift; see gdn_conv.py) of the head's q/k/v channels
fused in front, reading the raw conv input x [B, C] instead of qkv, and dv split over a cluster
of `splits` CTAs per head (grid = (splits, Hv, B)); its warps own columns (all reductions over dk
are warp shuffles) and only x, z, a, b are loaded after the PDL wait. GdnConvStepRows: the first
fused version (dk rows split over the warps, smem reductions), kept for A/B. Details in the
docstrings and docs/kernels-gdn.md.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from cute_kernels.sums import load_bf16, zero_f32

COLS = 4  # fp32 state columns per lane (one 16-byte access); 32 lanes x 4 = dv
L2_EPS = 1e-6
LOG2E = 1.4426950408889634


def _bfly_sum(x, offsets):
    """Sum of x over the lanes reached by butterfly shuffles at `offsets` (unrolled at trace time)."""
    for off in offsets:
        x = x + cute.arch.shuffle_sync_bfly(x, offset=off)
    return x


def _warp_sum(x):
    """Butterfly sum over the 32 lanes of a warp (every lane gets the total); unrolled at trace time."""
    for i in range(5):
        x = x + cute.arch.shuffle_sync_bfly(x, offset=1 << i)
    return x


class GdnStep:
    """Fused gates + q/k l2norm + gated delta-rule step + gated RMSNorm for one decode token."""

    def __init__(self, warps: int = 8, head_k: int = 128, head_v: int = 128):
        if head_v != 32 * COLS:
            raise ValueError(f"head_v must be {32 * COLS} (32 lanes x {COLS} columns)")
        if head_k % warps or head_k != 32 * COLS:
            raise ValueError(f"head_k must be {32 * COLS} and a multiple of warps")
        self.warps = warps
        self.dk = head_k
        self.dv = head_v
        self.rows = head_k // warps  # state rows per warp

    @cute.jit
    def __call__(self, mQKV: cute.Tensor, mZ: cute.Tensor, mA: cute.Tensor, mB: cute.Tensor,
                 mALog: cute.Tensor, mDtBias: cute.Tensor, mNormW: cute.Tensor, mState: cute.Tensor,
                 mSlots: cute.Tensor, mOut: cute.Tensor, eps: cutlass.Float32, stream: cuda.CUstream):
        hv = cute.size(mALog, mode=[0])
        b = cute.size(mSlots, mode=[0])
        self.kernel(mQKV, mZ, mA, mB, mALog, mDtBias, mNormW, mState, mSlots, mOut, eps).launch(
            grid=(hv, b, 1), block=(32 * self.warps, 1, 1), stream=stream
        )

    @cute.kernel
    def kernel(self, mQKV: cute.Tensor, mZ: cute.Tensor, mA: cute.Tensor, mB: cute.Tensor,
               mALog: cute.Tensor, mDtBias: cute.Tensor, mNormW: cute.Tensor, mState: cute.Tensor,
               mSlots: cute.Tensor, mOut: cute.Tensor, eps: cutlass.Float32):
        tidx, _, _ = cute.arch.thread_idx()
        head, seq, _ = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        dk, dv, rows = self.dk, self.dv, self.rows
        hv = cute.size(mALog, mode=[0])
        hk = (cute.size(mQKV, mode=[1]) - hv * dv) // (2 * dk)
        kh = head // (hv // hk)
        slot = mSlots[seq]

        # 1. Issue the state loads first: their latency overlaps the gate and q/k work below.
        gS = mState[slot * hv + head, None, None]
        rS = cute.make_rmem_tensor((COLS, rows), cutlass.Float32)
        for r in cutlass.range_constexpr(rows):
            cute.autovec_copy(cute.zipped_divide(gS[warp * rows + r, None], (COLS,))[None, lane], rS[None, r])

        smem = cutlass.memory.SmemAllocator()
        sQ = smem.allocate_tensor(cutlass.Float32, cute.make_layout((dk,)), byte_alignment=16)
        sK = smem.allocate_tensor(cutlass.Float32, cute.make_layout((dk,)), byte_alignment=16)
        sRedK = smem.allocate_tensor(cutlass.Float32, cute.make_layout((self.warps, dv), stride=(dv, 1)),
                                     byte_alignment=16)
        sRedQ = smem.allocate_tensor(cutlass.Float32, cute.make_layout((self.warps, dv), stride=(dv, 1)),
                                     byte_alignment=16)
        sScal = smem.allocate_tensor(cutlass.Float32, cute.make_layout((4,)), byte_alignment=16)

        # 2. Warp 0: l2-normalised q (scaled by dk^-0.5) and k into smem, and q . k.
        if warp == 0:
            gQKV = cute.zipped_divide(mQKV[seq, None], (COLS,))
            rQ = cute.make_rmem_tensor((COLS,), cutlass.BFloat16)
            rK = cute.make_rmem_tensor((COLS,), cutlass.BFloat16)
            cute.autovec_copy(gQKV[None, kh * (dk // COLS) + lane], rQ)
            cute.autovec_copy(gQKV[None, (hk + kh) * (dk // COLS) + lane], rK)
            q = rQ.load().to(cutlass.Float32)
            k = rK.load().to(cutlass.Float32)
            qq = _warp_sum((q * q).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0))
            kk = _warp_sum((k * k).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0))
            qk = _warp_sum((q * k).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0))
            q_scale = cute.math.rsqrt(qq + L2_EPS, fastmath=False) * (dk ** -0.5)
            k_scale = cute.math.rsqrt(kk + L2_EPS, fastmath=False)
            rQn = cute.make_rmem_tensor((COLS,), cutlass.Float32)
            rKn = cute.make_rmem_tensor((COLS,), cutlass.Float32)
            rQn.store(q * q_scale)
            rKn.store(k * k_scale)
            cute.autovec_copy(rQn, cute.zipped_divide(sQ, (COLS,))[None, lane])
            cute.autovec_copy(rKn, cute.zipped_divide(sK, (COLS,))[None, lane])
            if lane == 0:
                sScal[2] = qk * q_scale * k_scale
        # 3. One thread of warp 1: the decay e^g and beta.
        if tidx == 32:
            x = mA[seq, head].to(cutlass.Float32) + mDtBias[head]
            # softplus(x) = max(x, 0) + log1p(exp(-|x|)), stable for any x
            softplus = cute.math.max(x, cutlass.Float32(0.0)) + cute.math.log1p(
                cute.math.exp(-cute.math.abs(x), fastmath=False), fastmath=False)
            g = -cute.math.exp(mALog[head], fastmath=False) * softplus
            sScal[0] = cute.math.exp(g, fastmath=False)
            sScal[1] = 1.0 / (1.0 + cute.math.exp(-mB[seq, head].to(cutlass.Float32), fastmath=False))
        cute.arch.sync_threads()

        # 4. Per-warp partial k^T S and q^T S over this warp's rows, reduced across warps in smem.
        i0 = warp * rows
        acc_k = rS[None, 0].load() * sK[i0]
        acc_q = rS[None, 0].load() * sQ[i0]
        for r in cutlass.range_constexpr(1, rows):
            s_row = rS[None, r].load()
            acc_k = acc_k + s_row * sK[i0 + r]
            acc_q = acc_q + s_row * sQ[i0 + r]
        rAcc = cute.make_rmem_tensor((COLS,), cutlass.Float32)
        rAcc.store(acc_k)
        cute.autovec_copy(rAcc, cute.zipped_divide(sRedK[warp, None], (COLS,))[None, lane])
        rAcc.store(acc_q)
        cute.autovec_copy(rAcc, cute.zipped_divide(sRedQ[warp, None], (COLS,))[None, lane])
        cute.arch.sync_threads()

        rRed = cute.make_rmem_tensor((COLS,), cutlass.Float32)
        cute.autovec_copy(cute.zipped_divide(sRedK[0, None], (COLS,))[None, lane], rRed)
        k_s = rRed.load()
        cute.autovec_copy(cute.zipped_divide(sRedQ[0, None], (COLS,))[None, lane], rRed)
        q_s = rRed.load()
        for w in cutlass.range_constexpr(1, self.warps):
            cute.autovec_copy(cute.zipped_divide(sRedK[w, None], (COLS,))[None, lane], rRed)
            k_s = k_s + rRed.load()
            cute.autovec_copy(cute.zipped_divide(sRedQ[w, None], (COLS,))[None, lane], rRed)
            q_s = q_s + rRed.load()

        # 5. Delta-rule update of this thread's state entries, written back once.
        decay = sScal[0]
        beta = sScal[1]
        gQKV = cute.zipped_divide(mQKV[seq, None], (COLS,))
        rV = cute.make_rmem_tensor((COLS,), cutlass.BFloat16)
        cute.autovec_copy(gQKV[None, (2 * hk * dk + head * dv) // COLS + lane], rV)
        u = (rV.load().to(cutlass.Float32) - k_s * decay) * beta
        for r in cutlass.range_constexpr(rows):
            rS[None, r].store(rS[None, r].load() * decay + u * sK[i0 + r])
            cute.autovec_copy(rS[None, r], cute.zipped_divide(gS[i0 + r, None], (COLS,))[None, lane])

        # 6. Output of the step and its gated RMSNorm over dv (every warp holds all of o).
        o = q_s * decay + u * sScal[2]
        ss = _warp_sum((o * o).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0))
        if warp == 0:
            scale = cute.math.rsqrt(ss / dv + eps, fastmath=False)
            gZ = cute.zipped_divide(mZ[seq, None], (COLS,))
            rZ = cute.make_rmem_tensor((COLS,), cutlass.BFloat16)
            cute.autovec_copy(gZ[None, head * (dv // COLS) + lane], rZ)
            rW = cute.make_rmem_tensor((COLS,), cutlass.BFloat16)
            cute.autovec_copy(cute.zipped_divide(mNormW, (COLS,))[None, lane], rW)
            z = rZ.load().to(cutlass.Float32)
            gate = z / (cute.math.exp2(z * -LOG2E, fastmath=True) + 1.0)
            rY = cute.make_rmem_tensor((COLS,), cutlass.BFloat16)
            rY.store((o * scale * rW.load().to(cutlass.Float32) * gate).to(cutlass.BFloat16))
            cute.autovec_copy(rY, cute.zipped_divide(mOut[seq, None], (COLS,))[None, head * (dv // COLS) + lane])


# --- conv + step fused, dv split over a cluster ---------------------------------------------------

VEC = 8  # bf16 conv channels per 16-byte access


@dsl_user_op
def _st_cluster_f32(addr, rank, val, *, loc=None, ip=None):
    """st.shared::cluster of one fp32 at local smem address `addr` mapped into CTA `rank` of the cluster."""
    operands = [cutlass.Int32(addr).ir_value(loc=loc, ip=ip), cutlass.Int32(rank).ir_value(loc=loc, ip=ip),
                cutlass.Float32(val).ir_value(loc=loc, ip=ip)]
    asm = "{\n\t.reg .b32 ra;\n\tmapa.shared::cluster.u32 ra, $0, $1;\n\tst.shared::cluster.f32 [ra], $2;\n\t}"
    llvm.inline_asm(None, operands, asm, "r,r,f", has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def _atom_inc_release(addr, last, *, loc=None, ip=None):
    """atom.release.gpu.global.inc.u32: old = *addr; *addr = 0 if old >= last else old + 1; returns old.
    A counter of `last + 1` arrivals that resets itself. (ptxas turns a uniform atomic add into a warp-
    aggregated one that waits for its result at once; inc is left alone, so the wait is at first use.)"""
    return cutlass.Int32(llvm.inline_asm(
        T.i32(), [cutlass.Int64(addr).ir_value(loc=loc, ip=ip), cutlass.Int32(last).ir_value(loc=loc, ip=ip)],
        "atom.release.gpu.global.inc.u32 $0, [$1], $2;", "=r,l,r", has_side_effects=True, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT))


class GdnConvStepRows:
    """Causal conv1d + SiLU of the head's q/k/v channels, conv-window shift, then the GdnStep math
    (the first fused version, variant gdn_conv_step_v1: dk rows split over the warps).

    Grid (splits, Hv, B): CTA (c, j, b) owns columns [c*dv/splits, (c+1)*dv/splits) of value head j's
    state for sequence b; the `splits` CTAs of a head form one cluster and exchange their partial
    sums of o^2 (the gated RMSNorm over dv) through distributed shared memory. Every CTA convolves
    its key head's 256 q/k channels (warp 0) and its own v columns (warp 1). The v conv window is
    written by its only reader; the q/k window of key head kh is read by Hv/Hk * splits CTAs, so
    each counts itself on sync[b*Hk + kh] after reading (atom.inc, which wraps back to 0 on the last
    arrival), and the last to arrive writes the new window (no CTA waits on another).
    """

    def __init__(self, splits: int = 4, threads: int = 128, head_k: int = 128, head_v: int = 128, width: int = 4):
        if head_k != 128 or head_v != 128:
            raise ValueError("head_k and head_v must be 128")
        cols = head_v // splits
        if splits not in (1, 2, 4, 8):
            raise ValueError("splits must be 1, 2, 4 or 8 (a portable cluster)")
        lanes_per_row = cols // COLS
        if threads % 32 or not 128 <= threads <= 1024 or head_k % (threads // lanes_per_row):
            raise ValueError("threads must be 4..32 warps and split the rows evenly")
        if width != 4:
            raise ValueError("conv width must be 4")
        self.splits, self.threads, self.dk, self.dv, self.width = splits, threads, head_k, head_v, width
        self.cols = cols
        self.lr = lanes_per_row  # lanes (threads) per state row of this CTA's columns
        self.rpi = threads // lanes_per_row  # rows covered by one pass of the CTA
        self.iters = head_k // self.rpi  # rows per thread
        self.warps = threads // 32
        self.row_offsets = tuple(o for o in (1, 2, 4, 8, 16) if o >= lanes_per_row)  # lanes of one column group
        self.col_offsets = tuple(o for o in (1, 2, 4, 8, 16) if o < lanes_per_row)  # column groups of one row

    @cute.jit
    def __call__(self, mX: cute.Tensor, mConvState: cute.Tensor, mConvW: cute.Tensor, mZ: cute.Tensor,
                 mA: cute.Tensor, mB: cute.Tensor, mALog: cute.Tensor, mDtBias: cute.Tensor, mNormW: cute.Tensor,
                 mState: cute.Tensor, mSlots: cute.Tensor, mSync: cute.Tensor, mOut: cute.Tensor,
                 eps: cutlass.Float32, stream: cuda.CUstream):
        hv = cute.size(mALog, mode=[0])
        b = cute.size(mSlots, mode=[0])
        self.kernel(mX, mConvState, mConvW, mZ, mA, mB, mALog, mDtBias, mNormW, mState, mSlots, mSync, mOut,
                    eps).launch(grid=(self.splits, hv, b), block=(self.threads, 1, 1), cluster=(self.splits, 1, 1),
                                stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mConvState: cute.Tensor, mConvW: cute.Tensor, mZ: cute.Tensor,
               mA: cute.Tensor, mB: cute.Tensor, mALog: cute.Tensor, mDtBias: cute.Tensor, mNormW: cute.Tensor,
               mState: cute.Tensor, mSlots: cute.Tensor, mSync: cute.Tensor, mOut: cute.Tensor,
               eps: cutlass.Float32):
        tidx, _, _ = cute.arch.thread_idx()
        split, head, seq = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        dk, dv, cols, lr, rpi, iters, taps = self.dk, self.dv, self.cols, self.lr, self.rpi, self.iters, self.width - 1
        if cutlass.const_expr(self.splits > 1):
            cute.arch.cluster_arrive_relaxed()  # paired with the wait before the first DSMEM store
        hv = cute.size(mALog, mode=[0])
        hk = (cute.size(mX, mode=[1]) - hv * dv) // (2 * dk)
        kh = head // (hv // hk)
        slot = mSlots[seq]
        cg = tidx % lr  # this thread's 4-column group within the CTA's columns
        row0 = tidx // lr
        col_chunk = split * lr + cg  # 4-column chunk index within dv

        # 1. All state loads first (one 16-byte load per row), then every other input.
        gS = mState[slot * hv + head, None, None]
        rS = cute.make_rmem_tensor((COLS, iters), cutlass.Float32)
        for i in cutlass.range_constexpr(iters):
            cute.autovec_copy(cute.zipped_divide(gS[row0 + i * rpi, None], (COLS,))[None, col_chunk], rS[None, i])
        # PDL: the slot and this layer's state were written before the previous kernel started; the
        # inputs below come from it, so wait for it here.
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()

        smem = cutlass.memory.SmemAllocator()
        sQK = smem.allocate_tensor(cutlass.Float32, cute.make_layout((2 * dk,)), byte_alignment=16)
        sV = smem.allocate_tensor(cutlass.Float32, cute.make_layout((cols,)), byte_alignment=16)
        sRedK = smem.allocate_tensor(cutlass.Float32, cute.make_layout((self.warps, cols), stride=(cols, 1)),
                                     byte_alignment=16)
        sRedQ = smem.allocate_tensor(cutlass.Float32, cute.make_layout((self.warps, cols), stride=(cols, 1)),
                                     byte_alignment=16)
        sScal = smem.allocate_tensor(cutlass.Float32, cute.make_layout((4,)), byte_alignment=16)
        sSsq = smem.allocate_tensor(cutlass.Float32, cute.make_layout((8,)), byte_alignment=16)

        # Output-column owners (row group 0) prefetch z and the norm weight.
        rZ = cute.make_rmem_tensor((COLS,), cutlass.BFloat16)
        rW = cute.make_rmem_tensor((COLS,), cutlass.BFloat16)
        if tidx < lr:
            cute.autovec_copy(cute.zipped_divide(mZ[seq, None], (COLS,))[None, head * (dv // COLS) + col_chunk], rZ)
            cute.autovec_copy(cute.zipped_divide(mNormW, (COLS,))[None, col_chunk], rW)

        # 2. Warp 0: conv + SiLU of the key head's q (lanes 0-15) and k (lanes 16-31) channels, 8 per lane,
        #    l2norm, q.k; then it counts itself as a reader of the q/k conv window (released, result used later).
        half = dk // VEC  # 16 lanes per 128 channels
        qk_chunk = kh * half + lane
        if lane >= half:
            qk_chunk = (hk + kh) * half + lane - half
        sync_idx = seq * hk + kh
        readers = (hv // hk) * self.splits  # CTAs that read this key head's q/k window
        rXqk = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
        rTqk = cute.make_rmem_tensor((VEC, taps), cutlass.BFloat16)
        arrived = cutlass.Int32(0)
        if warp == 0:
            cute.autovec_copy(cute.zipped_divide(mX[seq, None], (VEC,))[None, qk_chunk], rXqk)
            for t in cutlass.range_constexpr(taps):
                cute.autovec_copy(cute.zipped_divide(mConvState[slot, t, None], (VEC,))[None, qk_chunk], rTqk[None, t])
            rCW = cute.make_rmem_tensor((VEC, taps + 1), cutlass.BFloat16)
            for t in cutlass.range_constexpr(taps + 1):
                cute.autovec_copy(cute.zipped_divide(mConvW[t, None], (VEC,))[None, qk_chunk], rCW[None, t])
            acc = rXqk.load().to(cutlass.Float32) * rCW[None, taps].load().to(cutlass.Float32)
            for t in cutlass.range_constexpr(taps):
                acc = acc + rTqk[None, t].load().to(cutlass.Float32) * rCW[None, t].load().to(cutlass.Float32)
            acc = acc / (cute.math.exp2(acc * -LOG2E, fastmath=True) + 1.0)  # silu
            rC = cute.make_rmem_tensor((VEC,), cutlass.Float32)
            rC.store(acc)
            ss = (acc * acc).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0)
            dot = cutlass.Float32(0.0)
            for e in cutlass.range_constexpr(VEC):
                dot = dot + rC[e] * cute.arch.shuffle_sync_bfly(rC[e], offset=half)
            ss = _bfly_sum(ss, (1, 2, 4, 8))  # within each 16-lane half
            dot = _bfly_sum(dot, (1, 2, 4, 8))
            ss_other = cute.arch.shuffle_sync_bfly(ss, offset=half)
            scale = cute.math.rsqrt(ss + L2_EPS, fastmath=False)
            if lane < half:
                scale = scale * (dk ** -0.5)
            rN = cute.make_rmem_tensor((VEC,), cutlass.Float32)
            rN.store(acc * scale)
            cute.autovec_copy(rN, cute.zipped_divide(sQK, (VEC,))[None, lane])
            if lane == 0:
                sScal[2] = dot * scale * cute.math.rsqrt(ss_other + L2_EPS, fastmath=False)
            cute.arch.sync_warp()  # every lane's window reads come before the (release) counter bump
            if lane == 0:
                arrived = _atom_inc_release((mSync.iterator + sync_idx).toint(), readers - 1)

        # 3. Warp 1: conv + SiLU of this CTA's v columns, and their window shift (this CTA is their only reader).
        if warp == 1:
            if lane < cols // VEC:
                chunk = (2 * hk * dk + head * dv + split * cols) // VEC + lane
                rX = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
                cute.autovec_copy(cute.zipped_divide(mX[seq, None], (VEC,))[None, chunk], rX)
                rT = cute.make_rmem_tensor((VEC, taps), cutlass.BFloat16)
                for t in cutlass.range_constexpr(taps):
                    cute.autovec_copy(cute.zipped_divide(mConvState[slot, t, None], (VEC,))[None, chunk], rT[None, t])
                rCW = cute.make_rmem_tensor((VEC, taps + 1), cutlass.BFloat16)
                for t in cutlass.range_constexpr(taps + 1):
                    cute.autovec_copy(cute.zipped_divide(mConvW[t, None], (VEC,))[None, chunk], rCW[None, t])
                acc = rX.load().to(cutlass.Float32) * rCW[None, taps].load().to(cutlass.Float32)
                for t in cutlass.range_constexpr(taps):
                    acc = acc + rT[None, t].load().to(cutlass.Float32) * rCW[None, t].load().to(cutlass.Float32)
                rC = cute.make_rmem_tensor((VEC,), cutlass.Float32)
                rC.store(acc / (cute.math.exp2(acc * -LOG2E, fastmath=True) + 1.0))
                cute.autovec_copy(rC, cute.zipped_divide(sV, (VEC,))[None, lane])
                for t in cutlass.range_constexpr(taps - 1):
                    cute.autovec_copy(rT[None, t + 1],
                                      cute.zipped_divide(mConvState[slot, t, None], (VEC,))[None, chunk])
                cute.autovec_copy(rX, cute.zipped_divide(mConvState[slot, taps - 1, None], (VEC,))[None, chunk])

        # 4. One thread of warp 2: the decay e^g and beta.
        if tidx == 64:
            x = mA[seq, head].to(cutlass.Float32) + mDtBias[head]
            softplus = cute.math.max(x, cutlass.Float32(0.0)) + cute.math.log1p(
                cute.math.exp(-cute.math.abs(x), fastmath=False), fastmath=False)
            g = -cute.math.exp(mALog[head], fastmath=False) * softplus
            sScal[0] = cute.math.exp(g, fastmath=False)
            sScal[1] = 1.0 / (1.0 + cute.math.exp(-mB[seq, head].to(cutlass.Float32), fastmath=False))
        cute.arch.sync_threads()

        # 5. k^T S and q^T S for this thread's 4 columns: its rows, then the lanes of the same columns
        #    (butterfly over lane offsets lr .. 16), then the warps (smem).
        acc_k = rS[None, 0].load() * sQK[dk + row0]
        acc_q = rS[None, 0].load() * sQK[row0]
        for i in cutlass.range_constexpr(1, iters):
            s_row = rS[None, i].load()
            acc_k = acc_k + s_row * sQK[dk + row0 + i * rpi]
            acc_q = acc_q + s_row * sQK[row0 + i * rpi]
        rAcc = cute.make_rmem_tensor((COLS,), cutlass.Float32)
        rAcq = cute.make_rmem_tensor((COLS,), cutlass.Float32)
        rAcc.store(acc_k)
        rAcq.store(acc_q)
        for e in cutlass.range_constexpr(COLS):
            rAcc[e] = _bfly_sum(rAcc[e], self.row_offsets)
            rAcq[e] = _bfly_sum(rAcq[e], self.row_offsets)
        if lane < lr:
            cute.autovec_copy(rAcc, cute.zipped_divide(sRedK[warp, None], (COLS,))[None, cg])
            cute.autovec_copy(rAcq, cute.zipped_divide(sRedQ[warp, None], (COLS,))[None, cg])
        cute.arch.sync_threads()
        rRed = cute.make_rmem_tensor((COLS,), cutlass.Float32)
        cute.autovec_copy(cute.zipped_divide(sRedK[0, None], (COLS,))[None, cg], rRed)
        k_s = rRed.load()
        cute.autovec_copy(cute.zipped_divide(sRedQ[0, None], (COLS,))[None, cg], rRed)
        q_s = rRed.load()
        for w in cutlass.range_constexpr(1, self.warps):
            cute.autovec_copy(cute.zipped_divide(sRedK[w, None], (COLS,))[None, cg], rRed)
            k_s = k_s + rRed.load()
            cute.autovec_copy(cute.zipped_divide(sRedQ[w, None], (COLS,))[None, cg], rRed)
            q_s = q_s + rRed.load()

        # 6. u and o = q^T S' for these columns; the sum of o^2 over dv (across the cluster: each CTA stores
        #    its partial into every CTA's smem, then one cluster barrier) before the state stores, so the
        #    barrier's release does not wait for them.
        decay = sScal[0]
        beta = sScal[1]
        cute.autovec_copy(cute.zipped_divide(sV, (COLS,))[None, cg], rRed)
        u = (rRed.load() - k_s * decay) * beta
        o = q_s * decay + u * sScal[2]
        ss = (o * o).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0)
        ss = _bfly_sum(ss, self.col_offsets)
        if cutlass.const_expr(self.splits > 1):
            cute.arch.cluster_wait()  # every CTA of the cluster has started: its smem may be written
            if tidx < self.splits:
                _st_cluster_f32((sSsq.iterator + split).toint(), tidx, ss)
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
            ss = sSsq[0]
            for r in cutlass.range_constexpr(1, self.splits):
                ss = ss + sSsq[r]

        # The last reader of the key head's q/k conv window (counted in step 2) writes the shifted window;
        # the acquire fence orders those writes after every other reader's (release) count.
        if warp == 0:
            arrived = cute.arch.shuffle_sync(arrived, 0)
            if arrived == readers - 1:  # the counter is back at 0
                cute.arch.fence_acq_rel_gpu()
                for t in cutlass.range_constexpr(taps - 1):
                    cute.autovec_copy(rTqk[None, t + 1],
                                      cute.zipped_divide(mConvState[slot, t, None], (VEC,))[None, qk_chunk])
                cute.autovec_copy(rXqk, cute.zipped_divide(mConvState[slot, taps - 1, None], (VEC,))[None, qk_chunk])

        # 7. Delta rule on this thread's entries, written back once; then the gated RMSNorm output.
        for i in cutlass.range_constexpr(iters):
            rS[None, i].store(rS[None, i].load() * decay + u * sQK[dk + row0 + i * rpi])
            cute.autovec_copy(rS[None, i], cute.zipped_divide(gS[row0 + i * rpi, None], (COLS,))[None, col_chunk])
        if tidx < lr:
            scale = cute.math.rsqrt(ss / dv + eps, fastmath=False)
            z = rZ.load().to(cutlass.Float32)
            gate = z / (cute.math.exp2(z * -LOG2E, fastmath=True) + 1.0)
            rY = cute.make_rmem_tensor((COLS,), cutlass.BFloat16)
            rY.store((o * scale * rW.load().to(cutlass.Float32) * gate).to(cutlass.BFloat16))
            cute.autovec_copy(rY, cute.zipped_divide(mOut[seq, None], (COLS,))[None, head * (dv // COLS) + col_chunk])


# --- conv + step fused, columns split over the warps (the default) ---------------------------------


def _silu(x):
    return x / (cute.math.exp2(x * -LOG2E, fastmath=True) + 1.0)


class GdnConvStep:
    """GdnConvStepRows with a short dependent chain after the PDL wait.

    Grid (splits, Hv, B), cluster (splits, 1, 1); CTA (c, j, b) owns columns [c*dv/splits, (c+1)*dv/splits)
    of value head j's state for sequence b. `threads` = 32 * (compute warps + 1):
      - compute warp w owns `cw` = 8 or 16 of those columns over all dk rows: lane (rg, cwi) holds the
        4 columns `cwi` of rows [rg*R, rg*R + R) (R = dk * cw / 128), so k^T S and q^T S are reduced
        with warp shuffles only (no shared memory, no CTA barrier);
      - every compute warp convolves the key head's 256 q/k channels itself (8 per lane; nothing to
        wait for across warps) and gathers each row's raw q and k by shuffles; each thread convolves
        its own 4 v columns (8-byte accesses, the row-group-0 lane writes their shifted window);
      - the last warp (the window warp) does the q/k conv-window protocol: after a named barrier that
        the compute warps arrive at (without waiting) once they have read the window, it counts its
        CTA on sync[b*Hk + kh] (atom.release.inc, wraps to 0) and the last of the Hv/Hk * splits CTAs
        writes the shifted window, so no fence or atomic sits on a compute warp's path.
    Issued before griddepcontrol.wait (the previous kernel does not write them) and consumed after it:
    the state, both conv windows and weights, A_log, dt_bias, norm_w. After it: x, z, a, b, so with or
    without PDL overlap every load of the step is in flight at once.
    The gated RMSNorm's sum of o^2 over dv: per warp by shuffles, then across warps (smem + a named
    barrier) or the cluster (each warp stores its partial into every CTA's smem, barrier.cluster
    arrive before the state stores, wait after them); every CTA sums the partials in the same order.
    `sums`: x and z are fp32, the sums an accumulating GEMV left (a deferred epilogue), rounded to bf16 as its
    epilogue would; once read they are zeroed (v and z by their row-group-0 lanes, a key head's q/k by the
    CTA that writes its window, after every reader has counted), so the next layer's GEMV adds into zeros.
    """

    def __init__(self, splits: int = 4, threads: int = 160, head_k: int = 128, head_v: int = 128, width: int = 4,
                 sums: bool = False):
        if head_k != 128 or head_v != 128:
            raise ValueError("head_k and head_v must be 128")
        self.sums = sums  # x and z fp32 (a GEMV's accumulated sums, rounded to bf16 here), zeroed once read
        if splits not in (1, 2, 4, 8):
            raise ValueError("splits must be 1, 2, 4 or 8 (a portable cluster)")
        if width != 4:
            raise ValueError("conv width must be 4")
        warps = threads // 32 - 1
        cols = head_v // splits
        if threads % 32 or warps < 1 or cols % warps or cols // warps not in (8, 16):
            raise ValueError("threads must be 32 * (warps + 1) with dv / splits / warps = 8 or 16 columns per warp")
        self.splits, self.threads, self.dk, self.dv, self.width = splits, threads, head_k, head_v, width
        self.warps = warps  # compute warps; warp `warps` is the window warp
        self.cols = cols  # columns per CTA
        self.cpw = cols // warps // COLS  # 4-column chunks per warp (2 or 4)
        self.lpc = 32 // self.cpw  # lanes per chunk = row groups (16 or 8)
        self.rows = head_k // self.lpc  # rows per lane (8 or 16)
        self.row_offsets = tuple(o for o in (1, 2, 4, 8, 16) if o >= self.cpw)  # lanes of one chunk
        self.col_offsets = tuple(o for o in (1, 2, 4, 8, 16) if o < self.cpw)  # chunks of one warp

    @cute.jit
    def __call__(self, mX: cute.Tensor, mConvState: cute.Tensor, mConvW: cute.Tensor, mZ: cute.Tensor,
                 mA: cute.Tensor, mB: cute.Tensor, mALog: cute.Tensor, mDtBias: cute.Tensor, mNormW: cute.Tensor,
                 mState: cute.Tensor, mSlots: cute.Tensor, mSync: cute.Tensor, mOut: cute.Tensor,
                 eps: cutlass.Float32, stream: cuda.CUstream):
        hv = cute.size(mALog, mode=[0])
        b = cute.size(mSlots, mode=[0])
        self.kernel(mX, mConvState, mConvW, mZ, mA, mB, mALog, mDtBias, mNormW, mState, mSlots, mSync, mOut,
                    eps).launch(grid=(self.splits, hv, b), block=(self.threads, 1, 1), cluster=(self.splits, 1, 1),
                                stream=stream)

    def lane_layout(self, split, warp, lane):
        """(rg, cwi, row0, col_chunk) of a compute thread (plain ints or DSL Int32): row group, chunk in
        the warp, first of its `rows` state rows, and its 4-column chunk within dv."""
        cwi = lane % self.cpw
        rg = lane // self.cpw
        return rg, cwi, rg * self.rows, split * (self.cols // COLS) + warp * self.cpw + cwi

    def qk_source(self, rg, i):
        """The lane whose conv output holds raw q of row rows*rg + i (k: that lane + 16), element i % 8."""
        return (self.rows // VEC) * rg + i // VEC

    @staticmethod
    def qk_chunk(kh, lane, hk):
        """The 8-channel chunk of x convolved by `lane`: q of key head kh (lanes 0-15), then its k (16-31)."""
        half = 128 // VEC
        return kh * half + lane + (lane // half) * ((hk - 1) * half)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mConvState: cute.Tensor, mConvW: cute.Tensor, mZ: cute.Tensor,
               mA: cute.Tensor, mB: cute.Tensor, mALog: cute.Tensor, mDtBias: cute.Tensor, mNormW: cute.Tensor,
               mState: cute.Tensor, mSlots: cute.Tensor, mSync: cute.Tensor, mOut: cute.Tensor,
               eps: cutlass.Float32):
        tidx, _, _ = cute.arch.thread_idx()
        split, head, seq = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        dk, dv, rows, nw, ns, taps = self.dk, self.dv, self.rows, self.warps, self.splits, self.width - 1
        if cutlass.const_expr(ns > 1):
            cute.arch.cluster_arrive_relaxed()  # phase 0: every CTA of the cluster has started
        hv = cute.size(mALog, mode=[0])
        hk = (cute.size(mX, mode=[1]) - hv * dv) // (2 * dk)
        kh = head // (hv // hk)
        a_log = mALog[head]
        dt_bias = mDtBias[head]
        slot = mSlots[seq]
        half = dk // VEC  # lanes per 128 q (or k) channels
        qk_chunk = self.qk_chunk(kh, lane, hk)
        rg, cwi, row0, col_chunk = self.lane_layout(split, warp, lane)
        v_chunk = (2 * hk * dk + head * dv) // COLS + col_chunk  # the same columns' v channels (4 per chunk)

        smem = cutlass.memory.SmemAllocator()
        sSsq = smem.allocate_tensor(cutlass.Float32, cute.make_layout((ns * nw,)), byte_alignment=16)

        gS = mState[slot * hv + head, None, None]
        rS = cute.make_rmem_tensor((COLS, rows), cutlass.Float32)
        rTqk = cute.make_rmem_tensor((VEC, taps), cutlass.BFloat16)
        rWqk = cute.make_rmem_tensor((VEC, taps + 1), cutlass.BFloat16)
        rTv = cute.make_rmem_tensor((COLS, taps), cutlass.BFloat16)
        rWv = cute.make_rmem_tensor((COLS, taps + 1), cutlass.BFloat16)
        rNw = cute.make_rmem_tensor((COLS,), cutlass.BFloat16)
        gXqk = cute.zipped_divide(mX[seq, None], (VEC,))[None, qk_chunk]

        # 1. Before the PDL wait: everything that the previous kernel does not write.
        if warp < nw:
            for i in cutlass.range_constexpr(rows):
                cute.autovec_copy(cute.zipped_divide(gS[row0 + i, None], (COLS,))[None, col_chunk], rS[None, i])
            for t in cutlass.range_constexpr(taps):
                cute.autovec_copy(cute.zipped_divide(mConvState[slot, t, None], (VEC,))[None, qk_chunk], rTqk[None, t])
                cute.autovec_copy(cute.zipped_divide(mConvState[slot, t, None], (COLS,))[None, v_chunk], rTv[None, t])
            for t in cutlass.range_constexpr(taps + 1):
                cute.autovec_copy(cute.zipped_divide(mConvW[t, None], (VEC,))[None, qk_chunk], rWqk[None, t])
                cute.autovec_copy(cute.zipped_divide(mConvW[t, None], (COLS,))[None, v_chunk], rWv[None, t])
            cute.autovec_copy(cute.zipped_divide(mNormW, (COLS,))[None, col_chunk], rNw)
        else:
            for t in cutlass.range_constexpr(1, taps):
                cute.autovec_copy(cute.zipped_divide(mConvState[slot, t, None], (VEC,))[None, qk_chunk], rTqk[None, t])
        if cutlass.const_expr(ns > 1):
            cute.arch.cluster_wait()
        # PDL: the slot, this layer's states and conv window were written before the previous kernel
        # started; x, z, a, b come from it.
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()

        rXqk = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
        if warp < nw:
            # 2. The inputs of this step (one round trip), the q/k conv + SiLU, l2norm scales and q.k.
            load_bf16(gXqk, rXqk, self.sums)
            rXv = cute.make_rmem_tensor((COLS,), cutlass.BFloat16)
            gXv = cute.zipped_divide(mX[seq, None], (COLS,))[None, v_chunk]
            load_bf16(gXv, rXv, self.sums)
            rZ = cute.make_rmem_tensor((COLS,), cutlass.BFloat16)
            gZ = cute.zipped_divide(mZ[seq, None], (COLS,))[None, head * (dv // COLS) + col_chunk]
            load_bf16(gZ, rZ, self.sums)
            a_in = mA[seq, head].to(cutlass.Float32)
            b_in = mB[seq, head].to(cutlass.Float32)
            acc = rXqk.load().to(cutlass.Float32) * rWqk[None, taps].load().to(cutlass.Float32)
            for t in cutlass.range_constexpr(taps):
                acc = acc + rTqk[None, t].load().to(cutlass.Float32) * rWqk[None, t].load().to(cutlass.Float32)
            # This warp has read the q/k window: tell the window warp (barrier 1, no waiting here).
            cute.arch.barrier_arrive(barrier_id=1, number_of_threads=self.threads)
            acc = _silu(acc)
            rC = cute.make_rmem_tensor((VEC,), cutlass.Float32)
            rC.store(acc)
            ss = (acc * acc).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0)
            dot = cutlass.Float32(0.0)
            for e in cutlass.range_constexpr(VEC):
                dot = dot + rC[e] * cute.arch.shuffle_sync_bfly(rC[e], offset=half)
            # Raw q and k of this lane's rows: row r lives in lane r // 8 (q) or 16 + r // 8 (k), element r % 8.
            rQr = cute.make_rmem_tensor((rows,), cutlass.Float32)
            rKr = cute.make_rmem_tensor((rows,), cutlass.Float32)
            for i in cutlass.range_constexpr(rows):
                src = self.qk_source(rg, i)
                rQr[i] = cute.arch.shuffle_sync(rC[i % VEC], offset=src)
                rKr[i] = cute.arch.shuffle_sync(rC[i % VEC], offset=src + half)
            ss = _bfly_sum(ss, (1, 2, 4, 8))  # within each 16-lane half
            dot = _bfly_sum(dot, (1, 2, 4, 8))
            ss_other = cute.arch.shuffle_sync_bfly(ss, offset=half)
            qq = ss
            kk = ss_other
            if lane >= half:
                qq = ss_other
                kk = ss
            q_scale = cute.math.rsqrt(qq + L2_EPS, fastmath=False) * (dk ** -0.5)
            k_scale = cute.math.rsqrt(kk + L2_EPS, fastmath=False)
            qk = dot * q_scale * k_scale

            # 3. Raw k^T S and q^T S for this thread's 4 columns over its rows, then over the row groups.
            acc_k = rS[None, 0].load() * rKr[0]
            acc_q = rS[None, 0].load() * rQr[0]
            for i in cutlass.range_constexpr(1, rows):
                s_row = rS[None, i].load()
                acc_k = acc_k + s_row * rKr[i]
                acc_q = acc_q + s_row * rQr[i]
            rAk = cute.make_rmem_tensor((COLS,), cutlass.Float32)
            rAq = cute.make_rmem_tensor((COLS,), cutlass.Float32)
            rAk.store(acc_k)
            rAq.store(acc_q)
            for e in cutlass.range_constexpr(COLS):
                rAk[e] = _bfly_sum(rAk[e], self.row_offsets)
                rAq[e] = _bfly_sum(rAq[e], self.row_offsets)

            # 4. Gates, v, u, o and this warp's partial sum of o^2.
            x = a_in + dt_bias
            softplus = cute.math.max(x, cutlass.Float32(0.0)) + cute.math.log1p(
                cute.math.exp(-cute.math.abs(x), fastmath=False), fastmath=False)
            decay = cute.math.exp(-cute.math.exp(a_log, fastmath=False) * softplus, fastmath=False)
            beta = 1.0 / (1.0 + cute.math.exp(-b_in, fastmath=False))
            v = rXv.load().to(cutlass.Float32) * rWv[None, taps].load().to(cutlass.Float32)
            for t in cutlass.range_constexpr(taps):
                v = v + rTv[None, t].load().to(cutlass.Float32) * rWv[None, t].load().to(cutlass.Float32)
            v = _silu(v)
            u = (v - (rAk.load() * k_scale) * decay) * beta
            o = (rAq.load() * q_scale) * decay + u * qk
            ssq = (o * o).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0)
            ssq = _bfly_sum(ssq, self.col_offsets)
            if cutlass.const_expr(ns > 1):
                if lane < ns:
                    _st_cluster_f32((sSsq.iterator + split * nw + warp).toint(), lane, ssq)
                cute.arch.cluster_arrive()  # release: the partials; no global store is in flight yet
            else:
                if lane == 0:
                    sSsq[warp] = ssq

            # 5. Delta rule on this thread's entries, written back once; the v window shift.
            for i in cutlass.range_constexpr(rows):
                rS[None, i].store(rS[None, i].load() * decay + u * (rKr[i] * k_scale))
                cute.autovec_copy(rS[None, i], cute.zipped_divide(gS[row0 + i, None], (COLS,))[None, col_chunk])
            if cutlass.const_expr(self.sums):  # every lane has read its v and z sums: the row-group-0 lanes zero them
                cute.arch.sync_warp()
                if rg == 0:
                    zero_f32(gXv)
                    zero_f32(gZ)
            if rg == 0:
                for t in cutlass.range_constexpr(taps - 1):
                    cute.autovec_copy(rTv[None, t + 1],
                                      cute.zipped_divide(mConvState[slot, t, None], (COLS,))[None, v_chunk])
                cute.autovec_copy(rXv, cute.zipped_divide(mConvState[slot, taps - 1, None], (COLS,))[None, v_chunk])

            # 6. The sum of o^2 over dv (same order in every CTA) and the gated RMSNorm output.
            if cutlass.const_expr(ns > 1):
                cute.arch.cluster_wait()
            else:
                cute.arch.barrier(barrier_id=2, number_of_threads=32 * nw)
            total = sSsq[0]
            for r in cutlass.range_constexpr(1, ns * nw):
                total = total + sSsq[r]
            if rg == 0:
                scale = cute.math.rsqrt(total / dv + eps, fastmath=False)
                rY = cute.make_rmem_tensor((COLS,), cutlass.BFloat16)
                rY.store((o * scale * rNw.load().to(cutlass.Float32) * _silu(rZ.load().to(cutlass.Float32)))
                         .to(cutlass.BFloat16))
                cute.autovec_copy(rY, cute.zipped_divide(mOut[seq, None], (COLS,))[None, head * (dv // COLS)
                                                                                      + col_chunk])
        else:
            # The window warp: once every compute warp of the CTA has read the q/k window (barrier 1),
            # count the CTA; the last of the key head's readers writes the shifted window.
            if cutlass.const_expr(ns > 1):
                cute.arch.cluster_arrive_relaxed()  # this warp publishes nothing to the cluster
            cute.arch.barrier(barrier_id=1, number_of_threads=self.threads)
            arrived = cutlass.Int32(0)
            if lane == 0:
                arrived = _atom_inc_release((mSync.iterator + seq * hk + kh).toint(), (hv // hk) * ns - 1)
            load_bf16(gXqk, rXqk, self.sums)
            arrived = cute.arch.shuffle_sync(arrived, 0)
            if arrived == (hv // hk) * ns - 1:  # the counter is back at 0
                cute.arch.fence_acq_rel_gpu()  # acquire: after every other reader's (released) count
                for t in cutlass.range_constexpr(taps - 1):
                    cute.autovec_copy(rTqk[None, t + 1],
                                      cute.zipped_divide(mConvState[slot, t, None], (VEC,))[None, qk_chunk])
                cute.autovec_copy(rXqk, cute.zipped_divide(mConvState[slot, taps - 1, None], (VEC,))[None, qk_chunk])
                if cutlass.const_expr(self.sums):  # every reader of the key head's q/k sums has read them
                    zero_f32(gXqk)
            if cutlass.const_expr(ns > 1):
                cute.arch.cluster_wait()
