"""Gated-attention decode per layer on the live GPU: the first launch sequence vs the fused kernels, one run.

    python tools/bench_attn_decode.py [--model 27b,35b] [--contexts 8192,65536] [--max-context 262144]
                                      [--layers N] [--no-pdl] [--baselines] [--out bench_attn.json]

One decode step's attention layers back to back (each layer with its own KV pool, so nothing is
served from L2 that a real step reads from HBM), batch 1, captured as a CUDA graph on a stream with
programmatic dependent launch (as the executor runs a step; `--no-pdl`: plain launches), timed by
events around 16 replays. Per layer and context:

  old    attn_qk_prep + attn_decode_g<G> + attn_combine: the first executor's sequence (3 launches)
  fused  attn_decode_g<G>_fused + attn_combine (2 launches: prep folded into the decode, the first
         K/V blocks issued before the PDL wait)
  fused+early  the same with attn_combine_early (lens and gate loaded before the combine's PDL wait),
         at the executor's split count, half and a quarter of it (longer splits: more pages per CTA)
  sums   attn_decode_g<G>_fused_sums + attn_combine_sums: the executor's pair when the projection GEMV
         accumulates (fp32 sums in, zeroed by the combine)
  fused s3+early  the same with three K/V stages (sm_90a)
  `--baselines` adds the previous decode kernels (`_pipelined` + `attn_combine_2pass`, `_s3`).

The split count is the executor's (`default_splits(max_context, 1, n_kv_heads, sm_count)`: fixed for
the graph's life, so at 8K it is the same as at 64K). Each row gives µs per layer for the whole
sequence and without the combine, KV GB/s and the share of this run's device copy rate (read + write
bytes). The last lines are a short table: old vs the fastest other row per model and context. Needs the
cubins of attn_qk_prep, attn_decode_g<G>{,_fused,_fused_sums,_fused_s3} and attn_combine{,_early,_sums} in
$INFERNO_KERNEL_DIR (`python -m inferno.kernels.attn_variants DIR sm_90a`; --baselines also `_pipelined`, `_s3`,
`attn_combine_2pass`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inferno.checkpoint.presets import get_preset  # noqa: E402
from inferno.cuda.copy import memset_d8, to_device  # noqa: E402
from inferno.cuda.device import Device  # noqa: E402
from inferno.cuda.graph import Graph  # noqa: E402
from inferno.cuda.memory import DeviceBuffer, device_alloc  # noqa: E402
from inferno.cuda.stream import Stream  # noqa: E402
from inferno.kernels import attn_variants as av  # noqa: E402
from inferno.kernels.ceilings import copy_bandwidth, time_ms  # noqa: E402
from inferno.kernels.kv_layout import KVLayout  # noqa: E402
from inferno.model.config import ModelConfig  # noqa: E402

PRESETS = {"27b": "qwen3.6-27b", "35b": "qwen3.6-35b-a3b"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def replay_us(stream: Stream, enqueue: Callable[[], None]) -> float:
    """Median device µs of one replay of the work `enqueue()` puts on `stream`, captured as a CUDA
    graph (as the executor runs a step), events around 16 replays at a time."""
    with Graph.capture(stream) as g:
        enqueue()
    ge = g.instantiate()
    try:
        return time_ms(lambda: ge.launch(stream), stream, reps=10, inner=16) * 1e3
    finally:
        stream.synchronize()
        ge.close()
        g.close()


class Inputs:
    """Device buffers of one batch-1 step: zero projections and norms (so every score is 0), lens,
    positions, a page table over `pages` pages and one KV pool per layer."""

    def __init__(self, cfg: ModelConfig, layers: int, context: int):
        hq, hkv = cfg.n_heads, cfg.n_kv_heads
        lay = KVLayout(hkv)
        self.pages = lay.pages_for(context)
        self.pools = [device_alloc(self.pages * lay.page_bytes, f"kv layer {i}") for i in range(layers)]
        self.table = to_device(None, np.arange(self.pages, dtype=np.int32).reshape(1, self.pages), "page_table")
        self.lens = to_device(None, np.array([context], np.int32), "lens")
        self.positions = to_device(None, np.array([context - 1], np.int32), "positions")
        zeros = {"q_proj": hq * 512, "gate": hq * 512, "k": hkv * 512, "v": hkv * 512, "q_norm": 512, "k_norm": 512,
                 "q": hq * 1024, "q_proj32": hq * 1024, "gate32": hq * 1024, "k32": hkv * 1024, "v32": hkv * 1024}
        self.z = {name: device_alloc(n, name) for name, n in zeros.items()}
        self.out = device_alloc(hq * 512, "out")
        for buf in (*self.pools, *self.z.values()):
            memset_d8(buf, 0)

    def free(self) -> None:
        for buf in (*self.pools, *self.z.values(), self.table, self.lens, self.positions, self.out):
            buf.free()


def sequence(kind: str, dec, comb, prep, inp: Inputs, cfg: ModelConfig, po: DeviceBuffer, pl: DeviceBuffer,
             splits: int, stream: Stream) -> Callable[[int, bool], None]:
    """layer(i, with_combine) enqueues layer i's attention: prep + decode (kind 'old') or the fused kernel."""
    z, hq, hkv = inp.z, cfg.n_heads, cfg.n_kv_heads
    geo = dict(batch=1, n_heads=hq, n_kv_heads=hkv, table_width=inp.pages, stream=stream)
    norm = dict(eps=cfg.rms_eps, rope_theta=cfg.rope_theta)

    def layer(i: int, with_combine: bool) -> None:
        kv = inp.pools[i]
        if kind == "sums":  # fp32 sums in (an accumulating projection GEMV's), zeroed by the combine
            dec(z["q_proj32"], z["k32"], z["v32"], z["q_norm"], z["k_norm"], inp.positions, inp.lens, inp.table, kv,
                z["q"], po, pl, splits=splits, **norm, **geo)
            if with_combine:
                comb(po, pl, inp.lens, z["gate32"], inp.out, batch=1, n_heads=hq, splits=splits, stream=stream,
                     zero=(z["q_proj32"], z["k32"], z["v32"]), n_kv_heads=hkv)
            return
        if kind == "fused":
            dec(z["q_proj"], z["k"], z["v"], z["q_norm"], z["k_norm"], inp.positions, inp.lens, inp.table, kv, z["q"],
                po, pl, splits=splits, **norm, **geo)
        else:
            prep(z["q_proj"], z["k"], z["v"], z["q_norm"], z["k_norm"], inp.positions, inp.lens, inp.table, kv, z["q"],
                 q_head_stride=256, **norm, **geo)
            dec(z["q"], inp.lens, inp.table, kv, po, pl, splits=splits, **geo)
        if with_combine:
            comb(po, pl, inp.lens, z["gate"], inp.out, batch=1, n_heads=hq, splits=splits, stream=stream)

    return layer


def bench_context(dev: Device, stream: Stream, model: str, cfg: ModelConfig, layers: int, context: int,
                  max_context: int, copy_gbps: float, baselines: bool) -> list[dict]:
    hq, hkv = cfg.n_heads, cfg.n_kv_heads
    base = av.default_splits(max_context, 1, hkv, dev.sm_count)
    name = av.decode_variant(hq, hkv).name
    fused = av.decode_variant(hq, hkv, fused=True).name
    runs = [("old", "old", name, av.COMBINE.name, base)]
    runs.append(("fused", "fused", fused, av.COMBINE.name, base))
    early = av.COMBINE_EARLY.name
    runs += [("fused+early", "fused", fused, early, s)
             for s in sorted({base, max(1, base // 2), max(1, base // 4)}, reverse=True)]
    runs.append(("sums", "sums", f"{fused}_sums", av.COMBINE_SUMS.name, base))  # the executor's (deferred inputs)
    if dev.arch == "sm_90a":
        runs.append(("fused s3+early", "fused", f"{fused}_s3", early, base))
    if baselines:
        runs.append(("pipelined", "old", f"{name}_pipelined", "attn_combine_2pass", base))
        if dev.arch == "sm_90a":
            runs.append(("old s3", "old", f"{name}_s3", av.COMBINE.name, base))
    inp = Inputs(cfg, layers, context)
    prep = av.AttnQkPrep.load(av.PREP.name, dev)
    kv_bytes = context * KVLayout(hkv).token_bytes
    rows = []
    try:
        for label, kind, dec_name, comb_name, splits in runs:
            dec = (av.AttnDecodeFused if kind in ("fused", "sums") else av.AttnDecode).load(dec_name, dev)
            comb = av.AttnCombine.load(comb_name, dev)
            po_b, pl_b = av.partial_bytes(1, hq, splits)
            po, pl = device_alloc(po_b, "part_o"), device_alloc(pl_b, "part_lse")
            try:
                layer = sequence(kind, dec, comb, prep, inp, cfg, po, pl, splits, stream)
                both, alone = (replay_us(stream, lambda c=c: [layer(i, c) for i in range(layers)]) / layers
                               for c in (True, False))
            finally:
                po.free()
                pl.free()
            pages = -(-context // 64)
            used = -(-pages // -(-pages // splits))
            row = dict(model=model, kernels=label, decode=dec_name, combine=comb_name, context=context, splits=splits,
                       used_splits=used, pages_per_cta=-(-pages // splits), us_per_layer=both, no_combine_us=alone,
                       combine_us=both - alone, kv_mb=kv_bytes / 1e6, kv_gbps=kv_bytes / both / 1e3,
                       pct_copy=100 * kv_bytes / both / 1e3 / copy_gbps)
            rows.append(row)
            log(f"{model} {label:9s} {dec_name:26s} ctx {context:6d} splits {splits:3d} ({used:3d} used, "
                f"{row['pages_per_cta']:2d} pages per CTA): {both:7.2f} us/layer (without combine {alone:6.2f}), "
                f"{row['kv_gbps']:6.0f} GB/s = {row['pct_copy']:5.1f} % of copy")
    finally:
        inp.free()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="27b,35b", help="comma-separated: 27b, 35b")
    ap.add_argument("--contexts", default="8192,65536", help="comma-separated context lengths")
    ap.add_argument("--max-context", type=int, default=262144, help="the executor's max context (sets splits)")
    ap.add_argument("--layers", type=int, default=0, help="attention layers per step (default: the model's)")
    ap.add_argument("--no-pdl", action="store_true", help="plain launches (no programmatic dependent launch)")
    ap.add_argument("--baselines", action="store_true", help="also the previous decode kernels")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    a = ap.parse_args()
    models = [m.strip() for m in a.model.split(",") if m.strip()]
    bad = [m for m in models if m not in PRESETS]
    if bad:
        sys.exit(f"error: unknown model {', '.join(bad)}; choose from {', '.join(PRESETS)}")

    dev = Device.open()
    stream = Stream.create()
    stream.pdl = not a.no_pdl
    copy = copy_bandwidth(stream, 1 << 30)["gbps"]
    log(f"{dev.name}: {dev.sm_count} SMs, copy {copy:.0f} GB/s (read + write), PDL {'off' if a.no_pdl else 'on'}")
    rows = []
    for model in models:
        cfg = ModelConfig.from_hf(get_preset(PRESETS[model]).text)
        layers = a.layers or len(cfg.attention_layers)
        log(f"{model}: {cfg.n_heads} q / {cfg.n_kv_heads} kv heads, {layers} attention layers per step")
        for ctx in (int(c) for c in a.contexts.split(",")):
            rows += bench_context(dev, stream, model, cfg, layers, ctx, max(a.max_context, ctx), copy, a.baselines)
    print("| model | kernels | context | splits (used) | us / layer | without combine | KV GB/s | % of copy |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['kernels']} `{r['decode']}` + `{r['combine']}` | {r['context']} "
              f"| {r['splits']} ({r['used_splits']}) | {r['us_per_layer']:.2f} | {r['no_combine_us']:.2f} "
              f"| {r['kv_gbps']:.0f} | {r['pct_copy']:.1f} |")
    print(f"\nold = prep + decode + combine at the executor's splits; new = the fastest other row "
          f"(copy {copy:.0f} GB/s, PDL {'off' if a.no_pdl else 'on'})")
    print("| model | context | old us (% copy) | new us (% copy) | new kernel, splits | speed-up |")
    print("|---|---|---|---|---|---|")
    for key in dict.fromkeys((r["model"], r["context"]) for r in rows):
        old = next(r for r in rows if (r["model"], r["context"]) == key and r["kernels"] == "old")
        new = min((r for r in rows if (r["model"], r["context"]) == key and r["kernels"] != "old"),
                  key=lambda r: r["us_per_layer"])
        print(f"| {key[0]} | {key[1]} | {old['us_per_layer']:.2f} ({old['pct_copy']:.0f} %) "
              f"| {new['us_per_layer']:.2f} ({new['pct_copy']:.0f} %) | {new['decode']}, {new['splits']} "
              f"| {old['us_per_layer'] / new['us_per_layer']:.2f}x |")
    if a.out:
        a.out.write_text(json.dumps(dict(copy_gbps=copy, pdl=not a.no_pdl, rows=rows), indent=1))
    stream.synchronize()
    stream.close()


if __name__ == "__main__":
    main()
