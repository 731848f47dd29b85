"""Decode GEMV on bf16 weights: y[t, n] = sum_k W[n, k] * x[t, k].

W bf16 [N, K] (row stride w_stride), x bf16 [T, K] with T <= `cols`, fp32 accumulation, bf16 y
[T, N]. For the small bf16 matrices of the decode step (the GDN a|b projection, [2 Hv, hidden])
that the tiled GEMM runs on a couple of CTAs: here each CTA owns `rows` weight rows and its
`threads` threads split K in 8-element (16-byte) chunks, thread j taking chunks j, j + threads,
..., so every weight row is read once, coalesced, and the grid has N / rows CTAs. Each x chunk
is reused `rows` times. Partial sums reduce with warp shuffles, then through shared memory.
K must be a multiple of 8 (16-byte rows); N and T are free.

PDL: the weights do not depend on the previous kernel, so each thread loads its first `prefetch`
chunks of every weight row into registers before `griddepcontrol.wait`; x (and the norm weight)
are read after it, those chunks' x at once. Chunks past them stream through a loop (`unroll`).

Epilogues: "plain"; "residual" (y = r + W x, r bf16 [T, N]); "swiglu" (W rows = [gate I | up I],
out[t, i] = silu(gate_i . x_t) * (up_i . x_t), out [T, I]; a CTA owns the gate and up rows of its
rows / 2 outputs).

Folded RMSNorm (`norm=True`, supported with cols = 1 and the plain epilogue only): x is the
un-normed residual stream [1, K], nw bf16 [K] the zero-centred norm weight, and the GEMV reads
xn = bf16(x * rsqrt(mean(x^2) + eps) * (1 + nw)), rounded as `cute_kernels/rmsnorm.py` rounds it
(fp32 math, the same formula order; the sum of squares is reduced in another order). Every CTA
computes the statistic itself from x (K * 2 bytes from L2).
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute

VEC = 8  # bf16 per 16-byte load


class GemvBf16:
    """One CTA per `rows` weight rows; `threads` threads split K in 16-byte chunks."""

    def __init__(self, cols: int, rows: int = 1, threads: int = 128, unroll: int = 2, epilogue: str = "plain",
                 norm: bool = False, prefetch: int = 1):
        if not 1 <= cols <= 8:
            raise ValueError("cols must be 1..8")
        if epilogue not in ("plain", "residual", "swiglu"):
            raise ValueError("epilogue must be plain, residual or swiglu")
        if epilogue == "swiglu" and rows % 2:
            raise ValueError("swiglu needs an even number of rows (gate + up per output)")
        if threads % 32 or rows * cols > threads:
            raise ValueError("threads must be whole warps and at least rows * cols")
        if norm and (cols != 1 or epilogue != "plain"):
            raise ValueError("the folded RMSNorm is supported at cols = 1 with the plain epilogue only")
        if prefetch < 1:
            raise ValueError("prefetch must be at least 1 chunk")
        self.cols, self.rows, self.threads, self.unroll = cols, rows, threads, unroll
        self.warps = threads // 32
        self.epilogue = epilogue
        self.norm = norm
        self.outs = rows // 2 if epilogue == "swiglu" else rows
        self.prefetch = prefetch

    @cute.jit
    def __call__(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mNw: cute.Tensor, mY: cute.Tensor,
                 eps: cutlass.Float32 | None, stream: cuda.CUstream):
        m = cute.size(mY, mode=[1])
        grid = ((m + self.outs - 1) // self.outs, 1, 1)
        self.kernel(mW, mX, mR, mNw, mY, eps).launch(grid=grid, block=(self.threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mNw: cute.Tensor, mY: cute.Tensor,
               eps: cutlass.Float32 | None):
        self.body(mW, mX, mR, mNw, mY, eps, None)

    @cute.jit
    def body(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mNw: cute.Tensor, mY: cute.Tensor,
             eps: cutlass.Float32 | None, mS: cute.Tensor | None):
        """The GEMV; mS (fp32 [K], T = 1) or None: x is read as bf16(x + s)."""
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        warp = tidx // 32
        n_out = cute.size(mY, mode=[1])
        t_rows = cute.size(mX, mode=[0])
        k = cute.size(mX, mode=[1])
        nchunks = k // VEC
        pre = self.prefetch

        # Row r serves output o0 + r % outs (the up half for swiglu when r >= outs); outputs past
        # the end re-read the last row and are not stored, as columns t >= T re-read the last x row.
        # Staged chunks past the row end re-read its last chunk and are not accumulated: the loads
        # are unconditional, so they all issue at once.
        o0 = bidx * self.outs
        gW = [cute.zipped_divide(mW[cutlass.min(o0 + r % self.outs, n_out - 1) + (r // self.outs) * n_out, None],
                                 (VEC,)) for r in range(self.rows)]

        # The weights do not depend on the previous kernel: stage this thread's first chunks now.
        wpre = cute.make_rmem_tensor((VEC, pre, self.rows), cutlass.BFloat16)
        for i in cutlass.range_constexpr(pre):
            for r in cutlass.range_constexpr(self.rows):
                cute.autovec_copy(gW[r][None, cutlass.min(tidx + i * self.threads, nchunks - 1)], wpre[None, i, r])

        cute.arch.griddepcontrol_wait()  # PDL: launched early, wait here for the previous kernel
        cute.arch.griddepcontrol_launch_dependents()

        gX = [cute.zipped_divide(mX[cutlass.min(t, t_rows - 1), None], (VEC,)) for t in range(self.cols)]
        gS = None
        if cutlass.const_expr(mS is not None):
            gS = cute.zipped_divide(mS, (VEC,))
        xpre = cute.make_rmem_tensor((VEC, pre, self.cols), cutlass.BFloat16)
        for i in cutlass.range_constexpr(pre):
            for t in cutlass.range_constexpr(self.cols):
                cute.autovec_copy(gX[t][None, cutlass.min(tidx + i * self.threads, nchunks - 1)], xpre[None, i, t])
        if cutlass.const_expr(mS is not None):  # every load above first, then the sums
            spre = cute.make_rmem_tensor((VEC, pre), cutlass.Float32)
            for i in cutlass.range_constexpr(pre):
                cute.autovec_copy(gS[None, cutlass.min(tidx + i * self.threads, nchunks - 1)], spre[None, i])
            for i in cutlass.range_constexpr(pre):
                xpre[None, i, 0].store((xpre[None, i, 0].load().to(cutlass.Float32) + spre[None, i].load())
                                       .to(cutlass.BFloat16))

        smem = cutlass.memory.SmemAllocator()
        scale = cutlass.Float32(1.0)
        if cutlass.const_expr(self.norm):
            gN = cute.zipped_divide(mNw, (VEC,))
            npre = cute.make_rmem_tensor((VEC, pre), cutlass.BFloat16)
            for i in cutlass.range_constexpr(pre):
                cute.autovec_copy(gN[None, cutlass.min(tidx + i * self.threads, nchunks - 1)], npre[None, i])
            part = smem.allocate_tensor(cutlass.Float32, cute.make_layout((self.warps,)))
            scale = self.norm_scale(gX[0], gS, xpre, k, nchunks, eps, part, tidx, lane, warp)

        acc = cute.make_rmem_tensor((self.rows * self.cols,), cutlass.Float32)
        acc.fill(0.0)
        for i in cutlass.range_constexpr(pre):
            if tidx + i * self.threads < nchunks:
                wf = cute.make_rmem_tensor((VEC, self.rows), cutlass.Float32)
                for r in cutlass.range_constexpr(self.rows):
                    wf[None, r].store(wpre[None, i, r].load().to(cutlass.Float32))
                for t in cutlass.range_constexpr(self.cols):
                    xf = cute.make_rmem_tensor((VEC,), cutlass.Float32)
                    if cutlass.const_expr(self.norm):
                        xf.store(self.normed(xpre[None, i, 0], npre[None, i], scale))
                    else:
                        xf.store(xpre[None, i, t].load().to(cutlass.Float32))
                    self.fma(acc, wf, xf, t)

        for c in cutlass.range(tidx + pre * self.threads, nchunks, self.threads, unroll=self.unroll):
            wf = cute.make_rmem_tensor((VEC, self.rows), cutlass.Float32)
            for r in cutlass.range_constexpr(self.rows):
                wb = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
                cute.autovec_copy(gW[r][None, c], wb)
                wf[None, r].store(wb.load().to(cutlass.Float32))
            for t in cutlass.range_constexpr(self.cols):
                xb = self.x_chunk(gX[t], gS, c)
                xf = cute.make_rmem_tensor((VEC,), cutlass.Float32)
                if cutlass.const_expr(self.norm):
                    nb = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
                    cute.autovec_copy(gN[None, c], nb)
                    xf.store(self.normed(xb, nb, scale))
                else:
                    xf.store(xb.load().to(cutlass.Float32))
                self.fma(acc, wf, xf, t)

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

    @cute.jit
    def x_chunk(self, gx: cute.Tensor, gs: cute.Tensor | None, c):
        """Chunk c of x (bf16, in registers), or of bf16(x + s) when gs (the sums' chunks) is given."""
        xb = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
        cute.autovec_copy(gx[None, c], xb)
        if cutlass.const_expr(gs is not None):
            sb = cute.make_rmem_tensor((VEC,), cutlass.Float32)
            cute.autovec_copy(gs[None, c], sb)
            xb.store((xb.load().to(cutlass.Float32) + sb.load()).to(cutlass.BFloat16))
        return xb

    @cute.jit
    def fma(self, acc: cute.Tensor, wf: cute.Tensor, xf: cute.Tensor, t: cutlass.Constexpr):
        """acc[r, t] += W chunk row r . x chunk, for every row of the CTA."""
        for r in cutlass.range_constexpr(self.rows):
            for i in cutlass.range_constexpr(VEC):
                acc[r * self.cols + t] = acc[r * self.cols + t] + wf[i, r] * xf[i]

    @cute.jit
    def normed(self, xb: cute.Tensor, nb: cute.Tensor, scale: cutlass.Float32):
        """One chunk of xn = bf16(x * scale * (1 + nw)), back in fp32 (rmsnorm.py's rounding)."""
        y = xb.load().to(cutlass.Float32) * scale * (nb.load().to(cutlass.Float32) + 1.0)
        return y.to(cutlass.BFloat16).to(cutlass.Float32)

    @cute.jit
    def norm_scale(self, gx: cute.Tensor, gs: cute.Tensor | None, xpre: cute.Tensor, k, nchunks, eps: cutlass.Float32,
                   part: cute.Tensor, tidx, lane, warp):
        """rsqrt(mean(x^2) + eps) over the whole x row (x + s with gs): the staged chunks, then those past them."""
        ss = cutlass.Float32(0.0)
        for i in cutlass.range_constexpr(self.prefetch):
            v = xpre[None, i, 0].load().to(cutlass.Float32)
            sq = (v * v).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0)
            if tidx + i * self.threads < nchunks:
                ss = ss + sq
        for c in cutlass.range(tidx + self.prefetch * self.threads, nchunks, self.threads, unroll=self.unroll):
            v = self.x_chunk(gx, gs, c).load().to(cutlass.Float32)
            ss = ss + (v * v).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0)
        for sh in cutlass.range_constexpr(5):
            ss = ss + cute.arch.shuffle_sync_bfly(ss, offset=1 << sh)
        if lane == 0:
            part[warp] = ss
        cute.arch.sync_threads()
        total = cutlass.Float32(0.0)
        for w in cutlass.range_constexpr(self.warps):
            total = total + part[w]
        return cute.math.rsqrt(total / cutlass.Float32(k) + eps, fastmath=False)


class GemvBf16Add(GemvBf16):
    """GemvBf16 (T = 1, plain, the RMSNorm folded) reading x as bf16(x + s), s fp32 [K]: the sums an
    `accumulate` GEMV left (a residual deferred to the GEMVs that read it; this one only reads them)."""

    def __init__(self, *args, add: bool = True, **kw):
        super().__init__(*args, **kw)
        if not add or not self.norm:
            raise ValueError("add: the folded-norm variant (cols = 1, plain) only")

    @cute.jit
    def __call__(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mNw: cute.Tensor, mY: cute.Tensor,
                 eps: cutlass.Float32 | None, mS: cute.Tensor, stream: cuda.CUstream):
        m = cute.size(mY, mode=[1])
        grid = ((m + self.outs - 1) // self.outs, 1, 1)
        self.kernel(mW, mX, mR, mNw, mY, eps, mS).launch(grid=grid, block=(self.threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mNw: cute.Tensor, mY: cute.Tensor,
               eps: cutlass.Float32 | None, mS: cute.Tensor):
        self.body(mW, mX, mR, mNw, mY, eps, mS)
