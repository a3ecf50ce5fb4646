"""REST kline history: paged ``GET /api/v3/klines``, rate-limited and retried with backoff."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from atc_stream.connectors.exchanges.config import LiveConfig, LiveStats
from atc_stream.connectors.exchanges.klines import Kline, parse_rest_row

if TYPE_CHECKING:
    import aiohttp

KLINES_PATH = "/api/v3/klines"
#: Most klines one REST request may return (the exchange's maximum ``limit``).
REST_PAGE_LIMIT = 1000


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
    """Paged, rate-limited, retried ``GET /api/v3/klines`` on one aiohttp session."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
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

    async def get_page(self, params: dict[str, Any]) -> list[Any]:
        """One request; JSON list on success. Retries, then raises ``RestError``."""
        import aiohttp

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
                    retry_after = min(float(header), backoff.maximum) if header else None
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
