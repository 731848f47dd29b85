"""NVFP4 tensor-core decode GEMV on the live GPU vs numpy (`formats.nvfp4` decode, float64 matmul): the
weights uploaded as their `tile16-nvfp4-v1` image (`inferno.kernels.tiled_nvfp4.tile`), fresh random
matrices through the format's encoder (with an all-zero block and rows small enough for subnormal scales),
poisoned outputs with a guard tail, sampled columns on big shapes: the 27B shapes (gate_up swiglu, down
residual, value_z, query_key, GDN output, attention q|k) and small ones, every member (x in shared memory,
stream-K), the `_n` members (RMSNorm folded into the staging), the workspace cleaning itself. Cubins come
from $INFERNO_KERNEL_DIR (`python -m inferno.kernels.gemv_mma_nvfp4_variants DIR`).
"""

import numpy as np
import pytest

from inferno.artifact.formats import nvfp4
from inferno.cuda.copy import from_device, h2d, memset_d8, to_device
from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import device_alloc
from inferno.kernels import gemv_mma_nvfp4_variants as nv
from inferno.kernels import gemv_mma_variants as mv
from inferno.kernels.cache import load
from inferno.kernels.reference import BF16_TOL, bf16, rel_error
from inferno.kernels.tiled_nvfp4 import tile
from gemv_check import check_gemv

GATE_UP, DOWN, VALUE_Z, QUERY_KEY = (34816, 5120), (5120, 17408), (12288, 5120), (4096, 5120)
GDN_OUT, ATTN_QK = (5120, 6144), (7168, 5120)
SMALL = [(128, 64), (256, 192), (384, 1088), (128, 320)]

_weights: dict = {}


@pytest.fixture(scope="module", autouse=True)
def _free_weights():
    yield
    for _, buf in _weights.values():
        buf.free()
    _weights.clear()


def weights(n, k, rng):
    """(payload, device tile16-nvfp4-v1 image), one encode + upload per shape for the module (all shapes
    together: ~0.25 GB)."""
    if (n, k) not in _weights:
        w = rng.standard_normal((n, k), np.float32) * rng.uniform(0.02, 0.2, (n, 1)).astype(np.float32)
        w[0, :16] = 0  # one all-zero group (scale +0)
        w[1] *= 1e-5  # a row of subnormal E4M3 scales
        w[2, 16:32] *= 1e-4
        pay = nvfp4.encode(w)
        _weights[(n, k)] = (pay, to_device(None, tile(pay, n, k), "w nvfp4 tiled"))
    return _weights[(n, k)]


def reference(pay, n, k, x, epilogue, r, outs):
    """float64 model: decode the rows the sampled outputs read, multiply, apply the epilogue."""
    codes, scales, d = nvfp4.unpack(pay.tobytes(), (n, k))
    m = n // 2 if epilogue == "swiglu" else n
    rows = np.r_[outs, outs + m] if epilogue == "swiglu" else outs
    y = x.astype(np.float64) @ nvfp4.dequantize(codes[rows], scales[rows], d).astype(np.float64).T
    if epilogue == "swiglu":
        g, u = y[:, :len(outs)], y[:, len(outs):]
        return g / (1 + np.exp(-g)) * u
    return y + r if epilogue == "residual" else y


def launcher(v, device):
    return nv.GemvMmaNvfp4SK(load(v, device)) if v.config.get("sk") else nv.GemvMmaNvfp4(load(v, device))


def run_case(device, rng, epilogue, n, k, kern=None, norm=False):
    kern = kern or nv.GemvMmaNvfp4.load(nv.variant_name(epilogue, 1, norm), device)
    pay, dw = weights(n, k, rng)
    check_gemv(kern, dw, epilogue, n, k, 1, rng, lambda x, r, outs: reference(pay, n, k, x, epilogue, r, outs),
               norm=norm)
    if isinstance(kern, nv.GemvMmaNvfp4SK):
        kern.free()


CASES = (("swiglu", *GATE_UP), ("residual", *DOWN), ("plain", *VALUE_Z), ("plain", *QUERY_KEY),
         ("residual", *GDN_OUT), ("plain", *ATTN_QK),
         *(("plain", n, k) for n, k in SMALL), *(("residual", n, k) for n, k in SMALL),
         ("swiglu", 256, 192), ("swiglu", 256, 320), ("swiglu", 768, 1088))


@pytest.mark.parametrize("epilogue,n,k", CASES)
def test_family(device, rng, epilogue, n, k):
    """The family launcher (its member choice) on the 27B and small shapes."""
    run_case(device, rng, epilogue, n, k)


@pytest.mark.parametrize("v", [v for v in nv.GEMV_MMA_NVFP4_VARIANTS if not v.config.get("norm")],
                         ids=lambda v: v.name)
def test_every_member(device, rng, v):
    """Each x-in-shared-memory and stream-K member on the 27B shape of its epilogue and small shapes."""
    epi = v.config["epilogue"]
    for e, n, k in CASES:
        if e == epi and (n * k <= 2 ** 22 or (n, k) in (GATE_UP, DOWN, VALUE_Z)):
            run_case(device, rng, e, n, k, launcher(v, device))


NORM_CASES = (("plain", 128, 64), ("plain", 384, 1088), ("plain", *VALUE_Z), ("plain", *QUERY_KEY),
              ("swiglu", 256, 192), ("swiglu", *GATE_UP))


@pytest.mark.parametrize("epilogue", ["plain", "swiglu"])
def test_norm_members(device, rng, epilogue):
    """The `_n` members match norm-then-GEMV in numpy; the family refuses a call without the norm and K
    past its shared x."""
    for epi, n, k in NORM_CASES:
        if epi != epilogue:
            continue
        for v in nv.members(epilogue, norm=True):
            run_case(device, rng, epi, n, k, launcher(v, device), norm=True)
        run_case(device, rng, epi, n, k, norm=True)  # the family's pick
    fam = nv.GemvMmaNvfp4.load(nv.variant_name(epilogue, 1, norm=True), device)
    with pytest.raises(LaunchError, match="norm="):
        run_case(device, rng, epilogue, 256, 192, fam)
    with pytest.raises(LaunchError, match=r"K <= \d+"):
        run_case(device, rng, epilogue, 256, mv.NORM_KMAX + 128, fam, norm=True)


def test_tune_variants(device, rng):
    """The benchmark's other shapes (kw 8, stages +-1, ring depth +-1) compute the same. They are not
    registry variants: build them with `python tools/bench_gemv.py --build DIR --nvfp4`."""
    import importlib.util

    from inferno.kernels.cache import stale_reason

    vs = [v for epi in ("plain", "residual", "swiglu") for v in nv.tune_variants(epi)]
    missing = [v.name for v in vs if stale_reason(v, device.arch) is not None]
    if missing and importlib.util.find_spec("cutlass") is None:
        pytest.skip(f"{len(missing)} tuning variants not built here (e.g. {missing[0]}): "
                    "python tools/bench_gemv.py --build $INFERNO_KERNEL_DIR --nvfp4")
    for v in vs:
        epi = v.config["epilogue"]
        for e, n, k in CASES:
            if e == epi and n * k <= 2 ** 22:
                run_case(device, rng, e, n, k, launcher(v, device))


@pytest.mark.parametrize("epi", ["plain", "swiglu", "residual"])
def test_sk_workspace_cleans_itself(device, rng, epi):
    """Repeated launches on the same output buffer (one workspace) stay right: each leaves it zeroed."""
    n, k = 768, 1088
    kern = nv.GemvMmaNvfp4SK(load(nv.make_sk_variant(epi), device))
    pay, dw = weights(n, k, rng)
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
            want = reference(pay, n, k, x.astype(np.float32), epi, r.astype(np.float32), np.arange(m))
            assert rel_error(y, want.astype(np.float32)) <= BF16_TOL
    finally:
        kern.free()
        for b in (dx, dy, dr):
            if b is not None:
                b.free()


def test_launcher_refuses_bad_arguments(device, rng):
    fam = nv.GemvMmaNvfp4.load(nv.variant_name("plain"), device)
    w, x, y = device_alloc(1 << 20, "w"), device_alloc(1 << 16, "x"), device_alloc(1 << 16, "y")
    try:
        with pytest.raises(LaunchError, match="exceeds its 1"):
            fam(w, x, y, 128, 256, 2)
        with pytest.raises(LaunchError, match="k % 16"):
            fam(w, x, y, 128, 264, 1)
        with pytest.raises(LaunchError, match="bytes, the call needs"):
            fam(w, x, y, 8192, 256, 1)
        with pytest.raises(LaunchError, match=r"no loaded member takes K"):
            fam(w, x, y, 16, mv.KMAX + 128, 1)
    finally:
        for b in (w, x, y):
            b.free()
