"""Where the CUDA-graph decode step's time goes, by ablation (GPU; timing only, results are garbage).

    python tools/ablate_decode.py ARTIFACT [--context 7680] [--replays 200] [--json OUT]

The eager kernel table (`inferno bench --kernel-table`) times each launch alone, so it cannot say what
a kernel costs inside the graph, where PDL overlaps launches and a side stream runs beside the main
one. This tool prefills a random prompt of `--context` tokens, then re-captures the decode body with
one class of operations left out and times replays of body + head (CUDA events around `--replays`
replays of the same step). Each row: the step without that class ("drop": its cost on the critical
path, all launches of the class together) and the step with only that class ("only": those launches
back to back as the graph orders them). Classes are an operation and its weight's role, as the kernel
table names them ("gemv mlp/gate_up", "gdn_conv_step", "attention", "linear_bf16 gdn/a_b_projection"), and
"branches": the side stream's fork and join (left out: the side branch's launches run on the main stream).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inferno.model.gpu.profile import role  # noqa: E402

NOT_WORK = frozenset({"alloc", "upload", "download", "zero", "write", "read", "synchronize", "marker", "side",
                      "join", "folds_norm", "preload_gemv", "close"})


def op_class(name: str, args: tuple, kwargs: dict) -> str:
    """The class of one device operation: its name and, for matrix products, its weight's role."""
    if name == "gemv":
        return f"gemv {role(args[2] if len(args) > 2 else kwargs['w'])}"
    if name == "linear_bf16":
        return f"linear_bf16 {role(args[1] if len(args) > 1 else kwargs['w'])}"
    return name


class Filtering:
    """Forwards to `ops`, leaving out the operations whose class `keep` rejects (and counting classes)."""

    def __init__(self, ops: Any, keep: Callable[[str], bool]):
        object.__setattr__(self, "_ops", ops)
        object.__setattr__(self, "_keep", keep)
        object.__setattr__(self, "seen", Counter())

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._ops, name)
        if name in ("side", "join"):  # the side branch's fork and join: class "branches"
            self.seen["branches"] += name == "side"
            if not self._keep("branches"):
                return contextlib.nullcontext if name == "side" else (lambda: None)
        if name.startswith("_") or name in NOT_WORK or not callable(attr):
            return attr

        def call(*args, **kwargs):
            cls = op_class(name, args, kwargs)
            self.seen[cls] += 1
            return attr(*args, **kwargs) if self._keep(cls) else None

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._ops, name, value)


def time_step(ex: Any, replays: int) -> float:
    """Microseconds per replay of the body and head graphs (the same step each time)."""
    from inferno.cuda.stream import Event

    body, head = ex.graphs["body"][1], ex.graphs["head"][1]
    stream = ex.ops.stream
    for _ in range(10):
        body.launch(stream)
        head.launch(stream)
    a, b = Event.create(), Event.create()
    a.record(stream)
    for _ in range(replays):
        body.launch(stream)
        head.launch(stream)
    b.record(stream)
    ex.ops.synchronize()
    return Event.elapsed_ms(a, b) * 1e3 / replays


def recapture(ex: Any, keep: Callable[[str], bool]) -> Counter:
    """Capture body and head again with `keep` choosing the operations; returns the classes seen."""
    prog = ex.program
    real = prog.ops
    filt = Filtering(real, keep)
    prog.ops = filt
    try:
        for name, fn in (("body", prog.body), ("head", prog.head)):
            g, ge = ex.graphs.pop(name)
            ge.close()
            g.close()
            ex._capture_one(name, fn)
    finally:
        prog.ops = real
    return filt.seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifact")
    ap.add_argument("--context", type=int, default=7680, help="prompt tokens before the timed step")
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    from inferno.model.gpu import GpuExecutor

    ex = GpuExecutor(a.artifact, max_seqs=1, max_context=a.context + 16, cuda_graph=True)
    st = ex.new_state()
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, ex.config.vocab, a.context).tolist()
    chunk = ex.prefill_chunk
    for i in range(0, len(prompt), chunk):
        ex.prefill(prompt[i:i + chunk], st)
    ex._write_step(int(prompt[-1]), st)  # the step inputs every replay reads (context + 1 tokens)
    ex.ops.synchronize()
    classes = recapture(ex, lambda c: True)
    full = time_step(ex, a.replays)
    print(f"full step {full:.1f} us (context {a.context + 1})", file=sys.stderr)
    rows = []
    for cls, n in classes.items():
        recapture(ex, lambda c, cls=cls: c != cls)
        drop = time_step(ex, a.replays)
        recapture(ex, lambda c, cls=cls: c == cls)
        only = time_step(ex, a.replays)
        rows.append(dict(cls=cls, launches=n, without_us=drop, saved_us=full - drop, only_us=only))
        print(f"{cls:<40} {n:4d}  without {drop:8.1f}  saved {full - drop:7.1f}  only {only:8.1f}", file=sys.stderr)
    recapture(ex, lambda c: False)
    empty = time_step(ex, a.replays)
    ex.close()
    if a.json:
        Path(a.json).write_text(json.dumps(dict(full_us=full, empty_us=empty, context=a.context, rows=rows), indent=1))
    print(f"\nstep {full:.1f} us; graphs with no operations {empty:.1f} us")
    print("| class | launches | step without (us) | saved (us) | only this class (us) |")
    print("|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: -r["saved_us"]):
        print(f"| {r['cls']} | {r['launches']} | {r['without_us']:.1f} | {r['saved_us']:.1f} | {r['only_us']:.1f} |")


if __name__ == "__main__":
    main()
