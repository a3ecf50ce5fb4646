"""OHLC bar files (CSV/Parquet, many symbols) read whole, every cell parsed strictly.

The cell rules and the bad-row policy are those of ``io/readers.py``
(docs/design/input-files.md); a row whose prices do not make a bar (a price not > 0,
``high < low``, open or close outside ``[low, high]``) or repeat a symbol's time is left
out and counted with its ``file:line``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from atc_stream.core.inputs import bad_ohlc
from atc_stream.core.timetext import EpochUnit
from atc_stream.io.readers import (
    MAX_FIELD_CHARS,
    BadRows,
    SymbolCodes,
    as_text,
    csv_batches,
    empty_cells,
    epoch_unit,
    input_files,
    parquet_batches,
    parse_closes,
    parse_times,
    row_where,
)

#: The price columns of a bar, in order.
PRICES = ("open", "high", "low", "close")
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
    columns = ("symbol", "time", *PRICES)
    parts: list[tuple[np.ndarray, ...]] = []
    files = input_files(path)
    for number, f in enumerate(files):
        batches = (
            parquet_batches(f, columns, _HINT)
            if f.suffix == ".parquet"
            else csv_batches(f, columns, bad, _HINT)
        )
        unit = epoch_unit(time_unit)
        for batch, line_of in batches:
            default = symbol if (symbol and not path.is_dir()) else f.stem
            parsed = _parse(f, number, batch, unit, codes, bad, line_of, default)
            if parsed is not None:
                parts.append(parsed)
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


def _parse(path: Path, number: int, batch, unit: EpochUnit, codes, bad, line_of, default: str):
    """The good rows of one record batch: (codes, times, open, high, low, close, lines,
    file numbers), or None when none is good."""
    names = batch.schema.names
    n = batch.num_rows
    if n == 0:
        return None
    text = {name: as_text(batch.column(names.index(name))) for name in ("time", *PRICES)}
    has_symbol = "symbol" in names
    symbols = (
        as_text(batch.column(names.index("symbol")))
        if has_symbol
        else pa.array([default] * n, pa.string())
    )
    blank = np.ones(n, bool)  # a blank line: nothing to report
    for cells in (*text.values(), *([symbols] if has_symbol else [])):
        blank &= empty_cells(cells)
    keep = ~blank
    for name, cells in (("symbol", symbols), *text.items()):
        long = pc.fill_null(pc.greater(pc.utf8_length(cells), MAX_FIELD_CHARS), False)
        for i in np.flatnonzero(long.to_numpy(zero_copy_only=False) & keep):
            bad.add(row_where(path, line_of(i)), "oversized_field", f"{name}: too long")
            keep[i] = False
    symbols = pc.utf8_trim_whitespace(symbols)
    nul = pc.fill_null(pc.match_substring(symbols, "\x00"), False).to_numpy(zero_copy_only=False)
    times, _, time_ok = parse_times(
        batch.column(names.index("time")), unit, lambda i: row_where(path, line_of(i))
    )
    prices = {}
    checks = [
        (empty_cells(symbols) | nul, "bad_symbol", symbols),
        (~time_ok, "bad_time", text["time"]),
    ]
    for name in PRICES:
        prices[name], ok = parse_closes(text[name])
        checks.append((~ok, f"bad_{name}", text[name]))
    for mask, reason, cells in checks:
        for i in np.flatnonzero(mask & keep):
            bad.add(row_where(path, line_of(i)), reason, repr(cells[i].as_py()))
            keep[i] = False
    o, h, lo, c = (prices[name] for name in PRICES)
    for i in np.flatnonzero(bad_ohlc(o, h, lo, c) & keep):
        detail = f"open={o[i]:g} high={h[i]:g} low={lo[i]:g} close={c[i]:g}"
        bad.add(row_where(path, line_of(i)), "bad_ohlc", detail)
        keep[i] = False
    idx = np.flatnonzero(keep)
    if idx.size == 0:
        return None
    return (
        codes.encode(symbols.to_numpy(zero_copy_only=False)[idx]).astype(np.int64),
        times[idx], o[idx], h[idx], lo[idx], c[idx],
        np.asarray(line_of(idx), np.int64), np.full(idx.size, number, np.int64),
    )  # fmt: skip
