"""Hopper bf16 GEMM: C = A @ B^T with TMA multi-stage loads, wgmma, and a TMA-store epilogue.

A is [M, K] row-major, B is [N, K] row-major (both K-major), C is [M, N] row-major; fp32
accumulate, bf16 out. One CTA computes a tile_m x tile_n tile of C. Warp 0 issues TMA loads
of A/B k-slices into a ring of `stages` shared-memory buffers (completion tracked on mbarriers);
all warpgroups run wgmma on the ready stage while later stages are in flight. The epilogue
converts the fp32 accumulators to bf16, stages them through shared memory (stmatrix) and
stores them with TMA. TMA zero-fills out-of-bounds loads and clips stores, so M, N and K need
not be tile multiples; K and N must be multiples of 8 (16-byte row strides).

The grid is one-dimensional: CTA ids walk M in groups of `raster` tiles so that CTAs running
together share B tiles in L2.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.tensor_utils as tensor_utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup

SM90_SMEM_BYTES = 232448  # 227 KiB usable dynamic shared memory per CTA on sm_90
TILE_K = 64


class HopperGemm:
    """bf16 x bf16 -> bf16 GEMM (fp32 accumulate) for sm_90a."""

    def __init__(self, tile_m: int = 128, tile_n: int = 256, raster: int = 8):
        if tile_m not in (64, 128) or tile_n not in (64, 128, 256):
            raise ValueError("tile_m must be 64/128 and tile_n 64/128/256")
        self.tile_m, self.tile_n, self.raster = tile_m, tile_n, raster
        # Two consumer warpgroups split M when the tile is large (a 128x256 fp32 tile in one
        # warpgroup would spill).
        self.warpgroups = 2 if tile_m > 64 and tile_n > 128 else 1
        self.threads = 128 * self.warpgroups
        stage_bytes = (tile_m + tile_n) * TILE_K * 2
        self.stages = (SM90_SMEM_BYTES - 1024) // stage_bytes
        self.epi_tile = (tile_m, 32) if self.warpgroups == 2 else (64, 32)
        self.epi_stages = 4

    @cute.jit
    def __call__(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, stream: cuda.CUstream):
        ab = cutlass.BFloat16
        tile_mnk = (self.tile_m, self.tile_n, TILE_K)
        a_major = tensor_utils.LayoutEnum.from_tensor(mA)
        b_major = tensor_utils.LayoutEnum.from_tensor(mB)
        c_major = tensor_utils.LayoutEnum.from_tensor(mC)
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            ab, ab, a_major.sm90_mma_major_mode(), b_major.sm90_mma_major_mode(),
            cutlass.Float32, (self.warpgroups, 1, 1), tiler_mn=(64, self.tile_n),
        )
        sA_layout = sm90_utils.make_smem_layout_a(a_major, tile_mnk, ab, self.stages)
        sB_layout = sm90_utils.make_smem_layout_b(b_major, tile_mnk, ab, self.stages)
        sC_layout = sm90_utils.make_smem_layout_epi(ab, c_major, self.epi_tile, self.epi_stages)

        tma_a, tA = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mA,
            cute.slice_(sA_layout, (None, None, 0)), (self.tile_m, TILE_K),
        )
        tma_b, tB = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mB,
            cute.slice_(sB_layout, (None, None, 0)), (self.tile_n, TILE_K),
        )
        tma_c, tC = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mC,
            cute.slice_(sC_layout, (None, None, 0)), self.epi_tile,
        )

        # For the build manifest: each TMA box (innermost mode first) and its smem swizzle.
        self.tma_boxes = {
            "a": ((TILE_K, self.tile_m), str(sA_layout.inner)),
            "b": ((TILE_K, self.tile_n), str(sB_layout.inner)),
            "c": ((self.epi_tile[1], self.epi_tile[0]), str(sC_layout.inner)),
        }

        @cute.struct
        class Storage:
            barriers: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sA: cute.struct.Align[cute.struct.MemRange[ab, cute.cosize(sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[ab, cute.cosize(sB_layout)], 1024]

        self.storage = Storage
        m = cute.size(mC, mode=[0])
        n = cute.size(mC, mode=[1])
        tiles = ((m + self.tile_m - 1) // self.tile_m) * ((n + self.tile_n - 1) // self.tile_n)
        self.kernel(tma_a, tA, tma_b, tB, tma_c, tC, tiled_mma, sA_layout, sB_layout, sC_layout,
                    c_major).launch(grid=(tiles, 1, 1), block=(self.threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom,
        mA: cute.Tensor,
        tma_b: cute.CopyAtom,
        mB: cute.Tensor,
        tma_c: cute.CopyAtom,
        mC: cute.Tensor,
        tiled_mma: cute.TiledMma,
        sA_layout: cute.ComposedLayout,
        sB_layout: cute.ComposedLayout,
        sC_layout: cute.ComposedLayout,
        c_major: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)

        # Raster: CTA ids walk `raster` M-tiles for each N-tile, then the next N-tile.
        m = cute.size(mC, mode=[0])
        n = cute.size(mC, mode=[1])
        tiles_m = (m + self.tile_m - 1) // self.tile_m
        tiles_n = (n + self.tile_n - 1) // self.tile_n
        per_group = self.raster * tiles_n
        group = bidx // per_group
        first_m = group * self.raster
        group_m = cutlass.min(tiles_m - first_m, self.raster)
        in_group = bidx - group * per_group
        pid_m = first_m + in_group % group_m
        pid_n = in_group // group_m
        coord = (pid_m, pid_n, None)
        tile_mnk = (self.tile_m, self.tile_n, TILE_K)

        storage = cutlass.memory.SmemAllocator().allocate(self.storage)
        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        # The epilogue staging buffer reuses sA once the main loop is done.
        sC = cute.make_tensor(
            cute.recast_ptr(sA.iterator, sC_layout.inner, dtype=cutlass.BFloat16), sC_layout.outer
        )

        stage_bytes = cute.size_in_bytes(
            cutlass.BFloat16, cute.slice_(sA_layout, (None, None, 0))
        ) + cute.size_in_bytes(cutlass.BFloat16, cute.slice_(sB_layout, (None, None, 0)))
        ring = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.barriers.data_ptr(),
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.threads // 32),
            tx_count=stage_bytes,
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
        )

        # Global tiles: (bM, bK, k) for A, (bN, bK, k) for B, (bM, bN) for C.
        gA = cute.local_tile(mA, tile_mnk, coord, proj=(1, None, 1))
        gB = cute.local_tile(mB, tile_mnk, coord, proj=(None, 1, 1))
        gC = cute.local_tile(mC, tile_mnk, coord, proj=(1, 1, None))
        tAsA, tAgA = cpasync.tma_partition(
            tma_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2)
        )
        tBsB, tBgB = cpasync.tma_partition(
            tma_b, 0, cute.make_layout(1), cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2)
        )

        wg = cute.arch.make_warp_uniform(tidx // 128)
        thr_mma = tiled_mma.get_slice(cute.make_layout(self.warpgroups, stride=128)(wg))
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        acc = cute.make_rmem_tensor(thr_mma.partition_C(gC).shape, cutlass.Float32)

        k_tiles = cute.size(gA, mode=[2])
        load_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        read_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        free_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)

        # Fill the ring.
        if warp == 0:
            for _ in cutlass.range(cutlass.min(self.stages, k_tiles), unroll=1):
                ring.producer_acquire(load_state)
                bar = ring.producer_get_barrier(load_state)
                cute.copy(tma_a, tAgA[(None, load_state.count)], tAsA[(None, load_state.index)],
                          tma_bar_ptr=bar)
                cute.copy(tma_b, tBgB[(None, load_state.count)], tBsB[(None, load_state.index)],
                          tma_bar_ptr=bar)
                ring.producer_commit(load_state)
                load_state.advance()

        k_blocks = cute.size(tCrA, mode=[2])
        tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
        for k in cutlass.range(k_tiles, unroll=1):
            ring.consumer_wait(read_state)
            warpgroup.fence()
            for kb in cutlass.range(k_blocks, unroll_full=True):
                cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, read_state.index)],
                          tCrB[(None, None, kb, read_state.index)], acc)
                tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            warpgroup.commit_group()
            read_state.advance()
            # Keep one wgmma batch in flight; the stage before it is free again.
            if k > 0:
                warpgroup.wait_group(1)
                ring.consumer_release(free_state)
                free_state.advance()
                if warp == 0 and load_state.count < k_tiles:
                    ring.producer_acquire(load_state)
                    bar = ring.producer_get_barrier(load_state)
                    cute.copy(tma_a, tAgA[(None, load_state.count)],
                              tAsA[(None, load_state.index)], tma_bar_ptr=bar)
                    cute.copy(tma_b, tBgB[(None, load_state.count)],
                              tBsB[(None, load_state.index)], tma_bar_ptr=bar)
                    ring.producer_commit(load_state)
                    load_state.advance()
        warpgroup.wait_group(0)
        cute.arch.sync_threads()  # every warpgroup is done reading sA before it is reused

        # Epilogue: accumulators -> bf16 -> smem (stmatrix) -> TMA store, epi_tile at a time.
        store_atom = sm90_utils.get_smem_store_op(c_major, cutlass.BFloat16, cutlass.Float32)
        c_atom = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(c_major.is_m_major_c(), 4), cutlass.BFloat16
        )
        r2s = cute.make_tiled_copy_S(store_atom, cute.make_tiled_copy_C_atom(c_atom, tiled_mma))
        thr_r2s = r2s.get_slice(tidx)
        tRS_sC = thr_r2s.partition_D(sC)
        tRS_acc = r2s.retile(acc)
        rD_layout = cute.make_layout(cute.shape(thr_r2s.partition_S(sC))[:3])
        rD = cute.make_rmem_tensor_like(rD_layout, cutlass.Float32)
        rD_bf16 = cute.make_rmem_tensor_like(rD_layout, cutlass.BFloat16)
        per_epi = cute.size(rD)

        gC_epi = cute.zipped_divide(gC, self.epi_tile)
        bSG_sC, bSG_gC = cpasync.tma_partition(
            tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), gC_epi
        )
        epi_grid = gC_epi.shape[1]
        epi_order = cute.make_layout(epi_grid, stride=(epi_grid[1], 1))
        store_ring = pipeline.PipelineTmaStore.create(
            num_stages=self.epi_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.threads),
        )
        for e in cutlass.range_constexpr(cute.size(gC_epi, mode=[1])):
            for v in cutlass.range_constexpr(per_epi):
                rD[v] = tRS_acc[e * per_epi + v]
            rD_bf16.store(rD.load().to(cutlass.BFloat16))
            buf = e % self.epi_stages
            cute.copy(r2s, rD_bf16, tRS_sC[(None, None, None, buf)])
            cute.arch.fence_proxy("async.shared", space="cta")
            pipeline.sync(barrier_id=1)
            if warp == 0:
                cute.copy(tma_c, bSG_sC[(None, buf)], bSG_gC[(None, epi_order.get_hier_coord(e))])
                store_ring.producer_commit()
                store_ring.producer_acquire()
            pipeline.sync(barrier_id=1)
        if warp == 0:
            store_ring.producer_tail()
