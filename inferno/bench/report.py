"""The bench report: one JSON document (schema below), a short text table, a docs/performance.md row.

JSON (`SCHEMA` = "inferno-bench/2"):
  schema, date (UTC ISO), command, device {kind: cpu|cuda, name, executor, cuda_graph, ...; cuda: gpu {uuid,
          sm_mhz_max, mem_mhz_max} | clocks_unavailable (why NVML could not be read)},
  model {path, identity, layers, attention_layers, gdn_layers, hidden, vocab, moe},
  settings {prompt_tokens, decode_tokens, contexts, reps, warmup, prefill_chunk, prefill_chunk_auto, seed,
            kernel_table, sampling, ignore_eos},
  limits {copy_gbps, gemm_tflops, gemm_impl, notes}          (null on the CPU)
  accounting {weights_per_decode_step {total, per group}, ffn_bytes_per_layer, kv_dtype,
              kv_bytes_per_token, gdn_state, decode_step_bytes_at_context, prefill_flops_per_token}
  runs [{prompt_tokens, decode_tokens, prefill {tok_s, seconds}, decode {tok_s, seconds},
         prefill_flops, prefill_tflops, prefill_mma_ratio, decode_bytes_per_step, decode_gbps,
         decode_roofline_tok_s, decode_roofline_ratio, samples,
         clocks {samples, period_s, sm_mhz, mem_mhz, power_w, clock_event_reasons, errors}}]
         (tok_s/seconds: median, min, max, stdev, n; clocks: cuda with NVML only, over the timed repetitions,
         sm_mhz/mem_mhz/power_w: median, min, max or null)
  skipped [{prompt_tokens, reason}]                            (contexts that did not fit)
  host_overhead {available: false, reason} | {available: true, prompt_tokens, steps, device_spans,
          wall_s_per_step, device_s_per_step, device_s_per_span {median, min, max},
          host_overhead_s_per_step, host_overhead_ratio, device_idle_between_steps_s {mean, median, max} | null,
          timed_wall_s_per_step, cuda_graph}   (one more generation of the first case, device events per step)
  kernels null | {available: false, reason} | {available: true, decode_step, prefill_chunk}   (eager, per launch)
Ratios are fractions (0.31 = 31 %); null where no limit was measured.
"""

from __future__ import annotations

import json
from pathlib import Path

from inferno.bench.clocks import clock_line

SCHEMA = "inferno-bench/2"


def build_report(*, date: str, command: str, device: dict, model: dict, settings: dict, limits: dict,
                 accounting: dict, runs: list[dict], skipped: list[dict], host_overhead: dict,
                 kernels: dict | None) -> dict:
    return {"schema": SCHEMA, "date": date, "command": command, "device": device, "model": model,
            "settings": settings, "limits": limits, "accounting": accounting, "runs": runs, "skipped": skipped,
            "host_overhead": host_overhead, "kernels": kernels}


def write_json(report: dict, path: str) -> None:
    """Write the report to `path` ('-' = stdout)."""
    text = json.dumps(report, indent=1) + "\n"
    if path == "-":
        import sys

        sys.stdout.write(text)
    else:
        Path(path).write_text(text, encoding="utf-8")


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def _num(x: float | None, fmt: str = ",.1f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3f} {unit}" if unit == "GB" else f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def text_table(report: dict) -> str:
    """A short human summary: limits, one line per case, the kernel table if present."""
    lim = report["limits"]
    acct = report["accounting"]
    lines = [
        f"inferno bench  {report['date']}  {report['device']['name']} ({report['device']['executor']} executor)",
        f"model {report['model']['identity']}: weights read per decode step "
        f"{_size(acct['weights_per_decode_step']['total'])}, KV {acct['kv_bytes_per_token']:,} B/token "
        f"({acct['kv_dtype']}), GDN state {_size(acct['gdn_state']['bytes'])}",
        f"limits: copy {_num(lim['copy_gbps'], ',.0f')} GB/s, bf16 GEMM {_num(lim['gemm_tflops'], ',.0f')} TFLOP/s",
        "",
        f"{'prompt':>8} {'decode':>6} | {'prefill tok/s':>14} {'±sd':>8} {'% MMA':>8} | "
        f"{'decode tok/s':>12} {'±sd':>8} {'roofline':>9} {'% roof':>8}",
    ]
    for r in report["runs"]:
        p, d = r["prefill"]["tok_s"], r["decode"]["tok_s"]
        lines.append(
            f"{r['prompt_tokens']:>8} {r['decode_tokens']:>6} | {p['median']:>14,.1f} {p['stdev']:>8,.1f} "
            f"{_pct(r['prefill_mma_ratio']):>8} | {d['median']:>12,.1f} {d['stdev']:>8,.1f} "
            f"{_num(r['decode_roofline_tok_s']):>9} {_pct(r['decode_roofline_ratio']):>8}")
    for s in report["skipped"]:
        lines.append(f"{s['prompt_tokens']:>8} skipped: {s['reason']}")
    gpu = report["device"].get("gpu")
    if gpu is not None:
        lines += ["", f"GPU {gpu['uuid']} (SM up to {gpu['sm_mhz_max']:,} MHz, memory {gpu['mem_mhz_max']:,} MHz)"]
        lines += [f"{r['prompt_tokens']:>8}: {clock_line(r['clocks'])}" for r in report["runs"] if "clocks" in r]
    elif "clocks_unavailable" in report["device"]:
        lines += ["", f"clocks: not sampled ({report['device']['clocks_unavailable']})"]
    lines += ["", overhead_line(report["host_overhead"])]
    k = report["kernels"]
    if k is not None:
        lines.append("")
        if not k["available"]:
            lines.append(f"kernel table: not available ({k['reason']})")
        else:
            for part, title in (("decode_step", f"decode step at context {k['decode_step']['context']}"),
                                ("prefill_chunk", f"prefill chunk of {k['prefill_chunk']['tokens']} tokens")):
                lines.append(f"{title}: device {k[part]['device_s'] * 1e3:.3f} ms")
                lines.append(f"  {'kernel':<48} {'n':>4} {'us':>10} {'GB/s':>9} {'TFLOP/s':>8} {'% limit':>8}")
                for row in k[part]["kernels"]:
                    lines.append(f"  {row['kernel'][:48]:<48} {row['launches']:>4} {row['seconds'] * 1e6:>10.1f} "
                                 f"{_num(row['gbps'], ',.0f'):>9} {_num(row['tflops'], ',.1f'):>8} "
                                 f"{_pct(row['ratio']):>8}")
    return "\n".join(lines)


def overhead_line(h: dict) -> str:
    """The host overhead summary: wall and device time per decode step, their difference and ratio."""
    if not h["available"]:
        return f"host overhead per decode step: not measured ({h['reason']})"
    idle = h["device_idle_between_steps_s"]
    gap = "n/a" if idle is None else f"{idle['mean'] * 1e6:,.1f} us mean, {idle['max'] * 1e6:,.1f} us max"
    return (f"host overhead per decode step: {h['host_overhead_s_per_step'] * 1e6:,.1f} us = "
            f"{_pct(h['host_overhead_ratio'])} of the step (wall {h['wall_s_per_step'] * 1e6:,.1f} us - device "
            f"{h['device_s_per_step'] * 1e6:,.1f} us over {h['steps']} steps; device idle between steps {gap}; "
            f"CUDA graph: {h['cuda_graph']})")


def markdown_row(report: dict) -> str:
    """`| date | GPU | command | result | ratio to the limit |` for docs/performance.md (first case)."""
    r = report["runs"][0]
    lim = report["limits"]
    result = (f"prefill {r['prompt_tokens']:,}: {r['prefill']['tok_s']['median']:,.1f} tok/s; "
              f"decode {r['decode_tokens']}: {r['decode']['tok_s']['median']:,.1f} tok/s")
    ratios = []
    if r["decode_roofline_ratio"] is not None:
        ratios.append(f"decode {_pct(r['decode_roofline_ratio'])} of roofline "
                      f"({r['decode_roofline_tok_s']:,.1f} tok/s at {lim['copy_gbps']:,.0f} GB/s copy)")
    if r["prefill_mma_ratio"] is not None:
        ratios.append(f"prefill {_pct(r['prefill_mma_ratio'])} of {lim['gemm_tflops']:,.0f} TFLOP/s GEMM")
    h = report["host_overhead"]
    if h["available"] and ratios:
        ratios.append(f"host overhead {_pct(h['host_overhead_ratio'])} of a decode step")
    ratio = "; ".join(ratios) if ratios else "n/a (no measured limit)"
    return f"| {report['date'][:10]} | {_gpu_cell(report)} | `{report['command']}` | {result} | {ratio} |"


def _gpu_cell(report: dict) -> str:
    """The GPU's name, and where the report has them its short UUID and the first case's median SM clock."""
    dev = report["device"]
    gpu = dev.get("gpu")
    if gpu is None:
        return dev["name"]
    sm = (report["runs"][0].get("clocks") or {}).get("sm_mhz")
    return f"{dev['name']} ({gpu['uuid'][:12]}" + (f", SM {sm['median']:,.0f} MHz)" if sm else ")")
