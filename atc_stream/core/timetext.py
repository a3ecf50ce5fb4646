"""Strict parsing of one time written as text: an integer epoch or ISO-8601 / RFC 3339.

Shared by the tick reader (``replay/ticks.py``) and the Redis Stream adapter
(``adapters/redis_streams.py``). Results are split into epoch **milliseconds** (the
engine's unit, floored) and the **nanoseconds within that millisecond** (0..999,999), so
sub-millisecond times keep their order without overflowing int64 for any present-day
date (a plain int64 of nanoseconds ends in 2262).

Accepted ISO forms (checked by ``ISO_PATTERN`` before ``datetime.fromisoformat``, so no
week dates, ordinal dates or basic format slip in)::

    2024-03-01                       midnight UTC
    2024-03-01T12:30  / 12:30:05     "T" or one space between date and time
    2024-03-01T12:30:05.123456789    any number of fraction digits (beyond 9: floored)
    ...Z / ...z / ...+02:00 / ...-0530   zone; without one the time is UTC

Integers: ``[+-]digits`` only (no ``1_0``, no spaces inside, no decimal point), in a
given unit (s/ms/us/ns), by magnitude (``auto``), or as they are (``None``: epoch ms).
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

from atc_stream.core.inputs import EPOCH_BANDS

__all__ = [
    "ISO_REGEX",
    "ISO_PATTERN",
    "INT_PATTERN",
    "iso_parts",
    "int_epoch_parts",
    "epoch_to_ms",
    "text_to_ms",
]

_DATE, _HOUR_MINUTE, _SECOND = r"\d{4}-\d{2}-\d{2}", r"[T ]\d{2}:\d{2}", r":\d{2}"
_ZONE = r"[Zz]|[+-]\d{2}(?::?\d{2})?"
#: The accepted ISO forms as a regular expression (RE2-compatible: Arrow's
#: ``match_substring_regex`` can check a whole column with it; anchor it there).
ISO_REGEX = rf"{_DATE}(?:{_HOUR_MINUTE}(?:{_SECOND}(?:[.,]\d+)?)?)?(?:{_ZONE})?"
ISO_PATTERN = re.compile(ISO_REGEX, re.ASCII)
_ISO_PARTS = re.compile(
    rf"(?P<base>{_DATE}(?:{_HOUR_MINUTE}(?:{_SECOND})?)?)(?:[.,](?P<frac>\d+))?(?P<zone>{_ZONE})?",
    re.ASCII,
)
INT_PATTERN = re.compile(r"[+-]?\d+", re.ASCII)
#: Longer cells are refused without a look (no valid time comes close).
MAX_TIME_CHARS = 64
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_NS_PER_MS = 1_000_000


def iso_parts(text: str) -> tuple[int, int] | None:
    """(epoch ms, ns within the ms) of an ISO-8601 / RFC 3339 time; None if it is not one.

    The fraction must follow whole seconds (``12:30:05.5``, not ``12:30.5``).
    """
    if not text or len(text) > MAX_TIME_CHARS:
        return None
    if ISO_PATTERN.fullmatch(text) is None:
        return None
    base, frac, zone = _ISO_PARTS.fullmatch(text).group("base", "frac", "zone")
    if zone in ("Z", "z"):
        zone = "+00:00"
    try:
        moment = datetime.fromisoformat(base + (zone or ""))
    except ValueError:  # 2024-02-30, 25:00, zone +24:00 ...
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    delta = moment - _EPOCH
    ms = (delta.days * 86_400 + delta.seconds) * 1000
    if frac:
        ns = int(frac[:9].ljust(9, "0"))
        ms += ns // _NS_PER_MS
        return ms, ns % _NS_PER_MS
    return ms, 0


def int_epoch_parts(value: int, unit: str) -> tuple[int, int]:
    """(epoch ms floored, ns within the ms) of an integer epoch in ``unit`` (s/ms/us/ns)."""
    if unit == "s":
        return value * 1000, 0
    if unit == "ms":
        return value, 0
    if unit == "us":
        return value // 1000, value % 1000 * 1000
    if unit == "ns":
        return value // _NS_PER_MS, value % _NS_PER_MS
    raise ValueError(f"time unit must be s, ms, us or ns, got {unit!r}")


def epoch_to_ms(value: int, unit: str | None) -> int | None:
    """Engine time (int ms, sub-ms floored) of an integer epoch in ``unit``: ``None`` takes
    it as it is (epoch ms by convention, or any increasing integer); ``auto`` picks the
    unit from its magnitude (``inputs.EPOCH_BANDS``). None when it fits no unit or int64."""
    if unit == "auto":
        magnitude = abs(value)
        unit = next((name for name, lo, hi in EPOCH_BANDS if lo <= magnitude < hi), None)
        if unit is None:
            return None
    if unit is not None:
        value = int_epoch_parts(value, unit)[0]
    return value if -(2**63) < value < 2**63 else None


def text_to_ms(text: str, unit: str | None = None) -> int | None:
    """Engine time (int ms) of one time cell: an integer epoch (``epoch_to_ms`` with
    ``unit``), or ISO-8601 / RFC 3339 (sub-ms floored). None when it is neither."""
    text = text.strip()
    if INT_PATTERN.fullmatch(text):
        if len(text) > 21:
            return None
        return epoch_to_ms(int(text), unit)
    parts = iso_parts(text)
    return None if parts is None else parts[0]
