"""Helpers shared by the subcommands."""

from inferno.errors import NotBuiltError


def not_built(what: str, issue: int) -> None:
    """Refuse a capability that is not built yet (see the named issue)."""
    raise NotBuiltError(f"{what} is not built yet (tracked in issue {issue})")
