"""Stream-K decode GEMV with one weight stream per SM (bulk copies into a CTA ring), T = 1.

Same math, formats (Q4-Q6), arguments, workspace and epilogues as `cute_kernels/gemv_mma_sk.py`
(`GemvMmaSK`); what differs is how the weights arrive. There every warp streams its own run through
its own cp.async ring, and a launch ends with the slowest of ~2,100 warp streams. Here a CTA takes an
equal contiguous run of the `units x pairs` blocks and one producer thread copies it with
`cp.async.bulk` into a ring of `stages` stages of `warps` blocks each (full / empty mbarriers); consumer
warp w takes block w of every stage, so the SM's stream is one and no warp's pace decides where its bytes
end (tools/bench_stream_probe.py: 95-96 % of copy on the 27B sizes against 87 % for per-warp runs, PDL
on). The whole ring is issued before `griddepcontrol.wait` (weights are static). Measured slower than
the cp.async member once the blocks are computed (docs/kernels-gemv-mma.md): a benchmark alternative.

A stage's blocks are consecutive in the run, so it is 3 copies per tile slot: the blocks' base bytes
(1024 each), high bytes (256 hw) and scale runs (64), each contiguous in the `tile16-v1` image (swiglu:
gate rows, then up rows I + 16 u: both linear in the block index when I % 16 == 0). A stage holds per
slot [base | high | scales] of its `warps` blocks.

Sums: a warp accumulates its blocks of the current unit in registers. At a stage where a unit ends
(a unit has at least a stage's pairs, so at most one ends per stage) and at the run's last stage, every
consumer warp parks its partial sums of that unit in shared memory (3 rotating buffers), a consumer
barrier, and warp u % warps adds the partials: a unit wholly inside the CTA's run is finished there
(epilogue, y stored: no workspace, no atomics); the run's first and last unit, shared with the
neighbouring CTAs, go through `ws` as in `GemvMmaSK` (red.add of the sums, the CTA's pair count on the
unit's counter, the completing CTA reads back, finishes and zeroes).

Needs pairs >= blocks per stage (K > 128 (warps - 1)) and, for swiglu, I % 16 == 0; the launcher
checks both. `probe` (benchmark only): "nocompute" reads the blocks but does not compute them (wrong
results); "clock" computes the same and lane 0 of every warp writes CLOCK
u64 words after ws's words (at 8-aligned ws end + 8 CLOCK (CTA (warps + 1) + warp)): %clock64 cycles a
consumer spent waiting for its blocks' bytes, reading and computing them, at unit ends (park, barrier,
finish) and in all after x was staged (the producer: waiting for empty slots, issuing copies, 0, all),
then %globaltimer when the warp began, when its PDL wait returned, when x was staged and at its end.
"""


import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import T, dsl_user_op

from cute_kernels.gemv_mma import BIAS_BF16, DslOps, GemvMma, _s32
from cute_kernels.gemv_mma import base_offset, high_offset
from cute_kernels.gemv_mma_sk import COUNTER_ALIGN, GemvMmaSK, _asm_se, _count, _lds, _now, _red_add, _st_u64, owned

BULK_PROBES = ("", "nocompute", "clock")  # benchmark only (module doc)
CLOCK = 8  # "clock": u64 words per warp after ws's words (module doc)
PARTS = 3  # rotating buffers of parked partial sums (a unit's are read before unit + 3 parks)


@dsl_user_op
def _mbar_init(addr, count: int, *, loc=None, ip=None):
    """Initialise the mbarrier at shared address addr for `count` arrivals."""
    _asm_se(None, [cutlass.Int32(addr).ir_value(loc=loc, ip=ip)], f"mbarrier.init.shared::cta.b64 [$0], {count};",
            "r", loc, ip)


@dsl_user_op
def _mbar_init_fence(*, loc=None, ip=None):
    """Make initialised mbarriers visible to the async proxy (bulk copies)."""
    _asm_se(None, [], "fence.mbarrier_init.release.cluster;", "", loc, ip)


@dsl_user_op
def _mbar_expect(addr, nbytes, *, loc=None, ip=None):
    """Arrive on the barrier at addr, expecting nbytes of bulk copies in this phase."""
    _asm_se(None, [cutlass.Int32(addr).ir_value(loc=loc, ip=ip), cutlass.Int32(nbytes).ir_value(loc=loc, ip=ip)],
            "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", "r,r", loc, ip)


@dsl_user_op
def _mbar_arrive(addr, *, loc=None, ip=None):
    """Arrive on the barrier at addr (release: this thread's reads of the slot are done)."""
    _asm_se(None, [cutlass.Int32(addr).ir_value(loc=loc, ip=ip)], "mbarrier.arrive.shared::cta.b64 _, [$0];", "r",
            loc, ip)


@dsl_user_op
def _mbar_done(addr, parity, *, loc=None, ip=None) -> cutlass.Int32:
    """1 when the barrier's phase of this parity has completed (try_wait: suspends a while), else 0."""
    return cutlass.Int32(_asm_se(
        T.i32(), [cutlass.Int32(addr).ir_value(loc=loc, ip=ip), cutlass.Int32(parity).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2;\n\tselp.u32 $0, 1, 0, p;\n\t}",
        "=r,r,r", loc, ip))


@dsl_user_op
def _bulk(dst, src, nbytes, bar, *, loc=None, ip=None):
    """cp.async.bulk of nbytes (a multiple of 16) from global src to shared dst, completing on barrier bar."""
    _asm_se(None, [cutlass.Int32(dst).ir_value(loc=loc, ip=ip), cutlass.Int64(src).ir_value(loc=loc, ip=ip),
                   cutlass.Int32(nbytes).ir_value(loc=loc, ip=ip), cutlass.Int32(bar).ir_value(loc=loc, ip=ip)],
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];", "r,l,r,r",
            loc, ip)


@cute.jit
def _wait(bar, parity):
    """Until the barrier's phase of this parity has completed."""
    while _mbar_done(bar, parity) == 0:
        pass


@dsl_user_op
def _clock(*, loc=None, ip=None) -> cutlass.Int64:
    """The SM's cycle counter."""
    return cutlass.Int64(_asm_se(T.i64(), [], "mov.u64 $0, %clock64;", "=l", loc, ip))


@cute.jit
def init_ring(full, stages: int, consumers: int):
    """Thread 0: full[s] (1 arrival + the bulk bytes) at full + 8 s and empty[s] (`consumers` arrivals) at
    full + 8 (stages + s), made visible to the bulk copies; then every thread of the CTA synchronises."""
    tidx, _, _ = cute.arch.thread_idx()
    if tidx == 0:
        for s in cutlass.range_constexpr(stages):
            _mbar_init(full + 8 * s, 1)
            _mbar_init(full + 8 * (stages + s), consumers)
        _mbar_init_fence()
    cute.arch.sync_threads()


class GemvMmaBulk(GemvMmaSK):
    """`warps` consumer warps (= blocks per stage) and one producer warp per CTA, one CTA per SM, a ring
    of `stages` stages, x for K <= kmax in shared memory (`norm`: the RMSNorm folded into the staging)."""

    def __init__(self, bits: int, group: int, cols: int, epilogue: str, warps: int = 16, stages: int = 4,
                 ctas: int = 1, kmax: int = 0, sk: bool = True, bulk: bool = True, norm: bool = False,
                 probe: str = ""):
        if cols != 1 or ctas != 1:
            raise ValueError("bulk stream-K: T = 1, one CTA per SM")
        if probe not in BULK_PROBES:
            raise ValueError(f"probe must be one of {BULK_PROBES}")
        GemvMma.__init__(self, bits, group, cols, epilogue, warps=warps + 1, kw=1, tiles=1, stages=stages, ctas=ctas,
                         xs=True, kmax=kmax, norm=norm)
        self.probe, self.cpa = probe, True
        self.cw = warps  # consumer warps = blocks per stage
        self.sl = (0, 1) if epilogue == "swiglu" else (0,)  # tile slots of a unit (swiglu: I % 16 == 0)
        self.rows = 16 * len(self.sl)  # parked sums per warp and unit
        self.blk = 1024 + 256 * self.hw + self.scale_run()  # bytes of a block per slot
        self.region = self.cw * self.blk  # a slot's bytes in a stage
        self.stage_bytes = len(self.sl) * self.region

    @cute.kernel
    def kernel(self, mW: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mY: cute.Tensor, mWs: cute.Tensor,
               mN: cute.Tensor, eps):
        B, S = self.cw, self.stages
        ck = self.probe == "clock"
        g0 = _now() if ck else None
        smem = cutlass.memory.SmemAllocator()
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        nctas, _, _ = cute.arch.grid_dim()
        lane, warp = tidx % 32, tidx // 32
        m = cute.size(mY, mode=[1])
        k = cute.size(mX, mode=[1])
        n_w, n_tiles, n_units, ngr, npairs = self.geometry(m, k)
        high, scale = self._planes(n_tiles, ngr)
        nblk = n_units * npairs
        c0 = cutlass.Int32(cutlass.Int64(bidx) * nblk // nctas)
        c1 = cutlass.Int32(cutlass.Int64(bidx + 1) * nblk // nctas)
        nst = (c1 - c0 + B - 1) // B

        xsd = self.xs_smem(smem, mX, mN, eps)
        ring = smem.allocate_tensor(cutlass.Int32, cute.make_layout((S * self.stage_bytes // 4,)), byte_alignment=128)
        bars = smem.allocate_tensor(cutlass.Int64, cute.make_layout((2 * S,)), byte_alignment=8)
        part = smem.allocate_tensor(cutlass.Float32, cute.make_layout((PARTS * self.cw * self.rows,)),
                                    byte_alignment=16)
        cnt = mWs.iterator.toint()
        wsp = cnt + (n_units + COUNTER_ALIGN - 1) // COUNTER_ALIGN * COUNTER_ALIGN * 4
        geo = (mW.iterator, ngr, npairs, high, scale, lane, k, m, n_tiles, n_w, cnt, wsp, ring.iterator.toint(),
               self._out_scale(mW, n_tiles, ngr))
        full = bars.iterator.toint()  # full[s] at full + 8 s, empty[s] at full + 8 (S + s)
        init_ring(full, S, self.cw)
        if warp == self.cw:  # the whole ring before the wait: the weights are static
            if lane == 0:
                for s in cutlass.range_constexpr(S):
                    if s < nst:
                        self._fill(geo, full, c0, c1, s, s)
        gv = None
        if cutlass.const_expr(self.norm):
            gv = self.load_norm_w(xsd, k, ngr)
        cute.arch.griddepcontrol_wait()
        g1 = _now() if ck else None
        self._stage_x(xsd, k, ngr, gv)
        cute.arch.sync_threads()
        cute.arch.griddepcontrol_launch_dependents()
        g2 = _now() if ck else None
        t0 = _clock() if ck else None
        clk = (cutlass.Int64(0), cutlass.Int64(0), cutlass.Int64(0))
        if warp == self.cw:
            if lane == 0:
                clk = self._produce(geo, full, c0, c1, nst)
        else:
            clk = self._consume(geo, full, part, xsd, mR, mY, c0, c1, nst)
        if cutlass.const_expr(ck):
            if lane == 0:
                at = (wsp + n_w * 4 + 7) // 8 * 8 + (bidx * (self.cw + 1) + warp) * (8 * CLOCK)
                for e, v in enumerate(clk + (_clock() - t0, g0, g1, g2, _now())):
                    _st_u64(at + 8 * e, v)

    @cute.jit
    def _produce(self, geo, full, c0, c1, nst):
        """Stages S .. nst - 1 into the ring as their slots are released; (empty waits, issue, 0) cycles
        under the "clock" probe."""
        S = self.stages
        tw = cutlass.Int64(0)
        ti = cutlass.Int64(0)
        for i in cutlass.range(S, nst, unroll=1):
            s = i % S
            if cutlass.const_expr(self.probe == "clock"):
                ta = _clock()
                _wait(full + 8 * (S + s), (i // S - 1) % 2)
                tb = _clock()
                self._fill(geo, full, c0, c1, i, s)
                tw = tw + (tb - ta)
                ti = ti + (_clock() - tb)
            else:
                _wait(full + 8 * (S + s), (i // S - 1) % 2)
                self._fill(geo, full, c0, c1, i, s)
        return tw, ti, cutlass.Int64(0)

    def _addrs(self, geo, s, w, b):
        """Shared addresses of the base, high and scale bytes of tile slot b of block w of stage s."""
        d = geo[12] + s * self.stage_bytes + b * self.region
        return (d + 1024 * w, d + 1024 * self.cw + 256 * self.hw * w,
                d + (1024 + 256 * self.hw) * self.cw + self.scale_run() * w)

    @cute.jit
    def _fill(self, geo, full, c0, c1, i, s):
        """Stage i of the CTA's run (blocks c0 + B i ..) into ring slot s: per tile slot its blocks' base,
        high and scale bytes, each one bulk copy (contiguous in the image)."""
        w_ptr, ngr, npairs, high, scale, _, _, m, n_tiles = geo[:9]
        b0 = c0 + i * self.cw
        nb = cutlass.min(self.cw, c1 - b0)
        u = b0 // npairs
        p = b0 - u * npairs
        tiles = self._tiles(u, m, n_tiles)
        base = w_ptr.toint()
        bar = full + 8 * s
        _mbar_expect(bar, nb * (len(self.sl) * self.blk))
        for b in cutlass.range_constexpr(len(self.sl)):
            tile = tiles[self.sl[b]]
            d, dh, ds = self._addrs(geo, s, 0, b)
            _bulk(d, base + base_offset(tile, 2 * p, ngr, 0), nb * 1024, bar)
            if cutlass.const_expr(self.hw > 0):
                _bulk(dh, base + high_offset(self.bits, high, tile, 2 * p, ngr, 0), nb * (256 * self.hw), bar)
            _bulk(ds, base + self._scale_off(scale, tile, p, ngr, 0), nb * self.scale_run(), bar)

    @cute.jit
    def _consume(self, geo, full, part, xsd, mR, mY, c0, c1, nst):
        """This consumer warp's block of every stage; parks and finishes units as they end (module doc).
        Between two stages where something ends (a unit, the run) the stages run a loop with no bookkeeping
        but the pair and the ring slot; the stage where it ends takes the general path. Returns the "clock"
        probe's (wait, compute, unit end) cycles."""
        B, S = self.cw, self.stages
        npairs, lane = geo[2], geo[5]
        tidx, _, _ = cute.arch.thread_idx()
        warp = tidx // 32
        ck = self.probe == "clock"
        ew = full + 8 * S  # the empty barriers
        xsr = self._xs_lane(xsd, lane)
        ops = DslOps()
        kb = cutlass.Int32(_s32(BIAS_BF16[self.bits] * 0x10001))
        nb = len(self.sl)
        wb = cute.make_rmem_tensor((4, 2, nb, 1), cutlass.Int32)
        hbuf = cute.make_rmem_tensor((max(self.hw, 1), 2, nb, 1), cutlass.Int32)
        sb = cute.make_rmem_tensor((2, nb, 1), cutlass.Int32)
        wb.fill(0)
        hbuf.fill(0)
        sb.fill(0)
        bufs = (wb, hbuf, sb, sb)
        acc = cute.make_rmem_tensor((4, self.slots), cutlass.Float32)
        acc.fill(0.0)
        vl = (c1 - 1) // npairs  # the run's last unit
        slot = cutlass.Int32(0)
        phase = cutlass.Int32(0)
        tw = cutlass.Int64(0)
        tc = cutlass.Int64(0)
        te = cutlass.Int64(0)
        i = cutlass.Int32(0)
        while i < nst:
            s0 = c0 + i * B
            v0 = s0 // npairs
            ib = (cutlass.min((v0 + 1) * npairs, c1) - 1 - c0) // B  # the stage where v0 or the run ends
            p = s0 + warp - v0 * npairs  # stages i .. ib - 1 lie inside unit v0, all their blocks valid
            for _ in cutlass.range(i, ib, unroll=1):
                if cutlass.const_expr(ck):
                    ta = _clock()
                    _wait(full + 8 * slot, phase)
                    tb = _clock()
                    tw = tw + (tb - ta)
                else:
                    _wait(full + 8 * slot, phase)
                self._slot_to_regs(geo, bufs, slot, warp)
                cute.arch.sync_warp()
                if lane == 0:
                    _mbar_arrive(ew + 8 * slot)
                self._block(ops, kb, bufs, acc, p, xsr)
                if cutlass.const_expr(ck):
                    tc = tc + (_clock() - tb)
                p = p + B
                slot = slot + 1
                if slot == S:
                    slot = cutlass.Int32(0)
                    phase = 1 - phase
            s0 = c0 + ib * B
            s1 = cutlass.min(s0 + B, c1)
            v0 = s0 // npairs
            blk = s0 + warp
            u = blk // npairs
            ends = cutlass.Int32((v0 + 1) * npairs <= s1)  # unit v0 ends in this stage
            last = cutlass.Int32(s1 == c1)
            tail = last * (1 - ends * cutlass.Int32(vl == v0))  # the run ends inside unit vl
            valid = cutlass.Int32(blk < s1)
            ta = _clock() if ck else None
            _wait(full + 8 * slot, phase)
            if valid > 0:
                self._slot_to_regs(geo, bufs, slot, warp)
            cute.arch.sync_warp()
            if lane == 0:
                _mbar_arrive(ew + 8 * slot)
            tb = _clock() if ck else None
            mine = valid * cutlass.Int32(u == v0)  # my block belongs to v0
            if ends * (1 - mine) > 0:  # v0 ended before my block: park it first
                self._park(part, acc, v0, warp, lane)
            if valid > 0:
                self._block(ops, kb, bufs, acc, blk - u * npairs, xsr)
            if ends * mine > 0:
                self._park(part, acc, v0, warp, lane)
            if tail > 0:
                self._park(part, acc, vl, warp, lane)
            tcx = _clock() if ck else None
            if ends + last > 0:
                cute.arch.barrier(barrier_id=1, number_of_threads=32 * B)
                if ends > 0:
                    if warp == v0 % B:
                        self._finish_unit(geo, part, v0, c0, c1, mR, mY)
                if tail > 0:
                    if warp == vl % B:
                        self._finish_unit(geo, part, vl, c0, c1, mR, mY)
            if cutlass.const_expr(ck):
                tw = tw + (tb - ta)
                tc = tc + (tcx - tb)
                te = te + (_clock() - tcx)
            slot = slot + 1
            if slot == S:
                slot = cutlass.Int32(0)
                phase = 1 - phase
            i = ib + 1
        return tw, tc, te

    @cute.jit
    def _block(self, ops, kb, bufs, acc, p, xsr):
        """This warp's block (pair p, in the register stage) into acc (not under the "nocompute" probe)."""
        if cutlass.const_expr(self.probe != "nocompute"):
            self._compute(ops, kb, bufs, acc, self.sl, 0, p, xsr)

    @cute.jit
    def _slot_to_regs(self, geo, bufs, s, w):
        """This lane's words of block w of ring slot s into the register stage."""
        lane = geo[5]
        wb, hbuf, sb, _ = bufs
        for b in cutlass.range_constexpr(len(self.sl)):
            d, dh, ds = self._addrs(geo, s, w, b)
            for q in cutlass.range_constexpr(2):
                v = _lds(d + 512 * q + 16 * lane, 4)
                for e in cutlass.range_constexpr(4):
                    wb[e, q, b, 0] = v[e]
                if cutlass.const_expr(self.hw > 0):
                    h = _lds(dh + 128 * self.hw * q + 4 * self.hw * lane, self.hw)
                    for e in cutlass.range_constexpr(self.hw):
                        hbuf[e, q, b, 0] = h[e]
            sc = _lds(ds + self._scale_off(0, 0, 0, 2, lane), self.sw)
            for e in cutlass.range_constexpr(self.sw):
                sb[e, b, 0] = sc[e]

    @cute.jit
    def _park(self, part, acc, v, warp, lane):
        """This warp's partial row sums of unit v into its parking row (buffer v % PARTS); acc zeroed."""
        g, t = lane // 4, lane % 4
        if t == 0:
            row0 = (v % PARTS * self.cw + warp) * self.rows
            for b in cutlass.range_constexpr(len(self.sl)):
                for h in cutlass.range_constexpr(2):
                    part[row0 + 16 * b + g + 8 * h] = acc[2 * h, self.sl[b]]
        acc.fill(0.0)

    @cute.jit
    def _finish_unit(self, geo, part, v, c0, c1, mR, mY):
        """The CTA's sums of unit v (its consumers' parked partials): the unit's outputs when the CTA holds
        all its pairs, else through ws (GemvMmaSK's counter protocol)."""
        npairs, lane, m, n_tiles, n_w, cnt, wsp = geo[2], geo[5], geo[7], geo[8], geo[9], geo[10], geo[11]
        a = cutlass.Float32(0.0)
        if lane < self.rows:
            for w in cutlass.range_constexpr(self.cw):
                a = a + part[(v % PARTS * self.cw + w) * self.rows + lane]
        seg = cutlass.min((v + 1) * npairs, c1) - cutlass.max(v * npairs, c0)
        if seg == npairs:
            a = self._unscale(a, geo[13])
            up = cute.arch.shuffle_sync(a, offset=(lane + 16) % 32)
            o = 16 * v + lane
            if lane < 16:
                if o < m:
                    if cutlass.const_expr(self.epilogue == "swiglu"):
                        a = a / (1.0 + cute.math.exp(-a, fastmath=False)) * up
                    if cutlass.const_expr(self.epilogue == "residual"):
                        a = a + mR[0, o].to(cutlass.Float32)
                    mY[0, o] = a.to(cutlass.BFloat16)
        else:
            tiles = self._tiles(v, m, n_tiles)
            for b in cutlass.range_constexpr(len(self.sl)):
                if lane // 16 == b:
                    row = 16 * tiles[self.sl[b]] + lane % 16
                    if owned(self.epilogue, self.sl[b], tiles[self.sl[b]], tiles, v, row, m, n_w, cutlass.Int32) != 0:
                        _red_add(wsp + row * 4, a)
            cute.arch.fence_acq_rel_gpu()
            cute.arch.sync_warp()
            old = cutlass.Int32(-1)
            if lane == 0:
                old = _count(cnt + v * 4, seg)
            old = cute.arch.shuffle_sync(old, offset=0)
            if old + seg == npairs:
                cute.arch.fence_acq_rel_gpu()
                self._finish(geo, v, mR, mY)
