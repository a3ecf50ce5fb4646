"""Hostile bar files: every case gives the correct rows, or one clear line and
exit status 2 -- never a traceback, never a wrong time.

The reader cases call ``io.readers.read_bars`` directly (no numba); the CLI cases run
``atc_stream.app.cli.main`` in this process for the exit status and the one-line message.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from atc_stream.core.timetext import iso_parts, parse_time_column, text_to_ms
from atc_stream.io import readers
from atc_stream.io.readers import BadRows, InputError, infer_interval, iter_bar_batches, read_bars

T0 = 1_700_000_040_000  # a whole minute, epoch ms


def write(tmp_path: Path, text: str | bytes, name: str = "bars.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def rows(table) -> list[tuple]:
    return list(
        zip(table.symbols.tolist(), table.times.tolist(), table.closes.tolist(), strict=True)
    )


def test_the_rows_shown_in_full_are_the_first_of_the_files_whatever_their_reason(tmp_path):
    # one batch checks a reason at a time: its bad times (lines 40-46) are found before
    # its bad closes (lines 3 and 5), which come first in the file and in the report
    lines = [f"A,{T0 + 60_000 * i},{i + 1}" for i in range(60)]
    for i in range(38, 45):
        lines[i] = f"A,not a time,{i + 1}"
    lines[1], lines[3] = f"A,{T0 + 60_000},x", f"A,{T0 + 180_000},"
    path = write(tmp_path, "symbol,time,close\n" + "\n".join(lines) + "\n", "a.csv")
    table = read_bars(path)
    assert table.bad_rows.counts == {"bad_time": 7, "bad_close": 2}
    assert table.bad_rows.examples == [
        "a.csv:3: bad_close: 'x'", "a.csv:5: bad_close: ''",
        "a.csv:40: bad_time: 'not a time'", "a.csv:41: bad_time: 'not a time'",
        "a.csv:42: bad_time: 'not a time'",
    ]  # fmt: skip
    assert table.bad_rows.lines()[-1] == "... and 4 more"
    # files in the order read: a later file's line 1 comes after an earlier file's line 9
    bad = BadRows()
    for where in ("a.csv:9", "a.csv:3", "b.csv:1", "b.csv:2", "a.csv:5", "b.csv:3", "a.csv:4"):
        bad.add(where, "bad_close", "''")
    first = ("a.csv:3", "a.csv:4", "a.csv:5", "a.csv:9", "b.csv:1")
    assert bad.examples == [f"{where}: bad_close: ''" for where in first]
    assert bad.total == 7


# -- times ---------------------------------------------------------------------------------


def test_one_iso_time_among_integers_is_parsed_per_cell(tmp_path):
    path = write(
        tmp_path, f"symbol,time,close\nA,{T0},1\nA,2023-11-14T22:15:00Z,2\nA,{T0 + 120_000},3\n"
    )
    table = read_bars(path)
    assert table.times.tolist() == [T0, T0 + 60_000, T0 + 120_000]
    assert table.bad_rows.total == 0


def test_whole_number_times_written_as_decimals_are_those_integers(tmp_path):
    """``1700000000.0``: a float column as pandas writes it, read as Parquet's whole
    floats are; a time with a fraction stays a bad row, alone."""
    seconds = T0 // 1000
    whole = "".join(f"A,{seconds + 60 * i}.0,{i + 1}\n" for i in range(3))
    table = read_bars(write(tmp_path, "symbol,time,close\n" + whole))
    assert table.times.tolist() == [T0, T0 + 60_000, T0 + 120_000]
    assert table.bad_rows.total == 0
    mixed = f"symbol,time,close\nA,{seconds}.00,1\nA,{seconds + 60}.5,2\nA,{seconds + 120},3\n"
    table = read_bars(write(tmp_path, mixed))
    assert table.times.tolist() == [T0, T0 + 120_000]
    assert table.bad_rows.counts == {"bad_time": 1}
    assert text_to_ms(f"{seconds}.0", "s") == text_to_ms(f"{seconds}", "s") == T0  # one cell
    assert text_to_ms(f"{seconds}.5", "s") is None


def test_iso_with_offset_and_without_zone(tmp_path):
    text = "symbol,time,close\nA,2023-11-14 23:15:00+01:00,1\nA,2023-11-14T22:15:00.5,2\n"
    table = read_bars(write(tmp_path, text))
    assert table.times.tolist() == [T0 + 60_000, T0 + 60_500]


def test_one_empty_time_rejects_only_its_row(tmp_path):
    body = "".join(f"A,{T0 + 60_000 * i},{i + 1}\n" for i in range(299))
    path = write(tmp_path, "symbol,time,close\nA,,7\n" + body)
    table = read_bars(path)
    assert len(table) == 299
    assert table.times.tolist() == [T0 + 60_000 * i for i in range(299)]
    assert table.bad_rows.counts == {"bad_time": 1}
    assert table.bad_rows.examples == ["bars.csv:2: bad_time: ''"]


@pytest.mark.parametrize(
    ("value", "unit", "expected"),
    [
        (T0 // 1000, "auto", T0),  # epoch seconds are seconds, not 1970 milliseconds
        (T0, "auto", T0),
        (T0 * 1000 + 999, "auto", T0),  # microseconds, floored to ms
        (T0 * 1_000_000 + 5, "auto", T0),  # nanoseconds
        (T0 // 1000, "s", T0),
        (T0, "ms", T0),
    ],
)
def test_time_units(tmp_path, value, unit, expected):
    table = read_bars(write(tmp_path, f"symbol,time,close\nA,{value},1\n"), time_unit=unit)
    assert table.times.tolist() == [expected]


def test_integers_beyond_int64_are_bad_times(tmp_path):
    path = write(tmp_path, f"symbol,time,close\nA,{T0},2\nA,99999999999999999999,3\n")
    table = read_bars(path)
    assert table.times.tolist() == [T0]
    assert table.bad_rows.examples == ["bars.csv:3: bad_time: '99999999999999999999'"]


def test_a_column_of_integers_in_different_units_is_refused(tmp_path):
    path = write(tmp_path, f"symbol,time,close\nA,12345,1\nA,{T0},2\n")
    with pytest.raises(InputError) as info:
        read_bars(path)
    message = str(info.value)
    assert "12345 (bars.csv:2: no unit) and 1700000040000 (bars.csv:3: ms)" in message
    assert message.endswith("pass --time-unit s, ms, us or ns") and "\n" not in message
    assert read_bars(path, time_unit="ms").times.tolist() == [12345, T0]  # a given unit


def test_the_unit_is_decided_from_the_whole_column_across_batches(tmp_path):
    seconds = T0 // 1000
    body = "".join(f"A,{seconds + 60 * i},1\n" for i in range(200_000))  # several blocks
    path = write(tmp_path, "symbol,time,close\n" + body + f"A,{T0 + 10**12},1\n")
    with pytest.raises(InputError, match=r"\(bars.csv:200002: ms\)"):
        read_bars(path)


def test_epoch_milliseconds_from_zero_keep_every_row(tmp_path):
    text = "symbol,time,close\n" + "".join(f"A,{60_000 * i},{i + 1}\n" for i in range(50))
    table = read_bars(write(tmp_path, text))
    assert table.times.tolist() == [60_000 * i for i in range(50)]
    assert table.bad_rows.total == 0


@pytest.mark.parametrize(
    "cell", ["2024-W01-1", "2024-061", "20240301T1230", "2024-03-01T12:30.5", "12:30", "1e12"]
)
def test_time_text_outside_the_strict_forms_is_a_bad_time(tmp_path, cell):
    table = read_bars(write(tmp_path, f"symbol,time,close\nA,{T0},1\nA,{cell},2\n"))
    assert table.times.tolist() == [T0]
    assert table.bad_rows.examples == [f"bars.csv:3: bad_time: {cell!r}"]


CELLS = [
    "2024-03-01", "2024-03-01T12:30", "2024-03-01 12:30:05", "2024-03-01T12:30:05.123456789",
    "2024-03-01T12:30:05,5Z", "2024-03-01T12:30:05.1234567891z", "2024-03-01T12:30:05+02:00",
    "2024-03-01T12:30:05-0530", "2024-03-01T23:30+05", "2024-02-29", "2024-02-30", "2023-02-29",
    "0000-01-01", "0001-01-01", "9999-12-31T23:59:59.999999999Z", "1969-12-31T23:59:59.9995Z",
    "2024-03-01T24:00", "2024-03-01T12:60", "2024-03-01T12:30:60", "2024-03-01T12:30+24:00",
    "2024-13-01", "2024-00-10", "2024-03-01T12:30Z+01:00", "2024-W01-1",
]  # fmt: skip


def test_one_cell_and_a_column_accept_the_same_text_with_the_same_result():
    ms, sub, ok = parse_time_column(pa.array(CELLS))
    for cell, got_ms, got_sub, got_ok in zip(CELLS, ms, sub, ok, strict=True):
        want = iso_parts(cell)
        assert (want is not None) == got_ok, cell
        if want is not None:
            assert want == (got_ms, got_sub), cell
            assert text_to_ms(cell) == got_ms, cell
    epoch, one_ms = datetime(1970, 1, 1, tzinfo=timezone.utc), timedelta(milliseconds=1)
    for cell in filter(iso_parts, CELLS):  # Python's ISO parser agrees where it takes it
        try:
            moment = datetime.fromisoformat(cell.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            continue
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        assert iso_parts(cell)[0] == (moment - epoch) // one_ms, cell


def test_columns_of_mixed_forms_and_lengths_parse_like_each_cell_alone():
    rng = np.random.default_rng(7)
    dates = ["2024-03-01", "2000-02-29", "2100-02-29", "1969-12-31", "2023-04-31", "0001-01-01"]
    clocks = ["", "T12:30", " 23:59", "T12:30:05", "T00:00:00.5", "T00:00:00,1234567891",
              "T23:59:59.999999", "T24:00", "T12:30:60"]  # fmt: skip
    zones = ["", "Z", "z", "+02:00", "-05:30", "+0200", "-05", "+24:00", "-00:60", "+1"]
    for size in (1, 7, 2000):
        cells = [
            str(rng.choice(dates)) + str(rng.choice(clocks)) + str(rng.choice(zones))
            for _ in range(size)
        ]
        ms, sub, ok = parse_time_column(pa.array(cells))
        got = [(int(m), int(s)) if o else None for m, s, o in zip(ms, sub, ok, strict=True)]
        assert got == [iso_parts(cell) for cell in cells]


def test_interval_is_inferred_from_the_spacing(tmp_path):
    day = 86_400_000
    text = "symbol,time,close\n" + "".join(f"A,{T0 + day * i},{i + 1}\n" for i in range(5))
    assert infer_interval(read_bars(write(tmp_path, text))) == "1d"


# -- cells and lines -------------------------------------------------------------------------


def test_bad_cells_are_counted_with_their_lines(tmp_path):
    text = (
        "symbol,time,close\n"
        f"A,{T0},1\n"
        f",{T0 + 60_000},2\n"  # empty symbol
        f"A,{T0 + 120_000},1_0\n"  # Python's int()/float() would take this
        f"A,{T0 + 180_000},abc\n"
        f"A,{T0 + 240_000},0x10\n"
        f"A,{T0 + 300_000},2,extra\n"  # wrong number of columns
        f"A,{T0 + 360_000},3\n"
    )
    table = read_bars(write(tmp_path, text))
    assert rows(table) == [("A", T0, 1.0), ("A", T0 + 360_000, 3.0)]
    assert table.bad_rows.counts == {
        "empty_symbol": 1, "bad_close": 3, "wrong_columns": 1,
    }  # fmt: skip
    assert "bars.csv:3: empty_symbol: ''" in table.bad_rows.examples
    assert "bars.csv:4: bad_close: '1_0'" in table.bad_rows.examples
    assert "bars.csv:7: wrong_columns: 4 columns, expected 3" in table.bad_rows.examples


@pytest.mark.parametrize("text_path", [False, True], ids=["typed", "text"])
def test_a_close_beyond_the_largest_float_is_a_bad_close_with_its_line(tmp_path, text_path):
    text = f"symbol,time,close\nA,{T0},1\nA,{T0 + 60_000},1e999\nA,{T0 + 120_000},-1E400\n"
    bad = BadRows()
    batches = list(iter_bar_batches(write(tmp_path, text), bad=bad, _text_path=text_path))
    assert [b.closes.tolist() for b in batches] == [[1.0]]
    assert bad.counts == {"bad_close": 2}
    assert bad.examples == ["bars.csv:3: bad_close: '1e999'", "bars.csv:4: bad_close: '-1E400'"]


def test_a_column_that_is_not_read_is_never_parsed(tmp_path, monkeypatch):
    """Columns beside the ones read (a volume, or the opens when only closes are read)
    may hold anything, in any block: every row is still read."""
    monkeypatch.setattr(readers, "BLOCK_BYTES", 256)  # the odd cells in a later block
    lines = [f"A,{T0 + 60_000 * i},{i + 1},{i + 1},7" for i in range(100)]
    lines[80] = f"A,{T0 + 60_000 * 80},1.2.3,81,x"
    table = read_bars(write(tmp_path, "symbol,time,open,close,volume\n" + "\n".join(lines)))
    assert rows(table) == [("A", T0 + 60_000 * i, float(i + 1)) for i in range(100)]
    assert table.bad_rows.total == 0
    no_symbol = "time,open,close\n" + "\n".join(line[2:-2] for line in lines)
    table = read_bars(write(tmp_path, no_symbol, "B.csv"))
    assert rows(table) == [("B", T0 + 60_000 * i, float(i + 1)) for i in range(100)]


def test_bom_blank_lines_and_trailing_blank_lines(tmp_path):
    text = f"\ufeffsymbol,time,close\nA,{T0},1\n\nA,{T0 + 60_000},2\n\n\n"
    table = read_bars(write(tmp_path, text))
    assert rows(table) == [("A", T0, 1.0), ("A", T0 + 60_000, 2.0)]
    assert table.bad_rows.total == 0


def test_line_numbers_stay_right_after_skipped_lines(tmp_path):
    text = f"symbol,time,close\nA,{T0},1,x\n\nA,{T0 + 60_000},2\nA,bad,3\n"
    table = read_bars(write(tmp_path, text))
    assert "bars.csv:5: bad_time: 'bad'" in table.bad_rows.examples


def test_a_cell_that_is_not_utf8_rejects_its_row_only(tmp_path):
    """A bad byte in a data row (a symbol, a close; in the first read block or a later
    one) rejects that row with its line; the rows before and after it are read, and a
    bad byte in a column that is not read changes nothing."""
    lines = [f"A,{T0 + 60_000 * i},{i + 1},note".encode() for i in range(120_000)]
    lines[1] = lines[1].replace(b"A,", b"A\xffB,", 1)  # line 3: the symbol
    lines[5] = lines[5].replace(b",6,", b",\xe96,", 1)  # line 7: the close (Latin-1)
    lines[100_000] = lines[100_000].replace(b"A,", b"\xe2\x82A,", 1)  # a later block
    lines[110_000] = lines[110_000].replace(b"note", b"n\xf6te", 1)  # a column not read
    path = write(tmp_path, b"symbol,time,close,note\n" + b"\n".join(lines) + b"\n")
    table = read_bars(path)
    kept = [i for i in range(120_000) if i not in (1, 5, 100_000)]
    assert rows(table) == [("A", T0 + 60_000 * i, float(i + 1)) for i in kept]
    assert table.bad_rows.counts == {"bad_utf8": 3}
    assert table.bad_rows.examples == [
        "bars.csv:3: bad_utf8: symbol: b'A\\xffB' (byte 0xff at offset 1)",
        "bars.csv:7: bad_utf8: close: b'\\xe96' (byte 0xe9 at offset 0)",
        "bars.csv:100002: bad_utf8: symbol: b'\\xe2\\x82A' (byte 0xe2 at offset 0)",
    ]


def test_oversized_field_rejects_its_row(tmp_path):
    text = f"symbol,time,close\nA,{T0},1\nA,{T0 + 60_000},{'9' * 200_000}\nA,{T0 + 120_000},3\n"
    table = read_bars(write(tmp_path, text))
    assert rows(table) == [("A", T0, 1.0), ("A", T0 + 120_000, 3.0)]
    assert table.bad_rows.counts == {"oversized_field": 1}


# -- unreadable files: one line ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (f'symbol,time,close\nA,{T0},1\nB,"5,3\nC,{T0},4\n', "unterminated quote"),
        (b"symbol,time,close\nA,1700000000000,1\nB,17\xff00,2,9\n", "is not UTF-8 text"),
        ("sym,t,c\nA,1,2\n", "no column 'time'"),
        ("", "cannot read CSV"),
    ],
    ids=["unterminated-quote", "encoding", "wrong-header", "empty"],
)
def test_unreadable_damage_raises_one_line(tmp_path, content, needle):
    with pytest.raises(InputError) as info:
        read_bars(write(tmp_path, content))
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_parquet_and_directories(tmp_path):
    pq.write_table(
        pa.table(
            {"symbol": ["A", "A", ""], "time": [T0, T0 + 60_000, T0], "close": [1.0, 2.0, 3.0]}
        ),
        tmp_path / "a.parquet",
    )
    per = tmp_path / "per"
    per.mkdir()
    stamps = pa.array([T0, T0 + 60_000], pa.timestamp("ms", tz="UTC"))
    pq.write_table(pa.table({"time": stamps, "close": [5.0, 6.0]}), per / "B.parquet")
    table = read_bars(tmp_path / "a.parquet")
    assert rows(table) == [("A", T0, 1.0), ("A", T0 + 60_000, 2.0)]
    assert table.bad_rows.counts == {"empty_symbol": 1}
    assert rows(read_bars(per)) == [("B", T0, 5.0), ("B", T0 + 60_000, 6.0)]
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(InputError, match="cannot read Parquet"):
        read_bars(tmp_path / "broken.parquet")


# -- the CLI: one line, exit 2 ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--backend", "gpu"], "'gpu' is not one of"),
        (["--warmup", "-5"], "--warmup"),
        (["-o", "out.txt"], "cannot tell the output format"),
        (["--interval", "1m"], "--interval 1m does not match the bars, which are 1d apart"),
        (["--strict"], "rejected rows"),
    ],
)
def test_cli_errors_are_one_line_with_exit_2(tmp_path, run_main, extra, needle):
    day = 86_400_000
    text = "symbol,time,close\n" + "".join(f"A,{T0 + day * i},{i + 1}\n" for i in range(5))
    path = write(tmp_path, text + "A,oops,1\n")
    code, err = run_main(["replay", str(path), "--no-progress", *extra])
    assert code == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("atc-stream: error:") and needle in last, err


def test_cli_missing_file_and_unterminated_quote(tmp_path, run_main):
    code, err = run_main(["replay", str(tmp_path / "nope.csv"), "--no-progress"])
    assert (
        code == 2
        and err.strip() == f"atc-stream: error: bar file '{tmp_path / 'nope.csv'}' does not exist"
    )
    path = write(tmp_path, f'symbol,time,close\nA,{T0},1\nB,"5,3\n')
    code, err = run_main(["replay", str(path), "--no-progress"])
    assert code == 2 and err.strip().count("\n") == 0 and "unterminated quote" in err


def test_output_by_extension(tmp_path, run_main):
    import json

    text = "symbol,time,close\n" + "".join(f"A,{T0 + 60_000 * i},{i + 1}\n" for i in range(3))
    path = write(tmp_path, text)
    for name in ("o.jsonl", "o.csv", "o.parquet"):
        code, err = run_main(["replay", str(path), "--no-progress", "-o", str(tmp_path / name)])
        assert code == 0, err
    jsonl = [json.loads(line) for line in open(tmp_path / "o.jsonl")]
    csv_lines = open(tmp_path / "o.csv").read().splitlines()
    parquet = pq.read_table(tmp_path / "o.parquet").to_pylist()
    from atc_stream.core.schema import COLUMNS

    assert list(jsonl[0]) == list(COLUMNS)
    assert csv_lines[0].split(",") == list(COLUMNS)
    assert [r["time"] for r in jsonl] == [T0, T0 + 60_000, T0 + 120_000]
    assert [int(line.split(",")[3]) for line in csv_lines[1:]] == [r["time"] for r in jsonl]
    assert [r["close"] for r in parquet] == [r["close"] for r in jsonl]
    assert {r["interval"] for r in jsonl} == {"1m"}


def test_a_nul_in_a_symbol_is_refused_never_merged_into_another(tmp_path):
    """NumPy's str arrays drop trailing NULs: "AB\\0" must not become "AB" (its bars
    would land in AB's series). Files reject the row; the Python API raises."""
    import numpy as np

    from atc_stream import Engine
    from atc_stream.io.tick_reader import load_ticks, ticks_from_arrays

    csv = (
        f"symbol,time,close\nAB,{T0},1\nAB\x00,{T0 + 60_000},9\nAB,{T0 + 60_000},2\nA\x00B,{T0},7\n"
    )
    table = read_bars(write(tmp_path, csv))
    assert rows(table) == [("AB", T0, 1.0), ("AB", T0 + 60_000, 2.0)]
    assert table.bad_rows.counts == {"bad_symbol": 2}
    assert "bars.csv:3: bad_symbol: 'AB\\x00'" in table.bad_rows.examples

    ticks_csv = f"time,symbol,price,size\n{T0},AB,1.5,1\n{T0 + 1},AB\x00,9.5,1\n"
    ticks = load_ticks(write(tmp_path, ticks_csv, "ticks.csv"))
    assert ticks.names == ["AB"] and ticks.prices.tolist() == [1.5]
    assert ticks.rejected == {"bad_symbol": 1}
    in_memory = ticks_from_arrays(
        np.array([T0, T0 + 1, T0 + 2]), ["AB", "AB\x00", "C"], [1.0, 2.0, 3.0], [1, 1, 1]
    )
    assert in_memory.names == ["AB", "C"] and +in_memory.rejected == {"bad_symbol": 1}
    assert in_memory.prices.tolist() == [1.0, 3.0]

    engine = Engine(backend="cpu")
    with pytest.raises(ValueError, match="without NUL"):
        engine.add_symbol("AB\x00")
    history = {"AB": (np.array([T0, T0 + 60_000]), np.array([1.0, 2.0]))}
    engine.warmup({**history, "AB\x00": history["AB"]})  # the rest still applies
    assert engine.symbols == ["AB"] and engine.rejections == {"bad_history": 1}
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame(
        {"symbol": ["AB", "AB\x00"], "time": [T0, T0 + 60_000], "close": [1.0, 2.0]}
    )
    with pytest.raises(ValueError, match="NUL"):
        engine.warmup(frame)


# -- pyarrow's threads ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        f"symbol,time,close\nA,{T0},1\nA,{T0 + 60_000},2\n".encode(),
        f"symbol,time,close\nA,{T0},1,9\n".encode(),
        f"symbol,time,close\nA\xff,{T0},1,9\n".encode("latin-1"),
        f'symbol,time,close\nA,{T0},1\n"B,{T0},1\nA,{T0 + 60_000},2\n'.encode(),
    ],
    ids=["good", "wrong_cells", "wrong_cells_not_utf8", "unterminated_quote"],
)
def test_a_read_returns_only_once_pyarrow_has_let_go_of_its_row_handler(
    tmp_path, reads_let_go_of_their_handler, text
):
    """An Arrow thread holding a Python object at interpreter exit aborts the process."""
    import atc_stream.io.readers as readers

    path = write(tmp_path, text)
    reads_let_go_of_their_handler(readers, lambda: read_bars(path))
