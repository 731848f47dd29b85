"""Gated DeltaNet prefill: causal depthwise conv1d (kernel 4) + SiLU over T tokens of one sequence.

    xin          = (st[slot, 0], ..., st[slot, K-2], x[0], ..., x[T-1])      (raw inputs, per channel)
    out[t, c]    = silu(sum_tap w[tap, c] * xin[t + tap, c])
    st[slot, :]  = xin[T .. T+K-2]                                      (the last K-1 raw inputs)

Same layouts as the decode conv (cute_kernels/gdn_conv.py): x and out [T, C] bf16 (row strides),
conv state [slots, K-1, C] bf16 tap-major (tap 0 = oldest), conv weight [K, C] bf16 tap-major.
Each thread owns one 16-byte chunk (8 channels) for `tokens` consecutive tokens, sliding its
window in registers: grid = (cdiv(C, 8 * threads), cdiv(T, tokens)). Only the CTAs of the
first token block read the old conv state, and those same threads write the new one after
their reads, so no CTA reads a state another has overwritten. x and out must not overlap.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute

VEC = 8  # bf16 channels per 16-byte access
LOG2E = 1.4426950408889634


class GdnConvPrefill:
    """Causal conv1d (kernel `width`) + SiLU over T tokens, continuing from and updating the conv state."""

    def __init__(self, threads: int = 128, width: int = 4, tokens: int = 16):
        if threads % 32 or not 32 <= threads <= 1024:
            raise ValueError("threads must be whole warps, 32..1024")
        if width < 2:
            raise ValueError("conv width must be at least 2")
        if tokens < width - 1:
            raise ValueError("tokens per thread must be at least width - 1 (the state hand-over)")
        self.threads, self.width, self.tokens = threads, width, tokens

    @cute.jit
    def __call__(self, mX: cute.Tensor, mState: cute.Tensor, mW: cute.Tensor, mOut: cute.Tensor,
                 slot: cutlass.Int32, stream: cuda.CUstream):
        t = cute.size(mOut, mode=[0])
        c = cute.size(mOut, mode=[1])
        per_cta = VEC * self.threads
        self.kernel(mX, mState, mW, mOut, slot).launch(
            grid=((c + per_cta - 1) // per_cta, (t + self.tokens - 1) // self.tokens, 1),
            block=(self.threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mState: cute.Tensor, mW: cute.Tensor, mOut: cute.Tensor,
               slot: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidy, _ = cute.arch.block_idx()
        taps = self.width - 1
        bf16, f32 = cutlass.BFloat16, cutlass.Float32
        t_len = cute.size(mOut, mode=[0])
        chunk = bidx * self.threads + tidx
        t0 = bidy * self.tokens
        if chunk < cute.size(mOut, mode=[1]) // VEC:
            w = []
            for tap in cutlass.range_constexpr(self.width):
                rw = cute.make_rmem_tensor((VEC,), bf16)
                cute.autovec_copy(cute.zipped_divide(mW[tap, None], (VEC,))[None, chunk], rw)
                w.append(rw.load().to(f32))
            # The window before token t0: raw inputs t0-K+1 .. t0-1 (from the state before token 0).
            win = []
            for j in cutlass.range_constexpr(taps):
                win.append(self._raw(mX, mState, slot, t0 - taps + j, chunk).to(f32))
            for s in cutlass.range_constexpr(self.tokens):
                t = t0 + s
                rx = cute.make_rmem_tensor((VEC,), bf16)
                rx.fill(0.0)
                if t < t_len:
                    cute.autovec_copy(cute.zipped_divide(mX[t, None], (VEC,))[None, chunk], rx)
                x = rx.load().to(f32)
                acc = x * w[taps]
                for j in cutlass.range_constexpr(taps):
                    acc = acc + win[j] * w[j]
                if t < t_len:
                    ro = cute.make_rmem_tensor((VEC,), bf16)
                    ro.store((acc / (cute.math.exp2(acc * -LOG2E, fastmath=True) + 1.0)).to(bf16))
                    cute.autovec_copy(ro, cute.zipped_divide(mOut[t, None], (VEC,))[None, chunk])
                win = win[1:] + [x]
            if bidy == 0:
                # New state: raw inputs T-K+1 .. T-1; all are read before any is written.
                new = []
                for j in cutlass.range_constexpr(taps):
                    rn = cute.make_rmem_tensor((VEC,), bf16)
                    rn.store(self._raw(mX, mState, slot, t_len - taps + j, chunk))
                    new.append(rn)
                for j in cutlass.range_constexpr(taps):
                    cute.autovec_copy(new[j], cute.zipped_divide(mState[slot, j, None], (VEC,))[None, chunk])

    @cute.jit
    def _raw(self, mX: cute.Tensor, mState: cute.Tensor, slot, p, chunk):
        """Raw input p of the sequence's conv input (p < 0: state tap p + K - 1), 8 channels, bf16."""
        r = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
        if p >= 0:
            cute.autovec_copy(cute.zipped_divide(mX[p, None], (VEC,))[None, chunk], r)
        else:
            cute.autovec_copy(cute.zipped_divide(mState[slot, p + self.width - 1, None], (VEC,))[None, chunk], r)
        return r.load()
