"""Decode GEMV on groupwise-int weights with tensor cores (mma.sync m16n8k16 bf16, fp32 accumulate),
reading the weights in the `tile16-v1` layout (`inferno/kernels/tiled.py`): one perfectly coalesced
512-byte warp load per (16-row tile, group).

    y[t, n] = sum_k W[n, k] * x[t, k],   W[n, k] = f32(scale[n, k / G]) * code[n, k]

Same formats, arguments and epilogues as `cute_kernels/gemv_q.py` (see docs/kernels-gemv-mma.md);
w is the `tile16-v1` image of the matrix instead of its row-split payload.

Codes become bf16 *pairs* on CUDA cores: a field at bits 0.. and 16.. of a word OR-ed into
0x4300_4300 (bf16 128.0 twice) is the exact bf16 pair (128 + f0, 128 + f1); the sign flip of the
two's complement top bit folds into the same LOP3. A holds code + bias (Q4 136, Q5 144, Q6 160;
W8 is split into nibbles: lo + 128 against x and (hi + 136) against 16 x, bias 128 + 16 * 136),
B is x (column n = batch row n; T <= 8 costs the same as T = 1), so per 16-row tile and k16 one
mma does the multiply-add of all 8 columns. Each mma sees k from one group: the 4 threads of a
quad share a group of a row (thread t: group words 2t, 2t+1), and a group's C starts at
-bias * sum(x over the group) (mmas with a constant A, once per warp and group, shared by its
tiles), so after the group's mmas C = sum(code * x) and acc += scale * C. The pairs are (code i,
code i + 4) of a base word (one shift + one LOP3 per pair), so B holds a fixed permutation of x.

Lane (g = lane / 4, t = lane % 4) holds A rows g and g + 8 of a tile; in `tile16-v1` its 16 bytes
of a (tile, group) block are exactly those rows' words 2t, 2t + 1, so one LDG.128 per lane and
group feeds the mma (Q5 / Q6 high bits: one 4- / 8-byte load, scales one 8-byte load per group
pair). A warp streams whole group pairs of its tiles; the `kw` warps of a warp row split the
pairs of the row into contiguous runs and reduce through shared memory; a CTA holds
`warps / kw` warp rows of `tiles` units each (a unit = 16 outputs: one tile; swiglu: the gate
tile and the one or two tiles holding the matching up rows). Loads go straight to registers,
`stages` group pairs deep per warp (weights issued before griddepcontrol.wait: PDL overlap).

The decode (`pairs_*`, `b_regs`) and the addressing (`*_offset`) are written against plain
arithmetic so that the CPU test can run them in numpy (tests/test_kernels_gemv_mma.py).
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

FIELD = 0x000F000F  # a nibble at bits 0-3 and 16-19
FIELD5 = 0x001F001F  # a packed Q5 code at bits 0-4 and 16-20
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


def pairs_q5(ops, w0, w1, hw, h: int):
    """Q5 (`tiled.pack_q5`): codes m, m + 4 (m < 3) sit whole at bits 5m and 16 + 5m of their base word,
    one shift and one LOP3 (bit 4 flipped: A = 128 + nib + 16 (1 - b) = code + 144); for m = 3 the
    nibbles come from the lane's high word hw (word i of row h at bits 8h + 4i, 16 + 8h + 4i) and the
    high bits from bits 15 and 31 of the base word."""
    k = ops.c(0x43104310)
    out = [tuple(ops.band_xor(_shift(ops, w, -5 * m), FIELD5, k) for w in (w0, w1)) for m in range(3)]
    last = []
    for i, w in enumerate((w0, w1)):
        e = ops.band_xor(ops.shr(w, 11), 0x00100010, k)
        last.append(ops.band_or(_shift(ops, hw, -(8 * h + 4 * i)), FIELD, e))
    return out + [tuple(last)]


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


# ---- tile16-v1 addressing (bytes; Python ints, numpy arrays or DSL Int32) ----------------------

HIGH_LANE_BYTES = {4: 0, 5: 2, 6: 4, 8: 0}  # hb: a lane's high bytes per row and group


def _up256(v):
    return (v + 255) // 256 * 256


def plane_offsets(bits: int, tiles, groups):
    """(high plane, scale plane) byte offsets of a `tile16-v1` image of `tiles` tiles x `groups` groups."""
    high = _up256(tiles * groups * 512)
    return high, high + _up256(tiles * groups * (64 * HIGH_LANE_BYTES[bits]))


def base_offset(tile, j, groups, lane):
    """Lane's 16 bytes of group j of `tile`: rows g, g + 8, base words 2t, 2t + 1 each."""
    return (tile * groups + j) * 512 + 16 * lane


def high_offset(bits: int, high, tile, j, groups, lane):
    """Lane's 2 hb bytes of high bits of group j (row g's hb bytes, then row g + 8's)."""
    hb = HIGH_LANE_BYTES[bits]
    return high + (tile * groups + j) * (64 * hb) + 2 * hb * lane


def scale_offset(scale, tile, pair, groups, lane):
    """Lane's 8 bytes of scales of groups 2 pair, 2 pair + 1: f16 [s(g, 2p), s(g+8, 2p), s(g, 2p+1), s(g+8, 2p+1)]."""
    return scale + (tile * (groups // 2) + pair) * 64 + 8 * (lane // 4)


def x_first(bits: int, j, lane):
    """Index along K of the first of the lane's x values of group j (16 for Q4-Q6, 8 for W8)."""
    if bits == 8:
        return j * 32 + 8 * (lane % 4)
    return j * 64 + 16 * (lane % 4)


def unit_tiles(epilogue: str, unit, m, tiles_total):
    """Tiles of output unit `unit` (outputs 16 unit ..): plain / residual the tile itself; swiglu
    (W = [gate; up], m = I) the gate tile and the two tiles that may hold up rows m + 16 unit .."""
    if epilogue != "swiglu":
        return [unit]
    up = (m + 16 * unit) // 16
    return [unit, up, _min(up + 1, tiles_total - 1)]


def _min(a, b):
    return cutlass.min(a, b) if isinstance(a, cutlass.Int32) or isinstance(b, cutlass.Int32) else min(a, b)


# ---- loads ---------------------------------------------------------------------------------------

def _ld(addr, n: int, cache: str, loc, ip):
    """n 32-bit words from global address `addr` (volatile asm: stays where it is written, so the
    weight loads stay ahead of their use and the x loads after griddepcontrol.wait)."""
    vec = "" if n == 1 else f".v{n}"
    outs = ", ".join(f"${i}" for i in range(n))
    text = f"ld.global{cache}{vec}.u32 " + (f"{{{outs}}}" if n > 1 else outs) + f", [${n}];"
    ty = T.i32() if n == 1 else llvm.StructType.get_literal([T.i32()] * n)
    r = llvm.inline_asm(ty, [cutlass.Int64(addr).ir_value(loc=loc, ip=ip)], text, ",".join(["=r"] * n + ["l"]),
                        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
                        loc=loc, ip=ip)
    if n == 1:
        return [cutlass.Int32(r)]
    return [cutlass.Int32(llvm.extractvalue(T.i32(), r, [i], loc=loc, ip=ip)) for i in range(n)]


@dsl_user_op
def _ldw(addr, n: int, *, loc=None, ip=None):
    """Weights: read-only path, not kept in L1 (streamed once)."""
    return _ld(addr, n, ".nc.L1::no_allocate", loc, ip)


@dsl_user_op
def _ldx(addr, *, loc=None, ip=None):
    """x: 16 bytes, cached (the CTA's warps share it)."""
    return _ld(addr, 4, "", loc, ip)


@dsl_user_op
def _lds4(addr, *, loc=None, ip=None):
    """4 words from shared address `addr` (16-byte aligned)."""
    ty = llvm.StructType.get_literal([T.i32()] * 4)
    r = llvm.inline_asm(ty, [cutlass.Int32(addr).ir_value(loc=loc, ip=ip)], "ld.shared.v4.u32 {$0, $1, $2, $3}, [$4];",
                        "=r,=r,=r,=r,r", has_side_effects=True, is_align_stack=False,
                        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)  # (stays after the barrier)
    return [cutlass.Int32(llvm.extractvalue(T.i32(), r, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def _sts4(addr, v, *, loc=None, ip=None):
    """4 words to shared address `addr` (16-byte aligned)."""
    args = [cutlass.Int32(addr).ir_value(loc=loc, ip=ip)] + [cutlass.Int32(e).ir_value(loc=loc, ip=ip) for e in v]
    llvm.inline_asm(None, args, "st.shared.v4.u32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r", has_side_effects=True,
                    is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


@dsl_user_op
def _stg4(addr, v, *, loc=None, ip=None):
    """4 words to global address `addr` (16-byte aligned)."""
    args = [cutlass.Int64(addr).ir_value(loc=loc, ip=ip)] + [cutlass.Int32(e).ir_value(loc=loc, ip=ip) for e in v]
    llvm.inline_asm(None, args, "st.global.v4.u32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r", has_side_effects=True,
                    is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


@dsl_user_op
def _add_word(v, s0, s1, *, loc=None, ip=None) -> cutlass.Int32:
    """bf16x2 of (lo(v) + s0, hi(v) + s1) in fp32, one rounding each (v bf16x2; s0, s1 fp32 bit patterns)."""
    args = [cutlass.Int32(e).ir_value(loc=loc, ip=ip) for e in (v, s0, s1)]
    return cutlass.Int32(_asm(
        T.i32(), args,
        "{ .reg .b32 xl, xh; .reg .f32 a, b, c, d; "
        "shl.b32 xl, $1, 16; and.b32 xh, $1, 0xffff0000; mov.b32 a, xl; mov.b32 b, xh; mov.b32 c, $2; "
        "mov.b32 d, $3; add.rn.f32 a, a, c; add.rn.f32 b, b, d; cvt.rn.bf16x2.f32 $0, b, a; }", "=r,r,r,r", loc, ip))


@dsl_user_op
def _lds1(addr, *, loc=None, ip=None) -> cutlass.Float32:
    """One fp32 from shared address `addr`."""
    return cutlass.Float32(llvm.inline_asm(T.f32(), [cutlass.Int32(addr).ir_value(loc=loc, ip=ip)],
                                           "ld.shared.f32 $0, [$1];", "=f,r", has_side_effects=True,
                                           is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


@dsl_user_op
def _lds4f(addr, *, loc=None, ip=None) -> list:
    """Four fp32 from shared address `addr` (16-byte aligned)."""
    ty = llvm.StructType.get_literal([T.f32()] * 4)
    r = llvm.inline_asm(ty, [cutlass.Int32(addr).ir_value(loc=loc, ip=ip)], "ld.shared.v4.f32 {$0, $1, $2, $3}, [$4];",
                        "=f,=f,=f,=f,r", has_side_effects=True, is_align_stack=False,
                        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
    return [cutlass.Float32(llvm.extractvalue(T.f32(), r, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def _bf16x2_sum(v, *, loc=None, ip=None) -> cutlass.Float32:
    """lo + hi of a bf16x2 word, in fp32 (both exact in fp32, one rounding)."""
    return cutlass.Float32(_asm(
        T.f32(), [cutlass.Int32(v).ir_value(loc=loc, ip=ip)],
        "{ .reg .b32 lo, hi; .reg .f32 a, b; shl.b32 lo, $1, 16; and.b32 hi, $1, 0xffff0000; "
        "mov.b32 a, lo; mov.b32 b, hi; add.rn.f32 $0, a, b; }", "=f,r", loc, ip))


@dsl_user_op
def _bf16x2_sq(v, *, loc=None, ip=None) -> cutlass.Float32:
    """lo^2 + hi^2 of a bf16x2 word, in fp32."""
    return cutlass.Float32(_asm(
        T.f32(), [cutlass.Int32(v).ir_value(loc=loc, ip=ip)],
        "{ .reg .b32 lo, hi; .reg .f32 a, b; shl.b32 lo, $1, 16; and.b32 hi, $1, 0xffff0000; "
        "mov.b32 a, lo; mov.b32 b, hi; mul.rn.f32 a, a, a; fma.rn.f32 $0, b, b, a; }", "=f,r", loc, ip))


@dsl_user_op
def _norm_word(v, g, rs, *, loc=None, ip=None) -> cutlass.Int32:
    """bf16x2 of x * rs * (1 + g) per half (x, g bf16x2 words; fp32 math as cute_kernels/rmsnorm.py)."""
    args = [cutlass.Int32(v).ir_value(loc=loc, ip=ip), cutlass.Int32(g).ir_value(loc=loc, ip=ip),
            cutlass.Float32(rs).ir_value(loc=loc, ip=ip)]
    return cutlass.Int32(_asm(
        T.i32(), args,
        "{ .reg .b32 xl, xh, gl, gh; .reg .f32 a, b, c, d; "
        "shl.b32 xl, $1, 16; and.b32 xh, $1, 0xffff0000; shl.b32 gl, $2, 16; and.b32 gh, $2, 0xffff0000; "
        "mov.b32 a, xl; mov.b32 b, xh; mov.b32 c, gl; mov.b32 d, gh; "
        "add.rn.f32 c, c, 0f3F800000; add.rn.f32 d, d, 0f3F800000; "
        "mul.rn.f32 a, a, $3; mul.rn.f32 a, a, c; mul.rn.f32 b, b, $3; mul.rn.f32 b, b, d; "
        "cvt.rn.bf16x2.f32 $0, b, a; }", "=r,r,r,f", loc, ip))


# ---- the kernel --------------------------------------------------------------------------------

class GemvMma:
    """`warps` warps per CTA in warp rows of `kw` warps that split K; a warp row owns `tiles` output
    units; `stages` register stages of group pairs per warp; registers capped for `ctas` CTAs per SM;
    x loaded one pair ahead (`xpre`) or when its pair is computed, or (`xs`, Q4-Q6, T <= 2, K <= kmax)
    staged once per CTA in shared memory as ready B words with each group's -bias * sum(x); with
    `norm` (xs, T = 1) x is the un-normed row and staging applies the zero-centred RMSNorm
    bf16(x * rsqrt(mean(x^2) + eps) * (1 + nw)) first, as cute_kernels/rmsnorm.py rounds it."""

    def __init__(self, bits: int, group: int, cols: int, epilogue: str, warps: int = 8, kw: int = 8,
                 tiles: int = 1, stages: int = 3, ctas: int = 2, xpre: bool = True, xs: bool = False,
                 kmax: int = 0, norm: bool = False):
        if (bits, group) not in ((4, 64), (5, 64), (6, 64), (8, 32)):
            raise ValueError("format must be bits/group 4/64, 5/64, 6/64 or 8/32")
        if not 1 <= cols <= 8:
            raise ValueError("cols must be 1..8")
        if epilogue not in ("plain", "residual", "swiglu"):
            raise ValueError("epilogue must be plain, residual or swiglu")
        if warps < 1 or kw < 1 or warps % kw or tiles < 1 or stages < 2:
            raise ValueError("kw must divide warps; tiles >= 1, stages >= 2")
        self.bits, self.group, self.cols, self.epilogue = bits, group, cols, epilogue
        self.warps, self.kw, self.tiles, self.stages, self.ctas = warps, kw, tiles, stages, ctas
        if xs and (bits == 8 or cols > 2 or kmax <= 0 or kmax % 128):
            raise ValueError("xs: Q4-Q6, cols <= 2, kmax > 0 a multiple of 128 (shared x for K <= kmax)")
        if norm and (not xs or cols != 1):
            raise ValueError("norm: x in shared memory (xs) at T = 1 only")
        self.xpre, self.xs, self.kmax, self.norm = xpre, xs, kmax, norm
        self.ngmax = kmax // group  # groups per row the shared x holds
        self.threads = 32 * warps
        self.rows = warps // kw  # warp rows per CTA
        self.units = self.rows * tiles  # output units (16 outputs) per CTA
        self.per_unit = 3 if epilogue == "swiglu" else 1  # tile slots per unit
        self.slots = tiles * self.per_unit
        self.xw = 8 if bits < 8 else 4  # x words (bf16 pairs) per lane and group
        self.hw = {5: 1, 6: 2}.get(bits, 0)  # high words per lane and group
        self.sw = 2  # scale words per lane and group pair

    # ---- format hooks (a subclass for another weight format overrides these and `_compute`) ----

    def _planes(self, n_tiles, ngr):
        """(high plane, scale plane) byte offsets of the weight image."""
        return plane_offsets(self.bits, n_tiles, ngr)

    def _scale_off(self, scale, tile, p, ngr, lane):
        """Byte offset of the lane's `sw` scale words of group pair p of `tile`."""
        return scale_offset(scale, tile, p, ngr, lane)

    def _out_scale(self, mW, n_tiles, ngr):
        """A per-matrix value the epilogue applies to every sum (`_unscale`); None: none."""
        return None

    def _unscale(self, a, fs):
        """A reduced row sum as the epilogue uses it (fs: `_out_scale`'s value)."""
        return a

    def geometry(self, m, k):
        """(rows of W, its 16-row tiles, output units, groups per row, group pairs per row) for m
        outputs and K = k (DSL values)."""
        n_w = 2 * m if self.epilogue == "swiglu" else m
        ngr = (k + 127) // 128 * 128 // self.group
        return n_w, (n_w + 15) // 16, (m + 15) // 16, ngr, ngr // 2

    @cute.jit
    def __call__(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mY: cute.Tensor, mN: cute.Tensor,
                 eps, stream: cuda.CUstream):
        m = cute.size(mY, mode=[1])
        grid = ((m + 16 * self.units - 1) // (16 * self.units), 1, 1)
        self.kernel(mW, mX, mR, mY, mN, eps).launch(grid=grid, block=(self.threads, 1, 1), stream=stream,
                                           min_blocks_per_mp=self.ctas, preferred_smem_carveout=-1)

    @cute.kernel
    def kernel(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mY: cute.Tensor, mN: cute.Tensor,
               eps):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        warp = tidx // 32
        wrow = warp // self.kw
        kwi = warp % self.kw
        g = lane // 4
        m = cute.size(mY, mode=[1])
        t_rows = cute.size(mX, mode=[0])
        k = cute.size(mX, mode=[1])
        n_w, n_tiles, n_units, ngr, npairs = self.geometry(m, k)
        high, scale = self._planes(n_tiles, ngr)
        fs = self._out_scale(mW, n_tiles, ngr)

        # This warp's tiles (units past the end recompute the last one; they are not stored) and pairs.
        tiles = []
        for s in cutlass.range_constexpr(self.tiles):
            unit = cutlass.min(bidx * self.units + wrow * self.tiles + s, n_units - 1)
            tiles += unit_tiles(self.epilogue, unit, m, n_tiles)
        per = (npairs + self.kw - 1) // self.kw
        p0 = kwi * per
        n_local = cutlass.max(cutlass.min(p0 + per, npairs) - p0, 0)

        w_ptr = mW.iterator
        xrow = cutlass.min(g, t_rows - 1)
        x_ptr = mX.iterator + cute.crd2idx((xrow, 0), mX.layout)

        ns = self.slots
        smem = cutlass.memory.SmemAllocator()
        red = smem.allocate_tensor(cutlass.Float32, cute.make_layout((32, 4, ns, self.warps)), byte_alignment=16)
        xsd = (mX, red, red, mN, eps, red)  # (unused without xs)
        if cutlass.const_expr(self.xs):
            xsd = self.xs_smem(smem, mX, mN, eps)
        acc = cute.make_rmem_tensor((4, ns), cutlass.Float32)
        acc.fill(0.0)
        ld = (w_ptr, x_ptr, tiles, ngr, high, scale, lane, k, p0, n_local, npairs)
        if cutlass.const_expr(self.epilogue == "swiglu"):
            # gate and first up tile of every unit; the second up tile in a pass of its own (only
            # when I % 16 != 0), so that the usual case keeps its registers
            self._stream(ld, acc, tuple(s for s in range(ns) if s % 3 != 2), xsd)
            if m % 16 != 0:
                self._stream(ld, acc, tuple(range(2, ns, 3)), xsd)
        else:
            self._stream(ld, acc, tuple(range(ns)), xsd)

        # ---- reduce over the kw warps of a row, epilogue ----
        for s in cutlass.range_constexpr(ns):
            for e in cutlass.range_constexpr(4):
                red[lane, e, s, warp] = acc[e, s]
        cute.arch.sync_threads()
        total = self.units * 16 * self.cols
        for it in cutlass.range_constexpr((total + self.threads - 1) // self.threads):
            idx = it * self.threads + tidx
            col = idx % self.cols
            r = idx // self.cols % 16
            ul = idx // (16 * self.cols)  # unit of the CTA
            o = (bidx * self.units + ul) * 16 + r
            if idx < total:
                if col < t_rows:
                    if o < m:
                        self._store(red, mR, mY, m, ul, r, col, o, fs)

    @cute.jit
    def _store(self, red, mR, mY, m, ul, r, col, o, fs):
        """The epilogue of output o, column col (row r of unit ul of the CTA)."""
        wr, su = ul // self.tiles, ul % self.tiles
        a = self._unscale(self._sum(red, wr, su * self.per_unit, r, col), fs)
        if cutlass.const_expr(self.epilogue == "swiglu"):
            off = m % 16 + r  # up row m + o sits at this row of the unit's up tiles
            up = self._unscale(self._sum(red, wr, su * self.per_unit + 1 + off // 16, off % 16, col), fs)
            a = a / (1.0 + cute.math.exp(-a, fastmath=False)) * up
        if cutlass.const_expr(self.epilogue == "residual"):
            a = a + mR[col, o].to(cutlass.Float32)
        mY[col, o] = a.to(cutlass.BFloat16)

    @cute.jit
    def _sum(self, red, wr, slot, r, col):
        """Sum over the warp row's kw warps of accumulator (row r, column col) of tile slot `slot`."""
        ln = (r % 8) * 4 + col // 2
        e = (r // 8) * 2 + col % 2
        a = red[ln, e, slot, wr * self.kw]
        for w in cutlass.range_constexpr(1, self.kw):
            a = a + red[ln, e, slot, wr * self.kw + w]
        return a

    @cute.jit
    def _stream(self, ld, acc, sl, xsd):
        """Stream the warp's group pairs of the tile slots `sl` into acc: weights `stages` - 1 pairs
        ahead in registers, x one pair ahead (`xpre`), when needed, or from shared memory (`xs`:
        staged by the first pass)."""
        p0, n_local, npairs = ld[8], ld[9], ld[10]
        S, nb = self.stages, len(sl)
        wb = cute.make_rmem_tensor((4, 2, nb, S), cutlass.Int32)  # base words [word, group, slot, stage]
        hbuf = cute.make_rmem_tensor((max(self.hw, 1), 2, nb, S), cutlass.Int32)
        sb = cute.make_rmem_tensor((2, nb, S), cutlass.Int32)  # scale words [group, slot, stage]
        xb = sb  # (unused with xs)
        if cutlass.const_expr(not self.xs):
            xb = cute.make_rmem_tensor((self.xw, 2, S), cutlass.Int32)  # x words [word, group, stage]
        wb.fill(0)
        hbuf.fill(0)
        sb.fill(0)
        bufs = (wb, hbuf, sb, xb)
        # Prologue: the first stages' weights before the wait (they do not depend on the previous kernel).
        for st in cutlass.range_constexpr(S - 1):
            if st < n_local:
                self._load_w(ld, bufs, sl, p0 + st, st)
        cute.arch.griddepcontrol_wait()
        last = npairs - 1
        xsr = (0, 0, 0)
        if cutlass.const_expr(self.xs):
            if cutlass.const_expr(sl[0] == 0):
                self._stage_x(xsd, ld[7], ld[3])
                cute.arch.sync_threads()
            xsr = self._xs_lane(xsd, ld[6])
        elif cutlass.const_expr(self.xpre):
            self._load_x(ld, xb, cutlass.min(p0, last), 0)
        cute.arch.griddepcontrol_launch_dependents()
        kb = cutlass.Int32(_s32(BIAS_BF16[self.bits] * 0x10001))
        ops = DslOps()
        for rd in cutlass.range((n_local + S - 1) // S, unroll=1):
            for u in cutlass.range_constexpr(S):
                i = rd * S + u
                nxt = i + S - 1
                if nxt < n_local:
                    self._load_w(ld, bufs, sl, p0 + nxt, (u + S - 1) % S)
                if cutlass.const_expr(self.xpre and not self.xs):  # x one pair ahead
                    self._load_x(ld, xb, cutlass.min(p0 + i + 1, last), (u + 1) % S)
                if i < n_local:
                    if cutlass.const_expr(not self.xpre and not self.xs):  # x when needed (mostly L1 hits)
                        self._load_x(ld, xb, p0 + i, u)
                    self._compute(ops, kb, bufs, acc, sl, u, p0 + i, xsr)

    @cute.jit
    def _load_w(self, ld, bufs, sl, p, st):
        """Issue the weight loads of group pair p of the tile slots sl into stage st."""
        w_ptr, _, tiles, ngr, high, scale, lane = ld[:7]
        self._load_tiles(w_ptr, tiles, ngr, high, scale, lane, bufs, sl, p, st)

    @cute.jit
    def _load_tiles(self, w_ptr, tiles, ngr, high, scale, lane, bufs, sl, p, st):
        """Issue the weight loads of group pair p of `tiles`' slots sl into register stage st."""
        wb, hbuf, sb, _ = bufs
        for b in cutlass.range_constexpr(len(sl)):
            tile = tiles[sl[b]]
            for q in cutlass.range_constexpr(2):
                v = _ldw((w_ptr + base_offset(tile, 2 * p + q, ngr, lane) // 4).toint(), 4)
                for e in cutlass.range_constexpr(4):
                    wb[e, q, b, st] = v[e]
                if cutlass.const_expr(self.hw > 0):
                    h = _ldw((w_ptr + high_offset(self.bits, high, tile, 2 * p + q, ngr, lane) // 4).toint(), self.hw)
                    for e in cutlass.range_constexpr(self.hw):
                        hbuf[e, q, b, st] = h[e]
            sc = _ldw((w_ptr + self._scale_off(scale, tile, p, ngr, lane) // 4).toint(), self.sw)
            for e in cutlass.range_constexpr(self.sw):
                sb[e, b, st] = sc[e]

    @cute.jit
    def _load_x(self, ld, xb, p, st):
        """The lane's x words of pair p (column min(g, T - 1): B columns >= T only reach outputs that
        are not stored) into stage st, unconditionally (a predicated write would keep every stage's
        registers live); zero past K (the 16-byte chunk is read at the last chunk of the row instead)."""
        x_ptr, lane, k = ld[1], ld[6], ld[7]
        for q in cutlass.range_constexpr(2):
            for c in cutlass.range_constexpr(self.xw // 4):
                e0 = x_first(self.bits, 2 * p + q, lane) + 8 * c
                v = _ldx((x_ptr + cutlass.min(e0, k - 8)).toint())
                keep = cutlass.Int32(0) - cutlass.Int32(e0 < k)  # all ones inside K
                for e in cutlass.range_constexpr(4):
                    xb[4 * c + e, q, st] = v[e] & keep

    def xs_smem(self, smem, mX, mN, eps, add=None):
        """The x staging operands: (x, B words [cols ngmax 32], -bias sums [cols ngmax], norm weight,
        eps, the norm's per-warp sums [32], `add`) with the shared buffers allocated from `smem`; `add`
        (T = 1): None, or (s fp32 [K], xo bf16 [K], z fp32 [K]): x is bf16(x + s) (see `_add_records`)."""
        xsm = smem.allocate_tensor(cutlass.Int32, cute.make_layout((self.cols * self.ngmax * 32,)), byte_alignment=16)
        nbs = smem.allocate_tensor(cutlass.Float32, cute.make_layout((self._nb_words() * self.ngmax,)), byte_alignment=16)
        nss = nbs
        if cutlass.const_expr(self.norm):
            nss = smem.allocate_tensor(cutlass.Float32, cute.make_layout((32,)), byte_alignment=16)
        return (mX, xsm, nbs, mN, eps, nss, add)

    def _nb_words(self) -> int:
        """Staged -bias sums per group: one per column; T = 1 four copies, the mma's whole C (no register moves)."""
        return 4 if self.cols == 1 else self.cols

    def _rounds(self) -> int:
        """Staging records per thread (the records of K = kmax over the CTA's threads)."""
        return (self.cols * self.ngmax * 4 + self.threads - 1) // self.threads

    @cute.jit
    def _record(self, it, ngr):
        """(record r, clamped record rr, quad thread t, group j, column c) of this thread's round it."""
        tidx, _, _ = cute.arch.thread_idx()
        n_rec = self.cols * ngr * 4
        r = it * self.threads + tidx
        rr = cutlass.min(r, n_rec - 1)  # in range: whole quads stay in step
        if cutlass.const_expr(self.cols == 1):  # no division (rr >= 0, and rr < 4 ngr)
            return r, rr, rr & 3, rr >> 2, 0
        return r, rr, rr % 4, rr // 4 % ngr, rr // (4 * ngr)

    @cute.jit
    def _load_records(self, mT, col, j, t, k, xv, it):
        """The 16 bf16 of group j, quad thread t of row `col` of mT (1-D: col ignored) into xv[:, it]
        (zero past K)."""
        ptr = mT.iterator
        if cutlass.const_expr(cute.rank(mT.layout) == 2):
            ptr = mT.iterator + cute.crd2idx((col, 0), mT.layout)
        for h in cutlass.range_constexpr(2):
            e = j * 64 + 16 * t + 8 * h
            v = _ldx((ptr + cutlass.min(e, k - 8)).toint())
            keep = cutlass.Int32(0) - cutlass.Int32(e < k)  # all ones inside K
            for q in cutlass.range_constexpr(4):
                xv[4 * h + q, it] = v[q] & keep

    @cute.jit
    def load_norm_w(self, xsd, k, ngr):
        """This thread's staging records of the norm weight (issue before griddepcontrol.wait: static)."""
        gv = cute.make_rmem_tensor((8, self._rounds()), cutlass.Int32)
        for it in cutlass.range_constexpr(self._rounds()):
            _, rr, t, j, _ = self._record(it, ngr)
            self._load_records(xsd[3], 0, j, t, k, gv, it)
        return gv

    @cute.jit
    def _stage_x(self, xsd, k, ngr, gv=None, issue=None):
        """All threads: x [T, K] into shared memory as the B words of every (column c, group j, quad
        thread t) (b_regs of x[c, 64 j + 16 t ..], 32 bytes at ((c ngmax + j) 4 + t) 32) and
        -bias * sum(x[c, group j]) at c ngmax + j; columns >= T repeat column T - 1, x past K is 0.
        A thread's records are r = tidx + threads i; all their x loads are issued first (one L2
        latency for the whole staging), then decoded and stored. With `norm` the records are normed
        first (the sum of squares reduced over the CTA; gv: the norm weight's records, or loaded here).
        `issue` (optional) runs once every x (and s) load is issued, before any is used; its result is
        returned (the stream-K members issue their first weight blocks there, behind x in the queues)."""
        mX = xsd[0]
        t_rows = cute.size(mX, mode=[0])
        n_rec = self.cols * ngr * 4
        ops = DslOps()
        rounds = self._rounds()
        xv = cute.make_rmem_tensor((8, rounds), cutlass.Int32)
        for it in cutlass.range_constexpr(rounds):
            _, rr, t, j, c = self._record(it, ngr)
            self._load_records(mX, cutlass.min(c, t_rows - 1), j, t, k, xv, it)
        sv = None
        if cutlass.const_expr(xsd[6] is not None):
            sv = self._load_sums(xsd, k, ngr)
        issued = None
        if cutlass.const_expr(issue is not None):
            cute.arch.sync_warp()  # keeps ptxas from hoisting the issued copies above the x loads
            issued = issue()
        if cutlass.const_expr(xsd[6] is not None):
            self._add_records(xsd, xv, sv, k, ngr)
        if cutlass.const_expr(self.norm):
            if cutlass.const_expr(gv is None):
                gv = self.load_norm_w(xsd, k, ngr)
            self._norm_records(xsd, xv, gv, k, ngr)
        for it in cutlass.range_constexpr(rounds):
            r, _, t, j, c = self._record(it, ngr)
            self.put_record(ops, xsd, [xv[q, it] for q in range(8)], c, j, t, r < n_rec)
        return issued

    @cute.jit
    def put_record(self, ops, xsd, xw, c, j, t, ok):
        """One staging record (x words xw of column c, group j, quad thread t) into shared memory when ok:
        its B words, and from quad thread 0 the group's -bias * sum (summed over the quad by shuffles, so
        every lane of the quad calls this, ok or not)."""
        xsm, nbs = xsd[1], xsd[2]
        s = cutlass.Float32(0.0)
        for q in cutlass.range_constexpr(8):
            s = s + _bf16x2_sum(xw[q])
        br = b_regs(ops, self.bits, xw)
        s = s + cute.arch.shuffle_sync_bfly(s, offset=1)
        s = s + cute.arch.shuffle_sync_bfly(s, offset=2)
        if ok:
            a = xsm.iterator.toint() + ((c * self.ngmax + j) * 4 + t) * 32
            _sts4(a, [br[0][0], br[0][1], br[1][0], br[1][1]])
            _sts4(a + 16, [br[2][0], br[2][1], br[3][0], br[3][1]])
            if t == 0:
                if cutlass.const_expr(self.cols == 1):
                    cs = self._c_start(s)
                    for e in cutlass.range_constexpr(4):
                        nbs[4 * j + e] = cs[e]
                else:
                    nbs[c * self.ngmax + j] = s * cutlass.Float32(-float(BIAS[self.bits]))

    def _c_start(self, s) -> list:
        """The four staged C words of a group at T = 1 (the mma's whole C) from the group's sum of x s: -bias * s
        (the B columns are copies of x, so C's odd columns are free for a second format, see GemvMmaSK's `lo4`)."""
        v = s * cutlass.Float32(-float(BIAS[self.bits]))
        return [v, v, v, v]

    @cute.jit
    def _load_sums(self, xsd, k, ngr):
        """The thread's s records (fp32 words of a deferred residual's sums, T = 1), every load issued."""
        mS = xsd[6][0]
        rounds = self._rounds()
        sv = cute.make_rmem_tensor((16, rounds), cutlass.Int32)
        for it in cutlass.range_constexpr(rounds):
            _, _, t, j, _ = self._record(it, ngr)
            for i in cutlass.range_constexpr(4):
                v = _ldx((mS.iterator + cutlass.min(j * 64 + 16 * t + 4 * i, k - 4)).toint())
                for q in cutlass.range_constexpr(4):
                    sv[4 * i + q, it] = v[q]
        return sv

    @cute.jit
    def _add_records(self, xsd, xv, sv, k, ngr):
        """xv (the thread's x records, T = 1) <- bf16(x + s), s fp32 (sv: `_load_sums`; a deferred residual:
        the sums of the GEMV before, added into s by `accumulate`). The CTA owning a record (record % CTAs
        = CTA) also writes it to xo and zeroes it in z (the sums the next such GEMV adds into), so each is
        written once."""
        bidx, _, _ = cute.arch.block_idx()
        nctas, _, _ = cute.arch.grid_dim()
        _, mXo, mZ = xsd[6]
        n_rec = ngr * 4
        rounds = self._rounds()
        zero = cutlass.Int32(0)
        for it in cutlass.range_constexpr(rounds):
            r, _, t, j, _ = self._record(it, ngr)
            for h in cutlass.range_constexpr(2):
                keep = cutlass.Int32(0) - cutlass.Int32(j * 64 + 16 * t + 8 * h < k)  # all ones inside K
                for q in cutlass.range_constexpr(4):
                    w = 4 * h + q
                    xv[w, it] = _add_word(xv[w, it], sv[2 * w, it], sv[2 * w + 1, it]) & keep
            if r < n_rec:
                if r % nctas == bidx:
                    for h in cutlass.range_constexpr(2):
                        e = j * 64 + 16 * t + 8 * h
                        if e < k:
                            _stg4((mXo.iterator + e).toint(), [xv[4 * h + q, it] for q in range(4)])
                            _stg4((mZ.iterator + e).toint(), [zero] * 4)
                            _stg4((mZ.iterator + e + 4).toint(), [zero] * 4)

    @cute.jit
    def _norm_records(self, xsd, xv, gv, k, ngr):
        """xv (the thread's x records, T = 1) <- bf16(x * rsqrt(sum(x^2) / K + eps) * (1 + nw))."""
        tidx, _, _ = cute.arch.thread_idx()
        nss, eps = xsd[5], xsd[4]
        n_rec = ngr * 4
        ss = cutlass.Float32(0.0)
        for it in cutlass.range_constexpr(self._rounds()):
            if it * self.threads + tidx < n_rec:  # clamped duplicates do not count
                for q in cutlass.range_constexpr(8):
                    ss = ss + _bf16x2_sq(xv[q, it])
        for sh in cutlass.range_constexpr(5):
            ss = ss + cute.arch.shuffle_sync_bfly(ss, offset=1 << sh)
        if tidx % 32 == 0:
            nss[tidx // 32] = ss
        cute.arch.sync_threads()
        ss = cutlass.Float32(0.0)
        for w in cutlass.range_constexpr(self.threads // 32):
            ss = ss + nss[w]
        rs = cute.math.rsqrt(ss / cutlass.Float32(k) + eps, fastmath=False)
        for it in cutlass.range_constexpr(self._rounds()):
            for q in cutlass.range_constexpr(8):
                xv[q, it] = _norm_word(xv[q, it], gv[q, it], rs)

    @cute.jit
    def _xs_lane(self, xsd, lane):
        """Shared addresses of this lane's B words (column min(g, T - 1), thread t; + 128 j) and of
        the -bias sums of its C columns 2t, 2t + 1 (+ 4 j; T = 1: the group's four copies, + 16 j)."""
        mX, xsm, nbs = xsd[0], xsd[1], xsd[2]
        t_rows = cute.size(mX, mode=[0])
        g, t = lane // 4, lane % 4
        rec = xsm.iterator.toint() + (cutlass.min(g, t_rows - 1) * self.ngmax * 4 + t) * 32
        nb0 = nbs.iterator.toint()
        if cutlass.const_expr(self.cols == 1):
            return rec, nb0, nb0
        return (rec, nb0 + cutlass.min(2 * t, t_rows - 1) * self.ngmax * 4,
                nb0 + cutlass.min(2 * t + 1, t_rows - 1) * self.ngmax * 4)

    @cute.jit
    def _compute(self, ops, kb, bufs, acc, sl, st, p, xsr, q4: bool = False):
        """The mmas of the group pair p in stage st, into acc; `q4` (T = 1, x staged): the blocks are Q4 whatever
        this member's format, their C starting at the staged odd C words (`_c_start`)."""
        wb, hbuf, sb, xb = bufs
        for q in cutlass.range_constexpr(2):
            if cutlass.const_expr(self.xs):
                j = 2 * p + q
                b0 = _lds4(xsr[0] + j * 128)
                b1 = _lds4(xsr[0] + j * 128 + 16)
                bregs = [(b0[0], b0[1]), (b0[2], b0[3]), (b1[0], b1[1]), (b1[2], b1[3])]
                if cutlass.const_expr(self.cols == 1):
                    nb = _lds4f(xsr[1] + j * 16)
                else:
                    va = _lds1(xsr[1] + j * 4)
                    vb = _lds1(xsr[2] + j * 4)
                    nb = [va, vb, va, vb]
            else:
                bregs = b_regs(ops, self.bits, [xb[i, q, st] for i in range(self.xw)])
                nb = [cutlass.Float32(0.0)] * 4
                for mk in bias_steps(self.bits):
                    nb = _mma((kb, kb, kb, kb), bregs[mk], nb)
            for b in cutlass.range_constexpr(len(sl)):
                if cutlass.const_expr(q4):
                    lo = pairs_q4(ops, wb[0, q, b, st], wb[1, q, b, st])
                    hi = pairs_q4(ops, wb[2, q, b, st], wb[3, q, b, st])
                else:
                    lo = self._pairs(ops, wb[0, q, b, st], wb[1, q, b, st], hbuf, 0, q, b, st)
                    hi = self._pairs(ops, wb[2, q, b, st], wb[3, q, b, st], hbuf, 1, q, b, st)
                d = nb
                for mk in cutlass.range_constexpr(4):
                    d = _mma((lo[mk][0], hi[mk][0], lo[mk][1], hi[mk][1]), bregs[mk], d)
                for h in cutlass.range_constexpr(2):
                    sc = _f16_f32(sb[q, b, st], h)
                    for e in cutlass.range_constexpr(1 if self.cols == 1 else 2):  # T = 1: column 0 only
                        acc[2 * h + e, sl[b]] = acc[2 * h + e, sl[b]] + sc * d[2 * h + e + (1 if q4 else 0)]

    def _pairs(self, ops, w0, w1, hbuf, h, q, s, st):
        """The A words per k-step of row g (h = 0) or g + 8 (h = 1) of group q of slot s."""
        if cutlass.const_expr(self.bits == 4):
            return pairs_q4(ops, w0, w1)
        if cutlass.const_expr(self.bits == 5):
            return pairs_q5(ops, w0, w1, hbuf[0, q, s, st], h)
        if cutlass.const_expr(self.bits == 6):
            return pairs_q6(ops, w0, w1, hbuf[h, q, s, st])
        return pairs_w8(ops, w0, w1)
