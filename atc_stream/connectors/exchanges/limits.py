"""REST request weight limiting by the exchange's own accounting (budget per window).

``WeightRules``: an exchange's budget (its ``Exchange.limits``). ``WeightLimiter`` spends
it (Binance spot: 6,000 a minute per IP), follows the used weight each response reports,
pauses every request on a 429's ``Retry-After`` and stops for good on a ban.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WeightRules:
    """How an exchange limits REST requests (its ``Exchange.limits``): ``budget`` weight
    per ``window`` seconds (fixed windows aligned to multiples of ``window`` on the
    clock), ``request_weight`` per klines request, and the response header that reports
    the weight used so far in the current window (None: the exchange reports none)."""

    budget: int
    window: float
    request_weight: int
    used_weight_header: str | None = None

    def __post_init__(self) -> None:
        for name in ("budget", "request_weight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not (isinstance(self.window, (int, float)) and self.window > 0):
            raise ValueError(f"window must be > 0 s, got {self.window!r}")


#: Share of the budget kept unspent: the exchange's window edges and other clients on
#: the same IP are only known through the used-weight header, which lags.
SAFETY_MARGIN = 0.1


class RateLimitBan(RuntimeError):
    """The exchange banned this client (HTTP 418): no request may go until ``until``."""

    def __init__(self, message: str, until: float | None) -> None:
        super().__init__(message)
        self.until = until  #: the clock's time the ban ends (None: not said)


def _wall_aligned_clock() -> Callable[[], float]:
    """A monotonic clock in wall-clock seconds: windows line up with the exchange's (which
    start on whole minutes) and a wall-clock step does not stretch a wait."""
    offset = time.time() - time.monotonic()
    return lambda: time.monotonic() + offset


class WeightLimiter:
    """Lets a request go once its weight fits in the current window's budget.

    Its own count of the weight spent in the current window is corrected from the
    exchange's used-weight header (the higher number wins). Past ``budget x (1 -
    margin)`` requests wait for the next window; after a 429 every request waits out its
    ``Retry-After``; after a 418 every ``acquire`` raises ``RateLimitBan``.
    ``clock`` (seconds) and ``sleep`` are injectable for tests.
    """

    def __init__(
        self,
        rules: WeightRules,
        budget: int | None = None,
        *,
        margin: float = SAFETY_MARGIN,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        budget = rules.budget if budget is None else budget
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError(f"weight budget must be an int >= 1, got {budget!r}")
        if not 0 <= margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {margin!r}")
        self.rules = rules
        self.budget = budget
        #: weight spent per window at most (at least one request's worth)
        self.usable = max(rules.request_weight, math.floor(budget * (1 - margin)))
        self._clock = clock or _wall_aligned_clock()
        self._sleep = sleep
        self._window = self._window_of(self._clock())
        self.spent = 0  #: weight spent in the current window (own count or the exchange's)
        self.paused_until = -math.inf  #: no request goes before this (a 429's Retry-After)
        self.ban: RateLimitBan | None = None
        self.waits = 0  #: requests that had to wait (budget or pause)
        self.waited = 0.0  #: seconds requests waited, summed over them
        self.pauses = 0  #: 429 answers that paused every request

    def _window_of(self, now: float) -> int:
        return math.floor(now / self.rules.window)

    def _roll(self, now: float) -> int:
        window = self._window_of(now)
        if window != self._window:
            self._window, self.spent = window, 0
        return window

    @property
    def used(self) -> int:
        """Weight used in the current window, as far as known."""
        self._roll(self._clock())
        return self.spent

    async def acquire(self, weight: int | None = None) -> int:
        """Waits until a request of ``weight`` (default: the rules' request weight) may
        go and counts it; returns the window it goes in (for ``record``). Raises
        ``RateLimitBan`` once the exchange banned this client."""
        weight = self.rules.request_weight if weight is None else weight
        waited = False
        while True:
            if self.ban is not None:
                raise self.ban
            now = self._clock()
            window = self._roll(now)
            if now < self.paused_until:
                delay = self.paused_until - now
            elif self.spent == 0 or self.spent + weight <= self.usable:
                self.spent += weight
                return window
            else:
                delay = (window + 1) * self.rules.window - now
            if not waited:
                waited = True
                self.waits += 1
            self.waited += delay
            await self._sleep(delay)

    def record(self, window: int, status: int, headers: Any) -> None:
        """Takes in one response to a request ``acquire`` let go in ``window``: the used
        weight it reports (when it counts more than we did), a 429's ``Retry-After``
        (every request waits it out) or a 418 (``acquire`` raises from now on)."""
        now = self._clock()
        current = self._roll(now)
        name = self.rules.used_weight_header
        reported = _int_header(headers, name) if name else None
        # a response to a request of an earlier window reports that window's weight
        if reported is not None and window == current and reported > self.spent:
            self.spent = reported
        if status not in (418, 429):
            return
        retry_after = _seconds_header(headers, "Retry-After")
        if status == 429:
            if retry_after is None:  # the exchange counts per window: the rest of this one
                retry_after = (current + 1) * self.rules.window - now
            self.paused_until = max(self.paused_until, now + retry_after)
            self.pauses += 1
            return
        until = None if retry_after is None else now + retry_after
        span = "" if retry_after is None else f" for {retry_after:g} s (Retry-After)"
        self.ban = RateLimitBan(
            f"HTTP 418: the exchange banned this IP{span} for sending too many requests; "
            "stopped rather than send more (a lower REST weight budget avoids it)",
            until,
        )
        raise self.ban


def _int_header(headers: Any, name: str) -> int | None:
    value = headers.get(name)
    try:
        number = int(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return number if number is not None and number >= 0 else None


def _seconds_header(headers: Any, name: str) -> float | None:
    """A delay in seconds, capped at a day (a larger one is taken as a day)."""
    value = headers.get(name)
    try:
        seconds = float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    if seconds is None or not seconds >= 0:  # NaN too
        return None
    return min(seconds, 86_400.0)
