"""Signals out to Redis pub/sub from a thread (``SignalPublisher``), and the subscriber
that reads them (``SignalSubscriber``).

Channels, message schema and delivery: docs/design/redis-pubsub.md.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import msgspec
import redis

from atc_stream.connectors.redis.channels import (
    SignalMessages,
    codec,
    message_types,
    position_channel,
    signal_channel,
)
from atc_stream.connectors.redis.resp import fail_fast_client, send_packed
from atc_stream.connectors.retry import DEFAULT_BACKOFF, Backoff
from atc_stream.core.messages import PositionRecord, TradeRecord
from atc_stream.core.results import StepResult

log = logging.getLogger("atc_stream.redis")

#: Seconds the subscriber waits for a connection, a TLS handshake or the rest of a reply:
#: a server that accepts and never answers (a TLS URL on a plain port) must not hang it.
#: Waiting for the next message is bounded by the caller's timeout, not by this.
SUBSCRIBER_SOCKET_TIMEOUT = 10.0


class SignalPublisher(SignalMessages):
    """Publishes step results to Redis without ever blocking the caller.

    >>> pub = SignalPublisher("redis://127.0.0.1:6379/0")
    >>> pub.publish(engine.step(bars))   # returns at once; False if the queue was full
    >>> pub.close()                      # flush (within ``close_timeout``) and stop

    Counters (read any time, or ``stats()``): ``enqueued``/``delivered``/``dropped``
    steps, ``delivered_rows``/``dropped_rows``, ``messages`` (pub/sub messages and hash
    fields written), ``errors`` (failed sends), ``reconnects`` (outages that ended) and
    ``connected``.

    Up to ``max_steps_per_send`` queued steps go out in one round trip (one Lua script
    that publishes them, plus one HSET); the cap keeps each script short, since Redis
    serves nobody else while a script runs. While Redis is unreachable the thread PINGs
    it on the ``backoff`` schedule.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "atc",
        encoding: str = "json",
        queue_size: int = 4096,
        per_symbol: bool = True,
        batch: bool = True,
        events: bool = True,
        events_before_ready: bool = False,
        latest: bool = True,
        max_steps_per_send: int = 16,
        socket_timeout: float = 2.0,
        backoff: Backoff = DEFAULT_BACKOFF,
        close_timeout: float = 10.0,
    ) -> None:
        super().__init__(
            prefix=prefix, encoding=encoding, per_symbol=per_symbol, batch=batch,
            events=events, events_before_ready=events_before_ready, latest=latest,
        )  # fmt: skip
        if not isinstance(queue_size, int) or queue_size < 1:
            raise ValueError(f"queue_size must be an int >= 1, got {queue_size!r}")
        if max_steps_per_send < 1:
            raise ValueError(f"max_steps_per_send must be >= 1, got {max_steps_per_send!r}")
        self.url = url
        self.close_timeout = close_timeout
        self.backoff = backoff
        self._client = fail_fast_client(url, socket_timeout)
        self._queue: queue.Queue[tuple[int, StepResult]] = queue.Queue(maxsize=queue_size)
        self._max_steps = max_steps_per_send
        self._lock = threading.Condition()
        self._closing = threading.Event()
        self._abandon = threading.Event()
        self._closed = False
        self._drop_logged = False
        self.connected = True
        self._thread = threading.Thread(target=self._run, name="atc-redis-publisher", daemon=True)
        self._thread.start()

    # -- caller side ---------------------------------------------------------------------

    def publish(self, result: StepResult) -> bool:
        """Queue ``result`` for publishing; False (and counted in ``dropped``) if it is full."""
        if self._closed:
            raise RuntimeError("publish() after close()")
        if len(result) == 0:
            return True
        with self._lock:
            self.enqueued += 1
            self._seq += 1
            seq = self._seq
        try:
            self._queue.put_nowait((seq, result))
        except queue.Full:
            self._count_dropped([result], "the publish queue is full (Redis slow or down)")
            return False
        return True

    def write(self, result: StepResult) -> None:
        """Sink protocol: same as :meth:`publish`."""
        self.publish(result)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued step is delivered or dropped; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self.delivered + self.dropped < self.enqueued:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._lock.wait(0.05 if remaining is None else min(remaining, 0.05))
        return True

    def close(self, timeout: float | None = None) -> bool:
        """Flush within ``timeout`` (default ``close_timeout``), stop the thread; True if all
        queued steps were handled (delivered or counted as dropped) in time."""
        if self._closed:
            return True
        timeout = self.close_timeout if timeout is None else timeout
        flushed = self.flush(timeout)
        self._closed = True
        if not flushed:
            self._abandon.set()
        self._closing.set()
        self._thread.join(max(timeout, 1.0))
        leftover = []
        while True:
            try:
                leftover.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if leftover:
            self._count_dropped(leftover, "closing before they could be sent")
        self._client.close()
        return flushed

    def stats(self) -> dict[str, int]:
        with self._lock:
            return self._counts(self._queue.qsize())

    def __enter__(self) -> SignalPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- publisher thread ---------------------------------------------------------------

    def _count_dropped(self, results: Sequence, why: str) -> None:
        """Count dropped steps (``StepResult`` or queued ``(seq, StepResult)`` items)."""
        with self._lock:
            self.dropped += len(results)
            self.dropped_rows += sum(len(r[1] if isinstance(r, tuple) else r) for r in results)
            self._lock.notify_all()
        if not self._drop_logged:
            self._drop_logged = True
            log.warning("dropping signal messages: %s (further drops are only counted)", why)

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=0.05)
            except queue.Empty:
                if self._closing.is_set():
                    return
                continue
            items = [first]
            while len(items) < self._max_steps:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if self._abandon.is_set():
                self._count_dropped(items, "closing before they could be sent")
                continue
            try:
                sent = self._send(items)
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                self._count_dropped(items, f"redis unreachable ({exc})")
                self._outage(exc)
                continue
            except Exception as exc:  # a reply error or an encoding bug: drop, never die
                self.errors += 1
                log.error("cannot publish signal messages (%s); dropping them", exc)
                self._count_dropped(items, f"publish failed ({exc})")
                continue
            with self._lock:
                self.delivered += len(items)
                self.delivered_rows += sum(len(result) for _, result in items)
                self.messages += sent
                self._lock.notify_all()

    def _outage(self, exc: BaseException) -> None:
        """Redis is unreachable: drop (and count) every step queued meanwhile, and PING
        on the ``backoff`` schedule until it answers (or ``close``)."""
        with self._lock:
            self.errors += 1
            self.connected = False
        log.warning("redis publish failed (%s); reconnecting with backoff", exc)
        retry = self.backoff.schedule()
        while True:
            deadline = time.monotonic() + retry.next()
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = self._queue.get(timeout=min(remaining, 0.05))
                except queue.Empty:
                    if self._closing.is_set():
                        self._abandon.set()
                        return
                    continue
                self._count_dropped([item], "redis unreachable")
            try:
                self._client.ping()
            except (redis.RedisError, OSError):
                continue
            with self._lock:
                self.connected = True
                self.reconnects += 1
            log.warning("redis publish resumed")
            return

    def _send(self, items: list[tuple[int, StepResult]]) -> int:
        """Encode ``items`` and send them in one round trip; returns messages sent."""
        commands, messages = self._commands(items)
        if commands:
            send_packed(self._client, commands)
        return messages


# -- subscriber -------------------------------------------------------------------------


class Message(msgspec.Struct):
    """One received message: its channel, kind (``signal``, ``event``, ``batch``, ``trade``
    or ``position``) and decoded payload (a Struct, or a dict with ``as_dict=True``)."""

    channel: str
    kind: str
    data: Any


class SignalSubscriber:
    """Subscribe to a publisher's channels and iterate decoded messages.

    With no ``symbols``, ``events``, ``trades``, ``positions`` or ``batch`` selected it
    subscribes to every per-symbol signal channel (pattern ``{prefix}:signal:*``).
    ``channels``/``patterns`` add raw channel names or glob patterns. ``outputs``: the
    output groups of the engine whose results are published (``Engine(outputs=...)``;
    the CLI publishes "all"), so that records of fewer columns decode. A lost connection
    is re-established on the ``backoff`` schedule, for as long as the outage lasts.
    A message that does not decode, or arrives on a channel name that is not UTF-8, is
    skipped and counted in ``malformed``; so is a field of the latest hashes that does
    not decode (``latest``, ``latest_positions``).

    The events, trades and positions channels and the latest hashes carry every
    symbol's records: with ``symbols`` (and not ``all_symbols``) only those symbols'
    records of them are given, as the signal channels are narrowed by subscription. A
    batch (one step of every symbol) is given whole; so is whatever arrives on the
    ``channels`` named, or only through ``patterns`` (a shared channel asked for by flag
    and matched by a pattern too is narrowed), and ``get_raw`` (undecoded) gives
    everything.

    >>> with SignalSubscriber(url, symbols=["BTCUSDT"], events=True) as sub:
    ...     for msg in sub.messages(timeout=5):
    ...         print(msg.channel, msg.data.signal)
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "atc",
        encoding: str = "json",
        symbols: Iterable[str] | None = None,
        events: bool = False,
        trades: bool = False,
        positions: bool = False,
        batch: bool = False,
        all_symbols: bool = False,
        channels: Iterable[str] = (),
        patterns: Iterable[str] = (),
        as_dict: bool = False,
        outputs: str | Sequence[str] = "all",
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        module = codec(encoding)
        self.prefix = prefix
        self.as_dict = as_dict
        self.batch_channel = f"{prefix}:batch"
        self.events_channel = f"{prefix}:events"
        self.trades_channel = f"{prefix}:trades"
        self.positions_channel = f"{prefix}:positions"
        self.latest_key = f"{prefix}:latest"
        self.positions_latest_key = f"{prefix}:positions:latest"
        record, batch_type = message_types(outputs)
        self._trade_decoder = module.Decoder(TradeRecord)
        self._position_decoder = module.Decoder(PositionRecord)
        self._record_decoder = module.Decoder(record)
        self._batch_decoder = module.Decoder(batch_type)
        self.backoff = backoff
        self._retry = backoff.schedule()
        self._client = fail_fast_client(url, SUBSCRIBER_SOCKET_TIMEOUT)
        self._pubsub = self._client.pubsub()
        #: messages that did not decode (skipped, counted; the first one is logged)
        self.malformed = 0
        #: times the connection was lost and re-established
        self.reconnects = 0
        #: the connection was lost and no resubscription has succeeded since
        self._lost = False
        chosen = list(symbols or ())
        #: the symbols whose records of the shared channels and hashes are given; None: all
        self.symbols = frozenset(chosen) if chosen and not all_symbols else None
        channels = list(channels)
        # narrowed: the shared channels asked for by flag; one also named in ``channels``
        # is given whole, as everything named there is
        flagged = {self.events_channel: events, self.trades_channel: trades,
                   self.positions_channel: positions}  # fmt: skip
        self._shared = frozenset(c for c, on in flagged.items() if on and c not in channels)
        names = [signal_channel(prefix, s) for s in chosen]
        if events:
            names.append(self.events_channel)
        if trades:
            names.append(self.trades_channel)
        if positions:
            names.append(self.positions_channel)
        if batch:
            names.append(self.batch_channel)
        names.extend(channels)
        globs = list(patterns)
        if all_symbols or not names and not globs:
            globs.append(signal_channel(prefix, "*"))
        self.channels = names
        self.patterns = globs
        if names:
            self._pubsub.subscribe(*names)
        if globs:
            self._pubsub.psubscribe(*globs)
        self._pending_confirmations = len(names) + len(globs)
        self._buffer: deque[dict] = deque()

    def wait_ready(self, timeout: float = 5.0) -> None:
        """Block until the server confirmed every subscription (messages published after
        this returns are received)."""
        deadline = time.monotonic() + timeout
        while self._pending_confirmations > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("subscriptions were not confirmed in time")
            raw = self._pubsub.get_message(timeout=remaining)
            self._take(raw)

    def _take(self, raw: dict | None) -> None:
        if raw is None:
            return
        if raw["type"] in ("subscribe", "psubscribe"):
            self._pending_confirmations -= 1
        elif raw["type"] in ("message", "pmessage"):
            self._buffer.append(raw)

    def decode(self, channel: str, data: bytes) -> Message:
        """Decode one payload received on ``channel``."""
        if channel == self.batch_channel:
            kind, value = "batch", self._batch_decoder.decode(data)
        elif channel == self.trades_channel or channel.startswith(f"{self.prefix}:trade:"):
            kind, value = "trade", self._trade_decoder.decode(data)
        elif channel == self.positions_channel or channel.startswith(
            position_channel(self.prefix, "")
        ):
            kind, value = "position", self._position_decoder.decode(data)
        else:
            kind = "event" if channel == self.events_channel else "signal"
            value = self._record_decoder.decode(data)
        if self.as_dict:
            value = msgspec.to_builtins(value)
        return Message(channel, kind, value)

    def _poll(self, timeout: float) -> None:
        """One ``get_message``; a lost connection is re-established on the ``backoff``
        schedule (messages published while it was down are lost: pub/sub keeps nothing)."""
        if self._lost:
            self._reconnect(timeout)
            return
        try:
            self._take(self._pubsub.get_message(timeout=timeout))
            self._retry.reset()
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            log.warning("subscriber lost its connection (%s); reconnecting with backoff", exc)
            self._lost = True
            self._reconnect(timeout)

    def _reconnect(self, timeout: float) -> None:
        """One attempt to subscribe again, after the next delay of the schedule. A
        failed attempt leaves ``_lost`` set: a pubsub whose SUBSCRIBE failed holds no
        subscription, and its ``get_message`` would wait quietly forever."""
        time.sleep(min(self._retry.next(), max(timeout, 0.01)))
        try:
            self._resubscribe()
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return
        self._lost = False
        self.reconnects += 1
        log.warning("subscriber reconnected (%d reconnects so far)", self.reconnects)

    def _resubscribe(self) -> None:
        try:
            self._pubsub.close()
        except Exception:  # the old connection is gone anyway
            pass
        pubsub = self._client.pubsub()
        if self.channels:
            pubsub.subscribe(*self.channels)
        if self.patterns:
            pubsub.psubscribe(*self.patterns)
        self._pubsub = pubsub

    def get_raw(self, timeout: float | None = 1.0) -> tuple[str, bytes] | None:
        """The next message undecoded, as ``(channel, payload)``; None after ``timeout`` s.
        A channel name that is not UTF-8 raises ``UnicodeDecodeError`` (the message is
        consumed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._buffer:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            # get_message(timeout=None) would block forever; poll in slices instead
            self._poll(1.0 if remaining is None else remaining)
        raw = self._buffer.popleft()
        channel = raw["channel"]
        return channel if isinstance(channel, str) else channel.decode(), raw["data"]

    def get(self, timeout: float | None = 1.0) -> Message | None:
        """The next message that decodes, or None if none arrived within ``timeout`` seconds.

        A message that does not decode is skipped and counted in ``malformed``; one of a
        symbol not chosen (see the class) is skipped, and ``timeout`` counts only the
        messages given.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                raw = self.get_raw(remaining)
            except UnicodeDecodeError as exc:  # a channel name no publisher of ours sends
                self._skip("a channel that is not UTF-8", exc)
                continue
            if raw is None:
                return None
            try:
                msg = self.decode(*raw)
            except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
                self._skip(raw[0], exc)
                continue
            if msg.channel not in self._shared or self._chosen(msg.data):
                return msg

    def _chosen(self, record: Any) -> bool:
        """Whether a decoded record (a Struct or a dict) is of one of ``symbols``."""
        if self.symbols is None:
            return True
        symbol = record.get("symbol") if isinstance(record, dict) else record.symbol
        return symbol in self.symbols

    def _skip(self, where: str, exc: Exception) -> None:
        """Count a message or hash field that does not decode; log the first one."""
        self.malformed += 1
        if self.malformed == 1:
            log.warning("malformed message on %s skipped (%s); further ones are only counted",
                        where, exc)  # fmt: skip

    def messages(self, timeout: float | None = None, limit: int | None = None) -> Iterator[Message]:
        """Yield messages until ``limit`` were yielded or none arrived for ``timeout`` s."""
        count = 0
        while limit is None or count < limit:
            msg = self.get(timeout)
            if msg is None:
                return
            count += 1
            yield msg

    def __iter__(self) -> Iterator[Message]:
        return self.messages()

    def latest(self) -> dict[str, Any]:
        """The latest record of every stream (the ``{prefix}:latest`` hash), by stream key;
        with ``symbols``, of those symbols' streams."""
        return self._hash(self.latest_key, self._record_decoder)

    def latest_positions(self) -> dict[str, Any]:
        """The latest position of every strategy stream (the ``{prefix}:positions:latest``
        hash), by ``symbol:interval:params_id:strategy_id``; with ``symbols``, of those
        symbols' streams."""
        return self._hash(self.positions_latest_key, self._position_decoder)

    def _hash(self, name: str, decoder: Any) -> dict[str, Any]:
        out = {}
        for field, data in self._client.hgetall(name).items():
            try:
                value = decoder.decode(data)
                key = field.decode() if isinstance(field, bytes) else field
            except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
                self._skip(name, exc)
                continue
            if self._chosen(value):
                out[key] = msgspec.to_builtins(value) if self.as_dict else value
        return out

    def close(self) -> None:
        self._pubsub.close()
        self._client.close()

    def __enter__(self) -> SignalSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
