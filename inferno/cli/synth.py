"""`inferno synth`."""

import typer

from inferno.cli.common import not_built


def synth(target: str = typer.Argument(None, help="artifact or checkpoint")) -> None:
    """Not built yet."""
    not_built("inferno synth", 3)
