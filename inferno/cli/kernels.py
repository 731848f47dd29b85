"""`inferno kernels build|list|check`."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from inferno.errors import UsageError

app = typer.Typer(help="Build, list and self-check the GPU kernels.", no_args_is_help=True)


@app.command("build")
def build(
    arch: List[str] = typer.Option(None, "--arch", help="target arch (repeatable); default sm_90a and sm_120a"),
    out: Optional[Path] = typer.Option(None, "--out", help="output root (default: the kernel cache)"),
    only: List[str] = typer.Option(None, "--only", help="build only this variant (repeatable)"),
    jobs: int = typer.Option(0, "--jobs", "-j", help="compiler processes at once (default: one per CPU core)"),
) -> None:
    """Compile kernel variants to OUT/<arch>/<variant>.cubin + .json (no GPU needed)."""
    from inferno.kernels.build import build_all
    from inferno.kernels.cache import cache_root
    from inferno.kernels.registry import ARCHS, get, variants

    archs = list(arch) if arch else list(ARCHS)
    for a in archs:
        if not any(a in v.archs for v in variants()):
            raise UsageError(f"no kernel builds for --arch {a}; known archs: {', '.join(ARCHS)}")
    chosen = [get(n) for n in only] if only else variants()
    if only:
        for v in chosen:
            if not any(a in v.archs for a in archs):
                raise UsageError(f"kernel {v.name} does not build for {', '.join(archs)} "
                                 f"(it builds for {', '.join(v.archs)})")
    if jobs < 0:
        raise UsageError(f"--jobs {jobs}: give a number of processes >= 1 (0: one per CPU core)")
    root = out or cache_root()
    built = build_all(chosen, archs, root, jobs=jobs or os.cpu_count() or 1)
    print(f"{len(built)} kernels in {root}", file=sys.stderr)


@app.command("list")
def list_() -> None:
    """Show every kernel variant, its archs, and its state in the kernel cache."""
    from inferno.kernels.cache import cache_root, stale_reason
    from inferno.kernels.registry import ARCHS, variants

    root = cache_root()
    print(f"kernel cache: {root}")
    print(f"{'variant':<15} {'op':<12} " + " ".join(f"{a:<9}" for a in ARCHS) + " summary")
    for v in variants():
        states = []
        for a in ARCHS:
            if a not in v.archs:
                states.append("-")
            else:
                reason = stale_reason(v, a, root)
                states.append("built" if reason is None else ("missing" if reason.startswith("not built")
                                                              else "stale"))
        print(f"{v.name:<15} {v.op:<12} " + " ".join(f"{s:<9}" for s in states) + f" {v.summary}")


@app.command("check")
def check(
    only: Optional[str] = typer.Option(None, "--only", help="check only this variant"),
    seed: Optional[int] = typer.Option(None, "--seed", help="random seed (default: fresh)"),
) -> None:
    """Run every kernel on the live GPU against numpy (poisoned outputs, ragged shapes)."""
    from inferno.cuda.device import Device, gpu_count

    if gpu_count() == 0:
        print("no NVIDIA GPU on this machine: kernel self-check skipped "
              "(`inferno kernels build` still compiles every kernel here)")
        return
    from inferno.kernels.registry import get
    from inferno.kernels.selfcheck import run_all

    if only:
        get(only)
    device = Device.open()
    print(f"{device!r}")
    results = run_all(device, seed, only)
    for r in results:
        print(r.line())
    bad = [r for r in results if not r.ok]
    print(f"{len(results) - len(bad)}/{len(results)} checks passed")
    if bad:
        raise typer.Exit(1)
