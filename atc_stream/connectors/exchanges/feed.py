"""Live klines from a Binance-compatible exchange: websocket combined streams + REST history.

``KlineClient`` keeps an ``Engine`` in step with an exchange's kline feed:

1. **Warmup.** Symbols whose streams hold no state get their last ``history`` closed
   klines over REST (``GET {rest_url}/api/v3/klines``, paged by 1000, rate-limited by
   a token bucket, retried with backoff on 429/418/5xx/timeouts/garbage) and go
   through one batched ``Engine.warmup``. Symbols restored from a snapshot are
   backfilled instead, from their stream's last bar time.
2. **Streaming.** Symbols are spread over websocket connections of at most
   ``max_streams_per_connection`` streams each
   (``{ws_url}/stream?streams=btcusdt@kline_1m/ethusdt@kline_1m``). A closed kline
   (``"x": true``) becomes an ``Engine.step`` with bar time = the kline's open time
   ``t`` and close = ``c``; an in-progress kline becomes an ``Engine.preview`` (results
   have ``provisional=True`` and never change state; within one batch only each
   symbol's latest preview is computed). Closed klines that arrive together are
   applied in one ``step``.
3. **No closed bar is ever skipped.** Every kline (closed or not) of a symbol tells
   that all bars opening before it have closed. When one opens later than the bar
   after the symbol's last applied bar -- after a disconnect, a stall, a restart, a
   corrupted message -- the missing range is fetched over REST and applied, in
   order, before that kline; the symbol's websocket klines wait meanwhile (other
   symbols go on). REST is re-asked a few times (``gap_confirm_retries``) when the
   last bar of a gap is not there yet; bars REST still does not have are taken as
   not existing (the exchange made no bar). A failed backfill is retried with
   backoff, forever; the symbol's held klines (at most ``max_held``) then follow.
   Duplicate and older closed klines are dropped.
4. **Connections.** Keepalive pings (``ping_interval``/``ping_timeout``), an idle
   timeout (no message for ``idle_timeout`` s → reconnect), reconnects with
   exponential backoff and jitter. Connection ends are counted by reason in
   ``stats.disconnects``.

Hostile input never raises: each bad message is counted by reason in
``stats.rejections`` (see ``REJECTION_REASONS``) and left out; bars the engine
rejects are counted in ``engine.rejections`` as usual. Only closed klines reach
warmup and backfill: a REST kline counts as closed when its close time is before the
clock read just before the request (``clock_ms``, injectable), or when a later bar of
the same symbol has already opened.

Only this module imports ``aiohttp`` (websocket feed and REST, one session); the engine
and kernels never do.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import msgspec
import numpy as np

from atc_stream.core.intervals import (
    approx_interval_ms,
    interval_ms,
    is_calendar,
    next_open,
    on_grid,
    validate_interval,
)
from atc_stream.core.results import StepResult
from atc_stream.engine.engine import Engine

log = logging.getLogger("atc_stream.binance")

DEFAULT_WS_URL = "wss://stream.binance.com:9443"
DEFAULT_REST_URL = "https://api.binance.com"
KLINES_PATH = "/api/v3/klines"
#: Most klines one REST request may return (the exchange's maximum ``limit``).
REST_PAGE_LIMIT = 1000
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


class RestError(RuntimeError):
    """A REST request failed for good (retries exhausted, or a non-retryable status)."""


# -- parsing ------------------------------------------------------------------------------


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

    def _reject(self, reason: str, detail: Any) -> None:
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
        try:
            return self._parse_usual(raw) or self._parse(raw)
        except Exception as exc:  # never let one message take the connection down
            self._reject("not_a_kline", f"{type(exc).__name__}: {exc}")
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
            self._reject("malformed_json", raw)
            return None
        if not isinstance(msg, dict):
            self._reject("not_a_kline", raw)
            return None
        stream = None
        if "stream" in msg or "data" in msg:  # combined-stream envelope
            stream, data = msg.get("stream"), msg.get("data")
            if stream is None or data is None:
                self._reject("missing_field", raw)
                return None
            if not isinstance(stream, str) or not isinstance(data, dict):
                self._reject("bad_type", raw)
                return None
        else:  # a raw-stream event (``/ws/<stream>``)
            data = msg
        event = data.get("e")
        if event is None:
            self._reject("missing_field" if "k" in data else "not_a_kline", raw)
            return None
        if event != "kline":
            self._reject("not_a_kline", raw)
            return None
        k = data.get("k")
        if k is None:
            self._reject("missing_field", raw)
            return None
        if not isinstance(k, dict):
            self._reject("bad_type", raw)
            return None
        for name in _KLINE_FIELDS:
            if name not in k:
                self._reject("missing_field", raw)
                return None
        symbol, interval, closed = k["s"], k["i"], k["x"]
        if not isinstance(symbol, str) or not isinstance(interval, str):
            self._reject("bad_type", raw)
            return None
        if not isinstance(closed, bool):
            self._reject("bad_type", raw)
            return None
        symbol = symbol.upper()
        outer = data.get("s", symbol)
        if not isinstance(outer, str) or outer.upper() != symbol:
            self._reject("inconsistent_message", raw)
            return None
        if symbol not in self.symbols:
            self._reject("unsubscribed_symbol", raw)
            return None
        if interval != self.interval:
            self._reject("wrong_interval", raw)
            return None
        if stream is not None and stream.lower() != f"{symbol.lower()}@kline_{interval.lower()}":
            self._reject("inconsistent_message", raw)
            return None
        t, tc = _time(k["t"]), _time(k["T"])
        if t is None or tc is None:
            self._reject("bad_time", raw)
            return None
        if tc < t:
            self._reject("inconsistent_message", raw)
            return None
        o, h, lo, c, v = (_number(k[name]) for name in ("o", "h", "l", "c", "v"))
        if o is None or h is None or lo is None or c is None or v is None or v < 0:
            self._reject("bad_number", raw)
            return None
        if c <= 0 or o <= 0 or h <= 0 or lo <= 0:
            self._reject("non_positive_price", raw)
            return None
        return Kline(symbol, t, tc, o, h, lo, c, v, closed)


def _same_grid(last: int, open_time: int, interval: str) -> bool:
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


# -- pacing ---------------------------------------------------------------------------------


def backoff_delay(
    attempt: int, initial: float, maximum: float, factor: float, jitter: float, rng
) -> float:
    """``min(maximum, initial * factor**attempt)``, shortened by up to ``jitter`` of itself."""
    base = min(maximum, initial * factor ** min(attempt, 64))
    return base * (1.0 - jitter * rng.random())


class TokenBucket:
    """At most ``burst`` requests at once, refilled at ``rate`` per second (None: no limit)."""

    def __init__(
        self, rate: float | None, burst: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate is not None and not rate > 0:
            raise ValueError(f"rate must be > 0 requests/s or None, got {rate!r}")
        if not burst >= 1:
            raise ValueError(f"burst must be >= 1, got {burst!r}")
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self._clock = clock
        self._stamp = clock()
        self.waited = 0.0  #: total seconds callers waited

    async def acquire(self, tokens: float = 1.0) -> None:
        if self.rate is None:
            return
        while True:
            now = self._clock()
            self.tokens = min(self.burst, self.tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            if self.tokens >= tokens:
                self.tokens -= tokens
                return
            delay = (tokens - self.tokens) / self.rate
            self.waited += delay
            await asyncio.sleep(delay)


# -- configuration and statistics -------------------------------------------------------------


@dataclass
class LiveConfig:
    """Knobs of ``KlineClient`` (seconds unless stated). Invalid values raise ``ValueError``."""

    ws_url: str = DEFAULT_WS_URL  #: websocket base; ``/stream?streams=...`` is appended
    rest_url: str = DEFAULT_REST_URL  #: REST base; ``/api/v3/klines`` is appended
    history: int = 1000  #: closed bars per fresh symbol fetched for warmup (0: none)
    max_streams_per_connection: int = 1024
    previews: bool = True  #: compute previews for in-progress klines
    ping_interval: float | None = 20.0
    ping_timeout: float | None = 20.0
    idle_timeout: float | None = 60.0  #: no message for this long → reconnect
    open_timeout: float = 10.0
    close_timeout: float = 2.0
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    backoff_factor: float = 2.0
    backoff_jitter: float = 0.5  #: each delay is shortened by a random 0..jitter of itself
    rest_rate: float | None = 10.0  #: REST requests per second (token bucket); None: no limit
    rest_burst: int = 10
    rest_timeout: float = 10.0  #: per request
    rest_retries: int = 5  #: extra tries per request on 429/418/5xx/timeouts/garbage
    rest_concurrency: int = 8
    gap_confirm_retries: int = 2  #: re-asks when REST lacks the last bar of a gap
    gap_confirm_delay: float = 1.0
    max_held: int = 10_000  #: klines held per symbol while it is backfilled
    max_batch: int = 100_000  #: queue items per engine step
    max_queue: int = 100_000  #: parsed klines waiting for the engine (backpressure)
    max_message_bytes: int = 1 << 20
    #: offer permessage-deflate. Off by default: klines are a few hundred bytes, and
    #: inflating each costs ~7 us of CPU on the latency path (about half of reading it)
    ws_compression: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("ws_url", "rest_url"):
                if not isinstance(value, str) or "://" not in value:
                    raise ValueError(f"{f.name} must be a URL like scheme://host, got {value!r}")
            elif f.name in ("previews", "ws_compression"):
                if not isinstance(value, bool):
                    raise ValueError(f"{f.name} must be a bool, got {value!r}")
            elif f.name in ("history", "rest_retries", "gap_confirm_retries"):
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"{f.name} must be an int >= 0, got {value!r}")
            elif f.name in (
                "max_streams_per_connection", "rest_burst", "rest_concurrency", "max_held",
                "max_batch", "max_queue", "max_message_bytes",
            ):  # fmt: skip
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"{f.name} must be an int >= 1, got {value!r}")
            elif f.name in ("ping_interval", "ping_timeout", "idle_timeout", "rest_rate"):
                if value is not None and not (isinstance(value, (int, float)) and value > 0):
                    raise ValueError(f"{f.name} must be > 0 or None, got {value!r}")
            elif f.name == "backoff_jitter":
                if not (isinstance(value, (int, float)) and 0 <= value <= 1):
                    raise ValueError(f"backoff_jitter must be in [0, 1], got {value!r}")
            elif f.name == "backoff_factor":
                if not (isinstance(value, (int, float)) and value >= 1):
                    raise ValueError(f"backoff_factor must be >= 1, got {value!r}")
            elif f.name == "gap_confirm_delay":
                if not (isinstance(value, (int, float)) and value >= 0):
                    raise ValueError(f"gap_confirm_delay must be >= 0, got {value!r}")
            elif not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"{f.name} must be > 0, got {value!r}")
        if self.backoff_max < self.backoff_initial:
            raise ValueError("backoff_max must be >= backoff_initial")


@dataclass
class LiveStats:
    """What a ``KlineClient`` did so far (read at any time)."""

    symbols: int = 0
    connections: int = 0  #: websocket connections the symbols are spread over
    open_connections: int = 0
    connects: int = 0  #: successful websocket handshakes
    reconnects: int = 0  #: handshakes after the first one of a connection
    messages: int = 0  #: websocket messages received
    warmup_bars: int = 0
    bars: int = 0  #: closed (symbol, bar)s applied after warmup (websocket + backfill)
    closed_klines: int = 0  #: of which came from the websocket
    backfilled_bars: int = 0  #: of which came from REST backfill
    backfills: int = 0  #: REST backfills started
    backfill_failures: int = 0
    backfill_overlap: int = 0  #: websocket klines held during a backfill that brought them
    previews: int = 0  #: (symbol, bar) previews computed
    previews_superseded: int = 0  #: in-progress klines replaced by a newer one before use
    rows_out: int = 0  #: result rows passed to ``on_result``
    rest_requests: int = 0
    last_bar_lag_ms: float | None = None  #: clock - close time of the newest applied bar
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None  #: set when ``run`` returns
    rejections: Counter = field(default_factory=Counter)  #: bad input by reason
    disconnects: Counter = field(default_factory=Counter)  #: connection ends by reason
    http_retries: Counter = field(default_factory=Counter)  #: REST retries by reason
    engine_rejections: Counter = field(default_factory=Counter)  #: engine's, during the run

    @property
    def seconds(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    @property
    def bars_per_second(self) -> float:
        s = self.seconds
        return self.bars / s if s > 0 else 0.0

    def status_line(self) -> str:
        lag = "-" if self.last_bar_lag_ms is None else f"{self.last_bar_lag_ms / 1000:.1f}s"
        rejected = sum(self.rejections.values()) + sum(self.engine_rejections.values())
        return (
            f"live {self.symbols} symbols | {self.open_connections}/{self.connections} conn | "
            f"{self.bars} bars ({self.bars_per_second:.1f}/s) | previews {self.previews} | "
            f"lag {lag} | reconnects {self.reconnects} | rejected {rejected}"
        )

    def lines(self) -> list[str]:
        def fmt(counter: Counter) -> str:
            return ", ".join(f"{k}={v}" for k, v in sorted(counter.items())) or "none"

        return [
            f"symbols          {self.symbols} over {self.connections} connection(s)",
            f"bars             {self.warmup_bars} warmup + {self.bars} live "
            f"({self.closed_klines} websocket, {self.backfilled_bars} backfilled)",
            f"time             {self.seconds:.1f} s ({self.bars_per_second:.1f} bars/s)",
            f"previews         {self.previews} ({self.previews_superseded} superseded)",
            f"messages         {self.messages}; connects {self.connects}, "
            f"reconnects {self.reconnects}",
            f"disconnects      {fmt(self.disconnects)}",
            f"REST             {self.rest_requests} requests, {self.backfills} backfills "
            f"({self.backfill_failures} failed); retries: {fmt(self.http_retries)}",
            f"rejected input   {fmt(self.rejections)}",
            f"engine rejected  {fmt(self.engine_rejections)}",
        ]


# -- REST -------------------------------------------------------------------------------------


class KlineRest:
    """Paged, rate-limited, retried ``GET /api/v3/klines`` on one aiohttp session."""

    def __init__(
        self,
        session: Any,
        config: LiveConfig,
        interval: str,
        stats: LiveStats,
        clock_ms: Callable[[], int],
        rng: random.Random,
    ) -> None:
        self.session = session
        self.config = config
        self.interval = interval
        self.stats = stats
        self.clock_ms = clock_ms
        self.rng = rng
        self.url = config.rest_url.rstrip("/") + KLINES_PATH
        self.bucket = TokenBucket(config.rest_rate, config.rest_burst)
        self._semaphore = asyncio.Semaphore(config.rest_concurrency)

    async def get_page(self, params: dict[str, Any]) -> list:
        """One request; JSON list on success. Retries, then raises ``RestError``."""
        import aiohttp

        cfg = self.config
        last_problem = ""
        retry_after: float | None = None
        for attempt in range(cfg.rest_retries + 1):
            if attempt:
                delay = backoff_delay(
                    attempt - 1, cfg.backoff_initial, cfg.backoff_max, cfg.backoff_factor,
                    cfg.backoff_jitter, self.rng,
                )  # fmt: skip
                if retry_after is not None:
                    delay = max(delay, retry_after)
                await asyncio.sleep(delay)
            retry_after = None
            await self.bucket.acquire()
            self.stats.rest_requests += 1
            try:
                async with self._semaphore:
                    timeout = aiohttp.ClientTimeout(total=cfg.rest_timeout)
                    async with self.session.get(self.url, params=params, timeout=timeout) as resp:
                        status = resp.status
                        body = await resp.read()
                        header = resp.headers.get("Retry-After")
            except asyncio.TimeoutError:
                self.stats.http_retries["timeout"] += 1
                last_problem = f"timed out after {cfg.rest_timeout} s"
                continue
            except aiohttp.ClientError as exc:
                self.stats.http_retries["connection_error"] += 1
                last_problem = f"{type(exc).__name__}: {exc}"
                continue
            if status in (418, 429):
                self.stats.http_retries[f"status_{status}"] += 1
                last_problem = f"HTTP {status}"
                try:
                    retry_after = min(float(header), self.config.backoff_max) if header else None
                except ValueError:
                    retry_after = None
                continue
            if status >= 500:
                self.stats.http_retries["status_5xx"] += 1
                last_problem = f"HTTP {status}"
                continue
            if status != 200:
                raise RestError(f"GET {self.url} {params} answered HTTP {status}: {body[:300]!r}")
            try:
                data = msgspec.json.decode(body)
            except msgspec.DecodeError:
                data = None
            if not isinstance(data, list):
                self.stats.http_retries["bad_response"] += 1
                last_problem = f"not a JSON list: {body[:100]!r}"
                continue
            return data
        raise RestError(
            f"GET {self.url} {params} failed after {cfg.rest_retries + 1} tries: {last_problem}"
        )

    async def fetch(self, symbol: str, start: int, end: int) -> list[Kline]:
        """Klines of ``symbol`` opening in ``[start, end]`` (ms), all pages, ascending.

        ``closed`` is judged against the clock read before the first request.
        """
        now = self.clock_ms()
        out: dict[int, Kline] = {}
        cursor = start
        while cursor <= end:
            params = {
                "symbol": symbol,
                "interval": self.interval,
                "startTime": cursor,
                "endTime": end,
                "limit": REST_PAGE_LIMIT,
            }
            rows = await self.get_page(params)
            newest = cursor - 1
            for row in rows:
                kline = parse_rest_row(row, symbol, now)
                if kline is None:
                    self.stats.rejections["rest_bad_row"] += 1
                    continue
                newest = max(newest, kline.open_time)
                if cursor <= kline.open_time <= end:
                    out[kline.open_time] = kline
            if len(rows) < REST_PAGE_LIMIT or newest < cursor:
                break
            cursor = newest + 1
        return [out[t] for t in sorted(out)]


# -- the client ---------------------------------------------------------------------------------


@dataclass
class _SymbolState:
    last: int | None = None  #: open time of the last applied closed bar
    filled_until: int | None = None  #: REST was asked about every bar opening before this
    held: deque = field(default_factory=deque)  #: closed klines waiting for a backfill
    held_preview: Kline | None = None
    preview: Kline | None = None  #: newest in-progress kline of this batch
    backfill: asyncio.Task | None = None
    failures: int = 0


def _abort(ws: Any) -> None:
    """Drops a websocket's connection at once, without a close handshake; its pending
    ``receive()`` returns CLOSED. aiohttp has no public abort: this is what it does
    itself when a pong does not come."""
    ws._response.close()


class _IdleWatch:
    """Aborts a websocket that received nothing for ``idle`` seconds (None: never).

    Time during which the event loop itself was blocked (a long engine call) does not
    count as idle: messages may be waiting unread.
    """

    def __init__(self, ws: Any, idle: float | None) -> None:
        self.ws = ws
        self.idle = idle
        self.fired = False
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._task = asyncio.ensure_future(self._run()) if idle else None

    def seen(self) -> None:
        self._last = self._loop.time()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        tick = self.idle / 4
        while True:
            before = self._loop.time()
            await asyncio.sleep(tick)
            now = self._loop.time()
            if now - before > tick + self.idle / 2:  # the loop was blocked, not the feed
                self._last = max(self._last, now)
            if now - self._last >= self.idle:
                self.fired = True
                _abort(self.ws)
                return


class _Keepalive:
    """Pings every ``interval`` seconds; aborts the websocket when a pong has not come
    within ``timeout`` (either None: no pings). The reader calls ``pong()`` on each."""

    def __init__(self, ws: Any, interval: float | None, timeout: float | None) -> None:
        self.ws = ws
        self.interval = interval
        self.timeout = timeout
        self.fired = False
        self._pong = asyncio.Event()
        self._task = asyncio.ensure_future(self._run()) if interval and timeout else None

    def pong(self) -> None:
        self._pong.set()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self._pong.clear()
            try:
                await self.ws.ping()
                await asyncio.wait_for(self._pong.wait(), self.timeout)
            except asyncio.TimeoutError:
                self.fired = True
                _abort(self.ws)
                return
            except (OSError, RuntimeError):  # the connection is going: the reader sees it
                return


class _BackfillDone(NamedTuple):
    symbol: str
    start: int
    bound: int | None  #: exclusive end (a later bar's open time); None: up to the clock
    bars: list[Kline] | None
    error: BaseException | None


class KlineClient:
    """Feeds an ``Engine`` from an exchange's kline websocket, with REST warmup/backfill.

    >>> client = KlineClient(Engine(interval="1m"), ["BTCUSDT", "ETHUSDT"],
    ...                      LiveConfig(history=1000), on_result=sink.write)
    >>> stats = asyncio.run(client.run(max_seconds=60))

    ``on_result(StepResult)`` gets every closed-bar result (the warmup's last bars
    too); ``on_preview(StepResult)`` every preview (``provisional=True``).
    ``snapshotter`` (a ``state.snapshotter.Snapshotter``) is told about applied bars;
    ``source_offsets()`` (optional) is called when it takes a snapshot, after the bars'
    results went to ``on_result``, e.g. to record the output's durable position.
    ``publisher`` (a ``redis_loop.LoopPublisher``) gets every closed-bar result first,
    from inside the event loop; ``run`` starts and closes it.
    ``clock_ms`` (ms since the epoch) and ``seed`` (jitter) are for tests.
    """

    def __init__(
        self,
        engine: Engine,
        symbols: Sequence[str],
        config: LiveConfig | None = None,
        *,
        on_result: Callable[[StepResult], Any] | None = None,
        on_preview: Callable[[StepResult], Any] | None = None,
        snapshotter: Any | None = None,
        source_offsets: Callable[[], Mapping[str, Any]] | None = None,
        publisher: Any | None = None,
        clock_ms: Callable[[], int] | None = None,
        seed: int | None = None,
    ) -> None:
        if isinstance(symbols, str):
            symbols = [s for s in symbols.split(",") if s.strip()]
        names = []
        for s in symbols:
            if not isinstance(s, str) or not s.strip() or not s.strip().isalnum():
                raise ValueError(f"symbols must be alphanumeric names like BTCUSDT, got {s!r}")
            if s.strip().upper() not in names:
                names.append(s.strip().upper())
        if not names:
            raise ValueError("symbols must name at least one symbol")
        self.engine = engine
        self.interval = validate_interval(engine.interval)
        self._interval_ms = None if is_calendar(self.interval) else interval_ms(self.interval)
        self._interval_bound = approx_interval_ms(self.interval)
        self._future_after = 0  # set from the clock before each batch is dispatched
        self.symbols = names
        self.config = config or LiveConfig()
        self.on_result = on_result
        self.on_preview = on_preview
        self.snapshotter = snapshotter
        self.source_offsets = source_offsets

        self.publisher = publisher
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.rng = random.Random(seed)
        self.stats = LiveStats(symbols=len(names))
        self.parser = KlineParser(names, self.interval, self.stats.rejections)
        per = self.config.max_streams_per_connection
        self.chunks = [names[i : i + per] for i in range(0, len(names), per)]
        self.stats.connections = len(self.chunks)
        for s in names:
            self.engine.add_symbol(s)
        self._state = {s: _SymbolState(last=t) for s, t in self._engine_lasts(names).items()}
        self._engine_rejections_at_start = Counter(engine.rejections)
        self._pending: list[tuple[str, int, float]] = []
        self._preview_symbols: set[str] = set()
        self._queue: asyncio.Queue | None = None
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._max_bars: int | None = None
        self.rest: KlineRest | None = None

    # -- helpers ------------------------------------------------------------------------

    def _engine_lasts(self, symbols: Iterable[str]) -> dict[str, int | None]:
        """Last bar time of each symbol's streams (the earliest where they differ; None
        when none of them holds a bar)."""
        out = {}
        for symbol in symbols:
            lasts = [t for t in self.engine.last_bar_times(symbol) if t is not None]
            out[symbol] = min(lasts, default=None)
        return out

    def stream_url(self, symbols: Sequence[str]) -> str:
        base = self.config.ws_url.rstrip("/")
        if not base.endswith("/stream"):
            base += "/stream"
        streams = "/".join(f"{s.lower()}@kline_{self.interval}" for s in symbols)
        return f"{base}?streams={streams}"

    def _backoff(self, attempt: int) -> float:
        c = self.config
        return backoff_delay(
            attempt, c.backoff_initial, c.backoff_max, c.backoff_factor, c.backoff_jitter, self.rng
        )

    def _emit(self, result: StepResult) -> None:
        self.stats.rows_out += len(result)
        if self.publisher is not None:  # first: the signal's latency; the file can wait
            self.publisher.publish(result)
        if self.on_result is not None:
            self.on_result(result)

    def stop(self) -> None:
        """Ask ``run`` to return (thread-safe)."""
        if self._stop is None or self._loop is None:
            return
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stop.set)

    # -- run ------------------------------------------------------------------------------

    async def run(
        self,
        *,
        max_seconds: float | None = None,
        max_bars: int | None = None,
        on_status: Callable[[LiveStats], Any] | None = None,
        status_every: float = 1.0,
    ) -> LiveStats:
        """Warm up / backfill, then stream until ``stop()``, ``max_seconds`` or ``max_bars``
        closed bars applied after warmup. Returns the statistics."""
        import aiohttp

        if max_bars is not None and max_bars < 1:
            raise ValueError(f"max_bars must be >= 1, got {max_bars!r}")
        if max_seconds is not None and not max_seconds > 0:
            raise ValueError(f"max_seconds must be > 0, got {max_seconds!r}")
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._queue = asyncio.Queue(maxsize=self.config.max_queue)
        self._max_bars = max_bars
        from yarl import URL  # aiohttp's URL type

        try:
            url = URL(self.stream_url(self.chunks[0]))
            problem = None if url.scheme in ("ws", "wss") and url.host else "need ws://host"
            url.port  # noqa: B018  (parses it: a port out of range raises)
        except ValueError as exc:
            problem = str(exc)
        if problem is not None:
            raise ValueError(f"ws_url {self.config.ws_url!r} is not a websocket URL: {problem}")
        if getattr(self.engine.backend, "name", None) == "cpu":
            # load (or compile) every CPU driver before any request is in flight: a first
            # load inside the event loop stalls it, firing REST and idle timeouts; once
            # loaded (``atc-stream live`` does it before connecting) this costs ~ms
            self.engine.compile()
        self.stats.started = time.monotonic()
        self.stats.ended = None
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        tasks: list[asyncio.Task] = []
        frozen = False
        async with aiohttp.ClientSession(trust_env=True) as session:
            self.rest = KlineRest(
                session, self.config, self.interval, self.stats, self.clock_ms, self.rng
            )
            try:
                if self.publisher is not None:
                    await self.publisher.start()
                startup = asyncio.ensure_future(self._startup())
                stop_wait = asyncio.ensure_future(self._stop.wait())
                tasks += [startup, stop_wait]
                await asyncio.wait(
                    [startup, stop_wait],
                    timeout=None if deadline is None else max(0.0, deadline - time.monotonic()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not startup.done():
                    return self.stats
                startup.result()
                # the start-up's garbage goes now, and what survives it (modules, the
                # engine, warmup data) leaves the collector's view: a full collection
                # in the live phase then scans only live-phase objects, not ~100 ms' worth
                gc.collect()
                gc.freeze()
                frozen = True
                consumer = asyncio.ensure_future(self._consume())
                tasks.append(consumer)
                for index, chunk in enumerate(self.chunks):
                    tasks.append(asyncio.ensure_future(self._connection(index, chunk)))
                if on_status is not None:
                    tasks.append(asyncio.ensure_future(self._status_loop(on_status, status_every)))
                await asyncio.wait(
                    [consumer, stop_wait],
                    timeout=None if deadline is None else max(0.0, deadline - time.monotonic()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if consumer.done():
                    consumer.result()  # re-raise a failure of the engine or a callback
            finally:
                tasks += [st.backfill for st in self._state.values() if st.backfill is not None]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                for st in self._state.values():
                    st.backfill = None
                if self.publisher is not None:
                    await self.publisher.aclose()
                if frozen:
                    gc.unfreeze()
                self._update_engine_rejections()
                self.stats.ended = time.monotonic()
        return self.stats

    def _update_engine_rejections(self) -> None:
        self.stats.engine_rejections = Counter(self.engine.rejections) - Counter(
            self._engine_rejections_at_start
        )

    async def _status_loop(self, on_status, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            self._update_engine_rejections()
            on_status(self.stats)

    # -- startup: warmup fresh symbols, backfill restored ones -------------------------------

    async def _startup(self) -> None:
        fresh = [s for s in self.symbols if self._state[s].last is None]
        history = self.config.history
        if fresh and history > 0:
            end = self.clock_ms()
            start = max(0, end - (history + 2) * approx_interval_ms(self.interval))
            fetched = await asyncio.gather(*(self.rest.fetch(s, start, end) for s in fresh))
            series = {}
            for symbol, klines in zip(fresh, fetched, strict=True):
                closed = [k for k in klines if k.closed][-history:]
                if closed:
                    series[symbol] = (
                        np.array([k.open_time for k in closed], np.int64),
                        np.array([k.close for k in closed], np.float64),
                    )
            if series:
                result = self.engine.warmup(series)
                self.stats.warmup_bars = sum(len(t) for t, _ in series.values())
                for symbol, last in self._engine_lasts(series).items():
                    self._state[symbol].last = last
                self._emit(result)
        for symbol in self.symbols:
            st = self._state[symbol]
            if st.last is not None and symbol not in fresh:
                self._start_backfill(symbol, st, next_open(st.last, self.interval), None)

    # -- websocket connections -------------------------------------------------------------------

    async def _connection(self, index: int, symbols: Sequence[str]) -> None:
        """One websocket of ``symbols``' streams, reconnected with backoff for ever.

        aiohttp's websocket client reads a burst of frames in its compiled parser:
        ~3.5 us of CPU a kline against ~11 us through ``websockets``' asyncio client,
        which at 200 symbols put ~3 ms between a bar's close and its signals (see
        benchmarks/RESULTS.md, session 5)."""
        import aiohttp

        cfg = self.config
        url = self.stream_url(symbols)
        attempt = 0
        connected_before = False
        while True:
            reason, detail = "connect_failed", ""
            try:
                ws = await asyncio.wait_for(
                    self.rest.session.ws_connect(
                        url,
                        autoping=False,  # pongs to our pings are seen by _Keepalive
                        max_msg_size=cfg.max_message_bytes,
                        compress=15 if cfg.ws_compression else 0,
                        timeout=aiohttp.ClientWSTimeout(ws_close=cfg.close_timeout),
                    ),
                    cfg.open_timeout,
                )
            except (OSError, aiohttp.ClientError, asyncio.TimeoutError) as exc:
                detail = f"{type(exc).__name__}: {exc}"
            except Exception as exc:  # a bug or an unexpected library error: log, reconnect
                reason, detail = "error", f"{type(exc).__name__}: {exc}"
                log.exception("connection %d failed unexpectedly", index)
            else:
                self.stats.connects += 1
                if connected_before:
                    self.stats.reconnects += 1
                connected_before = True
                try:
                    reason, detail, received = await self._read_stream(ws)
                except Exception as exc:  # a bug: log, reconnect
                    reason, detail, received = "error", f"{type(exc).__name__}: {exc}", False
                    log.exception("connection %d failed unexpectedly", index)
                if received:  # the backoff grows only while nothing comes through
                    attempt = 0
            self.stats.disconnects[reason] += 1
            delay = self._backoff(attempt)
            attempt += 1
            log.warning(
                "connection %d (%d streams) ended (%s: %s); reconnecting in %.2f s",
                index, len(symbols), reason, detail, delay,
            )  # fmt: skip
            await asyncio.sleep(delay)

    async def _read_stream(self, ws: Any) -> tuple[str, str, bool]:
        """Reads ``ws`` until it ends: why it ended (a ``stats.disconnects`` reason), the
        detail, and whether any message came."""
        import aiohttp

        cfg = self.config
        self.stats.open_connections += 1
        watch = _IdleWatch(ws, cfg.idle_timeout)
        keepalive = _Keepalive(ws, cfg.ping_interval, cfg.ping_timeout)
        text, binary = aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY
        queue = self._queue
        received = False
        try:
            while True:
                msg = await ws.receive()
                kind = msg.type
                if kind is text or kind is binary:
                    received = True
                    watch.seen()
                    self.stats.messages += 1
                    kline = self.parser.parse(msg.data)
                    if kline is not None:
                        if queue.full():  # backpressure: wait for the engine
                            await queue.put(kline)
                        else:
                            queue.put_nowait(kline)
                    continue
                watch.seen()
                if kind is aiohttp.WSMsgType.PING:
                    await ws.pong(msg.data)
                elif kind is aiohttp.WSMsgType.PONG:
                    keepalive.pong()
                elif kind is aiohttp.WSMsgType.CLOSE:  # the server's close frame
                    code, why = msg.data, msg.extra or ""
                    if code in (1000, 1001):
                        return "closed_by_server", f"code {code} {why}".strip(), received
                    return "connection_lost", f"closed with code {code} {why}".strip(), received
                else:  # CLOSED (transport gone), CLOSING or ERROR (bad frame, pong timeout)
                    if watch.fired:
                        reason, detail = "idle_timeout", f"no message for {cfg.idle_timeout} s"
                    elif keepalive.fired:
                        reason, detail = "ping_timeout", f"no pong within {cfg.ping_timeout} s"
                    else:
                        error = msg.data if kind is aiohttp.WSMsgType.ERROR else ws.exception()
                        reason = "connection_lost"
                        detail = f"{type(error).__name__}: {error}" if error else "closed"
                    return reason, detail, received
        finally:
            watch.stop()
            keepalive.stop()
            self.stats.open_connections -= 1
            if not ws.closed:  # shutting down: the close handshake, within close_timeout
                await ws.close()

    # -- the engine side: one consumer applies everything in order -------------------------------

    async def _consume(self) -> None:
        queue = self._queue
        max_batch = self.config.max_batch
        while True:
            items = [await queue.get()]
            while len(items) < max_batch:
                try:
                    items.append(queue.get_nowait())
                except asyncio.QueueEmpty:
                    break
            # one clock read a batch: a closed kline opening after this is from the future
            self._future_after = self.clock_ms() + self._interval_bound
            for item in items:
                if isinstance(item, Kline):
                    self._dispatch(item)
                else:
                    self._on_backfill_done(item)
            self._flush()
            if self._max_bars is not None and self.stats.bars >= self._max_bars:
                self._stop.set()
            await asyncio.sleep(0)

    def _dispatch(self, k: Kline, released: bool = False) -> None:
        st = self._state[k.symbol]
        if k.closed and k.open_time > self._future_after:
            # a closed bar cannot open more than one interval after now; applying one
            # would make every later bar of the symbol out of order (a frozen symbol)
            self.parser._reject("future_kline", k)
            return
        if st.backfill is not None:
            self._hold(st, k)
            return
        last = st.last
        if last is not None:
            if k.open_time <= last:
                if released:  # held during a backfill that brought this bar: expected
                    self.stats.backfill_overlap += 1
                    return
                if not k.closed:
                    reason = "stale_preview"
                elif k.open_time == last:
                    reason = "duplicate_kline"
                else:
                    reason = "out_of_order_kline"
                self.parser._reject(reason, k)
                return
            step = self._interval_ms  # None for months (calendar bars)
            if not (
                (k.open_time - last) % step == 0
                if step
                else _same_grid(last, k.open_time, self.interval)
            ):
                # an open time between two bar times would be applied as an extra bar
                self.parser._reject("off_grid_kline", k)
                return
            expected = last + step if step else next_open(last, self.interval)
            if st.filled_until is not None and st.filled_until > expected:
                expected = st.filled_until
            if k.open_time > expected:  # bars between were missed: fetch them first
                self._start_backfill(k.symbol, st, expected, k.open_time)
                self._hold(st, k)
                return
        if k.closed:
            self._pending.append((k.symbol, k.open_time, k.close))
            st.last = k.open_time
            self.stats.closed_klines += 1
            if st.preview is not None and st.preview.open_time <= k.open_time:
                st.preview = None
        elif self.config.previews:
            if st.preview is not None:
                self.stats.previews_superseded += 1
            st.preview = k
            self._preview_symbols.add(k.symbol)

    def _hold(self, st: _SymbolState, k: Kline) -> None:
        if not k.closed:
            if st.held_preview is not None:
                self.stats.previews_superseded += 1
            st.held_preview = k
            return
        st.held.append(k)
        if len(st.held) > self.config.max_held:
            self.parser._reject("held_overflow", st.held.popleft())

    def _start_backfill(self, symbol: str, st: _SymbolState, start: int, bound: int | None):
        self.stats.backfills += 1
        st.backfill = asyncio.ensure_future(self._backfill(symbol, start, bound, 0.0))

    async def _backfill(self, symbol: str, start: int, bound: int | None, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        try:
            for attempt in range(self.config.gap_confirm_retries + 1):
                if bound is None:
                    klines = await self.rest.fetch(symbol, start, self.clock_ms())
                    bars = [k for k in klines if k.closed]
                    break
                klines = await self.rest.fetch(symbol, start, bound - 1)
                bars = [k._replace(closed=True) for k in klines if k.open_time < bound]
                if bars and next_open(bars[-1].open_time, self.interval) >= bound:
                    break
                if attempt < self.config.gap_confirm_retries:
                    await asyncio.sleep(self.config.gap_confirm_delay)
            done = _BackfillDone(symbol, start, bound, bars, None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            done = _BackfillDone(symbol, start, bound, None, exc)
        await self._queue.put(done)

    def _on_backfill_done(self, done: _BackfillDone) -> None:
        st = self._state[done.symbol]
        st.backfill = None
        if done.error is not None:
            self.stats.backfill_failures += 1
            delay = self._backoff(st.failures)
            st.failures += 1
            log.warning(
                "backfill of %s from %d failed (%s); retrying in %.2f s",
                done.symbol, done.start, done.error, delay,
            )  # fmt: skip
            st.backfill = asyncio.ensure_future(
                self._backfill(done.symbol, done.start, done.bound, delay)
            )
            return
        st.failures = 0
        for k in done.bars:
            if st.last is None or k.open_time > st.last:
                self._pending.append((k.symbol, k.open_time, k.close))
                st.last = k.open_time
                self.stats.backfilled_bars += 1
        if done.bound is not None:
            st.filled_until = max(st.filled_until or done.bound, done.bound)
        held, st.held = st.held, deque()
        preview, st.held_preview = st.held_preview, None
        for k in held:
            self._dispatch(k, released=True)
        if preview is not None:
            self._dispatch(preview, released=True)

    def _flush(self) -> None:
        if self._pending:
            updates, self._pending = self._pending, []
            result = self.engine.step(updates)
            rejected = {r.index for r in result.rejected}
            applied = len(updates) - len(rejected)
            self.stats.bars += applied
            if rejected:  # resync with what the engine holds: a later kline refetches them
                lasts = self._engine_lasts({updates[i][0] for i in rejected})
                for symbol, last in lasts.items():
                    self._state[symbol].last = last
            newest = max(t for _, t, _ in updates)
            self.stats.last_bar_lag_ms = float(self.clock_ms() - next_open(newest, self.interval))
            self._emit(result)
            if self.snapshotter is not None:
                self.snapshotter.maybe_snapshot(applied, self.source_offsets)
        if self._preview_symbols:
            updates = []
            for symbol in sorted(self._preview_symbols):
                st = self._state[symbol]
                k, st.preview = st.preview, None
                if k is None or st.backfill is not None:
                    continue
                if st.last is None or k.open_time > st.last:
                    updates.append((symbol, k.open_time, k.close))
            self._preview_symbols.clear()
            if updates:
                result = self.engine.preview(updates)
                self.stats.previews += len(updates)
                if self.on_preview is not None:
                    self.on_preview(result)
