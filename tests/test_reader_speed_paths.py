"""The bar reader's typed reading (numbers read as numbers, each symbol name handled once,
Parquet names as the file's dictionary) gives exactly what its text reading gives: the
same batches, symbol codes, values to the bit, bad rows and messages."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from atc_stream.core.timetext import MAX_TIME_MS
from atc_stream.io import readers
from atc_stream.io.cells import NumberCells, TextCells, column_cells
from atc_stream.io.readers import PRICE_NAMES, BadRows, InputError, SymbolCodes, iter_bar_batches
from atc_stream.io.rebatch import whole_batches

T0 = 1_700_000_040_000  # a whole minute, epoch ms
COLUMNS = ("symbol", "time", "open", "high", "low", "close")


def outcome(path: Path, text_path: bool, **options) -> dict:
    """Everything a read gives: its batches (as bytes, so that values compare to the bit),
    its bad rows, the symbol codes, and the error that ended it, if one did."""
    bad, symbols = BadRows(), SymbolCodes()
    batches, error = [], None
    try:
        for b in iter_bar_batches(path, bad=bad, symbols=symbols, _text_path=text_path, **options):
            ohlc = None if b.ohlc is None else [(p.dtype.str, p.tobytes()) for p in b.ohlc]
            batches.append(
                [(a.dtype.str, a.tobytes()) for a in (b.codes, b.times, b.closes, b.lines)]
                + [ohlc, b.path]
            )
    except InputError as exc:
        error = str(exc)
    return {
        "batches": batches,
        "counts": dict(bad.counts),
        "examples": bad.examples,
        "lines": bad.lines(),
        "codes": list(symbols.codes.items()),
        "error": error,
    }


def assert_same(path: Path, **options) -> dict:
    typed = outcome(path, False, **options)
    text = outcome(path, True, **options)
    for key in text:  # one key at a time: a failure names what differs
        assert typed[key] == text[key], key
    return typed


def write_parquet(path: Path, table: pa.Table, row_group_size: int | None = None) -> Path:
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


# -- one file of every hostile cell ------------------------------------------------------

#: New names mid-file, out of sorted order; " A " and "A" are one name once trimmed.
SYMBOLS = ["M", "K", "M", "Z", None, "B", " A ", "", "K", "  ", "A", "X\x00Y", "Q", "C", "B"]


def hostile_columns(n: int) -> dict[str, list]:
    """Columns of ``n`` rows holding every kind of bad cell, mostly good bars."""
    symbols = [SYMBOLS[i % len(SYMBOLS)] for i in range(n)]
    times: list[int | None] = [T0 + 60_000 * i for i in range(n)]
    close: list[float | None] = [100.0 + 0.25 * (i % 17) for i in range(n)]
    specials = {
        3: ("close", np.nan), 5: ("close", np.inf), 8: ("close", -np.inf), 9: ("close", None),
        11: ("close", -2.5), 13: ("close", 0.0), 16: ("close", 1e300), 19: ("close", 5e-324),
        22: ("close", 0.1 + 0.2), 24: ("close", -0.0),
    }  # fmt: skip
    for i, (_, value) in specials.items():
        if i < n:
            close[i] = value
    for i, value in ((2, None), (6, -5), (7, 0), (10, MAX_TIME_MS + 1), (12, 10**18)):
        if i < n:
            times[i] = value
    opens = [c if c is None or not np.isfinite(c) else c for c in close]
    highs = [None if c is None else (c + 1.0 if np.isfinite(c) else c) for c in close]
    lows = [None if c is None else (c - 1.0 if np.isfinite(c) else c) for c in close]
    if n > 14:
        lows[14] = np.nan  # a bad low beside a good close
        highs[15] = (close[15] or 0.0) - 5.0  # a high under its close: bad_ohlc
    blank = 17  # every cell empty: skipped without a report
    if n > blank:
        symbols[blank] = times[blank] = opens[blank] = highs[blank] = lows[blank] = None
        close[blank] = None
    return {"symbol": symbols, "time": times, "open": opens, "high": highs, "low": lows,
            "close": close}  # fmt: skip


TIME_TYPES = {
    "int64": pa.int64(),
    "float64": pa.float64(),
    "uint64": pa.uint64(),
    "timestamp": pa.timestamp("ms"),
}
PRICE_TYPES = {
    "float64": pa.float64(),
    "float32": pa.float32(),
    "int64": pa.int64(),
    "int32": pa.int32(),
    "uint64": pa.uint64(),
}


def hostile_table(n: int, price_type: pa.DataType, time_type: pa.DataType) -> pa.Table:
    columns = hostile_columns(n)
    arrays = {"symbol": pa.array(columns["symbol"], pa.string())}
    times = columns["time"]
    if pa.types.is_floating(time_type):
        arrays["time"] = pa.array([None if t is None else float(t) for t in times], time_type)
    elif pa.types.is_unsigned_integer(time_type):
        arrays["time"] = pa.array([None if t is None or t < 0 else t for t in times], time_type)
    else:
        arrays["time"] = pa.array(times, time_type)
    for name in PRICE_NAMES + ("close",):
        values = columns[name]
        if pa.types.is_integer(price_type):
            lowest = 0 if pa.types.is_unsigned_integer(price_type) else -(2**31)
            values = [
                None if v is None or not np.isfinite(v) else min(max(lowest, round(v)), 2**31)
                for v in values
            ]
        arrays[name] = pa.array(values).cast(price_type, safe=False)
    return pa.table(arrays)


@pytest.mark.parametrize("price_type", sorted(PRICE_TYPES))
@pytest.mark.parametrize("time_type", sorted(TIME_TYPES))
def test_parquet_typed_cells_read_as_their_text(tmp_path, monkeypatch, price_type, time_type):
    table = hostile_table(90, PRICE_TYPES[price_type], TIME_TYPES[time_type])
    path = write_parquet(tmp_path / "bars.parquet", table, row_group_size=11)
    monkeypatch.setattr(readers, "PARQUET_BATCH_ROWS", 16)  # batches across row groups
    got = assert_same(path, ohlc_columns=PRICE_NAMES, time_unit="ms")
    assert got["error"] is None and got["batches"] and got["examples"]
    assert {"bad_close", "bad_time", "empty_symbol", "bad_symbol"} <= set(got["counts"])
    assert "time_out_of_range" in got["counts"] or time_type == "timestamp"
    assert_same(path, time_unit="ms")  # the close alone
    auto = assert_same(path)  # ms and far later integers: of two units
    assert time_type == "timestamp" or "different epoch units" in auto["error"]


def test_parquet_of_more_than_one_batch_keeps_the_batches_rows(tmp_path):
    """Batches of the default size, row groups of another: the codes of new names follow
    the batches' rows, which the file's dictionary pieces must not change."""
    n = 3 * readers.PARQUET_BATCH_ROWS + 123
    rng = np.random.default_rng(3)
    names = np.array(["N", "C", "H", "A", "Y", "E", "K", "B"])
    first = np.minimum(rng.integers(0, 8, n), np.arange(n) // 20_000)  # new names mid-file
    close = np.round(rng.uniform(1, 100, n), 2)
    close[rng.integers(0, n, 50)] = np.nan
    table = pa.table({
        "symbol": names[first], "time": T0 + 60_000 * np.arange(n, dtype=np.int64),
        "close": close,
    })  # fmt: skip
    path = write_parquet(tmp_path / "bars.parquet", table, row_group_size=50_000)
    got = assert_same(path)
    assert len(got["batches"]) == 4 and got["counts"] == {"bad_close": 50}


@pytest.mark.parametrize("words", [False, True], ids=["string", "dictionary"])
def test_parquet_batches_hold_the_rows_of_the_files_plain_batches(tmp_path, monkeypatch, words):
    """Read as the file's dictionary or not, a batch holds the rows pyarrow's plain
    reading of the file gives it (a dictionary column comes in pieces per row group)."""
    n = 100
    symbols = pa.array(["B", "A", "D", "C"] * (n // 4))
    table = pa.table({
        "symbol": symbols.dictionary_encode() if words else symbols,
        "time": T0 + 60_000 * np.arange(n), "close": np.ones(n),
    })  # fmt: skip
    path = write_parquet(tmp_path / "bars.parquet", table, row_group_size=30)
    monkeypatch.setattr(readers, "PARQUET_BATCH_ROWS", 16)
    plain = [b.num_rows for b in pq.ParquetFile(path).iter_batches(batch_size=16)]
    for text_path in (False, True):
        got = [len(b) for b in iter_bar_batches(path, _text_path=text_path)]
        assert got == plain
    assert assert_same(path)["codes"] == [("A", 0), ("B", 1), ("C", 2), ("D", 3)]


def test_parquet_symbol_columns_of_other_types(tmp_path):
    n = 40
    symbols = [SYMBOLS[i % len(SYMBOLS)] for i in range(n)]
    base = {"time": pa.array(T0 + 60_000 * np.arange(n)), "close": pa.array(np.ones(n))}
    forms = {
        "dictionary": pa.array(symbols).dictionary_encode(),
        "large_string": pa.array(symbols, pa.large_string()),
        "int": pa.array([None if s is None else i % 5 for i, s in enumerate(symbols)]),
    }
    for name, column in forms.items():
        path = write_parquet(tmp_path / f"{name}.parquet", pa.table({"symbol": column, **base}))
        assert assert_same(path)["batches"], name


def test_parquet_without_a_symbol_column_and_a_directory(tmp_path):
    n = 30
    table = hostile_table(n, pa.float64(), pa.int64()).drop_columns(["symbol"])
    write_parquet(tmp_path / "ZED.parquet", table, row_group_size=7)
    write_parquet(tmp_path / "ABC.parquet", table, row_group_size=4)
    assert assert_same(tmp_path, time_unit="ms")["codes"] == [("ABC", 0), ("ZED", 1)]
    one = assert_same(tmp_path / "ZED.parquet", symbol="  QQ ", time_unit="ms")
    assert one["codes"] == [("QQ", 0)]


def test_parquet_times_of_two_epoch_units_fail_alike(tmp_path):
    table = pa.table({"symbol": ["A", "A", "B"], "time": [T0, T0 // 1000, T0],
                      "close": [1.0, 2.0, 3.0]})  # fmt: skip
    got = assert_same(write_parquet(tmp_path / "bars.parquet", table))
    assert "different epoch units" in got["error"]


# -- CSV -----------------------------------------------------------------------------------


PRICE_TEXTS = ["1.5", " 2 ", "nan", "inf", "-inf", "1e999", "", "abc", "-3", "0", "+4.", ".5",
               "1e-400", "-0", "1.2.3", "e5", "1e", "--1", ".", "+", "1e+", "\u0661", "0x10",
               "1_0", "1E5", "-.5e-3"]  # fmt: skip
TIME_TEXTS = ["", "2023-11-14T22:15:00Z", "+1700000040000", " 1700000040000", "-5", "0",
              "00001700000040000", "17000000400000000000000", "1.7e12", "x",
              str(MAX_TIME_MS + 1)]  # fmt: skip


def csv_lines(n: int, hostile: range) -> list[str]:
    """Bar rows, the ones in ``hostile`` with bad or odd cells (the others plain)."""
    lines = ["symbol,time,open,high,low,close"]
    for i in range(n):
        symbol = SYMBOLS[i % len(SYMBOLS)] or "" if i in hostile else "ABCD"[i % 4]
        symbol = symbol.replace("\x00", "\\0") if i % 7 else symbol
        close = f"{100 + i % 13}.25"
        time = str(T0 + 60_000 * i)
        if i in hostile and i % 3 == 0:
            close = PRICE_TEXTS[i % len(PRICE_TEXTS)]
        if i in hostile and i % 4 == 1:
            time = TIME_TEXTS[i % len(TIME_TEXTS)]
        lines.append(f'"{symbol}",{time},{close},{close},{close},{close}')
        if i in hostile and i % 50 == 7:
            lines += [",,,,,", "A,1,2"]  # a blank row, a row with too few cells
    return lines


def test_csv_hostile_cells_read_alike(tmp_path, monkeypatch):
    path = tmp_path / "bars.csv"
    path.write_text("\n".join(csv_lines(900, range(300, 700))) + "\n")
    monkeypatch.setattr(readers, "BLOCK_BYTES", 512)  # many batches: plain ones, odd ones
    got = assert_same(path, ohlc_columns=PRICE_NAMES, time_unit="ms")
    assert len(got["batches"]) > 20 and got["examples"]
    reasons = {"bad_close", "bad_time", "empty_symbol", "bad_symbol", "wrong_columns",
               "time_out_of_range"}  # fmt: skip
    assert reasons <= set(got["counts"])
    closes_only = assert_same(path, time_unit="ms")  # "1.2.3" in the opens is not read
    assert closes_only["error"] is None and "bad_open" not in closes_only["counts"]
    assert "different epoch units" in assert_same(path, ohlc_columns=PRICE_NAMES)["error"]
    lines = csv_lines(300, range(0))
    path.write_text("\n".join(lines) + "\n")
    assert assert_same(path, ohlc_columns=PRICE_NAMES)["counts"] == {}
    for i, time in ((40, "17000000400000000000000"), (140, "1000000000000000000")):
        lines[i] = lines[i].replace(str(T0 + 60_000 * (i - 1)), time)  # digits, too many
    path.write_text("\n".join(lines) + "\n")
    got = assert_same(path, ohlc_columns=PRICE_NAMES, time_unit="ms")
    assert got["counts"] == {"bad_time": 1, "time_out_of_range": 1}


@pytest.mark.parametrize("cell", ['"A\nB"', '"A\rB"', '"1\n"'])
def test_csv_cell_over_two_lines_is_refused(tmp_path, cell):
    path = tmp_path / "bars.csv"
    path.write_text(f"symbol,time,close\nA,{T0},1\n{cell},{T0 + 60_000},2\nA,{T0 + 120_000},3\n")
    got = assert_same(path)
    assert "unterminated quote (the symbol field runs over the next lines" in got["error"]


def test_number_text_is_taken_at_once_only_where_the_pattern_takes_it():
    """On the bytes a cell of a batch cast at once may hold, Arrow's float parse takes
    exactly the pattern's numbers (one digit stands for all ten)."""
    import itertools
    import re

    from atc_stream.io.cells import _FLOAT_PATTERN, StringCells, parse_closes

    pattern = re.compile(_FLOAT_PATTERN)
    texts = ["".join(t) for k in range(1, 5) for t in itertools.product("09.eE+-", repeat=k)]
    for text in texts:
        try:
            pa.array([text]).cast(pa.float64())
            taken = True
        except pa.ArrowInvalid:
            taken = False
        assert taken == bool(pattern.match(text)), text
        got, want = StringCells(pa.array([text])).numbers(), parse_closes(pa.array([text]))
        assert got[1].tolist() == want[1].tolist() and got[0].tobytes() == want[0].tobytes()
    column = pa.array(texts)
    got, want = StringCells(column).numbers(), parse_closes(column)
    assert got[1].tolist() == want[1].tolist() and got[0].tobytes() == want[0].tobytes()


# -- any cells -----------------------------------------------------------------------------

_FLOAT_EDGES = [0.0, -0.0, 5e-324, 0.1, 1e16, 123.456, 1e300, -1e300, 2.0**53 + 2]


def price_values(kind: str):
    if kind in ("float64", "float32"):
        width = 64 if kind == "float64" else 32
        edges = _FLOAT_EDGES if width == 64 else [float(np.float32(v)) for v in _FLOAT_EDGES[:6]]
        finite = st.floats(width=width, allow_nan=True, allow_infinity=True)
        return st.one_of(st.none(), finite, st.sampled_from(edges))
    if kind == "uint64":
        return st.one_of(st.none(), st.integers(0, 2**64 - 1), st.integers(0, 300))
    bits = 64 if kind == "int64" else 32
    return st.one_of(st.none(), st.integers(-(2**(bits - 1)), 2**(bits - 1) - 1),
                     st.integers(-5, 300))  # fmt: skip


TIME_VALUES = st.one_of(
    st.none(),
    st.integers(0, 10**6).map(lambda k: T0 + 60_000 * k),
    st.sampled_from([-1, 0, 7, MAX_TIME_MS, MAX_TIME_MS + 1, 1_700_000_040, 2**62]),
)
SYMBOL_VALUES = st.one_of(
    st.sampled_from(["B", "A", " A", "A ", "C", "", "  ", "D\x00", "zz", "Ä", "é ", "\t"]),
    st.none(),
    st.text(alphabet="ABCxyz \x00", max_size=4),
)


@st.composite
def bar_tables(draw):
    n = draw(st.integers(0, 40))
    kinds = {name: draw(st.sampled_from(sorted(PRICE_TYPES))) for name in ("open", "close")}
    kinds["high"] = kinds["low"] = draw(st.sampled_from(sorted(PRICE_TYPES)))
    columns = {
        "symbol": pa.array(draw(st.lists(SYMBOL_VALUES, min_size=n, max_size=n)), pa.string()),
        "time": pa.array(draw(st.lists(TIME_VALUES, min_size=n, max_size=n)), pa.int64()),
    }
    for name in ("open", "high", "low", "close"):
        values = draw(st.lists(price_values(kinds[name]), min_size=n, max_size=n))
        columns[name] = pa.array(values, PRICE_TYPES[kinds[name]])
    return pa.table(columns)


@given(
    table=bar_tables(),
    row_group=st.integers(1, 9),
    batch_rows=st.integers(1, 12),
    ohlc=st.booleans(),
)
def test_any_cells_read_alike(tmp_path_factory, table, row_group, batch_rows, ohlc):
    where = tmp_path_factory.mktemp("cells")
    options = {"ohlc_columns": PRICE_NAMES} if ohlc else {}
    parquet = write_parquet(where / "bars.parquet", table, row_group_size=row_group)
    with mock.patch.object(readers, "PARQUET_BATCH_ROWS", batch_rows):
        assert_same(parquet, **options)
    csv = where / "bars.csv"
    pcsv.write_csv(table, csv)
    with mock.patch.object(readers, "BLOCK_BYTES", 64 + 8 * batch_rows):
        assert_same(csv, **options)


# -- the parts -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind", ["float64", "float32", "int64", "int32", "int8", "uint64", "uint32", "uint8"]
)
def test_number_cells_give_the_numbers_and_text_of_their_arrow_text(kind):
    rng = np.random.default_rng(7)
    dtype = np.dtype(kind)
    size = 200_000
    raw = rng.integers(0, 256, size * dtype.itemsize, dtype=np.uint8).view(dtype)
    if dtype.kind == "f":
        edges = np.array([np.nan, np.inf, -np.inf, *_FLOAT_EDGES[:6]], dtype)
    else:
        edges = np.array([np.iinfo(dtype).min, np.iinfo(dtype).max, 0, 1], dtype)
    values = np.concatenate([raw, edges])
    mask = np.zeros(values.size, bool)
    mask[::97] = True
    column = pa.array(values, mask=mask)
    typed, text = column_cells(column), TextCells(column)
    assert isinstance(typed, NumberCells)
    got, want = typed.numbers(), text.numbers()
    assert got[1].tolist() == want[1].tolist()
    assert got[0].tobytes() == want[0].tobytes()  # every bit, NaN where not a number
    assert (typed.empty() == text.empty()).all()
    assert not typed.long(10).any() and not text.long(30).any()
    for i in [*np.flatnonzero(~want[1])[:50].tolist(), 0, 1, values.size - 1]:
        assert typed.shown(i) == text.shown(i)
        assert mask[i] or typed.size(i) == text.size(i)


def test_whole_batches_cut_pieces_into_batches_of_one_size():
    rng = np.random.default_rng(1)
    pieces, start = [], 0
    for size in rng.integers(0, 9, 40).tolist():
        names = pa.array([f"S{(start + k) // 13}" for k in range(size)]).dictionary_encode()
        pieces.append(pa.record_batch({"symbol": names, "row": np.arange(start, start + size)}))
        start += size
    batches = list(whole_batches(iter(pieces), 10))
    assert [b.num_rows for b in batches] == [10] * (start // 10) + (
        [start % 10] if start % 10 else []
    )
    rows = np.concatenate([b.column(1).to_numpy() for b in batches])
    assert rows.tolist() == list(range(start))
    symbols = [s for b in batches for s in b.column(0).to_pylist()]
    assert symbols == [f"S{k // 13}" for k in range(start)]
