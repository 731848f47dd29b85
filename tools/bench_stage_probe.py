"""How long a decode GEMV's CTAs take to stage x, with every SM reading the same L2 lines or its own copy.

    python tools/bench_stage_probe.py --build DIR   (on the dev box: the probes' sm_90a cubins)
    python tools/bench_stage_probe.py [--pdl]       (on the GPU)

`cute_kernels/stage_probe.StageProbe` on the 27B x sizes (10 KB: a 5120-wide bf16 x; 30 KB: x plus the
deferred residual's fp32 sums; 34 KB: the MLP's 17408-wide act), x read from 1, 4 or 132 copies (CTA % R),
with and without a ring prologue of DRAM loads in flight. CUDA graphs of 64 launches, median of 15: us per
launch, and from the last launch the per-CTA ns from the wait to the staging barrier (median / max).
If R = 132 stages much faster than R = 1, the shared lines are the cost and multicast (or replicas) pays.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inferno.kernels.registry import Tensor, Variant  # noqa: E402

STRIDE = 36864
CONFIGS = tuple((nb, r, ring) for ring in (False, True) for nb in (10240, 30720, 34816) for r in (1, 4, 132))
LAUNCHES = 64
W_STEP = 9 << 20  # weight bytes a launch's ring prologue reads (132 x 16 warps x 4 KB), rounded up


def probe_variant(nbytes: int, replicas: int, ring: bool) -> Variant:
    """One StageProbe configuration as a (benchmark-only, unregistered) variant."""
    tag = f"{nbytes // 1024}k_r{replicas}" + ("_ring" if ring else "")
    return Variant(
        name=f"stage_probe_{tag}", op="stage_probe", source="cute_kernels.stage_probe", cls="StageProbe",
        config=dict(nbytes=nbytes, replicas=replicas, stride=STRIDE, ring=ring), archs=("sm_90a",),
        args=(Tensor("x", "i32", ("NX",), (1,)), Tensor("w", "i32", ("NW",), (1,)),
              Tensor("out", "i32", ("NO",), (1,))),
        grid=("SMS", "1", "1"), divisibility={"NX": 4, "NW": 4}, pdl=True,
        summary=f"benchmark: stage x in every CTA ({tag})")


def main() -> None:
    from bench_gemv import graph_ms, open_bench, probe_args

    a = probe_args(__doc__, lambda: [probe_variant(*c) for c in CONFIGS])
    from inferno.cuda.copy import from_device, to_device
    from inferno.cuda.launch import launch
    from inferno.cuda.memory import device_alloc
    from inferno.cuda.params import TensorArg
    from inferno.kernels.cache import load

    dev, stream, rng, copy = open_bench(a.pdl)
    if dev.sm_count != 132:
        raise SystemExit(f"the probe is laid out for 132 SMs; {dev.name} has {dev.sm_count}")
    x = to_device(None, rng.integers(0, 1 << 30, 132 * STRIDE // 4, dtype=np.int32), "x")
    w = device_alloc(LAUNCHES * W_STEP, "w")
    out = device_alloc(4 * (132 + 132 * 512), "out")
    print(f"\ncopy {copy:.0f} GB/s; {dev.name}; PDL {'on' if a.pdl else 'off'}; us per launch, then the last "
          "launch's per-CTA staging ns (median / max)")
    print("| x KB | ring | R = 1 | R = 4 | R = 132 |")
    print("|---|---|---|---|---|", flush=True)
    for ring in (False, True):
        for nb in (10240, 30720, 34816):
            cells = []
            for r in (1, 4, 132):
                p = load(probe_variant(nb, r, ring), dev)

                def one(i, p=p):
                    args = [TensorArg(x.ptr, (x.nbytes // 4,)), TensorArg(w.ptr + (i % LAUNCHES) * W_STEP, (W_STEP // 4,)),
                            TensorArg(out.ptr, (out.nbytes // 4,))]
                    launch(p.kernel, (132, 1, 1), p.manifest.block, p.layout.pack(args), p.manifest.smem, stream)

                us = 1000 * graph_ms(one, LAUNCHES, stream) / LAUNCHES
                ns = from_device(out, np.int32, (out.nbytes // 4,))[:132]
                cells.append(f"{us:.2f} ({np.median(ns):.0f} / {ns.max()})")
            print(f"| {nb // 1024} | {'yes' if ring else 'no'} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
