"""The kline websocket: one connection's session (subscriptions, keepalive, idle watch) and
its reconnects, in the wire format of a ``WireExchange``."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from atc_stream.connectors.exchanges.config import LiveConfig, LiveStats
from atc_stream.connectors.exchanges.exchange import PONG, WireExchange
from atc_stream.connectors.exchanges.klines import Kline, MessageParser

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger("atc_stream.binance")


def check_ws_url(url: str) -> None:
    """Raises ``ValueError`` unless ``url`` is ``ws://`` or ``wss://`` with a host (and a
    port, if any, in range)."""
    try:
        parts = urlsplit(url)
        problem = None if parts.scheme in ("ws", "wss") and parts.hostname else "need ws://host"
        parts.port  # noqa: B018  (parses it: a port out of range raises)
    except ValueError as exc:
        problem = str(exc)
    if problem is not None:
        raise ValueError(f"ws_url {url!r} is not a websocket URL: {problem}")


def _abort(ws: aiohttp.ClientWebSocketResponse[bool]) -> None:
    """Drops a websocket's connection at once, without a close handshake; its pending
    ``receive()`` returns CLOSED. aiohttp has no public abort: this is what it does
    itself when a pong does not come."""
    ws._response.close()


class IdleWatch:
    """Aborts a websocket that received nothing for ``idle`` seconds (None: never).

    Time during which the event loop itself was blocked (a long engine call) does not
    count as idle: messages may be waiting unread.
    """

    def __init__(self, ws: aiohttp.ClientWebSocketResponse[bool], idle: float | None) -> None:
        self.ws = ws
        self.idle = idle
        self.fired = False
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._task = asyncio.ensure_future(self._run(idle)) if idle else None

    def seen(self) -> None:
        """Something came: the idle time starts again."""
        self._last = self._loop.time()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self, idle: float) -> None:
        tick = idle / 4
        while True:
            before = self._loop.time()
            await asyncio.sleep(tick)
            now = self._loop.time()
            if now - before > tick + idle / 2:  # the loop was blocked, not the feed
                self._last = max(self._last, now)
            if now - self._last >= idle:
                self.fired = True
                _abort(self.ws)
                return


class Keepalive:
    """Pings every ``interval`` seconds; aborts the websocket when a pong has not come
    within ``timeout`` (either None: no pings). The reader calls ``pong()`` on each.
    Pings are websocket ping frames, or ``text`` messages where the exchange wants them."""

    def __init__(
        self,
        ws: aiohttp.ClientWebSocketResponse[bool],
        interval: float | None,
        timeout: float | None,
        text: str | None = None,
    ) -> None:
        self.ws = ws
        self.text = text
        self.fired = False
        self._pong = asyncio.Event()
        self._task = (
            asyncio.ensure_future(self._run(interval, timeout)) if interval and timeout else None
        )

    def pong(self) -> None:
        self._pong.set()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self, interval: float, timeout: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self._pong.clear()
            try:
                if self.text is None:
                    await self.ws.ping()
                else:
                    await self.ws.send_str(self.text)
                await asyncio.wait_for(self._pong.wait(), timeout)
            except asyncio.TimeoutError:
                self.fired = True
                _abort(self.ws)
                return
            except (OSError, RuntimeError):  # the connection is going: the reader sees it
                return


class KlineStream:
    """One websocket of some symbols' kline streams, reconnected with backoff for ever;
    parsed klines go into ``queue``, connection ends are counted in ``stats``. Where the
    exchange wants them, subscribe messages are sent after each connect.

    aiohttp's websocket client reads a burst of frames in its compiled parser, about a
    third of the CPU a kline costs through ``websockets``' asyncio client (see
    docs/design/live-feed.md)."""

    def __init__(
        self,
        index: int,
        symbols: Sequence[str],
        url: str,
        session: aiohttp.ClientSession,
        queue: asyncio.Queue[Any],
        parser: MessageParser,
        config: LiveConfig,
        stats: LiveStats,
        rng: random.Random,
        *,
        exchange: WireExchange,
        interval: str,
    ) -> None:
        self.index = index
        self.symbols = symbols
        self.url = url
        self.session = session
        self.queue = queue
        self.parser = parser
        self.config = config
        self.stats = stats
        self.rng = rng
        self.subscribe = exchange.subscribe_messages(interval, symbols)
        self.keepalive = exchange.keepalive
        #: set once a session is open and subscribed (its subscribe messages sent): the
        #: symbols' klines flow from then on
        self.connected = asyncio.Event()

    async def run(self) -> None:
        """Connects, reads, reconnects; returns only when cancelled."""
        import aiohttp

        cfg = self.config
        backoff = cfg.backoff.schedule(self.rng.random)
        connected_before = False
        while True:
            reason, detail = "connect_failed", ""
            try:
                ws = await asyncio.wait_for(
                    self.session.ws_connect(
                        self.url,
                        autoping=False,  # pongs to our pings are seen by Keepalive
                        max_msg_size=cfg.max_message_bytes,
                        compress=15 if cfg.ws_compression else 0,
                        timeout=aiohttp.ClientWSTimeout(ws_close=cfg.close_timeout),
                    ),
                    cfg.open_timeout,
                )
            except (OSError, aiohttp.ClientError, asyncio.TimeoutError) as exc:
                self.stats.connect_failures += 1
                detail = f"{type(exc).__name__}: {exc}"
            except Exception as exc:  # a bug or an unexpected library error: log, reconnect
                self.stats.connect_failures += 1
                reason, detail = "error", f"{type(exc).__name__}: {exc}"
                log.exception("connection %d failed unexpectedly", self.index)
            else:
                self.stats.connects += 1
                if connected_before:
                    self.stats.reconnects += 1
                connected_before = True
                try:
                    reason, detail, received = await self._read(ws)
                except Exception as exc:  # a bug: log, reconnect
                    reason, detail, received = "error", f"{type(exc).__name__}: {exc}", False
                    log.exception("connection %d failed unexpectedly", self.index)
                if received:  # the backoff grows only while nothing comes through
                    backoff.reset()
            self.stats.disconnects[reason] += 1
            delay = backoff.next()
            log.warning(
                "connection %d (%d streams) ended (%s: %s); reconnecting in %.2f s",
                self.index, len(self.symbols), reason, detail, delay,
            )  # fmt: skip
            await asyncio.sleep(delay)

    async def _read(self, ws: aiohttp.ClientWebSocketResponse[bool]) -> tuple[str, str, bool]:
        """Reads ``ws`` until it ends: why it ended (a ``stats.disconnects`` reason), the
        detail, and whether any message came."""
        import aiohttp

        cfg = self.config
        self.stats.open_connections += 1
        watch = IdleWatch(ws, cfg.idle_timeout)
        interval, most = cfg.ping_interval, self.keepalive.max_interval_s
        if interval is not None and most is not None:
            interval = min(interval, most)
        keepalive = Keepalive(ws, interval, cfg.ping_timeout, self.keepalive.ping_text)
        text, binary = aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY
        queue, parse = self.queue, self.parser.parse
        received = False
        try:
            try:
                for message in self.subscribe:
                    await ws.send_str(message)
            except (OSError, aiohttp.ClientError) as exc:
                return "connection_lost", f"{type(exc).__name__}: {exc}", received
            self.connected.set()
            while True:
                msg = await ws.receive()
                kind = msg.type
                if kind is text or kind is binary:
                    received = True
                    self.stats.messages += 1
                    result = parse(msg.data)
                    if result is not PONG:
                        # a pong only says the socket is open: a server that stalled
                        # still answers pings, and must still time out
                        watch.seen()
                    if result is None:
                        continue
                    if type(result) is Kline:
                        try:
                            queue.put_nowait(result)
                        except asyncio.QueueFull:  # backpressure: wait for the engine
                            await queue.put(result)
                    elif type(result) is list:
                        for kline in result:
                            await queue.put(kline)
                    elif result.kind == "pong":
                        keepalive.pong()
                    else:  # the exchange refused a subscription: connect again
                        return result.kind, result.detail, received
                    continue
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
