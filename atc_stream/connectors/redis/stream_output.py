"""The output streams of a Redis Streams run: a batch's signal, trade and position entries
and its input acknowledgement in one atomic Lua script, the output mark, reading them back.

The entries and the exactly-once argument: docs/design/redis-streams.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import redis

from atc_stream.connectors.redis.resp import pack_command
from atc_stream.core.messages import (
    position_records_from_result,
    records_from_result,
    trade_records_from_result,
)
from atc_stream.core.results import StepResult

#: Largest number of IDs one XACK call in the Lua script acknowledges.
_ACK_CHUNK = 512

# KEYS: signal, trade and position output streams, input stream[, mark key].
# ARGV: maxlen, group, the entry counts of the three output streams (n1, n2, n3)[, the
# batch's mark], then n1 + n2 + n3 x (src, key, time, data) in that order, then the input
# IDs to ack. With a mark key, a batch that writes signals sets it.
_OUTPUT_SCRIPT_TEMPLATE = """
local maxlen = ARGV[1]
local i = 6
if %s == 1 then
  if tonumber(ARGV[3]) > 0 then redis.call('SET', KEYS[5], ARGV[6]) end
  i = 7
end
for s = 1, 3 do
  for r = 1, tonumber(ARGV[2 + s]) do
    redis.call('XADD', KEYS[s], 'MAXLEN', '~', maxlen, '*',
               'src', ARGV[i], 'key', ARGV[i + 1], 'time', ARGV[i + 2], 'data', ARGV[i + 3])
    i = i + 4
  end
end
local acked = 0
while i <= #ARGV do
  local last = math.min(i + %d - 1, #ARGV)
  acked = acked + redis.call('XACK', KEYS[4], ARGV[2], unpack(ARGV, i, last))
  i = last + 1
end
return acked
"""
_OUTPUT_SCRIPT = (_OUTPUT_SCRIPT_TEMPLATE % (0, _ACK_CHUNK)).encode()
_OUTPUT_SCRIPT_MARKED = (_OUTPUT_SCRIPT_TEMPLATE % (1, _ACK_CHUNK)).encode()

#: The error a fenced script returns when the lease key no longer holds the writer's token.
FENCE_ERROR = "ATC_LEASE_LOST"


def _fenced(script: bytes, key_index: int, token: str) -> bytes:
    """``script`` preceded by a check that ``KEYS[key_index]`` (the lease) still holds
    ``token``: a writer that lost its lease between its last check and this script
    writes nothing (the token, from ``lease.Lease``, sits in a Lua long string)."""
    level = "=" * 4
    while f"]{level}]" in token:
        level += "="
    check = (
        f"if redis.call('GET', KEYS[{key_index}]) ~= [{level}[{token}]{level}] then\n"
        f"  return redis.error_reply('{FENCE_ERROR} the lease is no longer this process\\'s')\n"
        "end\n"
    )
    return check.encode() + script


def parse_id(value: bytes | str) -> tuple[int, int]:
    """A stream entry ID ``"<ms>-<seq>"`` as a comparable pair."""
    text = value.decode() if isinstance(value, bytes) else str(value)
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def format_id(value: tuple[int, int]) -> str:
    return f"{value[0]}-{value[1]}"


def output_keys(output_stream: str) -> tuple[str, str, str]:
    """The signal, trade and position output streams of ``--output-stream KEY``: ``KEY``,
    ``KEY:trades``, ``KEY:positions``."""
    return output_stream, f"{output_stream}:trades", f"{output_stream}:positions"


class OutputStreams:
    """Where a run's outputs go: the signal stream (one entry per row, the one that defines
    the output mark), the trade stream (one per closed trade) and the position stream
    (one per row and strategy), all trimmed with ``MAXLEN ~ maxlen``.

    >>> outputs = OutputStreams("signals", "bars", "atc", maxlen=1_000_000)
    >>> command, counts = outputs.command(result, srcs, ids)   # one EVAL, all or nothing
    >>> outputs.last_src(client)                              # the output mark

    ``mark_key``: where the output mark is kept when several inputs share the output
    streams (one per shard of a cluster): the script sets it to the batch's last ``src``
    with the entries, and ``last_src`` reads it. None: the signal stream's last ``src``.
    """

    def __init__(
        self,
        output_stream: str,
        input_stream: str,
        group: str,
        maxlen: int,
        mark_key: str | None = None,
    ) -> None:
        self.signals, self.trades, self.positions = output_keys(output_stream)
        self.mark_key = mark_key
        self.input_stream = input_stream
        self.group = group
        self.maxlen = maxlen
        self._encode = msgspec.json.Encoder().encode
        #: ``(lease key, token)``: the script writes only while the key holds the token
        #: (set by a runner that holds a lease, ``lease.LeasedStreamRunner``)
        self.fence: tuple[str, str] | None = None
        self._fenced_scripts: dict[tuple[bytes, int, str], bytes] = {}

    def command(
        self, result: StepResult, srcs: Sequence[bytes | str], ids: Sequence[bytes | str]
    ) -> tuple[bytes, tuple[int, int, int]]:
        """The packed EVAL that appends the rows of ``result`` (``srcs``: the input entry ID
        of each row), their trades and their positions, and acknowledges ``ids``; and how
        many signal, trade and position entries it appends."""
        encode = self._encode
        signals: list[Any] = []
        for record, src in zip(records_from_result(result), srcs, strict=True):
            signals += (src, record.key, record.time, encode(record))
        trades: list[Any] = []
        positions: list[Any] = []
        strategy = result.strategy
        if strategy is not None and len(result):
            # trades and positions come rows first: repeat each row's src for them
            per_row = strategy.n_closed.sum(axis=1).tolist()
            trade_srcs = [src for src, n in zip(srcs, per_row, strict=True) for _ in range(n)]
            for trade, src in zip(trade_records_from_result(result), trade_srcs, strict=True):
                trades += (src, trade.key, trade.exit_time, encode(trade))
            n_strategies = strategy.side.shape[1]
            position_srcs = [src for src in srcs for _ in range(n_strategies)]
            for position, src in zip(
                position_records_from_result(result), position_srcs, strict=True
            ):
                positions += (src, position.key, position.time, encode(position))
        counts = (len(signals) // 4, len(trades) // 4, len(positions) // 4)
        keys: list[Any] = [self.signals, self.trades, self.positions, self.input_stream]
        script, mark = _OUTPUT_SCRIPT, []
        if self.mark_key is not None:
            script = _OUTPUT_SCRIPT_MARKED
            keys.append(self.mark_key)
            mark = [max(srcs, key=parse_id) if len(srcs) else b"0-0"]
        if self.fence is not None:
            lease_key, token = self.fence
            keys.append(lease_key)
            cache = (script, len(keys), token)
            fenced = self._fenced_scripts.get(cache)
            if fenced is None:
                fenced = self._fenced_scripts[cache] = _fenced(script, len(keys), token)
            script = fenced
        args = [
            b"EVAL", script, len(keys), *keys, self.maxlen, self.group, *counts, *mark,
            *signals, *trades, *positions, *ids,
        ]  # fmt: skip
        return pack_command(args), counts

    def last_src(self, client: redis.Redis) -> tuple[int, int] | None:
        """The ``src`` of the signal stream's last entry (the output mark); None without one.

        The script writes a batch's three kinds of entries together, so the signal
        stream's mark says which batches the trade and position streams hold too."""
        if self.mark_key is not None:
            mark = client.get(self.mark_key)
            return None if mark is None else parse_id(mark)
        last = client.xrevrange(self.signals, "+", "-", count=1)
        fields = last[0][1] if last else None
        src = fields.get(b"src") if fields else None
        return None if src is None else parse_id(src)


def read_outputs(
    client: redis.Redis, output_stream: str, *, count: int = 10_000
) -> list[dict[str, Any]]:
    """Every entry of an output stream (signals, ``KEY:trades`` or ``KEY:positions``) as
    ``{"id", "src", "key", "time", "record"}`` (``record``: the decoded JSON record as a
    dict: a SignalRecord with the columns the engine was asked for, a TradeRecord or a
    PositionRecord), oldest first."""
    decoder = msgspec.json.Decoder()
    out: list[dict[str, Any]] = []
    start = "-"
    while True:
        chunk = client.xrange(output_stream, start, "+", count=count)
        if not chunk:
            return out
        for entry_id, fields in chunk:
            # only pending-list reads return IDs or fields of deleted entries as None
            assert entry_id is not None and fields is not None
            out.append(
                {
                    "id": _text(entry_id),
                    "src": _text(fields[b"src"]),
                    "key": _text(fields[b"key"]),
                    "time": int(fields[b"time"]),
                    "record": decoder.decode(fields[b"data"]),
                }
            )
        start = "(" + out[-1]["id"]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
