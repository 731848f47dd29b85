"""`inferno synth PRESET OUT`: write a synthetic HF checkpoint directory."""

import sys

import typer

from inferno.checkpoint.presets import PRESETS


def synth(
    preset: str = typer.Argument(..., help=f"one of: {', '.join(PRESETS)}"),
    out: str = typer.Argument(..., help="output directory (new or empty)"),
    seed: int = typer.Option(0, "--seed", help="weights seed (same seed, same bytes)"),
    expert_layout: str = typer.Option("fused", "--expert-layout", help="MoE experts: fused (official) or per-expert"),
) -> None:
    """Write a synthetic Qwen3.5-family checkpoint (HF layout, random BF16 weights)."""
    from inferno.checkpoint.synth import synthesize_with_progress

    path = synthesize_with_progress(preset, out, seed, expert_layout)
    print(f"wrote {preset} (seed {seed}) to {path}", file=sys.stderr)
