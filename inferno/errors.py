"""Errors the user can act on.

Every error raised for bad input (a flag, an artifact, a request) derives from `InfernoError`.
The CLI prints its message on one line and exits with `exit_code`; the server maps it to the
API's own error shape. Messages say what was wrong and what to do.
"""


class InfernoError(Exception):
    """Base class: a one-line, user-facing message."""

    exit_code = 2


class ConfigError(InfernoError):
    """A model or checkpoint configuration that Inferno cannot use."""


class ArtifactError(InfernoError):
    """A `.ninfer` artifact or HF checkpoint that fails validation."""


class UsageError(InfernoError):
    """A bad command-line flag or argument combination."""


class NotBuiltError(InfernoError):
    """A capability that this version does not provide yet."""

    exit_code = 3
