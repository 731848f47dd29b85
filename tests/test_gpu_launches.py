"""CPU: every launch of the GPU executor passes the real typed launchers' checks and packs its
parameters with the real manifests (kernels compiled here for sm_90a; the driver's launch is
replaced by a recorder, device memory by the emulated arena). Catches wrong sizes, alignments,
strides and argument orders before GPU time; the numbers themselves are tests/gpu's job."""

from __future__ import annotations

import types

import numpy as np
import pytest

from inferno.artifact.convert import convert
from inferno.checkpoint.synth import synthesize
from inferno.kernels.build import dsl_available
from inferno.model.gpu.emulator import EmulatedOps
from inferno.model.gpu.ops import CudaOps

pytestmark = pytest.mark.skipif(not dsl_available(), reason="the CuTe DSL is not installed (kernels cannot be built)")

ARCH = "sm_90a"


class DryOps(CudaOps):
    """CudaOps' kernel calls (real launchers, recorded launches) over the emulated memory."""

    def __init__(self, capacity: int, config, attn_group: int):
        self.mem = EmulatedOps(capacity)
        self.device = types.SimpleNamespace(arch=ARCH, sm_count=132, name="dry run", ordinal=0)
        self.stream = None
        self._resolve(config, attn_group)

    def alloc(self, name, nbytes):
        return self.mem.alloc(name, nbytes)

    def upload(self, buf, array):
        self.mem.upload(buf, array)

    def download(self, buf, dtype, shape):
        return self.mem.download(buf, dtype, shape)

    def zero(self, buf):
        self.mem.zero(buf)

    def write(self, buf, array):
        self.mem.write(buf, array)

    def read(self, out, buf):
        self.mem.read(out, buf)

    def synchronize(self):
        pass

    def copy2d(self, dst, dst_pitch, src, src_pitch, width, height):
        self.mem.copy2d(dst, dst_pitch, src, src_pitch, width, height)

    def close(self):
        pass


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-launch")
    return convert(synthesize("tiny-dense", root / "ckpt"), root / "tiny.ninfer", "groupwise-int", progress=False)


@pytest.fixture(scope="module")
def dry(artifact, kernel_builds):
    """A GpuExecutor on DryOps, and the list of its launches (kernel name, grid)."""
    from inferno.cuda.params import PackedParams, ParamLayout, ParamSpec
    from inferno.kernels import (attn_variants, cache, gdn_variants, gemv_mma_variants, gemv_variants, launchers,
                                 prefill_variants, sample_variants)
    from inferno.kernels.manifest import Manifest
    from inferno.model.gpu import GpuExecutor
    from inferno.model.gpu.residency import gemv_kinds

    root = kernel_builds([], [])  # the session's kernel directory: what load() builds, other modules reuse
    launches: list[tuple[str, tuple]] = []
    mp = pytest.MonkeyPatch()

    def load(variant, device=None, _root=None):
        v = cache.get(variant) if isinstance(variant, str) else variant
        cache.ensure_built(v, ARCH, root)
        m = Manifest.read(root / ARCH / f"{v.name}.json")
        specs = [ParamSpec(p.name, p.kind, p.size, p.align, len(p.dyn_shape) if p.kind == "tensor" else 0,
                           len(p.dyn_stride)) for p in m.params]
        return cache.LoadedKernel(v, m, types.SimpleNamespace(name=v.name, manifest=m), ParamLayout(specs, v.name), 132)

    def record(kernel, grid, block, params, smem=0, stream=None, cluster=None):
        m = kernel.manifest
        assert isinstance(params, PackedParams), kernel.name
        assert list(params.layout.sizes) == [p.size for p in m.params], kernel.name
        assert list(block) == m.block and smem == m.smem, kernel.name
        g = tuple(grid)
        assert len(g) == 3 and all(isinstance(x, int) and x >= 1 for x in g), (kernel.name, g)
        launches.append((kernel.name, g))

    group = 2  # tiny-dense: 4 query / 2 kv heads
    if group not in attn_variants.GROUPS:  # not registered (yet): compile it here by the registry's own rule
        extra = attn_variants._decode(group, 32, 2)
        real = attn_variants.decode_variant
        mp.setattr(attn_variants, "decode_variant", lambda hq, hkv: extra if hq == 2 * hkv else real(hq, hkv))
    mp.setattr(cache, "load", load)
    for mod in (launchers, gdn_variants, gemv_variants, gemv_mma_variants, sample_variants, prefill_variants):
        mp.setattr(mod, "launch", record)
    mp.setattr(launchers.Gemm, "_tma", lambda self, p, ptr, rows, cols: bytes(p.size))  # no driver here
    workspaces: dict = {}  # the stream-K members' own workspaces (device_alloc: no driver here), from the arena

    def workspace(self, y, nbytes):
        key = (self.name, y.ptr, nbytes)
        if key not in workspaces:
            workspaces[key] = ops_holder[0].alloc(f"{self.name} workspace", nbytes)
        return workspaces[key]

    ops_holder: list = []
    mp.setattr(gemv_mma_variants.GemvMmaSK, "workspace", workspace)

    def make_ops(self, config, device, emulate):
        ops = DryOps(self.plan.arena_bytes + (1 << 20), config, config.n_heads // config.n_kv_heads)
        ops_holder[:] = [ops]
        ops.preload_gemv(gemv_kinds(self.plan.placements))
        return ops

    def host_buffers(self, emulate):
        self._tokens = np.zeros(1 + 2 * self.plan.kv.max_seqs, np.int32)  # as GpuExecutor._host_buffers
        self._token = self._tokens[:1]
        return np.zeros((64, self.program.step_words), np.int32), np.zeros(self.config.vocab, np.uint16)

    mp.setattr(GpuExecutor, "_make_ops", make_ops)
    mp.setattr(GpuExecutor, "_host_buffers", host_buffers)
    try:
        ex = GpuExecutor(artifact, max_seqs=2, max_context=160, cuda_graph=False, progress=False, prefill_chunk=1024)
        yield ex, launches
    finally:
        mp.undo()


def test_every_decode_launch_passes_the_launchers(dry):
    ex, launches = dry
    c = ex.config
    s = ex.new_state()
    try:
        launches.clear()
        ex.step(5, s)
        names = [n for n, _ in launches]
        # the norms are folded into the GEMVs that read them
        # the input projections: one GEMV of the merged matrix (INFERNO_MERGE_PROJ=1, the default), else two
        inputs = ["gemv_mma"] if ex.plan.merge else ["gemv_mma", "gemv_mma"]
        per_gdn = ["gemv_bf16_t1_n", *inputs, "gdn_conv_step", "gemv_mma", "gemv_mma", "gemv_mma"]
        # attention: the decode kernel with the prep folded in, then the combine (its early-loading variant, or the
        # one reading and zeroing the input GEMV's sums when that GEMV accumulates)
        combine = "attn_combine_sums" if ex.program.attn_sums else "attn_combine_early"
        per_attn = [*inputs, "attn_decode_g", combine, "gemv_mma", "gemv_mma", "gemv_mma"]
        want = ["embedding"]
        for kind in c.layer_types:
            want += per_attn if kind == "full_attention" else per_gdn
        want += ["rmsnorm", "gemv"]
        assert [w if n.startswith(w) else n for n, w in zip(names, want)] == want, names
        ex.prefill(list(range(3, 3 + 70)), s)  # across a KV page boundary
        assert ex.step_greedy(9, s) >= 0
        assert launches[-1][0] == "argmax_bf16"
    finally:
        ex.release(s)


@pytest.mark.parametrize("epilogue, folded", [("plain", False), ("plain", True), ("accumulate", False)])
def test_mixed_stack_splits_into_one_launch_per_part(dry, epilogue, folded):
    """A mixed stack read other than by the accumulating normed GEMV (the `_lo4` member's call) is one launch of
    each part's own family over its rows, each passing the launchers' size checks."""
    from inferno.kernels.gemv_mma_variants import ACCUMULATE
    from inferno.kernels.tiled import MIXED_HIGH
    from inferno.model.gpu.residency import MERGED_INPUTS

    ex, launches = dry
    ops, c = ex.ops, ex.config
    t = next(ex.weights[name] for name in ex.weights if name.endswith(MERGED_INPUTS["gdn"][0]))
    assert t.q4_rows and t.fmt == MIXED_HIGH and t.tiled, t
    n, k = t.shape
    x = ops.alloc("x", k * 2)
    y = ops.alloc("y", n * (4 if epilogue == ACCUMULATE else 2))
    norm = (ops.alloc("norm", k * 2), c.rms_eps) if folded else None
    launches.clear()
    ops.gemv(t.fmt, epilogue, t.buf, x, y, n, k, tiled=True, norm=norm, q4_rows=t.q4_rows)
    names = [name for name, _ in launches]
    assert len(names) == 2 and "q4" in names[0] and "q5" in names[1] and "lo4" not in "".join(names), names
