"""The exchange's kline protocol: parsing and validating websocket and REST klines."""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable
from typing import Any, NamedTuple

import msgspec

from atc_stream.core.intervals import interval_ms, is_calendar, on_grid

log = logging.getLogger("atc_stream.binance")

#: Largest accepted time (ms); larger "times" are rejected as ``bad_time``.
MAX_TIME_MS = 1 << 53

#: Why a websocket message or REST row was left out (keys of ``stats.rejections``).
REJECTION_REASONS = {
    "malformed_json": "not decodable as JSON (garbage, truncated, bad UTF-8)",
    "not_a_kline": "valid JSON but not a kline event (wrong shape or event type)",
    "missing_field": "a required field of the event or kline is absent",
    "bad_type": "a field has the wrong JSON type (e.g. symbol not a string, x not a bool)",
    "bad_time": "t/T not an integer number of ms in range",
    "bad_number": "a price/volume that is not a finite number (or a number-string)",
    "non_positive_price": "open/high/low/close <= 0",
    "inconsistent_message": "stream name, symbols or times of one message disagree",
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


def _number(value: Any) -> float | None:
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


def _time(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_TIME_MS:
        return value
    return None


_KLINE_FIELDS = ("t", "T", "s", "i", "o", "c", "h", "l", "v", "x")
_INF = math.inf


class _TypedKline(msgspec.Struct):
    """The ``k`` object as the exchange sends it (prices as strings); for the fast path."""

    t: int
    T: int
    s: str
    i: str
    o: str
    h: str
    l: str  # noqa: E741  (the exchange's name)
    c: str
    v: str
    x: bool


class _TypedEvent(msgspec.Struct):
    e: str
    k: _TypedKline
    s: str | None = None


class _TypedCombined(msgspec.Struct):
    """A combined-stream message (``{"stream": ..., "data": {...}}``)."""

    stream: str
    data: _TypedEvent


class KlineParser:
    """Parses combined-stream (or raw-stream) kline messages; counts what it rejects."""

    def __init__(self, symbols: Iterable[str], interval: str, rejections: Counter) -> None:
        self.symbols = {s.upper() for s in symbols}
        self.interval = interval
        self.rejections = rejections
        self._decoder = msgspec.json.Decoder()
        self._typed_decoder = msgspec.json.Decoder(_TypedCombined)
        self._logged: set[str] = set()

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

    def parse(self, raw: str | bytes) -> Kline | None:
        """The kline in ``raw``, or None (counted by reason) when it holds none."""
        try:
            return self._parse_usual(raw) or self._parse(raw)
        except Exception as exc:  # never let one message take the connection down
            self.reject("not_a_kline", f"{type(exc).__name__}: {exc}")
            return None

    def _parse_usual(self, raw: str | bytes) -> Kline | None:
        """The fast path: a well-formed combined-stream kline of a subscribed symbol, decoded
        into typed structs in one pass. None for anything else, which ``_parse`` then
        classifies (so every rejection keeps its exact reason)."""
        try:
            msg = self._typed_decoder.decode(raw)
        except (msgspec.DecodeError, UnicodeDecodeError):
            return None
        data, k = msg.data, msg.data.k
        symbol = k.s.upper()
        if data.e != "kline" or k.i != self.interval or symbol not in self.symbols:
            return None
        if data.s is not None and data.s.upper() != symbol:
            return None
        if msg.stream.lower() != f"{symbol.lower()}@kline_{k.i.lower()}":
            return None
        if not 0 <= k.t <= k.T < MAX_TIME_MS:
            return None
        try:  # the struct holds str: float() is what _number does with them
            o, h, lo, c, v = float(k.o), float(k.h), float(k.l), float(k.c), float(k.v)
        except ValueError:
            return None
        if not (v >= 0 and c > 0 and o > 0 and h > 0 and lo > 0):  # False for NaN too
            return None
        if not (v < _INF and c < _INF and o < _INF and h < _INF and lo < _INF):
            return None
        return Kline(symbol, k.t, k.T, o, h, lo, c, v, k.x)

    def _parse(self, raw: str | bytes) -> Kline | None:
        try:
            msg = self._decoder.decode(raw)
        except (msgspec.DecodeError, UnicodeDecodeError):
            self.reject("malformed_json", raw)
            return None
        if not isinstance(msg, dict):
            self.reject("not_a_kline", raw)
            return None
        stream = None
        if "stream" in msg or "data" in msg:  # combined-stream envelope
            stream, data = msg.get("stream"), msg.get("data")
            if stream is None or data is None:
                self.reject("missing_field", raw)
                return None
            if not isinstance(stream, str) or not isinstance(data, dict):
                self.reject("bad_type", raw)
                return None
        else:  # a raw-stream event (``/ws/<stream>``)
            data = msg
        event = data.get("e")
        if event is None:
            self.reject("missing_field" if "k" in data else "not_a_kline", raw)
            return None
        if event != "kline":
            self.reject("not_a_kline", raw)
            return None
        k = data.get("k")
        if k is None:
            self.reject("missing_field", raw)
            return None
        if not isinstance(k, dict):
            self.reject("bad_type", raw)
            return None
        for name in _KLINE_FIELDS:
            if name not in k:
                self.reject("missing_field", raw)
                return None
        symbol, interval, closed = k["s"], k["i"], k["x"]
        if not isinstance(symbol, str) or not isinstance(interval, str):
            self.reject("bad_type", raw)
            return None
        if not isinstance(closed, bool):
            self.reject("bad_type", raw)
            return None
        symbol = symbol.upper()
        outer = data.get("s", symbol)
        if not isinstance(outer, str) or outer.upper() != symbol:
            self.reject("inconsistent_message", raw)
            return None
        if symbol not in self.symbols:
            self.reject("unsubscribed_symbol", raw)
            return None
        if interval != self.interval:
            self.reject("wrong_interval", raw)
            return None
        if stream is not None and stream.lower() != f"{symbol.lower()}@kline_{interval.lower()}":
            self.reject("inconsistent_message", raw)
            return None
        t, tc = _time(k["t"]), _time(k["T"])
        if t is None or tc is None:
            self.reject("bad_time", raw)
            return None
        if tc < t:
            self.reject("inconsistent_message", raw)
            return None
        o, h, lo, c, v = (_number(k[name]) for name in ("o", "h", "l", "c", "v"))
        if o is None or h is None or lo is None or c is None or v is None or v < 0:
            self.reject("bad_number", raw)
            return None
        if c <= 0 or o <= 0 or h <= 0 or lo <= 0:
            self.reject("non_positive_price", raw)
            return None
        return Kline(symbol, t, tc, o, h, lo, c, v, closed)


def same_grid(last: int, open_time: int, interval: str) -> bool:
    """Whether ``open_time`` is a whole number of intervals after ``last`` (months: on the
    calendar grid), i.e. not an extra bar between two bar times."""
    if is_calendar(interval):
        return on_grid(open_time, interval)
    return (open_time - last) % interval_ms(interval) == 0


def parse_rest_row(row: Any, symbol: str, now_ms: int) -> Kline | None:
    """One row of a REST klines response (``closed`` = close time before ``now_ms``)."""
    if not isinstance(row, (list, tuple)) or len(row) < 7:
        return None
    t, tc = _time(row[0]), _time(row[6])
    if t is None or tc is None or tc < t:
        return None
    o, h, lo, c, v = (_number(x) for x in row[1:6])
    if o is None or h is None or lo is None or c is None or v is None or v < 0:
        return None
    if c <= 0 or o <= 0 or h <= 0 or lo <= 0:
        return None
    return Kline(symbol, t, tc, o, h, lo, c, v, tc < now_ms)
