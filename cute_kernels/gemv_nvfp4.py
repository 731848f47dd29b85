"""Decode GEMV on NVFP4 weights, read straight from the `blockscale-k16-m128x4-v1` payload.

    y[t, n] = (sum_g e4m3(s[n, g]) * sum_{k in g} e2m1(c[n, k]) * x[t, k]) / d_w

(groups g of 16 along K), x bf16 [T, K] with T <= `cols`, fp32 accumulation, bf16 out.
Epilogues: "plain"; "residual" (y = r + W x); "swiglu" (W rows = [gate I | up I];
out[t, i] = silu(gate_i . x_t) * (up_i . x_t), out [T, I]). The format needs N % 128 == 0 and
K % 64 == 0, so there is no K padding and no row tail inside a 128-row tile.

The weight argument is the whole payload as int32 words: code plane (row-major, 2 codes a byte,
low nibble = even k), the swizzled E4M3 scale plane (256-byte aligned) and the FP32 divisor d_w.
A CTA owns `rows` weight rows (the gate and up rows of its outputs for swiglu), so each x load
is reused `rows` times; thread j takes 32-code chunks j, j + threads, ...: one 16-byte load of
codes per row and chunk (a warp reads 512 contiguous bytes of a row) and one scale word, whose
two bytes (c % 2 picks the pair) are the chunk's two 16-code group scales. Codes become floats
by building the float32 bit pattern (sign, exponent, mantissa bit); the products with x sum in
fp32 per 16-code group, which is then multiplied by its scale; d_w divides once at the end.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

CHUNK = 32  # codes per thread step (one 16-byte load)


@dsl_user_op
def _bits_f32(v, *, loc=None, ip=None) -> cutlass.Float32:
    """Reinterpret an Int32 bit pattern as Float32."""
    return cutlass.Float32(llvm.bitcast(T.f32(), cutlass.Int32(v).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


def _e2m1_f32(c) -> cutlass.Float32:
    """E2M1 code c (bit 3 sign, 2 exponent bits bias 1, 1 mantissa bit) as Float32 (exact)."""
    m = c & 7
    normal = (((m >> 1) + 126) << 23) | ((m & 1) << 22)  # 1, 1.5, 2, 3, 4, 6
    sub = (m & 1) * 0x3F000000  # 0 or 0.5
    return _bits_f32(((c & 8) << 28) | cutlass.select_(m >= 2, normal, sub))


def _e4m3_f32(s) -> cutlass.Float32:
    """E4M3FN word s (0..0x7E, sign clear) as Float32 (exact; subnormals s & 7 * 2^-9)."""
    e = s >> 3
    normal = _bits_f32(((e + 120) << 23) | ((s & 7) << 20))
    return cutlass.select_(e == 0, cutlass.Float32(s & 7) * cutlass.Float32(2.0 ** -9), normal)


class GemvNvfp4:
    """One CTA per `rows` weight rows; `threads` threads split K in 32-code chunks."""

    def __init__(self, cols: int, epilogue: str, rows: int = 4, threads: int = 128):
        if not 1 <= cols <= 8:
            raise ValueError("cols must be 1..8")
        if epilogue not in ("plain", "residual", "swiglu"):
            raise ValueError("epilogue must be plain, residual or swiglu")
        if epilogue == "swiglu" and rows % 2:
            raise ValueError("swiglu needs an even number of rows (gate + up per output)")
        if threads % 32 or rows * cols > threads:
            raise ValueError("threads must be whole warps and at least rows * cols")
        self.cols, self.epilogue, self.rows, self.threads = cols, epilogue, rows, threads
        self.warps = threads // 32
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
        n_w = n_out
        if cutlass.const_expr(self.epilogue == "swiglu"):
            n_w = n_out * 2
        nchunks = k // CHUNK
        # Plane offsets in int32 words: codes n_w * k / 8, scales from the next 256-byte boundary
        # (n_w * k / 64 words), then d_w.
        scale_off = (n_w * (k // 8) + 63) // 64 * 64
        d_w = _bits_f32(mW[scale_off + n_w * (k // 64)])

        # The weight rows of this CTA (rows past the end re-read the last row and are not stored).
        o0 = bidx * self.outs
        row = []
        srow = []  # scale word of (row, chunk 0) minus the chunk term
        for r in cutlass.range_constexpr(self.rows):
            n = cutlass.min(o0 + r % self.outs, n_out - 1) + (r // self.outs) * n_out
            row.append(n)
            srow.append(scale_off + (n // 128) * (k // 64) * 128 + (n % 32) * 4 + (n % 128) // 32)

        gW4 = cute.zipped_divide(mW, (4,))
        gX = [cute.zipped_divide(mX[t, None], (8,)) for t in range(self.cols)]

        acc = cute.make_rmem_tensor((self.rows * self.cols,), cutlass.Float32)
        acc.fill(0.0)
        for c in cutlass.range(tidx, nchunks, self.threads, unroll=1):
            wb = cute.make_rmem_tensor((4, self.rows), cutlass.Int32)
            for r in cutlass.range_constexpr(self.rows):
                cute.autovec_copy(gW4[None, row[r] * (k // CHUNK) + c], wb[None, r])
            sw = cute.make_rmem_tensor((self.rows,), cutlass.Int32)
            for r in cutlass.range_constexpr(self.rows):
                sw[r] = mW[srow[r] + (c // 2) * 128] >> ((c % 2) * 16)

            for h in cutlass.range_constexpr(2):  # the chunk's two 16-code groups
                part = cute.make_rmem_tensor((self.rows * self.cols,), cutlass.Float32)
                part.fill(0.0)
                for jj in cutlass.range_constexpr(2):
                    j = 2 * h + jj
                    xs = cute.make_rmem_tensor((8, self.cols), cutlass.Float32)
                    for t in cutlass.range_constexpr(self.cols):
                        xb = cute.make_rmem_tensor((8,), cutlass.BFloat16)
                        xb.fill(0.0)
                        if t < t_rows:
                            cute.autovec_copy(gX[t][None, c * (CHUNK // 8) + j], xb)
                        xs[None, t].store(xb.load().to(cutlass.Float32))
                    for r in cutlass.range_constexpr(self.rows):
                        for i in cutlass.range_constexpr(8):
                            f = _e2m1_f32((wb[j, r] >> (4 * i)) & 0xF)
                            for t in cutlass.range_constexpr(self.cols):
                                part[r * self.cols + t] = part[r * self.cols + t] + f * xs[i, t]
                for r in cutlass.range_constexpr(self.rows):
                    s = _e4m3_f32((sw[r] >> (8 * h)) & 0xFF)
                    for t in cutlass.range_constexpr(self.cols):
                        acc[r * self.cols + t] = acc[r * self.cols + t] + s * part[r * self.cols + t]

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
                        a = a + red[w, oi * self.cols + t]
                    a = a / d_w
                    if cutlass.const_expr(self.epilogue == "swiglu"):
                        u = cutlass.Float32(0.0)
                        for w in cutlass.range_constexpr(self.warps):
                            u = u + red[w, (oi + self.outs) * self.cols + t]
                        u = u / d_w
                        a = a / (1.0 + cute.math.exp(-a, fastmath=False)) * u
                    if cutlass.const_expr(self.epilogue == "residual"):
                        a = a + mR[t, o].to(cutlass.Float32)
                    mY[t, o] = a.to(cutlass.BFloat16)
