"""Ticks → time bars: trades (time, symbol, price, size) aggregated into OHLCV bars.

``load_ticks`` reads a CSV or Parquet trade file (or a directory of per-symbol files,
symbol = file stem) into a ``TickTable``; ``aggregate_ticks`` turns it into
``TickBars`` (open, high, low, close, volume, trade count per symbol and interval),
vectorised with NumPy (one sort, then ``reduceat``); ``TickBars.to_bar_table()`` gives
the ``BarTable`` that ``BarPlayer`` feeds through the engine.

Bar rules
---------
- A bar's time is the **start** of its interval: ``origin + k * interval`` (ms), with
  ``origin = 0`` (the Unix epoch) by default, so ``1m`` bars start on whole minutes.
  A trade at time ``t`` belongs to the bar with ``start <= t < start + interval``.
- Within a bar, trades are ordered by time and, for equal times, by file order:
  ``open`` is the first trade's price, ``close`` the last one's, ``high``/``low`` the
  extremes, ``volume`` the sum of sizes, ``trades`` the count.
- Empty intervals (no trade of that symbol): ``empty="skip"`` (default) makes no bar,
  so the stream simply has no bar at that time; ``empty="carry"`` makes a bar with
  open = high = low = close = the previous bar's close, volume 0 and 0 trades. Carry
  only fills gaps *between* a symbol's first and last trade: there are never bars
  before a symbol's first trade or after its last one.
- Bad ticks are dropped and counted in ``rejected`` by reason: ``bad_time`` (not an
  integer / parsable timestamp), ``bad_price`` (not a finite number > 0) and
  ``bad_size`` (not a finite number >= 0), ``bad_symbol`` (empty symbol cell).
"""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..intervals import interval_ms as _interval_ms
from .player import BarTable, require_columns

DEFAULT_TICK_TIME_COLUMN = "time"
DEFAULT_TICK_SYMBOL_COLUMN = "symbol"
DEFAULT_PRICE_COLUMN = "price"
DEFAULT_SIZE_COLUMN = "size"
EMPTY_POLICIES = ("skip", "carry")
TICK_SUFFIXES = (".csv", ".parquet")


@dataclass
class TickTable:
    """Trades: ``names[codes[i]]`` traded ``sizes[i]`` at ``prices[i]`` at ``times[i]`` (ms)."""

    times: np.ndarray  # int64
    codes: np.ndarray  # int64 index into names
    names: list[str]
    prices: np.ndarray  # float64
    sizes: np.ndarray  # float64
    rejected: Counter = field(default_factory=Counter)

    def __len__(self) -> int:
        return self.times.shape[0]

    @property
    def symbols(self) -> np.ndarray:
        """Symbol of each trade (object array; built on demand)."""
        return np.asarray(self.names, dtype=object)[self.codes]


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
        order = np.lexsort((self.codes, self.times))
        return BarTable(
            symbols=np.asarray(self.names, dtype=object)[self.codes[order]],
            times=self.times[order],
            closes=self.close[order],
        )


def _encode_symbols(values) -> tuple[np.ndarray, list[str]]:
    """Symbol strings → (int64 codes, sorted unique names)."""
    items = values.tolist() if isinstance(values, np.ndarray) else list(values)
    index: dict = {}
    codes = np.fromiter(
        (index.setdefault(v, len(index)) for v in items), np.int64, count=len(items)
    )
    seen = [str(v) for v in index]
    if len(set(seen)) != len(seen):  # distinct objects with one text (e.g. 1 and "1")
        return _encode_symbols([str(v) for v in items])
    order = np.argsort(np.array(seen, dtype=str), kind="stable")
    rank = np.empty(len(seen), np.int64)
    rank[order] = np.arange(len(seen))
    return rank[codes], [seen[i] for i in order]


def ticks_from_arrays(times, symbols, prices, sizes) -> TickTable:
    """A ``TickTable`` from array-likes; ``symbols`` may be one str for all rows."""
    times = np.asarray(times)
    n = times.shape[0]
    if isinstance(symbols, str):
        codes, names = np.zeros(n, np.int64), [symbols]
    else:
        codes, names = _encode_symbols(symbols)
    return _make_table(times, codes, names, np.asarray(prices), np.asarray(sizes), Counter())


def _to_float(values: np.ndarray) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        out = np.empty(len(values), np.float64)
        for i, v in enumerate(values):
            try:
                out[i] = float(v)
            except (TypeError, ValueError):
                out[i] = np.nan
        return out


def _to_times(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int64 ms times, valid mask): integers as they are, ISO-8601 / datetimes → ms."""
    if values.dtype.kind in "iu":
        return values.astype(np.int64), np.ones(values.shape[0], bool)
    if values.dtype.kind == "M":
        valid = ~np.isnat(values)
        return values.astype("datetime64[ms]").astype(np.int64), valid
    if values.dtype.kind == "f":
        valid = np.isfinite(values) & (values == np.round(values))
        return np.where(valid, values, 0).astype(np.int64), valid
    out = np.zeros(values.shape[0], np.int64)
    valid = np.zeros(values.shape[0], bool)
    for i, v in enumerate(values.tolist()):
        text = str(v).strip()
        try:
            out[i] = int(text)
            valid[i] = True
            continue
        except ValueError:
            pass
        try:
            out[i] = np.datetime64(text.rstrip("Z"), "ms").astype(np.int64)
            valid[i] = True
        except ValueError:
            pass
    return out, valid


def _make_table(times, codes, names, prices, sizes, rejected: Counter) -> TickTable:
    n = times.shape[0]
    if not (codes.shape[0] == prices.shape[0] == sizes.shape[0] == n):
        raise ValueError(
            "times, symbols, prices and sizes must have one length, got "
            f"{n}, {codes.shape[0]}, {prices.shape[0]}, {sizes.shape[0]}"
        )
    times, time_ok = _to_times(times)
    prices = _to_float(prices)
    sizes = _to_float(sizes)
    names = list(names)
    symbol_ok = np.ones(n, bool)
    if "" in names:  # empty / missing symbol cells
        blank = names.index("")
        symbol_ok = codes != blank
        names.pop(blank)
        codes = codes - (codes > blank)
    price_ok = np.isfinite(prices) & (prices > 0)
    size_ok = np.isfinite(sizes) & (sizes >= 0)
    ok = symbol_ok & time_ok & price_ok & size_ok
    if not ok.all():
        rejected["bad_symbol"] += int((~symbol_ok).sum())
        rejected["bad_time"] += int((symbol_ok & ~time_ok).sum())
        rejected["bad_price"] += int((symbol_ok & time_ok & ~price_ok).sum())
        rejected["bad_size"] += int((symbol_ok & time_ok & price_ok & ~size_ok).sum())
        times, codes, prices, sizes = times[ok], codes[ok], prices[ok], sizes[ok]
    return TickTable(times, codes.astype(np.int64), names, prices, sizes, rejected)


def load_ticks(
    path: str | Path,
    *,
    time_column: str = DEFAULT_TICK_TIME_COLUMN,
    symbol_column: str = DEFAULT_TICK_SYMBOL_COLUMN,
    price_column: str = DEFAULT_PRICE_COLUMN,
    size_column: str = DEFAULT_SIZE_COLUMN,
    symbol: str | None = None,
) -> TickTable:
    """Read trades from a CSV/Parquet file, or a directory of them (one per symbol).

    A file without a symbol column holds one symbol: ``symbol`` or the file's stem.
    In a directory, every ``*.csv``/``*.parquet`` file is read that way (symbol = stem
    unless the file has a symbol column). Times: integer ms or ISO-8601.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"tick file {str(path)!r} does not exist")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in TICK_SUFFIXES and p.is_file())
        if not files:
            raise ValueError(f"tick directory {str(path)!r} has no .csv or .parquet files")
        parts = [
            load_ticks(
                f,
                time_column=time_column,
                symbol_column=symbol_column,
                price_column=price_column,
                size_column=size_column,
            )
            for f in files
        ]
        return concat_ticks(parts)
    columns = _read_tick_columns(path, symbol_column)
    require_columns(
        path, columns, {"time": time_column, "price": price_column, "size": size_column}
    )
    n = len(columns[time_column])
    if symbol_column in columns:
        sym = columns[symbol_column]
        if isinstance(sym, tuple):  # (codes, names) from a dictionary-encoded column
            codes, names = sym
        else:
            codes, names = _encode_symbols(sym)
    else:
        codes, names = np.zeros(n, np.int64), [symbol or path.stem]
    return _make_table(
        np.asarray(columns[time_column]),
        codes,
        names,
        np.asarray(columns[price_column]),
        np.asarray(columns[size_column]),
        Counter(),
    )


def _read_tick_columns(path: Path, symbol_column: str) -> dict:
    """Columns as NumPy arrays (the symbol column as ``(codes, names)`` when Arrow is used)."""
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
    except ImportError:  # CSV without the parquet extra
        if path.suffix == ".parquet":
            raise ValueError(
                "reading Parquet needs pyarrow (pip install atc-stream[parquet])"
            ) from None
        return _read_csv_plain(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
    else:
        import pyarrow.csv as pacsv

        try:
            table = pacsv.read_csv(path)
        except pa.ArrowInvalid as exc:
            if "Empty CSV file" in str(exc):
                raise ValueError(f"{path.name}: empty file") from exc
            return _read_csv_plain(path)
    out: dict = {}
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        if name == symbol_column:
            if pa.types.is_dictionary(col.type):
                col = col.cast(col.type.value_type)
            enc = pc.dictionary_encode(col.cast(pa.string()).fill_null(""))
            names = [str(x) for x in enc.dictionary.to_pylist()]
            codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
            order = np.argsort(np.array(names, dtype=str), kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(order.shape[0])
            out[name] = (rank[codes], [names[i] for i in order])
        elif pa.types.is_timestamp(col.type):
            out[name] = col.cast(pa.timestamp("ms")).to_numpy(zero_copy_only=False)
        elif pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
            if col.null_count:
                col = col.cast(pa.float64()).fill_null(float("nan"))
            out[name] = col.to_numpy(zero_copy_only=False)
        else:
            out[name] = np.asarray(col.to_pylist(), dtype=object)
    return out


def _read_csv_plain(path: Path) -> dict:
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path.name}: empty file")
        rows = list(reader)
    return {
        name: np.array([row[j] if j < len(row) else "" for row in rows], dtype=object)
        for j, name in enumerate(header)
    }


def concat_ticks(parts: list[TickTable]) -> TickTable:
    """One table from several (symbol codes are merged by name)."""
    names = sorted({n for p in parts for n in p.names})
    index = {n: i for i, n in enumerate(names)}
    codes = [np.array([index[n] for n in p.names], np.int64)[p.codes] for p in parts]
    rejected: Counter = Counter()
    for p in parts:
        rejected.update(p.rejected)
    return TickTable(
        times=np.concatenate([p.times for p in parts]) if parts else np.zeros(0, np.int64),
        codes=np.concatenate(codes) if parts else np.zeros(0, np.int64),
        names=names,
        prices=np.concatenate([p.prices for p in parts]) if parts else np.zeros(0),
        sizes=np.concatenate([p.sizes for p in parts]) if parts else np.zeros(0),
        rejected=rejected,
    )


def _sort_order(times: np.ndarray, codes: np.ndarray, n_names: int) -> np.ndarray | None:
    """Stable order by (symbol, time); ``None`` when already in that order."""
    n = times.shape[0]
    if n < 2:
        return None
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
    order = _sort_order(times, codes, len(ticks.names))
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
