"""SiLU-gated product for a fused gate_up projection: out = silu(gate) * up.

`gu` is [T, 2I] bf16 with gate in columns [0, I) and up in [I, 2I) of each row (what a fused
gate_up GEMM/GEMV emits); `out` is [T, I] bf16. fp32 math. Each thread handles one 16-byte
chunk (8 elements) of one output row: grid = (cdiv(I, 8 * threads), T). I must be a multiple
of 8.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute

VEC = 8


class SiluMul:
    """out[t, i] = silu(gu[t, i]) * gu[t, I + i]."""

    def __init__(self, threads: int = 256):
        self.threads = threads

    @cute.jit
    def __call__(self, mGU: cute.Tensor, mOut: cute.Tensor, stream: cuda.CUstream):
        t = cute.size(mOut, mode=[0])
        i = cute.size(mOut, mode=[1])
        per_cta = VEC * self.threads
        self.kernel(mGU, mOut).launch(
            grid=((i + per_cta - 1) // per_cta, t, 1), block=(self.threads, 1, 1), stream=stream
        )

    @cute.kernel
    def kernel(self, mGU: cute.Tensor, mOut: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, row, _ = cute.arch.block_idx()
        inter = cute.size(mOut, mode=[1])
        chunk = bidx * self.threads + tidx
        n_chunks = inter // VEC
        if chunk < n_chunks:
            gG = cute.zipped_divide(mGU[row, None], (VEC,))
            gO = cute.zipped_divide(mOut[row, None], (VEC,))
            rG = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
            rU = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
            cute.autovec_copy(gG[None, chunk], rG)
            cute.autovec_copy(gG[None, chunk + n_chunks], rU)
            g = rG.load().to(cutlass.Float32)
            u = rU.load().to(cutlass.Float32)
            # silu(g) = g / (1 + exp(-g)), with exp(-g) = exp2(-g * log2(e)).
            e = cute.math.exp2(g * -1.4426950408889634, fastmath=True)
            rO = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
            rO.store((g / (e + 1.0) * u).to(cutlass.BFloat16))
            cute.autovec_copy(rO, gO[None, chunk])
