"""The ``atc-stream`` command's entry point: a Ctrl-C while the command loads ends it
with one line and exit status 130, as one during a job does, never a traceback."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from types import FrameType
from typing import Any

#: the exit status of a command stopped by Ctrl-C (128 + SIGINT), as a shell reports it
INTERRUPTED = 130
#: the command's line for it, where ``console`` (which says it otherwise) is not loaded
_INTERRUPTED_LINE = "atc-stream: interrupted\n"

#: the modules of the import machinery: a frame of theirs on the stack means an import
_IMPORT_MACHINERY = frozenset({"importlib._bootstrap", "importlib._bootstrap_external"})


def main() -> None:
    """Load the CLI (the engine, numba, numpy: most of a second) and run it."""
    previous = _take_ctrl_c()  # first: before anything heavy is imported
    try:
        from atc_stream.app.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt as exc:  # later ones: the job's handling, or typer's 130
        _interrupted(exc)
    finally:
        _ignore_signals_once_stopped()
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _take_ctrl_c() -> Any:
    """Installs the command's SIGINT handler (in the main thread, over Python's default
    one); the handler it replaces, or None when it left it alone."""
    try:
        previous = signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:  # not the main thread: signals are not ours to take
        return None
    if previous is not signal.default_int_handler:  # an embedding program's: theirs
        signal.signal(signal.SIGINT, previous)
        return None
    return previous


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C: ``KeyboardInterrupt`` as Python's own handler raises it (the command then
    says its one line), except inside an import (most of the command's loading). An
    interrupted import cannot be unwound into that line: a compiled module (numba's)
    turns the interrupt into an ``ImportError``, a traceback, and a module left half run
    stays broken; so the process ends there, with its line and stdout flushed."""
    if _importing(frame):
        _say_interrupted()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os._exit(INTERRUPTED)
    raise KeyboardInterrupt


#: what ``run_job`` looks for: this handler is for the command's loading only
_on_sigint.while_loading = True  # type: ignore[attr-defined]


def _importing(frame: FrameType | None) -> bool:
    """Whether ``frame`` (the one a signal interrupted) runs inside an import."""
    while frame is not None:
        if frame.f_globals.get("__name__") in _IMPORT_MACHINERY:
            return True
        frame = frame.f_back
    return False


def _say_interrupted() -> None:
    """The command's line, as its other lines go (a JSON record with ``--log-format
    json``), or straight to stderr's descriptor while the console is not loaded."""
    console = sys.modules.get("atc_stream.app.console")
    with contextlib.suppress(Exception):  # (a console module still loading has no lines)
        if console is not None and console.lines_are_logged():
            console.err(console.INTERRUPTED_LINE)
            return
    os.write(2, _INTERRUPTED_LINE.encode())


def _ignore_signals_once_stopped() -> None:
    """After a run stopped by a signal, SIGTERM is ignored: a service manager's second
    SIGTERM would otherwise meet the default action while the interpreter shuts down
    (Python puts its handlers back then) and end a clean stop as "killed"."""
    durability = sys.modules.get("atc_stream.app.durability")
    if durability is not None and durability.Durability.signalled:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _interrupted(exc: KeyboardInterrupt) -> None:
    try:
        from atc_stream.app.console import interrupted
    except BaseException:  # a second Ctrl-C while it loads, or what the first one cut short
        sys.stderr.write(_INTERRUPTED_LINE)
    else:
        interrupted(exc)
    raise SystemExit(INTERRUPTED) from None
