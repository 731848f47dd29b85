"""Quantized decode GEMV benchmark on the live GPU, against the device copy bandwidth of the same run.

    python tools/bench_gemv.py [--out bench_gemv.json] [--quick] [--tune] [--compare]
    python tools/bench_gemv.py --build DIR [--tune] [--compare]   (build those extra variants)
    python tools/bench_gemv.py --mma [--mma-tune] [--out f.json]   (tiled tensor-core GEMV vs this one)
    python tools/bench_gemv.py --build DIR --mma [--mma-tune]      (build the variants --mma times)
    python tools/bench_gemv.py --xs [--pdl] [--build DIR]   (x-in-shared-memory and stream-K members, T = 1)
    python tools/bench_gemv.py --nvfp4 [--pdl] [--build DIR]   (NVFP4: tensor-core members vs CUDA-core, T = 1)
    python tools/bench_gemv.py --probe [--pdl] [--build DIR]   (stream-K: where a launch's fixed cost goes)

Each case replays a CUDA graph of back-to-back launches that cycle over enough copies of the
weights (>= 512 MB in all) that no launch finds its weights in L2, as in decode. Time = median
over replays of (graph time / launches). GB/s counts weight + x + y (+ r) bytes once.
Copy bandwidth: a 1 GiB device-to-device copy, bytes read + written. --tune adds rows/threads
alternatives of the T=1 kernels, --compare the old-constant and 8-row swiglu ones. Prints a
table, then markdown rows. --mma times the tensor-core GEMV (`gemv_mma_*`, weights in `tile16-v1`)
against the CUDA-core one (row-split payload) at T = 1 and 8 on the 27B shapes (--mma-tune adds
every K-split member at T = 1) and prints a comparison table last (it replaces the default, --tune
and --compare cases). --nvfp4 times the NVFP4 tensor-core family (`gemv_mma_nvfp4_*`, weights in
`tile16-nvfp4-v1`), each of its members and the tuning shapes against the CUDA-core NVFP4 GEMV
(`gemv_nvfp4_t1*`, the payload as is) on the 27B NVFP4 shapes, and prints its own table last.
--probe times, on the 27B stream-K shapes, the default stream-K member against its probes (wrong
results, timing only): `_probe_nochain` (no unit counters / finishing read-back at the end of a run)
`_probe_empty` (x staged, nothing streamed: a launch's fixed cost) and `_probe_nocompute` (the ring
streamed, nothing decoded or multiplied), and prints what each part costs per launch.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inferno.artifact.formats.groupwise import geometry  # noqa: E402
from inferno.cuda.copy import d2d, memset_d8, to_device  # noqa: E402
from inferno.cuda.device import Device  # noqa: E402
from inferno.cuda.graph import Graph  # noqa: E402
from inferno.cuda.memory import device_alloc  # noqa: E402
from inferno.cuda.stream import Event, Stream  # noqa: E402
from inferno.kernels import qlayout as ql  # noqa: E402
from inferno.kernels.reference import bf16  # noqa: E402
from inferno.kernels.cache import load  # noqa: E402
from inferno.kernels import gemv_mma_variants as mv  # noqa: E402
from inferno.kernels.gemv_variants import GemvQ, make_variant, variant_name  # noqa: E402
from inferno.kernels.tiled import tile  # noqa: E402

SHAPES = {"gate_up": (34816, 5120), "down": (5120, 17408), "qkv": (12288, 5120), "head": (248320, 5120),
          "qkvz": (16384, 5120),
          "value_z": (12288, 5120), "query_key": (4096, 5120), "gdn_out": (5120, 6144), "attn_qk": (7168, 5120)}
LAYER_SHAPES = ("gate_up", "down", "qkv")  # the default and --compare cases
# --mma: (shape, epilogue) per format (the head: Q6 only)
MMA_COMBOS = (("gate_up", "plain"), ("gate_up", "swiglu"), ("down", "plain"), ("down", "residual"),
              ("value_z", "plain"), ("query_key", "plain"), ("gdn_out", "residual"), ("attn_qk", "plain"))
FMT_SHORT = {"Q4G64_F16S": "Q4", "Q5G64_F16S": "Q5", "Q6G64_F16S": "Q6", "W8G32_F16S": "W8"}
WORKING_SET = 512 << 20


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def timed(fn, stream: Stream, reps: int) -> float:
    """Median milliseconds of fn() between events on `stream`."""
    fn()
    fn()
    stream.synchronize()
    out = []
    for _ in range(reps):
        a, b = Event(), Event()
        a.record(stream)
        fn()
        b.record(stream)
        b.synchronize()
        out.append(Event.elapsed_ms(a, b))
        a.close()
        b.close()
    return statistics.median(out)


def graph_ms(launch_i, n: int, stream: Stream, reps: int = 15) -> float:
    """Median ms of a CUDA graph of launch_i(0) .. launch_i(n - 1) (launch_i(0) run eagerly first: the
    stream-K members' workspaces)."""
    launch_i(0)
    stream.synchronize()
    with Graph.capture(stream) as g:
        for i in range(n):
            launch_i(i)
    ge = g.instantiate()
    ge.upload(stream)
    ms = timed(lambda: ge.launch(stream), stream, reps)
    ge.close()
    g.close()
    return ms


def probe_args(doc: str, variants, extra: tuple = ()) -> argparse.Namespace:
    """The probe benchmarks' command line: --pdl, `extra` ((flags, argparse kwargs) pairs), and --build DIR
    (the sm_90a cubins of `variants()` built into DIR, then exit)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--build", metavar="DIR", help="build the probes' sm_90a cubins into DIR and exit")
    ap.add_argument("--pdl", action="store_true", help="programmatic dependent launch, as the decode graph")
    for flags, kw in extra:
        ap.add_argument(*flags, **kw)
    a = ap.parse_args()
    if a.build:
        from inferno.kernels.build import build_variant

        for v in variants():
            build_variant(v, "sm_90a", Path(a.build))
        raise SystemExit(0)
    return a


def open_bench(pdl: bool, copy: bool = True) -> tuple:
    """(device, stream launching with PDL or not, seeded rng, same-run D2D copy GB/s or None), logged."""
    dev = Device.open()
    stream = Stream.create()
    stream.pdl = pdl
    rate = copy_bandwidth(stream) if copy else None
    if copy:
        log(f"device {dev.name}  copy bandwidth {rate:.0f} GB/s (1 GiB D2D, read + write); PDL {'on' if pdl else 'off'}")
    return dev, stream, np.random.default_rng(0), rate


def copy_bandwidth(stream: Stream, nbytes: int = 1 << 30) -> float:
    src, dst = device_alloc(nbytes, "copy_src"), device_alloc(nbytes, "copy_dst")
    memset_d8(src, 0x3C)
    ms = timed(lambda: d2d(dst, src, nbytes, stream), stream, 20)
    src.free()
    dst.free()
    return 2 * nbytes / ms / 1e6


class Weights:
    """Copies of one random payload (or its tile16-v1 image; or any prepared image, tiled=False) on the
    device, uploaded once per (format, shape, layout)."""

    def __init__(self, fmt: str, n: int, k: int, pay: np.ndarray, tiled: bool = False):
        if tiled:
            pay = tile(fmt, pay, n, k)
        self.nbytes = pay.nbytes
        first = to_device(None, pay, f"w {fmt}")
        self.bufs = [first]
        for i in range(1, max(2, -(-WORKING_SET // self.nbytes))):
            b = device_alloc(self.nbytes, f"w{i}")
            d2d(b, first, self.nbytes)
            self.bufs.append(b)

    def free(self) -> None:
        for b in self.bufs:
            b.free()


def bench_case(kern: "GemvQ | mv.GemvMma", w: Weights, n: int, k: int, cols: int, stream: Stream, rng) -> float:
    """Microseconds per launch."""
    m = n // 2 if kern.epilogue == "swiglu" else n
    x = to_device(None, rng.standard_normal((cols, k), np.float32).astype(bf16), "x")
    y = device_alloc(cols * m * 2, "y")
    r = device_alloc(cols * m * 2, "r") if kern.epilogue == "residual" else None
    if r is not None:
        memset_d8(r, 0)
    launches = len(w.bufs) * max(1, -(-24 // len(w.bufs)))
    ms = graph_ms(lambda i: kern(w.bufs[i % len(w.bufs)], x, y, n, k, cols, r=r, stream=stream), launches, stream)
    if isinstance(kern, mv.GemvMmaSK):
        kern.free()
    for b in (x, y, r):
        if b is not None:
            b.free()
    return 1000 * ms / launches


def tune_cases() -> list:
    """(variant, format, shape) alternatives: the shift decode; rows/threads/unroll at T = 1."""
    out = []
    for fmt in FMT_SHORT:
        for cols in (1, 4, 8):
            out.append((make_variant(fmt, "plain", cols, inplace=False), fmt, "gate_up"))
    for fmt, shape in (("Q4G64_F16S", "gate_up"), ("Q5G64_F16S", "down"), ("Q4G64_F16S", "qkv")):
        for rows, threads in ((2, 64), (4, 64), (4, 256), (8, 128), (8, 256), (16, 256)):
            out.append((make_variant(fmt, "plain", 1, rows, threads), fmt, shape))
        for rows, threads in ((4, 128), (2, 64), (8, 256)):
            out.append((make_variant(fmt, "plain", 1, rows, threads, unroll=2), fmt, shape))
    return out


def compare_cases() -> list:
    """(variant, format, shape) at T = 1: the old constant form (`_immc`) of every default case, and
    8 rows per CTA for swiglu."""
    out = []
    for fmt in FMT_SHORT:
        for shape in LAYER_SHAPES:
            out.append((make_variant(fmt, "plain", 1, regconst=False), fmt, shape))
        out.append((make_variant(fmt, "swiglu", 1, regconst=False), fmt, "gate_up"))
        out.append((make_variant(fmt, "residual", 1, regconst=False), fmt, "down"))
        out.append((make_variant(fmt, "swiglu", 1, 8, 128), fmt, "gate_up"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="", help="only build the --tune/--compare variants into this dir (needs the DSL)")
    ap.add_argument("--out", default="")
    ap.add_argument("--quick", action="store_true", help="T = 1 and 8 only")
    ap.add_argument("--tune", action="store_true", help="also rows/threads alternatives at T = 1")
    ap.add_argument("--compare", action="store_true",
                    help="also the old-constant (_immc) and 8-row swiglu variants at T = 1")
    ap.add_argument("--mma", action="store_true", help="tensor-core GEMV vs the CUDA-core one (T = 1, 8)")
    ap.add_argument("--mma-tune", action="store_true", help="with --mma: tiles/warps/steps/stages alternatives")
    ap.add_argument("--pdl", action="store_true",
                    help="launch with programmatic dependent launch, as the decode graph does (each launch's "
                         "prologue may overlap the previous one's tail)")
    ap.add_argument("--xs", action="store_true",
                    help="T = 1 on the 27B shapes: CUDA-core, tensor-core family, x-in-shared-memory members")
    ap.add_argument("--nvfp4", action="store_true",
                    help="T = 1 on the 27B shapes, NVFP4: CUDA-core GEMV vs the tensor-core family and members")
    ap.add_argument("--probe", action="store_true",
                    help="stream-K members vs their probes (no flush chain; no stream) on the 27B shapes")
    ap.add_argument("--timeline", action="store_true",
                    help="per-warp timeline of the 27B stream-K shapes (the `timeline` probe; build with --probe)")
    ap.add_argument("--sk", action="append", default=[], metavar="KEY=VALUE",
                    help="--probe / --timeline: the probes of the stream-K member with this ring option "
                         "(stages=N, ctas=N, warps=N)")
    a = ap.parse_args()
    a.ring = ring_options(a.sk)
    if a.timeline:
        timeline_main(a)
        return
    if a.nvfp4:
        nvfp4_main(a)
        return
    extra = (tune_cases() if a.tune else []) + (compare_cases() if a.compare else [])
    if a.mma:
        extra = mma_cases(a.mma_tune)
    if a.xs:
        a.mma = True
        extra = xs_cases()
    if a.probe:
        extra = probe_cases(a.ring)
    if a.build:
        from inferno.kernels.build import build_all

        fam = {f"{v}_k{kw}" for v, _, _ in extra if isinstance(v, str) for kw in mv.KW}
        vs = [v for v, _, _ in extra if not isinstance(v, str)] + [mv.gemv_mma_variant(nm) for nm in sorted(fam)]
        build_all(list({v.name: v for v in vs}.values()), ["sm_90a"], Path(a.build))
        return
    dev, stream, rng, copy = open_bench(a.pdl)
    cols_list = (1, 8) if a.quick else (1, 2, 4, 8)
    cases = []  # (label, kernel, fmt, shape)
    for fmt in ([] if a.mma or a.probe else FMT_SHORT):
        for shape in LAYER_SHAPES:
            for cols in cols_list:
                cases.append((variant_name(fmt, "plain", cols), fmt, shape, cols, None))
        cases += [(variant_name(fmt, "swiglu", c), fmt, "gate_up", c, None) for c in cols_list]
        cases += [(variant_name(fmt, "residual", c), fmt, "down", c, None) for c in cols_list]
    for v, f, shape in extra:
        if isinstance(v, str):  # a tensor-core family: the launcher picks the member
            cases.append((v, f, shape, 8 if "_t8" in v else 1, None))
        else:
            cases.append((v.name, f, shape, v.config["cols"], v))
    cases.sort(key=lambda c: (c[1], c[2], c[0].startswith("gemv_mma_")))  # one upload per (format, shape, layout)
    rows_out = []
    weights: dict = {}
    payload: tuple = (None, None)
    for name, fmt, shape, cols, v in cases:
        n, k = SHAPES[shape]
        key = (fmt, shape, name.startswith("gemv_mma_"))
        if key not in weights:
            for old in weights.values():
                old.free()
            if payload[0] != (fmt, shape):  # one random payload per (format, shape), both layouts
                payload = ((fmt, shape), ql.random_payload(fmt, n, k, rng))
            log(f"uploading {fmt} {shape} {'tile16-v1' if key[2] else 'row-split'}")
            weights = {key: Weights(fmt, n, k, payload[1], tiled=key[2])}
        w = weights[key]
        try:
            cls = mv.GemvMma if name.startswith("gemv_mma_") else GemvQ
            if v is not None and v.config.get("sk"):
                cls = mv.GemvMmaSK
            kern = cls(load(v, dev)) if v is not None else cls.load(name, dev)
            us = bench_case(kern, w, n, k, cols, stream, rng)
        except Exception as e:  # a tuning variant that is not built: report, go on
            log(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
            continue
        m = n // 2 if "swiglu" in name else n
        nbytes = geometry(fmt, (n, k)).nbytes + cols * k * 2 + cols * m * 2 * (2 if "_res" in name else 1)
        gbps = nbytes / us / 1e3
        row = dict(variant=name, format=FMT_SHORT[fmt], shape=f"{shape} [{n}x{k}]", T=cols, us=us,
                   weight_mb=geometry(fmt, (n, k)).nbytes / 1e6, gbps=gbps, pct_copy=100 * gbps / copy,
                   floor_us=nbytes / copy / 1e3)
        rows_out.append(row)
        log(f"{name:<26} {row['shape']:<22} T={cols}  {us:8.2f} us  {gbps:6.0f} GB/s  {row['pct_copy']:5.1f} %")
    for old in weights.values():
        old.free()
    if a.out:
        Path(a.out).write_text(json.dumps(dict(device=dev.name, copy_gbps=copy, rows=rows_out), indent=1))
    print(f"\ncopy bandwidth {copy:.0f} GB/s; {dev.name}")
    print("| variant | shape | T | weight MB | us | floor us | GB/s | % copy |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows_out:
        print(f"| {r['variant']} | {r['shape']} | {r['T']} | {r['weight_mb']:.1f} | {r['us']:.1f} | "
              f"{r['floor_us']:.1f} | {r['gbps']:.0f} | {r['pct_copy']:.0f} |")
    if a.mma:
        print_mma_table(rows_out, copy)
    if a.probe:
        print_probe_table(rows_out, a.ring)


PROBE_COMBOS = (("Q4G64_F16S", "gate_up", "swiglu"), ("Q5G64_F16S", "down", "residual"),
                ("Q5G64_F16S", "qkvz", "plain"), ("Q5G64_F16S", "gdn_out", "residual"))


def probe_cases(ring: dict) -> list:
    """The 27B decode's stream-K GEMVs (gate_up, down, the merged GDN q|k|v|z, the GDN output): the
    default member, its ring alternatives (`mv.sk_variants` at SK_CTAS) and the probes of the member with
    the `ring` options (`--sk`)."""
    out = {}
    for fmt, shape, epi in PROBE_COMBOS:
        for v in ([mv.make_sk_variant(fmt, epi), mv.make_sk_variant(fmt, epi, **ring)]
                  + [a for a in mv.sk_variants(fmt, epi) if a.config["cpa"] and a.config["ctas"] == mv.SK_CTAS]
                  + mv.probe_variants(fmt, epi, **ring)):
            out.setdefault((v.name, shape), (v, fmt, shape))
    return list(out.values())


def ring_options(pairs: list[str]) -> dict:
    """`--sk KEY=VALUE` pairs as make_sk_variant's ring options (stages=N, ctas=N, warps=N)."""
    out = {}
    for kv in pairs:
        key, sep, val = kv.partition("=")
        if not sep or key not in ("stages", "ctas", "warps") or not val.isdigit():
            raise SystemExit(f"--sk takes stages=N, ctas=N or warps=N; not {kv!r}")
        out[key] = int(val)
    return out


TIMELINE_KEPT = 3  # --timeline: the last launches kept (each its own output buffer, so its own workspace)


def timeline_main(a) -> None:
    """Per 27B stream-K shape: the last TIMELINE_KEPT of >= 24 graph-replayed launches of the `timeline`
    probe. Printed for the last one: per warp its stamps (run entered, PDL wait returned, x staged, last flush
    begins, run ends), relative to the earliest wait return, as percentiles over the warps, and per kept
    launch the longest lull in block arrivals (pooled over the warps, between their 5th and 95th
    percentile); `--out F.npz` keeps every kept launch's warps: stamps and block arrivals (us from the
    earliest kept wait return), SM, first block and block count."""
    from inferno.cuda.copy import from_device

    dev, stream, rng, _ = open_bench(a.pdl, copy=False)
    names = ("entered", "waited", "staged", "last flush", "ended")
    saved: dict = {}  # per shape: [launch, warp, ...] stamps (us), SM, first block, block count, arrivals (--out)
    print(f"device {dev.name}; PDL {'on' if a.pdl else 'off'}; us from the last launch's first PDL wait return, "
          "percentiles 0 / 50 / 100 over the warps")
    print("| shape | " + " | ".join(names) + " | staging p50 | last flush p50 | stream end: spread in a CTA "
          "(mean) / of CTA medians / of warp-slot medians | longest arrival lull per kept launch (us) |")
    print("|---|" + "---|" * (len(names) + 4))
    for fmt, shape, epi in PROBE_COMBOS:
        n, k = SHAPES[shape]
        w = Weights(fmt, n, k, ql.random_payload(fmt, n, k, rng), tiled=True)
        kern = mv.GemvMmaSK(load(mv.make_sk_variant(fmt, epi, probe="timeline", **a.ring), dev))
        m = n // 2 if epi == "swiglu" else n
        x = to_device(None, rng.standard_normal((1, k), np.float32).astype(bf16), "x")
        ys = [device_alloc(2 * m, f"y{i}") for i in range(TIMELINE_KEPT)]
        r = device_alloc(2 * m, "r") if epi == "residual" else None
        launches = len(w.bufs) * max(1, -(-24 // len(w.bufs)))
        launches += -launches % TIMELINE_KEPT  # the last TIMELINE_KEPT launches write ys[0], ys[1], ...
        for y in ys:
            kern(w.bufs[0], x, y, n, k, 1, r=r, stream=stream)
        with Graph.capture(stream) as g:
            for i in range(launches):
                kern(w.bufs[i % len(w.bufs)], x, ys[i % TIMELINE_KEPT], n, k, 1, r=r, stream=stream)
        ge = g.instantiate()
        ge.launch(stream)
        stream.synchronize()
        grid, warps = kern.grid(m, k), kern.warps
        words = []
        for y in ys:
            ws = kern._ws[next(key for key in kern._ws if key[0] == int(y.ptr))]
            base = mv.sk_workspace_bytes(m, n, 1)
            base += -(int(ws.ptr) + base) % 8
            raw = from_device(ws, np.uint8, (ws.nbytes,))[base:base + 8 * mv.TIMELINE * grid * warps]
            words.append(raw.view(np.int64).reshape(grid * warps, mv.TIMELINE))
        words = np.stack(words)  # [launch, warp, word]
        origin = words[:, :, 1].min()
        us = (words[:, :, :len(names)] - origin) / 1e3
        arrived = np.arange(words.shape[2] - 7) < (words[:, :, 6:7] >> 32)
        trace = np.where(arrived, (words[:, :, 7:] - origin) / 1e3, np.nan)
        saved[shape] = dict(us=us, sm=words[:, :, 5], first_block=words[:, :, 6] & 0xFFFFFFFF,
                            blocks=words[:, :, 6] >> 32, trace=trace)
        t = us[-1] - us[-1][:, 1].min()
        cols = [f"{np.percentile(t[:, e], 0):.1f} / {np.percentile(t[:, e], 50):.1f} / {t[:, e].max():.1f}"
                for e in range(len(names))]
        end = t[:, 3].reshape(grid, warps)
        within = float((end.max(1) - end.min(1)).mean())
        across = float(np.median(end, 1).max() - np.median(end, 1).min())
        by_slot = float(np.median(end, 0).max() - np.median(end, 0).min())  # a warp's index in its CTA
        lulls = " / ".join(f"{longest_lull(tr[~np.isnan(tr)]):.2f}" for tr in trace)
        print(f"| {shape} [{n}x{k}] | " + " | ".join(cols) +
              f" | {np.median(t[:, 2] - t[:, 1]):.2f} | {np.median(t[:, 4] - t[:, 3]):.2f} | {within:.1f} / {across:.1f}"
              f" / {by_slot:.1f} | {lulls} |")
        ge.close()
        g.close()
        kern.free()
        w.free()
        for b in (x, r, *ys):
            if b is not None:
                b.free()
    if a.out:
        np.savez(a.out, **{f"{sh}_{key}": v for sh, d in saved.items() for key, v in d.items()})
        print(f"wrote {a.out} (per shape, [kept launch, warp, ...]: us (5 stamps), sm, first_block, blocks, trace "
              f"({mv.TIMELINE - 7}): us when each block was in shared memory)")


def longest_lull(arrivals: np.ndarray) -> float:
    """The longest gap between consecutive block arrivals (us, pooled over warps) between their 5th and
    95th percentile: a pause of every warp at once shows as a gap far above the timer's step."""
    if arrivals.size < 2:
        return 0.0
    lo, hi = np.percentile(arrivals, [5, 95])
    a = np.unique(arrivals[(arrivals >= lo) & (arrivals <= hi)])
    return float(np.diff(a).max()) if a.size > 1 else 0.0


def print_probe_table(rows: list, ring: dict) -> None:
    """Per shape: us per launch of the member (with the `ring` options), the flush chain (member - nochain),
    the fixed cost of a launch that streams nothing (empty) and what streaming leaves over the copy floor."""
    members = {mv.make_sk_variant(fmt, epi, **ring).name for fmt, _, epi in PROBE_COMBOS}
    by = {}
    for r in rows:
        base, _, probe = r["variant"].partition("_probe_")
        if base in members:
            by[(r["shape"], probe)] = r
    print("\n| shape | member us (floor) | flush chain us | empty launch us | rest over the floor us | "
          "no compute us | no staging us | no staging, no chain us |")
    print("|---|---|---|---|---|---|---|---|")
    nan = dict(us=float("nan"))
    for shape in dict.fromkeys(r["shape"] for r in rows):
        full, chain, empty, nocomp, nostage, bare = (
            by.get((shape, p)) for p in ("", "nochain", "empty", "nocompute", "nostage", "bare"))
        if not (full and chain and empty):
            continue
        rest = full["us"] - full["floor_us"] - (full["us"] - chain["us"]) - empty["us"]
        print(f"| {shape} | {full['us']:.1f} ({full['floor_us']:.1f}) | {full['us'] - chain['us']:.1f} | "
              f"{empty['us']:.1f} | {rest:.1f} | {(nocomp or nan)['us']:.1f} | {(nostage or nan)['us']:.1f} | "
              f"{(bare or nan)['us']:.1f} |")


def mma_cases(tune: bool) -> list:
    """(variant or family name, format, shape, epilogue, T): per format the CUDA-core and the tiled
    tensor-core GEMV (the family: its launcher picks the K split) at T = 1 and 8 on MMA_COMBOS and the
    Q6 output head; with `tune` every K-split member and `mv.alternatives` at T = 1 (plain, swiglu)."""
    out = []
    for fmt in FMT_SHORT:
        combos = MMA_COMBOS + ((("head", "plain"),) if fmt == "Q6G64_F16S" else ())
        for shape, epi in combos:
            for cols in (1, 8):
                out.append((make_variant(fmt, epi, cols), fmt, shape))
                out.append((mv.variant_name(fmt, epi, cols), fmt, shape))
                if tune and cols == 1 and epi != "residual":
                    out += [(mv.make_variant(fmt, epi, 1, kw), fmt, shape) for kw in mv.KW]
                    out += [(v, fmt, shape) for v in mv.alternatives(fmt, epi, 1)]
    return out


def xs_cases() -> list:
    """Per Q4-Q6 format and 27B (shape, epilogue) at T = 1: the CUDA-core GEMV, the tensor-core family
    and every x-in-shared-memory member (mv.xs_variants)."""
    out = []
    for fmt in ("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S"):
        combos = [c for c in MMA_COMBOS if c[0] not in ("gate_up", "down") or c[1] != "plain"]
        for shape, epi in combos + ([("head", "plain")] if fmt == "Q6G64_F16S" else []):
            out += [(make_variant(fmt, epi, 1), fmt, shape), (mv.variant_name(fmt, epi, 1), fmt, shape)]
            out += [(v, fmt, shape) for v in mv.xs_variants(fmt, epi, 1) + mv.sk_variants(fmt, epi)]
    return out


def _family(name: str) -> str:
    return re.sub(r"(_k\d+(_xs)?(_w\d+_r\d+_p\d+(_xj)?)?|_sk(_p\d+_c\d+_w\d+)?)$", "", name)


def print_mma_table(rows: list, copy: float) -> None:
    """Short table: tiled tensor-core (family) vs CUDA-core rows of the same (format, shape, epilogue, T),
    with the fastest K-split member where measured."""
    def key(r):
        return (_family(r["variant"]).replace("gemv_mma_", "gemv_"), r["shape"], r["T"])

    old = {key(r): r for r in rows if not r["variant"].startswith("gemv_mma_")}
    best: dict = {}
    for r in rows:
        if r["variant"].startswith("gemv_mma_") and r["variant"] != _family(r["variant"]):
            b = best.get(key(r))
            if b is None or r["us"] < b["us"]:
                best[key(r)] = r
    print(f"\ncopy {copy:.0f} GB/s = 100 %")
    print("| format | shape | epilogue | T | CUDA-core us (% copy) | tiled mma us (% copy) | speedup | best member |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if not r["variant"].startswith("gemv_mma_") or r["variant"] != _family(r["variant"]):
            continue
        o, b = old.get(key(r)), best.get(key(r))
        epi = "swiglu" if "_swiglu" in r["variant"] else "residual" if "_res" in r["variant"] else "plain"
        ref = f"{o['us']:.1f} ({o['pct_copy']:.0f} %)" if o else "-"
        sp = f"{o['us'] / r['us']:.2f}x" if o else "-"
        bm = f"{b['variant'][len(_family(b['variant'])) + 1:]} {b['us']:.1f} ({b['pct_copy']:.0f} %)" if b else "-"
        print(f"| {r['format']} | {r['shape']} | {epi} | {r['T']} | {ref} | {r['us']:.1f} ({r['pct_copy']:.0f} %) "
              f"| {sp} | {bm} |")


# ---- --nvfp4 ---------------------------------------------------------------------------------------

NVFP4_COMBOS = (("gate_up", "swiglu"), ("down", "residual"), ("value_z", "plain"), ("query_key", "plain"),
                ("gdn_out", "residual"), ("attn_qk", "plain"))


def nvfp4_cases() -> list:
    """(label, variant or None, shape, epilogue) per 27B shape at T = 1: the CUDA-core GEMV (`core`), the
    tensor-core family (`family`: its launcher picks), every registered member and the tuning shapes."""
    from inferno.kernels import gemv_mma_nvfp4_variants as nv

    out = []
    for shape, epi in NVFP4_COMBOS:
        out += [("core", None, shape, epi), ("family", None, shape, epi)]
        out += [(v.name, v, shape, epi) for v in nv.members(epi) + nv.tune_variants(epi)]
    return out


def nvfp4_payload(n: int, k: int, rng) -> np.ndarray:
    """A random NVFP4 payload: uniform code bits, scales 0.25 .. 4 (E4M3 0x28 .. 0x48), d_w 1000."""
    from inferno.artifact.formats import nvfp4

    codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales = rng.integers(0x28, 0x49, (n, k // 16), dtype=np.uint8)
    return nvfp4.pack(codes, scales, np.float32(1000.0))


def nvfp4_main(a) -> None:
    """--nvfp4: one device run over nvfp4_cases(), a table of every case, then the comparison table."""
    from inferno.artifact.formats import nvfp4
    from inferno.kernels import gemv_mma_nvfp4_variants as nv
    from inferno.kernels.gemv_nvfp4_variants import GemvNvfp4
    from inferno.kernels.gemv_nvfp4_variants import variant_name as core_name
    from inferno.kernels.tiled_nvfp4 import tile as tile_nvfp4

    cases = nvfp4_cases()
    if a.build:
        from inferno.kernels.build import build_all

        vs = {v.name: v for _, v, _, _ in cases if v is not None}
        build_all(list(vs.values()), ["sm_90a"], Path(a.build))
        return
    dev, stream, rng, copy = open_bench(a.pdl)
    rows_out = []
    for shape, epi in NVFP4_COMBOS:
        n, k = SHAPES[shape]
        log(f"uploading NVFP4 {shape} (payload and tile16-nvfp4-v1)")
        pay = nvfp4_payload(n, k, rng)
        wts = {"payload": Weights("NVFP4", n, k, pay), "tiled": Weights("NVFP4", n, k, tile_nvfp4(pay, n, k))}
        m = n // 2 if epi == "swiglu" else n
        wbytes = nvfp4.geometry((n, k)).code_bytes + n * k // 16
        nbytes = wbytes + k * 2 + m * 2 * (2 if epi == "residual" else 1)
        for label, v, s, e in cases:
            if (s, e) != (shape, epi):
                continue
            try:
                if label == "core":
                    kern, w = GemvNvfp4.load(core_name(epi, 1), dev), wts["payload"]
                elif label == "family":
                    kern, w = nv.GemvMmaNvfp4.load(nv.variant_name(epi), dev), wts["tiled"]
                else:
                    cls = nv.GemvMmaNvfp4SK if v.config.get("sk") else nv.GemvMmaNvfp4
                    kern, w = cls(load(v, dev)), wts["tiled"]
                us = bench_case(kern, w, n, k, 1, stream, rng)
            except Exception as ex:  # a tuning variant that is not built: report, go on
                log(f"{label}: {type(ex).__name__}: {str(ex).splitlines()[0][:160]}")
                continue
            gbps = nbytes / us / 1e3
            row = dict(variant=label, shape=f"{shape} [{n}x{k}]", epilogue=epi, us=us, weight_mb=wbytes / 1e6,
                       gbps=gbps, pct_copy=100 * gbps / copy, floor_us=nbytes / copy / 1e3)
            rows_out.append(row)
            log(f"{label:<36} {row['shape']:<22} {us:8.2f} us  {gbps:6.0f} GB/s  {row['pct_copy']:5.1f} %")
        for w in wts.values():
            w.free()
    if a.out:
        Path(a.out).write_text(json.dumps(dict(device=dev.name, copy_gbps=copy, pdl=a.pdl, rows=rows_out), indent=1))
    print(f"\ncopy bandwidth {copy:.0f} GB/s; {dev.name}; PDL {'on' if a.pdl else 'off'}")
    print("| variant | shape | epilogue | weight MB | us | floor us | % copy |")
    print("|---|---|---|---|---|---|---|")
    for r in rows_out:
        print(f"| {r['variant']} | {r['shape']} | {r['epilogue']} | {r['weight_mb']:.1f} | {r['us']:.1f} | "
              f"{r['floor_us']:.1f} | {r['pct_copy']:.0f} |")
    print_nvfp4_table(rows_out)


def print_nvfp4_table(rows: list) -> None:
    """Short table: per shape the CUDA-core GEMV, the tensor-core family and its fastest member."""
    print("\n| shape | epilogue | floor us | CUDA-core us (% copy) | tensor-core family us (% copy) | speedup "
          "| best member |")
    print("|---|---|---|---|---|---|---|")
    for shape, epi in NVFP4_COMBOS:
        rs = [r for r in rows if r["shape"].startswith(shape + " ")]
        core = next((r for r in rs if r["variant"] == "core"), None)
        fam = next((r for r in rs if r["variant"] == "family"), None)
        members = [r for r in rs if r["variant"] not in ("core", "family")]
        best = min(members, key=lambda r: r["us"]) if members else None

        def cell(r):
            return f"{r['us']:.1f} ({r['pct_copy']:.0f} %)" if r else "-"

        sp = f"{core['us'] / fam['us']:.2f}x" if core and fam else "-"
        floor = f"{rs[0]['floor_us']:.1f}" if rs else "-"
        bm = f"{best['variant']} {cell(best)}" if best else "-"
        print(f"| {shape} | {epi} | {floor} | {cell(core)} | {cell(fam)} | {sp} | {bm} |")


if __name__ == "__main__":
    main()
