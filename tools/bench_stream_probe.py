"""How fast one launch streams a decode GEMV's weight bytes, per-warp cp.async runs vs per-SM bulk copies.

    python tools/bench_stream_probe.py --build DIR      (on the dev box: the probes' sm_90a cubins)
    python tools/bench_stream_probe.py [--pdl] [--ctas N]  (on the GPU; --ctas: N CTAs, not one per SM)

`cute_kernels/stream_probe.StreamProbe` (memory side only, no decode or math) on the 27B stream-K shapes'
image sizes: CUDA graphs of >= 24 launches over >= 512 MB of copies, median of 15 (tools/bench_gemv.py's
method), us per launch and % of the same-run D2D copy; "tiny" (one 16-byte unit per warp) is a launch's
fixed cost. If the per-SM bulk stream ends its launches much nearer the floor than the per-warp runs, the
stream-K GEMV's tail is the per-warp streams' spread, and a CTA-level ring is the way to cut it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inferno.kernels.registry import Tensor, Variant  # noqa: E402

# (mode, consumer warps, stages, chunk bytes)
CONFIGS = (("warp", 16, 3, 16384), ("warp", 16, 2, 16384), ("bulk", 8, 8, 16384), ("bulk", 8, 4, 32768),
           ("bulk", 16, 6, 32768), ("bulk", 8, 12, 16384), ("bulk", 4, 16, 8192))
SIZES = (("gate_up Q4", 94_699_520), ("down Q5", 58_490_880), ("qkvz Q5", 55_050_240), ("gdn_out Q5", 20_643_840),
         ("tiny", 132 * 16 * 16))


def probe_variant(mode: str, warps: int, stages: int, chunk: int) -> Variant:
    """One StreamProbe configuration as a (benchmark-only, unregistered) variant."""
    tag = f"{mode}{warps}_s{stages}" + (f"_c{chunk // 1024}k" if mode == "bulk" else "")
    return Variant(
        name=f"stream_probe_{tag}", op="stream_probe", source="cute_kernels.stream_probe", cls="StreamProbe",
        config=dict(mode=mode, warps=warps, stages=stages, chunk=chunk), archs=("sm_90a",),
        args=(Tensor("src", "i32", ("NW",), (1,)), Tensor("out", "i32", ("NO",), (1,))),
        grid=("SMS", "1", "1"), divisibility={"NW": 4}, pdl=True,
        summary=f"benchmark: stream NW words once ({tag})")


def main() -> None:
    from bench_gemv import Weights, graph_ms, open_bench, probe_args

    a = probe_args(__doc__, lambda: [probe_variant(*c) for c in CONFIGS],
                   ((("--ctas",), dict(type=int, default=0,
                                       help="launch this many CTAs (one an SM; default: every SM)")),))
    from inferno.cuda.launch import launch
    from inferno.cuda.memory import device_alloc
    from inferno.cuda.params import TensorArg
    from inferno.kernels.cache import load

    dev, stream, rng, copy = open_bench(a.pdl)
    probes = {c: load(probe_variant(*c), dev) for c in CONFIGS}
    out = device_alloc(4 * dev.sm_count * 1024, "out")
    names = [probe_variant(*c).name.removeprefix("stream_probe_") for c in CONFIGS]
    ctas = a.ctas or dev.sm_count
    if not 1 <= ctas <= dev.sm_count:  # out holds one CTA per SM
        raise SystemExit(f"--ctas must be 1..{dev.sm_count} (one CTA an SM on this {dev.name}), got {ctas}")
    print(f"\ncopy {copy:.0f} GB/s; {dev.name}; PDL {'on' if a.pdl else 'off'}; {ctas} CTAs; us per launch "
          "(% of copy)")
    print("| bytes | MB | floor us | " + " | ".join(names) + " |")
    print("|---" * (3 + len(names)) + "|", flush=True)
    for label, nbytes in SIZES:
        w = Weights("raw", 0, 0, rng.integers(0, 256, nbytes, dtype=np.uint8))
        n = max(len(w.bufs), 24)
        cells = []
        for c in CONFIGS:
            p = probes[c]

            def one(i, p=p):
                args = [TensorArg(w.bufs[i % len(w.bufs)].ptr, (nbytes // 4,)), TensorArg(out.ptr, (out.nbytes // 4,))]
                launch(p.kernel, (ctas, 1, 1), p.manifest.block, p.layout.pack(args), p.manifest.smem, stream)

            us = 1000 * graph_ms(one, n, stream) / n
            cells.append(f"{us:.1f} ({100 * nbytes / copy / 1e3 / us:.0f} %)")
        w.free()
        print(f"| {label} | {nbytes / 1e6:.1f} | {nbytes / copy / 1e3:.1f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
