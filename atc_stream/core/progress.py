"""Progress bars on stderr that log records do not break: while a bar is shown, warnings
go above it through ``tqdm.write`` instead of into the middle of its line."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class NoBar:
    """Stands in for a bar when none is shown (tqdm is then not imported: the engine runs
    where only numpy and numba are installed)."""

    def update(self, n: int = 1) -> None:
        pass

    def refresh(self) -> None:
        pass


@contextmanager
def progress_bar(enabled: bool, **options: Any) -> Iterator[Any]:
    """A tqdm bar made with ``options`` and closed on exit, or a ``NoBar`` when not
    ``enabled``. While the bar is shown, the root logger's console handlers write
    through ``tqdm.write`` (tqdm's ``logging_redirect_tqdm``): a warning logged meanwhile
    gets a line of its own, and the bar is drawn again below it."""
    if not enabled:
        yield NoBar()
        return
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    with logging_redirect_tqdm(), tqdm(**options) as bar:
        yield bar
