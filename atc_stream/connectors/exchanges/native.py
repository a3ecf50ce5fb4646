"""``NativeExchange``: a ``WireExchange`` served by the feed's own REST client
(``rest.py``) and websocket client (``websocket.py``); the base of every native adapter."""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from atc_stream.connectors.exchanges.config import LiveConfig, LiveStats
from atc_stream.connectors.exchanges.exchange import OnRetry, WireExchange
from atc_stream.connectors.exchanges.klines import MessageParser
from atc_stream.connectors.exchanges.limits import WeightLimiter
from atc_stream.connectors.exchanges.rest import KlineRest
from atc_stream.connectors.exchanges.websocket import KlineStream, check_ws_url

if TYPE_CHECKING:
    import aiohttp


class NativeExchange(WireExchange):
    """A wire exchange the feed talks to itself (REST over aiohttp, websocket over aiohttp)."""

    def check_config(self, config: LiveConfig) -> None:
        check_ws_url(config.ws_url or self.ws_url or "")

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
    ) -> KlineRest:
        return KlineRest(
            session, config, interval, stats, clock_ms, rng, exchange=self, limiter=limiter,
            pace=pace,
        )  # fmt: skip

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
    ) -> KlineStream:
        url = self.stream_url(config.ws_url or self.ws_url or "", interval, symbols)
        return KlineStream(
            index, symbols, url, session, queue, parser, config, stats, rng,
            exchange=self, interval=interval,
        )  # fmt: skip

    async def unknown_symbols(
        self,
        config: LiveConfig,
        interval: str,
        symbols: Sequence[str],
        on_retry: OnRetry | None = None,
    ) -> list[str]:
        import aiohttp

        from atc_stream.connectors.exchanges.rest import RestError

        known: set[str] = set()
        async with aiohttp.ClientSession(trust_env=True) as session:
            rest = self.history(
                session, config, interval, LiveStats(), lambda: int(time.time() * 1000),
                random.Random(),
            )  # fmt: skip
            for request in self.instruments_requests(symbols):
                params: dict[str, Any] | None = request.params
                while params is not None:
                    page = await rest.get_page(
                        params, url=rest.base + request.path,
                        rows=functools.partial(self.instrument_page, params=params),
                        on_retry=on_retry,
                    )  # fmt: skip
                    listed, params = page
                    known |= {s for s in listed if isinstance(s, str)}
        if not known:  # an exchange lists its instruments: this is not its answer
            raise RestError(
                f"{rest.base} lists no instrument (not the answer {self.name} gives; check "
                f"--rest-url)"
            )
        return [s for s in symbols if s not in known]
