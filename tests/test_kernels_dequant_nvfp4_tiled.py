"""CPU: `dequant_nvfp4_tiled` (NVFP4 in `tile16-nvfp4-v1` -> bf16, cute_kernels/dequant.py
`DequantNvfp4Tiled`): the variant and its (format, tiled) mapping, the plane offsets against
`tiled_nvfp4.tiled_geometry`, the kernel's own index arithmetic (`nvfp4_load_words`,
`nvfp4_store_fields`, the shuffles as "the source lane's loaded word") and decode run on numpy
over the variant's grid (every element written once, bit-equal to the format's decoder of
`tiled_nvfp4.untile_words`), and the launcher's packing, grid and argument checks."""

import struct

import numpy as np
import pytest

from inferno.artifact.formats import nvfp4 as nv
from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import DeviceBuffer
from inferno.cuda.params import ParamLayout, ParamSpec
from inferno.kernels import prefill_variants as pv
from inferno.kernels import tiled_nvfp4 as tn
from inferno.kernels.manifest import Manifest, eval_grid
from inferno.kernels.reference import bf16
from inferno.kernels.registry import ARCHS

NAME = "dequant_nvfp4_tiled"


def _dq():
    return pytest.importorskip("cute_kernels.dequant", reason="CuTe DSL not installed")


# d_w: typical, and extremes where s / d_w leaves the normal range for some scales (the kernel's
# per-code division path: results subnormal or 0, or overflowing to inf), the smallest subnormal
DIVISORS = [None, 1.37 * 2.0**125, 3e38, 1e-37, 2.0**-149]


def _random_words(n: int, k: int, rng, d=None) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """Every code, every finite non-negative E4M3 scale word (subnormals and +0 included), d_w (random
    when None)."""
    codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales = rng.integers(0, 0x7F, (n, k // 16), dtype=np.uint8)
    scales[0, :min(8, k // 16)] = np.arange(min(8, k // 16))
    return codes, scales, np.float32(rng.uniform(0.5, 3000.0) if d is None else d)


def _e2m1_f32(c: np.ndarray) -> np.ndarray:
    m = c & 7
    normal = (((m >> 1) + 126) << 23) | ((m & 1) << 22)
    return (((c & 8) << 28) | np.where(m >= 2, normal, (m & 1) * 0x3F000000)).astype(np.uint32).view(np.float32)


def _e4m3_f32(s: np.ndarray) -> np.ndarray:
    e = s >> 3
    normal = (((e + 120) << 23) | ((s & 7) << 20)).astype(np.uint32).view(np.float32)
    return np.where(e == 0, (s & 7).astype(np.float32) * np.float32(2.0**-9), normal)


def prmt_np(a, b, c):
    """PTX prmt.b32 (default mode) on numpy int arrays: byte i = byte (c >> 4i) & 7 of {b, a}."""
    a, b, c = (np.asarray(v).astype(np.int64).astype(np.uint64) & np.uint64(0xFFFFFFFF) for v in (a, b, c))
    assert not np.any(c & np.uint64(0x8888)), "sign-replicating selector"
    x = (b << np.uint64(32)) | a
    out = np.zeros(np.broadcast(a, b, c).shape, np.uint64)
    for i in range(4):
        sel = (c >> np.uint64(4 * i)) & np.uint64(7)
        out |= ((x >> (np.uint64(8) * sel)) & np.uint64(0xFF)) << np.uint64(8 * i)
    return out.astype(np.int64)


def fast_words(dq, w, sc, d_w):
    """The kernel's fast path: (bf16 pair words uint32 [4, ...] of the 8 codes of words w at scale
    sc, whether the fast path applies)."""
    with np.errstate(all="ignore"):
        q1, q3 = sc / d_w, (sc * np.float32(1.5)) / d_w
    fast = (q1 >= np.float32(dq.FAST_Q1_MIN)) & (q3 <= np.float32(dq.FAST_Q3_MAX))
    bits = [dq.bf16_rne_bits(np.where(fast, q, 1).astype(np.float32).view(np.uint32).astype(np.int64))
            for q in (q1, q3)]
    lut = dq.nvfp4_lut(*bits, prmt_np)
    planes = dq.nvfp4_code_planes(np.asarray(w, np.int64))
    return np.stack([dq.nvfp4_pair_word(i, planes, lut, prmt_np) for i in range(4)]).astype(np.uint32), fast


def slow_halves(w, sc, d_w):
    """bf16 bits uint16 [8, ...] of the per-code division `DequantNvfp4` does."""
    with np.errstate(all="ignore"):
        return np.stack([((_e2m1_f32((w >> (4 * q)) & 0xF) * sc) / d_w).astype(bf16).view(np.uint16)
                         for q in range(8)])


def kernel_model(image: np.ndarray, n: int, k: int, n0: int, rows: int, stride: int):
    """DequantNvfp4Tiled's thread mapping, loads, shuffles and decode over the variant's grid:
    (out bf16 bits uint16 [rows, stride], 0xFFFF where unwritten; writes per element)."""
    dq = _dq()
    v = pv.prefill_variant(NAME)
    threads, items = v.config["threads"], v.config["items"]
    warps = threads // 32
    words = image.view("<u4").astype(np.int64)
    grid = eval_grid(v.grid, {"M": rows, "K": k, "WL": words.size, "out_stride": stride})
    blocks = -(-k // 128) * 2
    bx, by, tidx = (a.ravel() for a in np.meshgrid(np.arange(grid[0]), np.arange(grid[1]), np.arange(threads),
                                                   indexing="ij"))
    tile = n0 // 16 + by
    warp, lane = tidx // 32, tidx % 32
    j0 = bx * (items * warps) + warp
    on = (tile * 16 < n0 + rows) & (j0 < blocks)
    tile, lane, j0 = tile[on], lane[on], j0[on]
    scale_w0, div_w = dq.nvfp4_plane_words(-(-n // 16), blocks)
    assert div_w == words.size - 1
    d_w = np.float32(words[div_w:div_w + 1].astype(np.uint32).view(np.float32)[0])
    out = np.full((rows, stride), 0xFFFF, np.uint16)
    count = np.zeros((rows, stride), np.int64)
    for s in range(items):
        j = j0 + s * warps
        jc = np.minimum(j, blocks - 1)
        own_code, own_scale = dq.nvfp4_load_words(tile, jc, lane, blocks)
        assert np.all(own_code + 3 < scale_w0) and np.all(scale_w0 + own_scale < div_w)
        for i in range(4):
            src, word, shift, row, col = dq.nvfp4_store_fields(tile, j, lane, i)
            assert np.all((src >> 2) == (lane >> 2)) and np.all((word >> 1) == i // 2)
            # a shuffle returns what lane `src` of the warp loaded for the same block
            code_w, scale_w = dq.nvfp4_load_words(tile, jc, src, blocks)
            w = words[code_w + word]
            sc = _e4m3_f32((words[scale_w0 + scale_w] >> shift) & 0xFF)
            pairs, fast = fast_words(dq, w, sc, d_w)
            halves = np.where(fast, pairs.view(np.uint16).reshape(4, -1, 2).transpose(0, 2, 1).reshape(8, -1),
                              slow_halves(w, sc, d_w))
            r = row - n0
            ok = (j < blocks) & (r >= 0) & (r < rows) & (col < k)
            for q in range(8):
                out[r[ok], col[ok] + q] = halves[q][ok]
                np.add.at(count, (r[ok], col[ok] + q), 1)
    return out, count


@pytest.mark.parametrize("n,k,n0,rows,stride", [
    (128, 64, 0, 128, 64), (256, 192, 0, 256, 192), (256, 192, 37, 100, 200), (256, 5120, 120, 17, 5128),
    (40, 80, 0, 40, 80), (130, 1216, 3, 126, 1224), (48, 16, 16, 32, 24)])
def test_kernel_model_matches_decoder(n, k, n0, rows, stride):
    """Every element of the slice written exactly once with bf16(e2m1 * e4m3 / d_w) of the matrix the
    image holds; padding columns, other rows and the image's padding (rows >= N, codes >= K) never."""
    rng = np.random.default_rng()
    codes, scales, d = _random_words(n, k, rng)
    image = tn.tile_words(codes, scales, d)
    got, count = kernel_model(image, n, k, n0, rows, stride)
    assert np.all(count[:, :k] == 1) and np.all(count[:, k:] == 0)
    want = nv.dequantize(codes, scales, d)[n0:n0 + rows].astype(bf16)
    assert np.array_equal(got[:, :k], want.view(np.uint16))


@pytest.mark.parametrize("d", DIVISORS[1:])
def test_kernel_model_matches_decoder_at_extreme_divisors(d):
    """d_w where s / d_w is subnormal, zero or infinite for some scales: the per-code path, bit-exact."""
    n, k = 64, 512
    codes, scales, d = _random_words(n, k, np.random.default_rng(), d)
    got, _ = kernel_model(tn.tile_words(codes, scales, d), n, k, 0, n, k)
    with np.errstate(all="ignore"):
        want = nv.dequantize(codes, scales, d).astype(bf16)
    assert np.array_equal(got, want.view(np.uint16))


def test_every_scale_and_code_exact():
    """All 127 scale words x 16 codes x many d_w (log-uniform over the float32 range): the fast path
    (byte-permute lookup of p * bf16(q1 | q3)) equals bf16(f32(e2m1 * e4m3) / d_w) bit for bit wherever
    it applies, and applies to most."""
    dq = _dq()
    sc = _e4m3_f32(np.arange(0x7F, dtype=np.int64))[:, None]
    d = np.exp2(np.random.default_rng().uniform(-149, 127, 4000)).astype(np.float32)
    d = np.concatenate([d, np.float32([1.0, 2.0**-149, 2.0**-126, 3.4e38, 2.0**124, 1.5 * 2.0**124])])[None, :]
    sc, d = np.broadcast_arrays(sc, d)
    got, want = [], []
    for w in (0x76543210, 0xFEDCBA98):  # codes 0..7, 8..15
        pairs, fast = fast_words(dq, np.full(sc.shape, w, np.int64), sc, d)
        got.append(pairs.view(np.uint16).reshape(4, *sc.shape, 2))
        want.append(slow_halves(np.int64(w), sc, d))
    assert fast.mean() > 0.5
    for g, wt in zip(got, want):
        g = np.moveaxis(g, -1, 1).reshape(8, *sc.shape)  # code 2i at half 0, 2i + 1 at half 1
        assert np.array_equal(g[:, fast], wt[:, fast])


def test_kernel_model_matches_blockscale_decoder_of_untiled_payload():
    """An encoder-made matrix: the model on `tile(payload)` equals `nvfp4.decode(payload)` and the decode
    of `untile(tile(payload))` (the reference the GPU test uses)."""
    n, k = 256, 320
    w = np.random.default_rng().standard_normal((n, k), np.float32)
    pay = nv.encode(w)
    image = tn.tile(pay, n, k)
    got, _ = kernel_model(image, n, k, 0, n, k)
    want = nv.decode(pay, (n, k)).astype(bf16).view(np.uint16)
    assert np.array_equal(got, want)
    assert np.array_equal(tn.untile(image, n, k), pay)


def test_plane_words_match_tiled_geometry():
    dq = _dq()
    for n, k in [(128, 64), (256, 192), (40, 80), (34816, 5120), (5120, 17408)]:
        t = tn.tiled_geometry(n, k)
        assert dq.nvfp4_plane_words(t.tiles, t.blocks) == (t.scale_offset // 4, t.divisor_offset // 4)
        assert t.code_bytes == t.tiles * t.blocks * dq.NV_BLOCK_WORDS * 4


def test_store_fields_cover_each_block_once_with_whole_sectors():
    """The 4 x 32 stores of a block write each (row, 8-code chunk) of its 16 x 64 codes once; each store
    instruction writes 64 contiguous bytes of 8 rows."""
    dq = _dq()
    lane = np.arange(32)
    seen = set()
    for i in range(4):
        _, _, _, row, col = dq.nvfp4_store_fields(3, 5, lane, i)
        for r in np.unique(row):
            cols = np.sort(col[row == r])
            assert cols.size == 4 and np.all(np.diff(cols) == 8) and cols[0] % 32 == 0
        seen |= set(zip(row.tolist(), col.tolist()))
    assert seen == {(48 + r, 320 + 8 * c) for r in range(16) for c in range(8)}


def test_variant_and_format_mapping():
    v = pv.prefill_variant(NAME)
    assert pv.DEQUANT_TILED["NVFP4"] == NAME and pv.DEQUANT_FORMATS["NVFP4"] == "dequant_nvfp4"
    assert (v.cls, v.source, v.op) == ("DequantNvfp4Tiled", "cute_kernels.dequant", NAME)
    assert set(v.archs) == set(ARCHS) and v.divisibility == {"K": 16, "out_stride": 8}


# --- launcher (no GPU: launch is recorded) --------------------------------------------------------


@pytest.fixture(scope="module")
def built(kernel_builds):
    return kernel_builds([pv.prefill_variant(NAME)], ARCHS)


def _loaded(root, arch="sm_90a"):
    from inferno.kernels.cache import LoadedKernel

    m = Manifest.read(root / arch / f"{NAME}.json")
    specs = [ParamSpec(p.name, p.kind, p.size, p.align, len(p.dyn_shape) if p.kind == "tensor" else 0,
                       len(p.dyn_stride)) for p in m.params]
    return LoadedKernel(pv.prefill_variant(NAME), m, None, ParamLayout(specs, NAME))


class _Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, kernel, grid, block, params, smem, stream):
        self.calls.append((grid, tuple(block), params, smem))


@pytest.fixture
def rec(monkeypatch):
    r = _Recorder()
    monkeypatch.setattr(pv, "launch", r)
    return r


def _dev(nbytes, ptr):
    return DeviceBuffer(ptr, nbytes, "buf")


@pytest.mark.parametrize("arch", ARCHS)
def test_launcher_packs_and_grids(built, rec, arch):
    m = Manifest.read(built / arch / f"{NAME}.json")
    assert m.block == [256, 1, 1] and m.smem == 0 and m.config == pv.prefill_variant(NAME).config
    k = pv.Dequant(_loaded(built, arch))
    assert k.fmt == "NVFP4" and k.tiled
    n, kk, n0, rows, stride = 1024, 192, 300, 500, 200
    nbytes = tn.tiled_geometry(n, kk).nbytes
    assert k.payload_bytes(n, kk) == nbytes
    w, out = _dev(nbytes, 1 << 20), _dev(rows * stride * 2, 1 << 28)
    k(w, out, n, kk, n0=n0, rows=rows, out_stride=stride)
    grid, block, params, smem = rec.calls[-1]
    assert grid == (1, 33, 1) and block == (256, 1, 1) and smem == 0  # 4 blocks / 32 per CTA; 32 tiles + 1
    assert params.raw("w") == struct.pack("<Qii", w.ptr, nbytes // 4, 0)
    assert params.raw("out") == struct.pack("<Qiiq", out.ptr, rows, kk, stride)
    assert params.raw("n_total") == struct.pack("<i", n) and params.raw("n0") == struct.pack("<i", n0)
    nbytes = tn.tiled_geometry(34816, 5120).nbytes
    k(_dev(nbytes, 1 << 20), _dev(34816 * 5120 * 2, 1 << 28), 34816, 5120)
    assert rec.calls[-1][0] == (3, 2177, 1)  # 80 blocks / 32 per CTA; 2176 tiles + 1
    assert rec.calls[-1][2].raw("out") == struct.pack("<Qiiq", 1 << 28, 34816, 5120, 5120)


def test_launcher_refuses_bad_arguments(built, rec):
    k = pv.Dequant(_loaded(built))
    n, kk = 256, 192
    w, out = _dev(tn.tiled_geometry(n, kk).nbytes, 1 << 20), _dev(n * kk * 2, 1 << 28)
    # the blockscale payload, not the image (K = 192: the image holds a padding block per row)
    with pytest.raises(LaunchError, match="bytes, the call needs"):
        k(_dev(nv.geometry((n, kk)).nbytes, 1 << 20), out, n, kk)
    with pytest.raises(LaunchError, match="multiple of 16"):
        k(w, out, n, 200)
    with pytest.raises(LaunchError, match="run past"):
        k(w, out, n, kk, n0=250, rows=8)
    with pytest.raises(LaunchError, match="too large for one call"):
        k(w, out, 16 * 65535, 64)
    with pytest.raises(LaunchError, match="less than k"):
        k(w, out, n, kk, out_stride=128)
    assert not rec.calls
