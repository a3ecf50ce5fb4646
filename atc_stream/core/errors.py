"""Error text shared by every floor: the one-line form of an exception for a user message."""

from __future__ import annotations


def first_line(exc: BaseException) -> str:
    """The first non-empty line of ``exc``'s message, or its type name when it has none."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__
