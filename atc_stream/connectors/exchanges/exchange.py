"""The exchange interface the live feed runs on: ``Exchange`` (what ``KlineClient`` asks
of a venue) and ``WireExchange`` (a venue's REST and websocket wire formats).

Adapters live in ``venues/``; docs/design/live-feed.md ("Exchanges") explains the split.
"""

from __future__ import annotations

import asyncio
import random
import re
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from atc_stream.connectors.exchanges.config import LiveConfig, LiveStats
from atc_stream.connectors.exchanges.klines import Kline, MessageParser
from atc_stream.connectors.exchanges.limits import WeightLimiter, WeightRules

if TYPE_CHECKING:
    import aiohttp

#: ``on_retry(problem, retry, delay_s)``: told of a REST request's retry before its wait
OnRetry = Callable[[str, int, float], None]


@dataclass(frozen=True)
class Keepalive:
    """How a connection is kept open: websocket ping frames (``ping_text`` None) or a text
    ping the exchange answers with a text pong; ``max_interval_s``: the exchange drops a
    connection quiet for longer, so pings go at least this often."""

    ping_text: str | None = None
    max_interval_s: float | None = None


class PageRequest(NamedTuple):
    """One REST request: path under the REST base URL, query, most rows it returns."""

    path: str
    params: dict[str, Any]
    limit: int


class Control(NamedTuple):
    """A websocket message that is not market data but matters to the connection."""

    kind: str  #: "pong", or "subscribe_failed" (the connection is dropped and redone)
    detail: str = ""


#: A parser's result for the exchange's answer to a text ping.
PONG = Control("pong")


class KlineHistory(Protocol):
    """Closed-kline history of one run (``rest.KlineRest`` for wire exchanges)."""

    async def fetch(self, symbol: str, start: int, end: int) -> list[Kline]:
        """Klines of ``symbol`` opening in ``[start, end]`` (ms), ascending."""
        ...


class KlineConnection(Protocol):
    """One connection's klines into the feed's queue, reconnected until cancelled;
    ``connected`` is set once it is open and subscribed (its symbols' klines flow)."""

    symbols: Sequence[str]
    connected: asyncio.Event

    async def run(self) -> None: ...


class Exchange(ABC):
    """A kline venue as ``KlineClient`` sees it.

    Class attributes: ``name`` (the ``--exchange`` value), default ``ws_url`` and
    ``rest_url`` (None where a library picks them), ``limits``, ``intervals`` (our
    interval -> the exchange's name), ``max_topics_per_connection``, and the symbol
    rule ``symbol_pattern`` with a ``symbol_examples`` line for errors.
    """

    name: str
    ws_url: str | None = None
    rest_url: str | None = None
    limits: WeightRules
    intervals: Mapping[str, str]
    max_topics_per_connection: int = 1024
    symbol_pattern: re.Pattern[str]
    symbol_examples: str

    def interval_name(self, interval: str) -> str:
        """The exchange's name of ``interval``; ``ValueError`` (one line) when it has no
        such klines."""
        try:
            return self.intervals[interval]
        except KeyError:
            raise ValueError(
                f"{self.name} has no {interval} klines; intervals: {', '.join(self.intervals)}"
            ) from None

    def normalise_symbol(self, symbol: str) -> str:
        """``symbol`` as the exchange writes it; ``ValueError`` (one line) when it cannot
        be one of its symbols."""
        name = symbol.strip().upper() if isinstance(symbol, str) else ""
        if not self.symbol_pattern.fullmatch(name):
            raise ValueError(
                f"{self.name} symbols look like {self.symbol_examples}, got {symbol!r}"
            )
        return name

    @abstractmethod
    def check_config(self, config: LiveConfig) -> None:
        """Raises ``ValueError`` for settings this exchange cannot run with (before any
        connection is made)."""

    @abstractmethod
    def parser(self, symbols: Sequence[str], interval: str, rejections: Counter) -> MessageParser:
        """The parser of this exchange's kline messages for ``symbols`` at ``interval``."""

    @abstractmethod
    async def unknown_symbols(
        self,
        config: LiveConfig,
        interval: str,
        symbols: Sequence[str],
        on_retry: OnRetry | None = None,
    ) -> list[str]:
        """The ``symbols`` the exchange does not list (its instruments endpoint); raises
        ``rest.RestError`` when it cannot be asked. ``on_retry(problem, retry, delay_s)``
        hears of each retried request."""

    @abstractmethod
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
    ) -> KlineHistory:
        """The REST history client of one run; ``limiter`` spends the REST weight budget
        (default: one of ``limits``, its budget ``config.rest_weight_budget`` when set);
        ``pace`` is awaited before each answer is parsed, where the client parses them
        (the feed keeps that work off the bursts of closed klines)."""

    @abstractmethod
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
    ) -> KlineConnection:
        """Connection ``index`` of one run, for ``symbols`` (at most
        ``max_topics_per_connection``)."""

    async def aclose(self) -> None:
        """Releases what the exchange holds between runs (a library's client), in the
        event loop that ran the feed."""
        return None


class WireExchange(Exchange):
    """An exchange spoken to over its own wire formats by the feed's REST client
    (``rest.KlineRest``) and websocket client (``websocket.KlineStream``)."""

    #: klines REST pages list the newest kline first (Bybit, OKX): paged backwards
    newest_first: bool = False
    keepalive: Keepalive = Keepalive()

    @abstractmethod
    def klines_request(
        self, symbol: str, interval: str, start: int, end: int, now_ms: int
    ) -> PageRequest:
        """The request of one page of ``symbol``'s klines opening in ``[start, end]``:
        the oldest ones (ascending exchanges) or the newest ones (``newest_first``)."""

    @abstractmethod
    def page_rows(self, data: Any) -> list[Any] | None:
        """The kline rows of a decoded klines response; None when it is not one (an
        error body: the request is retried)."""

    @abstractmethod
    def parse_row(self, row: Any, symbol: str, interval: str, now_ms: int) -> Kline | None:
        """One REST kline row (closed: the exchange says so, or it closed before
        ``now_ms``); None when malformed."""

    @abstractmethod
    def stream_url(self, ws_url: str, interval: str, symbols: Sequence[str]) -> str:
        """The websocket URL of a connection for ``symbols``."""

    def subscribe_messages(self, interval: str, symbols: Sequence[str]) -> list[str]:
        """Text messages sent after connecting (none where the URL names the streams)."""
        return []

    @abstractmethod
    def instruments_requests(self, symbols: Sequence[str]) -> list[PageRequest]:
        """The requests listing the instruments ``symbols`` may be among."""

    @abstractmethod
    def instrument_page(
        self, data: Any, params: dict[str, Any]
    ) -> tuple[set[str], dict[str, Any] | None] | None:
        """(symbols listed in a decoded instruments answer, the params of the next page
        or None); None when it is not such an answer."""
