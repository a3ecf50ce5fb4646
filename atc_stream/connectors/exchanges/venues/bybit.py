"""Bybit v5 public klines: spot (``bybit``) and USDT perpetuals (``bybit-linear``):
``/v5/market/kline`` paged newest first, topics ``kline.{interval}.{symbol}`` subscribed
after connecting, ``{"op":"ping"}`` every 20 s, ``confirm`` marking a closed kline."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from atc_stream.connectors.exchanges.exchange import (
    PONG,
    Control,
    Keepalive,
    PageRequest,
)
from atc_stream.connectors.exchanges.klines import (
    Kline,
    MessageParser,
    checked_kline,
    prices,
    time_ms,
    time_text_ms,
)
from atc_stream.connectors.exchanges.limits import WeightRules
from atc_stream.connectors.exchanges.native import NativeExchange
from atc_stream.core.intervals import next_open

#: Our intervals and Bybit's names of them.
INTERVALS = {
    "1m": "1", "3m": "3", "5m": "5", "15m": "15", "30m": "30", "1h": "60", "2h": "120",
    "4h": "240", "6h": "360", "12h": "720", "1d": "D", "1w": "W", "1M": "M",
}  # fmt: skip
#: Topics one subscribe message may carry (Bybit's limit for spot; kept for linear too).
ARGS_PER_SUBSCRIBE = 10
_FIELDS = ("start", "end", "interval", "open", "close", "high", "low", "volume", "confirm")


class BybitSpot(NativeExchange):
    """Bybit spot (``category=spot``); a REST budget of 600 requests per 5 s per IP."""

    name = "bybit"
    category = "spot"
    ws_url = "wss://stream.bybit.com"
    rest_url = "https://api.bybit.com"
    page_limit = 1000
    newest_first = True
    limits = WeightRules(600, 5.0, 1, None)
    intervals = INTERVALS
    max_topics_per_connection = 200
    keepalive = Keepalive('{"op":"ping"}', 20.0)
    symbol_pattern = re.compile(r"[A-Z0-9]+(-[A-Z0-9]+)*")
    symbol_examples = "BTCUSDT"

    def parser(self, symbols: Sequence[str], interval: str, rejections: Counter) -> BybitParser:
        return BybitParser(symbols, self.interval_name(interval), interval, rejections)

    def klines_request(
        self, symbol: str, interval: str, start: int, end: int, now_ms: int
    ) -> PageRequest:
        params = {
            "category": self.category, "symbol": symbol, "interval": self.interval_name(interval),
            "start": start, "end": end, "limit": self.page_limit,
        }  # fmt: skip
        return PageRequest("/v5/market/kline", params, self.page_limit)

    def page_rows(self, data: Any) -> list[Any] | None:
        result = _result(data)
        rows = result.get("list") if result is not None else None
        return rows if isinstance(rows, list) else None

    def parse_row(self, row: Any, symbol: str, interval: str, now_ms: int) -> Kline | None:
        """``[startTime, open, high, low, close, volume, turnover]``, numbers as strings."""
        if not isinstance(row, list) or len(row) < 6:
            return None
        t = time_text_ms(row[0])
        values = prices(row[1], row[2], row[3], row[4], row[5])
        if t is None or isinstance(values, str):
            return None
        close_time = next_open(t, interval) - 1
        o, h, lo, c, v = values
        return Kline(symbol, t, close_time, o, h, lo, c, v, close_time < now_ms)

    def stream_url(self, ws_url: str, interval: str, symbols: Sequence[str]) -> str:
        path = f"/v5/public/{self.category}"
        base = ws_url.rstrip("/")
        return base if base.endswith(path) else base + path

    def subscribe_messages(self, interval: str, symbols: Sequence[str]) -> list[str]:
        name = self.interval_name(interval)
        topics = [f"kline.{name}.{s}" for s in symbols]
        return [
            json.dumps({"op": "subscribe", "args": topics[i : i + ARGS_PER_SUBSCRIBE]})
            for i in range(0, len(topics), ARGS_PER_SUBSCRIBE)
        ]

    def instruments_requests(self, symbols: Sequence[str]) -> list[PageRequest]:
        params = {"category": self.category, "limit": 1000}
        return [PageRequest("/v5/market/instruments-info", params, 1000)]

    def instrument_page(
        self, data: Any, params: dict[str, Any]
    ) -> tuple[set[str], dict[str, Any] | None] | None:
        result = _result(data)
        listed = result.get("list") if result is not None else None
        if result is None or not isinstance(listed, list):
            return None
        names = {d["symbol"] for d in listed if isinstance(d, dict) and "symbol" in d}
        cursor = result.get("nextPageCursor")
        return names, ({**params, "cursor": cursor} if cursor and listed else None)


class BybitLinear(BybitSpot):
    """Bybit USDT perpetuals (``category=linear``)."""

    name = "bybit-linear"
    category = "linear"


def _result(data: Any) -> dict[str, Any] | None:
    """The ``result`` of a successful answer (``retCode`` 0); None otherwise."""
    if not isinstance(data, dict) or data.get("retCode") != 0:
        return None
    result = data.get("result")
    return result if isinstance(result, dict) else None


class BybitParser(MessageParser):
    """Parses Bybit kline pushes (one or more klines each) and the pong and subscribe
    answers; counts what it rejects."""

    def __init__(
        self, symbols: Iterable[str], name: str, interval: str, rejections: Counter
    ) -> None:
        super().__init__(symbols, interval, rejections)
        self.name = name  #: Bybit's name of the interval

    def _parse(self, raw: str | bytes) -> Kline | list[Kline] | Control | None:
        msg = self.decode_object(raw)
        if msg is None:
            return None
        topic = msg.get("topic")
        if topic is None:
            return self._control(msg, raw)
        if not self.typed(raw, (topic, str)):
            return None
        parts = topic.split(".")
        if len(parts) != 3 or parts[0] != "kline":
            self.reject("not_a_kline", raw)
            return None
        _, name, symbol = parts
        data = msg.get("data")
        if not self.subscribed(raw, symbol, name == self.name) or not self.typed(raw, (data, list)):
            return None
        out = [k for k in (self._kline(item, symbol, raw) for item in data) if k is not None]
        return out[0] if len(out) == 1 else out or None

    def _kline(self, k: Any, symbol: str, raw: str | bytes) -> Kline | None:
        if not isinstance(k, dict):
            self.reject("bad_type", raw)
            return None
        if not self.has_fields(raw, k, _FIELDS):
            return None
        if not isinstance(k["confirm"], bool) or not isinstance(k["interval"], str):
            self.reject("bad_type", raw)
            return None
        times = (time_ms(k["start"]), time_ms(k["end"]))
        values = (k["open"], k["high"], k["low"], k["close"], k["volume"])
        agrees = k["interval"] == self.name
        return self.accepted(raw, checked_kline(symbol, times, values, k["confirm"], agrees))

    def _control(self, msg: dict[str, Any], raw: str | bytes) -> Control | None:
        op = msg.get("op")
        if op == "pong" or (op == "ping" and msg.get("ret_msg") == "pong"):
            return PONG
        if op == "subscribe":
            if msg.get("success") is False:
                return Control("subscribe_failed", str(msg.get("ret_msg")))
            return None  # the subscription is confirmed
        self.reject("missing_field" if "data" in msg else "not_a_kline", raw)
        return None
