"""`inferno serve`."""

import typer

from inferno.cli.common import not_built


def serve(target: str = typer.Argument(None, help="artifact or checkpoint")) -> None:
    """Not built yet."""
    not_built("inferno serve", 7)
