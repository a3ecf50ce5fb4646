"""Bars in from a Redis Stream, signals, trades and positions out to Redis Streams, exactly
once across crashes.

The input and output format and the exactly-once argument: docs/design/redis-streams.md.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import redis

from atc_stream.connectors.redis.resp import client_of, pack_command, send_packed
from atc_stream.connectors.redis.stream_output import (
    OutputStreams,
    format_id,
    output_keys,
    parse_id,
)
from atc_stream.connectors.retry import DEFAULT_BACKOFF, Backoff, BackoffSchedule
from atc_stream.core.inputs import TIME_UNITS
from atc_stream.core.results import StepResult
from atc_stream.core.timetext import epoch_to_ms, text_to_ms
from atc_stream.engine.engine import Engine
from atc_stream.engine.paper import BAD_OHLC, MISSING_OHLC

log = logging.getLogger("atc_stream.redis")

# KEYS: input stream. ARGV: group, consumer, count. Returns the new entries as one
# msgpack blob ([[id, [field, value, ...]], ...]) or nil (false) when there are none.
_READ_SCRIPT = b"""
local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3],
                     'STREAMS', KEYS[1], '>')
if not r then return false end
return cmsgpack.pack(r[1][2])
"""

_MIN_TIME, _MAX_TIME = -(2**63), 2**63
_CLOSE_PATTERN = re.compile(
    r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|nan|inf|infinity)", re.ASCII | re.IGNORECASE
)

MALFORMED_MISSING_FIELD = "missing_field"
MALFORMED_SYMBOL = "bad_symbol"
MALFORMED_TIME = "bad_time"
MALFORMED_CLOSE = "bad_close"


def parse_bar_time(raw: Any, time_unit: str | None = None) -> int | None:
    """Engine time (int ms) of an entry's ``time`` field, strictly: an integer epoch in
    ``time_unit`` (None: as it is, epoch ms by convention; ``auto``: by magnitude), or
    ISO-8601 / RFC 3339 (``timetext``; sub-ms floored). None for anything else (``1_0``,
    ``1.5``, ``yesterday``, outside int64, no unit fits)."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        if not _MIN_TIME < raw < _MAX_TIME:  # int64, and not the "no bar" marker
            return None
        return epoch_to_ms(raw, time_unit)
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not isinstance(raw, str):
        return None
    return text_to_ms(raw, time_unit)


def _raw_prices(fields: Any) -> list[Any]:
    """An entry's raw open, high and low (None where one is missing)."""
    if isinstance(fields, list):  # msgpack path
        found = dict(zip(fields[0::2], fields[1::2], strict=False))
        return [found.get(name) for name in ("open", "high", "low")]
    return [fields.get(name) for name in (b"open", b"high", b"low")]


def parse_close(raw: Any) -> float | None:
    """An entry's ``close`` as float, strictly: a decimal or scientific number (``nan``
    and ``inf`` pass, for the engine to refuse and count); None for anything else
    (``1_0``, ``0x10``, empty)."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw)
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not isinstance(raw, str) or not _CLOSE_PATTERN.fullmatch(raw.strip()):
        return None
    return float(raw)


def source_key(input_stream: str) -> str:
    """The name of a Redis Stream input in ``Engine.source_offsets``."""
    return f"redis-stream:{input_stream}"


@dataclass
class RunStats:
    """What a Redis Streams run did."""

    entries: int = 0  #: input entries read (all kinds)
    bars: int = 0  #: bars applied: well-formed and not rejected by the engine
    rows_out: int = 0  #: output rows written (output stream and/or publisher)
    trades_out: int = 0  #: trade entries written to the output stream's ``:trades``
    positions_out: int = 0  #: position entries written to its ``:positions``
    rows_suppressed: int = 0  #: replayed rows not written again (already in the output)
    skipped_old: int = 0  #: entries at or before the restored offset, dropped
    batches: int = 0
    malformed: Counter = field(default_factory=Counter)
    #: well-formed bars the engine rejected in this run, by reason (``Engine.rejections``
    #: also holds those of the runs before a restored snapshot)
    rejected: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    #: of ``seconds``, those spent applying batches (not waiting for entries)
    busy_seconds: float = 0.0

    def lines(self) -> list[str]:
        malformed = ", ".join(f"{k}={v}" for k, v in sorted(self.malformed.items())) or "none"
        rejected = ", ".join(f"{k}={v}" for k, v in sorted(self.rejected.items())) or "none"
        return [
            f"entries read     {self.entries} in {self.batches} batches",
            f"bars applied     {self.bars} ({self.bars / self.busy_seconds:,.0f} bars/s "
            f"while busy, {self.seconds:,.1f} s in all)"
            if self.busy_seconds > 0
            else f"bars applied     {self.bars}",
            f"rows out         {self.rows_out} (+{self.rows_suppressed} suppressed replays)",
            *(
                [f"trades out       {self.trades_out}, positions out {self.positions_out}"]
                if self.trades_out or self.positions_out
                else []
            ),
            f"skipped          {self.skipped_old} (at or before the restored offset)",
            f"malformed        {malformed}",
            f"rejected bars    {rejected}",
        ]


class _Faults:
    """``ATC_STREAM_FAULT=point:n``: SIGKILL this process the n-th time ``point`` is hit."""

    def __init__(self) -> None:
        spec = os.environ.get("ATC_STREAM_FAULT", "")
        self.point, _, n = spec.partition(":")
        self.remaining = int(n) if n.strip().isdigit() else 1
        self.enabled = bool(self.point)

    def hit(self, point: str, before_kill=None) -> None:
        if not self.enabled or point != self.point:
            return
        self.remaining -= 1
        if self.remaining <= 0:
            if before_kill is not None:
                before_kill()
            os.kill(os.getpid(), signal.SIGKILL)


class RedisStreamRunner:
    """Reads bars from ``input_stream`` with a consumer group and applies them to ``engine``.

    >>> runner = RedisStreamRunner(engine, "redis://127.0.0.1:6379/0", "bars",
    ...                            output_stream="signals", snapshotter=snapshotter)
    >>> runner.prepare(resume=True)      # group, rewind to the snapshot, output mark
    >>> stats = runner.run(stop_when_idle=5.0)
    >>> snapshotter.close()               # final snapshot (the caller owns it)

    ``engine`` is a fresh engine or one restored from the newest snapshot
    (``Engine.restore``); its ``source_offsets`` say where the input resumes.
    ``output_stream`` receives the signal entries; with strategies, the trades and
    positions go to ``output_stream:trades`` and ``output_stream:positions``, written
    in the same script (``stream_output.OutputStreams``).
    ``time_unit`` is the unit of integer entry times (None: taken as they are, epoch ms
    by convention; ``auto``: by magnitude; see ``parse_bar_time``). Redis outages are
    waited out on the ``backoff`` schedule. ``output_mark_key``: a key of the output mark
    of its own, for an output stream that other runners write too (``OutputStreams``).
    """

    def __init__(
        self,
        engine: Engine,
        redis_url_or_client: str | redis.Redis,
        input_stream: str,
        *,
        group: str = "atc",
        consumer: str = "engine-1",
        output_stream: str | None = None,
        output_maxlen: int = 1_000_000,
        batch_size: int = 1000,
        block_ms: int = 100,
        start_id: str = "0",
        snapshotter: Any = None,
        publisher: Any = None,
        time_unit: str | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
        output_mark_key: str | None = None,
    ) -> None:
        if time_unit is not None and time_unit not in TIME_UNITS:
            raise ValueError(f"time_unit must be None, auto, s, ms, us or ns, got {time_unit!r}")
        for name, value in (("input_stream", input_stream), ("group", group)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty str, got {value!r}")
        if not isinstance(consumer, str) or not consumer:
            raise ValueError(f"consumer must be a non-empty str, got {consumer!r}")
        if output_stream is not None and (not isinstance(output_stream, str) or not output_stream):
            raise ValueError(f"output_stream must be a non-empty str or None: {output_stream!r}")
        if output_stream is not None and input_stream in output_keys(output_stream):
            raise ValueError(
                f"output_stream must differ from input_stream (and its :trades and "
                f":positions streams too): {output_stream!r}"
            )
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if not isinstance(output_maxlen, int) or output_maxlen < 1:
            raise ValueError(f"output_maxlen must be an int >= 1, got {output_maxlen!r}")
        if not isinstance(block_ms, int) or block_ms < 1:
            raise ValueError(f"block_ms must be an int >= 1, got {block_ms!r}")
        self.engine = engine
        #: with strategies, entries carry open/high/low too (``MISSING_OHLC`` without)
        self._ohlc = bool(engine.strategies)
        # no hidden retries: a lost XREADGROUP reply must surface (see _check_pending)
        self.client = client_of(
            redis_url_or_client, max(10.0, 5 * block_ms / 1000), connect_timeout=5.0
        )
        self.input_stream = input_stream
        self.group = group
        self.consumer = consumer
        self.output_stream = output_stream
        self.output_maxlen = output_maxlen
        self.output = (
            None
            if output_stream is None
            else OutputStreams(
                output_stream, input_stream, group, output_maxlen, mark_key=output_mark_key
            )
        )
        self.batch_size = batch_size
        self.block_ms = block_ms
        self.start_id = start_id
        self.snapshotter = snapshotter
        self.time_unit = time_unit
        self.publisher = publisher
        self.backoff = backoff
        self.source = source_key(input_stream)
        self.stats = RunStats()
        self.output_mark: tuple[int, int] | None = None
        self._offset = self._restored_offset()
        self._msgpack = msgspec.msgpack.Decoder(list)
        self._logged: set[str] = set()
        self._stop = False
        self._faults = _Faults()
        #: read this consumer's pending entries (ID "0") before new ones (">"): set after
        #: a connection error, when entries may have been delivered with the reply lost
        self._check_pending = False
        self.connection_errors = 0

    # -- setup --------------------------------------------------------------------------

    def _restored_offset(self) -> tuple[int, int]:
        value = self.engine.source_offsets.get(self.source)
        if value is None:
            return (0, 0)
        try:
            return parse_id(value)
        except ValueError as exc:
            raise ValueError(f"source offset {self.source}={value!r} is not a stream ID") from exc

    @property
    def offset(self) -> str:
        """ID of the last input entry applied to the engine (``0-0`` before any)."""
        return format_id(self._offset)

    def prepare(self, resume: bool = False) -> None:
        """Create the group if missing; with ``resume``, rewind it to the engine's offset,
        acknowledge stale pending entries and read the output mark
        (docs/design/redis-streams.md)."""
        offset = self.offset
        try:
            self.client.xgroup_create(
                self.input_stream, self.group, id=offset if resume else self.start_id, mkstream=True
            )
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        if not resume:
            return
        self.client.xgroup_setid(self.input_stream, self.group, offset)
        self._ack_stale_pending(offset)
        self._check_trimmed()
        self.output_mark = self._last_output_src()
        log.info(
            "resuming %s after entry %s (output mark %s)",
            self.input_stream,
            offset,
            None if self.output_mark is None else format_id(self.output_mark),
        )

    def group_position(self) -> str | None:
        """The ID of the last entry the consumer group delivered, when a consumer has read
        from it already; None for a missing group, or one nothing was read from yet (a
        fresh engine may start there only with ``prepare(resume=True)``, which rewinds
        the group to the engine's offset)."""
        try:
            groups = self.client.xinfo_groups(self.input_stream)
        except redis.ResponseError as exc:
            if "no such key" in str(exc).lower():
                return None
            raise
        for info in groups:
            name, last = info.get("name"), info.get("last-delivered-id")
            name = name.decode() if isinstance(name, bytes) else name
            if name != self.group or not info.get("consumers") or last is None:
                continue
            if parse_id(last) > (0, 0):
                return last.decode() if isinstance(last, bytes) else str(last)
        return None

    def _ack_stale_pending(self, offset: str) -> None:
        while True:
            pending = self.client.xpending_range(
                self.input_stream, self.group, min="-", max=offset, count=1000
            )
            if not pending:
                return
            self.client.xack(self.input_stream, self.group, *[p["message_id"] for p in pending])

    def _check_trimmed(self) -> None:
        try:
            info = self.client.xinfo_stream(self.input_stream)
        except redis.ResponseError:
            return
        deleted = info.get("max-deleted-entry-id")
        if deleted is not None and parse_id(deleted) > self._offset:
            log.error(
                "input stream %s was trimmed past the snapshot offset %s (up to %s): "
                "bars in between are lost",
                self.input_stream,
                self.offset,
                deleted.decode() if isinstance(deleted, bytes) else deleted,
            )

    # -- loop ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask ``run`` to return after the batch in progress (safe from signal handlers)."""
        self._stop = True

    def run(
        self,
        *,
        stop_when_idle: float | None = None,
        max_entries: int | None = None,
    ) -> RunStats:
        """Read and apply batches until ``stop()``, ``stop_when_idle`` seconds without
        input, or ``max_entries`` entries read. Redis outages are waited out (retried on
        the ``backoff`` schedule)."""
        started = time.perf_counter()
        idle_since = time.monotonic()
        retry = self.backoff.schedule()
        try:
            while not self._stop:
                count = self.batch_size
                if max_entries is not None:
                    count = min(count, max_entries - self.stats.entries)
                    if count <= 0:
                        break
                try:
                    entries = self._read(count)
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    self._connection_error(exc, retry)
                    idle_since = time.monotonic()
                    continue
                retry.reset()
                if not entries:
                    if self.snapshotter is not None:
                        self.snapshotter.maybe_snapshot(0)
                    if (
                        stop_when_idle is not None
                        and time.monotonic() - idle_since >= stop_when_idle
                    ):
                        break
                    continue
                applying = time.perf_counter()
                self.process(entries)
                self.stats.busy_seconds += time.perf_counter() - applying
                idle_since = time.monotonic()
        finally:
            self.stats.seconds += time.perf_counter() - started
        return self.stats

    def _read(self, count: int) -> list:
        """The next entries, as ``(id, fields)`` pairs.

        Fast path: a Lua script runs XREADGROUP and returns the entries packed with
        ``cmsgpack`` (one bulk string that msgspec decodes in microseconds, instead of
        redis-py parsing ~10 RESP items per entry in Python). When nothing is waiting
        it falls back to a blocking XREADGROUP (redis-py). Entries whose bytes are not
        UTF-8 cannot come through msgpack strings: they are then re-read from this
        consumer's pending list (ID ``0``) with redis-py, like after a connection error.
        """
        if self._check_pending:
            reply = self.client.xreadgroup(
                self.group, self.consumer, {self.input_stream: "0"}, count=count
            )
            entries = _group_entries(reply)
            if entries:
                return entries
            self._check_pending = False
        command = pack_command(
            [b"EVAL", _READ_SCRIPT, b"1", self.input_stream, self.group, self.consumer, count]
        )
        blob = send_packed(self.client, [command])[0]
        if blob is not None:
            try:
                return self._msgpack.decode(blob)
            except (msgspec.DecodeError, UnicodeDecodeError):
                self._check_pending = True
                return self._read(count)
        reply = self.client.xreadgroup(
            self.group, self.consumer, {self.input_stream: ">"}, count=count, block=self.block_ms
        )
        return _group_entries(reply)

    def _connection_error(self, exc: Exception, retry: BackoffSchedule) -> None:
        """Count the failure and wait for the next attempt (cut short by ``stop()``)."""
        self.connection_errors += 1
        self._check_pending = True
        delay = retry.next()
        if self.connection_errors == 1 or delay >= 1.0:
            log.warning("redis unreachable (%s); retrying in %.2f s", exc, delay)
        deadline = time.monotonic() + delay
        while not self._stop and time.monotonic() < deadline:
            time.sleep(min(0.05, delay))

    def process(self, entries: list) -> StepResult:
        """Apply one batch of ``(id, fields)`` entries, write its outputs and ack it (steps
        2-4 of docs/design/redis-streams.md). ``fields`` is a dict of bytes (redis-py) or a
        flat list of str (the msgpack read path)."""
        self._faults.hit("after_read")
        self.stats.batches += 1
        self.stats.entries += len(entries)
        bars: list[tuple] = []  # (symbol, time, close[, open, high, low])
        src_of: dict[tuple[str, int, float], bytes | str] = {}
        ids = [entry_id for entry_id, _ in entries]
        offset = self._offset
        # entries come in ID order: only a batch that starts at or before the offset
        # (a replay) needs the per-entry check
        check = bool(entries) and parse_id(ids[0]) <= offset
        last = max(offset, parse_id(ids[-1])) if entries else offset
        known = self.engine.symbol_slots
        for entry_id, fields in entries:
            if check and parse_id(entry_id) <= offset:
                self.stats.skipped_old += 1
                continue
            bar = self._parse_bar(entry_id, fields)
            if bar is None:
                continue
            if bar[0] not in known:
                self.engine.add_symbol(bar[0])
            bars.append(bar)
            src_of.setdefault(bar[:3], entry_id)
        rejected_before = self.engine.rejections.copy()
        result = self._step(bars)
        rejected = self.engine.rejections - rejected_before
        self.stats.bars += len(bars) - rejected.total()
        self.stats.rejected.update(rejected)
        self._faults.hit("after_step")
        out = self._unwritten(result, src_of)
        self._write_until_done(out, ids)
        self._faults.hit("after_output")
        self._offset = last
        if self.publisher is not None and len(out[0]):
            self.publisher.publish(out[0])
        if self.snapshotter is not None:
            started = self.snapshotter.maybe_snapshot(
                len(result), source_offsets={self.source: self.offset}
            )
            if started:
                self._faults.hit("after_snapshot", before_kill=self.snapshotter.wait)
        else:
            self.engine.source_offsets[self.source] = self.offset
        return result

    def _step(self, bars: list[tuple]) -> StepResult:
        """``Engine.step(bars)`` through the array fast path: the bars are already parsed
        and typed, so only the fan-out to each symbol's slots is left (same update
        order, same results and rejection counting as ``Engine.step``)."""
        if not bars:
            return self.engine.step([])
        symbol_slots = self.engine.symbol_slots
        slot_lists = [symbol_slots[b[0]] for b in bars]
        counts = np.fromiter((a.shape[0] for a in slot_lists), np.int64, len(bars))
        slots = np.concatenate(slot_lists)
        # a bar fanned out to several streams is one input: rejected and counted once
        inputs = np.repeat(np.arange(len(bars)), counts)
        times = np.repeat(np.fromiter((b[1] for b in bars), np.int64, len(bars)), counts)
        closes = np.repeat(np.fromiter((b[2] for b in bars), np.float64, len(bars)), counts)
        if not self._ohlc:
            return self.engine.step_arrays(slots, times, closes, inputs)
        o, h, lo = (
            np.repeat(np.fromiter((b[k] for b in bars), np.float64, len(bars)), counts)
            for k in (3, 4, 5)
        )
        return self.engine.step_arrays(slots, times, closes, inputs, opens=o, highs=h, lows=lo)

    def _parse_bar(self, entry_id, fields) -> tuple | None:
        if isinstance(fields, list):  # msgpack path: [name, value, name, value, ...] of str
            if len(fields) == 6 and fields[0] == "symbol" and fields[2] == "time":
                raw_symbol, raw_time = fields[1], fields[3]
                raw_close = fields[5] if fields[4] == "close" else None
            else:
                found = dict(zip(fields[0::2], fields[1::2], strict=False))
                raw_symbol, raw_time = found.get("symbol"), found.get("time")
                raw_close = found.get("close")
        elif isinstance(fields, dict):  # redis-py path: {b"name": b"value"}
            raw_symbol, raw_time = fields.get(b"symbol"), fields.get(b"time")
            raw_close = fields.get(b"close")
        else:  # a deleted entry still in the pending list comes back without fields
            raw_symbol = raw_time = raw_close = None
        if raw_symbol is None or raw_time is None or raw_close is None:
            self._malformed(MALFORMED_MISSING_FIELD, entry_id, fields)
            return None
        if isinstance(raw_symbol, bytes):
            try:
                raw_symbol = raw_symbol.decode()
            except UnicodeDecodeError:
                raw_symbol = ""
        if not raw_symbol or not raw_symbol.isprintable():
            self._malformed(MALFORMED_SYMBOL, entry_id, fields)
            return None
        bar_time = parse_bar_time(raw_time, self.time_unit)
        if bar_time is None:
            self._malformed(MALFORMED_TIME, entry_id, fields)
            return None
        close = parse_close(raw_close)
        if close is None:
            self._malformed(MALFORMED_CLOSE, entry_id, fields)
            return None
        if not self._ohlc:
            return raw_symbol, bar_time, close
        raw = _raw_prices(fields)
        if any(v is None for v in raw):
            self._malformed(MISSING_OHLC, entry_id, fields)
            return None
        prices = [parse_close(v) for v in raw]
        if any(p is None for p in prices):
            self._malformed(BAD_OHLC, entry_id, fields)
            return None
        return (raw_symbol, bar_time, close, *prices)

    def _malformed(self, reason: str, entry_id: bytes | str, fields: Any) -> None:
        """Count an entry that is not a bar; log the first one of each reason."""
        self.stats.malformed[reason] += 1
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning(
                "skipping malformed stream entry %s (%s): %r (further ones are only counted)",
                entry_id.decode(errors="replace") if isinstance(entry_id, bytes) else entry_id,
                reason,
                fields,
            )

    def _unwritten(self, result: StepResult, src_of) -> tuple[StepResult, list[bytes]]:
        """The rows of ``result`` not yet in the output (see the output mark), with the
        input entry ID of each."""
        n = len(result)
        keys_by_slot = result._keys_by_slot
        symbols = [keys_by_slot[s].symbol for s in result.slots.tolist()]
        times, closes = result.times.tolist(), result.closes.tolist()
        srcs = [src_of[bar] for bar in zip(symbols, times, closes, strict=True)]
        if self.output_mark is None or n == 0:
            return result, srcs
        keep = np.array([parse_id(s) > self.output_mark for s in srcs], dtype=bool)
        if keep.all():
            self.output_mark = None  # past the mark: nothing more to suppress
            return result, srcs
        self.stats.rows_suppressed += int((~keep).sum())
        rows = np.flatnonzero(keep)
        subset = result.take(rows)
        return subset, [srcs[i] for i in rows.tolist()]

    def _write_until_done(self, out: tuple[StepResult, list[bytes]], ids: list[bytes]) -> None:
        """Write the batch's outputs and acknowledge ``ids``, retried through Redis outages.
        The script is atomic, so after a failure either the whole batch is in the output
        streams (its reply was lost) or none of it; the signal stream's last ``src`` tells
        which, and the script is sent again only once that was read."""
        result, srcs = out
        if self.output is None:
            command = pack_command([b"XACK", self.input_stream, self.group, *ids]) if ids else None
            counts = (len(result), 0, 0)
        else:
            command, counts = self.output.command(result, srcs, ids)
        retry = self.backoff.schedule()
        unsure = False  # a send failed: the script may have run, its reply lost
        while command is not None:
            try:
                if unsure:
                    if self._batch_written(srcs):
                        self.client.xack(self.input_stream, self.group, *ids)
                        break
                    unsure = False
                unsure = True
                send_packed(self.client, [command])
                break
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if self._stop:
                    raise
                self._connection_error(exc, retry)
        self.stats.rows_out += len(result)
        self.stats.trades_out += counts[1]
        self.stats.positions_out += counts[2]

    def _batch_written(self, srcs: list[bytes]) -> bool:
        if not srcs:
            return False
        mark = self._last_output_src()
        return mark is not None and mark >= max(parse_id(s) for s in srcs)

    def _last_output_src(self) -> tuple[int, int] | None:
        """The output mark (``OutputStreams.last_src``); None without an output stream."""
        return None if self.output is None else self.output.last_src(self.client)


def _group_entries(reply: object) -> list[Any]:
    """The ``(id, fields)`` entries of the one stream in an XREADGROUP reply: redis-py's
    RESP2 shape ``[[key, entries]]``, or nothing."""
    if not reply:
        return []
    if not isinstance(reply, list):
        raise TypeError(
            f"XREADGROUP replied with a {type(reply).__name__}: the runner needs a client "
            "speaking RESP2 (redis-py's default, protocol=2)"
        )
    return list(reply[0][1])
