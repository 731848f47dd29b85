"""Gated attention decode prep: per-head q/k norm + RoPE, and K/V appended to the paged cache.

For sequence b (one decode token) with rope position pos = positions[b] and cache slot
i = lens[b] - 1 (lens counts the cached tokens including this one; lens = 0 marks an idle batch
lane, whose q is computed but nothing is cached):

    q_h   = rope(rmsnorm(q_proj[b, h, :]; q_norm))          -> q_out[b, h, :]  (fp32)
    k_g   = rope(rmsnorm(k[b, g*d : (g+1)*d];   k_norm))    -> K row of (page_table[b, i // 64], g, i % 64)
    v_g   = v[b, g*d : (g+1)*d]                             -> V row of the same slot          (bf16)

rmsnorm is zero-centred (x * rsqrt(mean(x^2) + eps) * (1 + w)) over d = 256; rope is NeoX
(half-split) on the first `rotary` dims with inv_freq[j] = theta^(-2j/rotary) (text M-RoPE,
where t = h = w = pos). q_proj is a [B, Hq, d] view with dynamic row and head strides: decode
passes the q projection where its GEMV wrote it (head stride d), prefill the q halves of its
per-head [q_h | gate_h] rows (head stride 2d). The KV pool is viewed as rows of d values (see
inferno/kernels/kv_layout.py): row ((page * 2 + kv) * Hkv + g) * 64 + token.

One warp per head (q heads 0..Hq-1, then kv heads): lane l holds dims 8l..8l+7 (16-byte
accesses), so the norm is one warp reduction and the RoPE partner of lane l < rotary/16 is
lane l + rotary/16 (a butterfly shuffle). Grid = (cdiv(Hq + Hkv, warps), B).
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute

VEC = 8  # bf16 per 16-byte access
HEAD_DIM = 256
PAGE = 64


def _warp_sum(x):
    for i in range(5):  # unrolled at trace time (helpers are not preprocessed)
        x = x + cute.arch.shuffle_sync_bfly(x, offset=1 << i)
    return x


class AttnQkPrep:
    """q/k zero-centred RMSNorm + partial NeoX RoPE for every head, K/V written to the page cache."""

    def __init__(self, warps: int = 4, rotary: int = 64):
        if rotary not in (16, 32, 64, 128, 256):
            raise ValueError("rotary must be a power of two between 16 and 256")
        self.warps = warps
        self.rotary = rotary
        self.rot_lanes = rotary // VEC  # lanes holding rotary dims
        self.half_lanes = self.rot_lanes // 2  # butterfly distance to the rotate_half partner

    @cute.jit
    def __call__(self, mQP: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mQNorm: cute.Tensor,
                 mKNorm: cute.Tensor, mPos: cute.Tensor, mLens: cute.Tensor, mPT: cute.Tensor,
                 mKV: cute.Tensor, mQOut: cute.Tensor, eps: cutlass.Float32, theta: cutlass.Float32,
                 stream: cuda.CUstream):
        b = cute.size(mQOut, mode=[0])
        heads = cute.size(mQOut, mode=[1]) + cute.size(mK, mode=[1]) // HEAD_DIM
        self.kernel(mQP, mK, mV, mQNorm, mKNorm, mPos, mLens, mPT, mKV, mQOut, eps, theta).launch(
            grid=((heads + self.warps - 1) // self.warps, b, 1), block=(32 * self.warps, 1, 1), stream=stream
        )

    @cute.kernel
    def kernel(self, mQP: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mQNorm: cute.Tensor,
               mKNorm: cute.Tensor, mPos: cute.Tensor, mLens: cute.Tensor, mPT: cute.Tensor,
               mKV: cute.Tensor, mQOut: cute.Tensor, eps: cutlass.Float32, theta: cutlass.Float32):
        tidx, _, _ = cute.arch.thread_idx()
        cute.arch.griddepcontrol_wait()  # PDL: launched early, wait here for the previous kernel
        cute.arch.griddepcontrol_launch_dependents()
        bidx, seq, _ = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        hq = cute.size(mQOut, mode=[1])
        hkv = cute.size(mK, mode=[1]) // HEAD_DIM
        head = bidx * self.warps + warp
        chunks = HEAD_DIM // VEC  # 16-byte chunks per head

        if head < hq + hkv:
            kh = head - hq
            rX = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
            rW = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
            if head < hq:
                cute.autovec_copy(cute.zipped_divide(mQP[seq, head, None], (VEC,))[None, lane], rX)
                cute.autovec_copy(cute.zipped_divide(mQNorm, (VEC,))[None, lane], rW)
            else:
                cute.autovec_copy(cute.zipped_divide(mK[seq, None], (VEC,))[None, kh * chunks + lane], rX)
                cute.autovec_copy(cute.zipped_divide(mKNorm, (VEC,))[None, lane], rW)

            x = rX.load().to(cutlass.Float32)
            ss = _warp_sum((x * x).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0))
            scale = cute.math.rsqrt(ss / HEAD_DIM + eps, fastmath=False)
            rY = cute.make_rmem_tensor((VEC,), cutlass.Float32)
            rY.store(x * scale * (rW.load().to(cutlass.Float32) + 1.0))

            # NeoX RoPE on dims 0..rotary-1: y[i] = y[i] cos + (i < rotary/2 ? -y[i + r/2] : y[i - r/2]) sin.
            pos = cutlass.Float32(mPos[seq])
            log2_theta = cute.math.log2(theta, fastmath=False)
            half = self.rotary // 2
            for e in cutlass.range_constexpr(VEC):
                partner = cute.arch.shuffle_sync_bfly(rY[e], offset=self.half_lanes)
                if lane < self.rot_lanes:
                    j = (lane * VEC + e) % half
                    inv_freq = cute.math.exp2(cutlass.Float32(j) * (-2.0 / self.rotary) * log2_theta,
                                              fastmath=False)
                    angle = pos * inv_freq
                    rot = partner
                    if lane < self.half_lanes:
                        rot = -partner
                    rY[e] = rY[e] * cute.math.cos(angle, fastmath=False) + rot * cute.math.sin(angle, fastmath=False)

            if head < hq:
                cute.autovec_copy(rY, cute.zipped_divide(mQOut[seq, head, None], (VEC,))[None, lane])
            else:
                slot = mLens[seq] - 1
                if slot >= 0:  # lens = 0 marks an idle batch lane: nothing is cached
                    page = mPT[seq, slot // PAGE]
                    row_k = (page * 2 * hkv + kh) * PAGE + slot % PAGE
                    rB = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
                    rB.store(rY.load().to(cutlass.BFloat16))
                    cute.autovec_copy(rB, cute.zipped_divide(mKV[row_k, None], (VEC,))[None, lane])
                    cute.autovec_copy(cute.zipped_divide(mV[seq, None], (VEC,))[None, kh * chunks + lane], rX)
                    cute.autovec_copy(rX, cute.zipped_divide(mKV[row_k + hkv * PAGE, None], (VEC,))[None, lane])

