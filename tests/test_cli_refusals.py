"""User errors of ``replay``, ``demo`` and ``plot`` that must end in one line and exit
status 2 before any damage: outputs over inputs, unwritable paths, undecodable or
misquoted files; and the counts and messages a run reports about rejected rows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from atc_stream.connectors.replay.player import BarPlayer, ReplaySummary
from atc_stream.state.snapshot import SnapshotWarning

T0 = 1_700_000_000_000


def bars_text(n: int = 200) -> str:
    return "symbol,time,close\n" + "".join(
        f"AAA,{T0 + 60_000 * i},{100 + i * 0.1:.2f}\n" for i in range(n)
    )


@pytest.fixture
def bars(tmp_path) -> Path:
    path = tmp_path / "g.csv"
    path.write_text(bars_text())
    return path


def one_error_line(code, err: str, needle: str) -> None:
    assert code == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("atc-stream: error:") and needle in last, err


@pytest.mark.parametrize(
    "option, hint",
    [(["--empty", "carry"], "--empty"), (["--price-column", "p"], "--price-column/--size-column")],
)
def test_tick_options_on_a_bar_file_are_refused(bars, run_main, option, hint):
    """An option that only --ticks reads is refused, not silently ignored."""
    code, err = run_main(["replay", str(bars), *option, "--no-progress"])
    assert code == 2, err
    assert f"Invalid value for {hint}: applies to --ticks only" in err, err


@pytest.mark.parametrize(
    "option, hint",
    [
        (["--interval", "7x"], "--interval"),
        (["--interval", "1M"], "--interval"),
        (["--interval", "1m", "--empty", "fill"], "--empty"),
    ],
)
def test_bad_tick_options_are_refused_before_the_tick_file_is_read(
    tmp_path, run_main, option, hint
):
    ticks = tmp_path / "t.csv"
    ticks.write_text(f"symbol,time,price,size\nA,{T0},100,1\nA,{T0 + 1000},-5,1\n")
    out = str(tmp_path / "o.jsonl")
    code, err = run_main(["replay", "--ticks", str(ticks), *option, "-o", out])
    assert code == 2, err
    assert err.strip().splitlines() == [err.strip()], err  # no bad-row report before it
    assert f"Invalid value for {hint}" in err, err


# -- outputs that would destroy an input ---------------------------------------------------


def test_an_output_over_its_csv_input_is_refused_and_the_input_kept(bars, run_main):
    before = bars.read_bytes()
    code, err = run_main(["replay", str(bars), "-o", str(bars), "--no-progress"])
    one_error_line(code, err, "is the input BARS")
    assert bars.read_bytes() == before


def test_an_output_over_its_parquet_input_is_refused_and_the_input_kept(tmp_path, run_main):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"symbol": ["A", "A"], "time": [T0, T0 + 60_000], "close": [1.0, 2.0]}),
                   path)  # fmt: skip
    code, err = run_main(["replay", str(path), "-o", str(path), "--no-progress"])
    one_error_line(code, err, "is the input BARS")
    assert path.is_file() and pq.read_table(path).num_rows == 2


PAPER = ["--strategy", "direction=long_only"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["{dir}", "-o", "{dir}/out.jsonl"], "is inside the input BARS"),
        (["{csv}", "-o", "{tmp}"], "contains the input BARS"),
        (["--ticks", "{csv}", "-o", "{csv}"], "is the input --ticks"),
        (["{csv}", "-o", "{tmp}/s.jsonl", *PAPER, "--trades", "{tmp}/s.jsonl"], "is the output -o"),
        (
            ["{csv}", "-o", "{tmp}/s.parquet", *PAPER, "--positions", "{tmp}/s.parquet/p.jsonl"],
            "is inside the output -o",
        ),  # fmt: skip
        (["{csv}", "-o", "{tmp}/s.jsonl", *PAPER, "--trades", "{csv}"], "is the input BARS"),
        (
            [
                "{csv}",
                "-o",
                "{tmp}/s.jsonl",
                *PAPER,
                "--trades",
                "{tmp}/t.parquet",
                "--snapshot-dir",
                "{tmp}/t.parquet",
            ],
            "--snapshot-dir {tmp}/t.parquet is the output --trades",
        ),  # fmt: skip
        (
            ["{csv}", "-o", "{tmp}/s.parquet", "--snapshot-dir", "{tmp}/s.parquet/snaps"],
            "--snapshot-dir {tmp}/s.parquet/snaps is inside the output -o",
        ),
    ],
    ids=[
        "into-input-dir",
        "dir-holding-input",
        "ticks",
        "trades-is-o",
        "inside-o",
        "trades-input",
        "snapshots-are-trades",
        "snapshots-inside-o",
    ],  # fmt: skip
)
def test_overlapping_inputs_and_outputs_are_refused(tmp_path, run_main, args, needle):
    folder = tmp_path / "dir"
    folder.mkdir()
    (folder / "AAA.csv").write_text(bars_text(20))
    csv = tmp_path / "in.csv"
    csv.write_text(bars_text(20))
    names = {"dir": folder, "csv": csv, "tmp": tmp_path}
    code, err = run_main(["replay", *[a.format(**names) for a in args], "--no-progress"])
    one_error_line(code, err, needle.format(**names))
    assert csv.read_text() == bars_text(20)
    assert sorted(p.name for p in folder.iterdir()) == ["AAA.csv"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "in.csv"]  # nothing made


def test_a_snapshot_directory_may_hold_the_outputs(tmp_path, run_main):
    """Only a snapshot directory that is an output, or inside a Parquet one, is refused:
    one directory for the signals and the snapshots is a usual layout."""
    csv = tmp_path / "in.csv"
    csv.write_text(bars_text(20))
    code, err = run_main(["replay", str(csv), "-o", str(tmp_path / "s.jsonl"),
                          "--snapshot-dir", str(tmp_path), "--no-progress"])  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "s.jsonl").stat().st_size and list(tmp_path.glob("snapshot-*"))


@pytest.mark.parametrize(
    ("command", "args", "needle"),
    [
        ("demo", ["-o", "{tmp}/d.parquet", "--snapshot-dir", "{tmp}/d.parquet"],
         "--snapshot-dir {tmp}/d.parquet is the output -o"),
        ("live", ["--symbols", "BTCUSDT", "-o", "{tmp}/s.jsonl", *PAPER, "--trades",
                  "{tmp}/s.jsonl"], "--trades {tmp}/s.jsonl is the output -o"),
        ("live", ["--symbols", "BTCUSDT", "-o", "{tmp}/s.jsonl", "--snapshot-dir",
                  "{tmp}/s.jsonl"], "--snapshot-dir {tmp}/s.jsonl is the output -o"),
    ],
    ids=["demo-snapshots-are-o", "live-trades-are-o", "live-snapshots-are-o"],
)  # fmt: skip
def test_demo_and_live_refuse_overlapping_outputs_before_anything_runs(
    tmp_path, run_main, command, args, needle
):
    code, err = run_main([command, *[a.format(tmp=tmp_path) for a in args]])
    one_error_line(code, err, needle.format(tmp=tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_a_parquet_output_directory_with_foreign_files_is_refused(bars, tmp_path, run_main):
    out = tmp_path / "out.parquet"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, err = run_main(["replay", str(bars), "-o", str(out), "--no-progress"])
    one_error_line(code, err, "did not write ('notes.txt')")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_parquet_output_over_a_file_not_ours_is_refused_before_input_is_read(tmp_path, run_main):
    mine = tmp_path / "mydata.parquet"
    pq.write_table(pa.table({"x": [1.0, 2.0]}), mine)
    before = mine.read_bytes()
    empty = tmp_path / "empty.csv"  # unreadable: the output's error must come first
    empty.write_text("")
    code, err = run_main(["replay", str(empty), "-o", str(mine), "--no-progress"])
    one_error_line(code, err, "is a file atc-stream did not write")
    assert mine.read_bytes() == before


def test_an_older_runs_single_file_parquet_output_is_replaced(bars, tmp_path, run_main):
    out = tmp_path / "out.parquet"
    table = pa.table({"x": [1.0]}).replace_schema_metadata({"atc_stream.schema_version": "1"})
    pq.write_table(table, out)
    code, err = run_main(["replay", str(bars), "-o", str(out), "--no-progress"])
    assert code == 0, err
    assert out.is_dir() and pq.read_table(out).num_rows == 200


# -- unusable paths ----------------------------------------------------------------------


def test_an_empty_output_path_is_one_line(bars, run_main):
    code, err = run_main(["replay", str(bars), "-o", "", "--no-progress"])
    one_error_line(code, err, "-o is an empty path: give a file name, or - for stdout")


def test_a_directory_of_subdirectories_says_they_are_not_read(tmp_path, run_main):
    hive = tmp_path / "hive"
    (hive / "symbol=AAA").mkdir(parents=True)
    (hive / "symbol=AAA" / "part-0.parquet").write_bytes(b"")
    code, err = run_main(["replay", str(hive), "-o", str(tmp_path / "o.jsonl")])
    one_error_line(code, err, "has no .csv or .parquet files (its subdirectories are not read)")


@pytest.mark.parametrize(
    ("command", "target", "needle"),
    [
        ("replay", "missing/x.jsonl", "cannot write"),
        ("replay", "a_dir.jsonl", "Is a directory"),
        ("replay", "a_file.txt/x.parquet", "cannot write"),
        ("demo", "missing/x.jsonl", "cannot write"),
        ("demo", "a_file.txt/x.csv", "cannot write"),
    ],
)
def test_unwritable_outputs_are_one_line(bars, tmp_path, run_main, command, target, needle):
    (tmp_path / "a_dir.jsonl").mkdir()
    (tmp_path / "a_file.txt").write_text("x")
    source = [str(bars)] if command == "replay" else ["--symbols", "2", "--bars", "30"]
    args = [command, *source, "-o", str(tmp_path / target), "--no-progress", "--warmup", "5"]
    code, err = run_main(args)
    one_error_line(code, err, needle)


@pytest.mark.parametrize(
    ("option", "target", "needle"),
    [
        ("-o", "signals.txt", "cannot tell the output format of"),
        ("-o", "missing/signals.jsonl", "no such directory"),
        ("-o", "a_file.txt/signals.parquet", "not a directory"),
        ("--trades", "missing/trades.jsonl", "no such directory"),
    ],
)
def test_an_output_that_cannot_be_written_is_refused_before_the_input_is_read(
    tmp_path, run_main, option, target, needle
):
    (tmp_path / "a_file.txt").write_text("x")
    unread = tmp_path / "empty.csv"  # reading it would stop the run: it is not read
    unread.write_text("")
    args = ["replay", str(unread), option, str(tmp_path / target), "--no-progress"]
    if option != "-o":
        args += ["-o", str(tmp_path / "signals.jsonl"), "--strategy", "stop=0.02"]
    code, err = run_main(args)
    one_error_line(code, err, needle)
    assert "Empty CSV" not in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file.txt", "empty.csv"]


def test_a_snapshot_dir_that_is_a_file_is_one_line(bars, tmp_path, run_main):
    args = ["replay", str(bars), "-o", str(tmp_path / "o.jsonl"), "--snapshot-dir", str(bars)]
    code, err = run_main([*args, "--no-progress"])
    one_error_line(code, err, "as a snapshot directory: it is a file; give a directory")


@pytest.mark.parametrize("option", ["--symbols", "--bars"])
@pytest.mark.parametrize("value", ["0", "-5"])
def test_demo_sizes_below_one_are_usage_errors(run_main, option, value):
    code, err = run_main(["demo", option, value, "--no-progress"])
    one_error_line(code, err, option)


@pytest.mark.parametrize(
    "args, said",
    [
        (["demo", "--symbols", "0"], "--symbols: must be at least 1"),
        (["demo", "--bars", "x"], "--bars: not an integer"),
        (["replay", "{bars}", "--time-unit", "h"], "--time-unit: 'h' is not one of"),
    ],
)
def test_usage_errors_say_it_plainly(bars, run_main, args, said):
    code, err = run_main([a.format(bars=bars) for a in args])
    one_error_line(code, err, said)
    assert "Input should" not in err and "Value error" not in err


def test_a_negative_demo_seed_is_a_usage_error(run_main):
    code, err = run_main(["demo", "--seed", "-1", "--bars", "50", "--no-progress"])
    one_error_line(code, err, "--seed")


def test_a_demo_data_set_larger_than_the_machine_is_refused_before_it_is_made(tmp_path, run_main):
    out = tmp_path / "d.jsonl"
    code, err = run_main(["demo", "--symbols", "1000000", "--bars", "1000000", "-o", str(out)])
    one_error_line(code, err, "GiB for the demo's data set")
    assert not out.exists()


def test_plot_refuses_an_unknown_image_format_and_lists_the_known(bars, tmp_path, run_main):
    signals = tmp_path / "s.jsonl"
    assert run_main(["replay", str(bars), "-o", str(signals), "--no-progress"])[0] == 0
    code, err = run_main(["plot", str(signals), "--symbol", "AAA", "-o", str(tmp_path / "c.txt")])
    one_error_line(code, err, ".png")
    assert not (tmp_path / "c.txt").exists()
    code, err = run_main(["plot", str(signals), "--params-id", "3", "-o", str(tmp_path / "c.png")])
    one_error_line(code, err, "(have [0])")


# -- files that cannot be read -----------------------------------------------------------


@pytest.mark.parametrize("ticks", [False, True])
@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"sym\xe9bol,time,close\nAAA,1700000000000,1\n", "header line is not UTF-8"),
        (bars_text(5).encode("utf-16"), "is UTF-16 text; save it as UTF-8"),
    ],
    ids=["latin-1", "utf-16"],
)
def test_files_that_are_not_utf8_are_one_line(tmp_path, run_main, ticks, content, needle):
    path = tmp_path / "b.csv"
    path.write_bytes(content)
    source = ["--ticks", str(path)] if ticks else [str(path)]
    code, err = run_main(["replay", *source, "--no-progress"])
    one_error_line(code, err, needle)


@pytest.mark.parametrize(
    ("header", "row", "ticks", "needle"),
    [
        ("symbol,time,close,close", "AAA,{t},1,2", False, "column 'close' 2 times"),
        ("symbol,time,symbol,close", "AAA,{t},BBB,1", False, "column 'symbol' 2 times"),
        ("\ufefftime,close,time", "{t},1,{t}", False, "column 'time' 2 times"),
        ("symbol,time,price,size,price", "AAA,{t},1,1,2", True, "column 'price' 2 times"),
    ],
    ids=["close", "symbol", "time-after-a-bom", "tick-price"],
)
def test_a_column_the_reader_needs_named_twice_is_one_line(
    tmp_path, run_main, header, row, ticks, needle
):
    path = tmp_path / "b.csv"
    lines = [header] + [row.format(t=T0 + 60_000 * i) for i in range(5)]
    path.write_text("\r\n".join(lines) + "\r\n", encoding="utf-8")
    source = ["--ticks", str(path)] if ticks else [str(path)]
    code, err = run_main(["replay", *source, "--interval", "1m", "--no-progress"])
    one_error_line(code, err, needle)


def test_a_column_it_does_not_read_may_be_named_twice(tmp_path, run_main):
    path = tmp_path / "b.csv"
    text = "symbol,time,close,volume,volume\n" + "".join(
        f"AAA,{T0 + 60_000 * i},{100 + i},1,2\n" for i in range(5)
    )
    path.write_text(text)
    code, err = run_main(["replay", str(path), "--interval", "1m", "-o", str(tmp_path / "o.jsonl")])
    assert code == 0, err
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 5


@pytest.mark.parametrize("ticks", [False, True])
def test_a_row_of_too_many_cells_that_is_not_utf8_is_one_line_without_a_traceback(tmp_path, ticks):
    """pyarrow cannot hand such a row to the reader (making text of it fails, an exception
    it ignores and prints): one line and exit 2, with nothing printed before it."""
    header = "time,symbol,price,size" if ticks else "symbol,time,close"
    row = f"{T0},A\xff,1,1,1" if ticks else f"A\xff,{T0},1,9"
    path = tmp_path / "u.csv"
    path.write_bytes(f"{header}\n{row}\n".encode("latin-1"))
    source = ["--ticks", str(path)] if ticks else [str(path)]
    command = [sys.executable, "-m", "atc_stream", "replay", *source, "--no-progress"]
    proc = subprocess.run(command, capture_output=True, text=True)
    one_error_line(proc.returncode, proc.stderr, "a row with the wrong number of cells is not")
    assert proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize("row", [100, 193])
def test_an_unterminated_quote_in_the_last_column_stops_the_run(tmp_path, run_main, row):
    lines = bars_text().splitlines()
    symbol, when, close = lines[row - 1].split(",")
    lines[row - 1] = f'{symbol},{when},"{close}'
    path = tmp_path / "q.csv"
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "q.jsonl"
    code, err = run_main(["replay", str(path), "-o", str(out), "--no-progress"])
    one_error_line(code, err, f"q.csv:{row}: unterminated quote")


def test_an_unterminated_quote_in_the_last_tick_column_stops_the_run(tmp_path, run_main):
    rows = [f"{T0 + 1000 * i},AAA,{100 + i},1" for i in range(100)]
    rows[50] = f'{T0 + 50_000},AAA,150,"1'
    path = tmp_path / "t.csv"
    path.write_text("time,symbol,price,size\n" + "\n".join(rows) + "\n")
    code, err = run_main(["replay", "--ticks", str(path), "--no-progress"])
    one_error_line(code, err, "t.csv:52: unterminated quote")


def test_a_parquet_column_of_lists_is_one_line(tmp_path, run_main):
    path = tmp_path / "l.parquet"
    closes = pa.array([[1.0], [2.0]], pa.list_(pa.float64()))
    pq.write_table(pa.table({"symbol": ["A", "A"], "time": [T0, T0 + 60_000], "close": closes}),
                   path)  # fmt: skip
    code, err = run_main(["replay", str(path), "--no-progress"])
    one_error_line(code, err, "column 'close' is of type list<")


# -- rejected rows -----------------------------------------------------------------------


@pytest.mark.parametrize("unit", [[], ["--time-unit", "ms"]], ids=["auto", "ms"])
def test_a_negative_integer_time_is_a_bad_row(tmp_path, run_main, unit):
    lines = bars_text().splitlines()
    lines[101] = lines[101].replace(f",{T0 + 60_000 * 100},", ",-5,")
    path = tmp_path / "t.csv"
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "t.jsonl"
    code, err = run_main(["replay", str(path), "-o", str(out), "--no-progress", *unit])
    assert code == 0, err
    assert "t.csv:102: bad_time: '-5'" in err
    times = [json.loads(line)["time"] for line in out.read_text().splitlines()]
    assert len(times) == 199 and min(times) == T0


def test_the_summary_counts_the_readers_rejections(tmp_path, run_main):
    path = tmp_path / "b.csv"
    path.write_text(bars_text(20) + f"AAA,{T0 + 60_000 * 20},oops\n")
    code, err = run_main(["replay", str(path), "-o", str(tmp_path / "o.jsonl"), "--no-progress"])
    assert code == 0 and "rejected inputs  bad_close=1" in err, err


def test_strict_exits_2_on_engine_rejections_after_a_complete_output(tmp_path, run_main, caplog):
    lines = bars_text(60).splitlines()
    lines[11] = lines[11].rsplit(",", 1)[0] + ",-5"
    lines.append(lines[30])  # the same bar again, out of order
    path = tmp_path / "e.csv"
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "e.jsonl"
    code, err = run_main(["replay", str(path), "-o", str(out), "--no-progress", "--strict"])
    one_error_line(code, err, "duplicate_bar=1, non_positive_close=1")
    warned = caplog.text  # the engine's warnings, lines of the command on stderr
    assert "symbol 'AAA' time" in warned and "slot " not in warned
    assert len(out.read_text().splitlines()) == 59  # 61 rows, 2 rejected


def test_a_bar_row_that_is_not_utf8_is_a_rejected_row(tmp_path, run_main):
    lines = bars_text(60).encode().splitlines()
    lines[11] = lines[11].replace(b"AAA", b"AA\xffA")  # line 12
    path = tmp_path / "u.csv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "u.jsonl"
    code, err = run_main(["replay", str(path), "-o", str(out), "--no-progress"])
    assert code == 0, err
    assert "u.csv:12: bad_utf8: symbol: b'AA\\xffA' (byte 0xff at offset 2)" in err
    assert "rejected inputs  bad_utf8=1" in err
    times = [json.loads(line)["time"] for line in out.read_text().splitlines()]
    assert times == [T0 + 60_000 * i for i in range(60) if i != 10]  # the rows around it apply
    code, err = run_main(["replay", str(path), "-o", str(out), "--no-progress", "--strict"])
    one_error_line(code, err, "1 rejected rows in")


def engine_rejections_file(tmp_path: Path) -> Path:
    """60 bars of AAA with a close <= 0 on line 12 and line 31's bar again on line 62."""
    lines = bars_text(60).splitlines()
    lines[11] = lines[11].rsplit(",", 1)[0] + ",-5"
    lines.append(lines[30])
    path = tmp_path / "e.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("warmup", ["0", "20"])
def test_engine_rejections_are_logged_with_file_and_line(tmp_path, run_main, caplog, warmup):
    path = engine_rejections_file(tmp_path)
    out = tmp_path / "e.jsonl"
    args = ["replay", str(path), "-o", str(out), "--no-progress", "--warmup", warmup]
    code, err = run_main([*args, "--strict"])
    negative = f"e.csv:12: symbol 'AAA' time {T0 + 60_000 * 10} close -5.0"
    repeated = f"e.csv:62: symbol 'AAA' time {T0 + 60_000 * 29} close 102.9"
    one_error_line(code, err, "the first: e.csv:12: non_positive_close: symbol 'AAA' time")
    assert f"rejected input (non_positive_close): {negative}" in caplog.text
    assert f"rejected input (duplicate_bar): {repeated}" in caplog.text
    assert caplog.text.count("rejected input") == 2  # the engine's own lines are not there too


def test_engine_rejections_in_a_directory_name_the_file_and_parquet_row(tmp_path, run_main, caplog):
    folder = tmp_path / "bars"
    folder.mkdir()
    times = [T0 + 60_000 * i for i in range(5)]
    pq.write_table(pa.table({"time": times, "close": [1.0, 2, 3, 4, 5]}), folder / "AAA.parquet")
    pq.write_table(pa.table({"time": times, "close": [1.0, 2, 0, 4, 5]}), folder / "BBB.parquet")
    code, err = run_main(["replay", str(folder), "-o", str(tmp_path / "o.jsonl"), "--no-progress"])
    assert code == 0 and "rejected inputs  non_positive_close=1" in err, err
    assert (
        f"rejected input (non_positive_close): BBB.parquet:row 3: symbol 'BBB' time {times[2]}"
        in caplog.text
    )


def test_a_damaged_only_snapshot_is_reported_once(bars, tmp_path, run_main, caplog):
    snaps = tmp_path / "snaps"
    args = ["replay", str(bars), "-o", str(tmp_path / "o.jsonl"), "--no-progress"]
    assert run_main([*args, "--snapshot-dir", str(snaps)])[0] == 0
    (snapshot,) = snaps.glob("*.atcsnap")
    data = bytearray(snapshot.read_bytes())
    data[100:107] = b"garbage"
    snapshot.write_bytes(bytes(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, err = run_main([*args, "--snapshot-dir", str(snaps), "--resume"])
    one_error_line(code, err, "no snapshot in")
    assert not [w for w in caught if issubclass(w.category, SnapshotWarning)]
    said = caplog.text + err  # logged warnings are lines of the command on stderr
    assert said.count(snapshot.stem) == 1 and "previous one" not in said


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_an_output_on_a_full_disk_is_one_line_and_exit_2(bars, tmp_path, run_main, suffix):
    out = tmp_path / f"full{suffix}"
    out.symlink_to("/dev/full")  # every write: ENOSPC
    code, err = run_main(["replay", str(bars), "-o", str(out), "--no-progress"])
    one_error_line(code, err, f"cannot write {out}: No space left on device")
    assert "Traceback" not in err


def test_an_output_that_is_a_hard_link_to_the_input_is_refused(bars, tmp_path, run_main):
    linked = tmp_path / "linked.csv"
    linked.hardlink_to(bars)
    before = bars.read_bytes()
    code, err = run_main(["replay", str(bars), "-o", str(linked), "--no-progress"])
    one_error_line(code, err, f"-o {linked} is the input BARS")
    assert bars.read_bytes() == before


def test_a_symlink_loop_is_one_line(bars, tmp_path, run_main):
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    for args in (["replay", str(tmp_path / "loop1")],
                 ["replay", str(bars), "-o", str(tmp_path / "loop1")]):  # fmt: skip
        code, err = run_main([*args, "--no-progress"])
        one_error_line(code, err, "loop1: Symlink loop")


def test_a_month_interval_on_minute_bars_is_refused(bars, tmp_path, run_main):
    code, err = run_main(["replay", str(bars), "-o", str(tmp_path / "o.jsonl"),
                          "--interval", "1M", "--no-progress"])  # fmt: skip
    one_error_line(code, err, "--interval 1M does not match the bars, which are 1m apart")


def test_resume_from_another_directory_finds_its_output(tmp_path, run_main, monkeypatch):
    """A relative ``-o``, resumed from a mid-run snapshot in another directory with the
    same file spelled another way: the file is cut back and completed there."""
    from atc_stream.state.snapshot_stores import DirectorySnapshotStore

    work = tmp_path / "work"
    work.mkdir()
    times = T0 + 60_000 * np.arange(50_000)
    bars = tmp_path / "bars.parquet"
    pq.write_table(pa.table({"symbol": np.repeat(["A", "B", "C"], 50_000), "time":
                             np.tile(times, 3), "close": np.tile(100 + np.sin(times / 9e6), 3)}),
                   bars)  # fmt: skip
    monkeypatch.chdir(work)
    args = ["replay", str(bars), "--no-progress", "--snapshot-dir", "snaps"]
    assert run_main([*args, "--snapshot-every", "1000", "-o", "out.jsonl"])[0] == 0
    whole = (work / "out.jsonl").read_bytes()
    store = DirectorySnapshotStore(work / "snaps")
    while len(store.list()) > 1:  # back to the first snapshot, as if killed after it
        store.delete(store.list()[-1])
    assert store.latest().header.source_offsets["file"]["output"]["bytes"] < len(whole)
    monkeypatch.chdir(tmp_path)
    code, err = run_main(["replay", str(bars), "--no-progress", "--snapshot-dir",
                          "work/snaps", "--resume", "-o", "work/out.jsonl"])  # fmt: skip
    assert code == 0 and "another file" not in err, err
    assert (work / "out.jsonl").read_bytes() == whole


def test_a_paced_wait_too_long_for_one_sleep_is_slept_in_slices(monkeypatch):
    from atc_stream.connectors.replay import player as player_module

    slept = []

    def sleep(seconds):
        slept.append(seconds)
        if len(slept) == 3:
            raise StopIteration  # (the run would sleep for eons)

    monkeypatch.setattr(player_module.time, "sleep", sleep)
    bar_player = BarPlayer.__new__(BarPlayer)
    bar_player._clock_origin = (0, player_module.time.perf_counter())
    with pytest.raises(StopIteration):
        bar_player._pace(60_000, 1e-300)
    assert slept == [player_module.MAX_SLEEP_S] * 3


def test_the_summary_says_how_many_of_the_bars_played_were_rejected(tmp_path, run_main):
    parts = tmp_path / "parts"
    parts.mkdir()
    rows = bars_text(200).splitlines()
    (parts / "a.csv").write_text("\n".join(rows[:101]) + "\n")  # header + bars 0-99
    (parts / "b.csv").write_text("\n".join([rows[0], *rows[90:]]) + "\n")  # 89-199: 11 again
    code, err = run_main(["replay", str(parts), "-o", str(tmp_path / "o.jsonl"), "--no-progress"])
    assert code == 0, err
    assert "211 stepped, 11 of them rejected (below)" in err, err
    assert "duplicate_bar=11" in err, err
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 200


def test_rows_left_out_when_read_are_not_counted_among_the_bars_played(tmp_path, run_main):
    lines = bars_text(20).splitlines()
    lines[5] = lines[5].rsplit(",", 1)[0] + ",oops"  # left out by the reader
    lines[8] = lines[8].rsplit(",", 1)[0] + ",-3"  # read, then rejected by the engine
    path = tmp_path / "m.csv"
    path.write_text("\n".join(lines) + "\n")
    code, err = run_main(["replay", str(path), "-o", str(tmp_path / "o.jsonl"), "--no-progress"])
    assert code == 0, err
    assert "0 warmup + 19 stepped, 1 of them rejected; 1 row left out when read (below)" in err
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 18


@pytest.mark.parametrize("ticks", [False, True], ids=["bars", "ticks"])
def test_a_file_whose_every_row_is_bad_is_one_line_and_exit_2(tmp_path, run_main, ticks):
    path = tmp_path / "bad.csv"
    size = ",1" if ticks else ""  # the tick file's size column
    header = "symbol,time,price,size" if ticks else "symbol,time,close"
    path.write_text(f"{header}\nAAA,yesterday,1{size}\nAAA,{T0},x{size}\n")
    out = tmp_path / "o.jsonl"
    args = ["--ticks", str(path), "--interval", "1m"] if ticks else [str(path)]
    code, err = run_main(["replay", *args, "-o", str(out), "--no-progress"])
    what = "ticks" if ticks else "rows"
    reason = "bad_price" if ticks else "bad_close"
    one_error_line(code, err, f"no usable {what}: all 2 were rejected ({reason}=1, bad_time=1)")
    assert not out.exists()  # refused before the output was opened


def test_a_replay_whose_every_bar_the_engine_rejects_ends_with_exit_2(tmp_path, run_main):
    path = tmp_path / "neg.csv"
    path.write_text(f"symbol,time,close\nAAA,{T0},-1\nAAA,{T0 + 60_000},0\n")
    out = tmp_path / "o.jsonl"
    code, err = run_main(["replay", str(path), "-o", str(out), "--no-progress"])
    assert code == 2, err
    assert "rejected inputs  non_positive_close=2" in err  # the summary first
    last = err.strip().splitlines()[-1]
    assert last.startswith("atc-stream: error: ") and "no bar applied" in last, err
    assert out.read_text() == ""


def test_a_file_of_a_header_and_no_rows_is_a_run_of_no_bars(tmp_path, run_main):
    path = tmp_path / "h.csv"
    path.write_text("symbol,time,close\n")
    code, err = run_main(["replay", str(path), "-o", str(tmp_path / "o.jsonl"), "--no-progress"])
    assert code == 0 and "0 warmup + 0 stepped\n" in err, err


def test_a_summary_of_no_time_shows_no_rate():
    lines = ReplaySummary(step_bars=0, seconds=0.0).lines()
    assert not any("inf" in line for line in lines)


def test_sigint_during_a_paced_replay_says_it_stopped(bars, tmp_path):
    out = tmp_path / "o.jsonl"
    command = [sys.executable, "-m", "atc_stream", "replay", str(bars), "-o", str(out)]
    proc = subprocess.Popen([*command, "--speed", "60", "--no-progress"],
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not (out.exists() and out.stat().st_size):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "replay stopped early" in err and "replay done" not in err and "inf" not in err


def test_sigint_during_a_bar_interval_wait_stops_at_once_and_resumes_exactly(bars, tmp_path):
    """At real speed a 1-minute bar waits a minute for the next: a Ctrl-C then ends the
    run within a fraction of a second, with its snapshot, not after the wait."""
    out, straight = tmp_path / "o.jsonl", tmp_path / "straight.jsonl"
    snapshots = ["--snapshot-dir", str(tmp_path / "snaps"), "--no-progress"]
    command = [sys.executable, "-m", "atc_stream", "replay", str(bars)]
    every = ["--snapshot-every", "1"]  # the output is flushed with the first bar's snapshot
    proc = subprocess.Popen([*command, "-o", str(out), "--speed", "1", *every, *snapshots],
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not (out.exists() and out.stat().st_size):  # the first bar, then a minute's wait
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGINT)
    asked = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert time.monotonic() - asked < 10, err
    resumed = subprocess.run([*command, "-o", str(out), *snapshots, "--resume"],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    subprocess.run([*command, "-o", str(straight), "--no-progress"], check=True, timeout=300)
    assert out.read_bytes() == straight.read_bytes()


def test_a_symbol_for_a_file_with_a_symbol_column_is_refused(bars, tmp_path, run_main):
    out = tmp_path / "o.jsonl"
    code, err = run_main(["replay", str(bars), "--symbol", "ZZ", "-o", str(out), "--no-progress"])
    one_error_line(code, err, "g.csv has a symbol column 'symbol': a symbol given for the file")
    no_column = tmp_path / "AAA.csv"
    no_column.write_text(
        "time,close\n" + "".join(f"{T0 + 60_000 * i},{100 + i}\n" for i in range(5))
    )
    code, err = run_main(["replay", str(no_column), "--symbol", "ZZ", "-o", str(out)])
    assert code == 0, err
    assert {json.loads(line)["symbol"] for line in out.read_text().splitlines()} == {"ZZ"}


def test_a_resume_onto_a_cut_output_says_what_to_do(bars, tmp_path, run_main):
    out = tmp_path / "o.jsonl"
    snapshots = ["--snapshot-dir", str(tmp_path / "snaps"), "--no-progress"]
    assert run_main(["replay", str(bars), "-o", str(out), *snapshots])[0] == 0
    out.write_bytes(out.read_bytes()[:100])
    code, err = run_main(["replay", str(bars), "-o", str(out), *snapshots, "--resume"])
    one_error_line(code, err, "cannot resume losslessly: resume with a new -o file or start fresh")


def test_a_resume_to_stdout_says_rows_after_the_snapshot_come_again(bars, tmp_path, run_main):
    snapshots = ["--snapshot-dir", str(tmp_path / "snaps"), "--no-progress"]
    code, _ = run_main(["replay", str(bars), "-o", str(tmp_path / "o.jsonl"), *snapshots])
    assert code == 0
    code, err = run_main(["replay", str(bars), "-o", "-", *snapshots, "--resume"])
    assert code == 0, err
    assert "note: resuming to stdout: rows written after the snapshot" in err


def test_a_reader_that_closes_stdout_ends_the_run_quietly(tmp_path):
    """`atc-stream replay ... | head -1`: status 141 (as a command killed by SIGPIPE), and
    not a word on stderr after the summary's absence."""
    path = tmp_path / "g.csv"
    path.write_text(bars_text(5000))
    proc = subprocess.Popen(
        [sys.executable, "-m", "atc_stream", "replay", str(path), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    assert first.startswith(b'{"symbol":"AAA"')
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 141, err
    assert "error" not in err and "Traceback" not in err and "Exception" not in err, err


@pytest.mark.parametrize(
    "command",
    [
        ["replay", "x.csv", "--redis", "redis://127.0.0.1:1"],
        ["cluster", "--shards", "2", "--redis", "redis://127.0.0.1:1"],
        ["sweep", "x.csv", "--grid", "g.toml", "--ray-address", "auto"],
    ],
)
def test_a_bad_interval_is_refused_as_the_option_is_read(command, run_main):
    # before any file or Redis server is looked at (the Redis URL here answers nothing),
    # and before the job's own checks (sweep's job would name --ray-address first)
    code, err = run_main([*command, "--interval", "banana"])
    one_error_line(code, err, "Invalid value for --interval")
    assert "banana" in err and "Redis" not in err and "x.csv" not in err


def test_an_option_is_named_one_way_whoever_refuses_its_value():
    from atc_stream.app.console import plain_usage_error as _plain

    assert _plain("Invalid value for '-o' / '--output': no") == (
        "Invalid value for -o / --output: no"
    )
    assert _plain("Invalid value for '--interval': got 'x'") == (
        "Invalid value for --interval: got 'x'"
    )
