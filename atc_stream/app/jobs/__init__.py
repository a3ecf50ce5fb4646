"""The work behind each ``atc-stream`` command, one module per command (``cli.py`` only
declares options and calls one function here).

A job function takes the command's option values and returns the exit status; what it
refuses and what it says go through ``app.console``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

#: whether this process's command has reached its job's own error handling (the CLI's,
#: or ``load_job``); a Ctrl-C before that came while typer parsed the command line
started = False


def load_job(job: str) -> Callable[..., int]:
    """The job function ``"module:function"`` of this package (imported on the call, so
    a command pays for its own job's imports only, inside its error handling)."""
    global started
    started = True
    module, function = job.split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), function)
