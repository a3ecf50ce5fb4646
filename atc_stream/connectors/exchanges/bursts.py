"""When the next burst of closed klines is due: start-up work and collections go between
bursts, and the step's path is warmed up just before one."""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable

log = logging.getLogger("atc_stream.binance")


class BurstClock:
    """The bar grid as the feed sees it: every symbol's closed kline comes in a burst
    just after each close. Work that can wait (a start-up's batched warmup, a garbage
    collection) asks :meth:`room_s` how much time is left before the next burst and
    runs only if it fits, so the first live bars are not delayed by the last histories.

    ``interval_ms`` None (calendar bars) or no bar stepped yet: no burst to keep clear
    of, ``room_s`` is infinite. The grid's phase comes from the open times stepped
    (weeks need not start at the epoch); a burst is taken to last until ``settle_ms``
    after its close: the recent bursts' lag (close to step, see :meth:`stepped`) plus
    a margin, at least ``MIN_SETTLE_MS``, at most half an interval or ``MAX_SETTLE_MS``.
    """

    #: ms kept clear before a close
    margin_ms = 5
    #: least ms after a close treated as its burst
    MIN_SETTLE_MS = 20
    #: most: a consumer far behind must not hold the start-up back for half an interval
    MAX_SETTLE_MS = 2_000
    #: bursts whose lag is remembered
    LAGS = 8
    #: ms of a burst's lag (close to step) taken to be its own applying, not waiting
    APPLY_MS = 10
    #: seconds of the event loop a REST page of klines is taken to need (a few hundred
    #: klines decoded and parsed: ~2 ms)
    PAGE_S = 0.005

    def __init__(self, interval_ms: int | None, clock_ms: Callable[[], int]) -> None:
        self.interval_ms = interval_ms
        self.clock_ms = clock_ms
        self._origin: int | None = None  #: a close on the grid (an open time stepped)
        self._lags: deque[int] = deque(maxlen=self.LAGS)

    def stepped(self, newest_open: int, now_ms: int | None = None, burst: bool = True) -> None:
        """Closed bars up to the one opening at ``newest_open`` were stepped now: it
        fixes the grid's phase and, for a ``burst`` (klines as the websocket brought
        them, not histories or backfills caught up later) of the latest closed bar, the
        bursts' lag."""
        iv = self.interval_ms
        if iv is None:
            return
        now = self.clock_ms() if now_ms is None else now_ms
        self._origin = newest_open
        lag = now - (newest_open + iv)
        if burst and 0 <= lag < iv:
            self._lags.append(lag)

    @property
    def settle_ms(self) -> float:
        """How long after a close its burst is taken to last."""
        iv = self.interval_ms or 0
        lag = max(self._lags, default=0)
        return min(max(lag + 10, self.MIN_SETTLE_MS), iv / 2, self.MAX_SETTLE_MS)

    def next_burst_ms(self, now_ms: int | None = None) -> int | None:
        """When (clock ms) the next burst's first klines are expected: a close plus the
        shortest recent lag, less the ``APPLY_MS`` a burst takes to apply (never before
        the close); None while no bar has been stepped, or bars are calendar ones."""
        iv = self.interval_ms
        if iv is None or self._origin is None:
            return None
        now = self.clock_ms() if now_ms is None else now_ms
        lag = max(min(self._lags, default=0) - self.APPLY_MS, 0)
        ahead = lag - (now - self._origin) % iv
        return now + (ahead if ahead >= 0 else ahead + iv)

    def _phase(self, now: int) -> float:
        """ms since the latest close (``0 <= phase < interval``)."""
        assert self.interval_ms is not None and self._origin is not None
        return (now - self._origin) % self.interval_ms

    def room_s(self, now_ms: int | None = None) -> float:
        """Seconds of work that fit before the next burst: 0 while one is under way,
        infinite when no burst is expected."""
        iv = self.interval_ms
        if iv is None or self._origin is None:
            return math.inf
        phase = self._phase(self.clock_ms() if now_ms is None else now_ms)
        if phase < self.settle_ms:
            return 0.0
        return max(0.0, (iv - self.margin_ms - phase) / 1000)

    async def wait_for_room(self, seconds: float) -> None:
        """Returns once ``seconds`` of work fit before the next burst, or (work longer
        than the room between two bursts) right after a burst; waits at most two
        intervals."""
        iv = self.interval_ms
        if iv is None or self._origin is None or self.room_s() >= seconds:
            return
        if seconds * 1000 > iv - self.margin_ms - self.settle_ms:
            waits = 1  # never fits: start right after the next burst
        else:
            waits = 2
        for _ in range(waits):
            phase = self._phase(self.clock_ms())
            after_burst = self.settle_ms - phase
            if after_burst <= 0:
                after_burst += iv
            await asyncio.sleep(after_burst / 1000)
            if self.room_s() >= seconds:
                return

    async def clear_for_page(self) -> None:
        """Returns once a REST page fits before the next burst (``wait_for_room``)."""
        await self.wait_for_room(self.PAGE_S)

    async def before_bursts(self, lead_s: float, warm: Callable[[], object]) -> None:
        """Calls ``warm()`` ``lead_s`` before each burst is expected, once a burst, until
        cancelled. An exception from ``warm`` is logged once and ends the warm-ups, not
        the feed.

        The feed warms the step's path with it (docs/design/live-feed.md, "Warm caches
        before a close"): after a second of idling, the CPU's caches hold what other
        processes touched, and a burst met cold took ~0.4 ms longer at 200 symbols."""
        polled = None  # the burst (its expected start) warmed up for last
        while True:
            now = self.clock_ms()
            expected = self.next_burst_ms(now)
            if expected is None or expected == polled:  # no grid yet, or done for this one
                await asyncio.sleep(0.1 if self.interval_ms is None else self.interval_ms / 4000)
                continue
            ahead = (expected - now) / 1000
            if ahead > lead_s:
                await asyncio.sleep(ahead - lead_s)
                continue  # the grid or the lags may have moved meanwhile
            polled = expected
            try:
                warm()
            except Exception:  # a warm-up is worth nothing next to a running feed
                log.exception("warming up before bursts failed; the feed goes on without")
                return
