"""Stream-K down projection over the fp32 sums of an accumulating gate_up (a deferred SwiGLU).

    y[n] += sum_k W[n, k] * act[k],   act[k] = bf16(silu(g[k]) * g[K + k])

g (fp32 [1, 2K]) holds the gate | up row sums an `accumulate` GEMV added (no flush: no counters, no
epilogue); this kernel applies the SwiGLU while it stages x, with the formula and rounding of the swiglu
epilogue (`GemvMmaSK._finish`). Staging all of act would cost every CTA 2 K fp32 sums (139 KB for the 27B
down), so the grid is split in two dimensions instead: CTA c takes the K slice kc = c % KC (KC = min(kslices,
pairs, CTAs)) and the unit group uc = c // KC, stages only its slice's act and streams the (unit, pair)
rectangle of blocks (`GemvMmaSK._window`), its warps in equal unit-major runs; the rows' sums go out by red.add
(`accumulate`). Each CTA also zeroes its share of z (fp32 [2K]: the next gate_up's sums), after the PDL wait.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from cute_kernels.gemv_mma import DslOps, _ldx, _stg4
from cute_kernels.gemv_mma_sk import GemvMmaSK


@dsl_user_op
def _as_f32(v, *, loc=None, ip=None) -> cutlass.Float32:
    """The fp32 whose bits are the Int32 v."""
    return cutlass.Float32(llvm.bitcast(T.f32(), cutlass.Int32(v).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def _bf16x2(lo, hi, *, loc=None, ip=None) -> cutlass.Int32:
    """bf16x2 word (lo in bits 0-15) of two fp32, each rounded to nearest even."""
    args = [cutlass.Float32(lo).ir_value(loc=loc, ip=ip), cutlass.Float32(hi).ir_value(loc=loc, ip=ip)]
    return cutlass.Int32(llvm.inline_asm(T.i32(), args, "cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f",
                                         has_side_effects=False, is_align_stack=False,
                                         asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


class GemvMmaSKAct(GemvMmaSK):
    """`accumulate` stream-K GEMV (T = 1) whose x is the SwiGLU of gate_up's fp32 sums, in a 2-D split of
    `kslices` K slices x the CTAs left over (see the module docstring)."""

    def __init__(self, bits: int, group: int, cols: int, epilogue: str, warps: int = 16, stages: int = 3,
                 ctas: int = 1, kmax: int = 0, sk: bool = True, cpa: bool = True, kslices: int = 12,
                 act: bool = True):
        if epilogue != "accumulate" or cols != 1 or not act or kslices < 1:
            raise ValueError("act: the accumulate epilogue at T = 1, kslices >= 1")
        super().__init__(bits, group, cols, epilogue, warps=warps, stages=stages, ctas=ctas, kmax=kmax, sk=sk,
                         cpa=cpa)
        self.kslices = kslices
        self.windowed = True
        self.pmax = (kmax // 128 + kslices - 1) // kslices  # pairs of a K slice at most (K <= kmax)

    @cute.jit
    def __call__(self, mW: cute.Tensor, mG: cute.Tensor, mY: cute.Tensor, mZ: cute.Tensor, stream: cuda.CUstream):
        self.kernel(mW, mG, mY, mZ).launch(grid=(264, 1, 1), block=(self.threads, 1, 1), stream=stream,
                                           min_blocks_per_mp=self.ctas, preferred_smem_carveout=-1)

    @cute.kernel
    def kernel(self, mW: cute.Tensor, mG: cute.Tensor, mY: cute.Tensor, mZ: cute.Tensor):
        self.body(mW, mG, None, mY, None, None, None, cutlass.memory.SmemAllocator(), add=mZ)

    def _kdim(self, mX: cute.Tensor):
        """K: g holds the gate and up sums of K outputs each."""
        return cute.size(mX, mode=[1]) // 2

    @cute.jit
    def _slice(self, npairs):
        """(K slices, this CTA's slice, its first pair, one past its last pair)."""
        bidx, _, _ = cute.arch.block_idx()
        nctas, _, _ = cute.arch.grid_dim()
        kcs = cutlass.min(cutlass.min(cutlass.Int32(self.kslices), npairs), nctas)
        kc = bidx % kcs
        return kcs, kc, kc * npairs // kcs, (kc + 1) * npairs // kcs

    @cute.jit
    def _window(self, n_units, npairs):
        """This warp's run of its CTA's rectangle: the K slice's pairs x the unit group's units."""
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        nctas, _, _ = cute.arch.grid_dim()
        kcs, _, p_lo, p_hi = self._slice(npairs)
        ucs = nctas // kcs
        uc = bidx // kcs  # CTAs past kcs * ucs get no units (they zero their share of z only)
        u_lo = cutlass.min(uc, ucs) * n_units // ucs
        u_hi = cutlass.min(uc + 1, ucs) * n_units // ucs
        nblk = (u_hi - u_lo) * (p_hi - p_lo)
        warp = tidx // 32
        b0 = warp * nblk // self.warps
        b1 = (warp + 1) * nblk // self.warps
        return b0, b1, (u_lo, p_lo, p_hi)

    def _rounds(self) -> int:
        """Staging records per thread: the 8 records of a pair over a K slice's pairs."""
        return (8 * self.pmax + self.threads - 1) // self.threads

    @cute.jit
    def _stage_x(self, xsd, k, ngr, gv=None):
        """The K slice's act = bf16(silu(gate) * up) as staging records (B words and -bias group sums, as
        GemvMma._stage_x puts them, at their groups' places), from g's fp32 sums (8 16-byte loads a record,
        all issued first); past K act is 0. Then this CTA's share of z is zeroed."""
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        nctas, _, _ = cute.arch.grid_dim()
        mG, mZ = xsd[0], xsd[6]
        _, _, p_lo, p_hi = self._slice(ngr // 2)
        n_rec = 8 * (p_hi - p_lo)
        rounds = self._rounds()
        gs = cute.make_rmem_tensor((32, rounds), cutlass.Int32)  # 16 gate then 16 up sums a record
        for it in cutlass.range_constexpr(rounds):
            rr = cutlass.min(it * self.threads + tidx, n_rec - 1)
            e0 = (2 * p_lo + rr // 4) * 64 + 16 * (rr % 4)
            for h in cutlass.range_constexpr(2):  # gate, up
                for i in cutlass.range_constexpr(4):
                    v = _ldx((mG.iterator + h * k + cutlass.min(e0 + 4 * i, k - 4)).toint())
                    for q in cutlass.range_constexpr(4):
                        gs[16 * h + 4 * i + q, it] = v[q]
        ops = DslOps()
        for it in cutlass.range_constexpr(rounds):
            r = it * self.threads + tidx
            rr = cutlass.min(r, n_rec - 1)
            j, t = 2 * p_lo + rr // 4, rr % 4
            words = []
            for w in cutlass.range_constexpr(8):
                a = []
                for e in cutlass.range_constexpr(2):
                    g = _as_f32(gs[2 * w + e, it])
                    up = _as_f32(gs[16 + 2 * w + e, it])
                    a.append(g / (1.0 + cute.math.exp(-g, fastmath=False)) * up)
                keep = cutlass.Int32(0) - cutlass.Int32(j * 64 + 16 * t + 2 * w < k)  # all ones inside K
                words.append(_bf16x2(a[0], a[1]) & keep)
            self.put_record(ops, xsd, words, 0, j, t, r < n_rec)
        chunk = (k // 2 + nctas - 1) // nctas  # 16-byte pieces of z (2 K fp32) per CTA
        for i in cutlass.range(tidx, chunk, self.threads, unroll=1):
            piece = bidx * chunk + i
            if piece < k // 2:
                _stg4((mZ.iterator + 4 * piece).toint(), [cutlass.Int32(0)] * 4)
