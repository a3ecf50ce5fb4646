"""Streamed replay of bar files in memory bounded by streams: the file source
(two passes, external sort with spills for unsorted files) gives exactly the rows of the
in-memory table path, whatever the order of the file's rows.

The ``BarFileSource`` cases force tiny chunks and merge batches so that the external
sort spills many runs in a few milliseconds.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from atc_stream import ATCParams, Engine, Strategy
from atc_stream.connectors.replay.player import BarPlayer, TableBars, random_walk_table
from atc_stream.connectors.replay.stream import BarFileSource, merge_runs, whole_bar_times
from atc_stream.io.readers import BarTable, read_bars

MINUTE = 60_000


def bars_table() -> BarTable:
    """5 symbols of a random walk with the awkward cases: a symbol that starts late, one
    with fewer bars than the warmup, a duplicate bar time, a gap."""
    walk = random_walk_table(n_symbols=4, n_bars=160, seed=3)
    keep = ~((walk.symbols == "SYM002") & (walk.times < walk.times[0] + 40 * MINUTE))
    keep &= ~((walk.symbols == "SYM003") & (walk.times == walk.times[0] + 90 * MINUTE))
    symbols, times, closes = walk.symbols[keep], walk.times[keep], walk.closes[keep]
    short_times = walk.times[0] + MINUTE * np.arange(5, 12)
    dup = np.flatnonzero(symbols == "SYM001")[70]
    symbols = np.concatenate([symbols, np.full(7, "FEW", object), symbols[[dup]]])
    times = np.concatenate([times, short_times, times[[dup]]])
    # the duplicate has its twin's close, so that whichever comes first the rows agree
    closes = np.concatenate([closes, np.linspace(10, 11, 7), closes[[dup]]])
    order = np.lexsort((symbols.astype(str), times))  # time-major, symbols by name
    return BarTable(symbols[order].astype(object), times[order], closes[order])


def write_csv(path, table: BarTable, order=None) -> None:
    order = np.arange(len(table)) if order is None else order
    with open(path, "w") as f:
        f.write("symbol,time,close\n")
        for i in order:
            f.write(f"{table.symbols[i]},{table.times[i]},{float(table.closes[i])!r}\n")


def orders(table: BarTable) -> dict[str, np.ndarray]:
    """Row orders of one table: time-major, shuffled, one block per symbol, reversed."""
    rng = np.random.default_rng(5)
    blocks = np.lexsort((table.times, table.symbols.astype(str)))
    return {
        "sorted": np.arange(len(table)),
        "shuffled": rng.permutation(len(table)),
        "blocks": blocks,
        "reversed": np.arange(len(table))[::-1],
    }


def play(bars, warmup: int, applied_until=None):
    """Every output row of a replay as plain values (and the summary)."""
    engine = Engine([ATCParams(), ATCParams(long_threshold=0.2)], backend="cpu")
    results = []
    player = BarPlayer(engine, bars, warmup_bars=warmup, on_result=results.append)
    summary = player.run(applied_until)
    rows = [row for r in results for row in zip(*r.column_values(), strict=True)]
    return rows, summary, engine


@pytest.fixture(scope="module")
def table():
    return bars_table()


@pytest.mark.parametrize("warmup", [0, 9])
@pytest.mark.parametrize("name", ["sorted", "shuffled", "blocks", "reversed"])
def test_file_source_equals_the_in_memory_table(tmp_path, table, name, warmup):
    path = tmp_path / f"{name}.csv"
    write_csv(path, table, orders(table)[name])
    want, want_summary, _ = play(read_bars(path), warmup)
    source = BarFileSource(path, warmup_bars=warmup, chunk_rows=97, merge_rows=13)
    assert source.in_order == (name == "sorted")
    got, summary, _ = play(source, warmup)
    assert got == want
    assert (summary.warmup_bars, summary.step_bars) == (
        want_summary.warmup_bars, want_summary.step_bars,
    )  # fmt: skip
    assert summary.rejected == want_summary.rejected and summary.rejected == {"duplicate_bar": 1}
    spilled = source.rows - summary.warmup_bars  # the warmup bars are not spilled
    assert source.spilled_runs == (0 if name == "sorted" else -(-spilled // 97))


def ohlc_of(closes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(opens, highs, lows) of bars with ``closes``; equal closes give equal bars (so that
    a duplicate bar is the same whichever of the two comes first)."""
    opens = np.round(closes * (1 + 0.003 * np.sin(closes * 7)), 6)
    return opens, np.maximum(opens, closes) * 1.002, np.minimum(opens, closes) * 0.998


def play_trading(bars, warmup: int):
    """Every signal, position and trade row of a replay with strategies, as plain values."""
    strategies = [Strategy(stop=0.004), Strategy(direction="long_only", max_hold=5)]
    engine = Engine([ATCParams(), ATCParams(long_threshold=0.2)], backend="cpu",
                    strategies=strategies)  # fmt: skip
    results = []
    BarPlayer(engine, bars, warmup_bars=warmup, on_result=results.append).run()
    rows = []
    for r in results:
        rows += list(zip(*r.column_values(), strict=True))
        for columns in (r.position_columns(), r.trade_columns()):
            rows += list(zip(*(v.tolist() for v in columns.values()), strict=True))
    return rows, engine


@pytest.mark.parametrize("warmup", [0, 9])
@pytest.mark.parametrize("name", ["sorted", "shuffled", "blocks"])
def test_file_source_with_ohlc_equals_the_in_memory_table(tmp_path, table, name, warmup):
    """Open, high and low travel with the close through the scan, the warmup selection
    and the spilled sort: the strategies trade as on the table in memory."""
    order = orders(table)[name]
    opens, highs, lows = ohlc_of(table.closes)
    path = tmp_path / f"{name}.csv"
    with open(path, "w") as f:
        f.write("sym,t,c,o,hi,lo\n")
        for i in order:
            f.write(f"{table.symbols[i]},{table.times[i]},{float(table.closes[i])!r},"
                    f"{float(opens[i])!r},{float(highs[i])!r},{float(lows[i])!r}\n")  # fmt: skip
    in_file_order = BarTable(table.symbols[order], table.times[order], table.closes[order])
    want, want_engine = play_trading(
        TableBars(in_file_order, ohlc=(opens[order], highs[order], lows[order])), warmup
    )
    source = BarFileSource(
        path, symbol_column="sym", time_column="t", close_column="c",
        ohlc_columns=("o", "hi", "lo"), warmup_bars=warmup, chunk_rows=97, merge_rows=13,
    )  # fmt: skip
    got, engine = play_trading(source, warmup)
    assert (source.spilled_runs > 1) == (name != "sorted")
    assert got == want
    metrics = engine.strategy_metrics()
    assert metrics["trades"].sum() > 10
    for column, values in want_engine.strategy_metrics().items():
        assert metrics[column].tolist() == values.tolist(), column


def by_bar(rows):
    """Rows by (time, symbol, params_id): within one bar time the output follows the
    file's order, which a shuffled file changes."""
    return sorted(rows, key=lambda r: (r[3], r[0], r[2]))


def test_any_row_order_gives_the_rows_of_the_sorted_file(tmp_path, table):
    """Unsorted and per-symbol-block files replay to the time-sorted file's rows, spilled
    (tiny chunks) or sorted in memory (one chunk); the block file (symbols in the sorted
    file's order within a bar time) row for row in the same order."""
    outputs = {}
    for name, order in orders(table).items():
        path = tmp_path / f"{name}.csv"
        write_csv(path, table, order)
        for chunk in (50, 10_000):
            source = BarFileSource(path, warmup_bars=12, chunk_rows=chunk, merge_rows=7)
            outputs[name, chunk] = play(source, 12)[0]
    first = outputs["sorted", 50]
    # warmup: one row per stream; the duplicate is rejected; two parameter sets
    assert len(first) == 2 * (len(table) - (4 * 12 + 7) + 5 - 1)
    assert outputs["blocks", 50] == outputs["blocks", 10_000] == first
    for key, rows in outputs.items():
        assert by_bar(rows) == by_bar(first), key
        assert rows == outputs[key[0], 10_000], key


def test_directory_of_one_file_per_symbol_merges_in_time_order(tmp_path, table):
    directory = tmp_path / "per_symbol"
    directory.mkdir()
    for name in table.symbol_names:
        mine = table.symbols == name
        pq.write_table(
            pa.table({"time": table.times[mine], "close": table.closes[mine]}),
            directory / f"{name}.parquet",
        )
    want = play(read_bars(directory), 4)[0]
    source = BarFileSource(directory, warmup_bars=4, chunk_rows=64, merge_rows=16)
    assert not source.in_order and source.symbol_names == table.symbol_names
    assert play(source, 4)[0] == want


def test_resume_skips_by_time_while_streaming(tmp_path, table):
    """Rows at or before each symbol's last applied time are skipped, streamed or not."""
    path = tmp_path / "shuffled.csv"
    write_csv(path, table, orders(table)["shuffled"])
    source = BarFileSource(path, chunk_rows=80, merge_rows=9)
    until = np.array([table.times[0] + MINUTE * (30 + 7 * i) for i in range(5)], np.int64)
    in_memory = BarPlayer(Engine([ATCParams()], backend="cpu"), read_bars(path))
    in_memory.run(until)
    got, summary, _ = play(source, 0, until)
    want, _, _ = play(read_bars(path), 0, until)
    assert got == want and source.skipped == in_memory.source.skipped > 0
    codes = {name: i for i, name in enumerate(source.symbol_names)}
    assert all(row[3] > until[codes[row[0]]] for row in got)


def test_interval_is_inferred_from_a_sample_and_the_scan_reports_bad_rows(tmp_path, table):
    path = tmp_path / "bars.csv"
    write_csv(path, table, orders(table)["blocks"])
    with open(path, "a") as f:
        f.write("SYM000,not-a-time,1\n")
    source = BarFileSource(path, sample_rows=50)
    assert source.infer_interval() == "1m"
    assert source.bad_rows.counts == {"bad_time": 1}
    assert source.bad_rows.examples == [f"bars.csv:{len(table) + 2}: bad_time: 'not-a-time'"]


def test_a_file_changed_between_the_passes_is_refused(tmp_path, table):
    from atc_stream.io.readers import InputError

    path = tmp_path / "bars.csv"
    write_csv(path, table)
    source = BarFileSource(path)
    with open(path, "a") as f:
        f.write(f"NEW,{table.times[-1] + MINUTE},1\n")
    with pytest.raises(InputError, match="changed while being replayed"):
        play(source, 0)


@pytest.mark.parametrize("warmup", [0, 80])
@pytest.mark.parametrize("form", ["csv", "parquet"])
@pytest.mark.parametrize("name", ["sorted", "shuffled", "blocks", "reversed"])
def test_engine_rejections_name_the_line_of_their_row(tmp_path, table, name, form, warmup):
    """The engine's rejection of a row (here a repeated bar time, in the warmup bars or
    stepped) names the file and line (Parquet: row) of that row, in every row order:
    through the sort in memory, the spilled runs and the warmup selection."""
    order = orders(table)[name]
    path = tmp_path / f"{name}.{form}"
    if form == "csv":
        write_csv(path, table, order)
    else:
        columns = {"symbol": table.symbols[order].astype(str), "time": table.times[order],
                   "close": table.closes[order]}  # fmt: skip
        pq.write_table(pa.table(columns), path, row_group_size=50)
    # the twin later in the file is the one rejected
    twins = np.flatnonzero((table.symbols[order] == "SYM001") & np.isin(
        table.times[order], table.times[table.symbols == "SYM001"][70]))  # fmt: skip
    assert twins.size == 2
    line = f"{path.name}:{twins[1] + 2}" if form == "csv" else f"{path.name}:row {twins[1] + 1}"
    source = BarFileSource(path, warmup_bars=warmup, chunk_rows=97, merge_rows=13)
    _, summary, _ = play(source, warmup)
    assert summary.engine_rows.counts == summary.rejected
    assert summary.engine_rows.examples
    assert all(e.startswith(f"{line}: duplicate_bar: symbol 'SYM001' time ")
               for e in summary.engine_rows.examples), summary.engine_rows.examples  # fmt: skip


def test_merge_keeps_equal_times_in_file_order(tmp_path):
    """Runs whose batches end on the same bar time: the merge waits for the rest of it."""
    from atc_stream.connectors.replay.stream import Block, _spill

    runs = []
    for number, (times, rows) in enumerate(
        [([1, 1, 1, 1, 2, 3], [0, 2, 4, 6, 8, 10]), ([1, 1, 2, 2, 2, 3], [1, 3, 5, 7, 9, 11])]
    ):
        block = Block(np.zeros(6, np.int32), np.array(times, np.int64), np.zeros(6), np.array(rows))
        runs.append(_spill(block, tmp_path, number, batch_rows=2))
    blocks = list(merge_runs(runs))
    merged = Block.concat(blocks)
    assert merged.rows.tolist() == [0, 1, 2, 3, 4, 6, 5, 7, 8, 9, 10, 11]
    assert merged.times.tolist() == sorted(merged.times.tolist())
    bounds = [(b.times[0], b.times[-1]) for b in blocks]
    assert all(a[1] < b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    regrouped = list(whole_bar_times(iter([merged.take(slice(0, 5)), merged.take(slice(5, None))])))
    assert [b.times.tolist() for b in regrouped] == [[1] * 6 + [2] * 4, [3, 3]]


def test_cli_replay_of_unsorted_and_block_files_equals_the_sorted_file(tmp_path, table):
    from typer.testing import CliRunner

    from atc_stream.app.cli import app

    outputs = {}
    for name, order in orders(table).items():
        path = tmp_path / f"{name}.csv"
        write_csv(path, table, order)
        out = tmp_path / f"{name}.jsonl"
        args = ["replay", str(path), "--warmup", "20", "--no-progress", "-o", str(out)]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        outputs[name] = [json.loads(line) for line in open(out)]
    # warmup: 20 bars of 4 symbols and all 7 of FEW (one row per stream); one duplicate
    assert len(outputs["sorted"]) == len(table) - (4 * 20 + 7) + 5 - 1
    assert outputs["blocks"] == outputs["sorted"]

    def key(row):
        return (row["time"], row["symbol"], row["params_id"])

    for name, rows in outputs.items():
        assert sorted(rows, key=key) == sorted(outputs["sorted"], key=key), name


def test_sort_files_of_a_killed_replay_are_removed_by_the_next(tmp_path, table, caplog):
    """A replay SIGKILLed while sorting cannot delete its spilled runs; the next sort in
    the same spill directory does, leaving live processes' and other hosts' alone."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    path = tmp_path / "shuffled.csv"
    write_csv(path, table, orders(table)["shuffled"])
    spills = tmp_path / "spills"
    spills.mkdir()
    killed = subprocess.Popen(
        [sys.executable, "-c", (
            "import sys\n"
            "from atc_stream.connectors.replay.stream import BarFileSource\n"
            "source = BarFileSource(sys.argv[1], chunk_rows=80, merge_rows=9,\n"
            "                       spill_dir=sys.argv[2])\n"
            "blocks = source.blocks(exclude_warm=False)  # held: its sort stays open\n"
            "next(blocks)\n"
            "print('sorting', flush=True)\n"
            "sys.stdin.read()  # blocks until killed (or the test's end closes the pipe)\n"
        ), str(path), str(spills)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    with killed:
        assert killed.stdout.readline().strip() == "sorting"
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
    left = list(spills.iterdir())
    assert len(left) == 1 and any(left[0].iterdir())  # its runs are still there
    host = socket.gethostname().replace("-", "_")
    alive = spills / f"atc-replay-sort-{host}-{os.getpid()}-x"  # a live process's
    other_host = spills / f"atc-replay-sort-otherhost-{killed.pid}-x"  # maybe alive there
    for kept in (alive, other_host):
        kept.mkdir()
        (kept / "run-0.arrow").write_bytes(b"x")

    source = BarFileSource(path, chunk_rows=80, merge_rows=9, spill_dir=spills)
    with caplog.at_level("WARNING", logger="atc_stream.replay"):
        got = play(source, 0)[0]
    assert got == play(read_bars(path), 0)[0] and source.spilled_runs > 1
    assert not left[0].exists()
    assert sorted(spills.iterdir()) == sorted([alive, other_host])  # its own is gone too
    assert any("removed 1 sort directory" in r.getMessage() for r in caplog.records)


def last_frame(err: str, desc: str) -> tuple[int, int]:
    """``(n, total)`` of the last frame the ``desc`` progress bar drew on stderr."""
    frames = re.findall(rf"{desc}:\s*\d+%\|[^|]*\| (\d+)/(\d+)", err)
    assert frames, err
    n, total = frames[-1]
    return int(n), int(total)


@pytest.mark.parametrize("kind", ["table", "file"])
def test_the_replay_bar_ends_at_its_total(tmp_path, capsys, kind):
    """The replay bar counts the rows after the warmup, stepped or skipped as already
    applied (a resume), and a replay that ends draws it at its total: also when its last
    bars are rejected, and when most of its rows are skipped."""
    walk = random_walk_table(n_symbols=3, n_bars=300, seed=4)
    closes = walk.closes.copy()
    closes[-6:] = 0.0  # the last two bar times of the three symbols: rejected
    table = BarTable(walk.symbols, walk.times, closes)
    bars = table
    if kind == "file":
        write_csv(tmp_path / "bars.csv", table)
        bars = BarFileSource(tmp_path / "bars.csv", warmup_bars=50)
    summary = BarPlayer(Engine(backend="cpu"), bars, warmup_bars=50, progress=True).run()
    assert summary.step_bars == 750 and sum(summary.rejected.values()) == 6
    assert last_frame(capsys.readouterr().err, "replay") == (750, 750)
    # a resume: each symbol's rows up to its 200th bar were applied before, and skipped
    player = BarPlayer(Engine(backend="cpu"), bars, progress=True)
    summary = player.run(applied_until=np.full(3, walk.times[0] + 199 * MINUTE))
    assert player.source.skipped == 600 and summary.step_bars == 300
    assert last_frame(capsys.readouterr().err, "replay") == (900, 900)
