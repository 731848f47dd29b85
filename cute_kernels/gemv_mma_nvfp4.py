"""Decode GEMV on NVFP4 weights with tensor cores: the x-in-shared-memory (`GemvMma` with xs) and
stream-K (`GemvMmaSK`, cp.async ring) kernels of `cute_kernels/gemv_mma.py` / `gemv_mma_sk.py`, reading
the `tile16-nvfp4-v1` image (`inferno/kernels/tiled_nvfp4.py`) instead of `tile16-v1`.

    y[t, n] = sum_k W[n, k] x[t, k],   W[n, k] = e2m1(c[n, k]) * e4m3(s[n, k / 16]) / d_w

Only the weight format differs from the groupwise kernels: the block of a lane quad is 64 codes (lane
t: group 4j + t of its two rows, its 16 base bytes exactly the Q4 ones), the scales are one E4M3 byte
per (row, group), and A holds the scaled weight itself, so no -bias start and no per-group fp32 fold:

* e2m1 -> bf16 by bit placement: the code's magnitude bits (e1 e0 m) moved to bits 8..6 and its sign
  to bit 15 is the bf16 of e2m1 * 2^-126 exactly (e = 0, m = 1, i.e. 0.5, is the bf16 subnormal
  2^-127). Pair i of a code word holds codes (i, i + 4) (bits 4i and 16 + 4i, as Q4): a LOP3 keeps
  their two nibbles, one IMAD by 2^a + 2^(a + 6) puts a copy of each at bits 6.. (magnitude) and one
  at bits 12.. (sign at 15; the copies do not overlap, so the sum carries nothing), a LOP3 keeps
  bits 6..8 and 15 of both halves (pairs 2, 3 from the word shifted right by 8, once per word).
* the scale: the E4M3 byte at bits 4..11 of a bf16 is e4m3 * 2^-120 exactly (its subnormals too);
  a shift and a mask put a row's two block scales into one bf16x2, two bf16x2 multiplies (2^120,
  2^119) make them s * 2^119: 8 instructions per thread and block pair for its 4 scales.
* A = bf16x2(e2m1 * 2^-126) * (s * 2^119, broadcast from its half) = e2m1 * s * 2^-7: exact (<= 6
  significant bits, within 2^-17 .. 21), one `mul.rn.bf16x2` per pair; the mmas accumulate straight
  into the fp32 sums, and the epilogue applies 2^7 / d_w (d_w read once from the image) before
  swiglu / residual.

PDL as the groupwise kernels: the inherited kernel bodies issue the first weight loads, then call
`cute.arch.griddepcontrol_wait()` before they touch x, r, y or the workspace.

B and the k permutation are those of Q4 (`b_regs`: k-step m pairs codes (m, m + 4 | 8 + m, 12 + m)),
so the shared-memory x staging (and the `_n` RMSNorm fold) is the groupwise one as it is.
The decode (`e2m1_pair`, `scale_pairs`, `pairs_fp4`) is written against `ops` so the CPU test runs it
in numpy (tests/test_kernels_gemv_nvfp4_mma.py).
"""

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from cute_kernels.gemv_mma import DslOps, GemvMma, _asm, _lds4, _mma
from cute_kernels.gemv_mma_sk import GemvMmaSK

E2M1_BITS = 0x81C081C0  # e2m1 sign at bf16 bit 15, magnitude bits (e1 e0 m) at bits 8..6, both halves
POW120, POW119 = 0x7B807B80, 0x7B007B00  # bf16x2 (2^120, 2^120), (2^119, 2^119)
OUT_SHIFT = 128.0  # 2^7: A holds e2m1 * s * 2^-7


def _up(v, a: int):
    return (v + a - 1) // a * a


# ---- decode, written against `ops` (DSL values in the kernel, numpy arrays in the CPU test) ----

def e2m1_pair(ops, w, w8, i: int):
    """bf16x2 (e2m1(code i), e2m1(code i + 4)) * 2^-126 of a code word w (code c at bits 4c .. 4c + 3;
    w8 = w >> 8 serves pairs 2 and 3)."""
    j = i % 2
    x = ops.band(w if i < 2 else w8, 0x000F000F << 4 * j)  # codes i, i + 4 alone
    return ops.band(ops.imul(x, (1 << 6 - 4 * j) + (1 << 12 - 4 * j)), E2M1_BITS)


def scale_pairs(ops, sw):
    """(row g, row g + 8) bf16x2 (s(block 0), s(block 1)) * 2^119 of the lane's scale word
    sw = E4M3 [s(g, q0), s(g + 8, q0), s(g, q1), s(g + 8, q1)] (sign clear)."""
    raw = (ops.band(ops.shl(sw, 4), 0x0FF00FF0), ops.band(ops.shr(sw, 4), 0x0FF00FF0))  # bf16 s * 2^-120
    return tuple(ops.hmul(ops.hmul(r, ops.c(POW120)), ops.c(POW119)) for r in raw)


def pairs_fp4(ops, w0, w1, s, h: int):
    """Per k-step m (4 per 16 codes): the A words (codes m, m+4 | 8+m, 12+m) of one row, times the
    scale in half h of s (both halves of a pair have the same scale)."""
    w8 = (ops.shr(w0, 8), ops.shr(w1, 8))
    return [tuple(ops.hmul_half(e2m1_pair(ops, w, v, m), s, h) for w, v in zip((w0, w1), w8)) for m in range(4)]


# ---- tile16-nvfp4-v1 addressing (bytes; Python ints, numpy arrays or DSL Int32) ----------------

def planes(tiles, blocks):
    """(scale plane, divisor) byte offsets of a `tile16-nvfp4-v1` image of `tiles` tiles x `blocks` blocks."""
    scale = _up(tiles * blocks * 512, 256)
    return scale, scale + tiles * blocks * 64


def scale_offset(scale, tile, pair, blocks, lane):
    """Lane's 4 scale bytes of blocks 2 pair, 2 pair + 1: [s(g, q0), s(g+8, q0), s(g, q1), s(g+8, q1)]."""
    return scale + (tile * (blocks // 2) + pair) * 128 + 4 * lane


# ---- DSL helpers -------------------------------------------------------------------------------

@dsl_user_op
def _hmul(a, b, *, loc=None, ip=None) -> cutlass.Int32:
    """bf16x2 a * b (round to nearest; subnormal inputs are honoured)."""
    args = [cutlass.Int32(a).ir_value(loc=loc, ip=ip), cutlass.Int32(b).ir_value(loc=loc, ip=ip)]
    return cutlass.Int32(_asm(T.i32(), args, "mul.rn.bf16x2 $0, $1, $2;", "=r,r,r", loc, ip))


@dsl_user_op
def _hmul_half(a, b, h: int, *, loc=None, ip=None) -> cutlass.Int32:
    """bf16x2 a * (half h of b in both halves)."""
    args = [cutlass.Int32(a).ir_value(loc=loc, ip=ip), cutlass.Int32(b).ir_value(loc=loc, ip=ip)]
    half = "h" if h else "l"
    return cutlass.Int32(_asm(T.i32(), args, "{ .reg .b16 l, h; .reg .b32 s; mov.b32 {l, h}, $2; "
                              f"mov.b32 s, {{{half}, {half}}}; mul.rn.bf16x2 $0, $1, s; }}", "=r,r,r", loc, ip))


@dsl_user_op
def _bits_f32(v, *, loc=None, ip=None) -> cutlass.Float32:
    return cutlass.Float32(llvm.bitcast(T.f32(), cutlass.Int32(v).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


class Fp4Ops(DslOps):
    """DslOps plus the bf16x2 multiply."""

    @staticmethod
    def hmul(a, b):
        return _hmul(a, b)

    @staticmethod
    def hmul_half(a, b, h: int):
        return _hmul_half(a, b, h)


class _Nvfp4:
    """The NVFP4 format of the tensor-core GEMV kernels (mixed into GemvMma / GemvMmaSK)."""

    def _fp4(self):
        self.sw = 1  # one scale word per lane and block pair

    def _planes(self, n_tiles, ngr):
        return 0, planes(n_tiles, ngr)[0]

    def _scale_off(self, scale, tile, p, ngr, lane):
        return scale_offset(scale, tile, p, ngr, lane)

    def _out_scale(self, mW, n_tiles, ngr):
        """d_w, read from the image (static: before griddepcontrol.wait is fine)."""
        return _bits_f32(mW[planes(n_tiles, ngr)[1] // 4])

    def _unscale(self, a, fs):
        return a * cutlass.Float32(OUT_SHIFT) / fs

    @cute.jit
    def _compute(self, ops, kb, bufs, acc, sl, st, p, xsr):
        """The mmas of block pair p in stage st, into acc (B words from the shared x records)."""
        wb, _, sb, _ = bufs
        fops = Fp4Ops()
        scales = [scale_pairs(fops, sb[0, b, st]) for b in range(len(sl))]
        for q in cutlass.range_constexpr(2):
            j = 2 * p + q
            b0 = _lds4(xsr[0] + j * 128)
            b1 = _lds4(xsr[0] + j * 128 + 16)
            bregs = [(b0[0], b0[1]), (b0[2], b0[3]), (b1[0], b1[1]), (b1[2], b1[3])]
            for b in cutlass.range_constexpr(len(sl)):
                sg, sg8 = scales[b]
                lo = pairs_fp4(fops, wb[0, q, b, st], wb[1, q, b, st], sg, q)
                hi = pairs_fp4(fops, wb[2, q, b, st], wb[3, q, b, st], sg8, q)
                d = [acc[e, sl[b]] for e in range(4)]
                for mk in cutlass.range_constexpr(4):
                    d = _mma((lo[mk][0], hi[mk][0], lo[mk][1], hi[mk][1]), bregs[mk], d)
                for e in cutlass.range_constexpr(4):
                    acc[e, sl[b]] = d[e]


def _check_format(bits: int, group: int) -> None:
    if (bits, group) != (4, 16):
        raise ValueError("NVFP4: bits 4, group 16")


class GemvMmaNvfp4(_Nvfp4, GemvMma):
    """x in shared memory (K <= kmax), `warps` warps per CTA in warp rows of `kw` warps splitting K."""

    def __init__(self, bits: int, group: int, cols: int, epilogue: str, warps: int = 8, kw: int = 4,
                 tiles: int = 1, stages: int = 3, ctas: int = 2, xs: bool = True, kmax: int = 18432,
                 norm: bool = False):
        _check_format(bits, group)
        if not xs:
            raise ValueError("NVFP4: x in shared memory (xs) only")
        super().__init__(4, 64, cols, epilogue, warps=warps, kw=kw, tiles=tiles, stages=stages, ctas=ctas,
                         xs=True, kmax=kmax, norm=norm)  # group 64: a lane quad's block (4 NVFP4 groups)
        self._fp4()


class GemvMmaNvfp4SK(_Nvfp4, GemvMmaSK):
    """Stream-K over (unit, block pair) blocks, weights through a cp.async ring (`cpa`) or register stages."""

    def __init__(self, bits: int, group: int, cols: int, epilogue: str, warps: int = 16, stages: int = 3,
                 ctas: int = 1, kmax: int = 18432, sk: bool = True, cpa: bool = True, norm: bool = False):
        _check_format(bits, group)
        super().__init__(4, 64, cols, epilogue, warps=warps, stages=stages, ctas=ctas, kmax=kmax, sk=sk, cpa=cpa,
                         norm=norm)
        self._fp4()
