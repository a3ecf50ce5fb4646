"""The ``atc-stream`` command's entry point: a Ctrl-C while the command loads ends it
with one line and exit status 130, as one during a job does, never a traceback."""

from __future__ import annotations

import sys

#: the exit status of a command stopped by Ctrl-C (128 + SIGINT), as a shell reports it
INTERRUPTED = 130


def main() -> None:
    """Load the CLI (the engine, numba, numpy: most of a second) and run it."""
    try:
        from atc_stream.app.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt as exc:  # later ones: the job's handling, or typer's 130
        _interrupted(exc)
    finally:
        _ignore_signals_once_stopped()


def _ignore_signals_once_stopped() -> None:
    """After a run stopped by a signal, SIGTERM is ignored: a service manager's second
    SIGTERM would otherwise meet the default action while the interpreter shuts down
    (Python puts its handlers back then) and end a clean stop as "killed"."""
    durability = sys.modules.get("atc_stream.app.durability")
    if durability is not None and durability.Durability.signalled:
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _interrupted(exc: KeyboardInterrupt) -> None:
    try:
        from atc_stream.app.console import interrupted
    except BaseException:  # a second Ctrl-C while it loads, or what the first one cut short
        sys.stderr.write("atc-stream: interrupted\n")
    else:
        interrupted(exc)
    raise SystemExit(INTERRUPTED) from None
