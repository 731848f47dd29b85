"""Groupwise-int weights (`row-split-k128-v1`) dequantised to a bf16 row-major matrix.

    out[r, k] = bf16(f32(scale[n0 + r, k / G]) * code[n0 + r, k])   for r < M, k < K

for Q4G64 / Q5G64 / Q6G64 / W8G32 (bits 4/5/6/8, group 64/64/64/32). The weight argument is the
whole payload of the [N, K] matrix as int32 words (plane arithmetic as in cute_kernels/gemv_q.py
and inferno/kernels/qlayout.py); `out` is [M, K] with its own row stride, so a big matrix can be
dequantised in row slices [n0, n0 + M) into a scratch tile that the bf16 GEMM reads.

One thread per 32-code chunk (row r, chunk c); consecutive threads take consecutive chunks of a
row, so a warp reads 512 (W8: 1024) contiguous base bytes with 16-byte loads and writes 2 KiB of
contiguous bf16 with 16-byte stores. The product code * scale has at most 19 significant bits,
so it is exact in fp32 and the one bf16 rounding matches `decode(...).astype(bfloat16)`.
Chunks past K (the 128-padding) are not stored; K must be a multiple of 8.

`DequantNvfp4` does the same for NVFP4 (`blockscale-k16-m128x4-v1`); see its docstring.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

CHUNK = 32  # codes per thread
VEC = 8  # bf16 per 16-byte store
MAGIC = 0x4B000000  # float 2^23


def _s32(u: int) -> int:
    """A 32-bit pattern as a signed Python int (so it fits an Int32 constant)."""
    return u - (1 << 32) if u >= 1 << 31 else u


@dsl_user_op
def _bits_f32(v, *, loc=None, ip=None) -> cutlass.Float32:
    """Reinterpret an Int32 bit pattern as Float32."""
    return cutlass.Float32(llvm.bitcast(T.f32(), cutlass.Int32(v).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def _f16lo_f32(v, *, loc=None, ip=None) -> cutlass.Float32:
    """The binary16 in the low half of an Int32, as Float32 (exact)."""
    return cutlass.Float32(llvm.inline_asm(
        T.f32(), [cutlass.Int32(v).ir_value(loc=loc, ip=ip)],
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $1; cvt.f32.f16 $0, lo; }", "=f,r",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


class DequantQ:
    """One thread per (row, 32-code chunk) of the slice; `threads` threads per CTA."""

    def __init__(self, bits: int, group: int, threads: int = 256):
        if (bits, group) not in ((4, 64), (5, 64), (6, 64), (8, 32)):
            raise ValueError("format must be bits/group 4/64, 5/64, 6/64 or 8/32")
        if threads % 32:
            raise ValueError("threads must be whole warps")
        self.bits, self.group, self.threads = bits, group, threads
        self.nvec = 2 if bits == 8 else 1  # 16-byte base loads per chunk
        self.bias = 1 << (bits - 1)

    @cute.jit
    def __call__(self, mW: cute.Tensor, mOut: cute.Tensor, n_total: cutlass.Int32, n0: cutlass.Int32,
                 stream: cuda.CUstream):
        m = cute.size(mOut, mode=[0])
        k = cute.size(mOut, mode=[1])
        chunks = (k + 127) // 128 * (128 // CHUNK)
        grid = ((m * chunks + self.threads - 1) // self.threads, 1, 1)
        self.kernel(mW, mOut, n_total, n0).launch(grid=grid, block=(self.threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mW: cute.Tensor, mOut: cute.Tensor, n_total: cutlass.Int32, n0: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        m = cute.size(mOut, mode=[0])
        k = cute.size(mOut, mode=[1])
        k_pad = (k + 127) // 128 * 128
        chunks = k_pad // CHUNK
        i = bidx * self.threads + tidx
        if i < m * chunks:
            r = i // chunks
            c = i - r * chunks
            row = n0 + r
            # Plane offsets and per-row strides in int32 words (planes are 256-byte aligned).
            base_row = k_pad // 8 if self.bits < 8 else k_pad // 4
            high_row = k_pad // 32 if self.bits == 5 else k_pad // 16
            high_off = (n_total * base_row + 63) // 64 * 64
            scale_off = high_off
            if cutlass.const_expr(self.bits in (5, 6)):
                scale_off = high_off + (n_total * high_row + 63) // 64 * 64

            gW4 = cute.zipped_divide(mW, (4,))
            wb = cute.make_rmem_tensor((4, self.nvec), cutlass.Int32)
            for v in cutlass.range_constexpr(self.nvec):
                cute.autovec_copy(gW4[None, row * (base_row // 4) + c * self.nvec + v], wb[None, v])
            hw = cute.make_rmem_tensor((2,), cutlass.Int32)
            if cutlass.const_expr(self.bits == 5):
                hw[0] = mW[high_off + row * high_row + c] ^ -1  # flip bit 4: code + 16
            if cutlass.const_expr(self.bits == 6):
                for h in cutlass.range_constexpr(2):
                    hw[h] = mW[high_off + row * high_row + 2 * c + h] ^ _s32(0xAAAAAAAA)
            g = row * (k_pad // self.group) + c * CHUNK // self.group
            s = _f16lo_f32(mW[scale_off + g // 2] >> ((g % 2) * 16))

            vals = cute.make_rmem_tensor((VEC, CHUNK // VEC), cutlass.Float32)
            for j in cutlass.range_constexpr(CHUNK // VEC):
                for q in cutlass.range_constexpr(VEC):
                    v = self._code_bits(wb, hw, j, q)
                    f = _bits_f32(v | MAGIC) - cutlass.Float32(8388608.0 + self.bias)
                    vals[q, j] = f * s
            out = cute.make_rmem_tensor((VEC, CHUNK // VEC), cutlass.BFloat16)
            out.store(vals.load().to(cutlass.BFloat16))
            gO = cute.zipped_divide(mOut[r, None], (VEC,))
            for j in cutlass.range_constexpr(CHUNK // VEC):
                if c * CHUNK + j * VEC < k:
                    cute.autovec_copy(out[None, j], gO[None, c * (CHUNK // VEC) + j])

    @cute.jit
    def _code_bits(self, wb, hw, j, q):
        """code + bias (unsigned, < 2^bits) of code 8j + q of the chunk."""
        if cutlass.const_expr(self.bits == 8):
            w = wb[(2 * j + q // 4) % 4, (2 * j + q // 4) // 4] ^ _s32(0x80808080)
            return (w >> (8 * (q % 4))) & 0xFF
        if cutlass.const_expr(self.bits == 4):
            return ((wb[j, 0] ^ _s32(0x88888888)) >> (4 * q)) & 0xF
        nib = (wb[j, 0] >> (4 * q)) & 0xF
        if cutlass.const_expr(self.bits == 5):
            return nib | (((hw[0] >> (8 * j + q)) & 1) << 4)
        return nib | (((hw[j // 2] >> (2 * (8 * (j % 2) + q))) & 3) << 4)


def _e2m1_bits(c) -> cutlass.Int32:
    """The float32 bit pattern of E2M1 code c (4 bits: sign, 2 exponent, 1 mantissa; bias 1)."""
    c = cutlass.Int32(c)
    m = c & 7
    normal = (((m >> 1) + 126) << 23) | ((m & 1) << 22)
    sub = (m & 1) * 0x3F000000  # 0 or 0.5
    return ((c & 8) << 28) | cutlass.select_(m >= 2, normal, sub)


class DequantNvfp4:
    """NVFP4 `blockscale-k16-m128x4-v1` -> bf16: out[r, k] = bf16(f32(e2m1 * e4m3) / d_w).

    One thread per 32 codes (one 16-byte code load, two scale bytes from the swizzled scale
    plane: one word read, and the f32 divisor d_w, which every thread reads). The division is
    IEEE (div.rn.f32), as the format's decoder does it, so the result matches
    `nvfp4.decode(...).astype(bfloat16)` bit for bit. Needs N % 128 == 0 and K % 64 == 0.
    """

    def __init__(self, threads: int = 256):
        if threads % 32:
            raise ValueError("threads must be whole warps")
        self.threads = threads

    @cute.jit
    def __call__(self, mW: cute.Tensor, mOut: cute.Tensor, n_total: cutlass.Int32, n0: cutlass.Int32,
                 stream: cuda.CUstream):
        m = cute.size(mOut, mode=[0])
        k = cute.size(mOut, mode=[1])
        grid = ((m * (k // CHUNK) + self.threads - 1) // self.threads, 1, 1)
        self.kernel(mW, mOut, n_total, n0).launch(grid=grid, block=(self.threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mW: cute.Tensor, mOut: cute.Tensor, n_total: cutlass.Int32, n0: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        m = cute.size(mOut, mode=[0])
        k = cute.size(mOut, mode=[1])
        chunks = k // CHUNK
        i = bidx * self.threads + tidx
        if i < m * chunks:
            r = i // chunks
            c = i - r * chunks
            n = n0 + r
            code_words = n_total * (k // 8)
            scale_word0 = (code_words + 63) // 64 * 64  # the scale plane is 256-byte aligned
            d_w = _bits_f32(mW[scale_word0 + n_total * (k // 64)])

            gW4 = cute.zipped_divide(mW, (4,))
            wb = cute.make_rmem_tensor((4,), cutlass.Int32)
            cute.autovec_copy(gW4[None, n * (k // 32) + c], wb)
            g = 2 * c  # first of the chunk's two 16-code scale groups (g % 4 is 0 or 2)
            sw = mW[scale_word0 + ((n // 128) * (k // 64) + g // 4) * 128 + (n % 32) * 4 + (n % 128) // 32]
            scales = cute.make_rmem_tensor((2,), cutlass.Float32)
            for h in cutlass.range_constexpr(2):
                s = (sw >> (8 * ((g % 4) + h))) & 0xFF
                e = s >> 3
                normal = _bits_f32(((e + 120) << 23) | ((s & 7) << 20))
                scales[h] = cutlass.select_(e == 0, cutlass.Float32(s & 7) * cutlass.Float32(2.0 ** -9), normal)

            vals = cute.make_rmem_tensor((VEC, CHUNK // VEC), cutlass.Float32)
            for j in cutlass.range_constexpr(CHUNK // VEC):
                for q in cutlass.range_constexpr(VEC):
                    f = _bits_f32(_e2m1_bits((wb[j] >> (4 * q)) & 0xF))
                    vals[q, j] = (f * scales[j // 2]) / d_w
            out = cute.make_rmem_tensor((VEC, CHUNK // VEC), cutlass.BFloat16)
            out.store(vals.load().to(cutlass.BFloat16))
            gO = cute.zipped_divide(mOut[r, None], (VEC,))
            for j in cutlass.range_constexpr(CHUNK // VEC):
                cute.autovec_copy(out[None, j], gO[None, c * (CHUNK // VEC) + j])
