"""`inferno bench`."""

import typer

from inferno.cli.common import not_built


def bench(target: str = typer.Argument(None, help="artifact or checkpoint")) -> None:
    """Not built yet."""
    not_built("inferno bench", 6)
