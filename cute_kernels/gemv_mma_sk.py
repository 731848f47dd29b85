"""Stream-K decode GEMV on groupwise-int weights in `tile16-v1` (tensor cores, x in shared memory).

Same math, formats, arguments and epilogues as `cute_kernels/gemv_mma.py` (`GemvMma` with `xs`:
x staged once per CTA as ready B words, each group's C starting at -bias * sum(x)), plus a workspace
`ws` (int32 words). What differs is the work split: a persistent grid (about `ctas` CTAs per SM)
and every warp takes an equal contiguous run of the `units x pairs` blocks (unit = 16 outputs, its
gate and up tiles for swiglu; pair = two groups along K), in unit-major order. So no SM waits on a
partial last wave, however the block count divides, and x is staged once per CTA, not per unit.

Weights reach the registers either through `stages` register stages per warp (LDG issued stages - 1
blocks ahead) or (`cpa`) through a ring of `stages` shared-memory stages per warp: each lane
cp.async-copies 16 bytes of a block (its 16 base bytes per group; the first lanes also the block's
contiguous high bytes and scale run) and reads its words back with LDS when the block is computed, after
a warp barrier (`cp.async.wait_group stages - 1`, then `bar.warp.sync`), so the bytes in flight cost no
registers and every request is 16 bytes.

A run crosses unit boundaries. At the end of each unit segment the warp adds its fp32 row sums
into `ws` (`red.global.add.f32`, rows this unit owns); at the end of its run it adds each segment's
pair count to the unit's counter (every lane's `fence.acq_rel.gpu` releasing its reds, then relaxed
`atom.add` by lane 0, the run's first and last segment in flight together: a unit ending inside the
run costs no round trip there); the warp that brings a counter to `pairs` acquires (a fence), reads
the sums back while zeroing them (`atom.exch`), applies the epilogue, stores y and zeroes the
counter, so `ws` is all zero again after every launch.

ws layout (int32 words): counters [align_up(units, 32)], then fp32 sums [cols, Nw] (Nw = rows of
W: M, swiglu 2 I). The launcher owns and zeroes it once.

Rows a unit owns (each weight row is added by exactly one unit): plain / residual the rows of its
tile below M; swiglu the gate rows 16 u .. 16 u + 15 below I and the up rows I + 16 u .. of its
up tiles below 2 I (a second up tile only when it differs from the first).
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from cute_kernels.gemv_mma import BIAS, BIAS_BF16, DslOps, GemvMma, _s32, unit_tiles

COUNTER_ALIGN = 32  # counters padded to 128 bytes before the fp32 sums
# Shared bytes a member holds at least: past 113 KB two CTAs (1 KB reserved each) cannot share an sm_90 SM's 228 KB,
# so the one-CTA-per-SM grid is never packed two to an SM by PDL's early launch (whatever the registers allow).
ONE_CTA_PER_SM = 116 * 1024


def _asm_se(ret, args, text, cons, loc, ip):
    return llvm.inline_asm(ret, args, text, cons, has_side_effects=True, is_align_stack=False,
                           asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


@dsl_user_op
def _red_add(addr, v, *, loc=None, ip=None):
    """*addr += v (fp32, global, relaxed)."""
    _asm_se(None, [cutlass.Int64(addr).ir_value(loc=loc, ip=ip), cutlass.Float32(v).ir_value(loc=loc, ip=ip)],
            "red.global.add.f32 [$0], $1;", "l,f", loc, ip)


@dsl_user_op
def _count(addr, v, *, loc=None, ip=None) -> cutlass.Int32:
    """old = *addr; *addr += v (u32, global, relaxed at GPU scope: fences order it)."""
    return cutlass.Int32(_asm_se(T.i32(), [cutlass.Int64(addr).ir_value(loc=loc, ip=ip),
                                          cutlass.Int32(v).ir_value(loc=loc, ip=ip)],
                                 "atom.relaxed.gpu.global.add.u32 $0, [$1], $2;", "=r,l,r", loc, ip))


@dsl_user_op
def _take(addr, *, loc=None, ip=None) -> cutlass.Float32:
    """The fp32 at addr, leaving 0 there (atomic exchange)."""
    return cutlass.Float32(_asm_se(T.f32(), [cutlass.Int64(addr).ir_value(loc=loc, ip=ip)],
                                   "atom.global.exch.b32 $0, [$1], 0;", "=f,l", loc, ip))


@dsl_user_op
def _cp_async(dst, src, nbytes: int, *, loc=None, ip=None):
    """Asynchronous copy of nbytes (4, 8, 16) from global src to shared dst (16: L2 only)."""
    cache = "cg" if nbytes == 16 else "ca"
    _asm_se(None, [cutlass.Int32(dst).ir_value(loc=loc, ip=ip), cutlass.Int64(src).ir_value(loc=loc, ip=ip)],
            f"cp.async.{cache}.shared.global [$0], [$1], {nbytes};", "r,l", loc, ip)


@dsl_user_op
def _evict_first(*, loc=None, ip=None) -> cutlass.Int64:
    """An L2 cache policy that marks the lines it is used with first to be evicted (a stream read once)."""
    return cutlass.Int64(_asm_se(T.i64(), [], "createpolicy.fractional.L2::evict_first.b64 $0, 1.0;", "=l",
                                 loc, ip))


@dsl_user_op
def _cp_async_stream(dst, src, policy, *, loc=None, ip=None):
    """16-byte asynchronous copy from global src to shared dst through L2 only, its lines evicted first
    (`policy` from `_evict_first`): the weights a decode GEMV streams once do not push out of the L2 the
    small vectors (x, sums, the residual) that the next launches read."""
    _asm_se(None, [cutlass.Int32(dst).ir_value(loc=loc, ip=ip), cutlass.Int64(src).ir_value(loc=loc, ip=ip),
                   cutlass.Int64(policy).ir_value(loc=loc, ip=ip)],
            "cp.async.cg.shared.global.L2::cache_hint [$0], [$1], 16, $2;", "r,l,l", loc, ip)


@dsl_user_op
def _mad_wide(a, b: int, c, *, loc=None, ip=None) -> cutlass.Int64:
    """c + a * b, a and b unsigned 32-bit, c 64-bit (an address from an index; ptxas: an IMAD.WIDE, or a LEA
    pair when b is a power of two)."""
    return cutlass.Int64(llvm.inline_asm(
        T.i64(), [cutlass.Int32(a).ir_value(loc=loc, ip=ip), cutlass.Int64(c).ir_value(loc=loc, ip=ip)],
        f"mad.wide.u32 $0, $1, {b}, $2;", "=l,r,l", has_side_effects=False, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


@dsl_user_op
def _udiv(a, b, *, loc=None, ip=None) -> cutlass.Int32:
    """a // b as unsigned 32-bit (a, b >= 0): ~20 inline instructions, where a 64-bit `//` is a call and a
    signed one longer."""
    return cutlass.Int32(llvm.inline_asm(
        T.i32(), [cutlass.Int32(a).ir_value(loc=loc, ip=ip), cutlass.Int32(b).ir_value(loc=loc, ip=ip)],
        "div.u32 $0, $1, $2;", "=r,r,r", has_side_effects=False, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


@dsl_user_op
def _lds(addr, n: int, *, loc=None, ip=None):
    """n (1, 2, 4) words from shared address addr."""
    vec = "" if n == 1 else f".v{n}"
    outs = ", ".join(f"${i}" for i in range(n))
    ty = T.i32() if n == 1 else llvm.StructType.get_literal([T.i32()] * n)
    r = _asm_se(ty, [cutlass.Int32(addr).ir_value(loc=loc, ip=ip)],
                f"ld.shared{vec}.u32 " + (f"{{{outs}}}" if n > 1 else outs) + f", [${n}];",
                ",".join(["=r"] * n + ["r"]), loc, ip)
    if n == 1:
        return [cutlass.Int32(r)]
    return [cutlass.Int32(llvm.extractvalue(T.i32(), r, [i], loc=loc, ip=ip)) for i in range(n)]


@dsl_user_op
def _zero(addr, *, loc=None, ip=None):
    """*addr = 0 (u32, global, relaxed at GPU scope)."""
    _asm_se(None, [cutlass.Int64(addr).ir_value(loc=loc, ip=ip)], "st.relaxed.gpu.global.u32 [$0], 0;", "l",
            loc, ip)


def owned(epilogue: str, slot: int, tile, tiles, u, row, m, n_w, as_int=int):
    """1 when weight row `row` (of `tile`, in tile slot `slot` of unit u, whose slots hold `tiles`) is one
    unit u adds into ws, else 0 (Python ints or DSL Int32, `as_int` turning a comparison into 0 / 1)."""
    if epilogue != "swiglu" or slot == 0:
        return as_int(row < m)
    ok = as_int(row >= m + 16 * u) * as_int(row < m + 16 * u + 16) * as_int(row < n_w)
    if slot == 2:
        ok = ok * as_int(tile != tiles[1])
    return ok


PROBES = ("", "nochain", "empty", "timeline", "nocompute", "nostage", "bare")  # benchmark only (wrong results / extra writes)
PRE_WAIT = 2  # ring slots a warp issues before griddepcontrol.wait (the rest of its prologue after x's loads;
# swiglu: one block, its gate and up slots)
TRACE = 32  # "timeline": %globaltimer when each of a warp's first TRACE blocks is in shared memory
TIMELINE = 7 + TRACE  # "timeline": u64 words per warp after ws's: 5 stamps, %smid, first block | blocks << 32, TRACE


@dsl_user_op
def _now(*, loc=None, ip=None) -> cutlass.Int64:
    """The GPU's global nanosecond timer."""
    return cutlass.Int64(_asm_se(T.i64(), [], "mov.u64 $0, %globaltimer;", "=l", loc, ip))


@dsl_user_op
def _smid(*, loc=None, ip=None) -> cutlass.Int32:
    """The SM this thread runs on."""
    return cutlass.Int32(_asm_se(T.i32(), [], "mov.u32 $0, %smid;", "=r", loc, ip))


@dsl_user_op
def _st_u64(addr, v, *, loc=None, ip=None):
    """*addr = v (u64, global)."""
    _asm_se(None, [cutlass.Int64(addr).ir_value(loc=loc, ip=ip), cutlass.Int64(v).ir_value(loc=loc, ip=ip)],
            "st.global.u64 [$0], $1;", "l,l", loc, ip)


class GemvMmaSK(GemvMma):
    """`warps` warps per CTA, `ctas` CTAs per SM (the launcher sizes the grid), `stages` stages of blocks
    per warp in registers or (`cpa`) in a shared-memory ring, x for K <= kmax in shared memory.

    `probe` (tools/bench_gemv.py --probe, never the executor): "nochain" adds the row sums into ws but
    skips the unit counters and the finishing warps' read-back and epilogue (the flush's dependent L2
    round trips at the end of a run); "empty" stages x and exits (a launch's fixed cost: PDL wait, x
    staging, the ring's first loads, no stream); "timeline" computes the same but lane 0 of every warp
    also writes TIMELINE words after ws's words (at 8-aligned ws end + 8 TIMELINE warp): %globaltimer
    entering the run, after the PDL wait, after the x staging, before the last flush and after it; the SM
    (%smid); the run's first block | its block count << 32; then the time each of the run's first TRACE
    blocks is in the ring (after its cp.async wait). "nostage" skips the x staging (x in shared memory is
    whatever was there), "bare" skips both the staging and the flush chain (bounds for an x, or an epilogue,
    that another kernel prepares). "nocompute" streams the ring but neither decodes nor
    multiplies (the loop's memory side alone)."""

    def __init__(self, bits: int, group: int, cols: int, epilogue: str, warps: int = 8, stages: int = 3,
                 ctas: int = 2, kmax: int = 0, sk: bool = True, cpa: bool = False, norm: bool = False,
                 probe: str = "", lo4: bool = False):
        self.accumulate = epilogue == "accumulate"  # y fp32 [1, M] += W x: the sums go there, no ws, no flush
        if lo4 and (bits != 5 or not self.accumulate or not cpa or not norm or probe):
            raise ValueError("lo4: the Q5 accumulating member with the RMSNorm folded, through the ring, no probe")
        self.lo4 = lo4  # W is a mixed stack: its first `lo` tiles a Q4 image (see GemvMmaSKLo)
        super().__init__(bits, group, cols, "plain" if self.accumulate else epilogue, warps=warps, kw=1, tiles=1,
                         stages=stages, ctas=ctas, xs=True, kmax=kmax, norm=norm)
        if probe not in PROBES:
            raise ValueError(f"probe must be one of {PROBES}")
        if self.accumulate and (cols != 1 or probe):
            raise ValueError("accumulate: T = 1, no probe")
        self.probe = probe
        self.cpa = cpa  # weights through a shared-memory ring (cp.async), not register stages
        # a slot's bytes in the ring: 2 groups of base (512 each), of high bits (128 hw each), 32 scale words x 2
        self.slot_bytes = 1024 + 256 * self.hw + 256
        self.ring_slots = stages * (2 if epilogue == "swiglu" else 1)  # slots of ring per warp

    @cute.jit
    def __call__(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mY: cute.Tensor, mWs: cute.Tensor,
                 mN: cute.Tensor, eps, stream: cuda.CUstream):
        self.kernel(mW, mX, mR, mY, mWs, mN, eps).launch(grid=(264, 1, 1), block=(self.threads, 1, 1),
                                                         stream=stream, min_blocks_per_mp=self.ctas,
                                                         preferred_smem_carveout=-1)

    @cute.kernel
    def kernel(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mY: cute.Tensor, mWs: cute.Tensor,
               mN: cute.Tensor, eps):
        self.body(mW, mX, mR, mY, mWs, mN, eps, cutlass.memory.SmemAllocator())

    def ring_bytes(self) -> int:
        """Shared-memory bytes of the cp.async ring (all warps)."""
        return self.warps * self.ring_slots * self.slot_bytes

    def smem_bytes(self, ring_here: bool) -> int:
        """Shared bytes `body` allocates before its padding (x's B words and group sums, the norm's warp sums,
        `ring_here`: the ring), not counting alignment: a lower bound."""
        return 4 * self.cols * self.ngmax * 33 + (128 if self.norm else 0) + (self.ring_bytes() if ring_here else 0)

    @cute.jit
    def body(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mY: cute.Tensor, mWs: cute.Tensor,
             mN: cute.Tensor, eps, smem, ring=None, add=None, lo=None):
        """The whole GEMV in the calling kernel: x staged from `smem` (`add`: see GemvMma.xs_smem), the ring
        `ring` (an Int32 shared tensor of at least ring_bytes(); None: allocated from `smem` after x); `lo` (lo4
        members): the tiles W holds as a Q4 image ahead of its Q5 image."""
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        nctas, _, _ = cute.arch.grid_dim()
        lane = tidx % 32
        warp = tidx // 32
        m = cute.size(mY, mode=[1])
        k = cute.size(mX, mode=[1])
        n_w, n_tiles, n_units, ngr, npairs = self.geometry(m, k)
        high, scale = self._planes(n_tiles, ngr)
        # warp wg's run: q blocks, one more for the first `rem` warps (no 64-bit division: this prologue is on
        # the critical path of the CTAs that start last)
        nblk = n_units * npairs
        nwarps = nctas * self.warps
        wg = bidx * self.warps + warp
        q = _udiv(nblk, nwarps)
        rem = nblk - q * nwarps
        b0 = wg * q + cutlass.min(wg, rem)
        b1 = b0 + q + cutlass.Int32(wg < rem)

        xsd = self.xs_smem(smem, mX, mN, eps, add)
        own = ring is None  # a caller passing the ring owns the shared-memory layout: no padding then
        ring0 = cutlass.Int32(0)
        if cutlass.const_expr(self.cpa):
            if cutlass.const_expr(ring is None):
                ring = smem.allocate_tensor(cutlass.Int32, cute.make_layout((self.ring_bytes() // 4,)), byte_alignment=16)
            ring0 = ring.iterator.toint() + warp * (self.ring_slots * self.slot_bytes)
        pad = ONE_CTA_PER_SM - self.smem_bytes(ring_here=self.cpa)
        if cutlass.const_expr(own and pad > 0):
            smem.allocate_tensor(cutlass.Int32, cute.make_layout((pad // 4,)), byte_alignment=16)
        if cutlass.const_expr(self.accumulate):
            cnt = mY.iterator.toint()
            part = cnt
        else:
            cnt = mWs.iterator.toint()
            part = cnt + (n_units + COUNTER_ALIGN - 1) // COUNTER_ALIGN * COUNTER_ALIGN * 4
        geo = (mW.iterator, ngr, npairs, high, scale, lane, k, m, n_tiles, n_w, cnt, part, ring0,
               self._out_scale(mW, n_tiles, ngr), _evict_first() if self.cpa else None)
        if cutlass.const_expr(self.lo4):
            self._run_lo(geo + (lo, self._mixed_bases(mW, lo, n_tiles, npairs, lane)), xsd, mY, b0, b1)
        elif cutlass.const_expr(self.epilogue == "swiglu"):
            if m % 16 == 0:
                self._run(geo, (0, 1), xsd, mR, mY, b0, b1)
            else:
                self._run(geo, (0, 1, 2), xsd, mR, mY, b0, b1)
        else:
            self._run(geo, (0,), xsd, mR, mY, b0, b1)

    def _tiles(self, u, m, n_tiles):
        return unit_tiles(self.epilogue, u, m, n_tiles)

    def _c_start(self, s) -> list:
        """lo4: the odd C words start the Q4 blocks (-136 s), the even ones the Q5 blocks (-144 s)."""
        v = super()._c_start(s)
        if not self.lo4:
            return v
        v4 = s * cutlass.Float32(-float(BIAS[4]))
        return [v[0], v4, v[2], v4]

    @cute.jit
    def _mixed_bases(self, mW, lo, n_tiles, npairs, lane):
        """A mixed stack's plane addresses for this lane, so that a block of global group pair P (tile * pairs
        + p, tile over both images) is at base + P x the plane's bytes a pair: (Q4 base, Q4 scale, Q5 base - Q4
        base, Q5 scale - Q4 scale, Q5 high). The image: the Q4 tile16-v1 image of tiles [0, lo) (base plane,
        then scales), padded to 256 bytes, then the Q5 image of tiles [lo, n_tiles) (base, high, scale planes)."""
        p4 = cutlass.Int64(lo * npairs)  # the Q4 image's group pairs
        p5 = cutlass.Int64((n_tiles - lo) * npairs)
        w = cutlass.Int64(mW.iterator.toint())
        q5 = w + p4 * 1024 + (p4 * 64 + 255) // 256 * 256
        b4 = w + 16 * lane
        s4 = w + p4 * 1024 + 16 * (lane - 16)
        b5 = q5 - p4 * 1024 + 16 * lane
        s5 = q5 + p5 * 1024 + (p5 * 256 + 255) // 256 * 256 - p4 * 64 + 16 * (lane - 16)
        h5 = q5 + p5 * 1024 - p4 * 256 + 16 * lane
        return b4, s4, b5 - b4, s5 - s4, h5

    @cute.jit
    def _start(self, geo, bufs, sl, xsd, u, p, n, pre, end):
        """A run's start: ring slots 0 .. pre - 1 issued and the norm weight read (both static) before the PDL wait,
        then x staged with slots pre .. end - 1 issued behind x's loads (ahead of them, x would wait for a launch's
        burst of DRAM loads to drain), the CTA barrier and the dependents' trigger. The load cursor (lu, lp), this
        lane's x and, for the timeline probe, the stamps after the wait and after the barrier (else None)."""
        ngr, lane, k = geo[1], geo[5], geo[6]
        tl = self.probe == "timeline"
        lu, lp = self._prologue(geo, bufs, sl, u, p, n, 0, pre)
        gv = None
        if cutlass.const_expr(self.norm):
            gv = self.load_norm_w(xsd, k, ngr)
        cute.arch.griddepcontrol_wait()
        t1 = _now() if tl else None
        if cutlass.const_expr(self.probe not in ("nostage", "bare")):
            if cutlass.const_expr(pre < end):
                lu, lp = self._stage_x(xsd, k, ngr, gv,
                                       issue=lambda: self._prologue(geo, bufs, sl, lu, lp, n, pre, end))
            else:
                self._stage_x(xsd, k, ngr, gv)
        elif cutlass.const_expr(pre < end):
            lu, lp = self._prologue(geo, bufs, sl, lu, lp, n, pre, end)
        cute.arch.sync_threads()
        t2 = _now() if tl else None
        xsr = self._xs_lane(xsd, lane)
        cute.arch.griddepcontrol_launch_dependents()
        return lu, lp, xsr, t1, t2

    @cute.jit
    def _run(self, geo, sl, xsd, mR, mY, b0, b1):
        """Stream blocks b0 .. b1 - 1 (unit b // pairs, pair b % pairs) through `stages` register stages
        (cpa: a ring of shared-memory stages, filled by cp.async); flush at every unit end and at b1."""
        npairs, lane = geo[2], geo[5]
        S, nb = self.stages, len(sl)
        if cutlass.const_expr(self.cpa):
            S = self.ring_slots // nb
        n = b1 - b0
        tl = self.probe == "timeline"
        t0 = _now() if tl else None
        at = cutlass.Int64(0)
        if cutlass.const_expr(tl):
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            end = (geo[11] + self.cols * geo[9] * 4 + 7) // 8 * 8
            at = end + (bidx * self.warps + tidx // 32) * (8 * TIMELINE)
        wb = cute.make_rmem_tensor((4, 2, nb, S), cutlass.Int32)
        hbuf = cute.make_rmem_tensor((max(self.hw, 1), 2, nb, S), cutlass.Int32)
        sb = cute.make_rmem_tensor((2, nb, S), cutlass.Int32)
        wb.fill(0)
        hbuf.fill(0)
        sb.fill(0)
        if cutlass.const_expr(self.cpa):  # one register stage, loaded from the ring before each compute
            wb = cute.make_rmem_tensor((4, 2, nb, 1), cutlass.Int32)
            hbuf = cute.make_rmem_tensor((max(self.hw, 1), 2, nb, 1), cutlass.Int32)
            sb = cute.make_rmem_tensor((2, nb, 1), cutlass.Int32)
        bufs = (wb, hbuf, sb, sb)
        # (u, p): block b0's unit and pair, the compute cursor; (lu, lp): the load cursor, S - 1 blocks ahead
        u = _udiv(b0, npairs)
        p = b0 - u * npairs
        # PRE_WAIT ring slots before the wait (register stages: whole blocks), the rest behind x's loads
        pre, end = min((S - 1) * nb, PRE_WAIT), (S - 1) * nb
        if cutlass.const_expr(not self.cpa):
            pre = min(S - 1, PRE_WAIT) * nb
        lu, lp, xsr, t1, t2 = self._start(geo, bufs, sl, xsd, u, p, n, pre, end)
        t3 = t2
        if cutlass.const_expr(self.probe == "empty"):  # nothing streamed; the ring's first loads drained
            n = cutlass.Int32(0)
            if cutlass.const_expr(self.cpa):
                cute.arch.cp_async_wait_group(0)

        ops = DslOps()
        kb = cutlass.Int32(_s32(BIAS_BF16[self.bits] * 0x10001))
        acc = cute.make_rmem_tensor((4, self.slots), cutlass.Float32)
        acc.fill(0.0)
        seg = cutlass.Int32(0)
        held = cutlass.Int32(-1)  # a unit whose sums are in ws but whose count waits for the run's end
        held_seg = cutlass.Int32(0)
        for rd in cutlass.range((n + S - 1) // S, unroll=1):
            for s in cutlass.range_constexpr(S):
                i = rd * S + s
                if i + S - 1 < n:
                    if cutlass.const_expr(self.cpa):
                        self._load_cpa(geo, sl, lu, lp, (s + S - 1) % S)
                    else:
                        self._load(geo, bufs, sl, lu, lp, (s + S - 1) % S)
                if cutlass.const_expr(self.cpa):
                    cute.arch.cp_async_commit_group()
                    cute.arch.cp_async_wait_group(S - 1)
                if cutlass.const_expr(tl):
                    if i < TRACE and i < n and lane == 0:
                        _st_u64(at + 8 * (7 + i), _now())
                lp = lp + 1
                if lp == npairs:
                    lp = cutlass.Int32(0)
                    lu = lu + 1
                if i < n:
                    if cutlass.const_expr(self.probe == "nocompute"):
                        pass
                    elif cutlass.const_expr(self.cpa):
                        self._ring_to_regs(geo, bufs, nb, s)
                        self._compute(ops, kb, bufs, acc, sl, 0, p, xsr)
                    else:
                        self._compute(ops, kb, bufs, acc, sl, s, p, xsr)
                    seg = seg + 1
                    p = p + 1
                    if p == npairs or i == n - 1:
                        if cutlass.const_expr(tl):
                            if i == n - 1:
                                t3 = _now()
                        self._sums(geo, sl, acc, u, mY)
                        if i == n - 1:
                            self._arrive(geo, sl, held, held_seg, u, seg, mR, mY)
                        else:  # a unit ends inside the run: no round trip now, its count goes with the last
                            if held >= 0:  # (a third segment: the held one arrives alone)
                                self._arrive(geo, sl, held, held_seg, held, 0, mR, mY)
                            held = u
                            held_seg = seg
                        acc.fill(0.0)
                        seg = cutlass.Int32(0)
                        if p == npairs:
                            p = cutlass.Int32(0)
                            u = u + 1
        if cutlass.const_expr(tl):
            t4 = _now()
            if lane == 0:
                info = (cutlass.Int64(_smid()), cutlass.Int64(b0) + (cutlass.Int64(n) << 32))
                for e, t in enumerate((t0, t1, t2, t3, t4) + info):
                    _st_u64(at + 8 * e, t)

    @cute.jit
    def _run_lo(self, geo, xsd, mY, b0, b1):
        """`_run` of a lo4 member (accumulate, one tile slot, ring): blocks b0 .. b1 - 1 of a mixed stack, whose
        units below `lo` are Q4. The run's Q4 blocks come first: whole rounds of Q4 blocks (their loads, S - 1
        blocks ahead, may be Q5: the format is chosen per load), then one round that may hold both (a branch per
        block; only in the few warps whose run crosses the boundary inside a round), then Q5 rounds, so no other
        block carries two decodes."""
        npairs, lo = geo[2], geo[15]
        S = self.ring_slots
        n = b1 - b0
        nq = cutlass.min(cutlass.max(lo * npairs - b0, 0), n)  # the run's Q4 blocks
        wb = cute.make_rmem_tensor((4, 2, 1, 1), cutlass.Int32)
        hbuf = cute.make_rmem_tensor((self.hw, 2, 1, 1), cutlass.Int32)
        sb = cute.make_rmem_tensor((2, 1, 1), cutlass.Int32)
        bufs = (wb, hbuf, sb, sb)
        u = _udiv(b0, npairs)
        p = b0 - u * npairs
        lu, lp, xsr, _, _ = self._start(geo, bufs, (0,), xsd, u, p, n, min(S - 1, PRE_WAIT), S - 1)
        ops = DslOps()
        kb = cutlass.Int32(_s32(BIAS_BF16[self.bits] * 0x10001))
        acc = cute.make_rmem_tensor((4, self.slots), cutlass.Float32)
        acc.fill(0.0)
        rounds = (n + S - 1) // S
        ra = nq // S  # rounds of Q4 blocks only
        rm = ra + cutlass.Int32(nq - ra * S > 0)  # and the round holding both, if the boundary is inside one
        for rd in cutlass.range(ra, unroll=1):
            for s in cutlass.range_constexpr(S):
                lu, lp, u, p = self._step_lo(geo, ops, kb, bufs, acc, xsr, mY, rd * S + s, s, n, nq, lu, lp, u, p, 4)
        for rd in cutlass.range(ra, rm, unroll=1):
            for s in cutlass.range_constexpr(S):
                lu, lp, u, p = self._step_lo(geo, ops, kb, bufs, acc, xsr, mY, rd * S + s, s, n, nq, lu, lp, u, p, 0)
        for rd in cutlass.range(rm, rounds, unroll=1):
            for s in cutlass.range_constexpr(S):
                lu, lp, u, p = self._step_lo(geo, ops, kb, bufs, acc, xsr, mY, rd * S + s, s, n, nq, lu, lp, u, p, 5)

    @cute.jit
    def _step_lo(self, geo, ops, kb, bufs, acc, xsr, mY, i, s, n, nq, lu, lp, u, p, fmt: int):
        """Block i of a lo4 run in ring stage s: issue block i + S - 1's copies, then compute block i as Q4
        (fmt 4), Q5 (5) or as its index says (0: Q4 below nq); add the unit's sums into y at its end. The load
        cursor (lu, lp) and the compute cursor (u, p), returned advanced."""
        npairs = geo[2]
        S = self.ring_slots
        if i + S - 1 < n:
            self._load_lo(geo, lu, lp, (s + S - 1) % S, fmt == 4)
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(S - 1)
        lp = lp + 1
        if lp == npairs:
            lp = cutlass.Int32(0)
            lu = lu + 1
        if i < n:
            self._ring_to_regs(geo, bufs, 1, s, fmt != 4)
            if cutlass.const_expr(fmt == 0):
                if i < nq:
                    self._compute(ops, kb, bufs, acc, (0,), 0, p, xsr, q4=True)
                else:
                    self._compute(ops, kb, bufs, acc, (0,), 0, p, xsr)
            else:
                self._compute(ops, kb, bufs, acc, (0,), 0, p, xsr, q4=fmt == 4)
            p = p + 1
            if p == npairs or i == n - 1:
                self._sums(geo, (0,), acc, u, mY)
                acc.fill(0.0)
                if p == npairs:
                    p = cutlass.Int32(0)
                    u = u + 1
        return lu, lp, u, p

    @cute.jit
    def _load_lo(self, geo, u, p, st, sel: bool):
        """cp.async pair p of unit u of a mixed stack into ring stage st (`_load_cpa`'s slot layout): Q5 when
        not `sel`, else as the unit says (below lo: Q4, no high bytes)."""
        npairs, lane, pol, lo = geo[2], geo[5], geo[14], geo[15]
        b4, s4, db, ds, h5 = geo[16]
        pair = u * npairs + p
        d = self._ring_addr(geo, 1, st, 0)
        b, sc = b4 + db, s4 + ds
        if cutlass.const_expr(sel):
            keep = cutlass.Int64(0) - cutlass.Int64(u >= lo)  # all ones for a Q5 unit
            b, sc = b4 + (db & keep), s4 + (ds & keep)
        src = _mad_wide(pair, 1024, b)
        for q in cutlass.range_constexpr(2):
            _cp_async_stream(d + 512 * q + 16 * lane, src + 512 * q, pol)
        if lane < 16:
            if cutlass.const_expr(sel):
                if u >= lo:
                    _cp_async_stream(d + 1024 + 16 * lane, _mad_wide(pair, 256, h5), pol)
            else:
                _cp_async_stream(d + 1024 + 16 * lane, _mad_wide(pair, 256, h5), pol)
        if lane >= 16 and lane < 16 + self.scale_run() // 16:
            _cp_async_stream(d + 1280 + 16 * (lane - 16), _mad_wide(pair, 64, sc), pol)

    @cute.jit
    def _prologue(self, geo, bufs, sl, lu, lp, n, first, last):
        """Issue slots first .. last - 1 of the run's first S - 1 blocks (slot st nb + b: tile slot b of
        block st, into ring stage st; register stages: whole blocks only), the load cursor at the block
        of slot `first`; a block's copies are committed as one group with its last slot. The load cursor
        after the blocks completed."""
        npairs, nb = geo[2], len(sl)
        for st in cutlass.range_constexpr(first // nb, (last + nb - 1) // nb):
            b0, b1 = max(first - st * nb, 0), min(last - st * nb, nb)
            if st < n:
                if cutlass.const_expr(self.cpa):
                    self._load_cpa(geo, sl, lu, lp, st, b0, b1)
                else:
                    self._load(geo, bufs, sl, lu, lp, st)
            if cutlass.const_expr(b1 == nb):
                if cutlass.const_expr(self.cpa):
                    cute.arch.cp_async_commit_group()
                lp = lp + 1
                if lp == npairs:
                    lp = cutlass.Int32(0)
                    lu = lu + 1
        return lu, lp

    def _ring_addr(self, geo, nb, st, b):
        """Shared address of slot b of ring stage st of this warp (lane offsets added by the callers)."""
        return geo[12] + (st * nb + b) * self.slot_bytes

    @cute.jit
    def _load_cpa(self, geo, sl, u, p, st, b0=0, b1=None):
        """cp.async pair p of unit u's tile slots sl into ring stage st, 16 bytes a lane: each lane its 16
        base bytes per group at 512 q + 16 lane; the pair's high bytes (256 hw, contiguous in the image) by
        lanes < 16 hw at 1024 + 16 lane; its scale run (`scale_run` bytes) by the next lanes at
        1024 + 256 hw + 16 lane. Every plane holds a tile's group pairs one after another, tile after tile,
        so a source is its plane's lane base plus (tile * pairs + p) times the plane's bytes a pair.
        Slots b0 .. b1 - 1 only (default: all). lo4: `_load_lo`, its format chosen by the unit."""
        if cutlass.const_expr(self.lo4):
            self._load_lo(geo, u, p, st, True)
        else:
            self._load_cpa_one(geo, sl, u, p, st, b0, b1)

    @cute.jit
    def _load_cpa_one(self, geo, sl, u, p, st, b0=0, b1=None):
        """`_load_cpa` for an image of one format."""
        w_ptr, _, npairs, high, scale, lane, _, m, n_tiles = geo[:9]
        pol = geo[14]
        tiles = self._tiles(u, m, n_tiles)
        base = cutlass.Int64(w_ptr.toint())
        run = self.scale_run()
        sl0 = 16 * self.hw % 32  # Q6's high bytes take every lane: its scales start again at lane 0
        for b in cutlass.range_constexpr(b0, len(sl) if b1 is None else b1):
            pair = tiles[sl[b]] * npairs + p
            d = self._ring_addr(geo, len(sl), st, b)
            src = _mad_wide(pair, self.pair_bytes()[0], base + 16 * lane)
            for q in cutlass.range_constexpr(2):
                _cp_async_stream(d + 512 * q + 16 * lane, src + 512 * q, pol)
            if cutlass.const_expr(self.hw > 0):
                if lane < 16 * self.hw:
                    _cp_async_stream(d + 1024 + 16 * lane,
                                     _mad_wide(pair, self.pair_bytes()[1], base + high + 16 * lane), pol)
            if lane >= sl0 and lane < sl0 + run // 16:
                _cp_async_stream(d + 1024 + 256 * self.hw + 16 * (lane - sl0),
                                 _mad_wide(pair, self.pair_bytes()[2], base + scale + 16 * (lane - sl0)), pol)

    def pair_bytes(self) -> tuple[int, int, int]:
        """Bytes one group pair of a tile takes in the image's base, high and scale planes."""
        return 1024, 256 * self.hw, self._scale_off(0, 0, 1, 2, 0)

    def scale_run(self) -> int:
        """Bytes of a group pair's scales in the image (contiguous; lanes of a quad may share them)."""
        return max(self._scale_off(0, 0, 0, 2, lane) for lane in range(32)) + 4 * self.sw

    @cute.jit
    def _ring_to_regs(self, geo, bufs, nb, st, high: bool = True):
        """This lane's words of ring stage st into the single register stage (lanes read bytes other lanes
        copied: a warp barrier after the cp.async wait, and one after the reads before the slot is refilled);
        not the high words when not `high` (a Q4 block of a lo4 member)."""
        lane = geo[5]
        wb, hbuf, sb, _ = bufs
        cute.arch.sync_warp()
        for b in cutlass.range_constexpr(nb):
            d = self._ring_addr(geo, nb, st, b)
            for q in cutlass.range_constexpr(2):
                v = _lds(d + 512 * q + 16 * lane, 4)
                for e in cutlass.range_constexpr(4):
                    wb[e, q, b, 0] = v[e]
                if cutlass.const_expr(self.hw > 0 and high):
                    h = _lds(d + 1024 + 128 * self.hw * q + 4 * self.hw * lane, self.hw)
                    for e in cutlass.range_constexpr(self.hw):
                        hbuf[e, q, b, 0] = h[e]
            sc = _lds(d + 1024 + 256 * self.hw + self._scale_off(0, 0, 0, 2, lane), self.sw)
            for e in cutlass.range_constexpr(self.sw):
                sb[e, b, 0] = sc[e]
        cute.arch.sync_warp()

    @cute.jit
    def _load(self, geo, bufs, sl, u, p, st):
        """Issue the weight loads of pair p of unit u's tile slots sl into register stage st."""
        w_ptr, ngr, _, high, scale, lane, _, m, n_tiles = geo[:9]
        self._load_tiles(w_ptr, self._tiles(u, m, n_tiles), ngr, high, scale, lane, bufs, sl, p, st)

    @cute.jit
    def _sums(self, geo, sl, acc, u, mY):
        """Add this warp's row sums of unit u into ws (relaxed reds, the rows unit u owns)."""
        lane, m, n_tiles, n_w, part = geo[5], geo[7], geo[8], geo[9], geo[11]
        t_rows = cute.size(mY, mode=[0])
        g, t = lane // 4, lane % 4
        tiles = self._tiles(u, m, n_tiles)
        if t == 0:
            for b in cutlass.range_constexpr(len(sl)):
                tile = tiles[sl[b]]
                for h in cutlass.range_constexpr(2):
                    row = 16 * tile + g + 8 * h
                    if owned(self.epilogue, sl[b], tile, tiles, u, row, m, n_w, cutlass.Int32) != 0:
                        for col in cutlass.range_constexpr(self.cols):
                            if col < t_rows:
                                _red_add(part + (col * n_w + row) * 4, acc[2 * h + col, sl[b]])

    @cute.jit
    def _arrive(self, geo, sl, u0, seg0, u1, seg1, mR, mY):
        """Count this warp's pairs of unit u0 (when u0 >= 0 and seg0 > 0) and of unit u1 (seg1 > 0), whose
        sums are in ws: every lane's fence releases its reds, lane 0 adds both counts (relaxed atomics in
        flight together), and the warp that completes a unit acquires and finishes it."""
        npairs, lane, cnt = geo[2], geo[5], geo[10]
        # the counters and the finishing warp's read-back (none for the probes without a chain, nor accumulate)
        if cutlass.const_expr(self.probe not in ("nochain", "bare") and not self.accumulate):
            cute.arch.fence_acq_rel_gpu()
            cute.arch.sync_warp()
            a0 = cutlass.Int32(-1)
            a1 = cutlass.Int32(-1)
            if lane == 0:
                if u0 >= 0:
                    a0 = _count(cnt + u0 * 4, seg0)
                if seg1 > 0:
                    a1 = _count(cnt + u1 * 4, seg1)
            a0 = cute.arch.shuffle_sync(a0, offset=0)
            a1 = cute.arch.shuffle_sync(a1, offset=0)
            d0 = cutlass.Int32(0)
            d1 = cutlass.Int32(0)
            if a0 >= 0:
                if a0 + seg0 == npairs:
                    d0 = cutlass.Int32(1)
            if a1 >= 0:
                if a1 + seg1 == npairs:
                    d1 = cutlass.Int32(1)
            if d0 + d1 > 0:
                cute.arch.fence_acq_rel_gpu()
            if d0 > 0:
                self._finish(geo, u0, mR, mY)
            if d1 > 0:
                self._finish(geo, u1, mR, mY)

    @cute.jit
    def _finish(self, geo, u, mR, mY):
        """Unit u is complete: read its sums back while zeroing them, apply the epilogue, store y, zero
        the unit's counter."""
        lane, m, n_w, cnt, part = geo[5], geo[7], geo[9], geo[10], geo[11]
        t_rows = cute.size(mY, mode=[0])
        r = lane % 16
        col = lane // 16
        o = 16 * u + r
        if col < self.cols:
            if col < t_rows:
                if o < m:
                    a = self._unscale(_take(part + (col * n_w + o) * 4), geo[13])
                    if cutlass.const_expr(self.epilogue == "swiglu"):
                        up = self._unscale(_take(part + (col * n_w + m + o) * 4), geo[13])
                        a = a / (1.0 + cute.math.exp(-a, fastmath=False)) * up
                    if cutlass.const_expr(self.epilogue == "residual"):
                        a = a + mR[col, o].to(cutlass.Float32)
                    mY[col, o] = a.to(cutlass.BFloat16)
        if lane == 0:
            _zero(cnt + u * 4)


class GemvMmaSKAdd(GemvMmaSK):
    """GemvMmaSK (T = 1) whose x is bf16(x + s): s fp32 [K] the sums an `accumulate` GEMV added (a residual
    deferred to this launch's staging); CTA c also writes the records it owns of that x to xo bf16 [K]
    (the residual stream, for the GEMV after) and zeroes them in z fp32 [K] (the next `accumulate` target)."""

    def __init__(self, *args, add: bool = True, **kw):
        super().__init__(*args, **kw)
        if not add or self.cols != 1 or not self.norm:
            raise ValueError("add: T = 1, the RMSNorm folded")

    @cute.jit
    def __call__(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mY: cute.Tensor, mWs: cute.Tensor,
                 mN: cute.Tensor, eps, mS: cute.Tensor, mXo: cute.Tensor, mZ: cute.Tensor, stream: cuda.CUstream):
        self.kernel(mW, mX, mR, mY, mWs, mN, eps, mS, mXo, mZ).launch(
            grid=(264, 1, 1), block=(self.threads, 1, 1), stream=stream, min_blocks_per_mp=self.ctas,
            preferred_smem_carveout=-1)

    @cute.kernel
    def kernel(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mY: cute.Tensor, mWs: cute.Tensor,
               mN: cute.Tensor, eps, mS: cute.Tensor, mXo: cute.Tensor, mZ: cute.Tensor):
        self.body(mW, mX, mR, mY, mWs, mN, eps, cutlass.memory.SmemAllocator(), add=(mS, mXo, mZ))


class GemvMmaSKLo(GemvMmaSK):
    """The `_acc_n` Q5 member over a mixed stack (`lo4`): W's first `lo` tiles are a Q4 tile16-v1 image (base
    plane, then scales), padded to 256 bytes, followed by the Q5 image of the other tiles (inferno/model/gpu/
    merge.py), so the Q4 rows of a merged input projection are read as Q4. `lo` is a launch argument."""

    def __init__(self, *args, lo4: bool = True, **kw):
        super().__init__(*args, lo4=lo4, **kw)

    @cute.jit
    def __call__(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mY: cute.Tensor, mWs: cute.Tensor,
                 mN: cute.Tensor, eps, lo: cutlass.Int32, stream: cuda.CUstream):
        self.kernel(mW, mX, mR, mY, mWs, mN, eps, lo).launch(grid=(264, 1, 1), block=(self.threads, 1, 1),
                                                             stream=stream, min_blocks_per_mp=self.ctas,
                                                             preferred_smem_carveout=-1)

    @cute.kernel
    def kernel(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mY: cute.Tensor, mWs: cute.Tensor,
               mN: cute.Tensor, eps, lo: cutlass.Int32):
        self.body(mW, mX, mR, mY, mWs, mN, eps, cutlass.memory.SmemAllocator(), lo=lo)


class GemvMmaSKAddLo(GemvMmaSKAdd):
    """GemvMmaSKLo whose x is bf16(x + s) (`_acc_na`, see GemvMmaSKAdd)."""

    def __init__(self, *args, lo4: bool = True, **kw):
        super().__init__(*args, lo4=lo4, **kw)

    @cute.jit
    def __call__(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mY: cute.Tensor, mWs: cute.Tensor,
                 mN: cute.Tensor, eps, mS: cute.Tensor, mXo: cute.Tensor, mZ: cute.Tensor, lo: cutlass.Int32,
                 stream: cuda.CUstream):
        self.kernel(mW, mX, mR, mY, mWs, mN, eps, mS, mXo, mZ, lo).launch(
            grid=(264, 1, 1), block=(self.threads, 1, 1), stream=stream, min_blocks_per_mp=self.ctas,
            preferred_smem_carveout=-1)

    @cute.kernel
    def kernel(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mY: cute.Tensor, mWs: cute.Tensor,
               mN: cute.Tensor, eps, mS: cute.Tensor, mXo: cute.Tensor, mZ: cute.Tensor, lo: cutlass.Int32):
        self.body(mW, mX, mR, mY, mWs, mN, eps, cutlass.memory.SmemAllocator(), add=(mS, mXo, mZ), lo=lo)
