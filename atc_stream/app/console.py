"""What a command tells its user on stderr, and the errors that become one line there.

A job raises ``OptionError`` for an option value it refuses (the CLI shows it like a
usage error) and ``RunError`` for a run that cannot start or resume (one line, exit 2).
Progress, notes and summaries go to stderr through ``err``; stdout is for signals.
With ``--log-format json`` (``app.logs``) those lines go to a sink that logs them instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from atc_stream.core.params import ATCParams, load_param_sets

#: How every user-facing line starts.
PROGRAM = "atc-stream"

#: Where ``err`` sends its lines instead of stderr, when set: ``(line, level, fields)``.
LineSink = Callable[[str, str, Mapping[str, Any] | None], None]
_sink: LineSink | None = None


class OptionError(ValueError):
    """An option value a job refuses; ``param_hint`` names the option (e.g. ``--symbols``)."""

    def __init__(self, message: str, param_hint: str | None = None) -> None:
        super().__init__(message)
        self.param_hint = param_hint


class RunError(Exception):
    """A run cannot start or resume as asked; the message is one line for the user."""


def param_sets_option(path: str | os.PathLike | None) -> list[ATCParams] | None:
    """The parameter sets of ``--params`` (None when not given); a file that cannot be
    read or holds invalid parameters is an ``OptionError``."""
    if path is None:
        return None
    try:
        return load_param_sets(path)
    except ValueError as exc:
        raise OptionError(str(exc)) from None


def set_line_sink(sink: LineSink | None) -> LineSink | None:
    """Sends the lines of ``err`` to ``sink`` (None: to stderr again); the sink before."""
    global _sink
    before, _sink = _sink, sink
    return before


def lines_are_logged() -> bool:
    """Whether ``err`` lines go to a line sink (``--log-format json``), not to stderr."""
    return _sink is not None


def err(
    line: str, *, end: str = "\n", level: str = "info", fields: Mapping[str, Any] | None = None
) -> None:
    """A line to stderr (stdout is for signals); ``end=""`` for a line redrawn in place.
    ``level`` and ``fields`` (values the line shows) are for a line sink."""
    if _sink is not None:
        if line.strip():
            _sink(line, level, fields)
        return
    print(line, end=end, file=sys.stderr, flush=not end)


def error(message: str) -> None:
    """The one line of an error that ends the command."""
    err(f"{PROGRAM}: error: {message}", level="error")


def reader_gone() -> None:
    """stdout's reader closed the pipe: stdout goes to the null device, so that the
    interpreter's flush at exit has no write left to fail (and report)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


#: The one line of a command stopped by Ctrl-C.
INTERRUPTED_LINE = f"{PROGRAM}: interrupted"


def interrupted(exc: KeyboardInterrupt, line: str = INTERRUPTED_LINE) -> None:
    """The line of a command stopped by Ctrl-C (or ``line``). Work cut short mid-call (a
    kernel compile) can leave objects half built in the frames it unwound, whose
    finalizers then fail and print tracebacks as the process exits: those frames are
    emptied now, with such failures unreported, so the line stays the command's only one."""
    import gc

    hook = sys.unraisablehook
    sys.unraisablehook = lambda _: None
    try:
        tb = exc.__traceback__
        while tb is not None:
            with contextlib.suppress(RuntimeError):  # a frame still running keeps its locals
                tb.tb_frame.clear()
            tb = tb.tb_next
        gc.collect()
    finally:
        sys.unraisablehook = hook
    err(line)


def stderr_is_terminal() -> bool:
    """Whether stderr is a terminal (progress bars and status lines redraw in place)."""
    return sys.stderr.isatty()


def status(line: str, fields: Mapping[str, Any] | None = None) -> None:
    """A status line: redrawn in place on a terminal, one line each otherwise."""
    if _sink is None and stderr_is_terminal():
        err(f"\r{line:<110}", end="")
    else:
        err(line, fields=fields)


def log_warnings() -> None:
    """Warnings logged by the modules a command runs go to stderr, as lines of the command."""
    logging.basicConfig(level=logging.WARNING, format=f"{PROGRAM}: %(levelname)s %(message)s")


_PASSWORD = re.compile(r"(//[^:@/]*:)[^@/]*@")


def shown_url(url: str) -> str:
    """``url`` as a line on stderr shows it: without its password, if it has one."""
    return _PASSWORD.sub(r"\1***@", url)


def redis_failure(url: str, exc: BaseException, doing: str = "") -> RunError:
    """The ``RunError`` of a ``redis`` exception raised against ``url``: Redis cannot be
    reached (refused, reset or timed out; credentials refused) or it refused a command
    (a key of the wrong type, a database number out of range). ``doing``: what failed."""
    import redis  # only called where the redis extra is installed

    text = " ".join(str(exc).split()) or type(exc).__name__
    what = f" ({doing})" if doing else ""
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OSError)):
        return RunError(f"cannot reach Redis at {shown_url(url)}{what}: {text}")
    return RunError(f"Redis at {shown_url(url)} refused a command{what}: {text}")


#: typer's validation wording (pydantic's), said as a person would
PLAIN_WORDING = (
    ("Value error, ", ""),
    ("Input should be a valid integer, unable to parse string as an integer", "not an integer"),
    ("Input should be a valid number, unable to parse string as a number", "not a number"),
    ("Input should be greater than or equal to ", "must be at least "),
    ("Input should be less than or equal to ", "must be at most "),
)


#: click quotes an option it names itself ("Invalid value for '--interval'") but not one a
#: job names ("Invalid value for --interval"): one form for both
_QUOTED_OPTIONS = re.compile(r"Invalid value for ((?:'-[^' ]+'(?: / )?)+)")


def plain_usage_error(message: str) -> str:
    """A usage error as a person would say it: pydantic's wording plain, options named
    one way."""
    for validator, plain in PLAIN_WORDING:
        message = message.replace(validator, plain)
    return _QUOTED_OPTIONS.sub(
        lambda match: "Invalid value for " + match.group(1).replace("'", ""), message
    )
