"""Signals out to Redis pub/sub (and a "latest" hash), and the subscriber that reads them.

Channels, message schema and delivery: docs/design/redis-pubsub.md.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import types
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import msgspec
import redis

from atc_stream.connectors.redis.resp import CRLF, bulk, fail_fast_client, send_packed
from atc_stream.connectors.retry import DEFAULT_BACKOFF, Backoff
from atc_stream.core.messages import (
    SignalRecord,
    TradeRecord,
    encoded_rows,
    record_json,
    record_type,
    records_from_result,
    trade_records_from_result,
)
from atc_stream.core.results import StepResult, StreamKey
from atc_stream.core.schema import SCHEMA_VERSION, columns_for, resolve_outputs

log = logging.getLogger("atc_stream.redis")

ENCODINGS = ("json", "msgpack")


class SignalBatch(msgspec.Struct, kw_only=True):
    """Every record of one engine step: the message on the batch channel."""

    v: int = SCHEMA_VERSION
    seq: int  #: 1, 2, 3, ... per publisher; a gap means steps were dropped
    published_at: int  #: ns since the epoch, when the publisher encoded the batch
    count: int
    records: list[SignalRecord]


class _BatchOut(msgspec.Struct, kw_only=True):
    """SignalBatch with already encoded records (each record is encoded only once)."""

    v: int = SCHEMA_VERSION
    seq: int
    published_at: int
    count: int
    records: list[msgspec.Raw]


def _message_types(outputs: str | Sequence[str]) -> tuple[type, type]:
    """The record and batch structs of a publisher whose engine returns ``outputs``."""
    record = record_type(columns_for(resolve_outputs(outputs)))
    if record is SignalRecord:
        return SignalRecord, SignalBatch
    batch = msgspec.defstruct(
        "SignalBatch",
        [("v", int, SCHEMA_VERSION), ("seq", int), ("published_at", int), ("count", int),
         ("records", types.GenericAlias(list, (record,)))],  # list[record], made at runtime
        kw_only=True, module=__name__,
    )  # fmt: skip
    return record, batch


def _codec(encoding: str):
    if encoding == "json":
        return msgspec.json
    if encoding == "msgpack":
        return msgspec.msgpack
    raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")


def signal_channel(prefix: str, symbol: str) -> str:
    return f"{prefix}:signal:{symbol}"


def trade_channel(prefix: str, symbol: str) -> str:
    return f"{prefix}:trade:{symbol}"


#: PUBLISH every (channel, message) pair of ARGV in one command (Lua scripts run atomically).
PUBLISH_SCRIPT = (
    b"for i = 1, #ARGV, 2 do redis.call('PUBLISH', ARGV[i], ARGV[i + 1]) end return #ARGV / 2"
)


#: ``EVAL <PUBLISH_SCRIPT> 0`` without the argument count that precedes it
_EVAL_PUBLISH = bulk(b"EVAL") + bulk(PUBLISH_SCRIPT) + bulk(b"0")
_HSET = bulk(b"HSET")
_PUBLISH = b"*3\r\n" + bulk(b"PUBLISH")  # then the channel and the message


class SignalMessages:
    """What goes out for a step: the channels, records, events and latest fields of
    docs/design/redis-pubsub.md, as packed Redis commands, and the delivery counters
    (``stats()``). Shared by the thread publisher (:class:`SignalPublisher`) and the
    event-loop one (``loop.LoopPublisher``)."""

    def __init__(
        self,
        *,
        prefix: str = "atc",
        encoding: str = "json",
        per_symbol: bool = True,
        batch: bool = True,
        events: bool = True,
        events_before_ready: bool = False,
        latest: bool = True,
    ) -> None:
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"prefix must be a non-empty str, got {prefix!r}")
        self._encoder = _codec(encoding).Encoder()
        self.prefix = prefix
        self.encoding = encoding
        self.per_symbol = per_symbol
        self.batch = batch
        self.events = events
        #: publish events of rows that are not ready yet too (docs/spec.md, "Readiness")
        self.events_before_ready = events_before_ready
        self.latest = latest
        self.batch_channel = f"{prefix}:batch"
        self.events_channel = f"{prefix}:events"
        self.trades_channel = f"{prefix}:trades"
        self.latest_key = f"{prefix}:latest"
        self._trades_bulk = bulk(self.trades_channel.encode())
        self._batch_bulk = bulk(self.batch_channel.encode())
        self._events_bulk = bulk(self.events_channel.encode())
        self._latest_key_bulk = bulk(self.latest_key.encode())
        #: RESP bulk strings of each stream's channel and latest-hash field, made once
        self._channels: dict[str, bytes] = {}
        self._fields: dict[tuple[str, str, int], bytes] = {}
        # delivery counters (``stats()``), kept by the publisher that sends these
        self._seq = 0
        self.enqueued = 0
        self.delivered = 0
        self.dropped = 0
        self.dropped_rows = 0
        self.messages = 0
        self.errors = 0
        self.reconnects = 0

    def _counts(self, queued: int) -> dict[str, int]:
        """The delivery counters; ``queued``: steps given but not delivered or dropped."""
        names = ("enqueued", "delivered", "dropped", "dropped_rows", "messages", "errors")
        return {**{n: getattr(self, n) for n in names}, "reconnects": self.reconnects,
                "queued": queued}  # fmt: skip

    def _commands(self, items: Sequence[tuple[int, StepResult]]) -> tuple[list[bytes], int]:
        """The packed commands that publish ``items`` ((seq, result) pairs), and how many
        messages (channel messages + latest fields) they carry.

        The Redis protocol is written directly, each message's bytes placed once, with
        the channel names and latest-hash fields of each stream encoded once per
        publisher: on a 200-symbol step this packing is what publishing costs. The
        batch channel's commands come first: Redis sends a subscriber its messages once
        it has run the commands it read, so a batch subscriber does not wait for the
        per-symbol fan-out and the latest hash.
        """
        encoded = self._encode(items)
        batches = self._batch_commands(encoded)
        fanout, messages = self._fanout_commands(encoded)
        return batches + fanout, len(batches) + messages

    def _encode(self, items: Sequence[tuple[int, StepResult]]) -> list[tuple]:
        """(seq, result, encoded records) of each item."""
        return [(seq, result, self._encoded_records(result)) for seq, result in items]

    def _batch_commands(self, encoded: Sequence[tuple]) -> list[bytes]:
        """A PUBLISH to the batch channel per step (none when ``batch`` is off)."""
        if not self.batch:
            return []
        commands = []
        for seq, _result, records in encoded:
            message = self._encoder.encode(
                _BatchOut(
                    seq=seq,
                    published_at=time.time_ns(),
                    count=len(records),
                    records=[msgspec.Raw(d) for d in records],
                )
            )
            head = b"$%d\r\n" % len(message)
            commands.append(b"".join((_PUBLISH, self._batch_bulk, head, message, CRLF)))
        return commands

    def _fanout_commands(self, encoded: Sequence[tuple]) -> tuple[list[bytes], int]:
        """The EVAL publishing per-symbol and event messages and the HSET of the latest
        hash, and how many messages and fields they carry."""
        publish: list[bytes] = []  # RESP pieces: channel, message, channel, message, ...
        n_publish = 0
        latest: dict[bytes, tuple[bytes, bytes]] = {}  # field -> (length header, message)
        for _seq, result, records in encoded:
            heads = [b"$%d\r\n" % len(data) for data in records]
            columns = dict(zip(result.column_names, result.column_values(), strict=True))
            symbols = columns["symbol"]
            if self.per_symbol:
                channel_of = self._channels.get
                for symbol, head, data in zip(symbols, heads, records, strict=True):
                    channel = channel_of(symbol) or self._symbol_channel(symbol)
                    publish += (channel, head, data, CRLF)
                n_publish += len(records)
            if self.events and "events" in result.groups:  # else no long/short columns
                flags = zip(columns["long"], columns["short"], columns["ready"], strict=True)
                for (long, short, ready), head, data in zip(flags, heads, records, strict=True):
                    if (long or short) and (ready or self.events_before_ready):
                        publish += (self._events_bulk, head, data, CRLF)
                        n_publish += 1
            for trade in trade_records_from_result(result):
                data = self._encoder.encode(trade)
                head = b"$%d\r\n" % len(data)
                channels = [self._trades_bulk]
                if self.per_symbol:
                    channels.append(bulk(trade_channel(self.prefix, trade.symbol).encode()))
                for channel in channels:
                    publish += (channel, head, data, CRLF)
                n_publish += len(channels)
            if self.latest:
                field_of = self._fields.get
                keys = zip(symbols, columns["interval"], columns["params_id"], strict=True)
                for key, head, data in zip(keys, heads, records, strict=True):
                    latest[field_of(key) or self._latest_field(key)] = (head, data)
        commands = []
        if n_publish:
            header = b"*%d\r\n" % (3 + 2 * n_publish) + _EVAL_PUBLISH
            commands.append(header + b"".join(publish))
        if latest:
            parts = [b"*%d\r\n" % (2 + 2 * len(latest)), _HSET, self._latest_key_bulk]
            for field, (head, data) in latest.items():
                parts += (field, head, data, CRLF)
            commands.append(b"".join(parts))
        return commands, n_publish + len(latest)

    def _symbol_channel(self, symbol: str) -> bytes:
        channel = bulk(signal_channel(self.prefix, symbol).encode())
        self._channels[symbol] = channel
        return channel

    def _latest_field(self, key: tuple[str, str, int]) -> bytes:
        field = bulk(str(StreamKey(*key)).encode())  # the stream key, as SignalRecord.key
        self._fields[key] = field
        return field

    def _encoded_records(self, result: StepResult) -> list[bytes]:
        """Every row's record, encoded; JSON reuses the rows the file writer encoded."""
        if self.encoding == "json":
            return [record_json(row) for row in encoded_rows(result)]
        encode = self._encoder.encode
        return [encode(record) for record in records_from_result(result)]


class SignalPublisher(SignalMessages):
    """Publishes step results to Redis without ever blocking the caller.

    >>> pub = SignalPublisher("redis://127.0.0.1:6379/0")
    >>> pub.publish(engine.step(bars))   # returns at once; False if the queue was full
    >>> pub.close()                      # flush (within ``close_timeout``) and stop

    Counters (read any time, or ``stats()``): ``enqueued``/``delivered``/``dropped``
    steps, ``dropped_rows``, ``messages`` (pub/sub messages and hash fields written),
    ``errors`` (failed sends), ``reconnects`` (outages that ended) and ``connected``.

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
    """One received message: its channel, kind (``signal``, ``event``, ``trade`` or ``batch``) and
    decoded payload (a Struct, or a dict with ``as_dict=True``)."""

    channel: str
    kind: str
    data: Any


class SignalSubscriber:
    """Subscribe to a publisher's channels and iterate decoded messages.

    With no ``symbols``, ``events`` or ``batch`` selected it subscribes to every
    per-symbol channel (pattern ``{prefix}:signal:*``). ``channels``/``patterns`` add
    raw channel names or glob patterns. ``outputs``: the output groups of the engine
    whose results are published (``Engine(outputs=...)``; the CLI publishes "all"), so
    that records of fewer columns decode. A lost connection is re-established on the
    ``backoff`` schedule.

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
        batch: bool = False,
        all_symbols: bool = False,
        channels: Iterable[str] = (),
        patterns: Iterable[str] = (),
        as_dict: bool = False,
        outputs: str | Sequence[str] = "all",
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        codec = _codec(encoding)
        self.prefix = prefix
        self.as_dict = as_dict
        self.batch_channel = f"{prefix}:batch"
        self.events_channel = f"{prefix}:events"
        self.trades_channel = f"{prefix}:trades"
        self.latest_key = f"{prefix}:latest"
        record, batch_type = _message_types(outputs)
        self._trade_decoder = codec.Decoder(TradeRecord)
        self._record_decoder = codec.Decoder(record)
        self._batch_decoder = codec.Decoder(batch_type)
        self.backoff = backoff
        self._retry = backoff.schedule()
        self._client = fail_fast_client(url)
        self._pubsub = self._client.pubsub()
        #: messages that did not decode (skipped, counted; the first one is logged)
        self.malformed = 0
        #: times the connection was lost and re-established
        self.reconnects = 0
        names = [signal_channel(prefix, s) for s in (symbols or ())]
        if events:
            names.append(self.events_channel)
        if trades:
            names.append(self.trades_channel)
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
        else:
            kind = "event" if channel == self.events_channel else "signal"
            value = self._record_decoder.decode(data)
        if self.as_dict:
            value = msgspec.to_builtins(value)
        return Message(channel, kind, value)

    def _poll(self, timeout: float) -> None:
        """One ``get_message``; a lost connection is re-established on the ``backoff``
        schedule (messages published while it was down are lost: pub/sub keeps nothing)."""
        try:
            self._take(self._pubsub.get_message(timeout=timeout))
            self._retry.reset()
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            if self._retry.attempt == 0:
                log.warning("subscriber lost its connection (%s); reconnecting with backoff", exc)
            time.sleep(min(self._retry.next(), max(timeout, 0.01)))
            try:
                self._resubscribe()
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                return
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
        """The next message undecoded, as ``(channel, payload)``; None after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._buffer:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            # get_message(timeout=None) would block forever; poll in slices instead
            self._poll(1.0 if remaining is None else remaining)
        raw = self._buffer.popleft()
        channel = raw["channel"].decode() if isinstance(raw["channel"], bytes) else raw["channel"]
        return channel, raw["data"]

    def get(self, timeout: float | None = 1.0) -> Message | None:
        """The next message that decodes, or None if none arrived within ``timeout`` seconds.

        A message that does not decode is skipped and counted in ``malformed``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            raw = self.get_raw(remaining)
            if raw is None:
                return None
            try:
                return self.decode(*raw)
            except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
                self.malformed += 1
                if self.malformed == 1:
                    log.warning("malformed message on %s skipped (%s); further ones are "
                                "only counted", raw[0], exc)  # fmt: skip

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
        """The latest record of every stream (the ``{prefix}:latest`` hash), by stream key."""
        out = {}
        for field, data in self._client.hgetall(self.latest_key).items():
            value = self._record_decoder.decode(data)
            key = field.decode() if isinstance(field, bytes) else field
            out[key] = msgspec.to_builtins(value) if self.as_dict else value
        return out

    def close(self) -> None:
        self._pubsub.close()
        self._client.close()

    def __enter__(self) -> SignalSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
