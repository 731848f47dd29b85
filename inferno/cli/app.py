"""The `inferno` command: one typer app, one module per subcommand."""

import sys

import typer

from inferno.errors import InfernoError

try:  # typer >= 0.29 bundles its own click
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
except ImportError:  # pragma: no cover - older typer on the system click
    from click.exceptions import ClickException, NoArgsIsHelpError
from inferno.cli import bench, convert, inspect, kernels, migrate, run, serve, synth, verify

app = typer.Typer(
    name="inferno",
    help="Fast single-GPU inference for the Qwen3.5-family .ninfer artifacts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("run")(run.run)
app.command("serve")(serve.serve)
app.command("convert")(convert.convert)
app.command("inspect")(inspect.inspect)
app.command("verify")(verify.verify)
app.command("migrate")(migrate.migrate)
app.command("bench")(bench.bench)
app.command("synth")(synth.synth)
app.add_typer(kernels.app, name="kernels")


def main() -> None:
    """Entry point: user errors become one line on stderr and a non-zero exit, never a traceback."""
    try:
        rc = app(standalone_mode=False)
    except NoArgsIsHelpError as e:
        e.show()
        sys.exit(0)
    except ClickException as e:
        print(f"error: {e.format_message()}", file=sys.stderr)
        sys.exit(e.exit_code)
    except InfernoError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(rc if isinstance(rc, int) else 0)
