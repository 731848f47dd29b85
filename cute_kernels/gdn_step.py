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

One CTA per (head, sequence): grid = (Hv, B). `warps` warps split the dk rows; lane l owns
columns 4l..4l+3 of each of its rows (dv = 128), so a warp reads each state row as 512
contiguous bytes and the CTA keeps the whole 64 KiB head state in registers between the read
and the write.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute

COLS = 4  # fp32 state columns per lane (one 16-byte access); 32 lanes x 4 = dv
L2_EPS = 1e-6
LOG2E = 1.4426950408889634


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
