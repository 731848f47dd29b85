"""Causal flash attention for one prefill chunk over the paged bf16 KV cache, gated output.

For query i < T of head h (position P + i), kv head g = h // group, S = P + T keys:

    out[i, h, :] = softmax_j<=P+i(q[i, h] . K[j, g] * scale) @ V[:, g] * sigmoid(gate[i, h, :])

q and gate are bf16 [T, Hq, 256] (already normed + roped; any row / head stride, so the gate
halves of the interleaved q|gate projection can be read in place), out bf16 [T, Hq, 256]. With
`q_f32`, q is fp32 (the decode prep kernel's q scratch), rounded to bf16 on the way to smem.
K/V live in the paged pool of inferno/kernels/kv_layout.py, viewed as rows of 256: the K (V) of kv
head g for the 64 tokens of page p is the contiguous 64-row block (p * 2 + 0 (1)) * Hkv + g, so
a key tile of 64 tokens is exactly one page: block n of the sequence is page pages[n].

One CTA per (q head, 64 query rows), 4 warps, each warp 16 query rows x all 256 dims; grid
(Hq, cdiv(T, 64)) with the row blocks in reverse, so the longest CTAs go first. Q, K, V
tiles (64 x 256 bf16, 32 KiB each, 128B-swizzled) come in with cp.async; S = Q K^T and O += P V
use mma.sync m16n8k16 (bf16 in, fp32 accumulate) fed by ldmatrix. The V load of block n overlaps
S = Q K^T of block n, and the K load of block n - 1 overlaps the softmax and P V of block n.
Key blocks run from the last (the diagonal, where the causal mask applies) down to 0. Online
softmax in fp32 with exp2 (scores pre-multiplied by scale * log2 e); a row whose keys so far are
all masked keeps max -inf and uses 0 as its exponent base, so nothing becomes NaN. Rows of the
last key tile past S and query rows past T are zero-filled in shared memory (never read from
memory that may hold poison). Epilogue: O / rowsum -> bf16 -> smem (reusing the Q tile) ->
16-byte rows, multiplied by sigmoid(gate) in fp32, stored for rows < T.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warp

LOG2_E = 1.4426950408889634074


class AttnPrefill:
    """Flash attention prefill: `block_m` query rows x one q head per CTA, key tiles of `block_n`."""

    def __init__(self, group: int, head_dim: int = 256, block_m: int = 64, block_n: int = 64,
                 threads: int = 128, q_f32: bool = False):
        if head_dim % 64 or block_m != threads // 32 * 16 or block_n % 16 or threads % 32:
            raise ValueError("need head_dim % 64 == 0, block_m = 16 per warp, block_n % 16 == 0")
        self.group, self.head_dim, self.block_m, self.block_n = group, head_dim, block_m, block_n
        self.threads, self.q_f32 = threads, q_f32

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mG: cute.Tensor, mKV: cute.Tensor, mPages: cute.Tensor,
                 mO: cute.Tensor, prefix: cutlass.Int32, scale: cutlass.Float32, stream: cuda.CUstream):
        dt = cutlass.BFloat16
        # 8 rows x 64 columns (128 bytes) per swizzle atom: conflict-free cp.async and ldmatrix.
        atom = cute.make_composed_layout(cute.make_swizzle(3, 3, 3), 0,
                                         cute.make_layout((8, 64), stride=(64, 1)))
        sQ_layout = cute.tile_to_shape(atom, (self.block_m, self.head_dim), (0, 1))
        sKV_layout = cute.tile_to_shape(atom, (self.block_n, self.head_dim), (0, 1))

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sKV_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sKV_layout)], 1024]

        # 16-byte copies: 8 threads span a 64-column atom row, 16 rows per pass.
        thr_layout = cute.make_layout((self.threads // 8, 8), stride=(8, 1))
        val_layout = cute.make_layout((1, 8))
        g2s = cute.make_tiled_copy_tv(
            cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dt,
                                num_bits_per_copy=128), thr_layout, val_layout)
        s2g = cute.make_tiled_copy_tv(
            cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dt, num_bits_per_copy=128), thr_layout, val_layout)
        tiled_mma = cute.make_tiled_mma(warp.MmaF16BF16Op(dt, cutlass.Float32, (16, 8, 16)),
                                        (self.threads // 32, 1, 1),
                                        permutation_mnk=(self.threads // 32 * 16, 16, 16))
        t = cute.size(mQ, mode=[0])
        hq = cute.size(mQ, mode=[1])
        grid = (hq, (t + self.block_m - 1) // self.block_m, 1)
        self.kernel(mQ, mG, mKV, mPages, mO, prefix, scale, sQ_layout, sKV_layout, g2s, s2g,
                    tiled_mma, SharedStorage).launch(grid=grid, block=(self.threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mG: cute.Tensor, mKV: cute.Tensor, mPages: cute.Tensor,
               mO: cute.Tensor, prefix: cutlass.Int32, scale: cutlass.Float32,
               sQ_layout: cute.ComposedLayout, sKV_layout: cute.ComposedLayout, g2s: cute.TiledCopy,
               s2g: cute.TiledCopy, tiled_mma: cute.TiledMma, SharedStorage: cutlass.Constexpr):
        dt = cutlass.BFloat16
        bm, bn, hd = self.block_m, self.block_n, self.head_dim
        tidx, _, _ = cute.arch.thread_idx()
        head, m_rev, _ = cute.arch.block_idx()
        t = cute.size(mQ, mode=[0])
        # Longest first: the last query rows (the most key blocks) of every head start in the first
        # wave, and the q heads of one kv head run side by side (their K/V reads hit L2).
        m_block = (t + bm - 1) // bm - 1 - m_rev
        hkv = cute.size(mQ, mode=[1]) // self.group
        kvh = head // self.group
        s_len = prefix + t
        scale_log2 = scale * LOG2_E  # in the kernel: the launcher passes the plain scale
        last_row = cutlass.min((m_block + 1) * bm, t)
        n_blocks = (prefix + last_row + bn - 1) // bn

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)
        sK = storage.sK.get_tensor(sKV_layout)
        sV = storage.sV.get_tensor(sKV_layout)
        sVt = cute.composition(sV, cute.make_layout((hd, bn), stride=(bn, 1)))  # [d, key]

        # ---- global -> shared partitions -------------------------------------------------------
        thr_g2s = g2s.get_slice(tidx)
        gQ = cute.local_tile(mQ[None, head, None], (bm, hd), (m_block, 0))
        tQgQ = thr_g2s.partition_S(gQ)
        tQsQ = thr_g2s.partition_D(sQ)
        tQcQ = thr_g2s.partition_S(cute.make_identity_tensor((bm, hd)))
        tKsK = thr_g2s.partition_D(sK)
        tVsV = thr_g2s.partition_D(sV)
        tKVc = thr_g2s.partition_S(cute.make_identity_tensor((bn, hd)))

        if cutlass.const_expr(self.q_f32):
            self._load_q_f32(gQ, sQ, s2g, tidx, tQcQ, m_block, t)
        else:
            for m in cutlass.range_constexpr(cute.size(tQsQ.shape[1])):
                if m_block * bm + tQcQ[0, m, 0][0] < t:
                    cute.copy(g2s, tQgQ[None, m, None], tQsQ[None, m, None])
                else:
                    tQsQ[None, m, None].fill(0)
        self._load_kv(mKV, mPages, n_blocks - 1, 0, hkv, kvh, s_len, g2s, thr_g2s, tKsK, tKVc)
        cute.arch.cp_async_commit_group()

        # ---- MMA partitions ----------------------------------------------------------------------
        thr_mma = tiled_mma.get_slice(tidx)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK))
        tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt))
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((bm, hd)), cutlass.Float32)
        acc_O.fill(0.0)

        s2r_q = cute.make_tiled_copy_A(cute.make_copy_atom(warp.LdMatrix8x8x16bOp(False, 4), dt), tiled_mma)
        s2r_k = cute.make_tiled_copy_B(cute.make_copy_atom(warp.LdMatrix8x8x16bOp(False, 4), dt), tiled_mma)
        s2r_v = cute.make_tiled_copy_B(cute.make_copy_atom(warp.LdMatrix8x8x16bOp(True, 4), dt), tiled_mma)
        thr_s2r_q, thr_s2r_k, thr_s2r_v = (c.get_slice(tidx) for c in (s2r_q, s2r_k, s2r_v))
        tSsQ, tSrQ_v = thr_s2r_q.partition_S(sQ), thr_s2r_q.retile(tSrQ)
        tSsK, tSrK_v = thr_s2r_k.partition_S(sK), thr_s2r_k.retile(tSrK)
        tOsVt, tOrVt_v = thr_s2r_v.partition_S(sVt), thr_s2r_v.retile(tOrVt)

        # Score coordinates (row in the q tile, key in the k tile) of this thread's accumulators.
        tScS = self._mn(thr_mma.partition_C(cute.make_identity_tensor((bm, bn))))
        acc_O_mn = self._mn(acc_O)
        rows = cute.size(acc_O_mn, mode=[0])
        row_max = cute.make_rmem_tensor((rows,), cutlass.Float32)
        row_sum = cute.make_rmem_tensor((rows,), cutlass.Float32)
        row_max.fill(-cutlass.Float32.inf)
        row_sum.fill(0.0)

        for it in cutlass.range(n_blocks, unroll=1):
            n_block = n_blocks - 1 - it
            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier()  # K(n) (and Q) landed; everyone is done with V(n + 1)
            self._load_kv(mKV, mPages, n_block, 1, hkv, kvh, s_len, g2s, thr_g2s, tVsV, tKVc)
            cute.arch.cp_async_commit_group()

            acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((bm, bn)), cutlass.Float32)
            acc_S.fill(0.0)
            nk = cute.size(tSsQ.shape[2])
            cute.copy(s2r_q, tSsQ[None, None, 0], tSrQ_v[None, None, 0])
            cute.copy(s2r_k, tSsK[None, None, 0], tSrK_v[None, None, 0])
            for k in cutlass.range_constexpr(nk):
                if cutlass.const_expr(k + 1 < nk):
                    cute.copy(s2r_q, tSsQ[None, None, k + 1], tSrQ_v[None, None, k + 1])
                    cute.copy(s2r_k, tSsK[None, None, k + 1], tSrK_v[None, None, k + 1])
                cute.gemm(tiled_mma, acc_S, tSrQ[None, None, k], tSrK[None, None, k], acc_S)

            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier()  # V(n) landed; everyone is done with K(n)
            if n_block > 0:
                self._load_kv(mKV, mPages, n_block - 1, 0, hkv, kvh, s_len, g2s, thr_g2s, tKsK, tKVc)
                cute.arch.cp_async_commit_group()

            # ---- causal mask + online softmax ----------------------------------------------------
            acc_S_mn = self._mn(acc_S)
            if (n_block + 1) * bn - 1 > prefix + m_block * bm:  # the tile crosses the diagonal
                for r in cutlass.range_constexpr(rows):
                    limit = cutlass.min(prefix + m_block * bm + tScS[r, 0][0], s_len - 1) - n_block * bn
                    for c in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[1])):
                        if tScS[0, c][1] > limit:
                            acc_S_mn[r, c] = -cutlass.Float32.inf
            for r in cutlass.range_constexpr(rows):
                srow = acc_S_mn[r, None].load()
                cur = self._quad(srow.reduce(cute.ReductionOp.MAX, -cutlass.Float32.inf, 0), True)
                prev = row_max[r]
                cur = cute.arch.fmax(prev, cur)
                base = cur
                if cur == -cutlass.Float32.inf:
                    base = cutlass.Float32(0.0)
                p = cute.math.exp2(srow * scale_log2 - base * scale_log2, fastmath=True)
                corr = cute.math.exp2(prev * scale_log2 - base * scale_log2, fastmath=True)
                row_sum[r] = row_sum[r] * corr + p.reduce(cute.ReductionOp.ADD, cutlass.Float32.zero, 0)
                row_max[r] = cur
                acc_O_mn[r, None] = acc_O_mn[r, None].load() * corr
                acc_S_mn[r, None] = p

            # ---- O += P V --------------------------------------------------------------------------
            rP = cute.make_fragment_like(acc_S, dt)
            rP.store(acc_S.load().to(dt))
            tOrP = cute.make_tensor(rP.iterator, self._a_view(rP.layout))
            nv = cute.size(tOrP.shape[2])
            cute.copy(s2r_v, tOsVt[None, None, 0], tOrVt_v[None, None, 0])
            for k in cutlass.range_constexpr(nv):
                if cutlass.const_expr(k + 1 < nv):
                    cute.copy(s2r_v, tOsVt[None, None, k + 1], tOrVt_v[None, None, k + 1])
                cute.gemm(tiled_mma, acc_O, tOrP[None, None, k], tOrVt[None, None, k], acc_O)

        # ---- epilogue: normalise, bf16 -> smem (the Q tile) -> * sigmoid(gate) -> global ----------
        for r in cutlass.range_constexpr(rows):
            total = self._quad(row_sum[r], False)
            inv = cutlass.Float32(1.0)
            if total > 0.0:
                inv = 1.0 / total
            acc_O_mn[r, None] = acc_O_mn[r, None].load() * inv
        rO = cute.make_fragment_like(acc_O, dt)
        rO.store(acc_O.load().to(dt))
        s2s_o = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dt), tiled_mma)
        thr_s2s_o = s2s_o.get_slice(tidx)
        sO = cute.make_tensor(sQ.iterator, sQ_layout)
        cute.arch.barrier()  # every warp is done reading Q (ldmatrix) before it is overwritten
        cute.copy(s2s_o, thr_s2s_o.retile(rO), thr_s2s_o.partition_D(sO))
        cute.arch.barrier()

        thr_s2g = s2g.get_slice(tidx)
        tOsO = thr_s2g.partition_S(sO)
        tOgO = thr_s2g.partition_D(cute.local_tile(mO[None, head, None], (bm, hd), (m_block, 0)))
        tOgG = thr_s2g.partition_S(cute.local_tile(mG[None, head, None], (bm, hd), (m_block, 0)))
        tOcO = thr_s2g.partition_S(cute.make_identity_tensor((bm, hd)))
        for m in cutlass.range_constexpr(cute.size(tOsO.shape[1])):
            if m_block * bm + tOcO[0, m, 0][0] < t:
                for c in cutlass.range_constexpr(cute.size(tOsO.shape[2])):
                    ro = cute.make_fragment_like(tOsO[None, m, c], dt)
                    rg = cute.make_fragment_like(tOsO[None, m, c], dt)
                    cute.copy(s2g, tOsO[None, m, c], ro)
                    cute.copy(s2g, tOgG[None, m, c], rg)
                    g = rg.load().to(cutlass.Float32)
                    o = ro.load().to(cutlass.Float32) / (1.0 + cute.math.exp(-g, fastmath=True))
                    ro.store(o.to(dt))
                    cute.copy(s2g, ro, tOgO[None, m, c])

    @cute.jit
    def _load_q_f32(self, gQ: cute.Tensor, sQ: cute.Tensor, s2g: cute.TiledCopy, tidx, tQcQ: cute.Tensor,
                    m_block, t):
        """fp32 q tile -> bf16 smem through registers (two 16-byte loads, one 16-byte smem store per
        8 values, the same thread -> (row, 8 columns) map as the bf16 copies); rows >= T are zeros."""
        g2r = cute.make_tiled_copy_tv(
            cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float32, num_bits_per_copy=128),
            cute.make_layout((self.threads // 8, 8), stride=(8, 1)), cute.make_layout((1, 8)))
        src = g2r.get_slice(tidx).partition_S(gQ)
        dst = s2g.get_slice(tidx).partition_D(sQ)
        for m in cutlass.range_constexpr(cute.size(dst.shape[1])):
            if m_block * self.block_m + tQcQ[0, m, 0][0] < t:
                for c in cutlass.range_constexpr(cute.size(dst.shape[2])):
                    r32 = cute.make_fragment_like(src[None, m, c], cutlass.Float32)
                    cute.copy(g2r, src[None, m, c], r32)
                    rb = cute.make_fragment_like(dst[None, m, c], cutlass.BFloat16)
                    rb.store(r32.load().to(cutlass.BFloat16))
                    cute.copy(s2g, rb, dst[None, m, c])
            else:
                dst[None, m, None].fill(0)

    @cute.jit
    def _load_kv(self, mKV: cute.Tensor, mPages: cute.Tensor, n_block, which: cutlass.Constexpr, hkv, kvh,
                 s_len, g2s: cute.TiledCopy, thr_g2s, dst: cute.Tensor, coord: cute.Tensor):
        """cp.async the K (which = 0) or V (1) tile of key block n_block (= one page) into dst;
        rows at or past s_len are zero-filled instead."""
        page = mPages[n_block]
        blk = (page * 2 + which) * hkv + kvh
        src = thr_g2s.partition_S(cute.local_tile(mKV, (self.block_n, self.head_dim), (blk, 0)))
        for m in cutlass.range_constexpr(cute.size(dst.shape[1])):
            if n_block * self.block_n + coord[0, m, 0][0] < s_len:
                cute.copy(g2s, src[None, m, None], dst[None, m, None])
            else:
                dst[None, m, None].fill(0)

    def _mn(self, acc: cute.Tensor) -> cute.Tensor:
        """An MMA accumulator ((2, 2), MMA_M, MMA_N) viewed as (rows, cols) of this thread."""
        lay = cute.make_layout(acc.layout.shape)
        mn = cute.make_layout(
            ((lay.shape[0][1], lay.shape[1]), (lay.shape[0][0], lay.shape[2])),
            stride=((lay.stride[0][1], lay.stride[1]), (lay.stride[0][0], lay.stride[2])))
        return cute.make_tensor(acc.iterator, cute.composition(acc.layout, mn))

    def _a_view(self, layout):
        """The P accumulator layout ((2, 2), MMA_M, MMA_N) regrouped as an A operand
        ((2, 2, 2), MMA_M, MMA_N / 2): two n8 accumulator tiles make one k16 operand tile."""
        d = cute.logical_divide(layout, (None, None, 2))
        return cute.make_layout(
            ((d.shape[0], d.shape[2][0]), d.shape[1], d.shape[2][1]),
            stride=((d.stride[0], d.stride[2][0]), d.stride[1], d.stride[2][1]))

    @cute.jit
    def _quad(self, v: cutlass.Float32, is_max: cutlass.Constexpr) -> cutlass.Float32:
        """Reduce over the 4 threads that share an accumulator row (lanes 4r..4r+3)."""
        for off in cutlass.range_constexpr(2):
            o = cute.arch.shuffle_sync_bfly(v, offset=2 >> off)
            if cutlass.const_expr(is_max):
                v = cute.arch.fmax(v, o)
            else:
                v = v + o
        return v
