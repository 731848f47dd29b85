"""gdn_chunk (GDN chunked prefill) time per vsplit at the 27B shape (Hk 16, Hv 48, dk = dv = 128).

    python tools/bench_gdn_prefill.py [--tokens 1024 4096] [--vsplit 1 2 4] [--reps 20] [--layers 48]

One sequence, T tokens, random SiLU'd qkv, z, a|b (fused, as the executor passes them), a nonzero
state. Each case: two warm-up launches, then `reps` samples of 5 back-to-back launches between CUDA
events on one stream; prints the median and min ms per launch, the mma TFLOP/s, x layers (ms per
prompt chunk of the model) and the speed-up over vsplit 1 as a table (stdout; progress on stderr).
Then one launch from the initial state, whose output is compared with vsplit 1's (relative L2; a
sanity check — tests/gpu/test_kernels_gdn_prefill.py is the test). Kernels load from the kernel
cache ($INFERNO_KERNEL_DIR), built there first when the CuTe DSL is installed; elsewhere build them
beforehand: python -c "from pathlib import Path; from inferno.kernels.build import build_all;
from inferno.kernels.gdn_prefill_variants import GDN_PREFILL_VARIANTS as P, GDN_CHUNK_VSPLIT_VARIANTS as V;
build_all([*P, *V], ['sm_90a'], Path('DIR'))".
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inferno.cuda.copy import from_device, h2d  # noqa: E402
from inferno.cuda.device import Device  # noqa: E402
from inferno.cuda.memory import DeviceBuffer, device_alloc  # noqa: E402
from inferno.cuda.stream import Event, Stream  # noqa: E402
from inferno.kernels.cache import load  # noqa: E402
from inferno.kernels.gdn_prefill_variants import (DEFAULT_VSPLIT, HEAD_DIM, VSPLITS, GdnChunk,  # noqa: E402
                                                  chunk_variant)
from inferno.kernels.reference import bf16  # noqa: E402

HK, HV, D = 16, 48, HEAD_DIM
N_SLOTS, SLOT = 2, 1
INNER = 5  # launches per timed sample (hides the host's launch latency behind the GPU's work)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _up(host: np.ndarray, name: str, bufs: list) -> DeviceBuffer:
    buf = device_alloc(host.nbytes, name)
    bufs.append(buf)
    h2d(buf, np.ascontiguousarray(host))
    return buf


def _inputs(rng: np.random.Generator, t: int, bufs: list) -> tuple[list, dict, np.ndarray]:
    cq, zw = 2 * HK * D + HV * D, HV * D
    x = rng.standard_normal((t, cq), np.float32)
    qkv = (x / (1 + np.exp(-x))).astype(bf16)
    z = rng.standard_normal((t, zw), np.float32).astype(bf16)
    ab = rng.standard_normal((t, 2 * HV), np.float32).astype(bf16)
    a_log = np.log(rng.uniform(1, 16, HV)).astype(np.float32)
    dt_bias = np.log(np.expm1(rng.uniform(1e-3, 0.1, HV))).astype(np.float32)
    w = (1 + 0.2 * rng.standard_normal(D, np.float32)).astype(bf16)
    state = 0.1 * rng.standard_normal((N_SLOTS, HV, D, D), np.float32)
    dab = _up(ab, "ab", bufs)
    args = [_up(qkv, "qkv", bufs), _up(z, "z", bufs), dab, DeviceBuffer(dab.ptr + HV * 2, dab.nbytes - HV * 2, "b"),
            _up(a_log, "a_log", bufs), _up(dt_bias, "dt_bias", bufs), _up(w, "norm_w", bufs),
            _up(state, "state", bufs), _up(np.zeros((t, zw), bf16), "out", bufs)]
    return args, dict(a_stride=2 * HV, b_stride=2 * HV), state


def _time(fn, stream: Stream, reps: int) -> list[float]:
    """ms per launch: `reps` samples of INNER back-to-back launches between two events."""
    fn()
    fn()
    stream.synchronize()
    out = []
    for _ in range(reps):
        a, b = Event.create(), Event.create()
        a.record(stream)
        for _ in range(INNER):
            fn()
        b.record(stream)
        b.synchronize()
        out.append(Event.elapsed_ms(a, b) / INNER)
        a.close()
        b.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--vsplit", type=int, nargs="+", default=list(VSPLITS), choices=VSPLITS)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=48, help="GDN layers per prompt chunk (27B: 48)")
    args = ap.parse_args()

    device = Device.open()
    log(f"device {device.name} ({device.arch}), Hk {HK} Hv {HV}, default vsplit {DEFAULT_VSPLIT}")
    chunks = {}
    for n in args.vsplit:
        log(f"loading {chunk_variant(n).name} (vsplit {n})")
        chunks[n] = GdnChunk(load(chunk_variant(n), device))
    stream = Stream.create()
    rng = np.random.default_rng(0)
    rows = []
    for t in args.tokens:
        bufs: list[DeviceBuffer] = []
        try:
            dev_args, strides, state0 = _inputs(rng, t, bufs)
            base, ref = None, None
            for n in args.vsplit:
                log(f"T={t} vsplit={n}")

                def run(k=chunks[n]):
                    k(*dev_args, t, HK, HV, N_SLOTS, SLOT, 1e-6, stream=stream, **strides)

                ms = _time(run, stream, args.reps)
                h2d(dev_args[7], state0)  # one launch from the initial state, for the comparison
                run()
                stream.synchronize()
                out = from_device(dev_args[-1], np.uint16, (t, HV * D)).view(bf16).astype(np.float32)
                finite = bool(np.all(np.isfinite(out)))
                ref = out if n == 1 else ref
                diff = float(np.linalg.norm(out - ref) / np.linalg.norm(ref)) if ref is not None else None
                med = statistics.median(ms)
                base = med if n == 1 else base
                flops = HV * -(-t // 64) * 2 * 64 * (128 * 128 * 2 + 64 * 128 * 2 + 128 * 64 + 128 * 128)
                rows.append((t, n, med, min(ms), flops / med / 1e9, med * args.layers, finite,
                             (base / med) if base else None, diff))
        finally:
            for b in bufs:
                b.free()
    stream.close()

    print(f"gdn_chunk, 27B shape (Hk {HK}, Hv {HV}, dk = dv = {D}), {device.name}, median of {args.reps}")
    print(f"| T | vsplit | CTAs | ms (median) | ms (min) | mma TFLOP/s | x{args.layers} layers ms | vs vsplit 1 "
          f"| out rel. diff to vsplit 1 | outputs finite |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for t, n, med, mn, tf, total, finite, up, diff in rows:
        sp = f"{up:.2f}x" if up else "-"
        df = f"{diff:.1e}" if diff is not None else "-"
        print(f"| {t} | {n} | {HV * n} | {med:.3f} | {mn:.3f} | {tf:.1f} | {total:.1f} | {sp} | {df} | {finite} |")
    return 0 if all(r[6] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
