"""Garbage collection between bursts of klines, not inside them (docs/design/live-feed.md)."""

from __future__ import annotations

import asyncio
import gc
import math
import time
from collections.abc import Callable
from typing import Any


class IdleCollector:
    """Moves the cyclic garbage collector out of the bursts of klines: automatic
    collection is off while the feed runs, and the collection CPython would have run by
    then (the oldest generation past its threshold) runs once the consumer has had
    nothing to apply for ``quiet`` seconds. A burst of 200 klines otherwise triggers a
    collection of 0.1-0.4 ms on most bars, between its first kline and its signals;
    right after a burst it would compete for the CPU with the signals' delivery.

    ``room()`` (``BurstClock.room_s``) says how many seconds are left before the next
    burst: a collection runs only if it fits, by the time the last one of its
    generation took (``UNMEASURED_S`` before any). During a start-up, a full collection
    over the histories' klines takes 50-80 ms; started just before a close, it made the
    first live bar that late."""

    quiet = 0.05
    #: assumed duration (s) of a collection not measured yet
    UNMEASURED_S = 0.1

    def __init__(self, room: Callable[[], float] | None = None) -> None:
        self._freeze_pending = False
        self._room = room or (lambda: math.inf)
        #: seconds the last collection of each generation took (3: collect and freeze)
        self.took = [self.UNMEASURED_S] * 4

    def __enter__(self) -> IdleCollector:
        self._was_enabled = gc.isenabled()
        gc.disable()
        return self

    def freeze_when_quiet(self) -> None:
        """At the next quiet moment, collect the young generations and move the
        survivors out of the collector's view for good (``gc.freeze``): the start-up's
        tens of thousands of parsed klines cost a collection of a few ms, which must not
        land between a burst's klines and its signals."""
        self._freeze_pending = True

    def __exit__(self, *exc: object) -> None:
        if self._was_enabled:
            gc.enable()

    def due(self, overdue: bool = False) -> bool:
        """Whether a collection is due (``overdue``: long overdue, for a backlog that
        never lets the consumer go quiet)."""
        if not self._was_enabled:
            return False
        count, threshold = gc.get_count()[0], gc.get_threshold()[0]
        return 0 < threshold < count and (not overdue or count > 100 * threshold)

    def _generation(self) -> int:
        """The generation CPython would collect now."""
        counts, thresholds = gc.get_count(), gc.get_threshold()
        return next(g for g in (2, 1, 0) if g == 0 or counts[g] > thresholds[g])

    def collect_if_room(self, generation: int) -> bool:
        """Collects ``generation`` if the last such collection would fit before the next
        burst, timing it (3 collects the young generations and freezes the survivors);
        whether it ran."""
        if self.took[generation] > self._room():
            return False
        started = time.perf_counter()
        if generation == 3:
            gc.collect(1)
            gc.freeze()
        else:
            gc.collect(generation)
        self.took[generation] = time.perf_counter() - started
        return True

    async def get(self, queue: asyncio.Queue[Any]) -> Any:
        """The next item of ``queue``; a due collection runs while it waits, once the
        queue has been empty for ``quiet`` seconds."""
        if not queue.empty() or not (self.due() or self._freeze_pending):
            if self.due(overdue=True):
                self.collect_if_room(self._generation())  # else after the next burst
            return await queue.get()
        # a timer, not wait_for: a cancelled wait_for that got its item swallows the
        # cancellation (Python < 3.12), and the consumer would never end
        timer = asyncio.get_running_loop().call_later(self.quiet, self._collect_if_empty, queue)
        try:
            return await queue.get()
        finally:
            timer.cancel()

    def _collect_if_empty(self, queue: asyncio.Queue[Any]) -> None:
        if not queue.empty():
            return
        if self._freeze_pending:
            if self.collect_if_room(3):  # else at the next quiet moment
                self._freeze_pending = False
        elif self.due():
            self.collect_if_room(self._generation())
