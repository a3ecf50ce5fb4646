"""Errors shared by every floor: a bad input file (``InputError``), and the one-line form
of an exception for a user message."""

from __future__ import annotations


class InputError(ValueError):
    """An input file cannot be read (one line for the user; the CLI exits 2)."""


def first_line(exc: BaseException) -> str:
    """The first non-empty line of ``exc``'s message, or its type name when it has none."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__
