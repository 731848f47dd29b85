"""Decode GEMV on bf16 weights: y[t, n] = sum_k W[n, k] * x[t, k].

W bf16 [N, K] (row stride w_stride), x bf16 [T, K] with T <= `cols`, fp32 accumulation, bf16 y
[T, N]. For the small bf16 matrices of the decode step (the GDN a|b projection, [2 Hv, hidden])
that the tiled GEMM runs on a couple of CTAs: here each CTA owns `rows` weight rows and its
`threads` threads split K in 8-element (16-byte) chunks, thread j taking chunks j, j + threads,
..., so every weight row is read once, coalesced, and the grid has N / rows CTAs. Each x chunk
is reused `rows` times. Partial sums reduce with warp shuffles, then through shared memory.
K must be a multiple of 8 (16-byte rows); N and T are free.

Epilogues: "plain"; "residual" (y = r + W x, r bf16 [T, N]); "swiglu" (W rows = [gate I | up I],
out[t, i] = silu(gate_i . x_t) * (up_i . x_t), out [T, I]; a CTA owns the gate and up rows of its
rows / 2 outputs).
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute

VEC = 8  # bf16 per 16-byte load


class GemvBf16:
    """One CTA per `rows` weight rows; `threads` threads split K in 16-byte chunks."""

    def __init__(self, cols: int, rows: int = 1, threads: int = 128, unroll: int = 2, epilogue: str = "plain"):
        if not 1 <= cols <= 8:
            raise ValueError("cols must be 1..8")
        if epilogue not in ("plain", "residual", "swiglu"):
            raise ValueError("epilogue must be plain, residual or swiglu")
        if epilogue == "swiglu" and rows % 2:
            raise ValueError("swiglu needs an even number of rows (gate + up per output)")
        if threads % 32 or rows * cols > threads:
            raise ValueError("threads must be whole warps and at least rows * cols")
        self.cols, self.rows, self.threads, self.unroll = cols, rows, threads, unroll
        self.warps = threads // 32
        self.epilogue = epilogue
        self.outs = rows // 2 if epilogue == "swiglu" else rows

    @cute.jit
    def __call__(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mY: cute.Tensor,
                 stream: cuda.CUstream):
        m = cute.size(mY, mode=[1])
        grid = ((m + self.outs - 1) // self.outs, 1, 1)
        self.kernel(mW, mX, mR, mY).launch(grid=grid, block=(self.threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mY: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        cute.arch.griddepcontrol_wait()  # PDL: launched early, wait here for the previous kernel
        cute.arch.griddepcontrol_launch_dependents()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        warp = tidx // 32
        n_out = cute.size(mY, mode=[1])
        t_rows = cute.size(mX, mode=[0])
        k = cute.size(mX, mode=[1])
        nchunks = k // VEC

        # Row r serves output o0 + r % outs (the up half for swiglu when r >= outs); outputs past
        # the end re-read the last row and are not stored.
        o0 = bidx * self.outs
        gW = [cute.zipped_divide(mW[cutlass.min(o0 + r % self.outs, n_out - 1) + (r // self.outs) * n_out, None],
                                 (VEC,)) for r in range(self.rows)]
        gX = [cute.zipped_divide(mX[t, None], (VEC,)) for t in range(self.cols)]

        acc = cute.make_rmem_tensor((self.rows * self.cols,), cutlass.Float32)
        acc.fill(0.0)
        for c in cutlass.range(tidx, nchunks, self.threads, unroll=self.unroll):
            wf = cute.make_rmem_tensor((VEC, self.rows), cutlass.Float32)
            for r in cutlass.range_constexpr(self.rows):
                wb = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
                cute.autovec_copy(gW[r][None, c], wb)
                wf[None, r].store(wb.load().to(cutlass.Float32))
            for t in cutlass.range_constexpr(self.cols):
                xb = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
                xb.fill(0.0)
                if t < t_rows:
                    cute.autovec_copy(gX[t][None, c], xb)
                xf = cute.make_rmem_tensor((VEC,), cutlass.Float32)
                xf.store(xb.load().to(cutlass.Float32))
                for r in cutlass.range_constexpr(self.rows):
                    for i in cutlass.range_constexpr(VEC):
                        acc[r * self.cols + t] = acc[r * self.cols + t] + wf[i, r] * xf[i]

        smem = cutlass.memory.SmemAllocator()
        red = smem.allocate_tensor(cutlass.Float32, cute.make_layout((self.warps, self.rows * self.cols)))
        for e in cutlass.range_constexpr(self.rows * self.cols):
            v = acc[e]
            for sh in cutlass.range_constexpr(5):
                v = v + cute.arch.shuffle_sync_bfly(v, offset=1 << sh)
            if lane == 0:
                red[warp, e] = v
        cute.arch.sync_threads()

        if tidx < self.outs * self.cols:
            oi = tidx // self.cols
            t = tidx % self.cols
            o = o0 + oi
            if o < n_out:
                if t < t_rows:
                    a = cutlass.Float32(0.0)
                    for w in cutlass.range_constexpr(self.warps):
                        a = a + red[w, tidx]
                    if cutlass.const_expr(self.epilogue == "swiglu"):
                        u = cutlass.Float32(0.0)
                        for w in cutlass.range_constexpr(self.warps):
                            u = u + red[w, (oi + self.outs) * self.cols + t]
                        a = a / (1.0 + cute.math.exp(-a, fastmath=False)) * u
                    if cutlass.const_expr(self.epilogue == "residual"):
                        a = a + mR[t, o].to(cutlass.Float32)
                    mY[t, o] = a.to(cutlass.BFloat16)
