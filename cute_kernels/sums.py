"""Reading the fp32 sums an accumulating GEMV leaves (deferred epilogues, docs/kernels-gemv-mma.md): rounded to
bf16 as the GEMV's epilogue would round them, and zeroed once read for the next accumulating GEMV."""

import cutlass
import cutlass.cute as cute


@cute.jit
def load_bf16(src: cute.Tensor, dst: cute.Tensor, sums: cutlass.Constexpr):
    """dst (bf16 registers) <- src: bf16, or (sums) fp32 rounded to bf16 as a GEMV's epilogue rounds it."""
    if cutlass.const_expr(sums):
        r = cute.make_rmem_tensor(cute.size(dst), cutlass.Float32)
        cute.autovec_copy(src, r)
        dst.store(r.load().to(cutlass.BFloat16))
    else:
        cute.autovec_copy(src, dst)


@cute.jit
def zero_f32(dst: cute.Tensor):
    """Zeroes of dst (fp32, global)."""
    r = cute.make_rmem_tensor(cute.size(dst), cutlass.Float32)
    r.fill(0.0)
    cute.autovec_copy(r, dst)
