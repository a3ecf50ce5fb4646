"""Signals out to Redis from inside an asyncio event loop, with no thread in between.

Why, and how delivery works: docs/design/redis-pubsub.md.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import deque
from typing import Any

from redis.connection import SSLConnection, UnixDomainSocketConnection, parse_url

from atc_stream.connectors.redis.channels import SignalMessages
from atc_stream.connectors.redis.resp import ReplyError, pack_command, read_reply
from atc_stream.connectors.retry import DEFAULT_BACKOFF, Backoff
from atc_stream.core.results import StepResult

log = logging.getLogger("atc_stream.redis")


class LoopPublisher(SignalMessages):
    """Publishes step results to Redis from the running event loop, without a thread.

    >>> publisher = LoopPublisher("redis://127.0.0.1:6379/0")
    >>> await publisher.start()          # in the loop that will publish
    >>> publisher.publish(result)        # encodes and writes now; never blocks
    >>> await publisher.aclose()         # waits (within close_timeout) for the replies

    Counters as ``SignalPublisher.stats()``: ``enqueued`` (steps given), ``delivered``
    and ``delivered_rows`` (acknowledged by Redis), ``dropped``/``dropped_rows``,
    ``messages``, ``errors``, ``reconnects``; ``queued`` is the steps sent but not
    acknowledged yet. A lost connection is re-established on the ``backoff`` schedule.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        connect_timeout: float = 2.0,
        backoff: Backoff = DEFAULT_BACKOFF,
        close_timeout: float = 10.0,
        max_buffer_bytes: int = 64 << 20,
        **messages: Any,
    ) -> None:
        super().__init__(**messages)
        self.url = url
        self._target = parse_url(url)  # ValueError for a URL that is not redis://...
        self.connect_timeout = connect_timeout
        self.close_timeout = close_timeout
        self.max_buffer_bytes = max_buffer_bytes
        self.backoff = backoff
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: set[asyncio.Task] = set()
        #: per step sent and not acknowledged yet: (replies expected, rows, messages)
        self._in_flight: deque[tuple[int, int, int]] = deque()
        self._settled = asyncio.Event()
        self._closed = False
        self._drop_logged = False
        self.connected = False

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Connect (within ``connect_timeout``); if Redis is unreachable, say so once and
        keep retrying in the background while steps are dropped and counted."""
        try:
            await self._connect()
        except (OSError, asyncio.TimeoutError, ReplyError) as exc:
            self._lost(exc)

    async def aclose(self, timeout: float | None = None) -> bool:
        """Wait (within ``timeout``, default ``close_timeout``) until every sent step is
        acknowledged, then close; True if none was left unacknowledged."""
        if self._closed:
            return not self._in_flight
        timeout = self.close_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while self._in_flight and self.connected:
            self._settled.clear()
            try:
                await asyncio.wait_for(self._settled.wait(), deadline - time.monotonic())
            except (asyncio.TimeoutError, ValueError):
                break
        self._closed = True
        flushed = not self._in_flight
        self._drop_in_flight("closing before Redis acknowledged them")
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self.connected = False
        return flushed

    def close(self, timeout: float | None = None) -> bool:
        """For callers outside the loop once it has ended: a publisher not closed with
        ``aclose`` counts what was still unacknowledged as dropped."""
        flushed = not self._in_flight
        if not self._closed:
            self._closed = True
            self._drop_in_flight("closing before Redis acknowledged them")
        return flushed

    def stats(self) -> dict[str, int]:
        return self._counts(len(self._in_flight))

    # -- publishing --------------------------------------------------------------------

    def publish(self, result: StepResult) -> bool:
        """Encode ``result`` and write it to Redis now; False (counted in ``dropped``)
        when Redis is unreachable or not reading."""
        if self._closed:
            raise RuntimeError("publish() after close()")
        if len(result) == 0:
            return True
        self.enqueued += 1
        self._seq += 1
        writer = self._writer
        if not self.connected or writer is None:
            self._count_dropped(1, len(result), "redis unreachable")
            return False
        if writer.transport.get_write_buffer_size() > self.max_buffer_bytes:
            self._count_dropped(1, len(result), "redis is not reading (write buffer full)")
            return False
        encoded = self._encode([(self._seq, result)])
        batches = self._batch_commands(encoded)
        if batches:  # out first: Redis delivers it while the fan-out is still being packed
            writer.write(b"".join(batches))
        fanout, messages = self._fanout_commands(encoded)
        writer.write(b"".join(fanout))
        self._in_flight.append((len(batches) + len(fanout), len(result), len(batches) + messages))
        return True

    def write(self, result: StepResult) -> None:
        """Sink protocol: same as :meth:`publish`."""
        self.publish(result)

    # -- connection --------------------------------------------------------------------

    async def _connect(self) -> None:
        target = self._target
        connection_class = target.get("connection_class")
        if connection_class is UnixDomainSocketConnection:
            opening = asyncio.open_unix_connection(target["path"])
        else:
            context = ssl.create_default_context() if connection_class is SSLConnection else None
            opening = asyncio.open_connection(
                target.get("host", "localhost"), int(target.get("port", 6379)), ssl=context
            )
        reader, writer = await asyncio.wait_for(opening, self.connect_timeout)
        try:
            setup = []
            if target.get("password") is not None:
                auth = [target["username"]] if target.get("username") else []
                setup.append(pack_command([b"AUTH", *auth, target["password"]]))
            if target.get("db"):
                setup.append(pack_command([b"SELECT", int(target["db"])]))
            setup.append(pack_command([b"PING"]))
            # whether the server takes CLIENT REPLY (a proxy may not): the fan-out's
            # PUBLISHes then go without replies, else in one EVAL
            setup.append(pack_command([b"CLIENT", b"REPLY", b"ON"]))
            writer.write(b"".join(setup))
            replies = [
                await asyncio.wait_for(read_reply(reader), self.connect_timeout) for _ in setup
            ]
            failure = next((r for r in replies[:-1] if isinstance(r, ReplyError)), None)
            if failure is not None:
                raise failure
            self.plain_publishes = not isinstance(replies[-1], ReplyError)
        except BaseException:
            writer.close()
            raise
        self._writer = writer
        self.connected = True
        self._spawn(self._read_replies(reader))

    async def _read_replies(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                replies, rows, messages = await self._next_step_replies(reader)
                failure = next((r for r in replies if isinstance(r, ReplyError)), None)
                self._in_flight.popleft()
                if failure is None:
                    self.delivered += 1
                    self.delivered_rows += rows
                    self.messages += messages
                else:
                    self.errors += 1
                    log.error("cannot publish signal messages (%s); dropping them", failure)
                    self._count_dropped(1, rows, f"publish failed ({failure})")
                if not self._in_flight:
                    self._settled.set()
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            if not self._closed:
                self._lost(exc)

    async def _next_step_replies(self, reader: asyncio.StreamReader):
        first = await read_reply(reader)  # wait here, so a broken idle connection shows
        if not self._in_flight:
            raise ValueError(f"unexpected reply from redis: {first!r}")
        count, rows, messages = self._in_flight[0]
        replies = [first] + [await read_reply(reader) for _ in range(count - 1)]
        return replies, rows, messages

    def _lost(self, exc: BaseException) -> None:
        """The connection failed: count what it took with it, and reconnect with backoff."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self.connected or not self.errors:
            log.warning("redis publish failed (%s); reconnecting with backoff", exc or "EOF")
        self.connected = False
        self.errors += 1
        self._drop_in_flight(f"redis connection lost ({exc or 'EOF'})")
        self._spawn(self._reconnect())

    async def _reconnect(self) -> None:
        retry = self.backoff.schedule()
        while not self._closed:
            await asyncio.sleep(retry.next())
            try:
                await self._connect()
            except (OSError, asyncio.TimeoutError, ReplyError):
                continue
            self.reconnects += 1
            log.warning("redis publish resumed")
            return

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _drop_in_flight(self, why: str) -> None:
        if self._in_flight:
            rows = sum(r for _, r, _ in self._in_flight)
            self._count_dropped(len(self._in_flight), rows, why)
            self._in_flight.clear()
        self._settled.set()

    def _count_dropped(self, steps: int, rows: int, why: str) -> None:
        self.dropped += steps
        self.dropped_rows += rows
        if not self._drop_logged:
            self._drop_logged = True
            log.warning("dropping signal messages: %s (further drops are only counted)", why)
