"""OHLC bar files (CSV/Parquet, many symbols) read whole, sorted by symbol and time.

The rows are those of ``io.readers.iter_bar_batches`` with open, high and low (its cell
rules, bad-row policy and ``bad_ohlc`` rule: docs/design/input-files.md); a row that
repeats a symbol's time is left out too and counted with its ``file:line``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa

from atc_stream.io.readers import (
    PRICE_NAMES,
    BadRows,
    SymbolCodes,
    epoch_unit,
    input_files,
    iter_bar_batches,
    row_where,
)

#: The price columns of a bar, in order.
PRICES = (*PRICE_NAMES, "close")
_HINT = "an OHLC bar file has the columns symbol, time, open, high, low, close"


@dataclass
class OhlcTable:
    """Bars sorted by symbol, then time: ``symbols[i]``'s bar at ``times[i]`` (epoch ms)."""

    symbols: np.ndarray  # object array of str
    times: np.ndarray  # int64
    open: np.ndarray  # float64
    high: np.ndarray
    low: np.ndarray
    close: np.ndarray
    bad_rows: BadRows = field(default_factory=BadRows)

    def __len__(self) -> int:
        return self.times.shape[0]

    @cached_property
    def starts(self) -> np.ndarray:
        """Where each symbol's bars start, in name order, and the number of rows last:
        symbol ``k``'s bars are rows ``starts[k]:starts[k + 1]``. Found from the changes
        of name (the rows are sorted by symbol): a sort or a set of every row's name takes
        seconds at 10 M bars."""
        symbols = self.symbols
        changes = np.flatnonzero(symbols[1:] != symbols[:-1]) + 1
        return np.r_[0, changes, symbols.shape[0]] if symbols.shape[0] else np.zeros(1, np.int64)

    @cached_property
    def symbol_names(self) -> list[str]:
        """The symbols, in name order (the rows' order)."""
        return self.symbols[self.starts[:-1]].tolist()

    @property
    def codes(self) -> np.ndarray:
        """int64 ``codes[i]``: the position of row ``i``'s symbol in ``symbol_names``."""
        return np.repeat(np.arange(len(self.starts) - 1), np.diff(self.starts))

    def of_symbols(self, names: Iterable[str]) -> OhlcTable:
        """The bars of ``names``, which must be symbols of the table, in name order: a view
        when they are neighbours in name order (a sweep's chunks), no pass over the rows."""
        position = {name: k for k, name in enumerate(self.symbol_names)}
        ks = sorted(position[name] for name in names)
        starts = self.starts
        if not ks:
            return self.take(slice(0, 0))
        if ks[-1] - ks[0] == len(ks) - 1:
            return self.take(slice(int(starts[ks[0]]), int(starts[ks[-1] + 1])))
        return self.take(np.concatenate([np.arange(starts[k], starts[k + 1]) for k in ks]))

    def take(self, rows: np.ndarray | slice) -> OhlcTable:
        """The bars at positions ``rows`` (a mask, indexes or a slice), same bad-row report."""
        return OhlcTable(
            self.symbols[rows], self.times[rows], self.open[rows], self.high[rows],
            self.low[rows], self.close[rows], self.bad_rows,
        )  # fmt: skip

    def to_arrow(self) -> pa.Table:
        """The long frame ``atc_stream.backtest`` takes."""
        return pa.table(
            {"symbol": pa.array(self.symbols.tolist(), pa.string()), "time": self.times,
             "open": self.open, "high": self.high, "low": self.low, "close": self.close}
        )  # fmt: skip


def read_ohlc(
    path: str | Path,
    *,
    time_unit: str = "auto",
    bad: BadRows | None = None,
    symbol: str | None = None,
    on_rows: Callable[[int], object] | None = None,
) -> OhlcTable:
    """An ``OhlcTable`` of a CSV/Parquet file or a directory of them (a file without a
    ``symbol`` column is the symbol ``symbol``, else of its stem; a directory's files
    always their stems). ``on_rows(n)`` is told of each batch of good rows read (a
    progress bar). ``InputError`` for an unreadable file."""
    epoch_unit(time_unit)
    path = Path(path)
    bad = bad if bad is not None else BadRows()
    codes = SymbolCodes()
    # one list of batches a column: code, time, open, high, low, close, line, file number
    parts: list[list[np.ndarray]] = [[] for _ in range(8)]
    files = input_files(path)
    for number, f in enumerate(files):
        batches = iter_bar_batches(
            f, symbol=None if path.is_dir() else symbol, time_unit=time_unit, bad=bad,
            symbols=codes, ohlc_columns=PRICE_NAMES, hint=_HINT,
        )  # fmt: skip
        for b in batches:
            assert b.ohlc is not None  # read with open, high and low
            columns = (b.codes, b.times, *b.ohlc, b.closes, b.lines,
                       np.full(len(b), number, np.int32))  # fmt: skip
            for column, values in zip(parts, columns, strict=True):
                column.append(values)
            if on_rows is not None:
                on_rows(len(b))
    names = codes.names
    by_name = np.argsort(names.astype(str), kind="stable")  # the codes in name order
    rank = np.empty(len(names), np.int64)
    rank[by_name] = np.arange(len(names))  # each code's place in name order
    key = rank[_joined(parts[0], np.int32)]  # each row's symbol, as its place in name order
    times = _joined(parts[1], np.int64)
    # files are usually written by symbol and time already: then no sort and no copies
    ordered = key.size < 2 or bool(
        np.all((key[1:] > key[:-1]) | ((key[1:] == key[:-1]) & (times[1:] >= times[:-1])))
    )
    order = None if ordered else np.lexsort((times, key))  # stable: file order within a time
    if order is not None:
        key, times = key[order], times[order]
    # the other columns one at a time, each batch let go of once joined (memory: the
    # batches and one joined column, not two copies of every column)
    open_, high, low, close, lines, file_no = (
        _joined(column, dtype, order)
        for column, dtype in zip(parts[2:], (*(np.float64,) * 4, np.int64, np.int32), strict=True)
    )
    sorted_names = names[by_name]
    repeat = np.zeros(times.shape[0], bool)
    repeat[1:] = (key[1:] == key[:-1]) & (times[1:] == times[:-1])
    for i in np.flatnonzero(repeat):
        where = row_where(files[file_no[i]], lines[i])
        bad.add(where, "duplicate_time", f"{sorted_names[key[i]]} at {int(times[i])} (first kept)")
    if repeat.any():
        keep = ~repeat
        key, times, open_, high, low, close = (
            c[keep] for c in (key, times, open_, high, low, close)
        )
    symbols = sorted_names[key] if key.size else np.empty(0, object)
    return OhlcTable(symbols, times, open_, high, low, close, bad)


def _joined(batches: list[np.ndarray], dtype, order: np.ndarray | None = None) -> np.ndarray:
    """The batches of one column as one array (rows ``order``), the list emptied as it goes."""
    joined = np.concatenate(batches).astype(dtype, copy=False) if batches else np.empty(0, dtype)
    batches.clear()
    return joined if order is None else joined[order]
