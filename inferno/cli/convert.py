"""`inferno convert HF_DIR -o OUT.ninfer --weights groupwise-int|nvfp4`."""

import sys
from pathlib import Path

import typer


def convert(
    hf_dir: Path = typer.Argument(..., help="HF checkpoint directory (config.json + BF16 safetensors)"),
    out: Path = typer.Option(..., "-o", "--out", help="output .ninfer file (written atomically)"),
    weights: str = typer.Option("groupwise-int", "--weights", help="weights_id: groupwise-int or nvfp4"),
    model_id: str = typer.Option(None, "--model-id", help="model_id (default: from the config's shapes; "
                                                          "qwen3.8-27b must be named)"),
    dflash: Path = typer.Option(None, "--dflash", help="DFlash drafter checkpoint (qwen3.6-35b-a3b only)"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
) -> None:
    """Quantize a Qwen3.5-family checkpoint into a .ninfer v2 artifact with its identity's formats."""
    from inferno.artifact.convert import convert as run_convert
    from inferno.errors import UsageError

    if out.suffix != ".ninfer":
        raise UsageError(f"output {out} must end in .ninfer")
    path = run_convert(hf_dir, out, weights, model_id=model_id, dflash_dir=dflash, progress=not quiet)
    print(f"wrote {path} ({path.stat().st_size:,} bytes)", file=sys.stderr)
