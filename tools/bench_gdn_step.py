"""GDN decode step benchmark at the 27B shape (Hk 16, Hv 48, dk = dv = 128), against the device copy
bandwidth of the same run.

    python tools/bench_gdn_step.py [--batch 1 4] [--layers 48] [--reps 20] [--no-pdl] [--probes] [--out F.json]

Cases: `old` = gdn_conv + gdn_step (two launches per layer), `gdn_step` alone, and every fused
`gdn_conv_step*` variant (one launch per layer; `gdn_conv_step_sums` is the one the executor runs after an
accumulating q|k|v|z GEMV: x and z fp32 sums in one row as in the executor's ws['mix_sums'], zeroed once read,
so later replays read zeros; `gdn_conv_step` the same on bf16 inputs, `gdn_conv_step_v1` the first fused kernel,
for A/B). `--probes` adds each of those two with x and z in separate buffers (`<case>@split`), to tell the
inputs' layout from their type, and with a row of their own for every layer (`<case>@layer`: no launch reads
what the one before it wrote). The fused kernels are launched
with PDL as in the executor (each one starts while its predecessor drains; `--no-pdl` serialises them); gdn_conv
and gdn_step do not use PDL. Each case captures `layers` back-to-back layer launches into a CUDA
graph, every layer with its own fp32 state (3 MiB per sequence), conv window and conv weights, so
no layer finds its state in L2 (48 x 3 MiB > the 50 MiB L2), as in decode. Time = median over
replays of (graph time / layers), between events. Bytes per layer = state read + written + the
conv window, activations and conv weights; "% copy" divides that rate by a 1 GiB device-to-device
copy (bytes read + written) timed in the same run.
Cubins come from $INFERNO_KERNEL_DIR (inferno kernels build --arch sm_90a --out DIR).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inferno.cuda.copy import d2d, from_device, h2d, memset_d8  # noqa: E402
from inferno.cuda.device import Device  # noqa: E402
from inferno.cuda.graph import Graph  # noqa: E402
from inferno.cuda.memory import device_alloc  # noqa: E402
from inferno.cuda.stream import Event, Stream  # noqa: E402
from inferno.kernels.gdn_variants import GDN_VARIANTS, GdnConv, GdnConvStep, GdnStep  # noqa: E402
from inferno.kernels.reference import bf16  # noqa: E402

HK, HV, D, K = 16, 48, 128, 4
C, ZW = 2 * HK * D + HV * D, HV * D
ROW = C + ZW + 2 * HV  # one fused projection row: x | z | a | b (the executor's mix_in layout differs; same bytes)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def timed(fn, stream: Stream, reps: int) -> float:
    """Median milliseconds of fn() between events on `stream` (two warm-up calls first)."""
    fn()
    fn()
    stream.synchronize()
    out = []
    for _ in range(reps):
        a, b = Event.create(), Event.create()
        a.record(stream)
        fn()
        b.record(stream)
        b.synchronize()
        out.append(Event.elapsed_ms(a, b))
        a.close()
        b.close()
    return statistics.median(out)


def copy_bandwidth(stream: Stream, nbytes: int = 1 << 30) -> float:
    """GB/s of a device-to-device copy, bytes read + written."""
    src, dst = device_alloc(nbytes, "copy_src"), device_alloc(nbytes, "copy_dst")
    memset_d8(src, 0x3C)
    ms = timed(lambda: d2d(dst, src, nbytes, stream), stream, 20)
    src.free()
    dst.free()
    return 2 * nbytes / ms / 1e6


class Layers:
    """Per-layer states and weights plus the shared activations of one batch size."""

    def __init__(self, nb: int, layers: int, rng: np.random.Generator, probes: bool = False):
        self.nb, self.bufs = nb, []
        up = self._up
        self.mix = up(rng.standard_normal((nb, ROW), np.float32).astype(bf16), "mix")
        self.x, self.z = self.mix, self.mix.view(C * 2, self.mix.nbytes - C * 2, "z")
        self.a = self.mix.view((C + ZW) * 2, self.mix.nbytes - (C + ZW) * 2, "a")
        self.b = self.mix.view((C + ZW + HV) * 2, self.mix.nbytes - (C + ZW + HV) * 2, "b")
        self.qkv = up(np.zeros((nb, C), bf16), "qkv")
        # the `_sums` kernel's inputs: an accumulating GEMV's fp32 sums of x (q|k|v) and z in one row, zeroed once read
        self.sums = up(rng.standard_normal((nb, C + ZW), np.float32), "sums")
        self.sums_z = self.sums.view(C * 4, self.sums.nbytes - C * 4, "sums_z")
        if probes:  # `@split`: x and z in buffers of their own (bf16 and fp32); `@layer`: a row per layer
            self.x_split = up(rng.standard_normal((nb, C), np.float32).astype(bf16), "x_split")
            self.z_split = up(rng.standard_normal((nb, ZW), np.float32).astype(bf16), "z_split")
            self.x_sums_split = up(rng.standard_normal((nb, C), np.float32), "x_sums_split")
            self.z_sums_split = up(rng.standard_normal((nb, ZW), np.float32), "z_sums_split")
            self.mix_layer = [up(rng.standard_normal((nb, ROW), np.float32).astype(bf16), f"mix{i}")
                              for i in range(layers)]
            self.sums_layer = [up(rng.standard_normal((nb, C + ZW), np.float32), f"sums{i}") for i in range(layers)]
        self.out = up(np.zeros((nb, ZW), bf16), "out")
        self.a_log = up(np.log(rng.uniform(1, 16, HV)).astype(np.float32), "a_log")
        self.dt_bias = up(np.log(np.expm1(rng.uniform(1e-3, 0.1, HV))).astype(np.float32), "dt_bias")
        self.norm_w = up(np.ones(D, bf16), "norm_w")
        self.slots = up(np.arange(nb, dtype=np.int32)[::-1].copy(), "slots")
        self.sync = up(np.zeros(nb * HK, np.int32), "sync")
        self.conv_w = [up((0.5 * rng.standard_normal((K, C), np.float32)).astype(bf16), f"conv_w{i}")
                       for i in range(layers)]
        self.conv_st = [up(np.zeros((nb, K - 1, C), bf16), f"conv_state{i}") for i in range(layers)]
        self.state = [up(0.05 * rng.standard_normal((nb, HV, D, D), np.float32), f"state{i}") for i in range(layers)]

    def inputs(self, case: str, layer: int) -> tuple:
        """(x, z, x_stride, z_stride) of a fused case: the bf16 mix row, the fp32 sums row, (`@split`) buffers
        of their own, or (`@layer`) the layer's own row."""
        sums, split = "_sums" in case, case.endswith("@split")
        if case.endswith("@layer"):
            row = (self.sums_layer if sums else self.mix_layer)[layer]
            e, w = (4, C + ZW) if sums else (2, ROW)
            return row, row.view(C * e, row.nbytes - C * e, f"z{layer}"), w, w
        if split:
            return (self.x_sums_split, self.z_sums_split, C, ZW) if sums else (self.x_split, self.z_split, C, ZW)
        return (self.sums, self.sums_z, C + ZW, C + ZW) if sums else (self.x, self.z, ROW, ROW)

    def _up(self, host: np.ndarray, name: str):
        buf = device_alloc(host.nbytes, name)
        h2d(buf, np.ascontiguousarray(host))
        self.bufs.append(buf)
        return buf

    def bytes_per_layer(self, fused: bool, sums: bool = False) -> int:
        """`sums`: x and z read as fp32 and written back as zeros."""
        nb = self.nb
        state = 2 * nb * HV * D * D * 4
        conv = nb * 2 * (K - 1) * C * 2 + K * C * 2  # window read + written, weights
        rest = nb * (ZW + 2 * HV) * 2  # out, a, b
        inputs = nb * (C + ZW) * (8 if sums else 2)  # x, z
        return state + conv + rest + inputs + (0 if fused else 2 * nb * C * 2)  # unfused: qkv written + read

    def free(self) -> None:
        for b in self.bufs:
            b.free()


def run_case(name: str, layers: Layers, n: int, stream: Stream, reps: int, launchers: dict) -> float:
    """Microseconds per layer of `n` back-to-back layers, graph-replayed."""
    L, nb = layers, layers.nb
    strides = dict(a_stride=ROW, b_stride=ROW)
    g = Graph.capture(stream)
    with g:
        for i in range(n):
            if name == "old":
                launchers["gdn_conv"](L.x, L.conv_st[i], L.conv_w[i], L.slots, L.qkv, nb, C, nb, x_stride=ROW,
                                      stream=stream)
            if name in ("old", "gdn_step"):
                launchers["gdn_step"](L.qkv, L.z, L.a, L.b, L.a_log, L.dt_bias, L.norm_w, L.state[i], L.slots, L.out,
                                      nb, HK, HV, nb, 1e-6, z_stride=ROW, stream=stream, **strides)
            if name not in ("old", "gdn_step"):
                x, z, xs, zs = L.inputs(name, i)
                launchers[name.split("@")[0]](x, L.conv_st[i], L.conv_w[i], z, L.a, L.b, L.a_log, L.dt_bias,
                                              L.norm_w, L.state[i], L.slots, L.sync, L.out, nb, HK, HV, nb, 1e-6,
                                              x_stride=xs, z_stride=zs, stream=stream, **strides)
    ge = g.instantiate()
    try:
        ms = timed(lambda: ge.launch(stream), stream, reps)
    finally:
        ge.close()
        g.close()
    out = from_device(L.out, bf16, (nb, ZW)).astype(np.float32)
    if not np.all(np.isfinite(out)):
        raise SystemExit(f"{name}: non-finite outputs")
    if name not in ("old", "gdn_step") and np.any(from_device(L.sync, np.int32, (nb * HK,))):
        raise SystemExit(f"{name}: sync counters not back to zero")
    return ms * 1e3 / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-pdl", action="store_true", help="launch the fused kernels without PDL")
    ap.add_argument("--probes", action="store_true",
                    help="also gdn_conv_step and gdn_conv_step_sums with x and z in separate buffers (@split) and "
                         "with a row per layer (@layer)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    device = Device.open()
    stream = Stream.create()
    stream.pdl = not args.no_pdl  # only PDL-capable kernels (the fused ones) launch early
    fused = [v.name for v in GDN_VARIANTS if v.op == "gdn_conv_step"]
    launchers: dict = {"gdn_conv": GdnConv.for_device(device), "gdn_step": GdnStep.for_device(device)}
    for name in fused:
        try:
            launchers[name] = GdnConvStep.for_device(device, name)
        except Exception as e:  # a variant missing from the kernel dir is reported, not fatal
            log(f"skip {name}: {e}")
    copy = copy_bandwidth(stream)
    log(f"copy bandwidth {copy:.0f} GB/s; fused kernels {'without' if args.no_pdl else 'with'} PDL")
    rng = np.random.default_rng(0)
    rows = []
    for nb in args.batch:
        layers = Layers(nb, args.layers, rng, args.probes)
        try:
            base = None
            probes = [f"{f}@{p}" for p in ("split", "layer") for f in ("gdn_conv_step", "gdn_conv_step_sums")
                      if args.probes and f in launchers]
            for name in ["old", "gdn_step", *[f for f in fused if f in launchers], *probes]:
                try:
                    us = run_case(name, layers, args.layers, stream, args.reps, launchers)
                except Exception as e:
                    log(f"B={nb} {name}: failed: {e}")
                    continue
                nbytes = layers.bytes_per_layer(name not in ("old", "gdn_step"), "_sums" in name)
                gbs = nbytes / us / 1e3
                base = us if name == "old" else base
                row = dict(batch=nb, case=name, us_per_layer=round(us, 3), us_per_step_48=round(48 * us, 1),
                           gb_s=round(gbs, 1), pct_copy=round(100 * gbs / copy, 1),
                           vs_old=round(base / us, 2) if base else None)
                rows.append(row)
                log(f"B={nb} {name:18s} {us:7.2f} us/layer  x48 {48 * us:7.1f} us  {gbs:7.0f} GB/s  "
                    f"{100 * gbs / copy:5.1f} % copy  {'' if not base else f'{base / us:.2f}x vs old'}")
        finally:
            layers.free()
    print("| batch | case | us / layer | us / 48 layers | GB/s | % copy | vs old |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | `{r['case']}` | {r['us_per_layer']:.2f} | {r['us_per_step_48']:.0f} | {r['gb_s']:.0f} "
              f"| {r['pct_copy']:.1f} | {r['vs_old'] or ''} |")
    if args.out:
        args.out.write_text(json.dumps(dict(copy_gb_s=round(copy, 1), pdl=not args.no_pdl, rows=rows), indent=1))
    stream.close()


if __name__ == "__main__":
    main()
