"""The work behind each ``atc-stream`` command, one module per command (``cli.py`` only
declares options and calls one function here).

A job function takes the command's option values, returns the exit status, and raises
``OptionError`` for an option value it refuses (the CLI shows it like a usage error),
``runner.RunError`` / ``io.writers.OutputError`` for a run that cannot start or resume
(one line, exit 2). Progress and summaries go to stderr through ``err``.
"""

from __future__ import annotations

import sys


class OptionError(ValueError):
    """An option value a job refuses; ``param_hint`` names the option (e.g. ``--symbols``)."""

    def __init__(self, message: str, param_hint: str | None = None) -> None:
        super().__init__(message)
        self.param_hint = param_hint


def err(line: str) -> None:
    """One line to stderr (stdout is for signals)."""
    print(line, file=sys.stderr)
