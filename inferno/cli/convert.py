"""`inferno convert`."""

import typer

from inferno.cli.common import not_built


def convert(target: str = typer.Argument(None, help="artifact or checkpoint")) -> None:
    """Not built yet."""
    not_built("inferno convert", 4)
