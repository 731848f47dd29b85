"""Same-run A/B of source trees on the GPU machine: snapshot each tree here, bench them alternated there.

    python tools/ab_trees.py snapshot NAME [--rev REV] [--base .gpu/kernels] [--jobs N]   (here: the DSL)
    python3 tools/ab_trees.py bench O N O N [--artifact /tmp/q27.ninfer] [--synth qwen3.6-27b] [--out $OUT]
        [-- BENCH ARGS]   (on the GPU machine)

`snapshot` copies a tree's sources (the working tree, or git revision REV) to `.gpu/ab/NAME/` and builds
into `.gpu/ab/NAME/kernels` only the sm_90a kernels whose source hash differs from the base cubins (the
shared build, `make kernels` or `inferno kernels build --arch sm_90a --out .gpu/kernels`), so a tree costs
its changed kernels alone. Name `.gpu` in the device tool's `carry`.

`bench` runs, for each tag in the order given, `inferno bench ARTIFACT --device cuda` from that tree's
sources with its kernels (the base cubins overlaid by its own), every run a fresh process; it prints one
line per run as it goes and a table last (with each run's GPU and SM clock where its tree's bench records them),
and writes `ab.jsonl` (one report line per run) to --out.
Default bench arguments: `--prompt-tokens 7680 --decode-tokens 128 --reps 1`. A tree whose kernels are
stale for its sources (a snapshot older than its build) is refused before anything runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AB = ROOT / ".gpu" / "ab"
SOURCES = ("inferno", "cute_kernels", "tools", "tests", "pyproject.toml")
ARCH = "sm_90a"
BENCH_ARGS = ["--prompt-tokens", "7680", "--decode-tokens", "128", "--reps", "1"]

# run inside a tree (its own package on sys.path): the variants whose cubins in BASE are missing or stale
_STALE = """
import json, sys
from pathlib import Path
from inferno.kernels.cache import stale_reason
from inferno.kernels.registry import variants
base = Path(sys.argv[1])
print(json.dumps([v.name for v in variants(sys.argv[2]) if stale_reason(v, sys.argv[2], base) is not None]))
"""

# a file run inside a tree (spawned build workers re-import the main module): build the named variants
_BUILD = """import sys
from pathlib import Path
from inferno.kernels.build import build_pairs
from inferno.kernels.registry import get
if __name__ == "__main__":
    build_pairs([(get(n), sys.argv[2]) for n in sys.argv[4:]], Path(sys.argv[1]), jobs=int(sys.argv[3]))
"""


def _in_tree(tree: Path, code: str, *args: str) -> str:
    """Run `code` with tree's package first on the path (not the installed one); its stdout."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"ab_trees: in {tree}: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else 'failed'}")
    return out.stdout


def stale_in(tree: Path, base: Path) -> list[str]:
    """The sm_90a variants of `tree` whose cubins in `base` are missing or stale."""
    return json.loads(_in_tree(tree, _STALE, str(base), ARCH).strip().splitlines()[-1])


def copy_sources(dest: Path, rev: str | None) -> None:
    """The working tree's sources (rev None) or git revision rev's, into dest."""
    if rev is None:
        for name in SOURCES:
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(src, dest / name)
        return
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, *SOURCES], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"ab_trees: git archive {rev}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)


def snapshot(name: str, rev: str | None, base: Path, jobs: int) -> None:
    if not (base / ARCH).is_dir():
        raise SystemExit(f"ab_trees: no base cubins in {base / ARCH}; build them first: "
                         f"python -m inferno kernels build --arch {ARCH} --out {base}")
    tree = AB / name
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    copy_sources(tree, rev)
    names = stale_in(tree, base)
    print(f"{name}: {rev or 'working tree'}; {len(names)} kernels differ from {base}", file=sys.stderr)
    if names:
        script = tree / ".ab_build.py"
        script.write_text(_BUILD)
        env = dict(os.environ, PYTHONPATH=str(tree))
        subprocess.run([sys.executable, str(script), str(tree / "kernels"), ARCH, str(jobs), *names],
                       cwd=tree, env=env, check=True)
        script.unlink()


def _kernels_for(name: str, base: Path, work: Path) -> Path:
    """base cubins overlaid by tree name's own, in work/name."""
    root = work / name
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(base, root)
    own = AB / name / "kernels"
    if own.is_dir():
        shutil.copytree(own, root, dirs_exist_ok=True)
    return root


def bench(order: list[str], artifact: str, out: Path, base: Path, extra: list[str], synth: str = "") -> None:
    missing = [n for n in dict.fromkeys(order) if not (AB / n).is_dir()]
    if missing:
        raise SystemExit(f"ab_trees: no snapshot for {', '.join(missing)} in {AB}: "
                         f"run `python tools/ab_trees.py snapshot NAME` here first")
    work = Path(tempfile.mkdtemp(prefix="ab-kernels-"))
    kernels = {n: _kernels_for(n, base, work) for n in dict.fromkeys(order)}
    for n, root in kernels.items():
        stale = stale_in(AB / n, root)
        if stale:
            raise SystemExit(f"ab_trees: tree {n} has stale kernels ({', '.join(stale[:4])}...): snapshot it again")
    if not Path(artifact).exists():
        if not synth:
            raise SystemExit(f"ab_trees: no artifact {artifact}; pass --synth MODEL (e.g. qwen3.6-27b) to make it")
        first = AB / order[0]
        subprocess.run([sys.executable, "-m", "inferno", "synth", synth, artifact], cwd=first,
                       env=dict(os.environ, PYTHONPATH=str(first)), check=True)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, n in enumerate(order):
        report = work / f"{n}_{i}.json"
        env = dict(os.environ, PYTHONPATH=str(AB / n), INFERNO_KERNEL_DIR=str(kernels[n]))
        cmd = [sys.executable, "-m", "inferno", "bench", artifact, "--device", "cuda", *(extra or BENCH_ARGS),
               "--json", str(report)]
        run = subprocess.run(cmd, cwd=AB / n, env=env, capture_output=True, text=True)
        if run.returncode != 0 or not report.exists():
            tail = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["no output"]
            rows.append((n, None))
            print(f"{i:>2} {n:<8} FAILED (rc {run.returncode}): {tail[0]}", flush=True)
            continue
        r = json.loads(report.read_text())
        with open(out / "ab.jsonl", "a") as f:
            f.write(json.dumps({"tree": n, "run": i, "report": r}) + "\n")
        rows.append((n, r))
        decode, ratio, prefill, _ = _summary(r)
        print(f"{i:>2} {n:<8} decode {decode:.1f} tok/s ({ratio or '-'} % of roofline), prefill {prefill:,.1f} tok/s",
              flush=True)
    print("\n| run | tree | decode tok/s | % of roofline | prefill tok/s | copy GB/s | GPU, SM clock |\n"
          "|---|---|---|---|---|---|---|")
    for i, (n, r) in enumerate(rows):
        if r is None:
            print(f"| {i} | {n} | failed | | | | |")
            continue
        decode, ratio, prefill, copy = _summary(r)
        print(f"| {i} | {n} | {decode:.1f} | {ratio} | {prefill:,.1f} | {copy:,.0f} | {_machine(r)} |")
    shutil.rmtree(work, ignore_errors=True)


def _summary(r: dict) -> tuple[float, str, float, float]:
    """An `inferno bench` report's decode tok/s, % of roofline (text, blank when unmeasured), prefill tok/s
    and copy GB/s."""
    u = r["runs"][0]
    ratio = u["decode_roofline_ratio"]
    return (u["decode"]["tok_s"]["median"], "" if ratio is None else f"{100 * ratio:.2f}",
            u["prefill"]["tok_s"]["median"], r["limits"].get("copy_gbps") or 0)


def _machine(r: dict) -> str:
    """The report's GPU (short UUID) and its median SM clock over the first case's timed repetitions, as far as the
    tree's `inferno bench` records them (blank before it did)."""
    gpu = r["device"].get("gpu")
    sm = (r["runs"][0].get("clocks") or {}).get("sm_mhz")
    return ", ".join(([gpu["uuid"][:12]] if gpu else []) + ([f"{sm['median']:,.0f} MHz"] if sm else []))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    extra = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("snapshot", help="copy a tree's sources to .gpu/ab/NAME and build its changed kernels")
    s.add_argument("name")
    s.add_argument("--rev", default=None, help="a git revision (default: the working tree)")
    s.add_argument("--base", type=Path, default=ROOT / ".gpu" / "kernels")
    s.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    b = sub.add_parser("bench", help="on the GPU machine: inferno bench per tree, in the order given")
    b.add_argument("order", nargs="+")
    b.add_argument("--artifact", default="/tmp/q27.ninfer")
    b.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    b.add_argument("--base", type=Path, default=ROOT / ".gpu" / "kernels")
    b.add_argument("--synth", default="", metavar="MODEL",
                   help="make the artifact first when it is missing (`inferno synth MODEL ARTIFACT`)")
    a = ap.parse_args(argv)
    for name in ([a.name] if a.cmd == "snapshot" else a.order):
        if not name.replace("_", "").replace("-", "").isalnum():
            raise SystemExit(f"ab_trees: tree name {name!r}: use letters, digits, '-' and '_'")
    if a.cmd == "snapshot":
        snapshot(a.name, a.rev, a.base, a.jobs)
    else:
        bench(a.order, a.artifact, a.out, a.base, extra, a.synth)


if __name__ == "__main__":
    main()
