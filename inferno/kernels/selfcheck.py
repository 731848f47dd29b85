"""GPU self-check: every kernel against numpy on fresh random inputs with poisoned outputs.

Each `check_*` allocates inputs, fills every output buffer (plus a guard tail) with 0xFF bytes
(bf16 NaN), launches, and returns a `CheckResult`: relative error vs the numpy reference, the
number of output elements left unwritten (still NaN) and whether the guard tail was touched.
`run_all(device)` runs the default shapes for every op the device has kernels for; the CLI's
`inferno kernels check` and the GPU tests use these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from inferno.kernels import reference as ref
from inferno.kernels.reference import bf16

if TYPE_CHECKING:
    from inferno.cuda.device import Device
    from inferno.kernels.launchers import Launcher

GUARD = 256  # poisoned bytes after each output, which the kernel must not touch


@dataclass
class CheckResult:
    variant: str
    shape: str
    rel_err: float
    unwritten: int
    guard_ok: bool
    tol: float = ref.BF16_TOL

    @property
    def ok(self) -> bool:
        return self.unwritten == 0 and self.guard_ok and self.rel_err <= self.tol

    def line(self) -> str:
        status = "ok  " if self.ok else "FAIL"
        return (f"{status} {self.variant:<14} {self.shape:<22} rel_err {self.rel_err:.2e} "
                f"(tol {self.tol:.0e})  unwritten {self.unwritten}  guard {'ok' if self.guard_ok else 'TOUCHED'}")


class _Out:
    """A poisoned output buffer with a guard tail."""

    def __init__(self, shape: tuple[int, ...], name: str):
        from inferno.cuda.copy import memset_d8
        from inferno.cuda.memory import device_alloc

        self.shape = shape
        self.nbytes = int(np.prod(shape)) * 2
        self.buf = device_alloc(self.nbytes + GUARD, name)
        memset_d8(self.buf, 0xFF)

    def read(self) -> tuple[np.ndarray, bool]:
        from inferno.cuda.copy import from_device

        raw = from_device(self.buf, np.uint8, (self.nbytes + GUARD,))
        guard_ok = bool(np.all(raw[self.nbytes:] == 0xFF))
        return raw[: self.nbytes].view(bf16).reshape(self.shape), guard_ok


def _up(a: np.ndarray, name: str):
    from inferno.cuda.copy import to_device

    return to_device(None, a, name)


def _result(variant: str, shape: str, outs: list[tuple[np.ndarray, bool, np.ndarray]]) -> CheckResult:
    err, unwritten, guard = 0.0, 0, True
    for out, g, want in outs:
        unwritten += int(np.count_nonzero(np.isnan(out.astype(np.float32))))
        err = max(err, ref.rel_error(np.nan_to_num(out.astype(np.float32), nan=0.0), want))
        guard = guard and g
    return CheckResult(variant, shape, err, unwritten, guard)


def _free(*bufs) -> None:
    for b in bufs:
        b.free()


def check_rmsnorm(k: "Launcher", rows: int, n: int, rng: np.random.Generator, eps: float = 1e-6) -> CheckResult:
    x = rng.standard_normal((rows, n), np.float32).astype(bf16)
    w = (0.5 * rng.standard_normal(n, np.float32)).astype(bf16)
    dx, dw, y = _up(x, "x"), _up(w, "w"), _Out((rows, n), "y")
    k(dx, dw, y.buf, rows, n, eps)
    out, g = y.read()
    _free(dx, dw, y.buf)
    return _result(k.name, f"{rows}x{n}", [(out, g, ref.rmsnorm(x, w, eps))])


def check_add_rmsnorm(k: "Launcher", rows: int, n: int, rng: np.random.Generator,
                      eps: float = 1e-6) -> CheckResult:
    x = rng.standard_normal((rows, n), np.float32).astype(bf16)
    r = rng.standard_normal((rows, n), np.float32).astype(bf16)
    w = (0.5 * rng.standard_normal(n, np.float32)).astype(bf16)
    dx, dr, dw = _up(x, "x"), _up(r, "r"), _up(w, "w")
    y, h = _Out((rows, n), "y"), _Out((rows, n), "h")
    k(dx, dr, dw, y.buf, h.buf, rows, n, eps)
    (oy, gy), (oh, gh) = y.read(), h.read()
    _free(dx, dr, dw, y.buf, h.buf)
    want_h, want_y = ref.add_rmsnorm(x, r, w, eps)
    return _result(k.name, f"{rows}x{n}", [(oh, gh, want_h), (oy, gy, want_y)])


def check_silu_mul(k: "Launcher", rows: int, inter: int, rng: np.random.Generator) -> CheckResult:
    gu = (2 * rng.standard_normal((rows, 2 * inter), np.float32)).astype(bf16)
    dg, o = _up(gu, "gu"), _Out((rows, inter), "out")
    k(dg, o.buf, rows, inter)
    out, g = o.read()
    _free(dg, o.buf)
    return _result(k.name, f"{rows}x{inter}", [(out, g, ref.silu_mul(gu))])


def check_embedding(k: "Launcher", tokens: int, vocab: int, hidden: int, rng: np.random.Generator) -> CheckResult:
    table = rng.standard_normal((vocab, hidden), np.float32).astype(bf16)
    ids = rng.integers(0, vocab, tokens).astype(np.int32)
    if tokens > 2:
        ids[1], ids[-1] = -1, vocab  # out of range: zero rows
    di, dt, o = _up(ids, "ids"), _up(table, "table"), _Out((tokens, hidden), "out")
    k(di, dt, o.buf, tokens, vocab, hidden)
    out, g = o.read()
    _free(di, dt, o.buf)
    res = _result(k.name, f"{tokens}x{hidden}", [(out, g, ref.embedding(ids, table))])
    res.tol = 0.0  # a gather is exact
    return res


def check_gemm(k: "Launcher", m: int, n: int, kdim: int, rng: np.random.Generator) -> CheckResult:
    a = rng.standard_normal((m, kdim), np.float32).astype(bf16)
    b = rng.standard_normal((n, kdim), np.float32).astype(bf16)
    da, db, c = _up(a, "a"), _up(b, "b"), _Out((m, n), "c")
    k(da, db, c.buf, m, n, kdim)
    out, g = c.read()
    _free(da, db, c.buf)
    return _result(k.name, f"{m}x{n}x{kdim}", [(out, g, ref.gemm(a, b))])


# Default shapes: ragged and model-sized (hidden 5120, q/k head 256, intermediate 17408).
DEFAULT_CASES: dict[str, list[tuple[Callable, tuple]]] = {
    "rmsnorm_1k": [(check_rmsnorm, (130, 256)), (check_rmsnorm, (3, 1024)), (check_rmsnorm, (5, 72))],
    "rmsnorm_5k": [(check_rmsnorm, (7, 5120)), (check_rmsnorm, (2000, 5120)), (check_rmsnorm, (5, 264))],
    "rmsnorm_8k": [(check_rmsnorm, (33, 8192)), (check_rmsnorm, (3, 6000))],
    "rmsnorm_16k": [(check_rmsnorm, (3, 16384)), (check_rmsnorm, (9, 5120))],
    "add_rmsnorm_5k": [(check_add_rmsnorm, (7, 5120)), (check_add_rmsnorm, (1500, 5120))],
    "add_rmsnorm_8k": [(check_add_rmsnorm, (2, 8192)), (check_add_rmsnorm, (65, 136))],
    "silu_mul": [(check_silu_mul, (3, 17408)), (check_silu_mul, (1, 520))],
    "embedding": [(check_embedding, (9, 1000, 5120)), (check_embedding, (1, 7, 64))],
    "gemm_wgmma": [(check_gemm, (256, 512, 256)), (check_gemm, (1000, 1000, 264)), (check_gemm, (7, 136, 72))],
    "gemm_simt": [(check_gemm, (128, 192, 256)), (check_gemm, (100, 72, 40))],
}


def run_all(device: "Device", seed: int | None = None, only: str | None = None) -> list[CheckResult]:
    """Run the default cases of every variant that has them and builds for the device's arch.

    The kernel families (GEMV, GDN, attention, prefill, sampling) are checked by their own GPU
    tests in tests/gpu/, which need shapes and state only the executor's layouts define.
    """
    from inferno.kernels.launchers import launcher
    from inferno.kernels.registry import variants

    rng = np.random.default_rng(seed)
    results = []
    for v in variants(device.arch):
        if (only and v.name != only) or v.name not in DEFAULT_CASES:
            continue
        k = launcher(v.name, device)
        for fn, shape in DEFAULT_CASES.get(v.name, []):
            results.append(fn(k, *shape, rng))
        device.synchronize()
    return results
