"""The bar interval of Redis Streams of bars, from the spacing of the entries they hold.

Entries carry a symbol, a time and prices but no interval, so ``run-stream`` and
``cluster`` label their rows with the most common gap between the bars of a symbol among
the first entries, as ``replay`` does for a file (``core.spacing``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import redis

from atc_stream.connectors.redis.stream_output import format_id, parse_id
from atc_stream.connectors.redis.streams import parse_bar_time
from atc_stream.core.spacing import interval_of

#: Entries read from the start of the stream to infer the interval (about 100 B each).
SAMPLE_ENTRIES = 100_000
#: Entries per XRANGE call: one reply stays small however long the stream is.
PAGE_ENTRIES = 10_000


def stream_interval(
    client: redis.Redis,
    input_stream: str,
    *,
    time_unit: str | None = None,
    sample: int = SAMPLE_ENTRIES,
    page: int = PAGE_ENTRIES,
) -> str | None:
    """The interval label of the bars in the first ``sample`` entries of
    ``input_stream`` (their most common gap within a symbol), or None when no symbol has
    two bars there (an empty or new stream). Entries without a symbol or a readable
    ``time`` (in ``time_unit``, as ``parse_bar_time`` reads them) are left out: the run
    counts them as malformed when it reads them."""
    return streams_interval(client, [input_stream], time_unit=time_unit, sample=sample, page=page)


def streams_interval(
    client: redis.Redis,
    streams: Sequence[str],
    *,
    time_unit: str | None = None,
    sample: int = SAMPLE_ENTRIES,
    page: int = PAGE_ENTRIES,
) -> str | None:
    """``stream_interval`` of the bars in the first ``sample`` entries of ``streams``,
    read in order, each from its start (a cluster's shard streams, each holding the bars
    of its own symbols): the streams after the one that fills the sample are not read."""
    codes: dict[bytes, int] = {}
    symbols: list[int] = []
    times: list[int] = []
    read = 0
    for stream in streams:
        start = "-"
        while read < sample:
            entries = client.xrange(stream, min=start, max="+", count=min(page, sample - read))
            if not entries:
                break
            for _, fields in entries:
                bar = _symbol_and_time(fields, time_unit)
                if bar is not None:
                    symbols.append(codes.setdefault(bar[0], len(codes)))
                    times.append(bar[1])
            read += len(entries)
            # the ID after the last one read ("(ID", an exclusive range, needs Redis 6.2)
            last_id: Any = entries[-1][0]  # bytes: the client does not decode replies
            ms, seq = parse_id(last_id)
            start = format_id((ms, seq + 1))
    return interval_of(np.array(symbols, np.int64), np.array(times, np.int64))


def _symbol_and_time(fields: Any, time_unit: str | None) -> tuple[bytes, int] | None:
    if not isinstance(fields, dict):
        return None
    symbol, raw_time = fields.get(b"symbol"), fields.get(b"time")
    if not symbol or raw_time is None:
        return None
    bar_time = parse_bar_time(raw_time, time_unit)
    return None if bar_time is None else (symbol, bar_time)
