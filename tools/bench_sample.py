"""Device sampling benchmark on the live GPU: the sampler and the greedy argmax, old vs new.

    python tools/bench_sample.py [--old REV] [--calls 100] [--replays 20]

"new" is the working tree's kernels (cute_kernels/sample.py, cute_kernels/argmax.py); "old" is
the same kernels and launch rules at git revision REV (default HEAD; once the new kernels are
committed, pass the commit before them), built into a temporary kernel cache. Cases: greedy
through the sampler, top_k 20 + top_p 0.8 + min_p + penalties (half the vocabulary counted), and
argmax, at vocab 248,320 and 151,936 (bf16 normal logits, sigma 3).

Two timings per case, in us per call: `graph` replays a CUDA graph of `--calls` back-to-back calls
(PDL on, as the executor's stream) --replays times, median -- the device time; `eager` is the
same calls launched from Python between two events -- what one call costs with the host launching.
Every case first checks that old and new pick the same token. Prints a table last.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from ml_dtypes import bfloat16

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from inferno.cuda.copy import from_device, h2d, to_device  # noqa: E402
from inferno.cuda.device import Device  # noqa: E402
from inferno.cuda.graph import Graph  # noqa: E402
from inferno.cuda.stream import Event, Stream  # noqa: E402
from inferno.engine.params import SamplingParams  # noqa: E402
from inferno.kernels import sample_variants as new_sv  # noqa: E402
from inferno.kernels.cache import load  # noqa: E402
from inferno.kernels.registry import Variant  # noqa: E402

VOCABS = (248320, 151936)
GREEDY = SamplingParams(temperature=0.0)
TOPK = SamplingParams(temperature=0.7, top_k=20, top_p=0.8, min_p=0.02, presence_penalty=1.5,
                      frequency_penalty=0.3, seed=1)


@dataclasses.dataclass(frozen=True)
class _OldVariant(Variant):
    """A registry variant whose kernel source is a file from another revision."""

    old_file: str = ""

    @property
    def source_file(self) -> Path:
        return Path(self.old_file)


def _git_show(rev: str, path: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], check=True,
                              capture_output=True, text=True).stdout
    except subprocess.CalledProcessError as e:
        sys.exit(f"error: cannot read {path} at {rev}: {e.stderr.strip()}; pass --old with a revision that has it")


def old_kernels(rev: str, tmp: Path, dev: Device):
    """(DeviceSampler, Argmax) built from revision `rev`'s kernels and launchers."""
    pkg = tmp / "inferno_bench_old"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in ("sample", "argmax"):
        (pkg / f"{name}.py").write_text(_git_show(rev, f"cute_kernels/{name}.py"))
    (pkg / "sample_variants.py").write_text(_git_show(rev, "inferno/kernels/sample_variants.py"))
    sys.path.insert(0, str(tmp))
    spec = importlib.util.spec_from_file_location("inferno_bench_old.sample_variants", pkg / "sample_variants.py")
    sv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sv)
    root = tmp / "cache"

    def old(v: Variant) -> "object":
        module = v.source.rsplit(".", 1)[1]
        ov = _OldVariant(**{f.name: getattr(v, f.name) for f in dataclasses.fields(Variant)},
                         old_file=str(pkg / f"{module}.py"))
        return load(dataclasses.replace(ov, name=f"old_{v.name}", source=f"inferno_bench_old.{module}"), dev, root)

    return (new_sv.DeviceSampler(old(sv.SAMPLE_TOPK), old(sv.SAMPLE_PICK)),
            new_sv.Argmax(old(sv.ARGMAX)))


def time_call(fn, stream: Stream, calls: int, replays: int) -> tuple[float, float]:
    """(graph us per call, eager us per call) of `fn(stream)`."""
    for _ in range(5):
        fn(stream)
    stream.synchronize()
    a, b = Event(), Event()
    a.record(stream)
    for _ in range(calls):
        fn(stream)
    b.record(stream)
    b.synchronize()
    eager = Event.elapsed_ms(a, b) * 1e3 / calls
    with Graph.capture(stream) as g:
        for _ in range(calls):
            fn(stream)
    ge = g.instantiate()
    ge.launch(stream)
    stream.synchronize()
    times = []
    for _ in range(replays):
        a.record(stream)
        ge.launch(stream)
        b.record(stream)
        b.synchronize()
        times.append(Event.elapsed_ms(a, b) * 1e3 / calls)
    ge.close()
    g.close()
    return statistics.median(times), eager


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default="HEAD", help="git revision of the old kernels (default HEAD)")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--replays", type=int, default=20)
    args = ap.parse_args()

    dev = Device.open()
    dev.activate()
    stream = Stream.create()
    stream.pdl = True
    new = (new_sv.DeviceSampler.for_device(dev), new_sv.Argmax.for_device(dev))
    with tempfile.TemporaryDirectory(prefix="bench-sample-") as tmp:
        old = old_kernels(args.old, Path(tmp), dev)
        rows = []
        rng = np.random.default_rng(0)
        for n in VOCABS:
            x = rng.standard_normal(n, np.float32) * 3
            logits = to_device(None, x.astype(bfloat16).view(np.uint16), "logits")
            counts0 = np.where(rng.random(n) < 0.5, rng.integers(1, 4, n), 0).astype(np.int32)
            counts = to_device(None, counts0, "counts")
            scratch = to_device(None, np.zeros(new_sv.scratch_bytes(n) // 4, np.float32), "scratch")
            out = to_device(None, np.array([-1], np.int32), "out")
            for case, params in (("sampler greedy", GREEDY), ("sampler top_k 20 + top_p + pen", TOPK),
                                 ("argmax", None)):
                res = {}
                for tag, (sampler, argmax) in (("old", old), ("new", new)):
                    if params is None:
                        def fn(s, argmax=argmax):
                            argmax(logits, out, n, stream=s)
                    else:
                        def fn(s, sampler=sampler, params=params):
                            sampler(logits, counts, scratch, out, n, params, 0.37, stream=s)
                    h2d(counts, counts0)
                    fn(stream)
                    stream.synchronize()
                    token = int(from_device(out, np.int32, (1,))[0])
                    res[tag] = (token, *time_call(fn, stream, args.calls, args.replays))
                same = "same" if res["old"][0] == res["new"][0] else f"DIFFER {res['old'][0]} / {res['new'][0]}"
                rows.append((case, n, res["old"][1], res["new"][1], res["old"][2], res["new"][2], same))
                print(f"{case:32s} vocab {n:>6}: graph {res['old'][1]:7.2f} -> {res['new'][1]:6.2f} us, "
                      f"eager {res['old'][2]:7.2f} -> {res['new'][2]:6.2f} us, token {same}", file=sys.stderr)
            for b in (logits, counts, scratch, out):
                b.free()
    print(f"\nus per call (old = {args.old}); graph = device time of back-to-back calls in a CUDA graph")
    print(f"| {'case':32s} | vocab  | old graph | new graph | old eager | new eager | token |")
    print(f"|{'-' * 34}|--------|-----------|-----------|-----------|-----------|-------|")
    for case, n, og, ng, oe, ne, same in rows:
        print(f"| {case:32s} | {n:>6} | {og:9.2f} | {ng:9.2f} | {oe:9.2f} | {ne:9.2f} | {same} |")


if __name__ == "__main__":
    main()
