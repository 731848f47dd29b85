"""Decode attention (split-K partials + combine) per layer on the live GPU: old vs new kernels in one run.

    python tools/bench_attn_decode.py [--model 27b|35b] [--contexts 8192,65536] [--max-context 262144]
                                      [--layers N] [--out bench_attn.json]

One decode step's attention layers back to back, captured as a CUDA graph like the executor's step
(events around 16 replays; each layer has its own KV pool, so nothing is served from L2 that a
real step would read from HBM; decode + combine and decode alone are separate graphs), batch 1, the
split count the executor uses (`default_splits(max_context, 1, n_kv_heads, sm_count)`) plus half
and twice that for the new kernel. Kernels: `regs` (K/V through registers + serial combine),
`pipelined` (cp.async K/V, fp32 CUDA-core dots, two-pass combine: the previous defaults), `mma` (the
default: QK and PV on tensor cores; once with the two-pass combine, then with the default one-pass
`attn_combine`) and `mma s3` (three K/V stages, sm_90a). Prints us per layer for decode + combine
and for decode alone, KV bytes per second and their share of this run's device copy rate (read +
write bytes). Needs prebuilt cubins
($INFERNO_KERNEL_DIR) for attn_decode_g<G>{,_s3,_pipelined,_regs} and attn_combine{,_2pass,_serial}
(`python -m inferno.kernels.attn_variants DIR sm_90a`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inferno.checkpoint.presets import get_preset  # noqa: E402
from inferno.cuda.copy import memset_d8, to_device  # noqa: E402
from inferno.cuda.device import Device  # noqa: E402
from inferno.cuda.graph import Graph  # noqa: E402
from inferno.cuda.memory import device_alloc  # noqa: E402
from inferno.cuda.stream import Stream  # noqa: E402
from inferno.kernels import attn_variants as av  # noqa: E402
from inferno.kernels.ceilings import copy_bandwidth, time_ms  # noqa: E402
from inferno.kernels.kv_layout import KVLayout  # noqa: E402
from inferno.model.config import ModelConfig  # noqa: E402

PRESETS = {"27b": "qwen3.6-27b", "35b": "qwen3.6-35b-a3b"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def replay_us(stream: Stream, enqueue) -> float:
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


def bench_context(dev: Device, stream: Stream, cfg: ModelConfig, layers: int, context: int, max_context: int,
                  copy_gbps: float) -> list[dict]:
    hq, hkv = cfg.n_heads, cfg.n_kv_heads
    lay = KVLayout(hkv)
    per_seq = lay.pages_for(context)
    base = av.default_splits(max_context, 1, hkv, dev.sm_count)
    name = av.decode_variant(hq, hkv).name
    runs = [("regs", f"{name}_regs", "attn_combine_serial", base),
            ("pipelined", f"{name}_pipelined", "attn_combine_2pass", base),
            ("mma", name, "attn_combine_2pass", base)]
    runs += [("mma", name, av.COMBINE.name, s) for s in sorted({max(1, base // 2), base, 2 * base})]
    if dev.arch == "sm_90a":
        runs += [("mma s3", f"{name}_s3", av.COMBINE.name, s) for s in sorted({base, 2 * base})]
    pools = [device_alloc(per_seq * lay.page_bytes, f"kv layer {i}") for i in range(layers)]
    for p in pools:
        memset_d8(p, 0)
    table = to_device(None, np.arange(per_seq, dtype=np.int32).reshape(1, per_seq), "page_table")
    lens = to_device(None, np.array([context], np.int32), "lens")
    q, qg, out = (device_alloc(hq * 256 * n, nm) for n, nm in ((4, "q"), (4, "qg"), (2, "out")))
    memset_d8(q, 0)
    memset_d8(qg, 0)
    kv_bytes = context * lay.token_bytes
    rows = []
    try:
        for label, dec_name, comb_name, splits in runs:
            dec = av.AttnDecode.load(dec_name, dev)
            comb = av.AttnCombine.load(comb_name, dev)
            po_b, pl_b = av.partial_bytes(1, hq, splits)
            po, pl = device_alloc(po_b, "part_o"), device_alloc(pl_b, "part_lse")
            try:
                def decode(i: int) -> None:
                    dec(q, lens, table, pools[i], po, pl, batch=1, n_heads=hq, n_kv_heads=hkv,
                        table_width=per_seq, splits=splits, stream=stream)

                def step(with_combine: bool) -> None:
                    for i in range(layers):
                        decode(i)
                        if with_combine:
                            comb(po, pl, lens, qg, out, batch=1, n_heads=hq, splits=splits, stream=stream)

                both, alone = (replay_us(stream, lambda c=c: step(c)) / layers for c in (True, False))
            finally:
                po.free()
                pl.free()
            pages = -(-context // 64)
            used = -(-pages // -(-pages // splits))
            row = dict(kernels=label, decode=dec_name, combine=comb_name, context=context, splits=splits,
                       used_splits=used, ctas=used * hkv, us_per_layer=both, decode_us=alone,
                       combine_us=both - alone, kv_mb=kv_bytes / 1e6, kv_gbps=kv_bytes / both / 1e3,
                       pct_copy=100 * kv_bytes / both / 1e3 / copy_gbps)
            rows.append(row)
            log(f"{label:9s} {dec_name:24s} {comb_name:20s} ctx {context:6d} splits {splits:3d} ({used:3d} used, "
                f"{used * hkv:4d} CTAs): {both:7.2f} us/layer (decode {alone:6.2f}, combine {both - alone:5.2f}), "
                f"{row['kv_gbps']:6.0f} GB/s = {row['pct_copy']:5.1f} % of copy")
    finally:
        for b in (*pools, table, lens, q, qg, out):
            b.free()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=list(PRESETS), default="27b")
    ap.add_argument("--contexts", default="8192,65536", help="comma-separated context lengths")
    ap.add_argument("--max-context", type=int, default=262144, help="the executor's max context (sets splits)")
    ap.add_argument("--layers", type=int, default=0, help="attention layers per step (default: the model's)")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    a = ap.parse_args()

    cfg = ModelConfig.from_hf(get_preset(PRESETS[a.model]).text)
    layers = a.layers or len(cfg.attention_layers)
    dev = Device.open()
    stream = Stream.create()
    copy = copy_bandwidth(stream, 1 << 30)["gbps"]
    log(f"{dev.name}: {dev.sm_count} SMs, copy {copy:.0f} GB/s (read + write); "
        f"{a.model}: {cfg.n_heads} q / {cfg.n_kv_heads} kv heads, {layers} attention layers per step")
    rows = []
    for ctx in (int(c) for c in a.contexts.split(",")):
        rows += bench_context(dev, stream, cfg, layers, ctx, max(a.max_context, ctx), copy)
    print("| kernels | context | splits (used) | us / layer | decode | combine | KV GB/s | % of copy |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kernels']} `{r['decode']}` + `{r['combine']}` | {r['context']} "
              f"| {r['splits']} ({r['used_splits']}) | {r['us_per_layer']:.2f} | {r['decode_us']:.2f} "
              f"| {r['combine_us']:.2f} | {r['kv_gbps']:.0f} | {r['pct_copy']:.1f} |")
    if a.out:
        a.out.write_text(json.dumps(dict(model=a.model, copy_gbps=copy, layers=layers, rows=rows), indent=1))
    stream.synchronize()
    stream.close()


if __name__ == "__main__":
    main()
