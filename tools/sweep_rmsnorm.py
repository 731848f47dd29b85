"""Tune the RMSNorm launch shape: build config candidates here, time them on the GPU.

    python tools/sweep_rmsnorm.py build DIR          # needs the CuTe DSL, no GPU
    python tools/sweep_rmsnorm.py run DIR [--rows 8192 --n 5120]   # needs a GPU, no DSL

Each candidate is the registry's `rmsnorm` variant with another (threads_per_row, rows_per_cta,
chunks), or with N fixed at compile time. `run` checks each against numpy (poisoned output)
and prints GB/s and the ratio to the same-run device copy bandwidth.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inferno.kernels.registry import Tensor, Variant, get  # noqa: E402


def candidate(tpr: int, rows: int, chunks: int, static_n: int | None = None) -> Variant:
    base = get("rmsnorm_8k")
    args = base.args
    name = f"rms_t{tpr}_r{rows}_c{chunks}"
    if static_n:
        eps = args[-1]
        args = (Tensor("x", "bf16", ("M", static_n), ("x_stride", 1)), None, Tensor("w", "bf16", (static_n,), (1,)),
                Tensor("y", "bf16", ("M", static_n), ("y_stride", 1)), None, eps)
        name += f"_n{static_n}"
    return dataclasses.replace(base, name=name, args=args, grid=("cdiv(M, R)", "1", "1"),
                               config=dict(threads_per_row=tpr, rows_per_cta=rows, chunks=chunks, residual=False))


CANDIDATES = [
    candidate(128, 1, 5), candidate(128, 1, 8), candidate(160, 1, 4), candidate(256, 1, 4), candidate(64, 2, 10),
    candidate(128, 1, 5, 5120), candidate(64, 2, 10, 5120), candidate(32, 4, 4), candidate(32, 4, 8),
]
CTAS_PER_SM = (None, 2, 4, 8)  # grid cap: None = one CTA per row group


def build(out: Path) -> None:
    from inferno.kernels.build import build_variant

    for v in CANDIDATES:
        m = build_variant(v, "sm_90a", out)
        print(f"built {v.name}: block {m.block[0]}, smem {m.smem}", file=sys.stderr)


def run(root: Path, rows: int, n: int) -> None:
    from inferno.cuda.copy import from_device, memset_d8, to_device
    from inferno.cuda.device import Device
    from inferno.cuda.launch import launch
    from inferno.cuda.memory import device_alloc
    from inferno.cuda.params import TensorArg
    from inferno.cuda.stream import Stream
    from inferno.kernels import reference as ref
    from inferno.kernels.cache import load
    from inferno.kernels.ceilings import copy_bandwidth, time_ms

    dev = Device.open()
    stream = Stream.create()
    rng = np.random.default_rng()
    copy = copy_bandwidth(stream, 2 << 30)["gbps"]
    x = rng.standard_normal((rows, n), np.float32).astype(ref.bf16)
    w = (0.5 * rng.standard_normal(n, np.float32)).astype(ref.bf16)
    dx, dw, dy = to_device(None, x, "x"), to_device(None, w, "w"), device_alloc(rows * n * 2, "y")
    want = ref.rmsnorm(x[:64], w, 1e-6)
    nbytes = 2 * rows * n * 2 + n * 2
    print(f"copy {copy:.0f} GB/s; RMSNorm {rows}x{n}")
    for v in CANDIDATES:
        static_n = v.args[0].shape[1]
        if v.config["threads_per_row"] * v.config["chunks"] * 8 < n or static_n not in ("N", n):
            continue
        lk = load(v, dev, root)
        m = lk.manifest
        sym = {"M": rows, "N": n, "x_stride": n, "y_stride": n}
        ptrs = {"x": dx.ptr, "w": dw.ptr, "y": dy.ptr}
        args = [TensorArg(ptrs[p.name], [sym[s] for s in p.dyn_shape], [sym[s] for s in p.dyn_stride])
                if p.kind == "tensor" else 1e-6 for p in m.params]
        params = lk.layout.pack(args)
        regs = lk.kernel.attribute("num_regs")
        for per_sm in CTAS_PER_SM:
            groups = -(-rows // v.config["rows_per_cta"])
            grid = (groups if per_sm is None else min(groups, per_sm * dev.sm_count), 1, 1)
            memset_d8(dy, 0xFF)
            launch(lk.kernel, grid, m.block, params, m.smem, stream)
            stream.synchronize()
            y = from_device(dy, ref.bf16, (rows, n))
            err = ref.rel_error(y[:64], want)
            nan = int(np.count_nonzero(np.isnan(y.astype(np.float32))))
            ms = time_ms(lambda: launch(lk.kernel, grid, m.block, params, m.smem, stream), stream)
            gbps = nbytes / ms / 1e6
            print(f"{v.name:<22} grid {grid[0]:>5}  regs {regs:>3}  {ms * 1e3:7.1f} us  {gbps:6.0f} GB/s  "
                  f"{gbps / copy:6.1%} of copy  err {err:.1e}  unwritten {nan}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["build", "run"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--n", type=int, default=5120)
    a = ap.parse_args()
    build(a.dir) if a.what == "build" else run(a.dir, a.rows, a.n)


if __name__ == "__main__":
    main()
