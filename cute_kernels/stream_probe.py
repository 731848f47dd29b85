"""Benchmark-only (tools/bench_stream_probe.py): how fast one launch can stream N bytes of weights.

No decode, no math: the memory side of a stream-K GEMV in two shapes, to price the tail of a launch.

* "warp" (the stream-K members' scheme): one CTA of `warps` warps per SM, every warp an equal contiguous
  run of 2 KB blocks, each lane cp.async-copying 4 x 16 bytes a block into the warp's own ring of `stages`
  blocks (`cp.async.wait_group stages - 1`), then reading its bytes back. Every warp's run ends on its own:
  the launch ends with the slowest of SMs x warps streams.
* "bulk": one CTA per SM, one producer thread issuing `cp.async.bulk` copies of `chunk` bytes of the CTA's
  contiguous run into a CTA ring of `stages` chunks (full / empty mbarriers), `warps` consumer warps each
  reading its share of every chunk. One stream per SM: a warp's pace no longer decides when its bytes end.

Both issue their first loads before `griddepcontrol.wait` (weights are static) and sum what they read; a
thread writes `out[thread]` only if its sum is 0x7FFFFFFF, so nothing is stored and nothing is elided.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import T, dsl_user_op

from cute_kernels.gemv_mma_sk import _asm_se, _cp_async, _lds


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


MODES = ("warp", "bulk")
BLOCK = 2048  # "warp": bytes a warp copies per block (32 lanes x 4 x 16)


class StreamProbe:
    """Stream src (int32 [NW], 16-byte multiple) once per launch; grid = one CTA per SM."""

    def __init__(self, mode: str = "warp", warps: int = 16, stages: int = 3, chunk: int = 16384):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        if chunk % (16 * 32 * warps):
            raise ValueError("chunk must be a multiple of 512 bytes per consumer warp")
        self.mode, self.warps, self.stages, self.chunk = mode, warps, stages, chunk
        self.threads = 32 * (warps + (1 if mode == "bulk" else 0))

    @cute.jit
    def __call__(self, mSrc: cute.Tensor, mOut: cute.Tensor, stream: cuda.CUstream):
        self.kernel(mSrc, mOut).launch(grid=(132, 1, 1), block=(self.threads, 1, 1), stream=stream,
                                       min_blocks_per_mp=1, preferred_smem_carveout=-1)

    @cute.kernel
    def kernel(self, mSrc: cute.Tensor, mOut: cute.Tensor):
        smem = cutlass.memory.SmemAllocator()
        tidx, _, _ = cute.arch.thread_idx()
        if cutlass.const_expr(self.mode == "warp"):
            acc = self._warp(mSrc, smem)
        else:
            acc = self._bulk(mSrc, smem)
        if acc == 0x7FFFFFFF:
            bidx, _, _ = cute.arch.block_idx()
            mOut[bidx * self.threads + tidx] = acc

    @cute.jit
    def _warp(self, mSrc: cute.Tensor, smem) -> cutlass.Int32:
        S = self.stages
        ring = smem.allocate_tensor(cutlass.Int32, cute.make_layout((self.warps * S * BLOCK // 4,)), byte_alignment=16)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        nctas, _, _ = cute.arch.grid_dim()
        lane, warp = tidx % 32, tidx // 32
        n16 = cute.size(mSrc, mode=[0]) // 4
        nw = nctas * self.warps
        wg = bidx * self.warps + warp
        lo = cutlass.Int64(cutlass.Int64(wg) * n16 // nw * 16)
        hi = cutlass.Int64(cutlass.Int64(wg + 1) * n16 // nw * 16)
        n = cutlass.Int32((hi - lo + BLOCK - 1) // BLOCK)
        base = mSrc.iterator.toint()
        r0 = ring.iterator.toint() + warp * (S * BLOCK)
        for st in cutlass.range_constexpr(S - 1):
            if st < n:
                self._issue(base, lo, hi, r0, st, st, lane)
            cute.arch.cp_async_commit_group()
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
        acc = cutlass.Int32(0)
        for i in cutlass.range(n, unroll=1):
            if i + S - 1 < n:
                self._issue(base, lo, hi, r0, i + S - 1, (i + S - 1) % S, lane)
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(S - 1)
            d = r0 + (i % S) * BLOCK
            for q in cutlass.range_constexpr(4):
                v = _lds(d + 512 * q + 16 * lane, 4)
                acc = acc + (v[0] ^ v[1]) + (v[2] ^ v[3])
        return acc

    @cute.jit
    def _issue(self, base, lo, hi, r0, i, st, lane):
        """cp.async block i of the warp's run (bytes past the run re-read its last 16) into ring stage st."""
        for q in cutlass.range_constexpr(4):
            src = cutlass.min(lo + i * BLOCK + 512 * q + 16 * lane, hi - 16)
            _cp_async(r0 + st * BLOCK + 512 * q + 16 * lane, base + src, 16)

    @cute.jit
    def _bulk(self, mSrc: cute.Tensor, smem) -> cutlass.Int32:
        S, C = self.stages, self.chunk
        ring = smem.allocate_tensor(cutlass.Int32, cute.make_layout((S * C // 4,)), byte_alignment=128)
        bars = smem.allocate_tensor(cutlass.Int64, cute.make_layout((2 * S,)), byte_alignment=8)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        nctas, _, _ = cute.arch.grid_dim()
        lane, warp = tidx % 32, tidx // 32
        n16 = cute.size(mSrc, mode=[0]) // 4
        lo = cutlass.Int64(cutlass.Int64(bidx) * n16 // nctas * 16)
        hi = cutlass.Int64(cutlass.Int64(bidx + 1) * n16 // nctas * 16)
        n = cutlass.Int32((hi - lo + C - 1) // C)
        base = mSrc.iterator.toint()
        r0 = ring.iterator.toint()
        full = bars.iterator.toint()  # full[s] at full + 8 s, empty[s] at full + 8 (S + s)
        init_ring(full, S, self.warps)
        acc = cutlass.Int32(0)
        if warp == self.warps:  # the producer warp
            if lane == 0:
                for s in cutlass.range_constexpr(S):
                    if s < n:
                        self._fill(base, lo, hi, r0, full, s, s)
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()
            if lane == 0:
                for i in cutlass.range(S, n, unroll=1):
                    s = i % S
                    _wait(full + 8 * (S + s), (i // S - 1) % 2)
                    self._fill(base, lo, hi, r0, full, i, s)
        else:
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()
            per = C // self.warps
            for i in cutlass.range(n, unroll=1):
                s = i % S
                _wait(full + 8 * s, i // S % 2)
                d = r0 + s * C + warp * per
                for q in cutlass.range_constexpr(per // 512):
                    v = _lds(d + 512 * q + 16 * lane, 4)
                    acc = acc + (v[0] ^ v[1]) + (v[2] ^ v[3])
                cute.arch.sync_warp()
                if lane == 0:
                    _mbar_arrive(full + 8 * (S + s))
        return acc

    @cute.jit
    def _fill(self, base, lo, hi, r0, full, i, s):
        """Chunk i of the CTA's run into ring slot s (the run's last chunk may be shorter)."""
        off = lo + cutlass.Int64(i) * self.chunk
        nbytes = cutlass.Int32(cutlass.min(hi - off, cutlass.Int64(self.chunk)))
        _mbar_expect(full + 8 * s, nbytes)
        _bulk(r0 + s * self.chunk, base + off, nbytes, full + 8 * s)
