"""Binance adapters: spot (``binance``) and USD-M futures (``binance-usdm``), one wire
format: combined websocket streams named in the URL, klines REST paged oldest first."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from atc_stream.connectors.exchanges.exchange import PageRequest
from atc_stream.connectors.exchanges.klines import (
    MAX_TIME_MS,
    Kline,
    MessageParser,
    checked_kline,
    time_ms,
)
from atc_stream.connectors.exchanges.limits import WeightRules
from atc_stream.connectors.exchanges.native import NativeExchange

_INTERVALS = ("1m", "3m", "5m", "15m", "30m", "1h", "2h", "4h", "6h", "8h", "12h", "1d", "3d",
              "1w", "1M")  # fmt: skip

#: Binance spot: REQUEST_WEIGHT 6,000 a minute per IP; ``GET /api/v3/klines`` weighs 2.
BINANCE_SPOT = WeightRules(6000, 60.0, 2, "X-MBX-USED-WEIGHT-1M")


class BinanceSpot(NativeExchange):
    """Binance spot: ``/api/v3/klines`` (weight 2 a page of 1000), combined streams of
    ``stream.binance.com`` (1024 a connection), websocket ping frames."""

    name = "binance"
    ws_url = "wss://stream.binance.com:9443"
    rest_url = "https://api.binance.com"
    klines_path = "/api/v3/klines"
    #: the symbol list of ``GET /api/v3/ticker/price`` (weight 4), lighter than exchangeInfo
    instruments_path = "/api/v3/ticker/price"
    page_limit = 1000
    limits = BINANCE_SPOT
    intervals = {i: i for i in ("1s", *_INTERVALS)}
    max_topics_per_connection = 1024
    symbol_pattern = re.compile(r"[A-Z0-9]+")
    symbol_examples = "BTCUSDT"

    def parser(self, symbols: Sequence[str], interval: str, rejections: Counter) -> BinanceParser:
        return BinanceParser(symbols, self.interval_name(interval), rejections)

    def klines_request(
        self, symbol: str, interval: str, start: int, end: int, now_ms: int
    ) -> PageRequest:
        params = {
            "symbol": symbol, "interval": self.interval_name(interval), "startTime": start,
            "endTime": end, "limit": self.page_limit,
        }  # fmt: skip
        return PageRequest(self.klines_path, params, self.page_limit)

    def page_rows(self, data: Any) -> list[Any] | None:
        return data if isinstance(data, list) else None

    def parse_row(self, row: Any, symbol: str, interval: str, now_ms: int) -> Kline | None:
        return parse_rest_row(row, symbol, now_ms)

    def stream_url(self, ws_url: str, interval: str, symbols: Sequence[str]) -> str:
        """The combined-stream URL (``{ws_url}/stream?streams=btcusdt@kline_1m/...``)."""
        base = ws_url.rstrip("/")
        if not base.endswith("/stream"):
            base += "/stream"
        name = self.interval_name(interval)
        streams = "/".join(f"{s.lower()}@kline_{name}" for s in symbols)
        return f"{base}?streams={streams}"

    def instruments_requests(self, symbols: Sequence[str]) -> list[PageRequest]:
        return [PageRequest(self.instruments_path, {}, 0)]

    def instrument_page(
        self, data: Any, params: dict[str, Any]
    ) -> tuple[set[str], dict[str, Any] | None] | None:
        if not isinstance(data, list):
            return None
        return {d["symbol"] for d in data if isinstance(d, dict) and "symbol" in d}, None


class BinanceUsdm(BinanceSpot):
    """Binance USD-M futures: ``/fapi/v1/klines`` (weight by ``limit``: 1-99 → 1,
    100-499 → 2, 500-1000 → 5, over 1000 → 10; pages of 1000 give the most bars a
    weight), streams of ``fstream.binance.com`` (200 a connection); no 1s klines."""

    name = "binance-usdm"
    ws_url = "wss://fstream.binance.com"
    rest_url = "https://fapi.binance.com"
    klines_path = "/fapi/v1/klines"
    instruments_path = "/fapi/v1/ticker/price"
    limits = WeightRules(2400, 60.0, 5, "X-MBX-USED-WEIGHT-1M")
    intervals = {i: i for i in _INTERVALS}
    max_topics_per_connection = 200
    symbol_pattern = re.compile(r"[A-Z0-9]+(_[0-9]{6})?")  # delivery: BTCUSDT_250926
    symbol_examples = "BTCUSDT (or BTCUSDT_250926)"


_KLINE_FIELDS = ("t", "T", "s", "i", "o", "c", "h", "l", "v", "x")
_INF = math.inf
#: ``_new_tuple(Kline, fields)`` is ``Kline(*fields)`` without the NamedTuple's
#: Python-level ``__new__`` (half the cost, on every kline)
_new_tuple = tuple.__new__


class _TypedKline(msgspec.Struct, gc=False):
    """The ``k`` object of the fast path, decoded in msgspec's lax mode so that the prices,
    sent as decimal strings, arrive as floats (msgspec's parse, correctly rounded like
    ``float()``). The unions keep what lax mode would coerce: a time or ``x`` of another
    JSON type decodes as that type, which the fast path then declines."""

    t: int | float | str
    T: int | float | str
    s: str
    i: str
    o: float
    h: float
    l: float  # noqa: E741  (the exchange's name)
    c: float
    v: float
    x: bool | int | float | str


class _TypedEvent(msgspec.Struct, gc=False):
    e: str
    k: _TypedKline
    #: absent or the symbol; a JSON null is declined here as in ``_parse``
    s: str | msgspec.UnsetType = msgspec.UNSET


class _TypedCombined(msgspec.Struct, gc=False):
    """A combined-stream message (``{"stream": ..., "data": {...}}``)."""

    stream: str
    data: _TypedEvent


class BinanceParser(MessageParser):
    """Parses combined-stream (or raw-stream) kline messages; counts what it rejects."""

    def __init__(self, symbols: Iterable[str], interval: str, rejections: Counter) -> None:
        super().__init__({s.upper() for s in symbols}, interval, rejections)
        #: each symbol's stream name, for the fast path (symbols whose case changes
        #: again when changed twice take the full path)
        self._streams = {}
        for s in self.symbols:
            stream = f"{s.lower()}@kline_{interval.lower()}"
            if s.upper() == s and stream.lower() == stream:
                self._streams[s] = stream
        self._typed_decoder = msgspec.json.Decoder(_TypedCombined, strict=False)

    def parse(self, raw: str | bytes) -> Kline | None:
        """The kline in ``raw``, or None (counted by reason) when it holds none."""
        try:
            return self._parse_usual(raw) or self._parse(raw)
        except Exception as exc:  # never let one message take the connection down
            self.failed(exc)
            return None

    def _parse_usual(self, raw: str | bytes) -> Kline | None:
        """The fast path: a well-formed combined-stream kline of a subscribed symbol, decoded
        into typed structs in one pass. None for anything else, which ``_parse`` then
        classifies (so every rejection keeps its exact reason)."""
        try:
            msg = self._typed_decoder.decode(raw)
        except (msgspec.DecodeError, UnicodeDecodeError):
            return None
        data = msg.data
        k = data.k
        t, close_time, closed = k.t, k.T, k.x
        if type(t) is not int or type(close_time) is not int or type(closed) is not bool:
            return None
        symbol = k.s
        stream = self._streams.get(symbol)
        if stream is None:  # not a subscribed symbol as the exchange writes them
            symbol = symbol.upper()
            stream = self._streams.get(symbol)
            if stream is None:
                return None
        if data.e != "kline" or k.i != self.interval:
            return None
        outer = data.s
        if outer is not msgspec.UNSET and outer != symbol and outer.upper() != symbol:
            return None
        if msg.stream != stream and msg.stream.lower() != stream:
            return None
        if not 0 <= t <= close_time < MAX_TIME_MS:
            return None
        o, h, lo, c, v = k.o, k.h, k.l, k.c, k.v
        if not (v >= 0 and c > 0 and o > 0 and h > 0 and lo > 0):  # False for NaN too
            return None
        if not (v < _INF and c < _INF and o < _INF and h < _INF and lo < _INF):
            return None
        return _new_tuple(Kline, (symbol, t, close_time, o, h, lo, c, v, closed))

    def _parse(self, raw: str | bytes) -> Kline | None:
        msg = self.decode_object(raw)
        if msg is None:
            return None
        stream = None
        if "stream" in msg or "data" in msg:  # combined-stream envelope
            stream, data = msg.get("stream"), msg.get("data")
            if not self.typed(raw, (stream, str), (data, dict)):
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
        if not self.typed(raw, (k, dict)) or not self.has_fields(raw, k, _KLINE_FIELDS):
            return None
        symbol, interval, closed = k["s"], k["i"], k["x"]
        if not (isinstance(symbol, str) and isinstance(interval, str)
                and isinstance(closed, bool)):  # fmt: skip
            self.reject("bad_type", raw)
            return None
        symbol = symbol.upper()
        outer = data.get("s", symbol)
        if not isinstance(outer, str) or outer.upper() != symbol:
            self.reject("inconsistent_message", raw)
            return None
        if not self.subscribed(raw, symbol, interval == self.interval):
            return None
        if stream is not None and stream.lower() != f"{symbol.lower()}@kline_{interval.lower()}":
            self.reject("inconsistent_message", raw)
            return None
        values = (k["o"], k["h"], k["l"], k["c"], k["v"])
        kline = checked_kline(symbol, (time_ms(k["t"]), time_ms(k["T"])), values, closed)
        return self.accepted(raw, kline)


def parse_rest_row(row: Any, symbol: str, now_ms: int) -> Kline | None:
    """One row of a REST klines response (``closed`` = close time before ``now_ms``)."""
    if not isinstance(row, (list, tuple)) or len(row) < 7:
        return None
    t, tc = time_ms(row[0]), time_ms(row[6])
    kline = checked_kline(symbol, (t, tc), row[1:6], tc is not None and tc < now_ms)
    return None if isinstance(kline, str) else kline
