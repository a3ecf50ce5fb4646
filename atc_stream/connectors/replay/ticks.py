"""Ticks -> time bars: trades aggregated into OHLCV bars per symbol and interval.

The bar rules (interval starts, order within a bar, the empty-interval policies):
docs/design/replay.md.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from atc_stream.core.intervals import interval_ms as _interval_ms
from atc_stream.io.readers import BarTable
from atc_stream.io.tick_reader import TickTable

EMPTY_POLICIES = ("skip", "carry")


@dataclass
class TickBars:
    """OHLCV bars, sorted by symbol then time; ``names[codes[i]]`` is bar ``i``'s symbol."""

    codes: np.ndarray  # int64
    names: list[str]
    times: np.ndarray  # int64, interval start (ms)
    open: np.ndarray
    high: np.ndarray
    low: np.ndarray
    close: np.ndarray
    volume: np.ndarray
    trades: np.ndarray  # int64
    interval_ms: int
    rejected: Counter = field(default_factory=Counter)

    def __len__(self) -> int:
        return self.times.shape[0]

    @property
    def symbols(self) -> np.ndarray:
        return np.asarray(self.names, dtype=object)[self.codes]

    def to_bar_table(self) -> BarTable:
        """The bars as a ``BarTable`` in time-major order (as a live feed delivers them)."""
        order = self._time_major()
        return BarTable(
            symbols=np.asarray(self.names, dtype=object)[self.codes[order]],
            times=self.times[order],
            closes=self.close[order],
        )

    def time_major_ohlc(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(opens, highs, lows)`` of the bars in the order of ``to_bar_table``."""
        order = self._time_major()
        return self.open[order], self.high[order], self.low[order]

    def _time_major(self) -> np.ndarray:
        return np.lexsort((self.codes, self.times))


def _sort_order(
    times: np.ndarray, codes: np.ndarray, n_names: int, sub_ms: np.ndarray | None = None
) -> np.ndarray | None:
    """Stable order by (symbol, time, ns within the ms); ``None`` when already in it."""
    n = times.shape[0]
    if n < 2:
        return None
    if sub_ms is not None and sub_ms.any():
        order = np.lexsort((sub_ms, times, codes))
        return None if (order == np.arange(n)).all() else order
    code_step = np.diff(codes)
    if (code_step >= 0).all() and ((code_step > 0) | (np.diff(times) >= 0)).all():
        return None
    if (np.diff(times) >= 0).all():  # time-sorted feed: one stable (radix) sort by symbol
        small = np.uint16 if n_names <= 1 << 16 else np.int64
        return np.argsort(codes.astype(small), kind="stable")
    t0 = int(times.min())
    span = int(times.max()) - t0 + 1
    if n_names * span < (1 << 62):
        key = codes * span + (times - t0)
        return np.argsort(key, kind="stable")
    return np.lexsort((times, codes))


def aggregate_ticks(
    ticks: TickTable, interval: str | int, *, empty: str = "skip", origin: int = 0
) -> TickBars:
    """Aggregate trades into OHLCV bars of ``interval`` (a label like ``1m`` or ms).

    See the module docstring for the bar rules and the ``empty`` policy
    (``"skip"`` or ``"carry"``). ``origin`` (ms) aligns the intervals.
    """
    if isinstance(interval, str):
        ims = _interval_ms(interval)
    elif isinstance(interval, (int, np.integer)) and not isinstance(interval, bool):
        ims = int(interval)
    else:
        raise ValueError(f"interval must be a label like '1m' or ms, got {interval!r}")
    if ims <= 0:
        raise ValueError(f"interval must be > 0 ms, got {ims}")
    if empty not in EMPTY_POLICIES:
        raise ValueError(f"empty must be one of {EMPTY_POLICIES}, got {empty!r}")
    times, codes, prices, sizes = ticks.times, ticks.codes, ticks.prices, ticks.sizes
    n = times.shape[0]
    if n == 0:
        z = np.zeros(0, np.int64)
        f = np.zeros(0, np.float64)
        return TickBars(z, list(ticks.names), z, f, f, f, f, f, z, ims, Counter(ticks.rejected))
    order = _sort_order(times, codes, len(ticks.names), ticks.sub_ms)
    if order is not None:
        times, codes, prices, sizes = times[order], codes[order], prices[order], sizes[order]
    bucket = (times - origin) // ims
    new = np.empty(n, bool)
    new[0] = True
    np.not_equal(bucket[1:], bucket[:-1], out=new[1:])
    new[1:] |= codes[1:] != codes[:-1]
    starts = np.flatnonzero(new)
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:] - 1
    ends[-1] = n - 1
    bar_codes = codes[starts]
    bar_buckets = bucket[starts]
    bars = dict(
        open=prices[starts],
        high=np.maximum.reduceat(prices, starts),
        low=np.minimum.reduceat(prices, starts),
        close=prices[ends],
        volume=np.add.reduceat(sizes, starts),
        trades=(ends - starts + 1).astype(np.int64),
    )
    if empty == "carry":
        bar_codes, bar_buckets, bars = _carry(bar_codes, bar_buckets, bars)
    return TickBars(
        codes=bar_codes,
        names=list(ticks.names),
        times=origin + bar_buckets * ims,
        interval_ms=ims,
        rejected=Counter(ticks.rejected),
        **bars,
    )


def _carry(codes: np.ndarray, buckets: np.ndarray, bars: dict):
    """Fill each symbol's empty intervals between its first and last bar (see module doc)."""
    m = codes.shape[0]
    first = np.empty(m, bool)
    first[0] = True
    first[1:] = codes[1:] != codes[:-1]
    group = np.cumsum(first) - 1
    group_start = np.flatnonzero(first)
    first_bucket = buckets[group_start][group]
    last_bucket = np.maximum.reduceat(buckets, group_start)
    span = last_bucket - buckets[group_start] + 1
    offsets = np.concatenate([[0], np.cumsum(span)])
    total = int(offsets[-1])
    if total == m:
        return codes, buckets, bars
    pos = offsets[group] + (buckets - first_bucket)
    present = np.zeros(total, bool)
    present[pos] = True
    source_bar = np.zeros(total, np.int64)
    source_bar[pos] = np.arange(m)
    source_bar = np.maximum.accumulate(np.where(present, source_bar, 0))
    out_group = np.repeat(np.arange(group_start.shape[0]), span)
    out_codes = codes[group_start][out_group]
    out_buckets = buckets[group_start][out_group] + (np.arange(total) - offsets[out_group])
    carried_close = bars["close"][source_bar]
    out = {}
    for name in ("open", "high", "low", "close"):
        out[name] = np.where(present, bars[name][source_bar], carried_close)
    out["volume"] = np.where(present, bars["volume"][source_bar], 0.0)
    out["trades"] = np.where(present, bars["trades"][source_bar], 0)
    return out_codes, out_buckets, out
