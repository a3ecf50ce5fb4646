"""Bars to their shard's Redis Stream: the ``Router`` of any producer, and the exactly-once
mover of one input stream's entries (``StreamRouter``, ``atc-stream cluster route``)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from atc_stream.connectors.redis.resp import client_of, pack_command, send_packed
from atc_stream.connectors.retry import DEFAULT_BACKOFF, Backoff, BackoffSchedule
from atc_stream.core.shards import bars_stream, check_shards, shard_of

log = logging.getLogger("atc_stream.cluster")

# KEYS: the input stream, then the shard streams 0 .. n-1. ARGV: group, maxlen (0: no
# trim), then per entry: id, shard (0-based), field count, fields. Every entry is added
# to its shard's stream and acknowledged in the input group, all or nothing.
_ROUTE_SCRIPT = b"""
local group, maxlen = ARGV[1], tonumber(ARGV[2])
local i = 3
while i <= #ARGV do
  local id, shard, n = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  if shard >= 0 then
    if maxlen > 0 then
      redis.call('XADD', KEYS[2 + shard], 'MAXLEN', '~', maxlen, '*',
                 unpack(ARGV, i + 3, i + 2 + n))
    else
      redis.call('XADD', KEYS[2 + shard], '*', unpack(ARGV, i + 3, i + 2 + n))
    end
  end
  redis.call('XACK', KEYS[1], group, id)
  i = i + 3 + n
end
return 1
"""


def _symbol_of(fields: Any) -> str | None:
    raw = fields.get(b"symbol", fields.get("symbol")) if isinstance(fields, Mapping) else None
    if isinstance(raw, bytes):
        try:
            raw = raw.decode()
        except UnicodeDecodeError:
            return None
    return raw if isinstance(raw, str) and raw and raw.isprintable() else None


class Router:
    """Writes bars (entries with ``symbol``, ``time``, ``close`` ...) to the stream of their
    symbol's shard (``core.shards.bars_stream``).

    >>> router = Router("redis://127.0.0.1:6379/0", shards=4)
    >>> router.send({"symbol": "BTC", "time": 1700000000000, "close": 37000.5})
    >>> router.flush()          # written, retried through Redis outages

    Bars wait in memory until ``flush`` (``send`` flushes every ``batch`` bars) writes
    them; an unreachable Redis is counted (``connection_errors``) and retried on the
    ``backoff`` schedule, so nothing is lost once it is back. A flush whose reply was
    lost is sent again: a bar may then reach its stream twice, and the engine drops the
    repeat (its time is not after the stream's last bar: a counted rejection).
    A bar without a usable ``symbol`` is counted in ``unroutable`` and dropped.
    """

    def __init__(
        self,
        redis_url_or_client: str | redis.Redis,
        shards: int,
        *,
        prefix: str = "atc",
        batch: int = 500,
        maxlen: int | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.shards = check_shards(shards)
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be an int >= 1, got {batch!r}")
        self.client = client_of(redis_url_or_client, 10.0, connect_timeout=2.0)
        self.prefix = prefix
        self.batch = batch
        self.maxlen = maxlen
        self.backoff = backoff
        self.sleep = sleep
        self.streams = [bars_stream(prefix, s) for s in range(shards)]
        self.pending: deque[tuple[int, list[Any]]] = deque()
        self.routed = 0
        self.unroutable = 0
        self.connection_errors = 0

    def send(self, fields: Mapping[str, Any]) -> None:
        """Queue one bar for its shard; flush once ``batch`` bars wait."""
        symbol = _symbol_of(fields)
        if symbol is None:
            self.unroutable += 1
            return
        flat: list[Any] = []
        for name, value in fields.items():
            flat += (name, value if isinstance(value, (bytes, str)) else str(value))
        self.pending.append((shard_of(symbol, self.shards), flat))
        if len(self.pending) >= self.batch:
            self.flush()

    def flush(self, timeout: float | None = None) -> int:
        """Write every queued bar, waiting out Redis outages (at most ``timeout`` seconds:
        then the rest stays queued); the number written."""
        deadline = None if timeout is None else time.monotonic() + timeout
        retry = self.backoff.schedule()
        written = 0
        while self.pending:
            chunk = [self.pending[i] for i in range(min(self.batch, len(self.pending)))]
            commands = []
            for shard, flat in chunk:
                trim: list[Any] = [b"MAXLEN", b"~", self.maxlen] if self.maxlen else []
                commands.append(pack_command([b"XADD", self.streams[shard], *trim, b"*", *flat]))
            try:
                send_packed(self.client, commands)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._wait(exc, retry, deadline)
                if deadline is not None and time.monotonic() >= deadline:
                    break
                continue
            retry.reset()
            for _ in chunk:
                self.pending.popleft()
            written += len(chunk)
        self.routed += written
        return written

    def _wait(self, exc: Exception, retry: BackoffSchedule, deadline: float | None) -> None:
        self.connection_errors += 1
        delay = retry.next()
        if deadline is not None:
            delay = max(0.0, min(delay, deadline - time.monotonic()))
        if self.connection_errors == 1 or delay >= 1.0:
            log.warning("router: redis unreachable (%s); %d bars wait, retrying in %.2f s",
                        exc, len(self.pending), delay)  # fmt: skip
        self.sleep(delay)


class RouterThread:
    """A ``Router`` fed from a thread of its own, so that a producer's event loop never
    waits on Redis: ``put`` queues bars and returns at once; the thread sends them in
    order and waits out Redis outages (the bars wait in memory meanwhile).

    >>> routing = RouterThread(Router("redis://127.0.0.1:6379/0", shards=4))
    >>> routing.put([{"symbol": "BTC", "time": 1700000000000, "close": "37000.5"}])
    >>> left = routing.close(timeout=10.0)   # bars not written by then (0: all written)
    """

    def __init__(self, router: Router) -> None:
        self.router = router
        self._queue: queue.SimpleQueue[list[Mapping[str, Any]] | None] = queue.SimpleQueue()
        self._queued = 0  # bars put and not yet handed to the router
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="atc-router", daemon=True)
        self._thread.start()

    def put(self, bars: list[Mapping[str, Any]]) -> None:
        """Queue ``bars`` (in order) for their shards."""
        if bars:
            with self._lock:
                self._queued += len(bars)
            self._queue.put(bars)

    def close(self, timeout: float) -> int:
        """Write what is queued (within ``timeout`` seconds) and stop; the number of bars
        left unwritten."""
        self._queue.put(None)
        self._thread.join(timeout)
        with self._lock:
            return self._queued + len(self.router.pending)

    def _run(self) -> None:
        while True:
            bars = self._queue.get()
            if bars is None:
                self.router.flush()
                return
            for fields in bars:
                self.router.send(fields)
            with self._lock:
                self._queued -= len(bars)
            if self._queue.empty():
                self.router.flush()


@dataclass
class RouteStats:
    """What a ``StreamRouter`` run did."""

    #: counts of confirmed scripts (a batch moved with its reply lost is not counted)
    entries: int = 0  #: input entries read and moved
    routed: int = 0  #: entries added to a shard stream
    unroutable: int = 0  #: entries without a usable symbol (acknowledged, dropped)
    connection_errors: int = 0

    def lines(self) -> list[str]:
        return [
            f"entries read     {self.entries}",
            f"routed           {self.routed}",
            f"unroutable       {self.unroutable} (no usable symbol)",
            f"redis errors     {self.connection_errors} (waited out)",
        ]


class StreamRouter:
    """Moves every entry of ``input_stream`` (read with consumer group ``group``) to its
    shard's stream exactly once: one Lua script adds a batch to the shard streams and
    acknowledges it in the input group, so a crash or a lost reply leaves the batch
    either moved and acknowledged or neither (then still pending: read again from the
    pending list). The input and shard streams must be reachable from one script: a
    standalone Redis, not a Redis Cluster (docs/design/cluster.md).
    """

    def __init__(
        self,
        redis_url_or_client: str | redis.Redis,
        input_stream: str,
        shards: int,
        *,
        prefix: str = "atc",
        group: str = "atc-router",
        consumer: str = "router-1",
        batch_size: int = 500,
        block_ms: int = 100,
        maxlen: int | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        self.shards = check_shards(shards)
        self.streams = [bars_stream(prefix, s) for s in range(shards)]
        if not isinstance(input_stream, str) or not input_stream or input_stream in self.streams:
            raise ValueError(f"input_stream must be a non-empty str and no shard stream: "
                             f"{input_stream!r}")  # fmt: skip
        self.client = client_of(redis_url_or_client, max(10.0, 5 * block_ms / 1000), 5.0)
        self.input_stream = input_stream
        self.group = group
        self.consumer = consumer
        self.batch_size = batch_size
        self.block_ms = block_ms
        self.maxlen = maxlen or 0
        self.backoff = backoff
        self.stats = RouteStats()
        self._stop = False
        self._check_pending = True  # entries of an earlier run may still be pending

    def stop(self) -> None:
        self._stop = True

    def prepare(self) -> None:
        """Create the input group (from the stream's start) when missing."""
        try:
            self.client.xgroup_create(self.input_stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def run(self, stop_when_idle: float | None = None) -> RouteStats:
        """Route until ``stop()`` or ``stop_when_idle`` seconds without input."""
        retry = self.backoff.schedule()
        idle_since = time.monotonic()
        while not self._stop:
            try:
                entries = self._read()
                if entries:
                    self._route(entries)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._connection_error(exc, retry)
                idle_since = time.monotonic()
                continue
            retry.reset()
            if entries:
                idle_since = time.monotonic()
            elif stop_when_idle is not None and time.monotonic() - idle_since >= stop_when_idle:
                break
        return self.stats

    def _read(self) -> list[Any]:
        start = "0" if self._check_pending else ">"
        reply: Any = self.client.xreadgroup(
            self.group, self.consumer, {self.input_stream: start}, count=self.batch_size,
            block=None if self._check_pending else self.block_ms,
        )  # fmt: skip
        entries = list(reply[0][1]) if reply else []
        if self._check_pending and not entries:
            self._check_pending = False
        return entries

    def _route(self, entries: list[Any]) -> None:
        args: list[Any] = [self.group, self.maxlen]
        routed = unroutable = 0
        for entry_id, fields in entries:
            symbol = _symbol_of(fields) if fields else None
            if symbol is None:
                args += (entry_id, -1, 0)
                unroutable += 1
                continue
            flat = [part for pair in fields.items() for part in pair]
            args += (entry_id, shard_of(symbol, self.shards), len(flat), *flat)
            routed += 1
        keys = [self.input_stream, *self.streams]
        send_packed(self.client, [pack_command([b"EVAL", _ROUTE_SCRIPT, len(keys), *keys, *args])])
        self.stats.entries += len(entries)
        self.stats.routed += routed
        self.stats.unroutable += unroutable

    def _connection_error(self, exc: Exception, retry: BackoffSchedule) -> None:
        self.stats.connection_errors += 1
        self._check_pending = True  # a batch may have been delivered with its reply lost
        delay = retry.next()
        if self.stats.connection_errors == 1 or delay >= 1.0:
            log.warning("router: redis unreachable (%s); retrying in %.2f s", exc, delay)
        deadline = time.monotonic() + delay
        while not self._stop and time.monotonic() < deadline:
            time.sleep(min(0.05, delay))
