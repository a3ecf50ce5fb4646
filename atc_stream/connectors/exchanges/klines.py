"""The kline protocol every exchange adapter speaks: ``Kline``, the rejection reasons,
the parser base class and the field checks the adapters share."""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import msgspec

from atc_stream.core.intervals import interval_ms, is_calendar, on_grid

log = logging.getLogger("atc_stream.binance")

#: Largest accepted time (ms); larger "times" are rejected as ``bad_time``.
MAX_TIME_MS = 1 << 53

#: Why a websocket message or REST row was left out (keys of ``stats.rejections``).
REJECTION_REASONS = {
    "malformed_json": "not decodable as JSON (garbage, truncated, bad UTF-8)",
    "not_a_kline": "valid JSON but not a kline message (wrong shape, event type or topic)",
    "missing_field": "a required field of the message or kline is absent",
    "bad_type": "a field has the wrong JSON type (e.g. symbol not a string, x not a bool)",
    "bad_time": "an open/close time not an integer number of ms in range",
    "bad_number": "a price/volume that is not a finite number (or a number-string)",
    "non_positive_price": "open/high/low/close <= 0",
    "inconsistent_message": "stream name, topic, symbols or times of one message disagree",
    "unsubscribed_symbol": "a kline for a symbol this client did not subscribe to",
    "wrong_interval": "a kline of another interval",
    "off_grid_kline": "an open time not a whole number of intervals after the last bar's",
    "future_kline": "a closed kline opening more than one interval after the client's clock",
    "duplicate_kline": "a closed kline for a bar already applied",
    "out_of_order_kline": "a closed kline older than the last applied bar",
    "stale_preview": "an in-progress kline for a bar already applied",
    "held_overflow": "a kline dropped while its symbol waited for a backfill (refetched)",
    "rest_bad_row": "a malformed row in a REST klines response",
}


class Kline(NamedTuple):
    """One parsed kline; ``open_time`` is the bar time used by the engine."""

    symbol: str
    open_time: int
    close_time: int
    open: float
    high: float
    low: float
    close: float
    volume: float
    closed: bool


def number(value: Any) -> float | None:
    """A finite float from a JSON number or number-string; None otherwise."""
    if isinstance(value, str):
        try:
            x = float(value)
        except ValueError:
            return None
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            x = float(value)
        except OverflowError:
            return None
    else:
        return None
    return x if math.isfinite(x) else None


def time_ms(value: Any) -> int | None:
    """A time in ms from a JSON integer in range; None otherwise."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_TIME_MS:
        return value
    return None


def time_text_ms(value: Any) -> int | None:
    """A time in ms from a decimal string of digits (as Bybit and OKX send them) or a
    JSON integer; None otherwise."""
    if isinstance(value, str):
        if not value.isdigit() or len(value) > 16:
            return None
        value = int(value)
    return time_ms(value)


def prices(o: Any, h: Any, lo: Any, c: Any, v: Any) -> tuple[float, ...] | str:
    """(open, high, low, close, volume) as floats when all five are good; else the
    rejection reason: ``bad_number`` or ``non_positive_price``."""
    fo, fh, fl, fc, fv = number(o), number(h), number(lo), number(c), number(v)
    if fo is None or fh is None or fl is None or fc is None or fv is None or fv < 0:
        return "bad_number"
    if fo <= 0 or fh <= 0 or fl <= 0 or fc <= 0:
        return "non_positive_price"
    return fo, fh, fl, fc, fv


class MessageParser:
    """Base of every adapter's websocket parser: counts what it rejects, by reason.

    ``parse(raw)`` returns a ``Kline``, a list of them (Bybit and OKX messages may hold
    several), a control result of ``exchange.py`` (a pong, a failed subscription) or
    None: nothing to apply (a rejected message is counted before). An adapter writes
    ``_parse``, its wire format, with the checks below; ``parse`` guards it."""

    def __init__(self, symbols: Iterable[str], interval: str, rejections: Counter) -> None:
        self.symbols = set(symbols)
        self.interval = interval
        self.rejections = rejections
        self._logged: set[str] = set()
        self._decoder = msgspec.json.Decoder()

    def reject(self, reason: str, detail: Any) -> None:
        """Counts ``detail`` as rejected for ``reason``; logs the first of each reason."""
        self.rejections[reason] += 1
        if reason not in self._logged:
            self._logged.add(reason)
            text = repr(detail)
            log.warning(
                "rejected websocket message (%s): %s (further ones are only counted)",
                reason,
                text if len(text) <= 300 else text[:300] + "...",
            )

    def parse(self, raw: str | bytes) -> Any:
        """What ``raw`` holds (see the class); never raises."""
        try:
            return self._parse(raw)
        except Exception as exc:  # never let one message take the connection down
            self.failed(exc)
            return None

    def _parse(self, raw: str | bytes) -> Any:
        """What ``raw`` holds, in the adapter's wire format; may raise."""
        raise NotImplementedError

    def failed(self, exc: Exception) -> None:
        """Counts a message whose parsing raised ``exc`` as ``not_a_kline``."""
        self.reject("not_a_kline", f"{type(exc).__name__}: {exc}")

    def decode_object(self, raw: str | bytes) -> Any:
        """``raw`` decoded as a JSON object (a dict); None (counted) for bad JSON or
        another value."""
        try:
            msg = self._decoder.decode(raw)
        except (msgspec.DecodeError, UnicodeDecodeError):
            self.reject("malformed_json", raw)
            return None
        if not isinstance(msg, dict):
            self.reject("not_a_kline", raw)
            return None
        return msg

    def typed(self, raw: str | bytes, *checks: tuple[Any, type | tuple[type, ...]]) -> bool:
        """Whether each ``(value, type)`` holds; else counts ``missing_field`` when a value
        is None (absent or null), ``bad_type`` otherwise."""
        if all(isinstance(value, kind) for value, kind in checks):
            return True
        missing = any(value is None for value, _ in checks)
        self.reject("missing_field" if missing else "bad_type", raw)
        return False

    def has_fields(self, raw: str | bytes, obj: dict[str, Any], names: Iterable[str]) -> bool:
        """Whether ``obj`` holds every key of ``names``; else counts ``missing_field``."""
        if all(name in obj for name in names):
            return True
        self.reject("missing_field", raw)
        return False

    def subscribed(self, raw: str | bytes, symbol: str, interval_matches: bool) -> bool:
        """Whether ``symbol`` is subscribed and the interval matches; else counts
        ``unsubscribed_symbol`` or ``wrong_interval``, in that order."""
        if symbol not in self.symbols:
            self.reject("unsubscribed_symbol", raw)
            return False
        if not interval_matches:
            self.reject("wrong_interval", raw)
            return False
        return True

    def accepted(self, raw: str | bytes, kline: Kline | str) -> Kline | None:
        """``kline``, or None when it is a rejection reason (counted)."""
        if isinstance(kline, str):
            self.reject(kline, raw)
            return None
        return kline


def checked_kline(
    symbol: str,
    times: tuple[int | None, int | None],
    values: Sequence[Any],
    closed: bool,
    agrees: bool = True,
) -> Kline | str:
    """A kline from its (open, close) times as parsed (None: bad) and its raw (open, high,
    low, close, volume), or the rejection reason: ``bad_time``, ``inconsistent_message``
    (it closes before it opens, or not ``agrees``), ``bad_number``, ``non_positive_price``."""
    t, close_time = times
    if t is None or close_time is None:
        return "bad_time"
    if close_time < t or not agrees:
        return "inconsistent_message"
    checked = prices(*values)
    if isinstance(checked, str):
        return checked
    o, h, lo, c, v = checked
    return Kline(symbol, t, close_time, o, h, lo, c, v, closed)


def same_grid(last: int, open_time: int, interval: str) -> bool:
    """Whether ``open_time`` is a whole number of intervals after ``last`` (months: on the
    calendar grid), i.e. not an extra bar between two bar times."""
    if is_calendar(interval):
        return on_grid(open_time, interval)
    return (open_time - last) % interval_ms(interval) == 0
