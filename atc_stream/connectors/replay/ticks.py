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
- Times in files (``load_ticks``): integer epochs in ``time_unit`` s/ms/us/ns (``auto``,
  the default: each value's unit from its magnitude, with the bands of
  ``inputs.EPOCH_BANDS``; a value that fits none is a bad time), ISO-8601 / RFC 3339
  text with any number of fraction digits and an optional zone (``timetext``), or
  Parquet timestamps. Sub-millisecond parts are kept (``TickTable.sub_ms``) to order the
  trades of one millisecond; bar times are whole milliseconds.
- Bad rows are left out, counted in ``rejected`` by reason and reported with file and
  line in ``bad_rows`` (first few in full): ``bad_time`` (empty, or neither an epoch
  nor an ISO time), ``bad_price`` (not a finite number > 0), ``bad_size`` (not a
  finite number >= 0), ``bad_symbol`` (empty symbol cell, or a NUL in it),
  ``oversized_field`` (a cell over ``io.readers.MAX_FIELD_CHARS``), ``wrong_columns`` (a
  line with too few or too many cells). Numbers are parsed strictly (no ``1_0``). Blank
  lines and a UTF-8 BOM are simply handled; damage that makes the rest of a file
  unreadable (unterminated quote, invalid UTF-8, missing column, corrupt Parquet) raises
  ``InputError``.
"""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from atc_stream.core.errors import first_line
from atc_stream.core.inputs import EPOCH_BANDS, UNIT_TO_MS
from atc_stream.core.intervals import interval_ms as _interval_ms
from atc_stream.core.timetext import ISO_REGEX, iso_parts, text_to_ms
from atc_stream.io.readers import (
    MAX_FIELD_CHARS,
    REPORT_FIRST,
    BadRows,
    BarTable,
    InputError,
    InvalidRows,
    csv_text_options,
    parse_closes,
)

DEFAULT_TICK_TIME_COLUMN = "time"
DEFAULT_TICK_SYMBOL_COLUMN = "symbol"
DEFAULT_PRICE_COLUMN = "price"
DEFAULT_SIZE_COLUMN = "size"
EMPTY_POLICIES = ("skip", "carry")
TICK_SUFFIXES = (".csv", ".parquet")


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
    time_unit: str = "auto",
) -> TickTable:
    """Read trades from a CSV/Parquet file, or a directory of them (one per symbol).

    A file without a symbol column holds one symbol: ``symbol`` or the file's stem.
    In a directory, every ``*.csv``/``*.parquet`` file is read that way (symbol = stem
    unless the file has a symbol column). Times: see the module docstring. Bad rows are
    left out and reported in ``bad_rows`` (``rejected`` holds their counts); damage that
    makes a file unreadable raises ``InputError`` (a ``ValueError``; one line).
    """
    if time_unit != "auto" and time_unit not in UNIT_TO_MS:
        raise InputError(f"time unit must be auto, s, ms, us or ns, got {time_unit!r}")
    path = Path(path)
    if not path.exists():
        raise InputError(f"tick file {str(path)!r} does not exist")
    roles = {"time": time_column, "symbol": symbol_column, "price": price_column,
             "size": size_column}  # fmt: skip
    bad = BadRows()
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in TICK_SUFFIXES and p.is_file())
        if not files:
            raise InputError(f"tick directory {str(path)!r} has no .csv or .parquet files")
        table = concat_ticks([_load_file(f, roles, f.stem, time_unit, bad) for f in files])
    else:
        table = _load_file(path, roles, symbol or path.stem, time_unit, bad)
    table.rejected = Counter(bad.counts)
    table.bad_rows = bad
    return table


def _load_file(path: Path, roles: dict, default_symbol: str, time_unit: str, bad) -> TickTable:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise InputError(
            "reading tick files needs pyarrow (pip install 'atc-stream[parquet]')"
        ) from None
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
    cells go to ``bad`` (``wrong_columns``); an unterminated quote or invalid UTF-8
    raises ``InputError``.
    """

    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            header = next(csv.reader(f), None)
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

    columns = {name: table.column(name).combine_chunks() for name in present}
    return columns, line_of


def _read_csv_text(path: Path, columns: list[str], *, threads: bool):
    """(table of ``columns`` as text, [(line, detail)] of rows with the wrong number of
    cells, [line] of those that look like an unterminated quote)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    rejected = InvalidRows("cells")
    try:
        table = pcsv.read_csv(
            path, **csv_text_options(columns, rejected, threads=threads, only=True)
        )
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read CSV: {first_line(exc)}") from None
    return table, sorted(rejected.invalid), sorted(rejected.unterminated)


def _parquet_columns(path: Path, roles: dict):
    """The tick columns of a Parquet file (their own types), and ``line_of(row)``."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    try:
        dataset = ds.dataset(path, format="parquet")
        names = dataset.schema.names
        _missing_column(path, names, roles)
        present = [name for name in dict.fromkeys(roles.values()) if name in names]
        table = dataset.to_table(columns=present)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{path}: cannot read Parquet: {first_line(exc)}") from None
    columns = {name: table.column(name).combine_chunks() for name in present}
    return columns, lambda i: f"row {int(i) + 1}"


def _parse_ticks(path, columns, roles, line_of, default_symbol, time_unit, bad) -> TickTable:
    """Strictly parsed ticks of one file's columns; bad rows reported to ``bad``."""
    import pyarrow as pa
    import pyarrow.compute as pc

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
        for i in np.flatnonzero(long):
            bad.add(f"{path.name}:{line_of(i)}", "oversized_field",
                    f"{role}: {len(col[int(i)].as_py())} chars")  # fmt: skip
        keep &= ~long
    if "symbol" in cells:
        symbols = cells["symbol"]
        if pa.types.is_dictionary(symbols.type):
            symbols = symbols.dictionary_decode()
        encoded = pc.dictionary_encode(pc.cast(symbols, pa.string()).fill_null(""))
        # trim the (few) distinct names, not every cell; " A" and "A" become one symbol
        trimmed = [str(x).strip() for x in encoded.dictionary.to_pylist()]
        # an object array: a str array would drop trailing NULs and merge "AB\0" into "AB"
        names, merged = np.unique(np.array(trimmed, dtype=object), return_inverse=True)
        codes = merged.reshape(-1)[encoded.indices.to_numpy(zero_copy_only=False)]
        names = names.tolist()
        symbol_ok = np.array([name != "" and "\x00" not in name for name in names], bool)[codes]
    else:
        symbol_ok = np.ones(n, bool)
        codes, names = np.zeros(n, np.int64), [default_symbol]
    times, sub_ms, time_ok = _tick_times(cells["time"], time_unit)
    prices, price_ok = _numbers(cells["price"])
    sizes, size_ok = _numbers(cells["size"])
    with np.errstate(invalid="ignore"):
        price_ok &= np.isfinite(prices) & (prices > 0)
        size_ok &= np.isfinite(sizes) & (sizes >= 0)
    for ok, reason, role in (
        (symbol_ok, "bad_symbol", "symbol"),
        (time_ok, "bad_time", "time"),
        (price_ok, "bad_price", "price"),
        (size_ok, "bad_size", "size"),
    ):
        hit = np.flatnonzero(~ok & keep)
        shown = hit[: max(0, REPORT_FIRST - len(bad.examples))]
        for i in shown:
            bad.add(f"{path.name}:{line_of(i)}", reason, repr(cells[role][int(i)].as_py()))
        if hit.size > shown.size:
            bad.counts[reason] += hit.size - shown.size
        keep[hit] = False
    rows = np.flatnonzero(keep)
    codes, names = _used_names(codes[rows], names)
    return TickTable(
        times[rows], codes, names, prices[rows], sizes[rows], Counter(), sub_ms=sub_ms[rows]
    )


def _used_names(codes: np.ndarray, names: list[str]) -> tuple[np.ndarray, list[str]]:
    """Codes renumbered to the sorted names that occur in ``codes`` (others dropped)."""
    used = np.unique(codes)
    used_names = [names[c] for c in used.tolist()]
    order = np.argsort(np.array(used_names, dtype=str), kind="stable")
    mapping = np.zeros(len(names), np.int64)
    mapping[used[order]] = np.arange(used.size)
    return mapping[codes], [used_names[j] for j in order.tolist()]


def _is_text(col) -> bool:
    import pyarrow as pa

    return pa.types.is_string(col.type) or pa.types.is_large_string(col.type)


def _empty(text) -> np.ndarray:
    import pyarrow.compute as pc

    return pc.fill_null(pc.equal(pc.utf8_length(text), 0), True).to_numpy(zero_copy_only=False)


def _numbers(col) -> tuple[np.ndarray, np.ndarray]:
    """float64 values of a price/size column and the mask of cells that are numbers
    (text strictly: decimal or scientific, no ``1_0``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

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


def _tick_times(col, unit: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(epoch ms floored, ns within the ms, parsed mask) of a time column: Parquet
    timestamps; integers in ``unit`` (``auto``: by each value's magnitude); text holding
    integers or ISO-8601 / RFC 3339 (``timetext``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(col)
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if pa.types.is_timestamp(col.type):
        valid = col.is_valid().to_numpy(zero_copy_only=False)
        values = pc.cast(col, pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        ms, sub = _epoch_parts(values, col.type.unit)
        return ms, sub, valid
    if pa.types.is_integer(col.type):
        valid = col.is_valid().to_numpy(zero_copy_only=False)
        if pa.types.is_unsigned_integer(col.type):  # above int64: not a time
            big = pc.fill_null(pc.greater(col, 2**63 - 1), False).to_numpy(zero_copy_only=False)
            valid &= ~big
            col = pc.if_else(pa.array(big), 0, col)
        values = pc.cast(col, pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        return _int_epochs(values, valid, unit)
    if pa.types.is_floating(col.type):  # whole numbers only
        raw = pc.cast(col, pa.float64()).fill_null(float("nan")).to_numpy(zero_copy_only=False)
        valid = np.isfinite(raw) & (raw == np.round(raw)) & (np.abs(raw) < 2.0**63)
        return _int_epochs(np.where(valid, raw, 0).astype(np.int64), valid, unit)
    text = pc.cast(col, pa.string())
    try:  # fast path: every cell an integer (Arrow also takes "0x10": not for us)
        values = pc.cast(text, pa.int64())
        if not pc.any(pc.match_substring(text, "x", ignore_case=True)).as_py():
            valid = values.is_valid().to_numpy(zero_copy_only=False)
            return _int_epochs(values.fill_null(0).to_numpy(zero_copy_only=False), valid, unit)
    except pa.ArrowInvalid:
        pass
    text = pc.utf8_trim_whitespace(text)
    ms, sub, ok = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, bool)
    iso = pc.fill_null(pc.match_substring_regex(text, f"^(?:{ISO_REGEX})$"), False)
    iso = iso.to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(iso)
    if rows.size:
        _iso_times(pc.take(text, pa.array(rows)), rows, ms, sub, ok)
    rest = np.flatnonzero(~iso)  # integers, or not a time
    if rest.size:
        rest_text = pc.take(text, pa.array(rest))
        is_int = pc.match_substring_regex(rest_text, r"^[+-]?[0-9]{1,19}$")
        idx = rest[pc.fill_null(is_int, False).to_numpy(zero_copy_only=False)]
    else:
        idx = rest
    if idx.size:
        digits = pc.take(text, pa.array(idx))
        try:
            values = pc.cast(digits, pa.int64()).to_numpy(zero_copy_only=False)
            fits = np.ones(idx.size, bool)
        except pa.ArrowInvalid:  # 19 digits beyond int64
            parsed = [int(v) for v in digits.to_pylist()]
            fits = np.array([-(2**63) <= v < 2**63 for v in parsed])
            values = np.array([v if f else 0 for v, f in zip(parsed, fits, strict=True)], np.int64)
        ms[idx], sub[idx], ok[idx] = _int_epochs(values, fits, unit)
    return ms, sub, ok


def _iso_times(text, rows: np.ndarray, ms, sub, ok) -> None:
    """Cells ``text`` (rows ``rows``) that match ``timetext.ISO_REGEX`` into ``ms``/
    ``sub``/``ok``: converted by Arrow where it takes a whole group (with a zone / without),
    else cell by cell with ``timetext.iso_parts`` (e.g. February 30th: not a time)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    zoned = pc.match_substring_regex(text, r"(?:[Zz]|[+-]\d{2}(?::?\d{2})?)$")
    zoned = pc.fill_null(zoned, False).to_numpy(zero_copy_only=False)
    left = np.ones(rows.size, bool)
    for group, tz in ((zoned, "UTC"), (~zoned, None)):
        picked = np.flatnonzero(group)
        if picked.size == 0:
            continue
        try:
            stamps = pc.cast(pc.take(text, pa.array(picked)), pa.timestamp("ns", tz=tz))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # one odd cell: one by one
            continue
        ns = stamps.cast(pa.int64()).to_numpy(zero_copy_only=False)
        ms[rows[picked]], sub[rows[picked]] = np.divmod(ns, 1_000_000)
        ok[rows[picked]] = True
        left[picked] = False
    picked = np.flatnonzero(left)
    for i, value in zip(picked.tolist(), pc.take(text, pa.array(picked)).to_pylist(), strict=True):
        parts = iso_parts(value)
        if parts is not None:
            ms[rows[i]], sub[rows[i]] = parts
            ok[rows[i]] = True


def _int_epochs(values: np.ndarray, valid: np.ndarray, unit: str):
    """(ms, ns within the ms, ok) of integer epochs in ``unit``; ``auto``: each value's
    unit by magnitude (``inputs.EPOCH_BANDS``), values that fit no band are not ok."""
    ms, sub = np.zeros(values.size, np.int64), np.zeros(values.size, np.int64)
    ok = np.zeros(values.size, bool)
    bands = EPOCH_BANDS if unit == "auto" else ((unit, 0.0, np.inf),)
    magnitude = np.abs(values.astype(np.float64))
    for name, lo, hi in bands:
        band = valid & (magnitude >= lo) & (magnitude < hi)
        if name == "s":  # s -> ms must stay inside int64
            band &= magnitude < 2.0**63 / 1000
        ms[band], sub[band] = _epoch_parts(values[band], name)
        ok |= band
    return ms, sub, ok


def _epoch_parts(values: np.ndarray, unit: str) -> tuple[np.ndarray, np.ndarray]:
    """Integer epochs in ``unit`` as (ms floored, ns within the ms), exactly."""
    num, den = UNIT_TO_MS[unit]
    if den == 1:
        return values * num, np.zeros(values.shape, np.int64)
    ms, rest = np.divmod(values, den)
    return ms, rest * (1_000_000 // den)


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
