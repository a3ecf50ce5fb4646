"""Bar interval labels ("1s", "1m", "4h", "1d", "1w", "1M") and their arithmetic.

Fixed-length intervals are ``<count><unit>`` with unit ``ms``, ``s``, ``m`` (minute),
``h``, ``d`` or ``w``; ``<count>M`` is calendar months (as on exchanges: ``1M`` bars
open at 00:00 UTC on the first of each month), which has no fixed length.
Times are integer milliseconds since the Unix epoch. Pure Python, no dependencies.
"""

from __future__ import annotations

import datetime as _dt
import functools
import re

_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_PATTERN = re.compile(r"^([1-9][0-9]*)(ms|s|m|h|d|w|M)$")


def _split(interval: str) -> tuple[int, str]:
    parts = _split_label(interval) if isinstance(interval, str) else None
    if parts is None:
        raise ValueError(
            "interval must look like 1s, 1m, 15m, 4h, 1d, 1w or 1M (a count from 1 and a "
            f"unit: ms, s, m, h, d, w, or M for calendar months), got {interval!r}"
        )
    return parts


@functools.lru_cache(maxsize=256)
def _split_label(interval: str) -> tuple[int, str] | None:
    # cached: the live client asks for every kline it checks (a regex match each time)
    match = _PATTERN.match(interval)
    return None if match is None else (int(match.group(1)), match.group(2))


def is_interval(interval: object) -> bool:
    """Whether ``interval`` is a label this module reads (``validate_interval`` passes)."""
    return isinstance(interval, str) and _split_label(interval) is not None


def validate_interval(interval: str) -> str:
    """Return ``interval`` unchanged, or raise ``ValueError`` naming it."""
    _split(interval)
    return interval


def is_calendar(interval: str) -> bool:
    """True for month intervals (``1M``), whose length varies."""
    return _split(interval)[1] == "M"


def interval_ms(interval: str) -> int:
    """Length in ms of a fixed-length interval; ``ValueError`` for months."""
    count, unit = _split(interval)
    if unit == "M":
        raise ValueError(f"interval {interval!r} (months) has no fixed length")
    return count * _UNIT_MS[unit]


def approx_interval_ms(interval: str) -> int:
    """Length in ms, months counted as 31 days (an upper bound, for ranges and lags)."""
    count, unit = _split(interval)
    return count * (31 * 86_400_000 if unit == "M" else _UNIT_MS[unit])


def next_open(open_time: int, interval: str) -> int:
    """Open time of the bar after the one opening at ``open_time``."""
    count, unit = _split(interval)
    if unit != "M":
        return open_time + count * _UNIT_MS[unit]
    d = _dt.datetime.fromtimestamp(open_time / 1000, tz=_dt.timezone.utc)
    months = d.year * 12 + (d.month - 1) + count
    nxt = _dt.datetime(months // 12, months % 12 + 1, 1, tzinfo=_dt.timezone.utc)
    return int(nxt.timestamp()) * 1000


#: Weekly bars open on Mondays 00:00 UTC (the exchange's grid); 1970-01-05 was a Monday.
_WEEK_ORIGIN_MS = 4 * 86_400_000


def on_grid(open_time: int, interval: str) -> bool:
    """Whether ``open_time`` is a bar open time of ``interval`` (whole minutes for ``1m``,
    Mondays for weeks, the 1st of a month for months; all UTC)."""
    count, unit = _split(interval)
    if unit == "M":
        d = _dt.datetime.fromtimestamp(open_time / 1000, tz=_dt.timezone.utc)
        return open_time % 86_400_000 == 0 and d.day == 1
    size = count * _UNIT_MS[unit]
    origin = _WEEK_ORIGIN_MS if unit == "w" else 0
    return (open_time - origin) % size == 0


def interval_label(ms: int) -> str:
    """``60000`` → ``"1m"``: the largest unit (w, d, h, m, s, ms) that divides ``ms``."""
    for unit, size in (("w", 604_800_000), ("d", 86_400_000), ("h", 3_600_000),
                       ("m", 60_000), ("s", 1_000)):  # fmt: skip
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
