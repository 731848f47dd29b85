"""`inferno verify`."""

import typer

from inferno.cli.common import not_built


def verify(target: str = typer.Argument(None, help="artifact or checkpoint")) -> None:
    """Not built yet."""
    not_built("inferno verify", 4)
