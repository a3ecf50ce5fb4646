"""OHLC bar files (CSV/Parquet, many symbols) read whole, sorted by symbol and time.

The rows are those of ``io.readers.iter_bar_batches`` with open, high and low (its cell
rules, bad-row policy and ``bad_ohlc`` rule: docs/design/input-files.md); a row that
repeats a symbol's time is left out too and counted with its ``file:line``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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

    @property
    def symbol_names(self) -> list[str]:
        return sorted(set(self.symbols.tolist()))

    def take(self, rows: np.ndarray) -> OhlcTable:
        """The bars at positions ``rows`` (a mask or indexes), same bad-row report."""
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
) -> OhlcTable:
    """An ``OhlcTable`` of a CSV/Parquet file or a directory of them (a file without a
    ``symbol`` column is the symbol ``symbol``, else of its stem; a directory's files
    always their stems). ``InputError`` for an unreadable file."""
    epoch_unit(time_unit)
    path = Path(path)
    bad = bad if bad is not None else BadRows()
    codes = SymbolCodes()
    parts: list[tuple[np.ndarray, ...]] = []
    files = input_files(path)
    for number, f in enumerate(files):
        batches = iter_bar_batches(
            f, symbol=None if path.is_dir() else symbol, time_unit=time_unit, bad=bad,
            symbols=codes, ohlc_columns=PRICE_NAMES, hint=_HINT,
        )  # fmt: skip
        for b in batches:
            assert b.ohlc is not None  # read with open, high and low
            parts.append((b.codes.astype(np.int64), b.times, *b.ohlc, b.closes, b.lines,
                          np.full(len(b), number, np.int64)))  # fmt: skip
    if parts:
        code, times, open_, high, low, close, lines, file_no = (
            np.concatenate(col) for col in zip(*parts, strict=True)
        )
    else:
        code, times, lines, file_no = (np.empty(0, np.int64) for _ in range(4))
        open_, high, low, close = (np.empty(0) for _ in range(4))
    names = codes.names
    order = np.lexsort((times, _rank(names)[code] if code.size else code))
    code, times, lines, file_no = code[order], times[order], lines[order], file_no[order]
    open_, high, low, close = open_[order], high[order], low[order], close[order]
    repeat = np.zeros(times.shape[0], bool)
    repeat[1:] = (code[1:] == code[:-1]) & (times[1:] == times[:-1])
    for i in np.flatnonzero(repeat):
        where = row_where(files[file_no[i]], lines[i])
        bad.add(where, "duplicate_time", f"{names[code[i]]} at {int(times[i])} (first kept)")
    keep = ~repeat
    return OhlcTable(
        names[code[keep]] if code.size else np.empty(0, object), times[keep], open_[keep],
        high[keep], low[keep], close[keep], bad,
    )  # fmt: skip


def _rank(names: np.ndarray) -> np.ndarray:
    """``rank[code]``: the position of each symbol code in name order."""
    rank = np.empty(len(names), np.int64)
    rank[np.argsort(names.astype(str), kind="stable")] = np.arange(len(names))
    return rank
