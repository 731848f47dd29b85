"""`inferno inspect`."""

import typer

from inferno.cli.common import not_built


def inspect(target: str = typer.Argument(None, help="artifact or checkpoint")) -> None:
    """Not built yet."""
    not_built("inferno inspect", 4)
