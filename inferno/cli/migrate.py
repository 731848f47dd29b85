"""`inferno migrate`."""

import typer

from inferno.cli.common import not_built


def migrate(target: str = typer.Argument(None, help="artifact or checkpoint")) -> None:
    """Not built yet."""
    not_built("inferno migrate", 4)
