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

`DequantQTiled` does the same from the load-time `tile16-v1` image of the matrix
(inferno/kernels/tiled.py), `DequantNvfp4` for NVFP4 (`blockscale-k16-m128x4-v1`) and
`DequantNvfp4Tiled` for NVFP4 in `tile16-nvfp4-v1` (inferno/kernels/tiled_nvfp4.py); see their docstrings.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

CHUNK = 32  # codes per thread (row-split, NVFP4)
VEC = 8  # bf16 per 16-byte store = codes per tile16-v1 item
MAGIC = 0x4B000000  # float 2^23
TILE_ROWS = 16  # tile16-v1: rows per tile
BLOCK_WORDS = 128  # tile16-v1: int32 words of base codes per (tile, group) block (512 bytes)


def _s32(u: int) -> int:
    """A 32-bit pattern as a signed Python int (so it fits an Int32 constant)."""
    return u - (1 << 32) if u >= 1 << 31 else u


@dsl_user_op
def _bits_f32(v, *, loc=None, ip=None) -> cutlass.Float32:
    """Reinterpret an Int32 bit pattern as Float32."""
    return cutlass.Float32(llvm.bitcast(T.f32(), cutlass.Int32(v).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def _f32_bits(v, *, loc=None, ip=None) -> cutlass.Int32:
    """Reinterpret a Float32 as its Int32 bit pattern."""
    return cutlass.Int32(llvm.bitcast(T.i32(), cutlass.Float32(v).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


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


# ---- tile16-v1 arithmetic: plain integer code (DSL Int32 in the kernel, numpy in the CPU test) ----

def items_per_block(bits: int) -> int:
    """Items (8 codes of one row) per (tile, group) block: 128 base words, W8 64 word pairs."""
    return 64 if bits == 8 else 128


def high_block_words(bits: int) -> int:
    """int32 words of high bits per block: 64 hb bytes (hb = 2 for Q5, 4 for Q6, else 0)."""
    return {5: 32, 6: 64}.get(bits, 0)


def plane_words(bits: int, tiles, groups):
    """Word offsets (high plane, scale plane) of the image of `tiles` row tiles x `groups` groups.
    Every plane is a whole number of 256-byte units already, so no padding is added."""
    high = tiles * groups * BLOCK_WORDS
    return high, high + tiles * groups * high_block_words(bits)


def item_fields(bits: int, group: int, tile, j, v, groups):
    """Where item v of block (tile, group j) is read and written (tile, j, v >= 0).

    Returns (base word, high word, high shift, scale word, scale shift, row, col); the high and
    scale words are relative to their planes, row is the matrix row, col the item's first column.
    The lane that holds the item's bytes is l = v / 4 (W8: v / 2), its half (row g or g + 8)
    h = (v / 2) % 2 (W8: v % 2), and the item's first code is 16 t + 8 (v % 2) (W8: 8 t).
    """
    blk = tile * groups + j
    if bits == 8:
        base = blk * BLOCK_WORDS + 2 * v
        lane, half, u = v >> 1, v & 1, (v >> 1) & 3
    else:
        base = blk * BLOCK_WORDS + v
        lane, half, u = v >> 2, (v >> 1) & 1, 2 * ((v >> 2) & 3) + (v & 1)
    if bits == 5:  # Q5 (`tiled.pack_q5`): the lane's high word, its nibbles of word v % 2 of half h at bit 0
        high, high_shift = blk * 32 + (v >> 2), 4 * (v & 3)
    elif bits == 6:  # Q6: high half-word v of the block's 128 (bits 2q, 2q + 1)
        high, high_shift = blk * 64 + (v >> 1), 16 * (v & 1)
    else:
        high, high_shift = 0, 0
    g = lane >> 2
    # scale block (tile, pair) = blk / 2 (groups is even); binary16 at byte 8 g + 4 (j % 2) + 2 h
    scale, scale_shift = (blk >> 1) * 16 + 2 * g + (j & 1), 16 * half
    row = TILE_ROWS * tile + g + 8 * half
    col = j * group + VEC * u
    return base, high, high_shift, scale, scale_shift, row, col


def code_bits(bits: int, base, high, q: int):
    """code + 2^(bits - 1) (unsigned) of code q (0..7) of an item: base its word (W8: its two
    words), high its high-bit word shifted so that bit 0 is the item's first high bit (Q5: its code 3
    nibble, `tiled.pack_q5`)."""
    if bits == 8:
        return ((base[q // 4] >> (8 * (q % 4))) & 0xFF) ^ 0x80
    if bits == 5:  # codes 0-2 / 4-6 whole at bits 5q / 16 + 5(q - 4); 3 and 7: nibble in high, bit 4 at 15 / 31
        if q % 4 == 3:
            return ((high >> (4 * q - 12)) & 0xF) | ((((base >> (4 * q + 3)) & 1) ^ 1) << 4)
        return ((base >> (5 * (q % 4) + 16 * (q // 4))) & 0x1F) ^ 0x10
    nib = (base >> (4 * q)) & 0xF
    if bits == 4:
        return nib ^ 0x8
    return nib | ((((high >> (2 * q)) & 3) ^ 2) << 4)


class DequantQTiled:
    """Groupwise-int `tile16-v1` -> bf16, the same output as `DequantQ` (rows [n0, n0 + M) of W,
    K unpadded, its own row stride); the weight argument is the whole tile16-v1 image of [N, K].

    An *item* is 8 codes of one row: a 4-byte base word of a (tile, group) block (W8: an 8-byte
    pair), in block order, so item v of a block is its word v (W8: pair v) and the 32 items of a
    warp instruction are 128 (256) contiguous bytes. In the layout's lane order (lane l = 4g + t,
    16 bytes: row g, then row g + 8) the items of one instruction are 4 rows x 64 codes (W8: 8 rows
    x 32 codes), so each thread's 8 bf16 go out as one 16-byte store and a warp store writes whole
    128-byte lines (W8: 64-byte halves). CTA (x, y) takes row tile n0 / 16 + y and `items` x
    `threads` consecutive items of it from item x * items * threads on (thread tid, step s: the
    same item of a block `threads / items_per_block` groups further each step); it issues all its
    loads, then decodes and stores. The index arithmetic (`item_fields`, `code_bits`) is the plain
    integer code above, run on DSL values here and on numpy arrays by the CPU test.
    """

    def __init__(self, bits: int, group: int, threads: int = 256, items: int = 4):
        if (bits, group) not in ((4, 64), (5, 64), (6, 64), (8, 32)):
            raise ValueError("format must be bits/group 4/64, 5/64, 6/64 or 8/32")
        if threads % items_per_block(bits):
            raise ValueError(f"threads must be a multiple of {items_per_block(bits)}")
        self.bits, self.group, self.threads, self.items = bits, group, threads, items
        self.nvec = 2 if bits == 8 else 1  # base words per item
        self.bias = 1 << (bits - 1)
        self.per_block = items_per_block(bits)
        self.jstep = threads // self.per_block  # groups apart of a thread's consecutive items

    @cute.jit
    def __call__(self, mW: cute.Tensor, mOut: cute.Tensor, n_total: cutlass.Int32, n0: cutlass.Int32,
                 stream: cuda.CUstream):
        m = cute.size(mOut, mode=[0])
        k = cute.size(mOut, mode=[1])
        per_cta = self.items * self.threads
        # 2 K_pad items per row tile; M / 16 + 1 tiles (a slice that starts inside a tile touches one more)
        grid = (((k + 127) // 128 * 256 + per_cta - 1) // per_cta, (m + TILE_ROWS - 1) // TILE_ROWS + 1, 1)
        self.kernel(mW, mOut, n_total, n0).launch(grid=grid, block=(self.threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mW: cute.Tensor, mOut: cute.Tensor, n_total: cutlass.Int32, n0: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidy, _ = cute.arch.block_idx()
        m = cute.size(mOut, mode=[0])
        k = cute.size(mOut, mode=[1])
        groups = (k + 127) // 128 * (128 // self.group)
        tile = n0 // TILE_ROWS + bidy
        j0 = bidx * (self.items * self.jstep) + tidx // self.per_block  # the thread's first group
        if tile * TILE_ROWS < n0 + m and j0 < groups:
            high_off, scale_off = plane_words(self.bits, (n_total + TILE_ROWS - 1) // TILE_ROWS, groups)
            v = tidx % self.per_block
            wb = cute.make_rmem_tensor((self.nvec, self.items), cutlass.Int32)
            hw = cute.make_rmem_tensor((self.items,), cutlass.Int32)
            sw = cute.make_rmem_tensor((self.items,), cutlass.Int32)
            dst = cute.make_rmem_tensor((2, self.items), cutlass.Int32)  # (out row or -1, col)
            gW2 = cute.zipped_divide(mW, (2,))
            # all loads first (groups past the last clamped to it; their stores are skipped)
            for s in cutlass.range_constexpr(self.items):
                j = j0 + s * self.jstep
                base, high, high_shift, scale, scale_shift, row, col = item_fields(
                    self.bits, self.group, tile, cutlass.min(j, groups - 1), v, groups)
                if cutlass.const_expr(self.bits == 8):
                    cute.autovec_copy(gW2[None, base // 2], wb[None, s])
                else:
                    wb[0, s] = mW[base]
                if cutlass.const_expr(self.bits in (5, 6)):
                    hw[s] = mW[high_off + high] >> high_shift
                sw[s] = mW[scale_off + scale] >> scale_shift
                dst[0, s] = cutlass.select_(j < groups, row - n0, -1)
                dst[1, s] = col
            for s in cutlass.range_constexpr(self.items):
                sc = _f16lo_f32(sw[s])
                if cutlass.const_expr(self.bits == 8):
                    base = (wb[0, s], wb[1, s])
                else:
                    base = wb[0, s]
                vals = cute.make_rmem_tensor((VEC,), cutlass.Float32)
                for q in cutlass.range_constexpr(VEC):
                    c = code_bits(self.bits, base, hw[s], q)
                    vals[q] = (_bits_f32(c | MAGIC) - cutlass.Float32(8388608.0 + self.bias)) * sc
                out = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
                out.store(vals.load().to(cutlass.BFloat16))
                r, col = dst[0, s], dst[1, s]
                if r >= 0 and r < m and col < k:
                    gO = cute.zipped_divide(mOut[r, None], (VEC,))
                    cute.autovec_copy(out, gO[None, col // VEC])


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


# ---- tile16-nvfp4-v1 arithmetic: plain integer code (DSL Int32 in the kernel, numpy in the CPU test) ----

NV_BLOCK_WORDS = 128  # tile16-nvfp4-v1: int32 words of codes per (tile, 64-code block) block (512 bytes)
NV_PAIR_WORDS = 32  # int32 words of scales per (tile, block pair) (128 bytes)


def nvfp4_plane_words(tiles, blocks):
    """Word offsets (scale plane, divisor) of the tile16-nvfp4-v1 image of `tiles` row tiles x
    `blocks` 64-code blocks (blocks even): the code plane is whole 512-byte blocks, so the scale
    plane needs no padding."""
    scale = tiles * blocks * NV_BLOCK_WORDS
    return scale, scale + tiles * blocks * (NV_PAIR_WORDS // 2)


def nvfp4_load_words(tile, j, lane, blocks):
    """(first code word, scale word relative to its plane) lane `lane` loads for block (tile, j):
    its 16 bytes of the block (4 words) and its 4 bytes of the block pair's scales."""
    blk = tile * blocks + j
    return blk * NV_BLOCK_WORDS + 4 * lane, (blk >> 1) * NV_PAIR_WORDS + lane


def nvfp4_store_fields(tile, j, lane, i):
    """Store i (0..3) of lane l = 4g + t of block (tile, j): 8 codes of row 16 tile + g + 8 h
    (h = i / 2), chunk c = 4 (i % 2) + t of the row's 8 in the block, so the four lanes of a row
    write 64 contiguous bytes. Returns (source lane, source word, scale shift, row, col): the
    codes are word `source word` (0..3) of the source lane's 16 bytes (2 h or 2 h + 1), the scale
    byte `scale shift / 8` of the source lane's scale word."""
    g, t, h, u = lane >> 2, lane & 3, i >> 1, i & 1
    src = (lane & 28) | (2 * u) | (t >> 1)  # the lane holding group c / 2 = 2u + t / 2 of row g
    word = 2 * h + (t & 1)
    return src, word, 8 * (2 * (j & 1) + h), TILE_ROWS * tile + g + 8 * h, 64 * j + VEC * (4 * u + t)


@dsl_user_op
def prmt(a, b, sel, *, loc=None, ip=None) -> cutlass.Int32:
    """PTX prmt.b32 (default mode): byte i of the result = byte (sel >> 4i) & 7 of {b, a}."""
    return cutlass.Int32(llvm.inline_asm(
        T.i32(), [cutlass.Int32(x).ir_value(loc=loc, ip=ip) for x in (a, b, sel)],
        "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


# ---- NVFP4 decode in the bf16 domain by byte permutes: plain integer code, `prmt` passed in ----

FAST_Q1_MIN = 2.0 ** -124  # q1 = s / d_w at or above: no result below the normal range
FAST_Q3_MAX = 2.0 ** 125  # q3 = 1.5 s / d_w at or below: 4 q3 stays finite in bf16


def bf16_rne_bits(f):
    """bf16 bits (RNE) of the non-negative finite float32 with bits f."""
    return (f + 0x7FFF + ((f >> 16) & 1)) >> 16


def nvfp4_lut(b1, b3, prmt):
    """Byte tables of R[m] = the bf16 bits of e2m1(m) * s / d_w for the 8 magnitudes m, from
    b1 = bf16(q1), b3 = bf16(q3): R = 0, b1 / 2, b1, b3, 2 b1, 2 b3, 4 b1, 4 b3 (a power of two
    scales the exponent field: +-0x80 per factor 2). Returns (low bytes of R[0..3], of R[4..7],
    high bytes of R[0..3], of R[4..7]) as words."""
    a = (b1 - 0x80) << 16  # R0, R1
    b = b1 | (b3 << 16)  # R2, R3
    c = b + 0x00800080  # R4, R5
    d = b + 0x01000100  # R6, R7
    return prmt(a, b, 0x6420), prmt(c, d, 0x6420), prmt(a, b, 0x7531), prmt(c, d, 0x7531)


def nvfp4_code_planes(w):
    """Per-word setup of 8 codes (nibble q = code q): (magnitudes of codes 0, 2, 4, 6 as byte
    pairs of nibbles m * 0x11, the same of codes 1, 3, 5, 7, their signs at bit 7 of each byte,
    the same of 1, 3, 5, 7)."""
    return ((w & 0x07070707) * 0x11, ((w >> 4) & 0x07070707) * 0x11,
            (w << 4) & _s32(0x80808080), w & _s32(0x80808080))


def nvfp4_pair_word(i, planes, lut, prmt):
    """bf16 bits of codes 2i (low half) and 2i + 1 (high half): R[m] looked up by byte permutes
    (selector nibbles m_lo, m_lo, m_hi, m_hi), the sign bits placed at bits 15 and 31."""
    e2, o2, se, so = planes
    sel = prmt(e2, o2, i | ((4 + i) << 4))
    lo = prmt(lut[0], lut[1], sel)
    hi = prmt(lut[2], lut[3], sel)
    sg = prmt(se, so, (i << 4) | ((4 + i) << 12))
    return (lo & 0x00FF00FF) | (hi & _s32(0xFF00FF00)) | (sg & _s32(0x80008000))


class DequantNvfp4Tiled:
    """NVFP4 `tile16-nvfp4-v1` -> bf16: the same output as `DequantNvfp4` (rows [n0, n0 + M) of W,
    its own row stride, `f32(e2m1 * e4m3) / d_w` with IEEE division, one RNE rounding to bf16);
    the weight argument is the whole image of [N, K] (inferno/kernels/tiled_nvfp4.py).

    A warp takes one 512-byte (tile, 64-code block) block: lane l = 4g + t loads its 16 bytes
    (row g, then row g + 8: group 4j + t of each) and its scale word of the block pair (one
    128-byte warp load). Each lane then makes four 16-byte stores; for store i it fetches, by warp
    shuffle, the code word (8 codes) of chunk 4 (i % 2) + t of row g + 8 (i / 2) and its scale
    word from the lane that holds them, so a warp store writes 64 contiguous bytes of each of
    8 rows (whole sectors). CTA (x, y) takes row tile n0 / 16 + y and `items` x warps
    consecutive blocks from x * items * warps on (warp w, step s: block x * items * warps +
    s * warps + w); each thread issues its loads first. Everything that decides a branch around
    the shuffles is uniform over the warp. N may be any (the image's padding rows are not stored),
    K a multiple of 16 (columns past K, i.e. the image's padding block, are not stored).

    Decoding, with the same bytes: the 8 codes of a store share a scale s, and e2m1 * s is
    p * s or p * (1.5 s) with p in {0, .5, 1, 2, 4} (signed), both products exact. With
    q1 = RN(s / d_w) and q3 = RN(1.5 s / d_w) (two divisions per 8 codes instead of eight), the
    output bf16(RN(p * s / d_w)) = p * bf16(q1) (or p * bf16(q3)) exactly whenever
    q1 >= 2^-124 (nothing below the normal range, where power-of-two scaling stops commuting with
    rounding) and q3 <= 2^125 (4 bf16(q3) finite). The 8 possible bf16 results R[m] are then
    two 8-byte tables (`nvfp4_lut`), and each pair of codes is 4 byte permutes and 2 LOP3s
    (`nvfp4_pair_word`), written as bf16 bits (no float conversion). Otherwise (s = 0, or
    extreme d_w) those 8 codes take `DequantNvfp4`'s per-code division.
    tests/test_kernels_dequant_nvfp4_tiled.py checks every scale word x code over d_w across the
    float32 range.
    """

    def __init__(self, threads: int = 256, items: int = 4):
        if threads % 32:
            raise ValueError("threads must be whole warps")
        self.threads, self.items = threads, items
        self.warps = threads // 32

    @cute.jit
    def __call__(self, mW: cute.Tensor, mOut: cute.Tensor, n_total: cutlass.Int32, n0: cutlass.Int32,
                 stream: cuda.CUstream):
        m = cute.size(mOut, mode=[0])
        k = cute.size(mOut, mode=[1])
        per_cta = self.items * self.warps
        grid = (((k + 127) // 128 * 2 + per_cta - 1) // per_cta, (m + TILE_ROWS - 1) // TILE_ROWS + 1, 1)
        self.kernel(mW, mOut, n_total, n0).launch(grid=grid, block=(self.threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mW: cute.Tensor, mOut: cute.Tensor, n_total: cutlass.Int32, n0: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidy, _ = cute.arch.block_idx()
        m = cute.size(mOut, mode=[0])
        k = cute.size(mOut, mode=[1])
        blocks = (k + 127) // 128 * 2
        tile = n0 // TILE_ROWS + bidy
        warp, lane = tidx // 32, tidx % 32
        j0 = bidx * (self.items * self.warps) + warp
        if tile * TILE_ROWS < n0 + m and j0 < blocks:  # uniform over the warp
            scale_w0, div_w = nvfp4_plane_words((n_total + TILE_ROWS - 1) // TILE_ROWS, blocks)
            d_w = _bits_f32(mW[div_w])
            wb = cute.make_rmem_tensor((4, self.items), cutlass.Int32)
            sw = cute.make_rmem_tensor((self.items,), cutlass.Int32)
            gW4 = cute.zipped_divide(mW, (4,))
            # all loads first (blocks past the last clamped to it; their stores are skipped)
            for s in cutlass.range_constexpr(self.items):
                jc = cutlass.min(j0 + s * self.warps, blocks - 1)
                code_w, scale_w = nvfp4_load_words(tile, jc, lane, blocks)
                cute.autovec_copy(gW4[None, code_w // 4], wb[None, s])
                sw[s] = mW[scale_w0 + scale_w]
            for s in cutlass.range_constexpr(self.items):
                j = j0 + s * self.warps
                if j < blocks:  # uniform over the warp: every lane takes part in the shuffles
                    for i in cutlass.range_constexpr(4):
                        src, word, shift, row, col = nvfp4_store_fields(tile, j, lane, i)
                        lo = cute.arch.shuffle_sync(wb[2 * (i // 2), s], src)  # words 2h, 2h + 1
                        hi = cute.arch.shuffle_sync(wb[2 * (i // 2) + 1, s], src)
                        w = cutlass.select_((word & 1) == 1, hi, lo)
                        sb = (cute.arch.shuffle_sync(sw[s], src) >> shift) & 0xFF
                        e = sb >> 3
                        normal = _bits_f32(((e + 120) << 23) | ((sb & 7) << 20))
                        sc = cutlass.select_(e == 0, cutlass.Float32(sb & 7) * cutlass.Float32(2.0 ** -9), normal)
                        out = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
                        q1 = sc / d_w
                        q3 = (sc * cutlass.Float32(1.5)) / d_w
                        if q1 >= cutlass.Float32(FAST_Q1_MIN) and q3 <= cutlass.Float32(FAST_Q3_MAX):
                            lut = nvfp4_lut(bf16_rne_bits(_f32_bits(q1)), bf16_rne_bits(_f32_bits(q3)), prmt)
                            planes = nvfp4_code_planes(w)
                            ow = cute.recast_tensor(out, cutlass.Int32)
                            for pair in cutlass.range_constexpr(VEC // 2):
                                ow[pair] = nvfp4_pair_word(pair, planes, lut, prmt)
                        else:
                            vals = cute.make_rmem_tensor((VEC,), cutlass.Float32)
                            for q in cutlass.range_constexpr(VEC):
                                vals[q] = (_bits_f32(_e2m1_bits((w >> (4 * q)) & 0xF)) * sc) / d_w
                            out.store(vals.load().to(cutlass.BFloat16))
                        r = row - n0
                        if r >= 0 and r < m and col < k:
                            gO = cute.zipped_divide(mOut[r, None], (VEC,))
                            cute.autovec_copy(out, gO[None, col // VEC])
