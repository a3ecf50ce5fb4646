"""read_ohlc against a plain reference on shuffled files, and OhlcTable's symbol slices."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atc_stream.io.ohlc import read_ohlc

MINUTE = 60_000


def _rows(draw_symbols, times, seed):
    """Bars of ``draw_symbols`` at ``times`` (repeats allowed), prices a function of the row."""
    rng = np.random.default_rng(seed)
    close = np.round(rng.uniform(10, 20, len(times)), 2)
    return {
        "symbol": list(draw_symbols),
        "time": np.asarray(times, np.int64),
        "open": close,
        "high": close + 1.0,
        "low": close - 1.0,
        "close": close,
    }


def _reference(files: list[dict]):
    """Rows sorted by (symbol, time), the first of a repeated (symbol, time) kept in file
    order (files in order), and the (file number, line) of each left-out repeat."""
    rows = [
        (sym, int(t), o, h, lo, c, number, line)
        for number, f in enumerate(files)
        for line, (sym, t, o, h, lo, c) in enumerate(
            zip(f["symbol"], f["time"], f["open"], f["high"], f["low"], f["close"], strict=True),
            start=2,
        )
    ]
    rows.sort(key=lambda r: (r[0], r[1]))  # stable: file order within a (symbol, time)
    kept, repeats, seen = [], [], set()
    for r in rows:
        if (r[0], r[1]) in seen:
            repeats.append((r[6], r[7]))
        else:
            seen.add((r[0], r[1]))
            kept.append(r)
    return kept, repeats


@settings(max_examples=40, deadline=None)
@given(
    files=st.lists(
        st.lists(
            st.tuples(st.sampled_from(["B", "A", "C1", "AA"]), st.integers(0, 6)),
            min_size=1,
            max_size=25,
        ),  # fmt: skip
        min_size=1,
        max_size=3,
    ),
    suffix=st.sampled_from([".csv", ".parquet"]),
)
def test_read_ohlc_sorts_and_drops_repeats_like_a_plain_sort(tmp_path_factory, files, suffix):
    folder = tmp_path_factory.mktemp("bars")
    frames = []
    for number, rows in enumerate(files):
        frame = _rows([s for s, _ in rows], [t * MINUTE for _, t in rows], seed=number)
        frames.append(frame)
        table = pa.table(frame)
        path = folder / f"part{number}{suffix}"
        if suffix == ".csv":
            pacsv.write_csv(table, path)
        else:
            pq.write_table(table, path)
    source = folder if len(files) > 1 else next(folder.iterdir())
    got = read_ohlc(source, time_unit="ms")
    kept, repeats = _reference(frames)
    assert got.symbols.tolist() == [r[0] for r in kept]
    assert got.times.tolist() == [r[1] for r in kept]
    for k, name in enumerate(("open", "high", "low", "close"), start=2):
        assert getattr(got, name).tolist() == [r[k] for r in kept]
    assert got.bad_rows.counts.get("duplicate_time", 0) == len(repeats)
    assert got.symbol_names == sorted({r[0] for r in kept})
    # each symbol's rows are one slice, found without a pass over the names
    for k, name in enumerate(got.symbol_names):
        rows = slice(got.starts[k], got.starts[k + 1])
        assert set(got.symbols[rows].tolist()) == {name}
        assert got.codes[rows].tolist() == [k] * (rows.stop - rows.start)
    assert got.starts[-1] == len(got)


@pytest.fixture
def table(tmp_path):
    frame = _rows(["C", "A", "B", "A", "C", "B", "D"], [1, 1, 1, 2, 2, 2, 1], seed=1)
    path = tmp_path / "bars.parquet"
    pq.write_table(pa.table(frame), path)
    return read_ohlc(path, time_unit="ms")


def test_of_symbols_takes_whole_symbols_in_name_order(table):
    assert table.symbol_names == ["A", "B", "C", "D"]
    neighbours = table.of_symbols(["C", "B"])
    assert neighbours.symbols.tolist() == ["B", "B", "C", "C"]
    assert np.shares_memory(neighbours.times, table.times)  # a view: no copy of the rows
    apart = table.of_symbols(["D", "A"])
    assert apart.symbols.tolist() == ["A", "A", "D"]
    assert apart.times.tolist() == [1, 2, 1]
    assert len(table.of_symbols([])) == 0
    with pytest.raises(KeyError):
        table.of_symbols(["E"])


def test_an_empty_table_has_no_symbols(tmp_path):
    path = tmp_path / "bars.csv"
    path.write_text("symbol,time,open,high,low,close\nA,2024-01-01,1,2,0.5,nan\n")
    empty = read_ohlc(path)
    assert len(empty) == 0 and empty.symbol_names == [] and empty.starts.tolist() == [0]
