"""Decode GEMV on groupwise-int weights with tensor cores (mma.sync m16n8k16 bf16, fp32 accumulate),
read straight from the `row-split-k128-v1` payload (no repack).

    y[t, n] = sum_k W[n, k] * x[t, k],   W[n, k] = f32(scale[n, k / G]) * code[n, k]

Same formats, arguments and epilogues as `cute_kernels/gemv_q.py` (see docs/kernels-gemv-mma.md).

Codes become bf16 *pairs* on CUDA cores: a field at bits 0.. and 16.. of a word OR-ed into
0x4300_4300 (bf16 128.0 twice) is the exact bf16 pair (128 + f0, 128 + f1); the sign flip of the
two's complement top bit folds into the same LOP3. A holds code + bias (Q4 136, Q5 144, Q6 160;
W8 is split into nibbles: lo + 128 against x and (hi + 136) against 16 x, bias 128 + 16 * 136),
B is x (column n = batch row n; T <= 8 costs the same as T = 1), so per 16-row tile and k16 one
mma does the multiply-add of all 8 columns. Each mma sees k from one group: the 4 threads of a
quad share a group of a row (thread t: group words 2t, 2t+1, one 8-byte load), and a group's C
starts at -bias * sum(x over the group) (computed by mmas with a constant A, once per warp and
group, shared by its row tiles), so after the group's mmas C = sum(code * x) and
acc += scale * C. The pairs are (code i, code i + 4) of a base word (one shift + one LOP3 per
pair), so B holds a fixed permutation of x (PRMTs once per warp and group).

Thread (g = lane / 4, t = lane % 4) holds A rows g and g + 8 of a tile: plain/residual 16
consecutive weight rows; swiglu gate rows i + g and up rows I + i + g, so its C (gate, up) gives
silu(gate) * up directly. A CTA owns `tiles` row tiles; its `warps` warps split K in 128-code
steps and reduce through shared memory. Weights stream through shared memory with cp.async:
each warp keeps `stages` batches of `steps` steps in flight (thread-private slots, so the
per-thread wait_group is the only synchronisation), and so does x (only the lanes whose column
is < T copy it).

The decode (`pairs_*`, `b_regs`) is written against an `ops` object so that the CPU test can run
the same bit logic in numpy (`NumpyOps` in tests/test_kernels_gemv_mma.py) against the reference.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync
from cutlass.cutlass_dsl import T, dsl_user_op

STEP = 128  # codes per K step (K_pad is a multiple of 128)
FIELD = 0x000F000F  # a nibble at bits 0-3 and 16-19
BIAS = {4: 136, 5: 144, 6: 160, 8: 128 + 16 * 136}  # A = code + bias (W8: lo + 16 hi, see above)
BIAS_BF16 = {4: 0xC308, 5: 0xC310, 6: 0xC320, 8: 0xC510}  # bf16(-bias)


def _s32(u: int) -> int:
    """A 32-bit pattern as a signed Python int (so it fits an Int32 constant)."""
    u &= 0xFFFFFFFF
    return u - (1 << 32) if u >= 1 << 31 else u


# ---- decode, written against `ops` (DSL values in the kernel, numpy arrays in the CPU test) ----

def _shift(ops, v, s: int):
    """v << s for s > 0, v >> -s (arithmetic) for s < 0."""
    if s > 0:
        return ops.shl(v, s)
    if s < 0:
        return ops.shr(v, -s)
    return v


def pairs_q4(ops, w0, w1):
    """Per k-step m (4 per group): the A words (codes m, m+4 | codes 8+m, 12+m) of one row.
    Nibble i of a word and nibble i + 4 sit at bits 4i and 16 + 4i: one shift, one LOP3."""
    k = ops.c(0x43084308)  # 128 + (nibble ^ 8) = code + 136
    return [tuple(ops.band_xor(_shift(ops, w, -4 * m), FIELD, k) for w in (w0, w1)) for m in range(4)]


def pairs_q5(ops, w0, w1, hh):
    """Q5: as Q4, plus the high bit (bit c of hh for code c) at bits 4 and 20, flipped:
    A = 128 + nib + 16 (1 - b) = code + 144. hd = byte * 0x1001 puts code c at bit c and
    code c + 4 at bit 16 + c, so one shift aligns both."""
    k = ops.c(0x43104310)
    out = []
    hd = [ops.imul(ops.band(hh, 0xFF), 0x1001), ops.imul(ops.band(ops.shr(hh, 8), 0xFF), 0x1001)]
    for m in range(4):
        regs = []
        for w, h in zip((w0, w1), hd):
            e = ops.band_xor(_shift(ops, h, 4 - m), 0x00100010, k)
            regs.append(ops.band_or(_shift(ops, w, -4 * m), FIELD, e))
        out.append(tuple(regs))
    return out


def pairs_q6(ops, w0, w1, hq):
    """Q6: two high bits per code (bits 2c, 2c+1 of hq), flipped top bit: A = code + 160.
    A PRMT puts codes 0-3 at bits 0.. and codes 4-7 at bits 16.. (w1: codes 8-11 / 12-15)."""
    k = ops.c(0x43204320)
    out = []
    hd = [ops.prmt(hq, ops.c(0), 0x4140), ops.prmt(hq, ops.c(0), 0x4342)]
    for m in range(4):
        regs = []
        for w, h in zip((w0, w1), hd):
            e = ops.band_xor(_shift(ops, h, 4 - 2 * m), 0x00300030, k)
            regs.append(ops.band_or(_shift(ops, w, -4 * m), FIELD, e))
        out.append(tuple(regs))
    return out


def pairs_w8(ops, w0, w1):
    """W8: per word (4 codes) two k-steps: low nibbles (lo + 128) and high nibbles (signed hi + 136,
    run against 16 x). Order: (w0 lo, w0 hi, w1 lo, w1 hi); pairs (code 0, 2 | code 1, 3)."""
    klo, khi = ops.c(0x43004300), ops.c(0x43084308)
    out = []
    for w in (w0, w1):
        out.append((ops.band_xor(w, FIELD, klo), ops.band_xor(ops.shr(w, 8), FIELD, klo)))
        out.append((ops.band_xor(ops.shr(w, 4), FIELD, khi), ops.band_xor(ops.shr(w, 12), FIELD, khi)))
    return out


def b_regs(ops, bits: int, xw):
    """B words per k-step, from the thread's natural bf16x2 x words xw (Q4-Q6: 8 words = x[0..15]
    of its group slice, pairs (m, m+4 | 8+m, 12+m); W8: 4 words = x[0..7], pairs (4s, 4s+2 | 4s+1,
    4s+3), the high-nibble k-steps against 16 x)."""
    if bits == 8:
        out = []
        for s in range(2):
            lo = (ops.prmt(xw[2 * s], xw[2 * s + 1], 0x5410), ops.prmt(xw[2 * s], xw[2 * s + 1], 0x7632))
            out += [lo, tuple(ops.mul16(b) for b in lo)]
        return out
    out = []
    for m in range(4):
        sel = 0x7632 if m % 2 else 0x5410
        out.append((ops.prmt(xw[m // 2], xw[2 + m // 2], sel), ops.prmt(xw[4 + m // 2], xw[6 + m // 2], sel)))
    return out


def bias_steps(bits: int) -> list[int]:
    """The k-steps whose B enters the -bias * sum(x) start value (W8: the low-nibble ones)."""
    return [0, 2] if bits == 8 else [0, 1, 2, 3]


# ---- DSL helpers -------------------------------------------------------------------------------

def _asm(ret, args, text, cons, loc, ip):
    return llvm.inline_asm(ret, args, text, cons, has_side_effects=False, is_align_stack=False,
                           asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


@dsl_user_op
def _prmt(a, b, sel: int, *, loc=None, ip=None) -> cutlass.Int32:
    args = [cutlass.Int32(a).ir_value(loc=loc, ip=ip), cutlass.Int32(b).ir_value(loc=loc, ip=ip)]
    return cutlass.Int32(_asm(T.i32(), args, f"prmt.b32 $0, $1, $2, {sel:#x};", "=r,r,r", loc, ip))


@dsl_user_op
def _lop(a, b: int, c, lut: int, *, loc=None, ip=None) -> cutlass.Int32:
    """lop3.b32 with an immediate second operand (ptxas keeps it one LOP3)."""
    args = [cutlass.Int32(a).ir_value(loc=loc, ip=ip), cutlass.Int32(c).ir_value(loc=loc, ip=ip)]
    return cutlass.Int32(_asm(T.i32(), args, f"lop3.b32 $0, $1, {_s32(b)}, $2, {lut:#x};", "=r,r,r", loc, ip))


@dsl_user_op
def _mul16(a, *, loc=None, ip=None) -> cutlass.Int32:
    """A bf16x2 word times 16 (exact)."""
    args = [cutlass.Int32(a).ir_value(loc=loc, ip=ip), cutlass.Int32(0x41804180).ir_value(loc=loc, ip=ip)]
    return cutlass.Int32(_asm(T.i32(), args, "mul.rn.bf16x2 $0, $1, $2;", "=r,r,r", loc, ip))


@dsl_user_op
def _f16_f32(v, hi: int, *, loc=None, ip=None) -> cutlass.Float32:
    """The binary16 in the low (hi=0) or high half of an Int32, as Float32 (exact)."""
    half = "hi" if hi else "lo"
    return cutlass.Float32(_asm(
        T.f32(), [cutlass.Int32(v).ir_value(loc=loc, ip=ip)],
        f"{{ .reg .b16 lo, hi; mov.b32 {{lo, hi}}, $1; cvt.f32.f16 $0, {half}; }}", "=f,r", loc, ip))


@dsl_user_op
def _mma(a, b, c, *, loc=None, ip=None):
    """D = A B + C, m16n8k16 row.col bf16 -> f32: a 4 words, b 2 words, c 4 floats."""
    args = ([cutlass.Int32(v).ir_value(loc=loc, ip=ip) for v in (*a, *b)]
            + [cutlass.Float32(v).ir_value(loc=loc, ip=ip) for v in c])
    ty = llvm.StructType.get_literal([T.f32()] * 4)
    r = _asm(ty, args, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {$0, $1, $2, $3}, "
             "{$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};", "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", loc, ip)
    return [cutlass.Float32(llvm.extractvalue(T.f32(), r, [i], loc=loc, ip=ip)) for i in range(4)]


class DslOps:
    """The decode's integer ops on DSL Int32 values (>> is arithmetic)."""

    @staticmethod
    def c(u: int):
        return cutlass.Int32(_s32(u))

    @staticmethod
    def shl(v, s: int):
        return v << s

    @staticmethod
    def shr(v, s: int):
        return v >> s

    @staticmethod
    def band(v, m: int):
        return v & _s32(m)

    @staticmethod
    def band_xor(v, m: int, k):
        return _lop(v, m, k, 0x6A)  # (a & b) ^ c with a=0xF0, b=0xCC, c=0xAA

    @staticmethod
    def band_or(v, m: int, k):
        return _lop(v, m, k, 0xEA)  # (a & b) | c

    @staticmethod
    def imul(v, m: int):
        return v * m

    @staticmethod
    def prmt(a, b, sel: int):
        return _prmt(a, b, sel)

    @staticmethod
    def mul16(v):
        return _mul16(v)


# ---- the kernel --------------------------------------------------------------------------------

class GemvMma:
    """`tiles` 16-row tiles per CTA, `warps` warps splitting K in 128-code steps, `steps` per batch,
    `stages` batches in flight per warp."""

    def __init__(self, bits: int, group: int, cols: int, epilogue: str, tiles: int = 1, warps: int = 4,
                 steps: int = 1, stages: int = 4):
        if (bits, group) not in ((4, 64), (5, 64), (6, 64), (8, 32)):
            raise ValueError("format must be bits/group 4/64, 5/64, 6/64 or 8/32")
        if not 1 <= cols <= 8:
            raise ValueError("cols must be 1..8")
        if epilogue not in ("plain", "residual", "swiglu"):
            raise ValueError("epilogue must be plain, residual or swiglu")
        if tiles < 1 or warps < 1 or steps < 1 or stages < 2:
            raise ValueError("tiles, warps and steps must be >= 1, stages >= 2")
        self.bits, self.group, self.cols, self.epilogue = bits, group, cols, epilogue
        self.tiles, self.warps, self.steps, self.stages = tiles, warps, steps, stages
        self.threads = 32 * warps
        self.outs = tiles * (8 if epilogue == "swiglu" else 16)  # outputs per CTA
        self.gps = STEP // group  # groups per step: 2 (Q4-Q6), 4 (W8)
        self.xw = 8 if bits < 8 else 4  # x words (bf16 pairs) per thread and group

    @cute.jit
    def __call__(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mY: cute.Tensor,
                 stream: cuda.CUstream):
        m = cute.size(mY, mode=[1])
        grid = ((m + self.outs - 1) // self.outs, 1, 1)
        self.kernel(mW, mX, mR, mY).launch(grid=grid, block=(self.threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mY: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        warp = tidx // 32
        g = lane // 4
        t = lane % 4
        n_out = cute.size(mY, mode=[1])
        t_rows = cute.size(mX, mode=[0])
        k = cute.size(mX, mode=[1])
        n_w = n_out
        if cutlass.const_expr(self.epilogue == "swiglu"):
            n_w = n_out * 2
        k_pad = (k + 127) // 128 * 128
        nsteps = k_pad // STEP
        gpr = k_pad // self.group
        base_row = k_pad // 8 if self.bits < 8 else k_pad // 4
        high_row = k_pad // 32 if self.bits == 5 else k_pad // 16
        high_off = (n_w * base_row + 63) // 64 * 64
        scale_off = high_off
        if cutlass.const_expr(self.bits in (5, 6)):
            scale_off = high_off + (n_w * high_row + 63) // 64 * 64

        # Weight rows of this thread: per tile, A rows g and g + 8 (rows past the end re-read the last).
        rows = []
        for r in cutlass.range_constexpr(self.tiles):
            for h in cutlass.range_constexpr(2):
                if cutlass.const_expr(self.epilogue == "swiglu"):
                    o = bidx * self.outs + 8 * r + g
                    rows.append(cutlass.min(o, n_out - 1) + h * n_out)
                else:
                    o = bidx * self.outs + 16 * r + 8 * h + g
                    rows.append(cutlass.min(o, n_out - 1))
        nrow = 2 * self.tiles
        wrow = [rw * (base_row // 2) + t for rw in rows]  # 8-byte units: group words 2t, 2t+1
        srow = [scale_off + rw * (gpr // 2) for rw in rows]
        hrow = [high_off + rw * high_row for rw in rows]

        gW2 = cute.zipped_divide(mW, (2,))
        xrow = cutlass.min(g, t_rows - 1)
        gX = cute.zipped_divide(mX[xrow, None], (8,))
        x_on = g < t_rows
        if cutlass.const_expr(self.cols == 1):
            x_on = g == 0

        kb = cutlass.Int32(_s32(BIAS_BF16[self.bits] * 0x10001))
        ops = DslOps()
        nacc = 4 * self.tiles
        acc = cute.make_rmem_tensor((nacc,), cutlass.Float32)
        acc.fill(0.0)
        gps, st, nsw, ns = self.gps, self.steps, max(self.gps // 2, 1), self.stages
        # Weights stream through shared memory with cp.async, `stages` batches (of `steps` steps)
        # in flight per warp. Every thread reads back only the words it copied itself, so the
        # per-thread cp.async.wait_group orders it; no barrier. Lane-fastest slots: conflict-free.
        smem = cutlass.memory.SmemAllocator()
        w_, lane_ = self.warps, 32
        nxl = 32 if self.cols > 1 else 4  # x slots: lane (g, t), or t alone when only g = 0 loads
        sB = smem.allocate_tensor(cutlass.Int32, cute.make_layout((2, lane_, w_, nrow, gps, st, ns)), byte_alignment=16)
        sH = sB
        if cutlass.const_expr(self.bits in (5, 6)):
            sH = smem.allocate_tensor(cutlass.Int32, cute.make_layout((1, lane_, w_, nrow, gps, st, ns)),
                                      byte_alignment=16)
        sS = smem.allocate_tensor(cutlass.Int32, cute.make_layout((1, lane_, w_, nrow, nsw, st, ns)), byte_alignment=16)
        sX = smem.allocate_tensor(cutlass.BFloat16, cute.make_layout((8, nxl, w_, self.xw // 4, gps, st, ns)),
                                  byte_alignment=16)
        xl = lane if self.cols > 1 else t
        cp8 = cute.make_copy_atom(cpasync.CopyG2SOp(), cutlass.Int32, num_bits_per_copy=64)
        cp4 = cute.make_copy_atom(cpasync.CopyG2SOp(), cutlass.Int32, num_bits_per_copy=32)
        cpx = cute.make_copy_atom(cpasync.CopyG2SOp(), cutlass.BFloat16, num_bits_per_copy=128)
        gW1 = cute.zipped_divide(mW, (1,))
        ld = (cp8, cp4, cpx, gW2, gW1, gX, sB, sH, sS, sX)
        cur_w = cute.make_rmem_tensor((2, gps, nrow, st), cutlass.Int32)
        cur_h = cute.make_rmem_tensor((gps, nrow, st), cutlass.Int32)
        cur_s = cute.make_rmem_tensor((nsw, nrow, st), cutlass.Int32)
        per_it = self.warps * st
        n_it = (nsteps + per_it - 1) // per_it
        for b in cutlass.range_constexpr(ns - 1):
            self._issue(ld, b, b, lane, xl, warp, nsteps, k, x_on, wrow, hrow, srow, t)
            cute.arch.cp_async_commit_group()
        for it in cutlass.range(n_it, unroll=1):
            nxt = it + ns - 1
            self._issue(ld, nxt, nxt % ns, lane, xl, warp, nsteps, k, x_on, wrow, hrow, srow, t)
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(ns - 1)
            slot = it % ns
            for u in cutlass.range_constexpr(st):
                for ri in cutlass.range_constexpr(nrow):
                    for q in cutlass.range_constexpr(gps):
                        cute.autovec_copy(sB[None, lane, warp, ri, q, u, slot], cur_w[None, q, ri, u])
                        if cutlass.const_expr(self.bits in (5, 6)):
                            cur_h[q, ri, u] = sH[0, lane, warp, ri, q, u, slot]
                    for v in cutlass.range_constexpr(nsw):
                        cur_s[v, ri, u] = sS[0, lane, warp, ri, v, u, slot]
            for u in cutlass.range_constexpr(st):
                step = (it * st + u) * self.warps + warp
                if step < nsteps:
                    # x of the step's groups (this lane's column g; zero past K and for g >= T).
                    xs = cute.make_rmem_tensor((self.xw, gps), cutlass.Int32)
                    xs.fill(0)
                    if x_on:
                        for q in cutlass.range_constexpr(gps):
                            for v in cutlass.range_constexpr(self.xw // 4):
                                ch = (step * STEP + q * self.group) // 8 + t * (self.xw // 4) + v
                                if ch * 8 < k:
                                    xb = cute.make_rmem_tensor((8,), cutlass.BFloat16)
                                    cute.autovec_copy(sX[None, xl, warp, v, q, u, slot], xb)
                                    xi = cute.recast_tensor(xb, cutlass.Int32)
                                    for e in cutlass.range_constexpr(4):
                                        xs[4 * v + e, q] = xi[e]
                    for q in cutlass.range_constexpr(gps):
                        bregs = b_regs(ops, self.bits, [xs[i, q] for i in range(self.xw)])
                        nb = [cutlass.Float32(0.0)] * 4
                        for m in bias_steps(self.bits):
                            nb = _mma((kb, kb, kb, kb), bregs[m], nb)
                        for r in cutlass.range_constexpr(self.tiles):
                            lo = self._pairs(ops, cur_w, cur_h, 2 * r, q, u, t)
                            hi = self._pairs(ops, cur_w, cur_h, 2 * r + 1, q, u, t)
                            d = nb
                            for m in cutlass.range_constexpr(4):
                                d = _mma((lo[m][0], hi[m][0], lo[m][1], hi[m][1]), bregs[m], d)
                            for h in cutlass.range_constexpr(2):
                                sc = _f16_f32(cur_s[q // 2, 2 * r + h, u], q % 2)
                                for e in cutlass.range_constexpr(2):
                                    acc[4 * r + 2 * h + e] = acc[4 * r + 2 * h + e] + sc * d[2 * h + e]
        cute.arch.cp_async_wait_group(0)

        # ---- reduce over the warps, epilogue ----
        red = smem.allocate_tensor(cutlass.Float32, cute.make_layout((32, nacc, self.warps), stride=(1, 32, 32 * nacc)))
        for e in cutlass.range_constexpr(nacc):
            red[lane, e, warp] = acc[e]
        cute.arch.sync_threads()
        if warp == 0:
            tot = cute.make_rmem_tensor((nacc,), cutlass.Float32)
            for e in cutlass.range_constexpr(nacc):
                a = red[lane, e, 0]
                for w in cutlass.range_constexpr(1, self.warps):
                    a = a + red[lane, e, w]
                tot[e] = a
            for r in cutlass.range_constexpr(self.tiles):
                for e in cutlass.range_constexpr(4 if self.epilogue != "swiglu" else 2):
                    col = 2 * t + e % 2
                    if cutlass.const_expr(self.epilogue == "swiglu"):
                        o = bidx * self.outs + 8 * r + g
                    else:
                        o = bidx * self.outs + 16 * r + 8 * (e // 2) + g
                    if col < cutlass.min(t_rows, self.cols):
                        if o < n_out:
                            a = tot[4 * r + e]
                            if cutlass.const_expr(self.epilogue == "swiglu"):
                                up = tot[4 * r + 2 + e]
                                a = a / (1.0 + cute.math.exp(-a, fastmath=False)) * up
                            if cutlass.const_expr(self.epilogue == "residual"):
                                a = a + mR[col, o].to(cutlass.Float32)
                            mY[col, o] = a.to(cutlass.BFloat16)

    @cute.jit
    def _issue(self, ld, it, slot, lane, xl, warp, nsteps, k, x_on, wrow, hrow, srow, t):
        """cp.async of batch `it` of this warp (weights, and x of the loading lanes) into stage `slot`;
        steps past the end and x past k are skipped."""
        cp8, cp4, cpx, gW2, gW1, gX, sB, sH, sS, sX = ld
        nsw = max(self.gps // 2, 1)
        for u in cutlass.range_constexpr(self.steps):
            step = (it * self.steps + u) * self.warps + warp
            if step < nsteps:
                for ri in cutlass.range_constexpr(2 * self.tiles):
                    for q in cutlass.range_constexpr(self.gps):
                        grp = step * self.gps + q
                        cute.copy(cp8, gW2[None, wrow[ri] + grp * 4], sB[None, lane, warp, ri, q, u, slot])
                        if cutlass.const_expr(self.bits == 5):
                            cute.copy(cp4, gW1[None, hrow[ri] + 2 * grp + t // 2], sH[None, lane, warp, ri, q, u, slot])
                        if cutlass.const_expr(self.bits == 6):
                            cute.copy(cp4, gW1[None, hrow[ri] + 4 * grp + t], sH[None, lane, warp, ri, q, u, slot])
                    for v in cutlass.range_constexpr(nsw):
                        cute.copy(cp4, gW1[None, srow[ri] + step * nsw + v], sS[None, lane, warp, ri, v, u, slot])
                if x_on:
                    for q in cutlass.range_constexpr(self.gps):
                        for v in cutlass.range_constexpr(self.xw // 4):
                            ch = (step * STEP + q * self.group) // 8 + t * (self.xw // 4) + v
                            if ch * 8 < k:
                                cute.copy(cpx, gX[None, ch], sX[None, xl, warp, v, q, u, slot])

    def _pairs(self, ops, wb, hw, ri, q, u, t):
        """The A words per k-step of weight row slot ri, group q of load step u."""
        w0, w1 = wb[0, q, ri, u], wb[1, q, ri, u]
        if cutlass.const_expr(self.bits == 4):
            return pairs_q4(ops, w0, w1)
        if cutlass.const_expr(self.bits == 5):
            return pairs_q5(ops, w0, w1, hw[q, ri, u] >> ((t % 2) * 16))
        if cutlass.const_expr(self.bits == 6):
            return pairs_q6(ops, w0, w1, hw[q, ri, u])
        return pairs_w8(ops, w0, w1)
