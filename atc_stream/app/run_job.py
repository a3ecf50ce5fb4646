"""Run a command's job: its exit status becomes the command's, and what it refuses is one
line (a usage error for an option, exit 2 for a run), never a traceback."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress

import typer

from atc_stream.app import jobs
from atc_stream.app.console import OptionError, RunError, error, lines_are_logged
from atc_stream.app.jobs import load_job


@contextmanager
def user_errors() -> Iterator[None]:
    """Errors meant for the user (bad option, unusable output, refused resume) become one
    line on stderr and exit status 2, never a traceback."""
    from atc_stream.app.console import interrupted, reader_gone

    jobs.started = True
    try:
        from atc_stream.io.writers import OutputError, ReaderGone  # a Ctrl-C may come here

        yield
    except KeyboardInterrupt as exc:  # typer would end the command with 130 and not a word
        interrupted(exc)
        raise typer.Exit(130) from None
    except ReaderGone:  # `| head` has what it wants: not a word
        reader_gone()
        raise typer.Exit(141) from None
    except (RunError, OutputError) as exc:
        error(str(exc))
        raise typer.Exit(2) from None


def run_job(job: str, *, logs: AbstractContextManager | None = None, **options) -> None:
    """Run one job of ``atc_stream.app.jobs`` (``"module:function"``) with the command's
    options: its exit status becomes the command's; a refused option is a usage error, a
    refused run one line and exit 2 (``user_errors``). ``logs``: how its lines are
    written (``--log-format``). The job is imported inside, so that a Ctrl-C while it
    loads (the engine, numba: most of a second) is the command's one line too."""
    with logs or nullcontext(), user_errors():
        try:
            run = load_job(job)
            _unwind_ctrl_c()
            status = run(**options)
        except OptionError as exc:
            if not lines_are_logged():
                raise typer.BadParameter(str(exc), param_hint=exc.param_hint) from None
            # click would print it after the log format is undone: log it as a line
            hint = f" for {exc.param_hint}" if exc.param_hint else ""
            error(f"Invalid value{hint}: {exc}")
            raise typer.Exit(2) from None
    if status:
        raise typer.Exit(status)


def _unwind_ctrl_c() -> None:
    """The job is loaded: from here a Ctrl-C unwinds as Python's does (its ``finally``
    clauses run: outputs closed, a sweep's Ray shut down), also inside a later import.
    ``entry``'s handler, which ends the process at once inside an import, was for the
    command's loading only."""
    if getattr(signal.getsignal(signal.SIGINT), "while_loading", False):
        with suppress(ValueError):  # not the main thread: not ours to change
            signal.signal(signal.SIGINT, signal.default_int_handler)
