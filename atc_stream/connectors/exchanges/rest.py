"""REST kline history: an exchange's klines endpoint paged, rate-limited and retried with
backoff (the request and row formats come from its ``WireExchange``)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from atc_stream.connectors.exchanges.config import LiveConfig, LiveStats
from atc_stream.connectors.exchanges.exchange import WireExchange
from atc_stream.connectors.exchanges.klines import Kline

if TYPE_CHECKING:
    import aiohttp


class RestError(RuntimeError):
    """A REST request failed for good (retries exhausted, or a non-retryable status)."""


class TokenBucket:
    """At most ``burst`` requests at once, refilled at ``rate`` per second (None: no limit)."""

    def __init__(
        self,
        rate: float | None,
        burst: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        if rate is not None and not rate > 0:
            raise ValueError(f"rate must be > 0 requests/s or None, got {rate!r}")
        if not burst >= 1:
            raise ValueError(f"burst must be >= 1, got {burst!r}")
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self._clock = clock
        self._sleep = sleep
        self._stamp = clock()
        self.waited = 0.0  #: total seconds callers waited

    async def acquire(self, tokens: float = 1.0) -> None:
        """Returns once ``tokens`` requests may go (at once when there is no limit)."""
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
            await self._sleep(delay)


class KlineRest:
    """Paged, rate-limited, retried GETs of ``exchange``'s klines on one aiohttp session."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        config: LiveConfig,
        interval: str,
        stats: LiveStats,
        clock_ms: Callable[[], int],
        rng: random.Random,
        *,
        exchange: WireExchange,
    ) -> None:
        self.session = session
        self.config = config
        self.interval = interval
        self.stats = stats
        self.clock_ms = clock_ms
        self.rng = rng
        self.exchange = exchange
        self.base = (config.rest_url or exchange.rest_url or "").rstrip("/")
        self.url = self.base  #: where requests go unless one names its own URL
        self.bucket = TokenBucket(config.rest_rate, config.rest_burst)
        self._semaphore = asyncio.Semaphore(config.rest_concurrency)

    async def get_page(
        self,
        params: dict[str, Any],
        url: str | None = None,
        rows: Callable[[Any], Any] | None = None,
    ) -> Any:
        """One request (to ``url``, default ``self.url``); what ``rows`` (default: the
        exchange's ``page_rows``) makes of the decoded JSON, retried while that is None.
        Retries, then raises ``RestError``."""
        import aiohttp

        url = url or self.url
        unwrap = rows or self.exchange.page_rows

        cfg = self.config
        backoff = cfg.backoff
        last_problem = ""
        retry_after: float | None = None
        for attempt in range(cfg.rest_retries + 1):
            if attempt:
                delay = backoff.delay(attempt - 1, self.rng.random)
                if retry_after is not None:
                    delay = max(delay, retry_after)
                await asyncio.sleep(delay)
            retry_after = None
            await self.bucket.acquire()
            self.stats.rest_requests += 1
            try:
                async with self._semaphore:
                    timeout = aiohttp.ClientTimeout(total=cfg.rest_timeout)
                    async with self.session.get(url, params=params, timeout=timeout) as resp:
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
                    retry_after = min(float(header), backoff.maximum) if header else None
                except ValueError:
                    retry_after = None
                continue
            if status >= 500:
                self.stats.http_retries["status_5xx"] += 1
                last_problem = f"HTTP {status}"
                continue
            if status != 200:
                raise RestError(f"GET {url} {params} answered HTTP {status}: {body[:300]!r}")
            try:
                data = unwrap(msgspec.json.decode(body))
            except msgspec.DecodeError:
                data = None
            if data is None:
                self.stats.http_retries["bad_response"] += 1
                last_problem = f"not the expected JSON: {body[:100]!r}"
                continue
            return data
        raise RestError(
            f"GET {url} {params} failed after {cfg.rest_retries + 1} tries: {last_problem}"
        )

    async def fetch(self, symbol: str, start: int, end: int) -> list[Kline]:
        """Klines of ``symbol`` opening in ``[start, end]`` (ms), all pages, ascending.

        ``closed`` is judged against the clock read before the first request. Pages go
        forwards from ``start``, or backwards from ``end`` where the exchange lists the
        newest kline first.
        """
        exchange = self.exchange
        now = self.clock_ms()
        out: dict[int, Kline] = {}
        low, high = start, end
        while low <= high:
            request = exchange.klines_request(symbol, self.interval, low, high, now)
            rows = await self.get_page(request.params, url=self.base + request.path)
            times = []
            for row in rows:
                kline = exchange.parse_row(row, symbol, self.interval, now)
                if kline is None:
                    self.stats.rejections["rest_bad_row"] += 1
                    continue
                times.append(kline.open_time)
                if low <= kline.open_time <= high:
                    out[kline.open_time] = kline
            if len(rows) < request.limit or not times:
                break
            if exchange.newest_first:
                if min(times) > high:  # no progress: the answer ignored the range
                    break
                high = min(times) - 1
            else:
                if max(times) < low:
                    break
                low = max(times) + 1
        return [out[t] for t in sorted(out)]
