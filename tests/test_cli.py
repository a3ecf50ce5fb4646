"""The atc-stream command: replay of CSV/Parquet bar files and the demo."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from atc_stream import ATCParams, compute
from atc_stream.app.cli import app
from atc_stream.connectors.replay.player import random_walk_table
from atc_stream.core.schema import COLUMNS
from atc_stream.io.readers import read_bars

runner = CliRunner(env={"COLUMNS": "240", "TERMINAL_WIDTH": "240", "NO_COLOR": "1"})


def write_csv(path, table, header=("symbol", "time", "close")):
    with open(path, "w") as f:
        f.write(",".join(header) + "\n")
        for s, t, c in zip(table.symbols, table.times, table.closes, strict=True):
            f.write(f"{s},{t},{c}\n")


def read_jsonl(path):
    return [json.loads(line) for line in open(path)]


def last_signals(rows):
    return {r["symbol"]: r["signal"] for r in rows}


@pytest.fixture(scope="module")
def table():
    return random_walk_table(n_symbols=4, n_bars=300, seed=11)


def test_replay_csv_with_warmup_matches_full_recomputation(tmp_path, table):
    bars = tmp_path / "bars.csv"
    write_csv(bars, table)
    out = tmp_path / "signals.jsonl"
    result = runner.invoke(
        app, ["replay", str(bars), "--warmup", "100", "-o", str(out), "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    assert "bars/s" in result.output and "rejected inputs  none" in result.output
    rows = read_jsonl(out)
    assert len(rows) == 4 + 4 * 200  # one warmup row per stream, then every stepped bar
    for symbol, signal in last_signals(rows).items():
        closes = table.closes[table.symbols == symbol]
        assert signal == compute(closes, ATCParams())["signal"][-1]
    assert tuple(rows[-1]) == COLUMNS  # the one output schema, in order


def test_replay_parquet_with_custom_columns_and_iso_times(tmp_path, table):
    path = tmp_path / "bars.parquet"
    iso = (table.times.astype("datetime64[ms]")).astype(str)
    pq.write_table(
        pa.table({"ticker": table.symbols.astype(str), "ts": iso, "px": table.closes}), path
    )
    loaded = read_bars(path, symbol_column="ticker", time_column="ts", close_column="px")
    assert np.array_equal(loaded.times, table.times)
    out = tmp_path / "signals.jsonl"
    args = ["replay", str(path), "--symbol-column", "ticker", "--time-column", "ts"]
    args += ["--close-column", "px", "-o", str(out), "--no-progress"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert len(read_jsonl(out)) == len(table)


def test_replay_single_symbol_unsorted_file_uses_file_stem_and_counts_bad_rows(tmp_path):
    path = tmp_path / "ETHUSDT.csv"
    path.write_text("time,close\n4,12.5\n1,10.0\n2,abc\n3,-1\n3,11\n3,11.5\n")
    out = tmp_path / "s.parquet"
    args = ["replay", str(path), "-o", str(out), "--no-progress", "--time-unit", "ms"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    # 'abc' is refused by the reader (with its line), -1 by the engine
    assert "bad_close=1" in result.output and "ETHUSDT.csv:4: bad_close: 'abc'" in result.output
    assert "non_positive_close=1" in result.output
    assert "duplicate_bar=1" in result.output  # rows replay in time order
    parquet = pq.read_table(out)
    assert parquet.schema.field("time").type == pa.timestamp("ms", tz="UTC")
    table = parquet.to_pydict()
    times = parquet.column("time").cast(pa.int64()).to_pylist()
    assert table["symbol"] == ["ETHUSDT"] * 3 and times == [1, 3, 4]


def test_replay_reports_missing_file_and_columns_clearly(tmp_path):
    result = runner.invoke(app, ["replay", str(tmp_path / "nope.csv")])
    assert result.exit_code != 0 and "does not exist" in result.output
    bad = tmp_path / "bad.csv"
    bad.write_text("when,price\n1,2\n")
    result = runner.invoke(app, ["replay", str(bad)])
    assert result.exit_code != 0 and "no column 'time'" in result.output


def test_replay_with_parameter_sweep_file(tmp_path, table):
    bars = tmp_path / "bars.csv"
    write_csv(bars, table)
    params = tmp_path / "params.json"
    params.write_text(json.dumps([{}, {"robustness": "Wide", "cutout": 10}]))
    out = tmp_path / "signals.jsonl"
    result = runner.invoke(app, ["replay", str(bars), "--params", str(params), "-o", str(out)])
    assert result.exit_code == 0, result.output
    rows = read_jsonl(out)
    assert {r["params_id"] for r in rows} == {0, 1} and len(rows) == 2 * len(table)
    params.write_text(json.dumps({"robustness": "Loose"}))
    result = runner.invoke(app, ["replay", str(bars), "--params", str(params)])
    assert result.exit_code != 0 and "robustness" in result.output


@pytest.mark.parametrize(
    ("text", "needle"),
    [("[]", "no parameter set"), ("5", "a parameter set is a JSON object"),
     ('[{}, "Wide"]', "got 'Wide'")],
)  # fmt: skip
def test_a_params_file_that_holds_no_parameter_object_is_one_line(tmp_path, text, needle):
    from atc_stream.core.params import load_param_sets

    params = tmp_path / "params.json"
    params.write_text(text)
    with pytest.raises(ValueError, match=needle) as info:
        load_param_sets(params)
    assert str(info.value).startswith(f"{params}: ")


def test_demo_runs_end_to_end_as_a_subprocess(tmp_path):
    out = tmp_path / "demo.jsonl"
    cmd = [sys.executable, "-m", "atc_stream", "demo", "--symbols", "3", "--bars", "200"]
    cmd += ["--warmup", "50", "-o", str(out), "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "full recomputation check: last signal of 3 symbols identical" in proc.stderr
    assert len(read_jsonl(out)) == 3 + 3 * 150


def test_demo_with_a_warmup_longer_than_the_walk_says_what_it_warms_up(tmp_path, run_main):
    out = tmp_path / "demo.jsonl"
    code, err = run_main(["demo", "--symbols", "2", "--bars", "10", "--warmup", "20",
                          "-o", str(out), "--no-progress"])  # fmt: skip
    assert code == 0, err
    assert "2 symbols x 10 bars, warmup 10," in err and "20 warmup + 0 stepped" in err


def test_replay_of_a_shuffled_file_with_warmup_equals_the_sorted_one(tmp_path, table):
    rng = np.random.default_rng(0)
    shuffled = rng.permutation(len(table))
    from atc_stream.io.readers import BarTable

    write_csv(tmp_path / "sorted.csv", table)
    write_csv(
        tmp_path / "shuffled.csv",
        BarTable(table.symbols[shuffled], table.times[shuffled], table.closes[shuffled]),
    )
    for name in ("sorted", "shuffled"):
        args = ["replay", str(tmp_path / f"{name}.csv"), "--warmup", "120", "--no-progress"]
        result = runner.invoke(app, [*args, "-o", str(tmp_path / f"{name}.jsonl")])
        assert result.exit_code == 0, result.output
        assert "rejected inputs  none" in result.output

    def by_key(rows):  # within one bar time, rows follow file order
        return sorted(rows, key=lambda r: (r["time"], r["symbol"]))

    sorted_rows = read_jsonl(tmp_path / "sorted.jsonl")
    assert by_key(sorted_rows) == by_key(read_jsonl(tmp_path / "shuffled.jsonl"))
    assert len(sorted_rows) == 4 + 4 * 180


def test_replay_keeps_every_row_of_epoch_milliseconds_counted_from_zero(tmp_path, run_main):
    path = tmp_path / "from_zero.csv"
    path.write_text("time,close\n" + "".join(f"{60_000 * i},{100 + i % 7}\n" for i in range(300)))
    out = tmp_path / "signals.jsonl"
    code, err = run_main(["replay", str(path), "--backend", "cpu", "--no-progress", "-o", str(out)])
    assert code == 0, err
    assert "rejected rows" not in err and "rejected inputs  none" in err, err
    assert [row["time"] for row in read_jsonl(out)] == [60_000 * i for i in range(300)]


def test_replay_refuses_a_time_column_of_two_epoch_units(tmp_path, run_main):
    day = 86_400_000  # epoch ms from 0: 86400000 fits no unit, 172800000 looks like seconds
    path = tmp_path / "days.csv"
    path.write_text("time,close\n" + "".join(f"{day * i},{100 + i}\n" for i in range(40)))
    out = tmp_path / "signals.jsonl"
    args = ["replay", str(path), "--backend", "cpu", "--no-progress", "-o", str(out)]
    code, err = run_main(args)
    assert code == 2 and err.strip().count("\n") == 0, err
    assert "86400000 (days.csv:3: no unit) and 172800000 (days.csv:4: s)" in err
    assert "pass --time-unit s, ms, us or ns" in err
    assert not out.exists() or out.read_text() == ""  # refused before any output
    code, err = run_main([*args, "--time-unit", "ms"])
    assert code == 0, err
    assert [row["time"] for row in read_jsonl(out)] == [day * i for i in range(40)]
