"""Decode GEMV on groupwise-int weights, read straight from the `row-split-k128-v1` payload.

    y[t, n] = sum_k W[n, k] * x[t, k],   W[n, k] = f32(scale[n, k / G]) * code[n, k]

for Q4G64 / Q5G64 / Q6G64 / W8G32 (bits 4/5/6/8, group 64/64/64/32), x bf16 [T, K] with
T <= `cols`, fp32 accumulation, bf16 out. Epilogues: "plain"; "residual" (y = r + W x);
"swiglu" (W rows = [gate I | up I]; out[t, i] = silu(gate_i . x_t) * (up_i . x_t), out [T, I]).

The weight argument is the whole payload as int32 words (planes: base nibbles/bytes, high bits,
fp16 scales; see docs/kernels-gemv.md). Per row the planes are contiguous, so a row-per-CTA
mapping where thread j takes 32-code chunks j, j + threads, ... reads every plane coalesced:
16-byte loads of base codes (two for W8), 4/8-byte loads of high bits (Q5/Q6) and the scale
word, with every weight byte read once. A CTA owns `rows` weight rows (the gate and up rows of
its outputs for swiglu) so each x load is reused `rows` times; threads split K and reduce with
warp shuffles, then through shared memory.

Codes become floats without int->float conversions: a code field is OR-ed into the mantissa
of 2^23 and 2^23 (+ the sign bias) subtracted, which is exact. With `inplace` (default) the
field stays where it lies in its word (nibble i at bit 4i, or 4(i-3) of the word >> 12; W8 byte
b at 8(b%2) of the word or the word >> 16), giving code * 16^p (256^p) for one AND/OR per code,
and x is pre-scaled by 16^-p (exact, shared by the CTA's rows). `inplace=False` shifts every
field down to bit 0 first (kept for A/B measurement). Each 32-code chunk is summed in fp32 and
then multiplied by its group's scale. For Q4/W8, 2^23 and the sign-flip XOR constant are kept in
registers (one LOP3 per code instead of LOP3 + MOV; `regconst=False` keeps the old immediates).
The chunk loop runs twice: over the chunks whose x lie wholly below k (no bounds checks), then
over the rest.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

CHUNK = 32  # codes per thread step
MAGIC = 0x4B000000  # float 2^23


def _s32(u: int) -> int:
    """A 32-bit pattern as a signed Python int (so it fits an Int32 constant)."""
    return u - (1 << 32) if u >= 1 << 31 else u


@dsl_user_op
def _bits_f32(v, *, loc=None, ip=None) -> cutlass.Float32:
    """Reinterpret an Int32 bit pattern as Float32."""
    return cutlass.Float32(llvm.bitcast(T.f32(), cutlass.Int32(v).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


def _move_bits(h, src: int, dst: int, width: int):
    """Bits src..src+width-1 of h, alone, at bits dst.. (static positions; dst + width <= 23)."""
    m = h >> (src - dst) if src >= dst else h << (dst - src)
    return m & (((1 << width) - 1) << dst)


@dsl_user_op
def _f16lo_f32(v, *, loc=None, ip=None) -> cutlass.Float32:
    """The binary16 in the low half of an Int32, as Float32 (exact)."""
    return cutlass.Float32(llvm.inline_asm(
        T.f32(), [cutlass.Int32(v).ir_value(loc=loc, ip=ip)],
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $1; cvt.f32.f16 $0, lo; }", "=f,r",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


class GemvQ:
    """One CTA per `rows` weight rows; `threads` threads split K in 32-code chunks."""

    def __init__(self, bits: int, group: int, cols: int, epilogue: str, rows: int = 4, threads: int = 128,
                 inplace: bool = True, unroll: int = 1, regconst: bool = True):
        if (bits, group) not in ((4, 64), (5, 64), (6, 64), (8, 32)):
            raise ValueError("format must be bits/group 4/64, 5/64, 6/64 or 8/32")
        if not 1 <= cols <= 8:
            raise ValueError("cols must be 1..8")
        if epilogue not in ("plain", "residual", "swiglu"):
            raise ValueError("epilogue must be plain, residual or swiglu")
        if epilogue == "swiglu" and rows % 2:
            raise ValueError("swiglu needs an even number of rows (gate + up per output)")
        if threads % 32 or rows * cols > threads:
            raise ValueError("threads must be whole warps and at least rows * cols")
        self.bits, self.group, self.cols, self.epilogue = bits, group, cols, epilogue
        self.rows, self.threads = rows, threads
        self.warps = threads // 32
        self.outs = rows // 2 if epilogue == "swiglu" else rows
        self.nvec = 2 if bits == 8 else 1  # 16-byte base loads per chunk
        self.bias = 1 << (bits - 1)
        self.inplace = inplace
        self.unroll = unroll  # chunk-loop unroll: >1 lets the next chunk's loads issue early
        self.regconst = regconst  # Q4/W8: 2^23 and the sign XOR in registers (False: the old form)

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
        k_pad = (k + 127) // 128 * 128
        nchunks = k_pad // CHUNK
        gpr = k_pad // self.group
        # Plane offsets and per-row strides, in int32 words (planes are 256-byte aligned).
        base_row = k_pad // 8 if self.bits < 8 else k_pad // 4
        high_row = k_pad // 32 if self.bits == 5 else k_pad // 16
        high_off = (n_w * base_row + 63) // 64 * 64
        scale_off = high_off
        if cutlass.const_expr(self.bits in (5, 6)):
            scale_off = high_off + (n_w * high_row + 63) // 64 * 64

        # The weight rows of this CTA (rows past the end re-read the last row and are not stored).
        o0 = bidx * self.outs
        row = []
        for r in cutlass.range_constexpr(self.rows):
            o = o0 + r % self.outs
            row.append(cutlass.min(o, n_out - 1) + (r // self.outs) * n_out)

        # Per-row start of each plane (16-byte vectors for the base plane, words for the others).
        wrow = [rw * (base_row // 4) for rw in row]
        hrow = [high_off + rw * high_row for rw in row]
        srow = [scale_off + rw * (gpr // 2) for rw in row]

        gW4 = cute.zipped_divide(mW, (4,))
        gX = [cute.zipped_divide(mX[t, None], (8,)) for t in range(self.cols)]

        # 2^23 and the sign-flip XOR constant as values the compiler cannot see (products with
        # gridDim.y, which is 1) stay in registers. As immediates ptxas folds the XOR into each
        # code's mask LOP3, which then needs the mask in a register, rematerialised by a MOV for
        # nearly every code; as registers the XOR is one op per word and a code one LOP3
        # (word & mask-immediate | magic-register). Q4 and W8 only: Q5's form below is as good,
        # Q6 gets slightly longer. `regconst=False` keeps the old form for A/B measurement.
        flip = {4: 0x88888888, 6: 0xAAAAAAAA, 8: 0x80808080}.get(self.bits, 0)  # Q5 has none
        self._magic = MAGIC
        self._flip = _s32(flip)
        _, gy, _ = cute.arch.grid_dim()
        if cutlass.const_expr(self.regconst and self.inplace and self.bits in (4, 8)):
            self._magic = cutlass.Int32(gy) * MAGIC
            self._flip = cutlass.Int32(gy) * _s32(flip)
        elif cutlass.const_expr(self.bits == 5):
            self._magic = cutlass.Int32(gy - 1) | MAGIC
        acc = cute.make_rmem_tensor((self.rows * self.cols,), cutlass.Float32)
        acc.fill(0.0)
        # Two passes: the chunks whose 32 x lie below k (no bounds checks on x), then the rest.
        nfull = k // CHUNK
        for tail in cutlass.range_constexpr(2):
            for c in cutlass.range(tidx + nfull * tail, nfull if tail == 0 else nchunks, self.threads,
                                   unroll=self.unroll):
                wb = cute.make_rmem_tensor((4, self.nvec, self.rows), cutlass.Int32)
                for r in cutlass.range_constexpr(self.rows):
                    for v in cutlass.range_constexpr(self.nvec):
                        cute.autovec_copy(gW4[None, wrow[r] + c * self.nvec + v], wb[None, v, r])
                hw = cute.make_rmem_tensor((2, self.rows), cutlass.Int32)
                if cutlass.const_expr(self.bits in (5, 6)):
                    for r in cutlass.range_constexpr(self.rows):
                        for h in cutlass.range_constexpr(self.bits - 4):
                            hw[h, r] = mW[hrow[r] + (self.bits - 4) * c + h]
                # Scale of group g = row * gpr + gc: gpr is even (k_pad is a multiple of 128), so the
                # word is row * gpr / 2 + gc / 2 and the half gc % 2, shared by the rows.
                gc = c // (self.group // CHUNK)
                sw = cute.make_rmem_tensor((self.rows,), cutlass.Int32)
                for r in cutlass.range_constexpr(self.rows):
                    sw[r] = mW[srow[r] + gc // 2] >> ((gc % 2) * 16)

                part = cute.make_rmem_tensor((self.rows * self.cols,), cutlass.Float32)
                part.fill(0.0)
                for j in cutlass.range_constexpr(CHUNK // 8):
                    kk = c * CHUNK + j * 8
                    xs = cute.make_rmem_tensor((8, self.cols), cutlass.Float32)
                    for t in cutlass.range_constexpr(self.cols):
                        xb = cute.make_rmem_tensor((8,), cutlass.BFloat16)
                        xb.fill(0.0)
                        if tail == 0 or kk < k:  # the launcher passes T >= 1: x row 0 always exists
                            if t == 0 or t < t_rows:
                                cute.autovec_copy(gX[t][None, c * (CHUNK // 8) + j], xb)
                        xs[None, t].store(xb.load().to(cutlass.Float32))
                        for i in cutlass.range_constexpr(8):
                            if cutlass.const_expr(self._xscale(i) != 1.0):
                                xs[i, t] = xs[i, t] * self._xscale(i)
                    for r in cutlass.range_constexpr(self.rows):
                        for i in cutlass.range_constexpr(8):
                            f = self._code_float(wb, hw, r, j, i)
                            for t in cutlass.range_constexpr(self.cols):
                                part[r * self.cols + t] = part[r * self.cols + t] + f * xs[i, t]
                for r in cutlass.range_constexpr(self.rows):
                    s = _f16lo_f32(sw[r])
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
                    if cutlass.const_expr(self.epilogue == "swiglu"):
                        u = cutlass.Float32(0.0)
                        for w in cutlass.range_constexpr(self.warps):
                            u = u + red[w, (oi + self.outs) * self.cols + t]
                        a = a / (1.0 + cute.math.exp(-a, fastmath=False)) * u
                    if cutlass.const_expr(self.epilogue == "residual"):
                        a = a + mR[t, o].to(cutlass.Float32)
                    mY[t, o] = a.to(cutlass.BFloat16)

    def _place(self, i: int) -> int:
        """Exponent p: code i of an 8-code step is produced as code * base^p (base 16; W8 256)."""
        if self.bits == 8:
            return (i % 4) % 2 if self.inplace else 0
        if not self.inplace:
            return 0
        return i if i < 5 else i - 3

    def _xscale(self, i: int) -> float:
        return float((256 if self.bits == 8 else 16) ** -self._place(i))

    @cute.jit
    def _code_float(self, wb, hw, r, j, i):
        """Code 8j + i of the chunk (weight row r) as a float times base^p (exact).

        A nibble/byte is OR-ed into the mantissa of 2^23 where it lies in its word (bits below
        20; the upper nibbles/bytes come from the word shifted right by 12/16), so the float is
        2^23 + v * base^p with v = code + bias (the sign bit flipped: XOR of the base word for
        Q4/W8, of the high word for Q6, whose high bits are moved in at bit 4p + 4); the
        constant 2^23 + bias * base^p is subtracted, exactly. Q5 (fewer integer instructions
        this way) subtracts the float 2^23 + b4 * 16^(p+1) from 2^23 + nib * 16^p instead: both
        lie in [2^23, 2^24), so the difference is exact.
        """
        p = self._place(i)
        if cutlass.const_expr(self.bits == 8):
            w = wb[(2 * j + i // 4) % 4, (2 * j + i // 4) // 4, r] ^ self._flip
            if cutlass.const_expr(not self.inplace):
                v = (w >> (8 * (i % 4))) & 0xFF
                return _bits_f32(v | MAGIC) - cutlass.Float32(8388608.0 + 128.0)
            if cutlass.const_expr(i % 4 >= 2):
                w = w >> 16
            return _bits_f32((w & (0xFF << (8 * p))) | self._magic) - cutlass.Float32(8388608.0 + 128.0 * 256 ** p)
        w = wb[j, 0, r]
        if cutlass.const_expr(not self.inplace):
            v = self._code_bits_shift(w, hw, r, j, i)
            return _bits_f32(v | MAGIC) - cutlass.Float32(8388608.0 + self.bias)
        if cutlass.const_expr(self.bits == 4):
            w = w ^ self._flip
        if cutlass.const_expr(i >= 5):
            w = w >> 12
        a = (w & (0xF << (4 * p))) | self._magic
        q = 8 * j + i
        if cutlass.const_expr(self.bits == 5):  # code * 16^p = (2^23 + nib 16^p) - (2^23 + b4 16^(p+1))
            return _bits_f32(a) - _bits_f32(_move_bits(hw[0, r], q, 4 * p + 4, 1) | self._magic)
        if cutlass.const_expr(self.bits == 6):  # b5 flipped: v = code + 32 = nib + 16 b4 + 32 (1 - b5)
            a = a | _move_bits(hw[j // 2, r] ^ self._flip, 2 * (q % 16), 4 * p + 4, 2)
        return _bits_f32(a) - cutlass.Float32(8388608.0 + self.bias * 16 ** p)

    @cute.jit
    def _code_bits_shift(self, w, hw, r, j, i):
        """Shift path (inplace=False): code + bias of a Q4/Q5/Q6 code, shifted down to bit 0."""
        if cutlass.const_expr(self.bits == 4):
            return ((w ^ _s32(0x88888888)) >> (4 * i)) & 0xF
        nib = (w >> (4 * i)) & 0xF
        if cutlass.const_expr(self.bits == 5):
            return nib | ((((hw[0, r] ^ -1) >> (8 * j + i)) & 1) << 4)
        return nib | ((((hw[j // 2, r] ^ _s32(0xAAAAAAAA)) >> (2 * (8 * (j % 2) + i))) & 3) << 4)
