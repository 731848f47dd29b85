"""Gated DeltaNet prefill: the chunked gated delta rule over T tokens of one sequence.

One CTA per value head j (key head kh = j // (Hv / Hk)), 8 warps, chunks of C = 64 tokens in
order, the fp32 state S [dk, dv] of the head held in registers (the accumulator of an 8-warp
mma.sync tiling, 16 rows of S per warp) from the first chunk to the last. Per chunk, with
G_i = cumulative log-decay from the chunk start, beta_i, and rows past T given g = beta = k = 0:

    q, k     = l2norm(q), l2norm(k) (eps 1e-6); q *= dk^-0.5            (bf16 tiles in smem)
    A        = (q k^T) * D,  D[i, m] = exp(G_i - G_m) for m <= i else 0      (tensor cores)
    L        = strictly_lower(beta_i (k k^T) * D)                           (tensor cores)
    R        = beta_i (v - exp(G_i) k S)                                    (tensor cores)
    v_new    = (I + L)^-1 R            (forward substitution, fp32, one thread per dv column)
    o        = exp(G_i) q S + A v_new                                       (tensor cores)
    S        = exp(G_last) S + (k exp(G_last - G))^T v_new                  (tensor cores)
    out      = norm_w * o * rsqrt(mean(o^2) + eps) * silu(z)                (gated RMSNorm, bf16)

v_new = U - W S of the UT form ((I+L)^-1 vb - (I+L)^-1 (kb exp(G)) S) computed as one solve.
Products are bf16 x bf16 -> fp32 (mma.sync m16n8k16, ldmatrix); S enters them as a bf16 copy, as
in FLA's kernels, while the carried state stays fp32. Warps 0-3 (the "query group") compute
q S and q k^T, warps 4-7 (the "key group") k S and k k^T, sharing one code path (their A tile is
sQ or sK). Then the key group solves while the query group rescales k in place for the state
update; then the query group adds A v_new and writes the output rows while all 8 warps update S.

Value split (`vsplit` = 1, 2 or 4): the columns of S evolve independently given k, beta and the
decays (S[:, c] only meets v[:, c]), so vsplit CTAs (one cluster) share a head, each owning dv /
vsplit columns of S, R, v_new and o; the k-side work (l2norm, q k^T, k k^T, D, L, A) is repeated
per CTA. The key group then solves with vsplit threads per column (interleaved terms, butterfly
sum). The gated RMSNorm needs mean(o^2) over the whole dv row: each CTA writes its per-row partial
sums of squares to smem (double-buffered by chunk parity), one cluster barrier per chunk, then
every CTA adds the vsplit partials in rank order through DSMEM (identical norms in all CTAs).
vsplit = 1 is the single-CTA kernel (grid Hv, no cluster), unchanged.

Layouts: qkv [T, 2*Hk*dk + Hv*dv] bf16 (conv output q | k | v), z and out [T, Hv*dv] bf16, a and
b [T, Hv] bf16 (any row stride), A_log and dt_bias [Hv] fp32, norm_w [dv] bf16, state
[slots * Hv, dk, dv] fp32 (the decode kernels' layout); `slot` picks the sequence's state.
Shared memory (89 KiB at vsplit 1): q / v_new tile, k tile (bf16 64 x 128 each), S in bf16
(128 x dv/vsplit) aliased by R in fp32 (64 x dv/vsplit), L fp32 (64 x 64), A bf16 (64 x 64), G and
beta, and for vsplit > 1 the row partial sums of squares (2 x 64 fp32).
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import warp
from cutlass.cutlass_dsl import T, dsl_user_op

L2_EPS = 1e-6
LOG2E = 1.4426950408889634
VEC = 4  # bf16 values per lane when a warp loads one 128-wide row
VSPLITS = (1, 2, 4)


@dsl_user_op
def _ld_cluster_f32(addr, rank, *, loc=None, ip=None):
    """ld.shared::cluster of the fp32 at local smem address `addr` in CTA `rank` of the cluster (a
    side effect, so it stays after the cluster barrier that orders it)."""
    return cutlass.Float32(llvm.inline_asm(
        T.f32(), [cutlass.Int32(addr).ir_value(loc=loc, ip=ip), cutlass.Int32(rank).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .b32 ra;\n\tmapa.shared::cluster.u32 ra, $1, $2;\n\tld.shared::cluster.f32 $0, [ra];\n\t}",
        "=f,r,r", has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


def _shared_storage(c: int, lay_ck, lay_cc, lay_s, split: bool):
    """The kernel's smem struct; with `split`, also the row partial sums of squares (2 x c fp32)."""
    bf16, f32 = cutlass.BFloat16, cutlass.Float32

    @cute.struct
    class SharedStorage:
        sQ: cute.struct.Align[cute.struct.MemRange[bf16, cute.cosize(lay_ck)], 1024]
        sK: cute.struct.Align[cute.struct.MemRange[bf16, cute.cosize(lay_ck)], 1024]
        sS: cute.struct.Align[cute.struct.MemRange[bf16, cute.cosize(lay_s)], 1024]
        sL: cute.struct.Align[cute.struct.MemRange[f32, c * c], 16]
        sA: cute.struct.Align[cute.struct.MemRange[bf16, cute.cosize(lay_cc)], 1024]
        sG: cute.struct.Align[cute.struct.MemRange[f32, c], 16]
        sBeta: cute.struct.Align[cute.struct.MemRange[f32, c], 16]

    @cute.struct
    class SharedStorageSplit:
        sQ: cute.struct.Align[cute.struct.MemRange[bf16, cute.cosize(lay_ck)], 1024]
        sK: cute.struct.Align[cute.struct.MemRange[bf16, cute.cosize(lay_ck)], 1024]
        sS: cute.struct.Align[cute.struct.MemRange[bf16, cute.cosize(lay_s)], 1024]
        sL: cute.struct.Align[cute.struct.MemRange[f32, c * c], 16]
        sA: cute.struct.Align[cute.struct.MemRange[bf16, cute.cosize(lay_cc)], 1024]
        sG: cute.struct.Align[cute.struct.MemRange[f32, c], 16]
        sBeta: cute.struct.Align[cute.struct.MemRange[f32, c], 16]
        sSS: cute.struct.Align[cute.struct.MemRange[f32, 2 * c], 16]

    return SharedStorageSplit if split else SharedStorage


def _warp_sum(x):
    """Butterfly sum over the 32 lanes of a warp; unrolled at trace time."""
    for i in range(5):
        x = x + cute.arch.shuffle_sync_bfly(x, offset=1 << i)
    return x


class GdnChunk:
    """Chunked gated delta rule + gates + q/k l2norm + gated RMSNorm; `vsplit` CTAs per value head."""

    def __init__(self, head_k: int = 128, head_v: int = 128, chunk: int = 64, warps: int = 8, vsplit: int = 1):
        if (head_k, head_v, chunk, warps) != (128, 128, 64, 8):
            raise ValueError("GdnChunk is written for dk = dv = 128, chunk 64, 8 warps")
        if vsplit not in VSPLITS:
            raise ValueError(f"GdnChunk vsplit must be one of {VSPLITS}, got {vsplit}")
        self.dk, self.dv, self.chunk, self.warps, self.vsplit = head_k, head_v, chunk, warps, vsplit
        self.dvs = head_v // vsplit  # value columns per CTA

    @cute.jit
    def __call__(self, mQKV: cute.Tensor, mZ: cute.Tensor, mA: cute.Tensor, mB: cute.Tensor,
                 mALog: cute.Tensor, mDtBias: cute.Tensor, mNormW: cute.Tensor, mState: cute.Tensor,
                 mOut: cute.Tensor, slot: cutlass.Int32, eps: cutlass.Float32, stream: cuda.CUstream):
        bf16, f32 = cutlass.BFloat16, cutlass.Float32
        c, dk, vs, dvs = self.chunk, self.dk, self.vsplit, self.dvs
        # 8 rows x 64 bf16 (128 bytes) per swizzle atom: conflict-free ldmatrix (as in attn_prefill).
        atom = cute.make_composed_layout(cute.make_swizzle(3, 3, 3), 0,
                                         cute.make_layout((8, 64), stride=(64, 1)))
        lay_ck = cute.tile_to_shape(atom, (c, dk), (0, 1))
        lay_cc = cute.tile_to_shape(atom, (c, c), (0, 1))
        if cutlass.const_expr(dvs >= 64):
            lay_s = cute.tile_to_shape(atom, (dk, dvs), (0, 1))
        else:  # 32 columns: 8 rows x 32 bf16 (64 bytes) per atom
            atom32 = cute.make_composed_layout(cute.make_swizzle(2, 3, 3), 0,
                                               cute.make_layout((8, 32), stride=(32, 1)))
            lay_s = cute.tile_to_shape(atom32, (dk, dvs), (0, 1))
        SharedStorage = _shared_storage(c, lay_ck, lay_cc, lay_s, vs > 1)

        atom_mma = warp.MmaF16BF16Op(bf16, f32, (16, 8, 16))
        mma_g = cute.make_tiled_mma(atom_mma, (4, 1, 1), permutation_mnk=(64, 16, 16))  # one group
        mma_s = cute.make_tiled_mma(atom_mma, (8, 1, 1), permutation_mnk=(128, 16, 16))  # all 8 warps
        hv = cute.size(mALog, mode=[0])
        launch = self.kernel(mQKV, mZ, mA, mB, mALog, mDtBias, mNormW, mState, mOut, slot, eps,
                             lay_ck, lay_cc, lay_s, mma_g, mma_s, SharedStorage)
        if cutlass.const_expr(vs == 1):
            launch.launch(grid=(hv, 1, 1), block=(32 * self.warps, 1, 1), stream=stream)
        elif cutlass.const_expr(vs == 2):  # the vsplit CTAs of a head form one cluster (consecutive blocks)
            launch.launch(grid=(hv * vs, 1, 1), block=(32 * self.warps, 1, 1), cluster=(vs, 1, 1), stream=stream)
        else:  # 4 Hv CTAs exceed the SMs: <= 128 registers so that two CTAs fit on one SM
            launch.launch(grid=(hv * vs, 1, 1), block=(32 * self.warps, 1, 1), cluster=(vs, 1, 1), stream=stream,
                          min_blocks_per_mp=2, preferred_smem_carveout=100)

    @cute.kernel
    def kernel(self, mQKV: cute.Tensor, mZ: cute.Tensor, mA: cute.Tensor, mB: cute.Tensor,
               mALog: cute.Tensor, mDtBias: cute.Tensor, mNormW: cute.Tensor, mState: cute.Tensor,
               mOut: cute.Tensor, slot: cutlass.Int32, eps: cutlass.Float32,
               lay_ck: cute.ComposedLayout, lay_cc: cute.ComposedLayout, lay_s: cute.ComposedLayout,
               mma_g: cute.TiledMma, mma_s: cute.TiledMma, SharedStorage: cutlass.Constexpr):
        bf16, f32 = cutlass.BFloat16, cutlass.Float32
        c, dk, dv, vs, dvs = self.chunk, self.dk, self.dv, self.vsplit, self.dvs
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        if cutlass.const_expr(vs == 1):
            head, part = bid, 0
        else:
            head, part = bid // vs, bid % vs  # part = this CTA's rank in the head's cluster
        c0 = part * dvs  # first value column of this CTA
        wid = tidx // 32
        lane = tidx % 32
        grp = wid // 4  # 0: query group, 1: key group
        gt = tidx % 128  # thread index inside the group
        t_len = cute.size(mQKV, mode=[0])
        hv = cute.size(mALog, mode=[0])
        hk = (cute.size(mQKV, mode=[1]) - hv * dv) // (2 * dk)
        kh = head // (hv // hk)
        v_col = 2 * hk * dk + head * dv + c0

        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(SharedStorage)
        sQ = st.sQ.get_tensor(lay_ck)
        sK = st.sK.get_tensor(lay_ck)
        sS = st.sS.get_tensor(lay_s)
        sVn = sQ  # v_new reuses the q tile (q is last read by the products before the solve)
        sR = cute.make_tensor(cute.recast_ptr(sS.iterator, dtype=f32), cute.make_layout((c, dvs), stride=(dvs, 1)))
        sL = st.sL.get_tensor(cute.make_layout((c, c), stride=(c, 1)))
        sA = st.sA.get_tensor(lay_cc)
        sG = st.sG.get_tensor(cute.make_layout((c,)))
        sBeta = st.sBeta.get_tensor(cute.make_layout((c,)))
        # This group's A tile (q or k): the two tiles are adjacent with the same layout.
        sX = cute.make_tensor((sQ.iterator + grp * cute.cosize(lay_ck)).align(1024), lay_ck)
        # Transposed views for the operands that are stored the other way round.
        sSt = cute.composition(sS, cute.make_layout((dvs, dk), stride=(dk, 1)))  # (dvs, dk)
        sVnT = cute.composition(sVn, cute.make_layout((dvs, c), stride=(c, 1)))  # (dvs, chunk)
        sKT = cute.composition(sK, cute.make_layout((dk, c), stride=(c, 1)))  # (dk, chunk)

        # The state: fp32 accumulator of the 8-warp tiling, loaded once, stored once.
        thr_s = mma_s.get_slice(tidx)
        gS = mState[slot * hv + head, None, None]
        if cutlass.const_expr(vs > 1):
            gS = cute.local_tile(gS, (dk, dvs), (0, part))  # this CTA's columns of the state
        accS = cute.make_rmem_tensor(thr_s.partition_shape_C((dk, dvs)), f32)
        cute.autovec_copy(thr_s.partition_C(gS), accS)
        s2s = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), bf16), mma_s)
        thr_s2s = s2s.get_slice(tidx)
        tSsS = thr_s2s.partition_D(sS)

        thr_g = mma_g.get_slice(gt)
        cX = thr_g.partition_C(cute.make_identity_tensor((c, dvs)))
        cXK = thr_g.partition_C(cute.make_identity_tensor((c, c)))
        acc_x = cute.make_rmem_tensor(thr_g.partition_shape_C((c, dvs)), f32)
        acc_xk = cute.make_rmem_tensor(thr_g.partition_shape_C((c, c)), f32)
        a_log = cute.math.exp(mALog[head], fastmath=False)
        dt_bias = mDtBias[head]

        n_chunks = (t_len + c - 1) // c
        for ci in cutlass.range(n_chunks, unroll=1):
            t0 = ci * c
            # ---- a. S -> bf16 smem; l2-normalised q, k -> smem; gates ---------------------------
            rSb = cute.make_fragment_like(accS, bf16)
            rSb.store(accS.load().to(bf16))
            cute.copy(s2s, thr_s2s.retile(rSb), tSsS)

            for rr in cutlass.range_constexpr(c // self.warps):
                r = wid * (c // self.warps) + rr
                rQ = cute.make_rmem_tensor((VEC,), bf16)
                rK = cute.make_rmem_tensor((VEC,), bf16)
                # Rows past T load the last row (no branch, so the loads of all rows can be in
                # flight together) and are zeroed by `keep`.
                keep = f32(1.0)
                if t0 + r >= t_len:
                    keep = f32(0.0)
                gQKV = cute.zipped_divide(mQKV[cutlass.min(t0 + r, t_len - 1), None], (VEC,))
                cute.autovec_copy(gQKV[None, kh * (dk // VEC) + lane], rQ)
                cute.autovec_copy(gQKV[None, (hk + kh) * (dk // VEC) + lane], rK)
                q = rQ.load().to(f32) * keep
                k = rK.load().to(f32) * keep
                qq = _warp_sum((q * q).reduce(cute.ReductionOp.ADD, f32(0.0), reduction_profile=0))
                kk = _warp_sum((k * k).reduce(cute.ReductionOp.ADD, f32(0.0), reduction_profile=0))
                rQ.store((q * (cute.math.rsqrt(qq + L2_EPS, fastmath=False) * (dk ** -0.5))).to(bf16))
                rK.store((k * cute.math.rsqrt(kk + L2_EPS, fastmath=False)).to(bf16))
                cute.autovec_copy(rQ, cute.zipped_divide(sQ[r, None], (VEC,))[None, lane])
                cute.autovec_copy(rK, cute.zipped_divide(sK[r, None], (VEC,))[None, lane])

            if wid == 0:
                # Lane l owns rows 2l, 2l+1: gates, then an inclusive warp scan of the log-decay.
                g0, b0 = self._gates(mA, mB, t0 + 2 * lane, t_len, head, a_log, dt_bias)
                g1, b1 = self._gates(mA, mB, t0 + 2 * lane + 1, t_len, head, a_log, dt_bias)
                run = g0 + g1
                for i in cutlass.range_constexpr(5):
                    up = cute.arch.shuffle_sync_up(run, offset=1 << i)
                    if lane >= (1 << i):
                        run = run + up
                sG[2 * lane] = run - g1
                sG[2 * lane + 1] = run
                sBeta[2 * lane] = b0
                sBeta[2 * lane + 1] = b1
            cute.arch.barrier()

            # ---- b. X S and X k^T for X = q (query group) or k (key group) ----------------------
            acc_x.fill(0.0)
            self._gemm(mma_g, gt, acc_x, sX, sSt, False, True)
            acc_xk.fill(0.0)
            self._gemm(mma_g, gt, acc_xk, sX, sK, False, False)
            if grp == 0:
                # A = (q k^T) * D on and below the diagonal; o starts as exp(G_i) q S.
                for e in cutlass.range_constexpr(cute.size(acc_xk)):
                    i, m = cXK[e]
                    val = f32(0.0)
                    if m <= i:
                        val = acc_xk[e] * cute.math.exp(sG[i] - sG[m], fastmath=True)
                    sA[i, m] = val.to(bf16)
                for e in cutlass.range_constexpr(cute.size(acc_x)):
                    acc_x[e] = acc_x[e] * cute.math.exp(sG[cX[e][0]], fastmath=True)
            else:
                # L = strictly_lower(beta_i (k k^T) * D)
                for e in cutlass.range_constexpr(cute.size(acc_xk)):
                    i, m = cXK[e]
                    val = f32(0.0)
                    if m < i:
                        val = acc_xk[e] * sBeta[i] * cute.math.exp(sG[i] - sG[m], fastmath=True)
                    sL[i, m] = val
            cute.arch.barrier()  # everyone is done reading S (bf16): R may overwrite it
            if grp == 1:
                # R = beta_i (v - exp(G_i) k S)
                for e in cutlass.range_constexpr(cute.size(acc_x)):
                    i, col = cX[e]
                    # beta = 0 on rows past T (which read the last row's v: no branch)
                    v = mQKV[cutlass.min(t0 + i, t_len - 1), v_col + col].to(f32)
                    sR[i, col] = sBeta[i] * (v - cute.math.exp(sG[i], fastmath=True) * acc_x[e])
            cute.arch.barrier()

            # ---- c. key group: (I + L) v_new = R; query group: k *= exp(G_last - G_i) -----------
            if grp == 1:
                if cutlass.const_expr(vs == 1):
                    self._solve(sL, sR, sVn, gt)
                else:  # vs threads (adjacent lanes) per column
                    self._solve_split(sL, sR, sVn, gt // vs, gt % vs)
            else:
                row = gt // 2
                scale = cute.math.exp(sG[c - 1] - sG[row], fastmath=False)
                gK = cute.zipped_divide(sK[row, None], (8,))
                for h in cutlass.range_constexpr(dk // 16):
                    rk = cute.make_rmem_tensor((8,), bf16)
                    cute.autovec_copy(gK[None, (gt % 2) * (dk // 16) + h], rk)
                    rk.store((rk.load().to(f32) * scale).to(bf16))
                    cute.autovec_copy(rk, gK[None, (gt % 2) * (dk // 16) + h])
            cute.arch.barrier()

            # ---- d. o += A v_new; S = exp(G_last) S + k_d^T v_new; output rows ------------------
            decay_last = cute.math.exp(sG[c - 1], fastmath=False)
            accS.store(accS.load() * decay_last)
            self._gemm(mma_s, tidx, accS, sKT, sVnT, True, True)
            if cutlass.const_expr(vs == 1):
                if grp == 0:
                    self._gemm(mma_g, gt, acc_x, sA, sVnT, False, True)
                    self._output(acc_x, cX, mZ, mNormW, mOut, t0, t_len, head, eps)
            else:
                sSS = st.sSS.get_tensor(cute.make_layout((2 * c,)))
                buf = (ci % 2) * c  # double-buffered by chunk parity: one cluster barrier per chunk
                if grp == 0:
                    self._gemm(mma_g, gt, acc_x, sA, sVnT, False, True)
                    self._row_sumsq(acc_x, cX, sSS, buf, lane)
                # release our partials, acquire the peers' (every thread of every CTA arrives)
                cute.arch.cluster_arrive()
                cute.arch.cluster_wait()
                if grp == 0:
                    self._output_split(acc_x, cX, sSS, buf, mZ, mNormW, mOut, t0, t_len, head, c0, eps)
            cute.arch.barrier()  # the next chunk overwrites every tile

        cute.autovec_copy(accS, thr_s.partition_C(gS))
        if cutlass.const_expr(vs > 1):
            # No CTA leaves while a peer may still read its partial sums of the last chunk.
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()

    @cute.jit
    def _gates(self, mA: cute.Tensor, mB: cute.Tensor, t, t_len, head, a_log, dt_bias):
        """(g, beta) of token t: g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b); both 0 for
        t >= T (then read from the last row, without a branch)."""
        f32 = cutlass.Float32
        keep = f32(1.0)
        if t >= t_len:
            keep = f32(0.0)
        row = cutlass.min(t, t_len - 1)
        x = mA[row, head].to(f32) + dt_bias
        softplus = cute.math.max(x, f32(0.0)) + cute.math.log1p(
            cute.math.exp(-cute.math.abs(x), fastmath=False), fastmath=False)
        beta = 1.0 / (1.0 + cute.math.exp(-mB[row, head].to(f32), fastmath=False))
        return -a_log * softplus * keep, beta * keep

    @cute.jit
    def _gemm(self, tiled_mma: cute.TiledMma, thr_idx, acc: cute.Tensor, sA: cute.Tensor, sB: cute.Tensor,
              trans_a: cutlass.Constexpr, trans_b: cutlass.Constexpr):
        """acc += A B^T with A (M, K) and B (N, K) in smem, through ldmatrix (trans for M/N-major)."""
        bf16 = cutlass.BFloat16
        thr = tiled_mma.get_slice(thr_idx)
        rA = thr.make_fragment_A(thr.partition_A(sA))
        rB = thr.make_fragment_B(thr.partition_B(sB))
        ld_a = cute.make_tiled_copy_A(cute.make_copy_atom(warp.LdMatrix8x8x16bOp(trans_a, 4), bf16), tiled_mma)
        ld_b = cute.make_tiled_copy_B(cute.make_copy_atom(warp.LdMatrix8x8x16bOp(trans_b, 4), bf16), tiled_mma)
        thr_a, thr_b = ld_a.get_slice(thr_idx), ld_b.get_slice(thr_idx)
        tAs, tAr = thr_a.partition_S(sA), thr_a.retile(rA)
        tBs, tBr = thr_b.partition_S(sB), thr_b.retile(rB)
        for k in cutlass.range_constexpr(cute.size(tAs.shape[2])):
            cute.copy(ld_a, tAs[None, None, k], tAr[None, None, k])
            cute.copy(ld_b, tBs[None, None, k], tBr[None, None, k])
            cute.gemm(tiled_mma, acc, rA[None, None, k], rB[None, None, k], acc)

    @cute.jit
    def _solve(self, sL: cute.Tensor, sR: cute.Tensor, sVn: cute.Tensor, col):
        """Forward substitution of (I + L) x = R[:, col] in fp32 (x in registers); x -> sVn as bf16.
        Four partial sums per row break the FMA dependency chain."""
        c = self.chunk
        x = cute.make_rmem_tensor((c,), cutlass.Float32)
        for i in cutlass.range_constexpr(c):
            parts = [sR[i, col], cutlass.Float32(0.0), cutlass.Float32(0.0), cutlass.Float32(0.0)]
            for m in cutlass.range_constexpr(i):
                parts[m % 4] = parts[m % 4] - sL[i, m] * x[m]
            x[i] = (parts[0] + parts[1]) + (parts[2] + parts[3])
            sVn[i, col] = x[i].to(cutlass.BFloat16)

    @cute.jit
    def _solve_split(self, sL: cute.Tensor, sR: cute.Tensor, sVn: cute.Tensor, col, r):
        """Forward substitution of (I + L) x = R[:, col] by P = vsplit adjacent lanes: lane r owns
        x[m] for m = P j + r (in registers, zero until solved) and sums those terms of each row; a
        butterfly over the P lanes gives every lane the row's sum. Terms with m >= i read L = 0
        and an unsolved x = 0, so the trip counts are compile-time. Lane r = 0 writes x -> sVn."""
        f32 = cutlass.Float32
        c, p = self.chunk, self.vsplit
        x = cute.make_rmem_tensor((c // p,), f32)
        x.fill(0.0)
        for i in cutlass.range_constexpr(c):
            parts = [f32(0.0), f32(0.0)]
            for j in cutlass.range_constexpr((i + p - 1) // p):
                parts[j % 2] = parts[j % 2] + sL[i, p * j + r] * x[j]
            acc = parts[0] + parts[1]
            for off in cutlass.range_constexpr(p.bit_length() - 1):
                acc = acc + cute.arch.shuffle_sync_bfly(acc, offset=1 << off)
            xi = sR[i, col] - acc
            if r == i % p:
                x[i // p] = xi
            if r == 0:
                sVn[i, col] = xi.to(cutlass.BFloat16)

    @cute.jit
    def _row_sumsq(self, acc: cute.Tensor, coord: cute.Tensor, sSS: cute.Tensor, buf, lane):
        """This CTA's sums of o^2 over its columns for the thread's two rows (quad shuffles, as in
        `_output`) -> sSS[buf + row] (lane 0 of each quad)."""
        f32 = cutlass.Float32
        ss0, ss1 = f32(0.0), f32(0.0)
        for e in cutlass.range_constexpr(cute.size(acc)):
            h = ((coord[e][0] % 16) // 8).to(f32)
            sq = acc[e] * acc[e]
            ss1 = ss1 + h * sq
            ss0 = ss0 + (1.0 - h) * sq
        for off in cutlass.range_constexpr(2):
            ss0 = ss0 + cute.arch.shuffle_sync_bfly(ss0, offset=1 << off)
            ss1 = ss1 + cute.arch.shuffle_sync_bfly(ss1, offset=1 << off)
        row0 = coord[0][0] - 8 * ((coord[0][0] % 16) // 8)  # the thread's row with (i % 16) < 8
        if lane % 4 == 0:
            sSS[buf + row0] = ss0
            sSS[buf + row0 + 8] = ss1

    @cute.jit
    def _output_split(self, acc: cute.Tensor, coord: cute.Tensor, sSS: cute.Tensor, buf, mZ: cute.Tensor,
                      mNormW: cute.Tensor, mOut: cute.Tensor, t0, t_len, head, c0, eps: cutlass.Float32):
        """Gated RMSNorm of this CTA's columns: mean(o^2) from the cluster's partial sums (ranks in
        order, so every CTA of the head uses the same norm); bf16 stores for rows < T."""
        f32 = cutlass.Float32
        dv = self.dv
        row0 = coord[0][0] - 8 * ((coord[0][0] % 16) // 8)
        ss0, ss1 = f32(0.0), f32(0.0)
        for rank in cutlass.range_constexpr(self.vsplit):
            ss0 = ss0 + _ld_cluster_f32((sSS.iterator + (buf + row0)).toint(), rank)
            ss1 = ss1 + _ld_cluster_f32((sSS.iterator + (buf + row0 + 8)).toint(), rank)
        sc0 = cute.math.rsqrt(ss0 / dv + eps, fastmath=False)
        sc1 = cute.math.rsqrt(ss1 / dv + eps, fastmath=False)
        for e in cutlass.range_constexpr(cute.size(acc)):
            i, col = coord[e]
            z = mZ[cutlass.min(t0 + i, t_len - 1), head * dv + c0 + col].to(f32)  # loads without a branch
            if t0 + i < t_len:
                h = ((i % 16) // 8).to(f32)
                gate = z / (cute.math.exp2(z * -LOG2E, fastmath=True) + 1.0)
                y = acc[e] * (sc0 + h * (sc1 - sc0)) * mNormW[c0 + col].to(f32) * gate
                mOut[t0 + i, head * dv + c0 + col] = y.to(cutlass.BFloat16)

    @cute.jit
    def _output(self, acc: cute.Tensor, coord: cute.Tensor, mZ: cute.Tensor, mNormW: cute.Tensor,
                mOut: cute.Tensor, t0, t_len, head, eps: cutlass.Float32):
        """Gated RMSNorm of the query group's output rows; bf16 stores for rows < T.

        Each accumulator row of the m16n8 tiling lives in one quad (4 lanes), 2 rows per thread."""
        f32 = cutlass.Float32
        dv = self.dv
        # Row half h = (i % 16) // 8 of each element, as a 0/1 weight: the code does not depend
        # on the order of the accumulator's modes.
        ss0, ss1 = f32(0.0), f32(0.0)
        for e in cutlass.range_constexpr(cute.size(acc)):
            h = ((coord[e][0] % 16) // 8).to(f32)
            sq = acc[e] * acc[e]
            ss1 = ss1 + h * sq
            ss0 = ss0 + (1.0 - h) * sq
        for off in cutlass.range_constexpr(2):
            ss0 = ss0 + cute.arch.shuffle_sync_bfly(ss0, offset=1 << off)
            ss1 = ss1 + cute.arch.shuffle_sync_bfly(ss1, offset=1 << off)
        sc0 = cute.math.rsqrt(ss0 / dv + eps, fastmath=False)
        sc1 = cute.math.rsqrt(ss1 / dv + eps, fastmath=False)
        for e in cutlass.range_constexpr(cute.size(acc)):
            i, col = coord[e]
            z = mZ[cutlass.min(t0 + i, t_len - 1), head * dv + col].to(f32)  # loads without a branch
            if t0 + i < t_len:
                h = ((i % 16) // 8).to(f32)
                gate = z / (cute.math.exp2(z * -LOG2E, fastmath=True) + 1.0)
                y = acc[e] * (sc0 + h * (sc1 - sc0)) * mNormW[col].to(f32) * gate
                mOut[t0 + i, head * dv + col] = y.to(cutlass.BFloat16)
