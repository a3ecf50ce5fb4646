"""Any exchange ccxt supports (``ccxt:<id>``): ``watch_ohlcv`` (ccxt.pro) for new bars,
``fetch_ohlcv`` for history. ccxt says nothing of a candle being final, so a bar counts
as closed when the next one opens: up to one interval later than a native adapter."""

from __future__ import annotations

import asyncio
import logging
import random
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from atc_stream.connectors.exchanges.config import LiveConfig, LiveStats
from atc_stream.connectors.exchanges.exchange import Exchange, OnRetry
from atc_stream.connectors.exchanges.klines import Kline, MessageParser, prices, time_ms
from atc_stream.connectors.exchanges.limits import WeightLimiter, WeightRules
from atc_stream.connectors.exchanges.rest import RestError
from atc_stream.core.intervals import next_open, validate_interval

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger("atc_stream.binance")

#: Candles asked for per ``fetch_ohlcv`` (ccxt caps it at the exchange's maximum).
PAGE_LIMIT = 1000


def _our_interval(timeframe: str) -> bool:
    try:
        validate_interval(timeframe)
    except ValueError:
        return False
    return True


class CcxtExchange(Exchange):
    """An exchange of ccxt.pro, driven through ccxt's own REST and websocket clients
    (reconnects of the socket, rate limits of REST: ccxt's).

    ``client_factory`` makes the ccxt exchange object (default: the class of ``exchange_id``
    with its rate limiter on); one is made per run and closed by ``aclose``.
    """

    ws_url = None
    rest_url = None
    max_topics_per_connection = 1 << 20  # one set of ccxt clients serves every symbol
    symbol_pattern = re.compile(r"[A-Z0-9]+/[A-Z0-9]+(:[A-Z0-9]+(-[A-Z0-9]+)*)?")
    symbol_examples = "BTC/USDT or BTC/USDT:USDT (ccxt's unified symbols)"

    def __init__(self, exchange_id: str, client_factory: Callable[[], Any] | None = None) -> None:
        import ccxt.pro

        if exchange_id not in ccxt.pro.exchanges:
            raise ValueError(
                f"ccxt has no websocket exchange {exchange_id!r} (ccxt.pro.exchanges lists them)"
            )
        cls = getattr(ccxt.pro, exchange_id)
        self.name = f"ccxt:{exchange_id}"
        self.factory = client_factory or (lambda: cls({"enableRateLimit": True}))
        described = cls().describe()
        has = described.get("has", {})
        if not (has.get("watchOHLCV") and has.get("fetchOHLCV")):
            raise ValueError(f"ccxt's {exchange_id} cannot watch and fetch OHLCV candles")
        timeframes = described.get("timeframes") or {}
        self.intervals = {tf: tf for tf in timeframes if _our_interval(tf)}
        # ccxt spaces requests ``rateLimit`` ms apart: one request per that window
        self.limits = WeightRules(1, float(described.get("rateLimit", 1000)) / 1000, 1, None)
        self._client: Any = None

    def client(self) -> Any:
        """The ccxt exchange object of the current run (made on first use)."""
        if self._client is None:
            self._client = self.factory()
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def check_config(self, config: LiveConfig) -> None:
        if config.ws_url is not None or config.rest_url is not None:
            raise ValueError(f"{self.name} connects where ccxt says: no --ws-url/--rest-url")

    def parser(self, symbols: Sequence[str], interval: str, rejections: Counter) -> CcxtCandles:
        return CcxtCandles(symbols, interval, rejections)

    async def unknown_symbols(
        self,
        config: LiveConfig,
        interval: str,
        symbols: Sequence[str],
        on_retry: OnRetry | None = None,
    ) -> list[str]:
        import ccxt

        client = self.factory()
        try:
            markets = await client.load_markets()
        except ccxt.BaseError as exc:
            raise RestError(f"{self.name}: cannot load the markets: {exc}") from None
        finally:
            await client.close()
        return [s for s in symbols if s not in markets]

    def history(
        self,
        session: aiohttp.ClientSession,
        config: LiveConfig,
        interval: str,
        stats: LiveStats,
        clock_ms: Callable[[], int],
        rng: random.Random,
        limiter: WeightLimiter | None = None,
        pace: Callable[[], Awaitable[None]] | None = None,
    ) -> CcxtHistory:
        # ccxt spaces its requests itself: ``limiter`` is not used; it parses an answer
        # inside the call that fetches it, so ``pace`` has no place to run either
        return CcxtHistory(self.client(), config, interval, stats, clock_ms, rng)

    def connection(
        self,
        index: int,
        symbols: Sequence[str],
        session: aiohttp.ClientSession,
        queue: asyncio.Queue[Any],
        parser: MessageParser,
        config: LiveConfig,
        stats: LiveStats,
        rng: random.Random,
        interval: str,
    ) -> CcxtStream:
        assert isinstance(parser, CcxtCandles)
        return CcxtStream(index, symbols, self.client(), queue, parser, config, stats, rng)


def candle_kline(row: Any, symbol: str, interval: str, closed: bool | None, now_ms: int = 0):
    """A kline from ccxt's ``[timestamp, open, high, low, close, volume]`` (closed: as
    given, or when None by its close time before ``now_ms``), or the rejection reason."""
    if not isinstance(row, (list, tuple)) or len(row) < 6:
        return "not_a_kline"
    t = time_ms(row[0])
    if t is None:
        return "bad_time"
    values = prices(row[1], row[2], row[3], row[4], 0.0 if row[5] is None else row[5])
    if isinstance(values, str):
        return values
    close_time = next_open(t, interval) - 1
    o, h, lo, c, v = values
    return Kline(symbol, t, close_time, o, h, lo, c, v, close_time < now_ms if closed is None
                 else closed)  # fmt: skip


class CcxtCandles(MessageParser):
    """Checks ccxt's candles as the wire parsers check messages; counts what it rejects."""

    def kline(self, symbol: str, row: Any, closed: bool) -> Kline | None:
        kline = candle_kline(row, symbol, self.interval, closed)
        if isinstance(kline, str):
            self.reject(kline, row)
            return None
        return kline

    def parse(self, raw: str | bytes) -> None:  # ccxt parses its own messages
        return None


class CcxtHistory:
    """Closed candles over ``fetch_ohlcv``, paged forwards, retried with ``Backoff`` on
    ccxt's network errors (its rate limiter spaces the requests)."""

    def __init__(
        self,
        client: Any,
        config: LiveConfig,
        interval: str,
        stats: LiveStats,
        clock_ms: Callable[[], int],
        rng: random.Random,
    ) -> None:
        self.client = client
        self.config = config
        self.interval = interval
        self.stats = stats
        self.clock_ms = clock_ms
        self.rng = rng

    async def fetch(self, symbol: str, start: int, end: int) -> list[Kline]:
        now = self.clock_ms()
        out: dict[int, Kline] = {}
        cursor = start
        while cursor <= end:
            rows = await self._page(symbol, cursor)
            newest = cursor - 1
            for row in rows:
                kline = candle_kline(row, symbol, self.interval, None, now)
                if isinstance(kline, str):
                    self.stats.rejections["rest_bad_row"] += 1
                    continue
                newest = max(newest, kline.open_time)
                if cursor <= kline.open_time <= end:
                    out[kline.open_time] = kline
            if newest < cursor or newest >= end:
                break
            cursor = newest + 1
        return [out[t] for t in sorted(out)]

    async def _page(self, symbol: str, since: int) -> list[Any]:
        import ccxt

        cfg, backoff = self.config, self.config.backoff
        problem = ""
        for attempt in range(cfg.rest_retries + 1):
            if attempt:
                await asyncio.sleep(backoff.delay(attempt - 1, self.rng.random))
            self.stats.rest_requests += 1
            try:
                rows = await self.client.fetch_ohlcv(symbol, self.interval, since, PAGE_LIMIT)
            except (ccxt.DDoSProtection, ccxt.RateLimitExceeded) as exc:
                self.stats.http_retries["rate_limited"] += 1
                problem = f"{type(exc).__name__}: {exc}"
            except ccxt.NetworkError as exc:
                self.stats.http_retries["connection_error"] += 1
                problem = f"{type(exc).__name__}: {exc}"
            except ccxt.BaseError as exc:
                raise RestError(f"fetch_ohlcv({symbol!r}, since={since}): {exc}") from None
            else:
                if isinstance(rows, list):
                    return rows
                self.stats.http_retries["bad_response"] += 1
                problem = f"not a list of candles: {str(rows)[:100]}"
        raise RestError(
            f"fetch_ohlcv({symbol!r}, since={since}) failed after {cfg.rest_retries + 1} "
            f"tries: {problem}"
        )


class CcxtStream:
    """The candles of some symbols from ``watch_ohlcv`` (one watch a symbol; ccxt shares
    its sockets), into the feed's queue: a symbol's bar is sent closed when its next bar
    opens, each update in between as in progress.

    Counted like one connection: up once any watch returns (``connected`` is set then:
    the symbols' candles flow), down (one ``disconnects`` entry) when a watch fails while
    up; the first symbol's watch failing while down counts as a failed connect, one a
    retry, as a websocket's attempt does: in ``connect_failures`` and in ``disconnects``
    (``connect_failed``, or ``error`` for a failure other than ccxt's network errors).
    A failed watch waits ``Backoff`` and watches again.
    """

    def __init__(
        self,
        index: int,
        symbols: Sequence[str],
        client: Any,
        queue: asyncio.Queue[Any],
        parser: CcxtCandles,
        config: LiveConfig,
        stats: LiveStats,
        rng: random.Random,
    ) -> None:
        self.index = index
        self.symbols = symbols
        self.client = client
        self.queue = queue
        self.parser = parser
        self.config = config
        self.stats = stats
        self.rng = rng
        self.up = False
        self._ups = 0
        self.connected = asyncio.Event()

    async def run(self) -> None:
        try:
            await asyncio.gather(*(self._watch(s) for s in self.symbols))
        finally:
            if self.up:
                self.up = False
                self.stats.open_connections -= 1

    def _went_up(self) -> None:
        if not self.up:
            self.up = True
            self._ups += 1
            self.stats.connects += 1
            self.stats.reconnects += self._ups > 1
            self.stats.open_connections += 1
            self.connected.set()

    def _went_down(self, reason: str, detail: str) -> None:
        if self.up:
            self.up = False
            self.stats.open_connections -= 1
            self.stats.disconnects[reason] += 1
            log.warning("ccxt connection %d ended (%s: %s)", self.index, reason, detail)

    async def _watch(self, symbol: str) -> None:
        import ccxt

        backoff = self.config.backoff.schedule(self.rng.random)
        pending: list[Any] | None = None  #: the latest update of the bar in progress
        while True:
            was_up = self.up  # a watch started while up that fails is a drop, not a connect
            try:
                candles = await self.client.watch_ohlcv(symbol, self.parser.interval)
            except ccxt.NetworkError as exc:
                reason, detail = "connection_lost", f"{type(exc).__name__}: {exc}"
            except ccxt.BaseError as exc:
                reason, detail = "error", f"{type(exc).__name__}: {exc}"
            else:
                self._went_up()
                backoff.reset()
                self.stats.messages += 1
                pending = await self._send(symbol, candles, pending)
                continue
            # updates after a break may miss the end of the pending bar: the feed
            # backfills it over REST once a later bar shows up
            pending = None
            # a watch that fails while down is a failed connect attempt; every symbol's
            # watch fails then, on one connection: the first symbol's count for it
            if not was_up and not self.up and symbol == self.symbols[0]:
                self.stats.connect_failures += 1
                failed = "connect_failed" if reason == "connection_lost" else reason
                self.stats.disconnects[failed] += 1
            self._went_down(reason, detail)
            await asyncio.sleep(backoff.next())

    async def _send(self, symbol: str, candles: Any, pending: list[Any] | None) -> Any:
        rows = []
        for row in candles if isinstance(candles, list) else []:
            if isinstance(row, (list, tuple)) and row and time_ms(row[0]) is not None:
                rows.append(row)
            else:
                self.parser.reject("bad_time" if isinstance(row, (list, tuple)) else "not_a_kline",
                                   row)  # fmt: skip
        for row in sorted(rows, key=lambda r: r[0]):
            if pending is not None:
                if row[0] < pending[0]:  # a late update of a bar already passed
                    continue
                if row[0] > pending[0]:
                    closed = self.parser.kline(symbol, pending, True)
                    if closed is not None:
                        await self.queue.put(closed)
            pending = list(row)
        if pending is not None:
            preview = self.parser.kline(symbol, pending, False)
            if preview is not None:
                await self.queue.put(preview)
        return pending
