"""bf16 decode GEMV on the live GPU vs numpy: T = 1, 2, 4, 8 (and odd T on wider variants), the
GDN a|b projection shape, a large shape, a row wider than the staged chunks and ragged ones; the
folded-RMSNorm variant gemv_bf16_t1_n against a reference that rounds xn as rmsnorm does, and
bit for bit (selection rows of W) against that reference and the rmsnorm kernel itself. Fresh
random inputs, poisoned outputs with a guard tail. Failures name what went wrong (unwritten
outputs, guard overwrite, the worst row and column). Cubins come from $INFERNO_KERNEL_DIR
(`inferno kernels build --only gemv_bf16_t1 ...`; the rmsnorm comparison needs rmsnorm_5k and
rmsnorm_16k too).
"""

import numpy as np
import pytest

from inferno.cuda.copy import from_device, memset_d8, to_device
from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import device_alloc
from inferno.kernels.gemv_bf16_variants import GemvBf16
from inferno.kernels.reference import BF16_TOL, bf16, rel_error
from stream_run import run_queued

AB, HEAD, RAGGED, TINY = (96, 5120), (12288, 5120), (1003, 200), (5, 8)
WIDE = (300, 8200)  # past the 5 chunks per thread staged before the PDL wait at T = 1
GUARD = 256


def _describe(y: np.ndarray, want: np.ndarray) -> str:
    """Where the output is furthest from the reference."""
    diff = np.abs(y.astype(np.float64) - want)
    t, row = np.unravel_index(int(np.nanargmax(np.where(np.isnan(diff), np.inf, diff))), diff.shape)
    bad = int((diff > 0.02 * (np.abs(want) + 1)).sum())
    return f"worst at column t={t}, row {row}: got {y[t, row]}, want {want[t, row]:.5g}; {bad} outputs off"


def run_case(device, rng, n: int, k: int, cols: int, variant_cols: int | None = None,
             epilogue: str = "plain") -> None:
    kern = GemvBf16.load(variant_cols or cols, device, epilogue)
    m = n // 2 if epilogue == "swiglu" else n
    w = (rng.standard_normal((n, k), np.float32) * 0.05).astype(bf16)
    x = rng.standard_normal((cols, k), np.float32).astype(bf16)
    r = rng.standard_normal((cols, m), np.float32).astype(bf16)
    dw, dx = to_device(None, w, "w"), to_device(None, x, "x")
    dr = to_device(None, r, "r") if epilogue == "residual" else None
    out_bytes = cols * m * 2
    dy = device_alloc(out_bytes + GUARD, "y")
    memset_d8(dy, 0xFF)  # bf16 0xFFFF is a NaN: any output left unwritten shows
    try:
        kern(dw, dx, dy, n, k, cols, r=dr)
        raw = from_device(dy, np.uint8, (out_bytes + GUARD,))
    finally:
        for b in (dw, dx, dy, dr):
            if b is not None:
                b.free()
    where = f"{kern.name} n={n} k={k} cols={cols}"
    y = raw[:out_bytes].view(bf16).reshape(cols, m).astype(np.float32)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    if epilogue == "residual":
        want = want + r.astype(np.float64)
    elif epilogue == "swiglu":
        gate, up = want[:, :m], want[:, m:]
        want = gate / (1.0 + np.exp(-gate)) * up
    guard = np.flatnonzero(raw[out_bytes:] != 0xFF)
    assert guard.size == 0, f"{where}: {guard.size} guard bytes past the output written (first at +{guard[0]})"
    unwritten = np.argwhere(np.isnan(y))
    assert unwritten.size == 0, f"{where}: {len(unwritten)} outputs unwritten, first (t, row) {tuple(unwritten[0])}"
    err = rel_error(y, want.astype(np.float32))
    assert err <= BF16_TOL, f"{where}: rel err {err:.2e}; {_describe(y, want)}"


@pytest.mark.parametrize("cols", [1, 2, 4, 8])
@pytest.mark.parametrize("n,k", [AB, HEAD, WIDE, RAGGED, TINY])
def test_gemv_bf16(device, rng, n, k, cols):
    run_case(device, rng, n, k, cols)


@pytest.mark.parametrize("epilogue", ["residual", "swiglu"])
@pytest.mark.parametrize("cols", [1, 2, 4, 8])
@pytest.mark.parametrize("n,k", [AB, (2002, 200), (6, 8)])
def test_gemv_bf16_epilogues(device, rng, n, k, cols, epilogue):
    run_case(device, rng, n, k, cols, epilogue=epilogue)


@pytest.mark.parametrize("epilogue", ["residual", "swiglu"])
def test_epilogues_fewer_columns_than_variant(device, rng, epilogue):
    run_case(device, rng, 2002, 200, 3, 4, epilogue)
    run_case(device, rng, 2002, 200, 5, 8, epilogue)


@pytest.mark.parametrize("cols,variant", [(3, 4), (5, 8), (7, 8), (1, 8)])
def test_fewer_columns_than_variant(device, rng, cols, variant):
    run_case(device, rng, *RAGGED, cols, variant)
    run_case(device, rng, *AB, cols, variant)


EPS = 1e-6
NORM_K = (5120, 2048, 4104, 8200)  # 4104: not a multiple of the thread stride; 8200: past the staged chunks


def normed_ref(x: np.ndarray, nw: np.ndarray, eps: float) -> np.ndarray:
    """xn = bf16(x * rsqrt(mean(x^2) + eps) * (1 + nw)) as rmsnorm rounds it (fp32 math, the
    sum of squares exact), returned as fp32."""
    xf = x.astype(np.float32)
    ss = np.sum(np.square(xf.astype(np.float64)), axis=-1, keepdims=True).astype(np.float32)
    scale = np.float32(1) / np.sqrt(ss / np.float32(x.shape[-1]) + np.float32(eps))
    return ((xf * scale) * (nw.astype(np.float32) + np.float32(1))).astype(bf16).astype(np.float32)


def _norm_inputs(rng, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A residual-stream row with a realistic spread and a zero-centred norm weight."""
    x = (rng.standard_normal((1, k), np.float32) * 3).astype(bf16)
    nw = (rng.standard_normal(k, np.float32) * 0.1).astype(bf16)
    return x, nw


def run_norm(device, w: np.ndarray, x: np.ndarray, nw: np.ndarray, eps: float = EPS,
             s: np.ndarray | None = None) -> np.ndarray:
    """gemv_bf16_t1_n (with s: gemv_bf16_t1_na, x read as bf16(x + s)) on (w, x, nw) into a poisoned y with a
    guard tail; y as fp32 [N]."""
    kern = GemvBf16.load(1, device, norm=True, add=s is not None)
    n, k = w.shape
    dw, dx, dn = to_device(None, w, "w"), to_device(None, x, "x"), to_device(None, nw, "nw")
    ds = to_device(None, s, "s") if s is not None else None
    out_bytes = n * 2
    dy = device_alloc(out_bytes + GUARD, "y")
    memset_d8(dy, 0xFF)  # bf16 0xFFFF is a NaN: any output left unwritten shows
    try:
        kern(dw, dx, dy, n, k, norm=(dn, eps), **({"sums": ds} if ds is not None else {}))
        raw = from_device(dy, np.uint8, (out_bytes + GUARD,))
    finally:
        for b in (dw, dx, dn, dy, ds):
            if b is not None:
                b.free()
    where = f"{kern.name} n={n} k={k}"
    guard = np.flatnonzero(raw[out_bytes:] != 0xFF)
    assert guard.size == 0, f"{where}: {guard.size} guard bytes past the output written (first at +{guard[0]})"
    y = raw[:out_bytes].view(bf16).astype(np.float32)
    unwritten = np.flatnonzero(np.isnan(y))
    assert unwritten.size == 0, f"{where}: {unwritten.size} outputs unwritten, first row {unwritten[0]}"
    return y


@pytest.mark.parametrize("n", [96, 1, 257])
@pytest.mark.parametrize("k", NORM_K)
def test_gemv_bf16_norm(device, rng, n, k):
    """y = W . xn within the output's own bf16 rounding (at most 2^-8 relative): xn is the rounded
    normed row."""
    x, nw = _norm_inputs(rng, k)
    w = (rng.standard_normal((n, k), np.float32) * 0.05).astype(bf16)
    y = run_norm(device, w, x, nw)
    want = normed_ref(x, nw, EPS).astype(np.float64) @ w.astype(np.float64).T
    err = rel_error(y[None], want.astype(np.float32))
    assert err <= 2.0 ** -8 * 1.05, f"gemv_bf16_t1_n n={n} k={k}: rel err {err:.2e}; {_describe(y[None], want)}"


def _selection_rows(rng, k: int, singles: int = 256, pairs: int = 256) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """W whose first rows pick one column (y = xn[a]) and the rest a difference (y = xn[a] - xn[b]):
    both exact in fp32, so y is bit-exact; the differences also tell a rounded xn from an
    unrounded one. Returns (w, a, b) with b = -1 for the single rows."""
    a = rng.choice(k, singles + pairs, replace=k < singles + pairs)
    b = np.full(singles + pairs, -1)
    b[singles:] = (a[singles:] + rng.integers(1, k, pairs)) % k
    w = np.zeros((singles + pairs, k), np.float32)
    w[np.arange(singles + pairs), a] = 1.0
    w[np.arange(singles, singles + pairs), b[singles:]] = -1.0
    return w.astype(bf16), a, b


def _assert_bit_exact(got: np.ndarray, want: np.ndarray, size: np.ndarray, where: str) -> None:
    """got == want but for at most 3 outputs, each within 2^-6 of its inputs' size (one xn value
    one bf16 step off: the sum of squares is reduced in another order)."""
    off = np.flatnonzero(got != want)
    far = off[np.abs(got[off] - want[off]) > size[off] * 2.0 ** -6]
    assert off.size <= 3 and far.size == 0, (
        f"{where}: {off.size} of {got.size} outputs differ ({far.size} by more than a bf16 step); first "
        + ", ".join(f"row {i}: got {got[i]}, want {want[i]}" for i in off[:4]))


def _assert_selected(y: np.ndarray, xn: np.ndarray, a: np.ndarray, b: np.ndarray, where: str) -> None:
    """y of `_selection_rows` (a, b) read xn back: xn[a], or the bf16 of xn[a] - xn[b] (b >= 0)."""
    pair = b >= 0
    want = xn[a].copy()
    want[pair] = (xn[a[pair]] - xn[b[pair]]).astype(bf16).astype(np.float32)
    _assert_bit_exact(y, want, np.maximum(np.abs(xn[a]), np.where(pair, np.abs(xn[b]), 0.0)), where)


@pytest.mark.parametrize("k", NORM_K)
def test_norm_rounds_xn_as_rmsnorm(device, rng, k):
    """Selection rows of W read xn back bit for bit: it equals the numpy reference and the output
    of the rmsnorm kernel itself (`rmsnorm_*`, the kernel the fold replaces)."""
    from inferno.kernels.launchers import RMSNorm

    x, nw = _norm_inputs(rng, k)
    w, a, b = _selection_rows(rng, k)
    y = run_norm(device, w, x, nw)
    _assert_selected(y, normed_ref(x, nw, EPS)[0], a, b, f"gemv_bf16_t1_n k={k} vs the numpy reference")
    pair = b >= 0

    norm = RMSNorm.for_width(k, device)
    dx, dn, dy = to_device(None, x, "x"), to_device(None, nw, "nw"), device_alloc(k * 2, "normed")
    try:
        norm(dx, dn, dy, 1, k, EPS)
        normed = from_device(dy, bf16, (k,)).astype(np.float32)
    finally:
        for buf in (dx, dn, dy):
            buf.free()
    single = ~pair
    _assert_bit_exact(y[single], normed[a[single]], np.abs(normed[a[single]]),
                      f"gemv_bf16_t1_n k={k} vs {norm.name}")


@pytest.mark.parametrize("k", NORM_K)
def test_norm_add_reads_x_plus_sums(device, rng, k):
    """gemv_bf16_t1_na: x is bf16(x + s) (s fp32, a deferred residual's sums) before the norm: random rows
    within the output's rounding, selection rows bit for bit against the numpy reference."""
    x, nw = _norm_inputs(rng, k)
    s = (rng.standard_normal(k) * 2).astype(np.float32)
    xs = (x.astype(np.float32) + s).astype(bf16)
    w = (rng.standard_normal((96, k), np.float32) * 0.05).astype(bf16)
    y = run_norm(device, w, x, nw, s=s)
    want = normed_ref(xs, nw, EPS).astype(np.float64) @ w.astype(np.float64).T
    err = rel_error(y[None], want.astype(np.float32))
    assert err <= 2.0 ** -8 * 1.05, f"gemv_bf16_t1_na k={k}: rel err {err:.2e}; {_describe(y[None], want)}"
    w, a, b = _selection_rows(rng, k)
    y = run_norm(device, w, x, nw, s=s)
    _assert_selected(y, normed_ref(xs, nw, EPS)[0], a, b, f"gemv_bf16_t1_na k={k} vs the numpy reference")


@pytest.mark.parametrize("graph", [False, True])
def test_norm_pdl_chain_sees_predecessor(device, rng, graph):
    """A chain of gemv_bf16_t1_n links (x_{i+1} = W . rmsnorm(x_i)), each launched early through
    PDL with its weight row loaded before the wait, still reads its predecessor's x: eagerly and
    replayed from a CUDA graph."""
    from inferno.cuda import Stream

    k, links = 1024, 16
    kern = GemvBf16.load(1, device, norm=True)
    assert kern.loaded.kernel.pdl
    x, nw = _norm_inputs(rng, k)
    w = (rng.standard_normal((k, k), np.float32) / np.sqrt(k)).astype(bf16)
    bufs = [to_device(None, x, "x0")] + [device_alloc(k * 2, f"x{i + 1}") for i in range(links)]
    dw, dn = to_device(None, w, "w"), to_device(None, nw, "nw")
    stream = Stream.create()
    stream.pdl = True
    try:
        for b in bufs[1:]:
            memset_d8(b, 0xFF)  # NaN bf16: a link that ran before its input was written shows

        def chain():
            for i in range(links):
                kern(dw, bufs[i], bufs[i + 1], k, k, norm=(dn, EPS), stream=stream)

        run_queued(stream, chain, graph)
        got = [x] + [from_device(b, bf16, (1, k)) for b in bufs[1:]]
        for i in range(links):  # each link against the reference on its own input
            assert np.isfinite(got[i + 1].astype(np.float32)).all(), f"link {i} read its x before it was written"
            want = normed_ref(got[i], nw, EPS).astype(np.float64) @ w.astype(np.float64).T
            err = rel_error(got[i + 1], want.astype(np.float32))
            assert err <= 2.0 ** -8 * 1.05, f"{kern.name} link {i} of {links}: rel err {err:.2e}"
    finally:
        for b in bufs + [dw, dn]:
            b.free()
        stream.close()


def _time_us(fn, reps: int = 50) -> float:
    from inferno.cuda import Event

    fn()  # warm (module load, first launch)
    start, end = Event(), Event()
    try:
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return Event.elapsed_ms(start, end) * 1e3 / reps
    finally:
        start.close()
        end.close()


def test_faster_than_the_one_row_gemm_on_the_ab_projection(device, rng):
    """The decode a|b projection ([2 Hv, hidden] = [96, 5120]) used to run on the tiled GEMM with
    one row; the GEMV must beat it (prints both times and the GEMV's bandwidth)."""
    from inferno.kernels.cache import load
    from inferno.kernels.launchers import Gemm
    from inferno.kernels.registry import get

    n, k = AB
    gemv, gemm = GemvBf16.load(1, device), Gemm(load(get("gemm_simt"), device))
    w = to_device(None, rng.standard_normal((n, k), np.float32).astype(bf16), "w")
    x = to_device(None, rng.standard_normal((1, k), np.float32).astype(bf16), "x")
    y = device_alloc(n * 2, "y")
    try:
        t_gemv = _time_us(lambda: gemv(w, x, y, n, k, 1))
        t_gemm = _time_us(lambda: gemm(x, w, y, 1, n, k))
    finally:
        for b in (w, x, y):
            b.free()
    gbps = (n * k + k + n) * 2 / t_gemv / 1e3
    print(f"\na|b projection {n}x{k}: gemv_bf16_t1 {t_gemv:.1f} us ({gbps:.0f} GB/s), gemm_simt M=1 {t_gemm:.1f} us")
    assert t_gemv < t_gemm, f"gemv_bf16_t1 {t_gemv:.1f} us is not faster than gemm_simt with one row {t_gemm:.1f} us"


def test_folded_norm_beats_rmsnorm_then_gemv(device, rng):
    """On the a|b projection ([96, 5120]) gemv_bf16_t1_n must take less time than the rmsnorm it
    replaces followed by gemv_bf16_t1 (prints the three times)."""
    from inferno.kernels.launchers import RMSNorm

    n, k = AB
    fused, plain, norm = GemvBf16.load(1, device, norm=True), GemvBf16.load(1, device), RMSNorm.for_width(k, device)
    x, nw = _norm_inputs(rng, k)
    w = to_device(None, (rng.standard_normal((n, k), np.float32) * 0.05).astype(bf16), "w")
    dx, dn = to_device(None, x, "x"), to_device(None, nw, "nw")
    normed, y = device_alloc(k * 2, "normed"), device_alloc(n * 2, "y")
    try:
        t_fused = _time_us(lambda: fused(w, dx, y, n, k, norm=(dn, EPS)))
        t_norm = _time_us(lambda: norm(dx, dn, normed, 1, k, EPS))
        t_split = _time_us(lambda: (norm(dx, dn, normed, 1, k, EPS), plain(w, normed, y, n, k)))
    finally:
        for b in (w, dx, dn, normed, y):
            b.free()
    print(f"\na|b projection {n}x{k}: {fused.name} {t_fused:.1f} us; {norm.name} {t_norm:.1f} us + "
          f"{plain.name} = {t_split:.1f} us")
    assert t_fused < t_split, (f"{fused.name} {t_fused:.1f} us is not faster than {norm.name} + {plain.name} "
                               f"{t_split:.1f} us")


def test_launcher_refuses_bad_arguments(device):
    k = GemvBf16.load(2, device)
    w, x, y = device_alloc(1 << 16, "w"), device_alloc(1 << 12, "x"), device_alloc(1 << 12, "y")
    try:
        with pytest.raises(LaunchError, match="exceeds its 2"):
            k(w, x, y, 16, 64, 3)
        with pytest.raises(LaunchError, match="multiple of 8"):
            k(w, x, y, 16, 60, 1)
        with pytest.raises(LaunchError, match="bytes, the call needs"):
            k(w, x, y, 1024, 64, 1)
    finally:
        for b in (w, x, y):
            b.free()
