"""Portable bf16 GEMM (SIMT, fp32 FMA): C = A @ B^T for any arch, the fallback to `gemm_sm90`.

A is [M, K], B is [N, K], C is [M, N], all row-major bf16; fp32 accumulate. A 256-thread CTA
computes a 64 x 64 tile of C: per 32-wide k-step every thread loads one 16-byte chunk of A and
one of B into padded fp32 shared-memory tiles, then accumulates a 4 x 4 block of outputs
(rows ty + 16 i, columns tx + 16 j, conflict-free reads). Edges are masked, so M and N are
free; K must be a multiple of 8 (whole 16-byte chunks).
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute

VEC = 8
TILE = 64
TILE_K = 32
THREADS = 256
PER_THREAD = 4  # outputs per thread along M and along N


class SimtGemm:
    """bf16 x bf16 -> bf16 GEMM (fp32 accumulate) on CUDA cores."""

    def __init__(self):
        self.threads = THREADS

    @cute.jit
    def __call__(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, stream: cuda.CUstream):
        m = cute.size(mC, mode=[0])
        n = cute.size(mC, mode=[1])
        self.kernel(mA, mB, mC).launch(
            grid=((n + TILE - 1) // TILE, (m + TILE - 1) // TILE, 1),
            block=(THREADS, 1, 1), stream=stream,
        )

    @cute.kernel
    def kernel(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bn, bm, _ = cute.arch.block_idx()
        m = cute.size(mC, mode=[0])
        n = cute.size(mC, mode=[1])
        k = cute.size(mA, mode=[1])
        m0 = bm * TILE
        n0 = bn * TILE

        smem = cutlass.memory.SmemAllocator()
        padded = cute.make_layout((TILE, TILE_K), stride=(TILE_K + 1, 1))
        sA = smem.allocate_tensor(cutlass.Float32, padded)
        sB = smem.allocate_tensor(cutlass.Float32, padded)

        # Loader role: thread t fills row t // 4, k-chunk (t % 4) * 8 of both tiles.
        ld_row = tidx // (TILE_K // VEC)
        ld_k = (tidx % (TILE_K // VEC)) * VEC
        # Compute role: thread (ty, tx) owns rows ty + 16 i and columns tx + 16 j.
        ty = tidx // 16
        tx = tidx % 16

        acc = cute.make_rmem_tensor((PER_THREAD, PER_THREAD), cutlass.Float32)
        acc.fill(0.0)
        rA = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
        rB = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
        for k0 in cutlass.range(0, k, TILE_K, unroll=1):
            rA.fill(0)
            rB.fill(0)
            kc = k0 + ld_k
            if kc < k:
                if m0 + ld_row < m:
                    cute.autovec_copy(
                        cute.zipped_divide(mA[m0 + ld_row, None], (VEC,))[None, kc // VEC], rA
                    )
                if n0 + ld_row < n:
                    cute.autovec_copy(
                        cute.zipped_divide(mB[n0 + ld_row, None], (VEC,))[None, kc // VEC], rB
                    )
            for v in cutlass.range_constexpr(VEC):
                sA[ld_row, ld_k + v] = rA[v].to(cutlass.Float32)
                sB[ld_row, ld_k + v] = rB[v].to(cutlass.Float32)
            cute.arch.sync_threads()
            for kk in cutlass.range(TILE_K, unroll=8):
                for i in cutlass.range_constexpr(PER_THREAD):
                    a = sA[ty + 16 * i, kk]
                    for j in cutlass.range_constexpr(PER_THREAD):
                        acc[i, j] = acc[i, j] + a * sB[tx + 16 * j, kk]
            cute.arch.sync_threads()

        for i in cutlass.range_constexpr(PER_THREAD):
            r = m0 + ty + 16 * i
            for j in cutlass.range_constexpr(PER_THREAD):
                c = n0 + tx + 16 * j
                if r < m and c < n:
                    mC[r, c] = acc[i, j].to(cutlass.BFloat16)
