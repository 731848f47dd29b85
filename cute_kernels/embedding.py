"""bf16 embedding-row gather: out[t, :] = table[ids[t], :].

`ids` is [T] int32, `table` [V, H] bf16, `out` [T, H] bf16. Ids outside [0, V) give a zero
row (the engine validates ids; the kernel never reads outside the table). Each thread copies
one 16-byte chunk: grid = (cdiv(H, 8 * threads), T). H must be a multiple of 8.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute

VEC = 8


class EmbeddingGather:
    """Copy table rows selected by int32 ids."""

    def __init__(self, threads: int = 256):
        self.threads = threads

    @cute.jit
    def __call__(self, mIds: cute.Tensor, mTable: cute.Tensor, mOut: cute.Tensor,
                 stream: cuda.CUstream):
        t = cute.size(mOut, mode=[0])
        h = cute.size(mOut, mode=[1])
        per_cta = VEC * self.threads
        self.kernel(mIds, mTable, mOut).launch(
            grid=((h + per_cta - 1) // per_cta, t, 1), block=(self.threads, 1, 1), stream=stream
        )

    @cute.kernel
    def kernel(self, mIds: cute.Tensor, mTable: cute.Tensor, mOut: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        cute.arch.griddepcontrol_wait()  # PDL: launched early, wait here for the previous kernel
        cute.arch.griddepcontrol_launch_dependents()
        bidx, row, _ = cute.arch.block_idx()
        vocab = cute.size(mTable, mode=[0])
        chunk = bidx * self.threads + tidx
        if chunk < cute.size(mOut, mode=[1]) // VEC:
            tok = mIds[row]
            rV = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
            rV.fill(0)
            if tok >= 0 and tok < vocab:
                cute.autovec_copy(cute.zipped_divide(mTable[tok, None], (VEC,))[None, chunk], rV)
            cute.autovec_copy(rV, cute.zipped_divide(mOut[row, None], (VEC,))[None, chunk])
