"""OKX candles (``okx``): ``/api/v5/market/candles`` (the latest 1440 bars) and
``history-candles`` (older) paged newest first, channels ``candle{bar}`` of the business
websocket subscribed after connecting, text ``ping``/``pong``, ``confirm`` "1" closed."""

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
from atc_stream.connectors.exchanges.klines import Kline, MessageParser, prices, time_text_ms
from atc_stream.connectors.exchanges.limits import WeightRules
from atc_stream.connectors.exchanges.native import NativeExchange
from atc_stream.core.intervals import approx_interval_ms, next_open

#: Our intervals and OKX's bar names: from 6h up the UTC-aligned bars (``...utc``), as
#: our bars open on the UTC grid (OKX's plain 6H/12H/1D/... open at Hong Kong times).
INTERVALS = {
    "1s": "1s", "1m": "1m", "3m": "3m", "5m": "5m", "15m": "15m", "30m": "30m", "1h": "1H",
    "2h": "2H", "4h": "4H", "6h": "6Hutc", "12h": "12Hutc", "1d": "1Dutc", "2d": "2Dutc",
    "3d": "3Dutc", "1w": "1Wutc", "1M": "1Mutc", "3M": "3Mutc",
}  # fmt: skip
#: Bars ``/market/candles`` serves back from now; older ones are in ``history-candles``.
RECENT_BARS = 1440
#: Channels one subscribe message carries (OKX caps a message's args at 64 KB).
ARGS_PER_SUBSCRIBE = 100


class Okx(NativeExchange):
    """OKX spot and swaps (``BTC-USDT``, ``BTC-USDT-SWAP``). REST budget: 40 requests per
    2 s for candles, 20 for history-candles (per IP); ``limits`` holds the smaller."""

    name = "okx"
    ws_url = "wss://ws.okx.com:8443"
    rest_url = "https://www.okx.com"
    newest_first = True
    limits = WeightRules(20, 2.0, 1, None)
    intervals = INTERVALS
    max_topics_per_connection = 200
    #: OKX drops a connection that is quiet for 30 s
    keepalive = Keepalive("ping", 25.0)
    symbol_pattern = re.compile(r"[A-Z0-9]+-[A-Z0-9]+(-SWAP|-[0-9]{6})?")
    symbol_examples = "BTC-USDT or BTC-USDT-SWAP"

    def parser(self, symbols: Sequence[str], interval: str, rejections: Counter) -> OkxParser:
        return OkxParser(symbols, self.interval_name(interval), interval, rejections)

    def klines_request(
        self, symbol: str, interval: str, start: int, end: int, now_ms: int
    ) -> PageRequest:
        """The newest page of ``[start, end]``: ``after`` and ``before`` are exclusive;
        ``candles`` (300 a page) when the whole range is within its latest bars, else
        ``history-candles`` (100 a page)."""
        recent = start >= now_ms - (RECENT_BARS - 1) * approx_interval_ms(interval)
        path, limit = ("candles", 300) if recent else ("history-candles", 100)
        params = {
            "instId": symbol, "bar": self.interval_name(interval), "after": str(end + 1),
            "limit": str(limit),
        }  # fmt: skip
        if start > 0:
            params["before"] = str(start - 1)
        return PageRequest(f"/api/v5/market/{path}", params, limit)

    def page_rows(self, data: Any) -> list[Any] | None:
        return _data(data)

    def parse_row(self, row: Any, symbol: str, interval: str, now_ms: int) -> Kline | None:
        kline = candle(row, symbol, interval)
        return None if isinstance(kline, str) else kline

    def stream_url(self, ws_url: str, interval: str, symbols: Sequence[str]) -> str:
        base = ws_url.rstrip("/")
        return base if base.endswith("/ws/v5/business") else base + "/ws/v5/business"

    def subscribe_messages(self, interval: str, symbols: Sequence[str]) -> list[str]:
        channel = "candle" + self.interval_name(interval)
        args = [{"channel": channel, "instId": s} for s in symbols]
        return [
            json.dumps({"op": "subscribe", "args": args[i : i + ARGS_PER_SUBSCRIBE]})
            for i in range(0, len(args), ARGS_PER_SUBSCRIBE)
        ]

    def instruments_requests(self, symbols: Sequence[str]) -> list[PageRequest]:
        kinds = sorted({instrument_type(s) for s in symbols})
        return [PageRequest("/api/v5/public/instruments", {"instType": k}, 0) for k in kinds]

    def instrument_page(
        self, data: Any, params: dict[str, Any]
    ) -> tuple[set[str], dict[str, Any] | None] | None:
        listed = _data(data)
        if listed is None:
            return None
        return {d["instId"] for d in listed if isinstance(d, dict) and "instId" in d}, None


def instrument_type(symbol: str) -> str:
    """OKX's ``instType`` of an instrument ID: SWAP, FUTURES (a date suffix) or SPOT."""
    last = symbol.rsplit("-", 1)[-1]
    return "SWAP" if last == "SWAP" else "FUTURES" if symbol.count("-") == 2 else "SPOT"


def _data(data: Any) -> list[Any] | None:
    """The ``data`` list of a successful answer (``code`` "0"); None otherwise."""
    if not isinstance(data, dict) or data.get("code") != "0":
        return None
    rows = data.get("data")
    return rows if isinstance(rows, list) else None


def candle(row: Any, symbol: str, interval: str) -> Kline | str:
    """A kline from ``[ts, o, h, l, c, vol, volCcy, volCcyQuote, confirm]`` (strings;
    REST and websocket alike), or the rejection reason."""
    if not isinstance(row, list):
        return "bad_type"
    if len(row) < 9:
        return "missing_field"
    t = time_text_ms(row[0])
    if t is None:
        return "bad_time"
    if row[8] not in ("0", "1"):
        return "bad_type"
    values = prices(row[1], row[2], row[3], row[4], row[5])
    if isinstance(values, str):
        return values
    o, h, lo, c, v = values
    return Kline(symbol, t, next_open(t, interval) - 1, o, h, lo, c, v, row[8] == "1")


class OkxParser(MessageParser):
    """Parses OKX candle pushes (one or more candles each), ``pong`` and the subscribe
    events; counts what it rejects."""

    def __init__(
        self, symbols: Iterable[str], bar: str, interval: str, rejections: Counter
    ) -> None:
        super().__init__(symbols, interval, rejections)
        self.channel = "candle" + bar

    def _parse(self, raw: str | bytes) -> Kline | list[Kline] | Control | None:
        if raw == "pong" or raw == b"pong":
            return PONG
        msg = self.decode_object(raw)
        if msg is None:
            return None
        event = msg.get("event")
        if event is not None:
            if event == "error":
                return Control("subscribe_failed", f"{msg.get('code')}: {msg.get('msg')}")
            return None  # subscribe confirmations, connection counts, notices
        arg, data = msg.get("arg"), msg.get("data")
        if arg is None and data is None:
            self.reject("not_a_kline", raw)
            return None
        if not self.typed(raw, (arg, dict), (data, list)):
            return None
        channel, symbol = arg.get("channel"), arg.get("instId")
        if not self.typed(raw, (channel, str), (symbol, str)):
            return None
        if not channel.startswith("candle"):
            self.reject("not_a_kline", raw)
            return None
        if not self.subscribed(raw, symbol, channel == self.channel):
            return None
        klines = (self.accepted(raw, candle(row, symbol, self.interval)) for row in data)
        out = [k for k in klines if k is not None]
        return out[0] if len(out) == 1 else out or None
