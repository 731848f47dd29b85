"""GPU: the prefill kernels vs numpy. Fresh random inputs every run; outputs start poisoned (0xFF
bytes = bf16 NaN) with a poisoned guard tail, and padding columns must stay poisoned.

dequant: every groupwise format, from the row-split payload and (the `_tiled` kernels) from its
`tile16-v1` image (`tiled.tile(...)`), and NVFP4; ragged N (not a multiple of 16) and K (not of 128:
the padding is not stored), model shapes, row slices [n0, n0 + rows) (also starting and ending
inside a 16-row tile) into a padded scratch with a poisoned head guard too; the result must equal
`formats.decode(...).astype(bfloat16)` bit for bit; dequant + the bf16 GEMM as the prefill matmul;
bandwidth as TB/s and as a share of a device-to-device copy moving as many bytes.
attn_prefill: T = 1, 17, 128, 1024 new tokens after prefixes of 0, 64, 1000 cached tokens, 27B
(24 q heads : 4 kv heads) and 35B-A3B (16 : 2) head configs, pages scattered in a NaN-poisoned pool;
q|gate read in place from the interleaved projection for T = 17, a padded output row for T = 128,
fp32 q (the _qf32 variants). Every case prints its errors (run with -s); the timing tests print
TB/s (dequant) and TFLOP/s (attention).

Cubins come from the kernel cache ($INFERNO_KERNEL_DIR); on a machine without the DSL build them
first: `python -m inferno.kernels.prefill_variants $INFERNO_KERNEL_DIR sm_90a` (sm_120a likewise;
the GEMM of test_dequant_then_gemm comes from `inferno kernels build`).
"""

import numpy as np
import pytest

from inferno.artifact.formats import groupwise as gw
from inferno.artifact.formats import nvfp4 as nv
from inferno.cuda.copy import from_device, memset_d8, to_device
from inferno.cuda.memory import device_alloc
from inferno.kernels import qlayout as ql
from inferno.kernels.kv_layout import KVLayout, page_table
from inferno.kernels.prefill_variants import HEAD_DIM, AttnPrefill, Dequant
from inferno.kernels.reference import bf16, rel_error
from inferno.kernels.tiled import tile
from inferno.model.reference.attention import causal_attention
from inferno.model.reference.norms import sigmoid

FORMATS = list(gw.SCHEMES)
GUARD = 256
D = HEAD_DIM
MODELS = [pytest.param(24, 4, id="27B"), pytest.param(16, 2, id="35B")]
ATTN_TOL = 1e-2  # relative L2 error of the bf16 output (P is rounded to bf16 before P V)


class _Bufs:
    """Device buffers of one test, freed at the end."""

    def __init__(self):
        self.all = []

    def up(self, a, name):
        b = to_device(None, a, name)
        self.all.append(b)
        return b

    def poisoned(self, nbytes, name):
        b = device_alloc(nbytes + GUARD, name)
        memset_d8(b, 0xFF)
        self.all.append(b)
        return b


@pytest.fixture
def bufs():
    b = _Bufs()
    yield b
    for x in b.all:
        x.free()


def _read(buf, nbytes):
    raw = from_device(buf, np.uint8, (nbytes + GUARD,))
    assert np.all(raw[nbytes:] == 0xFF), "guard tail written"
    return raw[:nbytes]


# --- dequant ------------------------------------------------------------------------------------


def _payload(fmt, n, k, rng):
    """Random valid payload words: every code, scales over their whole range (NVFP4: every finite
    non-negative E4M3 word, a random divisor)."""
    if fmt == "NVFP4":
        codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
        scales = rng.integers(0, 0x7F, (n, k // 16), dtype=np.uint8)
        return nv.pack(codes, scales, np.float32(rng.uniform(0.5, 3000.0)))
    return ql.random_payload(fmt, n, k, rng)


def _decode(fmt, pay, n, k, rows=None):
    """float32 W [n, k] (or the given rows) from the format's own decoder."""
    if fmt == "NVFP4":
        codes, scales, d = nv.unpack(pay, (n, k))
        sel = slice(None) if rows is None else rows
        return nv.dequantize(codes[sel], scales[sel], d)
    if rows is None:
        return gw.decode(fmt, pay, (n, k))
    return ql.dequant_rows(fmt, pay, n, k, rows).astype(np.float32)


def _device_image(fmt, pay, n, k, tiled):
    """What the kernel reads: the payload, or (tiled) the groupwise matrix's tile16-v1 image."""
    return tile(fmt, pay, n, k) if tiled else pay


def _dequant_case(device, bufs, rng, fmt, n, k, n0=0, rows=None, stride=None, tiled=False):
    rows = n - n0 if rows is None else rows
    stride = k if stride is None else stride
    pay = _payload(fmt, n, k, rng)
    dw = bufs.up(_device_image(fmt, pay, n, k, tiled), "w")
    nbytes = ((rows - 1) * stride + k) * 2
    guarded = bufs.poisoned(GUARD + nbytes, "out")  # a poisoned head guard, the slice, the tail guard
    dout = guarded.view(GUARD, nbytes + GUARD, "out")
    Dequant.for_format(fmt, device, tiled=tiled)(dw, dout, n, k, n0=n0, rows=rows, out_stride=stride)
    raw = _read(guarded, GUARD + nbytes)
    assert np.all(raw[:GUARD] == 0xFF), "head guard written"
    full = np.full(rows * stride * 2, 0xFF, np.uint8)
    full[:nbytes] = raw[GUARD:]
    got = full.view(bf16).reshape(rows, stride)
    want = _decode(fmt, pay, n, k)[n0:n0 + rows].astype(bf16)
    same = got[:, :k].view(np.uint16) == want.view(np.uint16)
    err = float(np.max(np.abs(got[:, :k].astype(np.float32) - want.astype(np.float32)))) if not same.all() else 0.0
    print(f"dequant {fmt}{' tiled' if tiled else ''} [{n}, {k}] rows [{n0}, {n0 + rows}) stride {stride}: "
          f"{int((~same).sum())} of {same.size} values differ, max abs err {err:.3g}")
    assert same.all()
    if stride > k:
        assert np.all(got[:, k:].view(np.uint16) == 0xFFFF), "padding columns written"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n,k", [(1002, 200), (256, 5120), (384, 17408), (130, 8)])
def test_dequant_whole(device, bufs, rng, fmt, n, k):
    _dequant_case(device, bufs, rng, fmt, n, k)


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequant_row_slice_into_padded_scratch(device, bufs, rng, fmt):
    _dequant_case(device, bufs, rng, fmt, 1002, 200, n0=301, rows=500, stride=264)
    _dequant_case(device, bufs, rng, fmt, 640, 1024, n0=512, rows=128, stride=1024 + 64)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n,k", [(1002, 200), (256, 5120), (384, 17408), (130, 8), (40, 1000), (16, 128)])
def test_dequant_tiled_whole(device, bufs, rng, fmt, n, k):
    _dequant_case(device, bufs, rng, fmt, n, k, tiled=True)


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequant_tiled_row_slice_into_padded_scratch(device, bufs, rng, fmt):
    _dequant_case(device, bufs, rng, fmt, 1002, 200, n0=301, rows=500, stride=264, tiled=True)
    _dequant_case(device, bufs, rng, fmt, 640, 1024, n0=512, rows=128, stride=1024 + 64, tiled=True)
    _dequant_case(device, bufs, rng, fmt, 1002, 264, n0=7, rows=3, stride=272, tiled=True)  # inside one tile
    _dequant_case(device, bufs, rng, fmt, 1002, 200, n0=993, rows=9, tiled=True)  # the last, partial tile
    _dequant_case(device, bufs, rng, fmt, 1002, 5120, n0=17, rows=40, tiled=True)  # K of several CTAs


@pytest.mark.parametrize("n,k", [(256, 512), (384, 17408), (128, 64)])
def test_dequant_nvfp4_whole(device, bufs, rng, n, k):
    _dequant_case(device, bufs, rng, "NVFP4", n, k)


def test_dequant_nvfp4_row_slice(device, bufs, rng):
    _dequant_case(device, bufs, rng, "NVFP4", 512, 320, n0=101, rows=300, stride=320 + 64)


@pytest.mark.parametrize("fmt,tiled", [*((f, t) for f in FORMATS for t in (False, True)), ("NVFP4", False)])
def test_dequant_bandwidth(device, bufs, rng, fmt, tiled):
    """27B FFN gate_up [34816, 5120]: time it against a device-to-device copy of as many bytes (read +
    written) and check a sample of rows exactly."""
    from inferno.cuda.copy import d2d
    from inferno.cuda.stream import Event, Stream

    n, k = 34816, 5120
    pay = _payload(fmt, n, k, rng)
    image = _device_image(fmt, pay, n, k, tiled)
    dw = bufs.up(image, "w")
    out_bytes = n * k * 2
    dout = bufs.poisoned(out_bytes, "out")
    moved = image.nbytes + out_bytes
    src, dst = bufs.poisoned(moved // 2, "copy src"), bufs.poisoned(moved // 2, "copy dst")
    kern = Dequant.for_format(fmt, device, tiled=tiled)
    stream = Stream.create()
    try:
        def timed(fn, reps=10):
            fn()
            start, end = Event.create(), Event.create()
            start.record(stream)
            for _ in range(reps):
                fn()
            end.record(stream)
            end.synchronize()
            ms = Event.elapsed_ms(start, end) / reps
            start.close()
            end.close()
            return ms

        ms = timed(lambda: kern(dw, dout, n, k, stream=stream))
        copy_ms = timed(lambda: d2d(dst, src, moved // 2, stream=stream))
    finally:
        stream.synchronize()
        stream.close()
    print(f"dequant {fmt}{' tiled' if tiled else ''} [{n}, {k}]: {ms * 1e3:.0f} us, {moved / 2**20:.0f} MiB moved, "
          f"{moved / ms / 1e9:.2f} TB/s = {100 * copy_ms / ms:.0f} % of a copy moving as many bytes "
          f"({moved / copy_ms / 1e9:.2f} TB/s)")
    sample = np.unique(np.r_[0, n - 1, rng.choice(n, 64, replace=False)])
    got = from_device(dout, bf16, (n, k))[sample]
    want = _decode(fmt, pay, n, k, sample).astype(bf16)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("fmt,tiled", [("Q4G64_F16S", False), ("Q6G64_F16S", True), ("NVFP4", False)])
def test_dequant_then_gemm(device, bufs, rng, fmt, tiled):
    """The prefill matmul path: y = x @ bf16(W)^T with the scratch as the GEMM's B operand [N, K],
    dequantised in two row slices (the wgmma GEMM on sm_90a, the SIMT one elsewhere)."""
    from inferno.kernels.launchers import Gemm

    t, n, k = 200, 1024, 2048
    pay = _payload(fmt, n, k, rng)
    dw = bufs.up(_device_image(fmt, pay, n, k, tiled), "w")
    x = rng.standard_normal((t, k), np.float32).astype(bf16)
    dx = bufs.up(x, "x")
    scratch = bufs.poisoned(n * k * 2, "scratch")
    deq = Dequant.for_format(fmt, device, tiled=tiled)
    deq(dw, scratch, n, k, rows=640)
    deq(dw, scratch.view(640 * k * 2, (n - 640) * k * 2), n, k, n0=640)
    dy = bufs.poisoned(t * n * 2, "y")
    Gemm.for_device(device)(dx, scratch, dy, t, n, k)
    y = _read(dy, t * n * 2).view(bf16).reshape(t, n).astype(np.float32)
    want = x.astype(np.float64) @ _decode(fmt, pay, n, k).astype(bf16).astype(np.float64).T
    err = rel_error(y, want.astype(np.float32))
    print(f"dequant {fmt} + gemm [{t}, {k}] x [{n}, {k}]^T: rel err {err:.2e}")
    assert err <= 1e-2


# --- attention ----------------------------------------------------------------------------------


def _attn_case(device, bufs, rng, hq, hkv, t, prefix, layout="contiguous", heads=None):
    """Run one chunk; compare heads `heads` (default all) with the reference; returns the kernel."""
    group = hq // hkv
    lay = KVLayout(hkv)
    s = prefix + t
    need = lay.pages_for(s)
    n_pool = need + 5
    pages = rng.permutation(n_pool)[:need].astype(np.int32)
    pool = lay.empty_pool(n_pool)  # NaN wherever the sequence has no token
    k = rng.standard_normal((s, hkv, D), np.float32).astype(bf16)
    v = rng.standard_normal((s, hkv, D), np.float32).astype(bf16)
    lay.write(pool, pages, 0, k, v)
    q32 = rng.standard_normal((t, hq, D), np.float32)
    q = q32.astype(bf16)
    gate = (2 * rng.standard_normal((t, hq, D), np.float32)).astype(bf16)
    width = hq * D
    kw = {}
    if layout in ("interleaved", "qf32"):  # the q|gate projection, per head [q | gate], read in place
        qg = np.concatenate([q, gate], axis=2).reshape(t, 2 * width)
        dqg = bufs.up(qg, "qg")
        dq, dg = dqg, dqg.view(D * 2, dqg.nbytes - D * 2, "gate")
        kw = dict(q_stride=2 * width, q_hstride=2 * D, gate_stride=2 * width, gate_hstride=2 * D)
        if layout == "qf32":  # q from an fp32 [T, Hq, 256] scratch (the decode prep's output)
            dq = bufs.up(q32, "q32")
            kw.update(q_stride=width, q_hstride=D)
    else:
        dq, dg = bufs.up(q, "q"), bufs.up(gate, "gate")
    ostride = width + 128 if layout == "padded" else width
    kw["out_stride"] = ostride
    table = page_table([list(pages)], width=need + 3)[0]  # unused entries -1
    dpool, dpages = bufs.up(pool, "kv"), bufs.up(table, "pages")
    nbytes = ((t - 1) * ostride + width) * 2
    dout = bufs.poisoned(nbytes, "out")
    kern = AttnPrefill.for_group(group, device, q_f32=layout == "qf32")
    kern(dq, dg, dpool, dpages, dout, t, hq, prefix, n_pool, **kw)
    raw = _read(dout, nbytes)
    full = np.full(t * ostride * 2, 0xFF, np.uint8)
    full[:nbytes] = raw
    got = full.view(bf16).reshape(t, ostride)
    if ostride > width:
        assert np.all(got[:, width:].view(np.uint16) == 0xFFFF), "padding columns written"
    got = got[:, :width].astype(np.float32).reshape(t, hq, D)
    hs = np.arange(hq) if heads is None else np.asarray(heads)
    kf, vf = lay.gather(pool, pages, s)
    # the reference per checked head (kv head h // group), fp32 on the bf16 inputs
    qref = q32 if layout == "qf32" else q.astype(np.float32)  # the kernel rounds fp32 q to bf16
    o = np.stack([causal_attention(qref[:, h:h + 1], kf[:, h // group:h // group + 1],
                                   vf[:, h // group:h // group + 1], D**-0.5)[:, 0] for h in hs], axis=1)
    want = o * sigmoid(gate[:, hs].astype(np.float32))
    nan_rows = int(np.isnan(got[:, hs]).any(axis=(1, 2)).sum())
    err = rel_error(got[:, hs], want)
    diff = np.abs(got[:, hs] - want)
    where = ""
    if nan_rows < t:
        i, j, c = np.unravel_index(np.nanargmax(diff), diff.shape)
        where = f"max abs err {diff[i, j, c]:.3g} at token {i} head {hs[j]} dim {c}"
    print(f"attn_prefill g{group} Hq {hq} T {t} P {prefix} {layout}: rel err {err:.2e}, {where}, "
          f"rows with NaN {nan_rows} (first {np.flatnonzero(np.isnan(got[:, hs]).any(axis=(1, 2)))[:4]})")
    assert nan_rows == 0, f"{nan_rows} rows unwritten or NaN"
    assert err <= ATTN_TOL, f"rel err {err:.2e}"
    return kern


@pytest.mark.parametrize("t", [1, 17, 128, 1024])
@pytest.mark.parametrize("prefix", [0, 64, 1000])
@pytest.mark.parametrize("hq,hkv", MODELS)
def test_attention(device, bufs, rng, hq, hkv, t, prefix):
    layout = {17: "interleaved", 128: "padded"}.get(t, "contiguous")
    _attn_case(device, bufs, rng, hq, hkv, t, prefix, layout)


@pytest.mark.parametrize("hq,hkv", MODELS)
@pytest.mark.parametrize("t,prefix", [(17, 64), (1024, 1000)])
def test_attention_q_f32(device, bufs, rng, hq, hkv, t, prefix):
    _attn_case(device, bufs, rng, hq, hkv, t, prefix, "qf32")


@pytest.mark.parametrize("hq,hkv,t,prefix", [(24, 4, 4096, 0), (24, 4, 2048, 6144), (16, 2, 4096, 0)])
def test_attention_time(device, bufs, rng, hq, hkv, t, prefix):
    """Time a long chunk (checking heads 0 and the last) and print the achieved TFLOP/s."""
    from inferno.cuda.stream import Event

    kern = _attn_case(device, bufs, rng, hq, hkv, t, prefix, heads=[0, hq - 1])
    group = hq // hkv
    lay = KVLayout(hkv)
    need = lay.pages_for(prefix + t)
    dq = bufs.up(np.zeros((t, hq, D), bf16), "q")
    dpool = bufs.up(lay.empty_pool(need, 0.0), "kv")
    dpages = bufs.up(np.arange(need, dtype=np.int32), "pages")
    dout = bufs.poisoned(t * hq * D * 2, "out")
    kern(dq, dq, dpool, dpages, dout, t, hq, prefix, need)
    start, end = Event.create(), Event.create()
    reps = 5
    start.record()
    for _ in range(reps):
        kern(dq, dq, dpool, dpages, dout, t, hq, prefix, need)
    end.record()
    end.synchronize()
    ms = Event.elapsed_ms(start, end) / reps
    keys = t * prefix + t * (t + 1) // 2
    flops = 4 * hq * D * keys
    print(f"attn_prefill g{group} Hq {hq} T {t} P {prefix}: {ms * 1e3:.0f} us, "
          f"{flops / ms / 1e9:.1f} TFLOP/s (causal FLOPs {flops / 1e12:.3f} T)")
