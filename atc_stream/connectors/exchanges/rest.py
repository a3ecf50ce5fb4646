"""REST kline history: paged ``GET /api/v3/klines``, weight-limited and retried with backoff."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from atc_stream.connectors.exchanges.config import LiveConfig, LiveStats
from atc_stream.connectors.exchanges.klines import Kline, parse_rest_row
from atc_stream.connectors.exchanges.limits import (
    BINANCE_SPOT,
    RateLimitBan,
    WeightLimiter,
    WeightRules,
)

if TYPE_CHECKING:
    import aiohttp

KLINES_PATH = "/api/v3/klines"
#: Most klines one REST request may return (the exchange's maximum ``limit``).
REST_PAGE_LIMIT = 1000


class RestError(RuntimeError):
    """A REST request failed for good (retries exhausted, or a non-retryable status)."""


class RestBanned(RestError):
    """The exchange banned this client (HTTP 418): the feed stops, it does not retry."""


class KlineRest:
    """Paged, weight-limited, retried ``GET /api/v3/klines`` on one aiohttp session.

    Requests run concurrently (at most ``config.rest_concurrency`` at once) as far as
    ``limiter`` lets them (default: ``rules``' budget, or ``config.rest_weight_budget``).
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        config: LiveConfig,
        interval: str,
        stats: LiveStats,
        clock_ms: Callable[[], int],
        rng: random.Random,
        rules: WeightRules = BINANCE_SPOT,
        limiter: WeightLimiter | None = None,
    ) -> None:
        self.session = session
        self.config = config
        self.interval = interval
        self.stats = stats
        self.clock_ms = clock_ms
        self.rng = rng
        self.url = config.rest_url.rstrip("/") + KLINES_PATH
        self.limiter = limiter or WeightLimiter(rules, config.rest_weight_budget)
        self._semaphore = asyncio.Semaphore(config.rest_concurrency)

    async def get_page(self, params: dict[str, Any]) -> list[Any]:
        """One request; JSON list on success. Retries, then raises ``RestError``
        (``RestBanned`` at once on a ban)."""
        import aiohttp

        cfg = self.config
        backoff = cfg.backoff
        limiter, stats = self.limiter, self.stats
        last_problem = ""
        for attempt in range(cfg.rest_retries + 1):
            if attempt:  # a 429's Retry-After is waited out in acquire, by every request
                await asyncio.sleep(backoff.delay(attempt - 1, self.rng.random))
            async with self._semaphore:
                try:
                    window = await limiter.acquire()
                except RateLimitBan as exc:
                    raise RestBanned(f"GET {self.url}: {exc}") from None
                finally:  # the limiter's totals: it counts every request's wait once
                    stats.rest_limit_waits = limiter.waits
                    stats.rest_limit_wait_s = limiter.waited
                stats.rest_requests += 1
                try:
                    timeout = aiohttp.ClientTimeout(total=cfg.rest_timeout)
                    async with self.session.get(self.url, params=params, timeout=timeout) as resp:
                        status = resp.status
                        body = await resp.read()
                        try:
                            limiter.record(window, status, resp.headers)
                        except RateLimitBan as exc:
                            raise RestBanned(f"GET {self.url}: {exc}") from None
                        finally:
                            stats.rest_weight_used = limiter.used
                except asyncio.TimeoutError:
                    stats.http_retries["timeout"] += 1
                    last_problem = f"timed out after {cfg.rest_timeout} s"
                    continue
                except aiohttp.ClientError as exc:
                    stats.http_retries["connection_error"] += 1
                    last_problem = f"{type(exc).__name__}: {exc}"
                    continue
            if status == 429:
                stats.http_retries["status_429"] += 1
                last_problem = f"HTTP {status}"
                continue
            if status >= 500:
                stats.http_retries["status_5xx"] += 1
                last_problem = f"HTTP {status}"
                continue
            if status != 200:
                raise RestError(f"GET {self.url} {params} answered HTTP {status}: {body[:300]!r}")
            try:
                data = msgspec.json.decode(body)
            except msgspec.DecodeError:
                data = None
            if not isinstance(data, list):
                stats.http_retries["bad_response"] += 1
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
