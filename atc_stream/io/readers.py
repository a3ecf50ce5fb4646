"""Bar file readers: CSV and Parquet bars, streamed in record batches and parsed strictly.

The cell rules, the bad-row policy and the memory bounds: docs/design/input-files.md.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import time
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from atc_stream.core.errors import InputError as InputError
from atc_stream.core.errors import first_line
from atc_stream.core.inputs import bad_ohlc
from atc_stream.core.spacing import interval_of
from atc_stream.core.timetext import MAX_TIME_MS, EpochUnit, EpochUnitError, parse_time_column
from atc_stream.io.cells import Cells, StringCells, SymbolCells, any_byte_of, column_cells
from atc_stream.io.cells import SymbolCodes as SymbolCodes
from atc_stream.io.cells import as_text as as_text
from atc_stream.io.cells import empty_cells as empty_cells
from atc_stream.io.cells import parse_closes as parse_closes
from atc_stream.io.csv_header import check_header
from atc_stream.io.rebatch import whole_batches

#: Cells longer than this are rejected (``oversized_field``); no valid cell comes close.
MAX_FIELD_CHARS = 1024
#: Bytes per CSV read block: pyarrow's streaming reader reads up to 32 blocks ahead on
#: its I/O thread, so this bounds the reader's memory (32 MiB ahead; 16 MiB blocks held
#: 512 MiB); a field longer than this makes the file unreadable.
BLOCK_BYTES = 1 << 20
#: Rows per record batch of a Parquet file.
PARQUET_BATCH_ROWS = 1 << 16
#: The price columns read beside the close for bars with OHLC, in order.
PRICE_NAMES = ("open", "high", "low")
#: Suffixes of the bar and tick files read from a directory.
INPUT_SUFFIXES = (".csv", ".parquet")
#: What a missing column's error tells the user to do.
COLUMN_HINT = "name it with --time-column/--close-column/--symbol-column"
#: The same for a file read with open, high and low (``replay --strategy``).
OHLC_COLUMN_HINT = (
    "--strategy trades bars with open, high, low and close: name them with "
    "--open-column/--high-column/--low-column/--close-column"
)
#: ``(opens, highs, lows)``, one value per row.
Ohlc = tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclass
class BarTable:
    """Bars of one or many symbols, in file order: ``symbols[i]`` closes at ``times[i]``."""

    symbols: np.ndarray  # object array of str
    times: np.ndarray  # int64
    closes: np.ndarray  # float64
    #: rows of the file(s) left out by the reader (``io.readers.BadRows``), if read from files
    bad_rows: object = None

    def __len__(self) -> int:
        return self.times.shape[0]

    @property
    def symbol_names(self) -> list[str]:
        return sorted(set(self.symbols.tolist()))


#: Rejected rows reported in full; later ones are only counted.
REPORT_FIRST = 5


@dataclass
class BadRows:
    """Rows left out by reason, and the first ``REPORT_FIRST`` of the input in full
    (``file:line: reason: detail``): first by file (``where``'s name first seen) and line,
    not the first reported (a batch is checked a reason at a time)."""

    counts: Counter = field(default_factory=Counter)
    #: ((file, line, order of the report), text) of the rows kept in full
    _first: list[tuple[tuple[int, float, int], str]] = field(default_factory=list)
    _files: dict[str, int] = field(default_factory=dict)

    def add(self, where: str, reason: str, detail: str) -> None:
        self.counts[reason] += 1
        name, _, line = where.rpartition(":")
        number = line.removeprefix("row ")
        file = self._files.setdefault(name, len(self._files))
        key = (file, int(number) if number.isdigit() else math.inf, self.total)
        first = self._first
        if len(first) == REPORT_FIRST:
            last = max(first)
            if key > last[0]:
                return
            first.remove(last)
        first.append((key, f"{where}: {reason}: {detail}"))

    def add_rows(self, rows: np.ndarray, reason: str, where: Callable, detail: Callable) -> None:
        """``add`` of each of ``rows``, ascending positions of one batch: only the first
        ``REPORT_FIRST`` of them can be among the first rows of the input, so only those
        are described (``where(i)``, ``detail(i)``); the others are counted."""
        shown = rows[:REPORT_FIRST]
        for i in shown:
            self.add(where(i), reason, detail(i))
        if rows.shape[0] > shown.shape[0]:  # a Counter keeps a key added 0
            self.counts[reason] += rows.shape[0] - shown.shape[0]

    @property
    def examples(self) -> list[str]:
        """The rows kept in full, in file and line order."""
        return [text for _, text in sorted(self._first)]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def lines(self) -> list[str]:
        if not self.total:
            return []
        counts = ", ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        more = self.total - len(self.examples)
        return [
            f"rejected rows: {counts}",
            *self.examples,
            *([f"... and {more} more"] if more > 0 else []),
        ]


@dataclass
class BarBatch:
    """Good rows of one record batch, in file order: symbol ``codes`` (``SymbolCodes``),
    epoch-ms ``times``, ``closes``, the ``lines`` they came from (CSV line numbers;
    1-based row numbers for Parquet) in the file ``path`` and, when read with them,
    ``(opens, highs, lows)``."""

    codes: np.ndarray  # int32
    times: np.ndarray  # int64
    closes: np.ndarray  # float64
    lines: np.ndarray  # int64
    ohlc: Ohlc | None = None
    path: Path | None = None

    def __len__(self) -> int:
        return self.times.shape[0]


def input_files(path: str | Path, what: str = "bar") -> list[Path]:
    """The ``what`` (bar/tick) files of ``path``: itself, or a directory's .csv/.parquet
    files by name."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{what} file {str(path)!r} does not exist")
    if not path.is_dir():
        return [path]
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in INPUT_SUFFIXES)
    if not files:
        nested = any(p.is_dir() for p in path.iterdir())
        raise InputError(f"{what} directory {str(path)!r} has no .csv or .parquet files"
                         + (" (its subdirectories are not read)" if nested else ""))  # fmt: skip
    return files


def epoch_unit(time_unit: str) -> EpochUnit:
    """A fresh ``EpochUnit`` for one file's time column; ``InputError`` for a bad name."""
    try:
        return EpochUnit(time_unit)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def parse_times(column, unit: EpochUnit, where) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``timetext.parse_time_column`` of a file's time column; a column of integers of
    different epoch units is an ``InputError`` (one line)."""
    try:
        return parse_time_column(column, unit, where)
    except EpochUnitError as exc:
        raise InputError(f"{exc}; pass --time-unit s, ms, us or ns") from None


def iter_bar_batches(
    path: str | Path,
    *,
    symbol_column: str = "symbol",
    time_column: str = "time",
    close_column: str = "close",
    symbol: str | None = None,
    time_unit: str = "auto",
    bad: BadRows | None = None,
    symbols: SymbolCodes | None = None,
    ohlc_columns: tuple[str, str, str] | None = None,
    hint: str | None = None,
    _text_path: bool = False,
):
    """``BarBatch``es of a CSV/Parquet file or a directory's files (by name), streamed.

    Memory: one record batch (a CSV read block of ``BLOCK_BYTES``, or 65,536 rows of
    one decoded Parquet row group) and its parsed columns, plus pyarrow's read-ahead (32
    CSV blocks). Bad rows go to ``bad``; symbol codes come from ``symbols`` (pass the
    same one to read a file again with the same codes). ``ohlc_columns``: the (open,
    high, low) columns, read beside the close (a row whose prices do not make a bar,
    ``core.inputs.bad_ohlc``, is a bad row); ``hint`` ends a missing column's error.
    Raises ``InputError`` for damage that makes a file unreadable. ``_text_path``: read
    every cell as text (``io.cells``), the reading the typed one must match.
    """
    epoch_unit(time_unit)  # a bad unit name is refused before any file is read
    path = Path(path)
    bad = bad if bad is not None else BadRows()
    symbols = symbols if symbols is not None else SymbolCodes()
    columns = (symbol_column, time_column, close_column, *(ohlc_columns or ()))
    if hint is None:
        hint = COLUMN_HINT if ohlc_columns is None else OHLC_COLUMN_HINT
    for f in input_files(path):
        batches = (
            parquet_batches(f, columns, hint, symbol_words=not _text_path)
            if f.suffix == ".parquet"
            else csv_batches(f, columns, bad, hint)
        )
        default_symbol = symbol if (symbol and not path.is_dir()) else f.stem
        unit = epoch_unit(time_unit)  # decided per file, from all its rows
        for batch, line_of in batches:
            if symbol and symbol_column in batch.schema.names:  # it would be ignored
                raise InputError(
                    f"{f.name} has a symbol column {symbol_column!r}: a symbol given for the "
                    "file (--symbol) names the bars of a file without one; leave it out"
                )
            parsed = _parse_batch(
                f, batch, columns, default_symbol, unit, symbols, bad, line_of, not _text_path
            )
            if parsed is not None:
                yield parsed


def read_bars(
    path: str | Path,
    *,
    symbol_column: str = "symbol",
    time_column: str = "time",
    close_column: str = "close",
    symbol: str | None = None,
    time_unit: str = "auto",
    bad: BadRows | None = None,
):
    """A ``BarTable`` of a CSV/Parquet file or a directory of them; bad rows go to ``bad``.

    Materialises every row (20 B each, plus the symbol objects); ``replay`` streams
    instead (``replay.stream``). A file's rows keep file order; a directory's files (by
    name) are merged in time order (stable). Raises ``InputError`` for damage that makes
    a file unreadable.
    """
    bad = bad if bad is not None else BadRows()
    symbols = SymbolCodes()
    parts = list(
        iter_bar_batches(
            path, symbol_column=symbol_column, time_column=time_column,
            close_column=close_column, symbol=symbol, time_unit=time_unit, bad=bad,
            symbols=symbols,
        )
    )  # fmt: skip
    codes = np.concatenate([p.codes for p in parts]) if parts else np.empty(0, np.int32)
    times = np.concatenate([p.times for p in parts]) if parts else np.empty(0, np.int64)
    closes = np.concatenate([p.closes for p in parts]) if parts else np.empty(0)
    if len(input_files(path)) > 1:  # files of a directory: put their rows in time order
        order = np.argsort(times, kind="stable")
        codes, times, closes = codes[order], times[order], closes[order]
    table = BarTable(symbols.names[codes], times, closes)
    table.bad_rows = bad
    return table


def _parse_batch(
    path, batch, columns, default_symbol, unit: EpochUnit, symbols, bad, line_of, typed: bool
) -> BarBatch | None:
    symbol_column, time_column, close_column, *ohlc_columns = columns
    names = batch.schema.names
    n = batch.num_rows
    if n == 0:
        return None
    time_cells = column_cells(batch.column(names.index(time_column)), typed)
    roles = {"close": close_column}
    if ohlc_columns:
        roles.update(zip(PRICE_NAMES, ohlc_columns, strict=True))
    price_cells = {
        name: column_cells(batch.column(names.index(col)), typed) for name, col in roles.items()
    }
    if symbol_column in names:
        symbol_array = batch.column(names.index(symbol_column))
    elif typed:
        symbol_array = pa.repeat(pa.scalar(default_symbol, pa.string()), n)
    else:
        symbol_array = pa.array([default_symbol] * n, pa.string())
    symbol_cells = SymbolCells(symbol_array, typed)
    present: list[Cells] = [time_cells, *price_cells.values()]
    present += [symbol_cells] if symbol_column in names else []
    blank = np.ones(n, bool)  # a blank line (every cell empty): nothing to report
    for cells in present:
        blank &= cells.empty()
    keep = ~blank
    named: list[tuple[str, Cells]] = [("symbol", symbol_cells), ("time", time_cells)]

    def where(i: int) -> str:
        return row_where(path, line_of(i))

    for name, cells in named + list(price_cells.items()):
        long = cells.long(MAX_FIELD_CHARS) & keep
        bad.add_rows(
            np.flatnonzero(long), "oversized_field", where,
            lambda i, name=name, cells=cells: f"{name}: {cells.size(i)} chars",
        )  # fmt: skip
        keep &= ~long
    symbol_ok = ~symbol_cells.blank()
    # a NUL in a name: NumPy's str arrays drop trailing NULs, which would merge "AB\0"
    # into "AB" (another symbol's series) -- refused instead
    nul = symbol_cells.nul() & symbol_ok
    time_array = batch.column(names.index(time_column))
    if isinstance(time_cells, StringCells) and (epochs := time_cells.epochs()) is not None:
        time_array = epochs
    times, _, time_ok = parse_times(time_array, unit, where)
    checks = [
        (~symbol_ok, "empty_symbol", symbol_cells),
        (nul, "bad_symbol", symbol_cells),
        (~time_ok, "bad_time", time_cells),
        (times > MAX_TIME_MS, "time_out_of_range", time_cells),
    ]
    prices = {}
    for name, cells in price_cells.items():
        prices[name], ok = cells.numbers()
        checks.append((~ok, f"bad_{name}", cells))
    for mask, reason, shown in checks:
        hit = mask & keep
        bad.add_rows(np.flatnonzero(hit), reason, where, shown.shown)
        keep &= ~hit
    if ohlc_columns:
        keep &= ~_bad_bars(where, prices, keep, bad)
    idx = np.flatnonzero(keep)
    if idx.size == 0:
        return None
    if idx.size < n:
        times = times[idx]
        prices = {name: values[idx] for name, values in prices.items()}
    ohlc = (prices["open"], prices["high"], prices["low"]) if ohlc_columns else None
    lines = np.asarray(line_of(idx), np.int64)
    return BarBatch(symbol_cells.codes(idx, symbols), times, prices["close"], lines, ohlc, path)


def _bad_bars(where, prices: dict[str, np.ndarray], keep, bad: BadRows) -> np.ndarray:
    """The rows still kept whose prices do not make a bar (``core.inputs.bad_ohlc``),
    each reported as ``bad_ohlc`` at ``where(i)``."""
    o, h, lo, c = (prices[name] for name in (*PRICE_NAMES, "close"))
    hit = bad_ohlc(o, h, lo, c) & keep
    bad.add_rows(
        np.flatnonzero(hit), "bad_ohlc", where,
        lambda i: f"open={o[i]:g} high={h[i]:g} low={lo[i]:g} close={c[i]:g}",
    )  # fmt: skip
    return hit


def row_where(path: Path, line) -> str:
    """``file:line`` of a CSV row, ``file:row N`` of a Parquet row."""
    return f"{path.name}:{'row ' if path.suffix == '.parquet' else ''}{int(line)}"


class InvalidRows:
    """The ``invalid_row_handler`` of a CSV read: collects the rows with the wrong number
    of cells (``invalid``: line, detail) and those that look like the start of an
    unterminated quote (``unterminated``: line); every such row is skipped.

    pyarrow gets ``handler()``, not this object, and a read ends with ``wait_released()``
    (why: docs/design/input-files.md, "Bad rows and unreadable files")."""

    def __init__(self, noun: str = "columns") -> None:
        self.noun = noun
        self.invalid: list[tuple[int, str]] = []
        self.unterminated: list[int] = []
        self._handed: list[weakref.ref] = []

    def handler(self) -> Callable:
        """A new callable reporting to this object, for pyarrow alone to hold."""
        on_invalid = functools.partial(InvalidRows.__call__, self)
        self._handed.append(weakref.ref(on_invalid))
        return on_invalid

    def wait_released(self, seconds: float = 5.0) -> bool:
        """Whether pyarrow's threads let go of every ``handler()`` within ``seconds``
        (sleeping lets them take the GIL to do so)."""
        deadline = time.monotonic() + seconds
        while (held := any(r() is not None for r in self._handed)) and time.monotonic() < deadline:
            time.sleep(0.001)
        return not held

    def __call__(self, row) -> str:
        text = row.text or ""
        line = row.number or -1
        if "\n" in text or "\r" in text or text.count('"') % 2:
            self.unterminated.append(line)
        self.invalid.append((line, f"{row.actual_columns} {self.noun}, expected "
                                   f"{row.expected_columns}"))  # fmt: skip
        return "skip"


def csv_text_options(columns, on_invalid, *, threads: bool = False, only=False) -> dict:
    """pyarrow CSV options of the bar and tick readers: every cell of ``columns`` as text
    (parsed strictly afterwards; ``only``: no other column read), not checked for UTF-8
    (``drop_non_utf8_rows`` does), empty lines kept so line numbers stay true, rows with
    the wrong number of cells to ``on_invalid``."""

    return {
        "read_options": pcsv.ReadOptions(use_threads=threads, block_size=BLOCK_BYTES),
        "parse_options": pcsv.ParseOptions(
            ignore_empty_lines=False, invalid_row_handler=on_invalid
        ),
        "convert_options": pcsv.ConvertOptions(
            column_types={name: pa.string() for name in columns},
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
            # pyarrow's own check fails the whole read on one bad byte; the cells are
            # checked afterwards instead (``drop_non_utf8_rows``), rejecting only its row
            check_utf8=False,
            **({"include_columns": list(columns)} if only else {}),
        ),
    }


def check_one_line_cells(path: Path, batch, line_of) -> None:
    """``InputError`` when a text cell of ``batch`` (record batch or table) holds a line
    break: only a quote left open (or a quoted field spanning lines) puts one there, and
    the rows it swallowed would be lost without a word."""
    for i, column in enumerate(batch.columns):
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            continue
        if not any_byte_of(column, b"\n\r"):  # the usual batch: no cell looked at
            continue
        broken = pc.or_(pc.match_substring(column, "\n"), pc.match_substring(column, "\r"))
        hit = np.flatnonzero(pc.fill_null(broken, False).to_numpy(zero_copy_only=False))
        if hit.size:
            raise InputError(
                f"{path}:{int(line_of(hit[0]))}: unterminated quote (the {batch.schema.names[i]}"
                " field runs over the next lines, which would be lost; a line break inside a "
                "quoted field is not taken either: one line a row); fix the quoting"
            )


#: Bytes of a cell that is not UTF-8 shown in its ``bad_utf8`` report.
_SHOWN_BYTES = 64


def drop_non_utf8_rows(path: Path, batch, columns, line_of, bad: BadRows):
    """``(batch, line_of)`` without the rows of ``batch`` (record batch or table, read
    with ``check_utf8=False``) whose cell of one of ``columns`` is not UTF-8 text, each
    reported as ``bad_utf8`` with its line; ``line_of`` then maps the rows left."""
    names = batch.schema.names
    details: dict[int, str] = {}
    for name in dict.fromkeys(columns):
        if name not in names:
            continue
        column = batch.column(names.index(name))
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            continue
        try:
            column.validate(full=True)  # the check pyarrow's reader would have made
            continue
        except pa.ArrowInvalid:
            pass
        binary = pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()
        for i, cell in enumerate(pc.cast(column, binary).to_pylist()):
            if cell is None or cell.isascii() or i in details:
                continue
            try:
                cell.decode("utf-8")
            except UnicodeDecodeError as exc:
                more = "..." if len(cell) > _SHOWN_BYTES else ""
                details[i] = (f"{name}: {cell[:_SHOWN_BYTES]!r}{more} (byte "
                              f"0x{cell[exc.start]:02x} at offset {exc.start})")  # fmt: skip
    if not details:
        return batch, line_of
    for i in sorted(details):
        bad.add(row_where(path, line_of(i)), "bad_utf8", details[i])
    keep = np.ones(batch.num_rows, bool)
    keep[list(details)] = False
    kept = np.flatnonzero(keep)

    def kept_line_of(i, kept=kept, line_of=line_of):
        return line_of(kept[i])

    return batch.take(pa.array(kept)), kept_line_of


@contextlib.contextmanager
def quiet_undecodable_rows():
    """Within: pyarrow's failure to make text of a row with the wrong number of cells
    that is not UTF-8 (for ``InvalidRows``) is not printed as an ignored exception (a
    traceback on stderr); the read fails with ``ArrowInvalid`` instead. Yields the list
    of those failures."""
    caught: list[BaseException] = []
    before = sys.unraisablehook

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, UnicodeDecodeError):
            caught.append(unraisable.exc_value)
        else:
            before(unraisable)

    sys.unraisablehook = hook
    try:
        yield caught
    finally:
        if sys.unraisablehook is hook:
            sys.unraisablehook = before


def unreadable_csv(path: Path, exc: BaseException, undecodable: list, lead: str) -> InputError:
    """The one-line ``InputError`` of a CSV read that failed with ``exc`` (``lead``: e.g.
    ``cannot read CSV``); ``undecodable``: what ``quiet_undecodable_rows`` caught."""
    if undecodable:
        return InputError(
            f"{path}: {lead}: a row with the wrong number of cells is not UTF-8 text "
            f"({first_line(exc)}); fix or remove it"
        )
    return InputError(f"{path}: {lead}: {first_line(exc)}")


def csv_batches(path: Path, columns, bad: BadRows, hint: str = COLUMN_HINT):
    """(record batch, line_of(row in batch)) of a CSV file, streamed; rows with the wrong
    number of columns, or a cell of ``columns`` that is not UTF-8, go to ``bad``."""

    rejected = InvalidRows("columns")
    check_header(path, columns)
    try:
        # the reader is never bound here: the handler it holds must go with it
        yield from _csv_reader_batches(
            path, columns, bad, hint, _open_csv(path, columns, rejected), rejected
        )
    finally:
        rejected.wait_released()


def _open_csv(path: Path, columns, rejected: InvalidRows):
    """A pyarrow streaming reader of a bar CSV's ``columns`` (the symbol column only
    where the file has one), or the one-line ``InputError``.

    Only those columns are read: any other would be type-guessed from the first block,
    and one later cell that breaks the guess would stop the whole read. A file without a
    column it needs is opened whole, so that ``_csv_reader_batches`` names its columns.
    """
    for wanted in (columns, columns[1:]):
        try:
            return _open_csv_columns(path, wanted, rejected, only=True)
        except KeyError:  # pyarrow's ArrowKeyError: a column of ``wanted`` is not there
            continue
    return _open_csv_columns(path, columns, rejected, only=False)


def _open_csv_columns(path: Path, columns, rejected: InvalidRows, *, only: bool):
    """``pcsv.open_csv`` of a bar CSV with ``csv_text_options``; a missing column of
    ``columns`` (``only``) raises pyarrow's ``ArrowKeyError``."""
    rejected.invalid.clear()  # a failed open may have reported its first block's rows
    rejected.unterminated.clear()
    try:
        with quiet_undecodable_rows() as undecodable:
            return pcsv.open_csv(path, **csv_text_options(columns, rejected.handler(), only=only))
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as exc:
        raise unreadable_csv(path, exc, undecodable, "cannot read CSV") from None


def _csv_reader_batches(path: Path, columns, bad: BadRows, hint: str, reader, rejected):
    """``csv_batches`` of an open pyarrow CSV ``reader``; closes it."""

    unterminated, invalid = rejected.unterminated, rejected.invalid
    reported = 0
    rows_before = 0
    try:
        names = reader.schema.names
        missing = [c for c in columns[1:] if c not in names]
        if missing:
            raise InputError(
                f"{path.name}: no column {missing[0]!r} (columns: {', '.join(names)}); {hint}"
            )
        while True:
            try:
                with quiet_undecodable_rows() as undecodable:
                    batch = reader.read_next_batch()
            except StopIteration:
                break
            except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
                lead = f"unreadable after data row {rows_before}"
                raise unreadable_csv(path, exc, undecodable, lead) from None
            if unterminated:
                raise InputError(
                    f"{path}:{unterminated[0]}: unterminated quote (the rest of the file would "
                    "be one field); fix the quoting"
                )
            for line, detail in invalid[reported:]:
                bad.add(f"{path.name}:{line}", "wrong_columns", detail)
            reported = len(invalid)
            skipped = np.array(sorted(x for x, _ in invalid if x > 0), np.int64)
            base = rows_before

            def line_of(i, base=base, skipped=skipped):
                row = base + np.asarray(i, np.int64)
                # data row ``row`` sits on line row + 2 plus the invalid lines before it
                shift = np.searchsorted(skipped - 2 - np.arange(skipped.size), row, side="right")
                return row + 2 + shift

            check_one_line_cells(path, batch, line_of)
            rows_before += batch.num_rows
            yield drop_non_utf8_rows(path, batch, columns, line_of, bad)
    finally:
        # closed here, not left to the collector, so that its read-ahead stops now; and
        # unbound, since an error's traceback keeps this frame (and the handler) alive
        reader.close()
        del reader
    for line, detail in invalid[reported:]:
        bad.add(f"{path.name}:{line}", "wrong_columns", detail)


def check_column_types(path: Path, schema, names) -> None:
    """``InputError`` naming the first column of ``names`` whose type holds no single
    value per row (a list, struct or map): no cell of it is a time, price or symbol."""
    for name in names:
        kind = schema.field(name).type
        if pa.types.is_nested(kind):
            raise InputError(
                f"{path.name}: column {name!r} is of type {kind}, not numbers, text or times"
            )


def parquet_batches(path: Path, columns, hint: str = COLUMN_HINT, symbol_words: bool = False):
    """(record batch, line_of(rows in batch)) of a Parquet file, one row group decoded at
    a time (``pyarrow.dataset``'s scanner reads ahead: 5x the memory here);
    ``symbol_words``: a text column ``columns[0]`` comes as a dictionary array (the
    file's own dictionary: each name decoded once, not once per row), in batches of the
    same rows as without."""

    as_words = False
    try:
        parquet = pq.ParquetFile(path)
        names = parquet.schema_arrow.names
        if symbol_words and columns[0] in names:
            as_words = parquet.schema_arrow.field(columns[0]).type == pa.string()
            if as_words:
                parquet.close()
                parquet = pq.ParquetFile(path, read_dictionary=[columns[0]])
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{path}: cannot read Parquet: {first_line(exc)}") from None
    missing = [c for c in columns[1:] if c not in names]
    if missing:
        raise InputError(
            f"{path.name}: no column {missing[0]!r} (columns: {', '.join(names)}); {hint}"
        )
    wanted = [c for c in columns if c in names]
    check_column_types(path, parquet.schema_arrow, wanted)
    rows_before = 0
    try:
        batches = parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=wanted)
        if as_words:  # dictionary pieces end at row groups: joined into the batches read
            # without them, since a batch's new names get their codes in sorted order
            # and its bad rows are reported check by check
            batches = whole_batches(batches, PARQUET_BATCH_ROWS)
        for batch in batches:
            base = rows_before

            def line_of(i, base=base):
                return base + np.asarray(i, np.int64) + 1

            yield batch, line_of
            rows_before += batch.num_rows
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{path}: unreadable after row {rows_before}: {first_line(exc)}") from None
    finally:
        parquet.close()


def infer_interval(table) -> str | None:
    """The interval label of the bars' most common spacing within a symbol (``1m``,
    ``5m``, ``1h``, ``1d``, ..., ``1M``: ``spacing.common_interval``); None when no
    symbol has two bars."""
    if len(table) < 2:
        return None
    _, codes = np.unique(table.symbols.astype(str), return_inverse=True)
    return interval_of(codes, table.times)
