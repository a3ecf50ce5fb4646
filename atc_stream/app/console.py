"""What a command tells its user: one line to stderr, and the errors that become one.

A job raises ``OptionError`` for an option value it refuses (the CLI shows it like a
usage error) and ``RunError`` for a run that cannot start or resume (one line, exit 2).
Progress and summaries go to stderr through ``err``; stdout is for signals.
"""

from __future__ import annotations

import sys


class OptionError(ValueError):
    """An option value a job refuses; ``param_hint`` names the option (e.g. ``--symbols``)."""

    def __init__(self, message: str, param_hint: str | None = None) -> None:
        super().__init__(message)
        self.param_hint = param_hint


class RunError(Exception):
    """A run cannot start or resume as asked; the message is one line for the user."""


def err(line: str) -> None:
    """One line to stderr (stdout is for signals)."""
    print(line, file=sys.stderr)
