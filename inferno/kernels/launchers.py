"""Typed launchers: one small class per kernel op, taking DeviceBuffers and ints.

Each launcher checks its arguments (types, sizes against the buffers, alignment and the
divisibility the kernel was compiled for) before any driver call, packs the kernel parameters
with the manifest's layout, computes the grid from the manifest's rule and launches.
`Launcher.for_device(device)` picks the op's preferred variant for the device's arch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferno.cuda.errors import LaunchError
from inferno.cuda.launch import launch
from inferno.cuda.memory import DeviceBuffer
from inferno.cuda.params import TensorArg
from inferno.kernels.cache import LoadedKernel, load
from inferno.kernels.manifest import compile_grid
from inferno.kernels.registry import variant_for

if TYPE_CHECKING:
    from inferno.cuda.device import Device

BF16 = 2


def _int(v: Any, what: str, kernel: str, lo: int = 1) -> int:
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise LaunchError(f"kernel {kernel}: {what} must be an int, got {type(v).__name__} {v!r}")
    x = int(v.__index__())
    if x < lo:
        raise LaunchError(f"kernel {kernel}: {what} must be >= {lo}, got {x}")
    return x


def _buf(v: Any, what: str, kernel: str, need: int, align: int = 16) -> int:
    """Address of a DeviceBuffer holding at least `need` bytes at an `align`-byte boundary."""
    if not isinstance(v, DeviceBuffer):
        raise LaunchError(f"kernel {kernel}: {what} must be a DeviceBuffer, got {type(v).__name__}")
    if v.nbytes < need:
        raise LaunchError(f"kernel {kernel}: {what} {v.name!r} has {v.nbytes} bytes, the call needs {need}")
    if v.ptr % align:
        raise LaunchError(f"kernel {kernel}: {what} {v.name!r} at 0x{v.ptr:x} is not {align}-byte aligned")
    return v.ptr


class Launcher:
    """Base: a loaded kernel plus pack -> grid -> launch.

    A launcher reuses one parameter buffer across calls: use one launcher per thread.
    """

    op = ""

    def __init__(self, loaded: LoadedKernel):
        if loaded.manifest.op != self.op:
            raise LaunchError(f"{type(self).__name__} needs a {self.op!r} kernel, got {loaded.variant.name} "
                              f"({loaded.manifest.op})")
        self.loaded = loaded
        self.name = loaded.variant.name
        self.config = loaded.manifest.config
        self._grid = compile_grid(tuple(loaded.manifest.grid))
        self._params = None  # one PackedParams, rewritten per call (the driver copies it at launch)

    @classmethod
    def for_device(cls, device: "Device | None" = None, variant: str | None = None) -> "Launcher":
        """The launcher for `variant`, or for the op's preferred variant on the device's arch."""
        from inferno.cuda.device import Device

        device = device or Device.open()
        name = variant or variant_for(cls.op, device.arch).name
        return cls(load(name, device))

    def _divisible(self, what: str, value: int, sym: str) -> None:
        d = self.loaded.manifest.divisibility.get(sym, 1)
        if value % d:
            raise LaunchError(f"kernel {self.name}: {what} = {value} must be a multiple of {d}")

    def _launch(self, args: list, symbols: dict[str, int], stream: Any) -> None:
        m = self.loaded.manifest
        if self._params is None:
            self._params = self.loaded.layout.pack(args)
        else:
            self._params.update(args)
        grid = self._grid({"SMS": self.loaded.sm_count, **symbols})
        launch(self.loaded.kernel, grid, m.block, self._params, m.smem, stream)


def _rows_tensor(ptr: int, rows: int, cols: int, stride: int) -> TensorArg:
    return TensorArg(ptr, (rows, cols), (stride,))


class RMSNorm(Launcher):
    """y = x * rsqrt(mean(x^2) + eps) * (1 + w) over `rows` rows of `n` bf16 values."""

    op = "rmsnorm"

    def max_n(self) -> int:
        c = self.config
        return c["threads_per_row"] * c["chunks"] * 8

    @classmethod
    def for_width(cls, n: int, device: "Device | None" = None) -> "RMSNorm":
        """The launcher of the narrowest variant whose rows hold `n` values (fewest registers)."""
        from inferno.cuda.device import Device
        from inferno.kernels.registry import variants

        device = device or Device.open()
        fits = [v for v in variants(device.arch)
                if v.op == cls.op and v.config["threads_per_row"] * v.config["chunks"] * 8 >= n]
        if not fits:
            raise LaunchError(f"no {cls.op} kernel holds rows of {n} values on {device.arch}")
        best = min(fits, key=lambda v: v.config["threads_per_row"] * v.config["chunks"])
        return cls(load(best.name, device))

    def _check_rows(self, rows: int, n: int, stride: int | None) -> int:
        rows = _int(rows, "rows", self.name)
        n = _int(n, "n", self.name)
        self._divisible("n", n, "N")
        if n > self.max_n():
            raise LaunchError(f"kernel {self.name}: n = {n} exceeds its maximum {self.max_n()}; "
                              "use a wider rmsnorm variant")
        stride = n if stride is None else _int(stride, "stride", self.name)
        if stride < n:
            raise LaunchError(f"kernel {self.name}: row stride {stride} is less than n = {n}")
        self._divisible("stride", stride, "x_stride")
        return stride

    def __call__(self, x: DeviceBuffer, w: DeviceBuffer, y: DeviceBuffer, rows: int, n: int,
                 eps: float = 1e-6, *, stride: int | None = None, stream: Any = None) -> None:
        """Normalise rows of x (row stride `stride` elements, default n) into y (same layout)."""
        stride = self._check_rows(rows, n, stride)
        need = ((rows - 1) * stride + n) * BF16
        px = _buf(x, "x", self.name, need)
        pw = _buf(w, "w", self.name, n * BF16)
        py = _buf(y, "y", self.name, need)
        args = [_rows_tensor(px, rows, n, stride), TensorArg(pw, (n,)), _rows_tensor(py, rows, n, stride), eps]
        self._launch(args, {"M": rows, "N": n}, stream)


class AddRMSNorm(RMSNorm):
    """h = x + r (written out, bf16); y = RMSNorm(h) with zero-centred weight w."""

    op = "add_rmsnorm"

    def __call__(self, x: DeviceBuffer, r: DeviceBuffer, w: DeviceBuffer, y: DeviceBuffer, h: DeviceBuffer,
                 rows: int, n: int, eps: float = 1e-6, *, stride: int | None = None,
                 stream: Any = None) -> None:
        stride = self._check_rows(rows, n, stride)
        need = ((rows - 1) * stride + n) * BF16
        t = [_rows_tensor(_buf(b, nm, self.name, need), rows, n, stride)
             for b, nm in ((x, "x"), (r, "r"), (y, "y"), (h, "h"))]
        pw = _buf(w, "w", self.name, n * BF16)
        self._launch([t[0], t[1], TensorArg(pw, (n,)), t[2], t[3], eps], {"M": rows, "N": n}, stream)


class SiluMul(Launcher):
    """out[t, :] = silu(gu[t, :I]) * gu[t, I:] for `rows` rows; gu is [rows, 2I], out [rows, I]."""

    op = "silu_mul"

    def __call__(self, gu: DeviceBuffer, out: DeviceBuffer, rows: int, inter: int, *, stream: Any = None) -> None:
        rows = _int(rows, "rows", self.name)
        inter = _int(inter, "inter", self.name)
        self._divisible("inter", inter, "I")
        if rows > 65535:
            raise LaunchError(f"kernel {self.name}: rows = {rows} exceeds 65535; split the call")
        pg = _buf(gu, "gu", self.name, rows * 2 * inter * BF16)
        po = _buf(out, "out", self.name, rows * inter * BF16)
        args = [_rows_tensor(pg, rows, 2 * inter, 2 * inter), _rows_tensor(po, rows, inter, inter)]
        self._launch(args, {"T": rows, "I": inter}, stream)


class Embedding(Launcher):
    """out[t, :] = table[ids[t], :]; ids int32 [tokens], table bf16 [vocab, hidden]."""

    op = "embedding"

    def __call__(self, ids: DeviceBuffer, table: DeviceBuffer, out: DeviceBuffer, tokens: int, vocab: int,
                 hidden: int, *, stream: Any = None) -> None:
        tokens = _int(tokens, "tokens", self.name)
        vocab = _int(vocab, "vocab", self.name)
        hidden = _int(hidden, "hidden", self.name)
        self._divisible("hidden", hidden, "H")
        if tokens > 65535:
            raise LaunchError(f"kernel {self.name}: tokens = {tokens} exceeds 65535; split the call")
        pi = _buf(ids, "ids", self.name, tokens * 4, align=4)
        pt = _buf(table, "table", self.name, vocab * hidden * BF16)
        po = _buf(out, "out", self.name, tokens * hidden * BF16)
        args = [TensorArg(pi, (tokens,)), _rows_tensor(pt, vocab, hidden, hidden),
                _rows_tensor(po, tokens, hidden, hidden)]
        self._launch(args, {"T": tokens, "H": hidden}, stream)


class Gemm(Launcher):
    """C[M, N] = A[M, K] @ B[N, K]^T in bf16 (fp32 accumulate); all row-major and contiguous."""

    op = "gemm"

    def __init__(self, loaded: LoadedKernel):
        super().__init__(loaded)
        self._tma_cache: dict[tuple, bytes] = {}

    def _tma(self, p, ptr: int, rows: int, cols: int) -> bytes:
        from inferno.cuda.tma import encode_tiled

        key = (p.name, ptr, rows, cols)
        d = self._tma_cache.get(key)
        if d is None:
            if len(self._tma_cache) > 256:
                self._tma_cache.clear()
            d = encode_tiled(p.dtype, ptr, [cols, rows], [cols * BF16], p.tma["box"], p.tma["swizzle"])
            self._tma_cache[key] = d
        return d

    def __call__(self, a: DeviceBuffer, b: DeviceBuffer, c: DeviceBuffer, m: int, n: int, k: int, *,
                 stream: Any = None) -> None:
        m, n, k = (_int(v, nm, self.name) for v, nm in ((m, "m"), (n, "n"), (k, "k")))
        for sym, val in (("K", k), ("N", n)):
            self._divisible(sym.lower(), val, sym)
        dims = {"a": (_buf(a, "a", self.name, m * k * BF16), m, k),
                "b": (_buf(b, "b", self.name, n * k * BF16), n, k),
                "c": (_buf(c, "c", self.name, m * n * BF16), m, n)}
        args: list = []
        for p in self.loaded.manifest.params:
            if p.kind == "tensor":
                ptr, rows, cols = dims[p.name]
                args.append(_rows_tensor(ptr, rows, cols, cols))
            elif p.kind == "tma":
                args.append(self._tma(p, *dims[p.of]))
            elif p.of:  # the i32 shape of a TMA tensor
                _, rows, cols = dims[p.of]
                args.append(rows.to_bytes(4, "little") + cols.to_bytes(4, "little"))
            else:
                args.append(bytes(p.size))
        self._launch(args, {"M": m, "N": n, "K": k}, stream)


LAUNCHERS = {cls.op: cls for cls in (RMSNorm, AddRMSNorm, SiluMul, Embedding, Gemm)}


def _all_launchers() -> dict[str, type]:
    """Core launchers plus those of the kernel families that define their own (by op)."""
    from inferno.kernels.gdn_prefill_variants import GDN_PREFILL_LAUNCHERS
    from inferno.kernels.gdn_variants import GDN_LAUNCHERS

    return {**LAUNCHERS, **GDN_LAUNCHERS, **GDN_PREFILL_LAUNCHERS}


def launcher(variant: str, device: "Device | None" = None) -> Launcher:
    """The typed launcher for a variant name (e.g. "rmsnorm_small", "gemm_simt")."""
    from inferno.kernels.registry import get

    op = get(variant).op
    table = _all_launchers()
    if op not in table:
        raise LaunchError(f"kernel {variant!r} (op {op}) has no generic launcher; use its family module's launcher")
    return table[op].for_device(device, variant)
