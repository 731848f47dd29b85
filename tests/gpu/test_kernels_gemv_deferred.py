"""Deferred epilogues on the live GPU vs numpy: the `accumulate` stream-K GEMV (y fp32 += W x, no flush; `_acc_n`
with the RMSNorm folded) and the `_na` members (x = bf16(x + s) staged, written once to xo, z zeroed once, then
RMSNorm and the GEMV, accumulate included), Q4-Q6 on small, ragged and 27B shapes; fresh random inputs,
poisoned outputs with guard tails."""

import numpy as np
import pytest

from inferno.artifact.formats import groupwise as gw
from inferno.cuda.copy import from_device, h2d, memset_d8, to_device
from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import device_alloc
from inferno.kernels import gemv_mma_variants as mv
from inferno.kernels import qlayout as ql
from inferno.kernels.reference import BF16_TOL, bf16, rel_error
from inferno.kernels.tiled import tile
from gemv_check import GUARD, rms_normed

FORMATS = list(gw.SCHEMES)[:3]  # Q4-Q6
GATE_UP, DOWN, GDN_OUT, RAGGED = (34816, 5120), (5120, 17408), (5120, 6144), (1002, 200)
# The normed members stage bf16(rmsnorm(x)): their sum of squares and rsqrt round apart from numpy's, so a few
# staged values land one bf16 ulp (~2^-8) off the reference's and y moves by ~1e-4 (seen: 1.1e-4 at 27B shapes)
NORM_ACC_TOL = 5e-4
ACC_CASES = ((17, 136), RAGGED, (300, 2048), GDN_OUT, DOWN)
ADD_CASES = (("plain", 17, 136), ("plain", *RAGGED), ("plain", 12288, 5120), ("swiglu", 34, 136),
             ("swiglu", *RAGGED), ("swiglu", *GATE_UP), (mv.ACCUMULATE, 17, 136), (mv.ACCUMULATE, 16384, 5120))


def _upload_weights(fmt, n, k, rng):
    pay = ql.random_payload(fmt, n, k, rng)
    return pay, to_device(None, tile(fmt, pay, n, k), f"w {fmt} tiled")


def _guarded(nbytes, name, fill=0xFF):
    buf = device_alloc(nbytes + GUARD, name)
    memset_d8(buf, fill)
    return buf


@pytest.mark.parametrize("fmt", FORMATS)
def test_accumulate(device, rng, fmt):
    """y fp32 += W x, twice on the same y (random start): every output gets both launches' sums, the guard
    tail stays."""
    kern = mv.GemvMma.load(mv.variant_name(fmt, mv.ACCUMULATE), device)
    for n, k in ACC_CASES:
        pay, dw = _upload_weights(fmt, n, k, rng)
        x = rng.standard_normal((1, k), np.float32).astype(bf16)
        y0 = rng.standard_normal(n).astype(np.float32)
        dx = to_device(None, x, "x")
        dy = _guarded(4 * n, "y")
        try:
            h2d(dy, y0)
            for _ in range(2):
                kern(dw, dx, dy, n, k, 1)
            raw = from_device(dy, np.uint8, (4 * n + GUARD,))
        finally:
            for b in (dw, dx, dy):
                b.free()
        assert np.all(raw[4 * n:] == 0xFF), f"{fmt} [{n}, {k}]: guard tail written"
        y = raw[:4 * n].view(np.float32)
        want = y0 + 2 * ql.reference(fmt, pay, n, k, x.astype(np.float32), "plain", None, np.arange(n))[0]
        err = rel_error(y, want.astype(np.float32))
        assert err <= 1e-4, f"{fmt} accumulate [{n}, {k}]: rel err {err:.2e}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_norm_members(device, rng, fmt):
    """`_acc_n`: y fp32 += W rmsnorm(x) (the GDN input projection when nothing is added to its x)."""
    kern = mv.GemvMma.load(mv.variant_name(fmt, mv.ACCUMULATE, 1, norm=True), device)
    for n, k in ((17, 136), RAGGED, (16384, 5120)):
        pay, dw = _upload_weights(fmt, n, k, rng)
        x = (rng.standard_normal((1, k), np.float32) * 4 + 1).astype(bf16)
        nw = (rng.standard_normal(k, np.float32) * 0.2).astype(bf16)
        y0 = rng.standard_normal(n).astype(np.float32)
        dx, dnw, dy = to_device(None, x, "x"), to_device(None, nw, "nw"), _guarded(4 * n, "y")
        try:
            h2d(dy, y0)
            kern(dw, dx, dy, n, k, 1, norm=(dnw, 1e-6))
            raw = from_device(dy, np.uint8, (4 * n + GUARD,))
        finally:
            for b in (dw, dx, dnw, dy):
                b.free()
        assert np.all(raw[4 * n:] == 0xFF), f"{fmt} accumulate_n [{n}, {k}]: guard tail written"
        want = y0 + ql.reference(fmt, pay, n, k, rms_normed(x, nw, 1e-6).astype(np.float32), "plain", None,
                                 np.arange(n))[0]
        err = rel_error(raw[:4 * n].view(np.float32), want.astype(np.float32))
        assert err <= NORM_ACC_TOL, f"{fmt} accumulate_n [{n}, {k}]: rel err {err:.2e}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_add_members(device, rng, fmt):
    """x_mid = bf16(x + s) written to xo exactly once per element (bit-exact), z zeroed exactly (guards
    intact), y = epilogue(W rmsnorm(x_mid)) (accumulate: y fp32 += W rmsnorm(x_mid)); the family refuses a
    call without add=."""
    for epi, n, k in ADD_CASES:
        kern = mv.GemvMma.load(mv.variant_name(fmt, epi, 1, norm=True, add=True), device)
        acc = epi == mv.ACCUMULATE
        m, ob = n // 2 if epi == "swiglu" else n, 4 if acc else 2  # outputs, bytes per output
        pay, dw = _upload_weights(fmt, n, k, rng)
        x = (rng.standard_normal((1, k), np.float32) * 4 + 1).astype(bf16)
        s = (rng.standard_normal(k) * 3).astype(np.float32)
        nw = (rng.standard_normal(k, np.float32) * 0.2).astype(bf16)
        y0 = rng.standard_normal(m).astype(np.float32) if acc else np.zeros(m, np.float32)
        dx, ds, dnw = to_device(None, x, "x"), to_device(None, s, "s"), to_device(None, nw, "nw")
        dxo, dz, dy = _guarded(2 * k, "xo"), _guarded(4 * k, "z", 0x3C), _guarded(ob * m, "y")
        try:
            if acc:
                h2d(dy, y0)
            kern(dw, dx, dy, n, k, 1, norm=(dnw, 1e-6), add=mv.Addend(ds, dxo, dz))
            xo = from_device(dxo, np.uint8, (2 * k + GUARD,))
            z = from_device(dz, np.uint8, (4 * k + GUARD,))
            raw = from_device(dy, np.uint8, (ob * m + GUARD,))
            with pytest.raises(LaunchError, match="add="):
                kern(dw, dx, dy, n, k, 1, norm=(dnw, 1e-6))
        finally:
            for b in (dw, dx, ds, dnw, dxo, dz, dy):
                b.free()
        what = f"{fmt} {epi}_na [{n}, {k}]"
        x_mid = (x[0].astype(np.float32) + s).astype(bf16)
        assert np.all(xo[2 * k:] == 0xFF) and np.all(z[4 * k:] == 0x3C) and np.all(raw[ob * m:] == 0xFF), \
            f"{what}: a guard tail written"
        np.testing.assert_array_equal(xo[:2 * k].view(np.uint16), x_mid.view(np.uint16), err_msg=f"{what}: xo")
        assert np.all(z[:4 * k] == 0), f"{what}: z not zeroed ({np.count_nonzero(z[:4 * k].view(np.float32))} left)"
        y = raw[:ob * m].view(np.float32 if acc else bf16).astype(np.float32)
        assert not np.isnan(y).any(), f"{what}: outputs unwritten"
        want = y0 + ql.reference(fmt, pay, n, k, rms_normed(x_mid[None], nw, 1e-6).astype(np.float32),
                                 "plain" if acc else epi, None, np.arange(m))[0]
        err = rel_error(y, want.astype(np.float32))
        assert err <= (NORM_ACC_TOL if acc else BF16_TOL), f"{what}: rel err {err:.2e}"


LO4_CASES = ((16, 16, 136), (16, 1, 136), (64, 938, 200), (48, 300, 2048), (4096, 12288, 5120), (7168, 7168, 5120))


def _mixed_weights(q4_rows, q5_rows, k, rng):
    """Random Q4 [q4_rows, k] and Q5 [q5_rows, k] payloads and their mixed stack on the device."""
    from inferno.kernels.tiled import mixed_nbytes, mixed_offset

    p4, p5 = ql.random_payload("Q4G64_F16S", q4_rows, k, rng), ql.random_payload("Q5G64_F16S", q5_rows, k, rng)
    image = np.full(mixed_nbytes(q4_rows + q5_rows, k, q4_rows), 0xA5, np.uint8)  # the padding poisoned
    t4 = tile("Q4G64_F16S", p4, q4_rows, k)
    image[:t4.size] = t4
    image[mixed_offset(q4_rows, k):] = tile("Q5G64_F16S", p5, q5_rows, k)
    return p4, p5, to_device(None, image, "w mixed")


@pytest.mark.parametrize("add", [False, True])
def test_lo4_members(device, rng, add):
    """`_acc_n_lo4` / `_acc_na_lo4` on mixed stacks (the first rows a Q4 image, the rest Q5): y fp32 += W
    rmsnorm(x) (x = bf16(x + s) with add: xo bit-exact, z zeroed), Q4 rows against the Q4 reference and Q5 rows
    against the Q5 one, on shapes whose warps' runs start, end and cross the format boundary anywhere (the 27B
    GDN and attention input projections among them); the family refuses a call without lo=, the plain
    `_acc_n` family one with it."""
    kern = mv.GemvMma.load(mv.variant_name("Q5G64_F16S", mv.ACCUMULATE, 1, norm=True, add=add) + "_lo4", device)
    plain = mv.GemvMma.load(mv.variant_name("Q5G64_F16S", mv.ACCUMULATE, 1, norm=True, add=add), device)
    for q4_rows, q5_rows, k in LO4_CASES:
        n = q4_rows + q5_rows
        p4, p5, dw = _mixed_weights(q4_rows, q5_rows, k, rng)
        x = (rng.standard_normal((1, k), np.float32) * 4 + 1).astype(bf16)
        s = (rng.standard_normal(k) * 3).astype(np.float32)
        nw = (rng.standard_normal(k, np.float32) * 0.2).astype(bf16)
        y0 = rng.standard_normal(n).astype(np.float32)
        dx, ds, dnw = to_device(None, x, "x"), to_device(None, s, "s"), to_device(None, nw, "nw")
        dxo, dz, dy = _guarded(2 * k, "xo"), _guarded(4 * k, "z", 0x3C), _guarded(4 * n, "y")
        extra = dict(add=mv.Addend(ds, dxo, dz)) if add else {}
        try:
            h2d(dy, y0)
            kern(dw, dx, dy, n, k, 1, norm=(dnw, 1e-6), lo=q4_rows // 16, **extra)
            xo = from_device(dxo, np.uint8, (2 * k + GUARD,))
            z = from_device(dz, np.uint8, (4 * k + GUARD,))
            raw = from_device(dy, np.uint8, (4 * n + GUARD,))
            with pytest.raises(LaunchError, match="lo="):
                kern(dw, dx, dy, n, k, 1, norm=(dnw, 1e-6), **extra)
            with pytest.raises(LaunchError, match="lo="):
                plain(dw, dx, dy, n, k, 1, norm=(dnw, 1e-6), lo=q4_rows // 16, **extra)
        finally:
            for b in (dw, dx, ds, dnw, dxo, dz, dy):
                b.free()
        what = f"acc_{'na' if add else 'n'}_lo4 [{q4_rows} + {q5_rows}, {k}]"
        x_in = (x[0].astype(np.float32) + s).astype(bf16) if add else x[0]
        assert np.all(raw[4 * n:] == 0xFF), f"{what}: guard tail written"
        if add:
            assert np.all(xo[2 * k:] == 0xFF) and np.all(z[4 * k:] == 0x3C), f"{what}: a guard tail written"
            np.testing.assert_array_equal(xo[:2 * k].view(np.uint16), x_in.view(np.uint16), err_msg=f"{what}: xo")
            assert np.all(z[:4 * k] == 0), f"{what}: z not zeroed"
        xn = rms_normed(x_in[None], nw, 1e-6).astype(np.float32)
        want = np.concatenate(
            [ql.reference("Q4G64_F16S", p4, q4_rows, k, xn, "plain", None, np.arange(q4_rows))[0],
             ql.reference("Q5G64_F16S", p5, q5_rows, k, xn, "plain", None, np.arange(q5_rows))[0]])
        got = raw[:4 * n].view(np.float32).astype(np.float64) - y0  # the launch's sums alone
        for part, rows in (("Q4 rows", slice(0, q4_rows)), ("Q5 rows", slice(q4_rows, n))):
            err = rel_error(got[rows], want[rows])
            assert err <= NORM_ACC_TOL, f"{what}: {part} rel err {err:.2e}"
