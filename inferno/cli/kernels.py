"""`inferno kernels build|check|list`."""

import typer

from inferno.cli.common import not_built

app = typer.Typer(help="Build, list and self-check the GPU kernels.", no_args_is_help=True)


@app.command("build")
def build() -> None:
    """Not built yet."""
    not_built("inferno kernels build", 2)
