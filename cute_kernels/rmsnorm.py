"""Zero-centred RMSNorm over bf16 rows, optionally fused with a residual add.

    y = x * rsqrt(mean(x^2) + eps) * (1 + w)            (RMSNorm)
    h = x + r;  y = norm(h)  with h written out         (fused residual add + RMSNorm)

bf16 in and out, fp32 math. Each row is handled by `threads_per_row` threads; a CTA holds
`rows_per_cta` rows at a time and walks rows with a grid stride, so any grid size is valid (the
registry caps it at a few CTAs per SM). Every thread keeps up to `chunks` 16-byte chunks (8 bf16)
of its row in registers: one pass over global memory reads x (and r) once and writes y (and h)
once, the weight is read once per CTA, and the next row's loads are in flight while the current
row is reduced and written. N must be a multiple of 8 and at most threads_per_row * chunks * 8.
In the fused form the norm is taken of h as written (rounded to bf16), so y == norm(h) exactly
as stored.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute

VEC = 8  # bf16 elements per 16-byte access


class RMSNorm:
    """Row RMSNorm (zero-centred weight), one or several rows per CTA."""

    def __init__(self, threads_per_row: int, rows_per_cta: int, chunks: int, residual: bool):
        if not 1 <= threads_per_row <= 1024 or (
            threads_per_row % 32 if threads_per_row > 32 else threads_per_row & (threads_per_row - 1)
        ):
            raise ValueError("threads_per_row must be a power of two up to 32, or whole warps up to 1024")
        if threads_per_row * rows_per_cta % 32:
            raise ValueError("a CTA must be whole warps (the row reduction shuffles across full warps)")
        self.tpr = threads_per_row
        self.rows_per_cta = rows_per_cta
        self.chunks = chunks
        self.residual = residual
        self.threads = threads_per_row * rows_per_cta
        self.warps_per_row = max(threads_per_row // 32, 1)
        self.max_n = threads_per_row * chunks * VEC

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,
        mR: cute.Tensor,
        mW: cute.Tensor,
        mY: cute.Tensor,
        mH: cute.Tensor,
        eps: cutlass.Float32,
        stream: cuda.CUstream,
    ):
        m = cute.size(mX, mode=[0])
        grid = ((m + self.rows_per_cta - 1) // self.rows_per_cta, 1, 1)
        self.kernel(mX, mR, mW, mY, mH, eps).launch(
            grid=grid, block=(self.threads, 1, 1), stream=stream
        )

    @cute.kernel
    def kernel(
        self,
        mX: cute.Tensor,
        mR: cute.Tensor,
        mW: cute.Tensor,
        mY: cute.Tensor,
        mH: cute.Tensor,
        eps: cutlass.Float32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        m = cute.size(mX, mode=[0])
        n = cute.size(mX, mode=[1])
        n_chunks = n // VEC
        row_in_cta = tidx // self.tpr
        lane = tidx % self.tpr
        # CTA b handles rows b*R + i*G*R (+ its row slot) for i < iters: any grid size works.
        step = gdim * self.rows_per_cta
        first = bidx * self.rows_per_cta + row_in_cta
        iters = (m - bidx * self.rows_per_cta + step - 1) // step

        smem = cutlass.memory.SmemAllocator()
        partial = smem.allocate_tensor(
            cutlass.Float32, cute.make_layout((self.warps_per_row, self.rows_per_cta, 2))
        )

        # The weight is loaded once per CTA.
        gW = cute.zipped_divide(mW, (VEC,))
        rW = cute.make_rmem_tensor((VEC, self.chunks), cutlass.BFloat16)
        rW.fill(0)
        for i in cutlass.range_constexpr(self.chunks):
            c = i * self.tpr + lane
            if c < n_chunks:
                cute.autovec_copy(gW[None, c], rW[None, i])

        cute.arch.griddepcontrol_wait()  # PDL: the weight is read early; wait here for the previous kernel
        cute.arch.griddepcontrol_launch_dependents()

        rX = cute.make_rmem_tensor((VEC, self.chunks), cutlass.BFloat16)
        rR = cute.make_rmem_tensor((VEC, self.chunks), cutlass.BFloat16)
        self.load_row(mX, first, m, n_chunks, lane, rX)
        if cutlass.const_expr(self.residual):
            self.load_row(mR, first, m, n_chunks, lane, rR)

        for it in cutlass.range(iters, unroll=1):
            row = first + it * step
            # Prefetch the next row while this one is reduced and written.
            rXn = cute.make_rmem_tensor((VEC, self.chunks), cutlass.BFloat16)
            rRn = cute.make_rmem_tensor((VEC, self.chunks), cutlass.BFloat16)
            self.load_row(mX, row + step, m, n_chunks, lane, rXn)
            if cutlass.const_expr(self.residual):
                self.load_row(mR, row + step, m, n_chunks, lane, rRn)
                rX.store((rX.load().to(cutlass.Float32) + rR.load().to(cutlass.Float32)).to(cutlass.BFloat16))
                self.store_row(mH, row, m, n_chunks, lane, rX)

            xf = rX.load().to(cutlass.Float32)
            ss = (xf * xf).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0)
            offset = 1
            for _ in cutlass.range_constexpr(min(self.tpr, 32).bit_length() - 1):
                ss = ss + cute.arch.shuffle_sync_bfly(ss, offset=offset)
                offset *= 2
            if cutlass.const_expr(self.warps_per_row > 1):
                # Double-buffered partials: the next iteration's writes cannot race this one's reads.
                buf = it % 2
                if lane % 32 == 0:
                    partial[lane // 32, row_in_cta, buf] = ss
                cute.arch.sync_threads()
                ss = cutlass.Float32(0.0)
                for w in cutlass.range_constexpr(self.warps_per_row):
                    ss = ss + partial[w, row_in_cta, buf]

            scale = cute.math.rsqrt(ss / cutlass.Float32(n) + eps, fastmath=False)
            rY = cute.make_rmem_tensor((VEC, self.chunks), cutlass.BFloat16)
            rY.store((xf * scale * (rW.load().to(cutlass.Float32) + 1.0)).to(cutlass.BFloat16))
            self.store_row(mY, row, m, n_chunks, lane, rY)
            rX.store(rXn.load())
            if cutlass.const_expr(self.residual):
                rR.store(rRn.load())

    @cute.jit
    def load_row(self, mT: cute.Tensor, row, m, n_chunks, lane, rT: cute.Tensor):
        """This thread's 16-byte chunks of row `row` (zeros past the row end or when row >= m)."""
        rT.fill(0)
        if row < m:
            g = cute.zipped_divide(mT[row, None], (VEC,))
            for i in cutlass.range_constexpr(self.chunks):
                c = i * self.tpr + lane
                if c < n_chunks:
                    cute.autovec_copy(g[None, c], rT[None, i])

    @cute.jit
    def store_row(self, mT: cute.Tensor, row, m, n_chunks, lane, rT: cute.Tensor):
        if row < m:
            g = cute.zipped_divide(mT[row, None], (VEC,))
            for i in cutlass.range_constexpr(self.chunks):
                c = i * self.tpr + lane
                if c < n_chunks:
                    cute.autovec_copy(rT[None, i], g[None, c])
