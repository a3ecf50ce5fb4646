"""Tick file reader: trades (time, symbol, price, size) from CSV or Parquet, parsed strictly.

The cell rules and the bad-row policy: docs/design/input-files.md.
"""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.dataset as ds

from atc_stream.core.errors import first_line
from atc_stream.core.timetext import MAX_TIME_MS, text_to_ms
from atc_stream.io.csv_header import check_header
from atc_stream.io.readers import (
    MAX_FIELD_CHARS,
    BadRows,
    InputError,
    InvalidRows,
    check_column_types,
    check_one_line_cells,
    csv_text_options,
    drop_non_utf8_rows,
    epoch_unit,
    input_files,
    parse_closes,
    parse_times,
    quiet_undecodable_rows,
    unreadable_csv,
)

DEFAULT_TICK_TIME_COLUMN = "time"
DEFAULT_TICK_SYMBOL_COLUMN = "symbol"
DEFAULT_PRICE_COLUMN = "price"
DEFAULT_SIZE_COLUMN = "size"


@dataclass
class TickTable:
    """Trades: ``names[codes[i]]`` traded ``sizes[i]`` at ``prices[i]`` at ``times[i]`` (ms).

    ``sub_ms[i]`` (ns within that ms, 0..999,999; None: all 0) orders trades of one
    millisecond; ``bad_rows`` reports the rows a loader left out (file:line, reason).
    """

    times: np.ndarray  # int64
    codes: np.ndarray  # int64 index into names
    names: list[str]
    prices: np.ndarray  # float64
    sizes: np.ndarray  # float64
    rejected: Counter = field(default_factory=Counter)
    sub_ms: np.ndarray | None = None
    bad_rows: BadRows = field(default_factory=BadRows)

    def __len__(self) -> int:
        return self.times.shape[0]

    @property
    def symbols(self) -> np.ndarray:
        """Symbol of each trade (object array; built on demand)."""
        return np.asarray(self.names, dtype=object)[self.codes]


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
    """(int64 ms times, valid mask): integers as they are, ISO-8601 / datetimes → ms
    (sub-ms floored)."""
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
        ms = text_to_ms(str(v))
        if ms is not None:
            out[i], valid[i] = ms, True
    return out, valid


def _make_table(times, codes, names, prices, sizes, rejected: Counter) -> TickTable:
    n = times.shape[0]
    if not (codes.shape[0] == prices.shape[0] == sizes.shape[0] == n):
        raise ValueError(
            "times, symbols, prices and sizes must have one length, got "
            f"{n}, {codes.shape[0]}, {prices.shape[0]}, {sizes.shape[0]}"
        )
    times, time_ok = _to_times(times)
    late = time_ok & (times > MAX_TIME_MS)
    time_ok &= ~late
    prices = _to_float(prices)
    sizes = _to_float(sizes)
    names = list(names)
    symbol_ok = np.ones(n, bool)
    for bad in [name for name in names if name == "" or "\x00" in name]:  # empty; a NUL
        position = names.index(bad)
        symbol_ok &= codes != position
        names.pop(position)
        codes = codes - (codes > position)
    price_ok = np.isfinite(prices) & (prices > 0)
    size_ok = np.isfinite(sizes) & (sizes >= 0)
    ok = symbol_ok & time_ok & price_ok & size_ok
    if not ok.all():
        rejected["bad_symbol"] += int((~symbol_ok).sum())
        rejected["bad_time"] += int((symbol_ok & ~time_ok & ~late).sum())
        rejected["time_out_of_range"] += int((symbol_ok & late).sum())
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
    time_unit: str = "auto",
) -> TickTable:
    """Read trades from a CSV/Parquet file, or a directory of them (one per symbol).

    A file without a symbol column holds one symbol: ``symbol`` or the file's stem.
    In a directory, every ``*.csv``/``*.parquet`` file is read that way (symbol = stem
    unless the file has a symbol column). Times: docs/design/input-files.md. Bad rows are
    left out and reported in ``bad_rows`` (``rejected`` holds their counts); damage that
    makes a file unreadable raises ``InputError`` (a ``ValueError``; one line).
    """
    epoch_unit(time_unit)  # a bad unit name is refused before any file is read
    path = Path(path)
    files = input_files(path, "tick")
    roles = {"time": time_column, "symbol": symbol_column, "price": price_column,
             "size": size_column}  # fmt: skip
    bad = BadRows()
    if path.is_dir():
        table = concat_ticks([_load_file(f, roles, f.stem, time_unit, bad) for f in files])
    else:
        table = _load_file(path, roles, symbol or path.stem, time_unit, bad)
    table.rejected = Counter(bad.counts)
    table.bad_rows = bad
    return table


def _load_file(path: Path, roles: dict, default_symbol: str, time_unit: str, bad) -> TickTable:
    if path.suffix == ".parquet":
        columns, line_of = _parquet_columns(path, roles)
    else:
        columns, line_of = _csv_columns(path, roles, bad)
    return _parse_ticks(path, columns, roles, line_of, default_symbol, time_unit, bad)


def _missing_column(path: Path, names: list[str], roles: dict) -> None:
    """``InputError`` naming the first missing required column and the option naming it."""
    for role in ("time", "price", "size"):
        if roles[role] not in names:
            options = "/".join(f"--{r}-column" for r in roles)
            raise InputError(
                f"{path.name}: no column {roles[role]!r} (columns: {', '.join(names)}); "
                f"name it with {options}"
            )


def _csv_columns(path: Path, roles: dict, bad):
    """The tick columns of a CSV file as pyarrow string arrays, and ``line_of(row)``.

    Every cell is read as text (parsed strictly later); rows with the wrong number of
    cells (``wrong_columns``) or a cell that is not UTF-8 (``bad_utf8``) go to ``bad``;
    an unterminated quote raises ``InputError``.
    """

    check_header(path, roles.values())
    try:  # the header line alone: a bad byte further on is a data row's problem
        with open(path, "rb") as f:
            first = f.readline().decode("utf-8-sig")
        header = next(csv.reader([first]), None)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(f"{path}: cannot read CSV header: {first_line(exc)}") from None
    if not header:
        raise InputError(f"{path.name}: empty file (no header line)")
    _missing_column(path, header, roles)
    present = [name for name in dict.fromkeys(roles.values()) if name in header]
    table, invalid, unterminated = _read_csv_text(path, present, threads=True)
    if invalid:  # line numbers are known only to a single-threaded read: read again
        table, invalid, unterminated = _read_csv_text(path, present, threads=False)
    if unterminated:
        raise InputError(
            f"{path}:{unterminated[0]}: unterminated quote (the rest of the file would be "
            "one field); fix the quoting"
        )
    for line, detail in invalid:
        bad.add(f"{path.name}:{line}", "wrong_columns", detail)
    # data row i sits on line i + 2 plus the skipped (invalid) lines before it
    skipped = np.array(sorted(line for line, _ in invalid if line > 0), np.int64)
    before = skipped - 2 - np.arange(skipped.size)

    def line_of(i: int) -> int:
        return int(i) + 2 + int(np.searchsorted(before, int(i), side="right"))

    check_one_line_cells(path, table, line_of)
    table, line_of = drop_non_utf8_rows(path, table, present, line_of, bad)
    columns = {name: table.column(name).combine_chunks() for name in present}
    return columns, line_of


def _read_csv_text(path: Path, columns: list[str], *, threads: bool):
    """(table of ``columns`` as text, [(line, detail)] of rows with the wrong number of
    cells, [line] of those that look like an unterminated quote)."""

    rejected = InvalidRows("cells")
    try:
        with quiet_undecodable_rows() as undecodable:
            table = pcsv.read_csv(
                path, **csv_text_options(columns, rejected.handler(), threads=threads, only=True)
            )
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as exc:
        raise unreadable_csv(path, exc, undecodable, "cannot read CSV") from None
    finally:
        rejected.wait_released()
    return table, sorted(rejected.invalid), sorted(rejected.unterminated)


def _parquet_columns(path: Path, roles: dict):
    """The tick columns of a Parquet file (their own types), and ``line_of(row)``."""

    try:
        dataset = ds.dataset(path, format="parquet")
        names = dataset.schema.names
        _missing_column(path, names, roles)
        present = [name for name in dict.fromkeys(roles.values()) if name in names]
        check_column_types(path, dataset.schema, present)
        table = dataset.to_table(columns=present)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{path}: cannot read Parquet: {first_line(exc)}") from None
    columns = {name: table.column(name).combine_chunks() for name in present}
    return columns, lambda i: f"row {int(i) + 1}"


def _parse_ticks(path, columns, roles, line_of, default_symbol, time_unit, bad) -> TickTable:
    """Strictly parsed ticks of one file's columns; bad rows reported to ``bad``."""

    cells = {role: columns[name] for role, name in roles.items() if name in columns}
    n = len(cells["time"])
    texts = {role: col for role, col in cells.items() if _is_text(col)}
    keep = np.ones(n, bool)
    lengths = {
        role: pc.utf8_length(col).fill_null(0).to_numpy(zero_copy_only=False)
        for role, col in texts.items()
    }
    if len(texts) == len(cells):  # a blank CSV line (every cell empty): nothing to report
        keep &= np.logical_or.reduce([length > 0 for length in lengths.values()])
    for role, col in texts.items():
        if lengths[role].max(initial=0) <= MAX_FIELD_CHARS:
            continue
        long = (lengths[role] > MAX_FIELD_CHARS) & keep
        bad.add_rows(
            np.flatnonzero(long), "oversized_field", lambda i: f"{path.name}:{line_of(i)}",
            lambda i, role=role, col=col: f"{role}: {len(col[int(i)].as_py())} chars",
        )  # fmt: skip
        keep &= ~long
    if "symbol" in cells:
        symbols = cells["symbol"]
        if pa.types.is_dictionary(symbols.type):
            symbols = symbols.dictionary_decode()
        encoded = pc.dictionary_encode(pc.cast(symbols, pa.string()).fill_null(""))
        # trim the (few) distinct names, not every cell; " A" and "A" become one symbol
        trimmed = [str(x).strip() for x in encoded.dictionary.to_pylist()]
        # an object array: a str array would drop trailing NULs and merge "AB\0" into "AB"
        unique, merged = np.unique(np.array(trimmed, dtype=object), return_inverse=True)
        codes = merged.reshape(-1)[encoded.indices.to_numpy(zero_copy_only=False)]
        names: list[str] = unique.tolist()
        symbol_ok = np.array([name != "" and "\x00" not in name for name in names], bool)[codes]
    else:
        symbol_ok = np.ones(n, bool)
        codes, names = np.zeros(n, np.int64), [default_symbol]
    times, sub_ms, time_ok = parse_times(
        cells["time"], epoch_unit(time_unit), lambda i: f"{path.name}:{line_of(i)}"
    )
    prices, price_ok = _numbers(cells["price"])
    sizes, size_ok = _numbers(cells["size"])
    with np.errstate(invalid="ignore"):
        price_ok &= np.isfinite(prices) & (prices > 0)
        size_ok &= np.isfinite(sizes) & (sizes >= 0)
    for ok, reason, role in (
        (symbol_ok, "bad_symbol", "symbol"),
        (time_ok, "bad_time", "time"),
        (times <= MAX_TIME_MS, "time_out_of_range", "time"),
        (price_ok, "bad_price", "price"),
        (size_ok, "bad_size", "size"),
    ):
        hit = np.flatnonzero(~ok & keep)
        bad.add_rows(
            hit, reason, lambda i: f"{path.name}:{line_of(i)}",
            lambda i, role=role: repr(cells[role][int(i)].as_py()),
        )  # fmt: skip
        keep[hit] = False
    rows = np.flatnonzero(keep)
    used_codes, used_names = _used_names(codes[rows], names)
    return TickTable(
        times[rows], used_codes, used_names, prices[rows], sizes[rows], Counter(),
        sub_ms=sub_ms[rows],
    )  # fmt: skip


def _used_names(codes: np.ndarray, names: list[str]) -> tuple[np.ndarray, list[str]]:
    """Codes renumbered to the sorted names that occur in ``codes`` (others dropped)."""
    used = np.unique(codes)
    used_names = [names[c] for c in used.tolist()]
    order = np.argsort(np.array(used_names, dtype=str), kind="stable")
    mapping = np.zeros(len(names), np.int64)
    mapping[used[order]] = np.arange(used.size)
    return mapping[codes], [used_names[j] for j in order.tolist()]


def _is_text(col) -> bool:

    return pa.types.is_string(col.type) or pa.types.is_large_string(col.type)


def _empty(text) -> np.ndarray:

    return pc.fill_null(pc.equal(pc.utf8_length(text), 0), True).to_numpy(zero_copy_only=False)


def _numbers(col) -> tuple[np.ndarray, np.ndarray]:
    """float64 values of a price/size column and the mask of cells that are numbers
    (text strictly: decimal or scientific, no ``1_0``)."""

    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
        valid = col.is_valid().to_numpy(zero_copy_only=False)
        values = pc.cast(col, pa.float64()).fill_null(float("nan"))
        return values.to_numpy(zero_copy_only=False), valid
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    col = pc.cast(col, pa.string())
    try:  # every cell a number (Arrow's parser takes no "1_0", no "0x10", no spaces)
        values = pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)
        return values, np.ones(values.shape[0], bool)
    except pa.ArrowInvalid:  # some are not: the strict cell-by-cell pattern
        return parse_closes(col)


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
        sub_ms=np.concatenate([_sub_ms(p) for p in parts]) if parts else None,
    )


def _sub_ms(ticks: TickTable) -> np.ndarray:
    return ticks.sub_ms if ticks.sub_ms is not None else np.zeros(len(ticks), np.int64)
