"""Kernel benchmarks on the live GPU, each against a limit measured in the same run.

    python tools/bench_kernels.py [--out bench.json] [--quick]

Measures: device copy bandwidth (large D2D cuMemcpy, bytes read + written), a bf16 reference
GEMM rate (torch.matmul when torch is importable; torch appears only in this tool), our GEMM at
8192^3 (rate and ratio to the reference), the memory-bound kernels' bandwidth as a ratio to the
copy bandwidth, and the host cost per launch (typed launcher, launch(), pre-validated Launch).
Prints a table and markdown rows for docs/performance.md; writes JSON with every number.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inferno.cuda.copy import to_device  # noqa: E402
from inferno.cuda.device import Device  # noqa: E402
from inferno.cuda.launch import Launch, launch  # noqa: E402
from inferno.cuda.memory import device_alloc  # noqa: E402
from inferno.cuda.stream import Event, Stream  # noqa: E402
from inferno.kernels.ceilings import copy_bandwidth, time_ms  # noqa: E402
from inferno.kernels.launchers import AddRMSNorm, RMSNorm, launcher  # noqa: E402
from inferno.kernels.manifest import eval_grid  # noqa: E402
from inferno.kernels.reference import bf16  # noqa: E402


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def rand_bf16(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape, np.float32).astype(bf16)


def torch_gemm(n: int) -> dict | None:
    try:
        import torch
    except ImportError:
        return None
    torch.manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b.T
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(5):
            a @ b.T
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 5)
    ms = statistics.median(times)
    del a, b
    torch.cuda.empty_cache()
    return {"ms": ms, "tflops": 2 * n**3 / ms / 1e9, "impl": f"torch {torch.__version__} matmul"}


def our_gemm(device: Device, stream: Stream, rng, m: int, n: int, k: int, variant: str = "gemm_wgmma") -> dict:
    """Our GEMM C[m,n] = A[m,k] @ B[n,k]^T on random bf16; 4 rows of C spot-checked in float64."""
    g = launcher(variant, device)
    a, b = rand_bf16(rng, (m, k)), rand_bf16(rng, (n, k))
    da, db = to_device(None, a, "A"), to_device(None, b, "B")
    dc = device_alloc(m * n * 2, "C")
    ms = time_ms(lambda: g(da, db, dc, m, n, k, stream=stream), stream, reps=10, inner=3)
    from inferno.cuda.copy import from_device

    c = from_device(dc, bf16, (m, n))
    rows = rng.choice(m, min(4, m), replace=False)
    want = a[rows].astype(np.float64) @ b.astype(np.float64).T
    err = float(np.linalg.norm(c[rows].astype(np.float64) - want) / np.linalg.norm(want))
    for x in (da, db, dc):
        x.free()
    return {"variant": variant, "m": m, "n": n, "k": k, "ms": ms, "tflops": 2 * m * n * k / ms / 1e9,
            "spot_rel_err": err}


def norm_bandwidth(device: Device, stream: Stream, rng, rows: int, n: int, residual: bool) -> dict:
    """RMSNorm (or add + RMSNorm) over two alternating input sets, so no run reads the last one's
    output from L2. Bytes: x (+ r) read, y (+ h) written, w read once."""
    k = (AddRMSNorm if residual else RMSNorm).for_width(n, device)
    w = to_device(None, rand_bf16(rng, (n,)), "w")
    sets = []
    for i in range(2):
        bufs = {nm: to_device(None, rand_bf16(rng, (rows, n)), f"{nm}{i}") for nm in ("x", "r")[: 1 + residual]}
        bufs.update({nm: device_alloc(rows * n * 2, f"{nm}{i}") for nm in ("y", "h")[: 1 + residual]})
        sets.append(bufs)
    turn = [0]

    def run():
        b = sets[turn[0] % 2]
        turn[0] += 1
        if residual:
            k(b["x"], b["r"], w, b["y"], b["h"], rows, n, stream=stream)
        else:
            k(b["x"], w, b["y"], rows, n, stream=stream)

    ms = time_ms(run, stream)
    nbytes = (4 if residual else 2) * rows * n * 2 + n * 2
    for b in sets:
        for buf in b.values():
            buf.free()
    w.free()
    return {"variant": k.name, "rows": rows, "n": n, "bytes": nbytes, "ms": ms, "gbps": nbytes / ms / 1e6}


def decode_norm_latency(device: Device, stream: Stream, rng, n: int = 5120, per_graph: int = 20,
                        pdl: bool = False) -> dict:
    """Device time of one decode-step RMSNorm (1 row): `per_graph` dependent launches (x -> y -> x ...)
    captured in a CUDA graph and replayed, so host launch cost is out of the picture; with `pdl`
    each launch is a programmatic dependent launch (it starts while its predecessor drains)."""
    from inferno.cuda.graph import Graph

    k = RMSNorm.for_width(n, device)
    x, w = to_device(None, rand_bf16(rng, (1, n)), "x"), to_device(None, rand_bf16(rng, (n,)), "w")
    y = device_alloc(n * 2, "y")
    stream.pdl = pdl
    try:
        with Graph.capture(stream) as g:
            for i in range(per_graph):
                a, b = (x, y) if i % 2 == 0 else (y, x)
                k(a, w, b, 1, n, stream=stream)
    finally:
        stream.pdl = False
    ge = g.instantiate()
    ms = time_ms(lambda: ge.launch(stream), stream, inner=5) / per_graph
    ge.close()
    g.close()
    for b in (x, w, y):
        b.free()
    return {"variant": k.name, "rows": 1, "n": n, "ms": ms, "pdl": pdl}


def silu_bandwidth(device: Device, stream: Stream, rng, rows: int, inter: int) -> dict:
    k = launcher("silu_mul", device)
    gu = to_device(None, rand_bf16(rng, (rows, 2 * inter)), "gu")
    out = device_alloc(rows * inter * 2, "out")
    ms = time_ms(lambda: k(gu, out, rows, inter, stream=stream), stream)
    gu.free()
    out.free()
    nbytes = 3 * rows * inter * 2
    return {"variant": k.name, "rows": rows, "inter": inter, "bytes": nbytes, "ms": ms, "gbps": nbytes / ms / 1e6}


def launch_overhead(device: Device, stream: Stream, calls: int = 2000) -> dict:
    """Host microseconds per launch of a tiny kernel: typed launcher, launch(), Launch object."""
    k = launcher("rmsnorm_1k", device)
    n = 256
    x, w, y = (device_alloc(n * 2, nm) for nm in ("x", "w", "y"))
    from inferno.cuda.copy import memset_d8

    for b in (x, w, y):
        memset_d8(b, 0)
    lk = k.loaded
    from inferno.cuda.params import TensorArg

    params = lk.layout.pack([TensorArg(x.ptr, (1, n), (n,)), TensorArg(w.ptr, (n,)),
                             TensorArg(y.ptr, (1, n), (n,)), 1e-6])
    grid = eval_grid(lk.manifest.grid, {"M": 1, "N": n, "SMS": lk.sm_count})
    pre = Launch(lk.kernel, grid, lk.manifest.block, params, lk.manifest.smem)
    ways = {
        "typed_launcher_us": lambda: k(x, w, y, 1, n, stream=stream),
        "launch_us": lambda: launch(lk.kernel, grid, lk.manifest.block, params, lk.manifest.smem, stream),
        "prevalidated_Launch_us": lambda: pre(stream),
    }
    out = {}
    for name, fn in ways.items():
        for _ in range(100):
            fn()
        stream.synchronize()
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            dt = time.perf_counter() - t
            stream.synchronize()
            best = min(best, dt)
        out[name] = best / calls * 1e6
    a, b = Event(), Event()
    a.record(stream)
    for _ in range(calls):
        pre(stream)
    b.record(stream)
    b.synchronize()
    out["gpu_us_per_tiny_kernel"] = Event.elapsed_ms(a, b) * 1e3 / calls
    for buf in (x, w, y):
        buf.free()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="write JSON results here")
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    args = ap.parse_args()
    rng = np.random.default_rng()
    device = Device.open()
    stream = Stream.create()
    gemm_n = 4096 if args.quick else 8192
    res: dict = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "gpu": device.name,
                 "arch": device.arch, "sms": device.sm_count}
    log(f"{device!r}")
    log("copy bandwidth ...")
    res["copy"] = copy_bandwidth(stream, (1 if args.quick else 4) << 30)
    log(f"  {res['copy']['gbps']:.0f} GB/s")
    log("reference GEMM ...")
    res["ref_gemm"] = torch_gemm(gemm_n)
    log(f"  {res['ref_gemm']}")
    log("our GEMM ...")
    res["gemm"] = our_gemm(device, stream, rng, gemm_n, gemm_n, gemm_n)
    log(f"  {res['gemm']}")
    log("RMSNorm / add+RMSNorm / SiLU*up ...")
    res["rmsnorm"] = norm_bandwidth(device, stream, rng, 8192, 5120, residual=False)
    res["add_rmsnorm"] = norm_bandwidth(device, stream, rng, 8192, 5120, residual=True)
    res["silu_mul"] = silu_bandwidth(device, stream, rng, 4096, 17408)
    res["rmsnorm_decode"] = decode_norm_latency(device, stream, rng)
    res["rmsnorm_decode_pdl"] = decode_norm_latency(device, stream, rng, pdl=True)
    if not args.quick:
        log("model-shaped GEMMs (27B prefill of 7680 tokens: gate_up, down) and the SIMT fallback ...")
        res["gemm_shapes"] = [our_gemm(device, stream, rng, 7680, 34816, 5120),
                              our_gemm(device, stream, rng, 7680, 5120, 17408),
                              our_gemm(device, stream, rng, 2048, 2048, 2048, "gemm_simt")]
    log("launch overhead ...")
    res["launch"] = launch_overhead(device, stream)

    res["kernels"] = {}
    for name in ("rmsnorm_1k", "rmsnorm_5k", "rmsnorm_8k", "rmsnorm_16k", "add_rmsnorm_5k", "add_rmsnorm_8k",
                 "silu_mul", "embedding", "gemm_wgmma", "gemm_simt"):
        kern = launcher(name, device).loaded.kernel
        res["kernels"][name] = {a: kern.attribute(a) for a in ("num_regs", "local_size_bytes", "shared_size_bytes")}
    log(f"  registers / local bytes: {res['kernels']}")

    copy = res["copy"]["gbps"]
    ref = res["ref_gemm"]["tflops"] if res["ref_gemm"] else None
    rows = [
        ("device copy D2D (4 GiB)", f"{copy:.0f} GB/s", "limit"),
        (f"reference GEMM {gemm_n}^3 bf16", f"{ref:.0f} TFLOP/s" if ref else "n/a", "limit"),
        (f"gemm_wgmma {gemm_n}^3 bf16", f"{res['gemm']['tflops']:.0f} TFLOP/s",
         f"{res['gemm']['tflops'] / ref:.1%} of reference" if ref else "n/a"),
    ]
    for g in res.get("gemm_shapes", []):
        rows.append((f"{g['variant']} {g['m']}x{g['n']}x{g['k']}", f"{g['tflops']:.0f} TFLOP/s",
                     f"{g['tflops'] / ref:.1%} of reference" if ref else "n/a"))
    for key, how in (("rmsnorm_decode", "graph"), ("rmsnorm_decode_pdl", "graph, PDL")):
        d = res[key]
        rows.append((f"{d['variant']} 1x5120 (decode; {how})", f"{d['ms'] * 1e3:.2f} us", "latency"))
    for key in ("rmsnorm", "add_rmsnorm", "silu_mul"):
        r = res[key]
        rows.append((f"{r['variant']} {r.get('rows')}x{r.get('n', r.get('inter'))}", f"{r['gbps']:.0f} GB/s",
                     f"{r['gbps'] / copy:.1%} of copy"))
    lo = res["launch"]
    rows.append(("launch host cost", f"typed {lo['typed_launcher_us']:.1f} us, launch() {lo['launch_us']:.1f} us, "
                 f"Launch {lo['prevalidated_Launch_us']:.1f} us", f"GPU {lo['gpu_us_per_tiny_kernel']:.2f} us/kernel"))
    res["table"] = rows
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    print(f"\n{res['date']}  {res['gpu']} ({res['arch']})  spot rel err {res['gemm']['spot_rel_err']:.1e}")
    for name, val, ratio in rows:
        print(f"| {name:<32} | {val:<48} | {ratio:<22} |")


if __name__ == "__main__":
    main()
