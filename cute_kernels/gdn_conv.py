"""Gated DeltaNet decode: causal depthwise conv1d update + SiLU, with the conv-state shift.

One decode token per sequence. For sequence b (state slot s = slots[b]) and channel c:

    out[b, c]      = silu(w[0, c] * st[s, 0, c] + ... + w[K-2, c] * st[s, K-2, c] + w[K-1, c] * x[b, c])
    st[s, :, c]    = (st[s, 1, c], ..., st[s, K-2, c], x[b, c])        (the last K-1 raw inputs)

Layouts (bf16): x [B, C] (row stride), out [B, C] (row stride), conv state [slots, K-1, C] tap-major
(tap 0 = oldest input; HF's conv_state[C, K-1] transposed), conv weight [K, C] tap-major (HF's
conv1d.weight[C, 1, K] squeezed and transposed; tap K-1 multiplies the current token), slots [B]
int32. fp32 math. Each thread handles one 16-byte chunk (8 channels): grid = (cdiv(C, 8 *
threads), B). C must be a multiple of 8. The conv input is the bf16 projection output, so the
bf16 conv state holds it exactly.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute

VEC = 8  # bf16 channels per 16-byte access


class GdnConv:
    """Causal conv1d (kernel `width`) decode update + SiLU over C channels for B sequences."""

    def __init__(self, threads: int = 128, width: int = 4):
        if threads % 32 or not 32 <= threads <= 1024:
            raise ValueError("threads must be whole warps, 32..1024")
        if width < 2:
            raise ValueError("conv width must be at least 2")
        self.threads = threads
        self.width = width

    @cute.jit
    def __call__(self, mX: cute.Tensor, mState: cute.Tensor, mW: cute.Tensor, mSlots: cute.Tensor,
                 mOut: cute.Tensor, stream: cuda.CUstream):
        b = cute.size(mOut, mode=[0])
        c = cute.size(mOut, mode=[1])
        per_cta = VEC * self.threads
        self.kernel(mX, mState, mW, mSlots, mOut).launch(
            grid=((c + per_cta - 1) // per_cta, b, 1), block=(self.threads, 1, 1), stream=stream
        )

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mState: cute.Tensor, mW: cute.Tensor, mSlots: cute.Tensor,
               mOut: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, seq, _ = cute.arch.block_idx()
        taps = self.width - 1
        chunk = bidx * self.threads + tidx
        if chunk < cute.size(mOut, mode=[1]) // VEC:
            slot = mSlots[seq]
            rX = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
            cute.autovec_copy(cute.zipped_divide(mX[seq, None], (VEC,))[None, chunk], rX)
            rS = cute.make_rmem_tensor((VEC, taps), cutlass.BFloat16)
            for t in cutlass.range_constexpr(taps):
                cute.autovec_copy(cute.zipped_divide(mState[slot, t, None], (VEC,))[None, chunk], rS[None, t])
            rW = cute.make_rmem_tensor((VEC, self.width), cutlass.BFloat16)
            for t in cutlass.range_constexpr(self.width):
                cute.autovec_copy(cute.zipped_divide(mW[t, None], (VEC,))[None, chunk], rW[None, t])

            acc = rX.load().to(cutlass.Float32) * rW[None, taps].load().to(cutlass.Float32)
            for t in cutlass.range_constexpr(taps):
                acc = acc + rS[None, t].load().to(cutlass.Float32) * rW[None, t].load().to(cutlass.Float32)
            # silu(a) = a / (1 + exp(-a))
            e = cute.math.exp2(acc * -1.4426950408889634, fastmath=True)
            rO = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
            rO.store((acc / (e + 1.0)).to(cutlass.BFloat16))
            cute.autovec_copy(rO, cute.zipped_divide(mOut[seq, None], (VEC,))[None, chunk])

            # Shift the window: tap t takes tap t + 1, the newest tap takes x.
            for t in cutlass.range_constexpr(taps - 1):
                cute.autovec_copy(rS[None, t + 1],
                                  cute.zipped_divide(mState[slot, t, None], (VEC,))[None, chunk])
            cute.autovec_copy(rX, cute.zipped_divide(mState[slot, taps - 1, None], (VEC,))[None, chunk])
