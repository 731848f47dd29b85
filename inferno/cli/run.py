"""`inferno run`."""

import typer

from inferno.cli.common import not_built


def run(target: str = typer.Argument(None, help="artifact or checkpoint")) -> None:
    """Not built yet."""
    not_built("inferno run", 3)
