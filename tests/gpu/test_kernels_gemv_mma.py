"""Tensor-core decode GEMV on the live GPU vs the numpy model: the weights uploaded as their
`tile16-v1` image (`inferno.kernels.tiled.tile`), every format x epilogue, T = 1, 2, 5, 8, the 27B
shapes (gate_up, down, GDN value_z, query_key, GDN output, attention q|k, the Q6 output head on
sampled columns), ragged and small odd ones, every K-split member and the benchmark's alternative
kernel shapes on a few shapes; fresh random
inputs, poisoned outputs with a guard tail. Cubins come from $INFERNO_KERNEL_DIR
(`python -m inferno.kernels.gemv_mma_variants DIR`).
"""

import importlib.util

import numpy as np
import pytest

from inferno.artifact.formats import groupwise as gw
from inferno.cuda.copy import from_device, h2d, memset_d8, to_device
from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import device_alloc
from inferno.kernels import gemv_mma_variants as mv
from inferno.kernels import qlayout as ql
from inferno.kernels.cache import load, stale_reason
from inferno.kernels.reference import BF16_TOL, bf16, rel_error
from inferno.kernels.tiled import tile
from gemv_check import check_gemv

FORMATS = list(gw.SCHEMES)
GATE_UP, DOWN, VALUE_Z, QUERY_KEY = (34816, 5120), (5120, 17408), (12288, 5120), (4096, 5120)
GDN_OUT, ATTN_QK, HEAD, RAGGED = (5120, 6144), (7168, 5120), (248320, 5120), (1002, 200)
COLS = [1, 2, 5, 8]


_weights: dict = {}


def weights(fmt, n, k, rng):
    """(row-split payload, device tile16-v1 image), one upload per (format, shape) for the module."""
    key = (fmt, n, k)
    if key not in _weights:
        if len(_weights) > 8:  # keep device and host memory bounded
            for _, buf in _weights.values():
                buf.free()
            _weights.clear()
        pay = ql.random_payload(fmt, n, k, rng)
        _weights[key] = (pay, to_device(None, tile(fmt, pay, n, k), f"w {fmt} tiled"))
    return _weights[key]


def run_case(device, rng, fmt, epilogue, n, k, cols, kern=None, norm=False):
    kern = kern or mv.GemvMma.load(mv.variant_name(fmt, epilogue, cols, norm), device)
    pay, dw = weights(fmt, n, k, rng)
    check_gemv(kern, dw, epilogue, n, k, cols, rng,
               lambda x, r, outs: ql.reference(fmt, pay, n, k, x, epilogue, r, outs), norm=norm)


@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("n,k", [GATE_UP, DOWN, VALUE_Z, QUERY_KEY, GDN_OUT, ATTN_QK, RAGGED])
@pytest.mark.parametrize("fmt", FORMATS)
def test_plain(device, rng, fmt, n, k, cols):
    run_case(device, rng, fmt, "plain", n, k, cols)


@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("n,k", [GATE_UP, RAGGED, (34, 136)])
@pytest.mark.parametrize("fmt", FORMATS)
def test_swiglu(device, rng, fmt, n, k, cols):
    run_case(device, rng, fmt, "swiglu", n, k, cols)


@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("n,k", [DOWN, GDN_OUT, RAGGED])
@pytest.mark.parametrize("fmt", FORMATS)
def test_residual(device, rng, fmt, n, k, cols):
    run_case(device, rng, fmt, "residual", n, k, cols)


@pytest.mark.parametrize("cols", [1, 8])
def test_output_head(device, rng, cols):
    run_case(device, rng, "Q6G64_F16S", "plain", *HEAD, cols)


def test_output_head_normed(device, rng):
    """The head with the final RMSNorm folded (T = 1; the executor's head once it folds that norm): the family's
    pick (stream-K since session 27) and its xs kw 2 member. `test_output_head` covers the unfolded head."""
    run_case(device, rng, "Q6G64_F16S", "plain", *HEAD, 1, norm=True)
    for v in mv.t1_fast_members("Q6G64_F16S", "plain", norm=True):
        run_case(device, rng, "Q6G64_F16S", "plain", *HEAD, 1, _fast_launcher(v, device), norm=True)


@pytest.mark.parametrize("n,k", [(16, 8), (17, 136), (40, 1000), (8, 17408)])
def test_small_and_odd_shapes(device, rng, n, k):
    for fmt in FORMATS:
        run_case(device, rng, fmt, "plain", n, k, 3)
        run_case(device, rng, fmt, "swiglu", 2 * n, k, 3)


@pytest.mark.parametrize("kw", mv.KW)
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_member(device, rng, fmt, kw):
    """Each K split computes the same, whichever the shape would pick."""
    for epi, n, k in (("plain", 300, 2048), ("plain", 2000, 5120), ("swiglu", *RAGGED), ("swiglu", 96, 1024),
                      ("residual", *RAGGED)):
        for cols in (1, 8):
            kern = mv.GemvMma(load(mv.gemv_mma_variant(f"{mv.variant_name(fmt, epi, cols)}_k{kw}"), device))
            run_case(device, rng, fmt, epi, n, k, cols, kern)


EPILOGUE_NAMES = ("plain", "swiglu", "residual")


@pytest.mark.parametrize("cols", [1, 8])
@pytest.mark.parametrize("fmt", FORMATS)
def test_alternatives(device, rng, fmt, cols):
    """The benchmark's other kernel shapes (x loaded when needed, two tiles per warp) compute the same.
    They are not registry variants: build them with `python tools/bench_gemv.py --build DIR --mma --mma-tune`."""
    missing = [v.name for epi in EPILOGUE_NAMES for v in mv.alternatives(fmt, epi, cols)
               if stale_reason(v, device.arch) is not None]
    if missing and importlib.util.find_spec("cutlass") is None:  # no DSL here to build them on demand
        pytest.skip(f"{len(missing)} tuning variants not built here (e.g. {missing[0]}): "
                    "python tools/bench_gemv.py --build $INFERNO_KERNEL_DIR --mma --mma-tune")
    for epi, n, k in (("plain", 300, 2048), ("plain", *RAGGED), ("plain", *GATE_UP), ("swiglu", *RAGGED),
                      ("swiglu", 96, 1024), ("residual", *RAGGED), ("residual", *DOWN)):
        for v in mv.alternatives(fmt, epi, cols):
            run_case(device, rng, fmt, epi, n, k, cols, mv.GemvMma(load(v, device)))


FAST_CASES = (("plain", 300, 2048), ("plain", *RAGGED), ("plain", 17, 136), ("plain", 16, 8), ("plain", *VALUE_Z),
              ("plain", 8, 17408), ("swiglu", *RAGGED), ("swiglu", 96, 1024), ("swiglu", 34, 136), ("swiglu", 2, 64),
              ("swiglu", *GATE_UP), ("residual", *RAGGED), ("residual", *DOWN), ("residual", *GDN_OUT))


def _fast_launcher(v, device):
    return mv.GemvMmaSK(load(v, device)) if v.config.get("sk") else mv.GemvMma(load(v, device))


def _run_fast(device, rng, fmt, variants):
    for epi, n, k in FAST_CASES:
        for v in variants:
            if v.config["epilogue"] == epi:
                kern = _fast_launcher(v, device)
                run_case(device, rng, fmt, epi, n, k, 1, kern)
                if isinstance(kern, mv.GemvMmaSK):
                    kern.free()


@pytest.mark.parametrize("fmt", FORMATS[:3])
def test_fast_members(device, rng, fmt):
    """The T = 1 family's x-in-shared-memory and stream-K members compute the same on ragged, small and
    27B shapes (ragged swiglu: up rows shared by two units' tiles), and refuse K past their shared x."""
    vs = [v for epi in EPILOGUE_NAMES for v in mv.t1_fast_members(fmt, epi)]
    _run_fast(device, rng, fmt, vs)
    for v in vs[:3]:
        with pytest.raises(LaunchError, match=r"K <= \d+"):
            run_case(device, rng, fmt, v.config["epilogue"], 64, mv.KMAX + 128, 1, _fast_launcher(v, device))


NORM_CASES = (("plain", 300, 2048), ("plain", *RAGGED), ("plain", 17, 136), ("plain", *VALUE_Z),
              ("plain", *QUERY_KEY), ("swiglu", *RAGGED), ("swiglu", 34, 136), ("swiglu", *GATE_UP))


@pytest.mark.parametrize("fmt", FORMATS[:3])
def test_norm_members(device, rng, fmt):
    """The `_n` members (RMSNorm of x folded into its staging) match norm-then-GEMV in numpy on small,
    ragged and 27B shapes; the family launcher picks them by shape like the plain family and refuses
    a call without the norm or past their shared x."""
    for epi, n, k in NORM_CASES:
        for v in mv.t1_fast_members(fmt, epi, norm=True):
            run_case(device, rng, fmt, epi, n, k, 1, _fast_launcher(v, device), norm=True)
        run_case(device, rng, fmt, epi, n, k, 1, norm=True)  # the family's pick
    fam = mv.GemvMma.load(mv.variant_name(fmt, "plain", 1, norm=True), device)
    with pytest.raises(LaunchError, match="norm="):
        run_case(device, rng, fmt, "plain", 64, 256, 1, fam)
    with pytest.raises(LaunchError, match=r"K <= \d+"):
        run_case(device, rng, fmt, "plain", 64, mv.NORM_KMAX + 128, 1, fam, norm=True)


@pytest.mark.parametrize("fmt", FORMATS[:3])
def test_fast_alternatives(device, rng, fmt):
    """The benchmark's other xs / stream-K shapes (K splits, stages, CTAs per SM) compute the same.
    Build them with `python tools/bench_gemv.py --build DIR --xs`."""
    registered = {v.name for v in mv.GEMV_MMA_VARIANTS}
    vs = [v for epi in EPILOGUE_NAMES for v in mv.xs_variants(fmt, epi, 1) + mv.sk_variants(fmt, epi)
          if v.name not in registered]
    missing = [v.name for v in vs if stale_reason(v, device.arch) is not None]
    if missing and importlib.util.find_spec("cutlass") is None:
        pytest.skip(f"{len(missing)} tuning variants not built here (e.g. {missing[0]}): "
                    "python tools/bench_gemv.py --build $INFERNO_KERNEL_DIR --xs")
    _run_fast(device, rng, fmt, vs)


@pytest.mark.parametrize("shape", ["ragged", "27b"])
@pytest.mark.parametrize("epi", EPILOGUE_NAMES)
def test_sk_workspace_cleans_itself(device, rng, epi, shape):
    """Repeated launches on the same output buffer (one workspace) stay right: each leaves it zeroed, the
    unit counters and the fp32 sums alike, on a ragged shape and on the 27B shape of its epilogue."""
    fmt, (n, k) = "Q4G64_F16S", RAGGED if shape == "ragged" else {"swiglu": GATE_UP, "plain": GDN_OUT}.get(epi, DOWN)
    kern = mv.GemvMmaSK(load(mv.make_sk_variant(fmt, epi), device))
    pay, dw = weights(fmt, n, k, rng)
    m = n // 2 if epi == "swiglu" else n
    dx, dy = device_alloc(2 * k, "x"), device_alloc(2 * m, "y")
    dr = device_alloc(2 * m, "r") if epi == "residual" else None
    try:
        for _ in range(3):
            x = rng.standard_normal((1, k), np.float32).astype(bf16)
            r = rng.standard_normal((1, m), np.float32).astype(bf16)
            h2d(dx, x)
            if dr is not None:
                h2d(dr, r)
            memset_d8(dy, 0xFF)
            kern(dw, dx, dy, n, k, 1, r=dr)
            y = from_device(dy, bf16, (1, m)).astype(np.float32)
            want = ql.reference(fmt, pay, n, k, x.astype(np.float32), epi,
                                r.astype(np.float32) if dr is not None else None, np.arange(m))
            assert rel_error(y, want.astype(np.float32)) <= BF16_TOL
        for ws in kern._ws.values():
            words = from_device(ws, np.uint32, (ws.nbytes // 4,))
            assert not words.any(), f"{np.count_nonzero(words)} workspace words left nonzero"
    finally:
        kern.free()
        for b in (dx, dy, dr):
            if b is not None:
                b.free()


def test_launcher_refuses_bad_arguments(device):
    k = mv.GemvMma.load("gemv_mma_q4_t1", device)
    w, x, y = device_alloc(1 << 20, "w"), device_alloc(1 << 16, "x"), device_alloc(1 << 16, "y")
    try:
        with pytest.raises(LaunchError, match="exceeds its 1"):
            k(w, x, y, 64, 256, 2)
        with pytest.raises(LaunchError, match="multiple of 8"):
            k(w, x, y, 64, 260, 1)
        with pytest.raises(LaunchError, match="bytes, the call needs"):
            k(w, x, y, 8192, 256, 1)
        with pytest.raises(LaunchError, match="residual"):
            k(w, x, y, 64, 256, 1, r=x)
    finally:
        for b in (w, x, y):
            b.free()
