"""`inferno synth PRESET OUT`: a synthetic HF checkpoint directory, or a `.ninfer` artifact."""

import sys

import typer

from inferno.checkpoint.presets import PRESETS


def synth(
    preset: str = typer.Argument(..., help=f"one of: {', '.join(PRESETS)}"),
    out: str = typer.Argument(..., help="output directory (new or empty), or a file ending in .ninfer"),
    seed: int = typer.Option(0, "--seed", help="weights seed (same seed, same bytes)"),
    expert_layout: str = typer.Option("fused", "--expert-layout", help="MoE experts: fused (official) or per-expert"),
    weights: str = typer.Option("groupwise-int", "--weights", help=".ninfer only: groupwise-int or nvfp4"),
    model_id: str = typer.Option(None, "--model-id", help=".ninfer only: identity model_id (e.g. qwen3.8-27b)"),
) -> None:
    """Write a synthetic Qwen3.5-family model with random weights.

    A directory gets an HF checkpoint (BF16 safetensors); a path ending in .ninfer gets an
    artifact written directly with random codes and scales (no HF intermediate).
    """
    if out.endswith(".ninfer"):
        from inferno.artifact.synth import synthesize_artifact

        path = synthesize_artifact(preset, out, weights_id=weights, model_id=model_id, seed=seed)
        print(f"wrote {preset} {weights} artifact (seed {seed}) to {path}", file=sys.stderr)
        return
    from inferno.checkpoint.synth import synthesize_with_progress

    path = synthesize_with_progress(preset, out, seed, expert_layout)
    print(f"wrote {preset} (seed {seed}) to {path}", file=sys.stderr)
