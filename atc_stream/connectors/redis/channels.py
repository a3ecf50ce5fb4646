"""The pub/sub messages of a step: channel names, the record and batch structs, and the
packed Redis commands that send them (``SignalMessages``, shared by both publishers).

Channels, message schema and packing: docs/design/redis-pubsub.md.
"""

from __future__ import annotations

import time
import types
from collections.abc import Sequence

import msgspec
import numpy as np

from atc_stream.connectors.redis.resp import CRLF, bulk
from atc_stream.core.messages import (
    SignalRecord,
    encoded_records,
    encoded_records_array,
    position_records_from_result,
    record_type,
    records_from_result,
    trade_records_from_result,
)
from atc_stream.core.results import StepResult, StreamKey
from atc_stream.core.schema import SCHEMA_VERSION, columns_for, resolve_outputs

ENCODINGS = ("json", "msgpack")


#: a ``_BatchOut``'s JSON as msgspec writes it (seq, published_at, count, records array)
_BATCH_JSON = b'{"v":%d,"seq":%%d,"published_at":%%d,"count":%%d,"records":%%s}' % SCHEMA_VERSION


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


def message_types(outputs: str | Sequence[str]) -> tuple[type, type]:
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


def codec(encoding: str):
    """msgspec's JSON or MessagePack module, by name (``ENCODINGS``)."""
    if encoding == "json":
        return msgspec.json
    if encoding == "msgpack":
        return msgspec.msgpack
    raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")


def signal_channel(prefix: str, symbol: str) -> str:
    return f"{prefix}:signal:{symbol}"


def trade_channel(prefix: str, symbol: str) -> str:
    return f"{prefix}:trade:{symbol}"


def position_channel(prefix: str, symbol: str) -> str:
    return f"{prefix}:position:{symbol}"


#: PUBLISH every (channel, message) pair of ARGV in one command (Lua scripts run atomically).
PUBLISH_SCRIPT = (
    b"for i = 1, #ARGV, 2 do redis.call('PUBLISH', ARGV[i], ARGV[i + 1]) end return #ARGV / 2"
)


#: ``EVAL <PUBLISH_SCRIPT> 0`` without the argument count that precedes it
_EVAL_PUBLISH = bulk(b"EVAL") + bulk(PUBLISH_SCRIPT) + bulk(b"0")
_HSET = bulk(b"HSET")
_PUBLISH = b"*3\r\n" + bulk(b"PUBLISH")  # then the channel and the message
_HEAD = b"$%d\r\n"  # a bulk string's length header
#: ``CLIENT REPLY OFF`` (no reply to it or to what follows) and ``CLIENT REPLY ON`` (+OK)
_REPLY_OFF = b"*3\r\n" + bulk(b"CLIENT") + bulk(b"REPLY") + bulk(b"OFF")
_REPLY_ON = b"*3\r\n" + bulk(b"CLIENT") + bulk(b"REPLY") + bulk(b"ON")


def _interleave(names: list[bytes], heads: list[bytes], messages: list[bytes]) -> list[bytes]:
    """RESP pieces ``name, head, message, CRLF`` for each row, laid out by slice
    assignment (C loops)."""
    pieces: list[bytes] = [CRLF] * (4 * len(messages))
    pieces[0::4] = names
    pieces[1::4] = heads
    pieces[2::4] = messages
    return pieces


class SignalMessages:
    """What goes out for a step: the channels, records, events, trades, positions and
    latest-hash fields of docs/design/redis-pubsub.md, as packed Redis commands, and the
    delivery counters (``stats()``). Shared by the thread publisher
    (``pubsub.SignalPublisher``) and the event-loop one (``loop.LoopPublisher``)."""

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
        self._encoder = codec(encoding).Encoder()
        self.prefix = prefix
        self.encoding = encoding
        self.per_symbol = per_symbol
        self.batch = batch
        self.events = events
        #: publish events of rows that are not ready yet too (docs/spec.md, "Readiness")
        self.events_before_ready = events_before_ready
        self.latest = latest
        #: the fan-out's messages as PUBLISH commands between ``CLIENT REPLY OFF`` and
        #: ``ON`` instead of one EVAL (set by a publisher whose server takes them)
        self.plain_publishes = False
        self.batch_channel = f"{prefix}:batch"
        self.events_channel = f"{prefix}:events"
        self.trades_channel = f"{prefix}:trades"
        self.positions_channel = f"{prefix}:positions"
        self.latest_key = f"{prefix}:latest"
        self.positions_latest_key = f"{prefix}:positions:latest"
        self._trades_bulk = bulk(self.trades_channel.encode())
        self._positions_bulk = bulk(self.positions_channel.encode())
        self._positions_latest_bulk = bulk(self.positions_latest_key.encode())
        self._batch_bulk = bulk(self.batch_channel.encode())
        self._events_bulk = bulk(self.events_channel.encode())
        self._latest_key_bulk = bulk(self.latest_key.encode())
        #: RESP bulk strings of each stream's channels and latest-hash fields, made once
        self._channels: dict[str, bytes] = {}
        self._fields: dict[tuple[str, str, int], bytes] = {}
        self._trade_channels: dict[str, bytes] = {}
        self._position_channels: dict[str, bytes] = {}
        self._position_fields: dict[tuple[StreamKey, int], list[bytes]] = {}
        #: the engine streams the per-slot arrays of ``_slot_names`` were made for
        self._slot_keys: list[StreamKey | None] = []
        self._slot_arrays: tuple[np.ndarray, np.ndarray] = (np.zeros(0, object),) * 2
        # delivery counters (``stats()``), kept by the publisher that sends these
        self._seq = 0
        self.enqueued = 0
        self.delivered = 0
        self.delivered_rows = 0
        self.dropped = 0
        self.dropped_rows = 0
        self.messages = 0
        self.errors = 0
        self.reconnects = 0

    def _counts(self, queued: int) -> dict[str, int]:
        """The delivery counters; ``queued``: steps given but not delivered or dropped."""
        names = ("enqueued", "delivered", "delivered_rows", "dropped", "dropped_rows",
                 "messages", "errors")  # fmt: skip
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

    def warm(self, result: StepResult) -> None:
        """Encodes and packs ``result``'s messages as a publish would, and sends nothing:
        run just before a burst, it brings this code and its data into the CPU's caches
        (``KlineStepper.warm``). Counters and sequence numbers are untouched."""
        self._commands([(0, result)])

    def _encode(self, items: Sequence[tuple[int, StepResult]]) -> list[tuple]:
        """(seq, result, encoded records) of each item; in JSON the records are None
        here: the batch message takes them as one array (``encoded_records_array``), and
        the other messages cut from it once the batch is out (``_fanout_commands``)."""
        if self.encoding == "json":
            return [(seq, result, None) for seq, result in items]
        return [(seq, result, self._encoded_records(result)) for seq, result in items]

    def _batch_commands(self, encoded: Sequence[tuple]) -> list[bytes]:
        """A PUBLISH to the batch channel per step (none when ``batch`` is off)."""
        if not self.batch:
            return []
        commands = []
        for seq, result, records in encoded:
            if self.encoding == "json":  # _BatchOut's JSON, written directly
                array = encoded_records_array(result)
                message = _BATCH_JSON % (seq, time.time_ns(), len(result), array)
            else:
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
        """The EVAL publishing per-symbol, event, trade and position messages and the HSETs
        of the latest hashes, and how many messages and fields they carry.

        The per-row pieces are laid out with list slice assignments over per-slot arrays
        of channel names and hash fields (C loops, no Python work per row); only the rows
        that fire an event, and groups whose rows repeat a stream, are visited one by one."""
        publish: list[bytes] = []  # RESP pieces: channel, message, channel, message, ...
        n_publish = 0
        latest: dict[bytes, tuple[bytes, bytes]] = {}  # field -> (length header, message)
        latest_pieces: list[bytes] = []  # field, header, message, CRLF, ... (unique fields)
        positions: dict[bytes, tuple[bytes, bytes]] = {}  # the same, of the positions hash
        one_step = len(encoded) == 1
        for _seq, result, step_records in encoded:
            records = self._encoded_records(result) if step_records is None else step_records
            n = len(records)
            heads = list(map(_HEAD.__mod__, map(len, records)))
            slots = result.slots
            channels, fields = self._slot_names(result._keys_by_slot)
            if self.per_symbol:
                publish += _interleave(channels[slots].tolist(), heads, records)
                n_publish += n
            if self.events and "events" in result.groups:  # else no long/short columns
                fire = result.long_events | result.short_events
                if not self.events_before_ready:
                    fire &= result.ready
                for i in np.flatnonzero(fire).tolist():
                    publish += (self._events_bulk, heads[i], records[i], CRLF)
                    n_publish += 1
            if result.strategy is not None:
                n_publish += self._strategy_messages(result, publish, positions)
            if self.latest:
                row_fields = fields[slots].tolist()
                if one_step and np.unique(slots).shape[0] == n:  # each field once
                    latest_pieces = _interleave(row_fields, heads, records)
                else:  # the last record of each stream wins
                    latest.update(zip(row_fields, zip(heads, records, strict=True), strict=True))
        commands = []
        if n_publish and self.plain_publishes:
            # PUBLISH commands with their replies off: one command each costs Redis about
            # a third of a PUBLISH from Lua, and the +OK of CLIENT REPLY ON is the one
            # reply (each message is 4 pieces of ``publish``: channel, head, data, CRLF)
            pieces: list[bytes] = [_PUBLISH] * (5 * n_publish)
            for k in range(4):
                pieces[k + 1 :: 5] = publish[k::4]
            commands.append(b"".join([_REPLY_OFF, *pieces, _REPLY_ON]))
        elif n_publish:
            header = b"*%d\r\n" % (3 + 2 * n_publish) + _EVAL_PUBLISH
            commands.append(header + b"".join(publish))
        for field, (head, data) in latest.items():
            latest_pieces += (field, head, data, CRLF)
        n_latest = len(latest_pieces) // 4
        if n_latest:
            parts = [b"*%d\r\n" % (2 + 2 * n_latest), _HSET, self._latest_key_bulk]
            commands.append(b"".join(parts + latest_pieces))
        if positions:
            parts = [b"*%d\r\n" % (2 + 2 * len(positions)), _HSET, self._positions_latest_bulk]
            for field, (head, data) in positions.items():
                parts += (field, head, data, CRLF)
            commands.append(b"".join(parts))
        return commands, n_publish + n_latest + len(positions)

    def _slot_names(self, keys_by_slot: list[StreamKey | None]) -> tuple[np.ndarray, np.ndarray]:
        """Per engine slot, the RESP bulk string of its symbol's channel and of its field in
        the latest hash (object arrays indexed by slot), rebuilt when the engine's streams
        changed since the last call."""
        if keys_by_slot != self._slot_keys:  # identical key objects compare without __eq__
            channels = np.full(len(keys_by_slot), None, object)
            fields = np.full(len(keys_by_slot), None, object)
            for slot, key in enumerate(keys_by_slot):
                if key is not None:
                    channels[slot] = self._channels.get(key.symbol) or self._symbol_channel(
                        key.symbol
                    )
                    fields[slot] = self._latest_field((key.symbol, key.interval, key.params_id))
            self._slot_keys = list(keys_by_slot)
            self._slot_arrays = channels, fields
        return self._slot_arrays

    def _strategy_messages(
        self, result: StepResult, publish: list[bytes], latest: dict[bytes, tuple[bytes, bytes]]
    ) -> int:
        """Add the trade and position messages of ``result`` to ``publish`` (RESP pieces)
        and its positions to ``latest`` (field -> length header, message); returns how
        many messages were added."""
        encode = self._encoder.encode
        per_record = 2 if self.per_symbol else 1  # the all-symbols channel, the symbol's
        added = 0
        for trade in trade_records_from_result(result):
            data = encode(trade)
            head = b"$%d\r\n" % len(data)
            publish += (self._trades_bulk, head, data, CRLF)
            if self.per_symbol:
                channel = self._trade_channels.get(trade.symbol) or self._cache(
                    self._trade_channels, trade.symbol, trade_channel(self.prefix, trade.symbol)
                )
                publish += (channel, head, data, CRLF)
            added += per_record
        positions = position_records_from_result(result)
        if not positions:
            return added
        # positions come rows first, one per strategy: a row's stream gives its channel
        # and, with the strategy id, its field in the positions hash
        n_strategies = len(positions) // len(result)
        messages = [encode(position) for position in positions]
        heads = [b"$%d\r\n" % len(data) for data in messages]
        keys = result.keys
        everyone = self._positions_bulk
        for head, data in zip(heads, messages, strict=True):
            publish += (everyone, head, data, CRLF)
        if self.per_symbol:
            cached = self._position_channels.get
            for key, k in zip(keys, range(0, len(positions), n_strategies), strict=True):
                channel = cached(key.symbol) or self._cache(
                    self._position_channels, key.symbol, position_channel(self.prefix, key.symbol)
                )
                for head, data in zip(heads[k : k + n_strategies], messages[k : k + n_strategies],
                                      strict=True):  # fmt: skip
                    publish += (channel, head, data, CRLF)
        if self.latest:
            field_of = self._position_fields.get
            fields = [
                field
                for key in keys
                for field in field_of((key, n_strategies))
                or self._strategy_fields(key, n_strategies)
            ]
            latest.update(zip(fields, zip(heads, messages, strict=True), strict=True))
        return added + per_record * len(positions)

    def _strategy_fields(self, key: StreamKey, n_strategies: int) -> list[bytes]:
        """The positions-hash fields of ``key``'s strategy streams (as ``PositionRecord.key``)."""
        fields = [bulk(f"{key}:{strategy_id}".encode()) for strategy_id in range(n_strategies)]
        self._position_fields[key, n_strategies] = fields
        return fields

    @staticmethod
    def _cache(cache: dict[str, bytes], name: str, text: str) -> bytes:
        """``text`` as a RESP bulk string, kept in ``cache`` under ``name``."""
        cache[name] = value = bulk(text.encode())
        return value

    def _symbol_channel(self, symbol: str) -> bytes:
        channel = bulk(signal_channel(self.prefix, symbol).encode())
        self._channels[symbol] = channel
        return channel

    def _latest_field(self, key: tuple[str, str, int]) -> bytes:
        field = bulk(str(StreamKey(*key)).encode())  # the stream key, as SignalRecord.key
        self._fields[key] = field
        return field

    def _encoded_records(self, result: StepResult) -> list[bytes]:
        """Every row's record, encoded (JSON: once per result, shared with the JSONL writer)."""
        if self.encoding == "json":
            return encoded_records(result)
        encode = self._encoder.encode
        return [encode(record) for record in records_from_result(result)]
