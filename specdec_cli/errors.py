"""The one family of errors that crosses the CLI boundary as `error: ...` plus a hint."""

from __future__ import annotations


class SpecdecError(Exception):
    """A runtime problem the user can act on: printed as one line, exit status 1."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(SpecdecError):
    """Bad options or arguments: exit status 2, like every command-line parser."""

    exit_code = 2
