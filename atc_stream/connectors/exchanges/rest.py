"""REST kline history: an exchange's klines endpoint paged, weight-limited (the exchange's
``WeightRules``) and retried with backoff (request and row formats: its ``WireExchange``)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from atc_stream.connectors.exchanges.config import LiveConfig, LiveStats
from atc_stream.connectors.exchanges.exchange import OnRetry, WireExchange
from atc_stream.connectors.exchanges.klines import Kline
from atc_stream.connectors.exchanges.limits import RateLimitBan, WeightLimiter

if TYPE_CHECKING:
    import aiohttp


class RestError(RuntimeError):
    """A REST request failed for good (retries exhausted, or a non-retryable status)."""


class RestBanned(RestError):
    """The exchange banned this client (HTTP 418): the feed stops, it does not retry."""


def _shown(url: str, params: dict[str, Any]) -> str:
    """``url`` with its query, as a request's line in a message (no ``{}`` of no query)."""
    if not params:
        return url
    return url + "?" + "&".join(f"{k}={v}" for k, v in params.items())


class KlineRest:
    """Paged, weight-limited, retried GETs of ``exchange``'s klines on one aiohttp session.

    Requests run concurrently (at most ``config.rest_concurrency`` at once) as far as
    ``limiter`` lets them (default: the exchange's ``limits``, its budget replaced by
    ``config.rest_weight_budget`` when set). ``pace`` (None: none) is awaited before an
    answer is decoded and parsed: a page of a few hundred klines takes ~2 ms of the event
    loop, and the feed waits with it until that fits before the next burst
    (``BurstClock.clear_for_page``): a start-up's 200 answers parsed back to back hold a
    burst that comes meanwhile for up to ~90 ms.
    """

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
        limiter: WeightLimiter | None = None,
        pace: Callable[[], Awaitable[None]] | None = None,
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
        self.limiter = limiter or WeightLimiter(exchange.limits, config.rest_weight_budget)
        self._semaphore = asyncio.Semaphore(config.rest_concurrency)
        self.pace = pace

    async def get_page(
        self,
        params: dict[str, Any],
        url: str | None = None,
        rows: Callable[[Any], Any] | None = None,
        on_retry: OnRetry | None = None,
    ) -> Any:
        """One request (to ``url``, default ``self.url``); what ``rows`` (default: the
        exchange's ``page_rows``) makes of the decoded JSON, retried while that is None.
        Retries, then raises ``RestError`` (``RestBanned`` at once on a ban).
        ``on_retry(problem, retry, delay_s)`` hears of each retry before its wait."""
        import aiohttp

        url = url or self.url
        unwrap = rows or self.exchange.page_rows

        cfg = self.config
        backoff = cfg.backoff
        limiter, stats = self.limiter, self.stats
        last_problem = ""
        for attempt in range(cfg.rest_retries + 1):
            if attempt:  # a 429's Retry-After is waited out in acquire, by every request
                delay = backoff.delay(attempt - 1, self.rng.random)
                if on_retry is not None:
                    on_retry(last_problem, attempt, delay)
                await asyncio.sleep(delay)
            async with self._semaphore:
                try:
                    window = await limiter.acquire()
                except RateLimitBan as exc:
                    raise RestBanned(f"GET {url}: {exc}") from None
                finally:  # the limiter's totals: it counts every request's wait once
                    stats.rest_limit_waits = limiter.waits
                    stats.rest_limit_wait_s = limiter.waited
                stats.rest_requests += 1
                try:
                    timeout = aiohttp.ClientTimeout(total=cfg.rest_timeout)
                    async with self.session.get(url, params=params, timeout=timeout) as resp:
                        status = resp.status
                        body = await resp.read()
                        try:
                            limiter.record(window, status, resp.headers)
                        except RateLimitBan as exc:
                            raise RestBanned(f"GET {url}: {exc}") from None
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
                said = body[:300].decode("utf-8", "replace").strip()  # the exchange's own words
                raise RestError(f"GET {_shown(url, params)} answered HTTP {status}: {said}")
            if self.pace is not None:
                await self.pace()
            try:
                data = unwrap(msgspec.json.decode(body))
            except msgspec.DecodeError:
                data = None
            if data is None:
                stats.http_retries["bad_response"] += 1
                last_problem = f"not the expected JSON: {body[:100]!r}"
                continue
            return data
        raise RestError(
            f"GET {_shown(url, params)} failed after {cfg.rest_retries + 1} tries: {last_problem}"
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
