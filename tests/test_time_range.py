"""Bar times run up to 9999-12-31T23:59:59.999Z (``timetext.MAX_TIME_MS``): a later one
(2^63 - 1 ms, year 10000) is a broken value, left out and counted as
``time_out_of_range`` on every way in -- the engine's step, array step, preview and
warmup (each naming its row), bar and tick files (with ``file:line``) -- so it never
becomes a stream's last bar and refuses every real bar after it. Times before 1970
(negative epoch ms) stay accepted."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from atc_stream import Engine
from atc_stream.core.timetext import MAX_TIME_MS, iso_parts
from atc_stream.io.readers import read_bars
from atc_stream.io.tick_reader import load_ticks, ticks_from_arrays

YEAR_10000 = 253_402_300_800_000  # 10000-01-01T00:00:00Z
LATE = [YEAR_10000, 2**63 - 1]
T0 = 1_700_000_040_000


def test_the_limit_is_the_last_millisecond_of_the_year_9999():
    assert MAX_TIME_MS == iso_parts("9999-12-31T23:59:59.999Z")[0] == YEAR_10000 - 1


@pytest.fixture(scope="module")
def engine_factory():
    def make() -> Engine:
        engine = Engine(backend="cpu")
        engine.add_symbol("A")
        return engine

    make().step([("A", 0, 1.0)])  # the kernels, loaded once
    return make


@pytest.mark.parametrize("late", LATE)
def test_step_rejects_a_time_past_the_year_9999_and_takes_the_next_bars(engine_factory, late):
    engine = engine_factory()
    result = engine.step([("A", T0, 1.0), ("A", late, 2.0), ("A", T0 + 60_000, 3.0)])
    assert [(r.index, r.reason) for r in result.rejected] == [(1, "time_out_of_range")]
    assert f"time {late}" in result.rejected[0].detail and result.rejected[0].symbol == "A"
    assert result.times.tolist() == [T0, T0 + 60_000]
    assert engine.rejections == {"time_out_of_range": 1}
    assert engine.step([("A", T0 + 120_000, 4.0)]).times.tolist() == [T0 + 120_000]


def test_step_arrays_preview_and_warmup_reject_it_too(engine_factory):
    engine = engine_factory()
    slots = np.repeat(engine.slots_of("A"), 3)
    result = engine.step_arrays(slots, [T0, 2**63 - 1, T0 + 60_000], [1.0, 2.0, 3.0])
    assert [(r.index, r.reason) for r in result.rejected] == [(1, "time_out_of_range")]
    assert engine.last_bar_times("A") == [T0 + 60_000]
    preview = engine.preview([("A", YEAR_10000, 4.0)])
    assert len(preview) == 0 and preview.rejected[0].reason == "time_out_of_range"
    warm = engine_factory()
    # a list: an int64 array this large is refused whole, as epoch us or ns given as ms
    result = warm.warmup({"A": ([T0, YEAR_10000, T0 + 60_000], [1.0, 2.0, 3.0])})
    assert [(r.index, r.reason) for r in result.rejected] == [(1, "time_out_of_range")]
    assert warm.last_bar_times("A") == [T0 + 60_000]


def test_converted_times_past_the_year_9999_are_rejected_like_plain_ones(engine_factory):
    engine = engine_factory()
    result = engine.step([("A", 1_700_000_040, 1.0), ("A", YEAR_10000 // 1000, 2.0)],
                         time_unit="s")  # fmt: skip
    assert [(r.index, r.reason) for r in result.rejected] == [(1, "time_out_of_range")]


def test_times_before_1970_and_up_to_the_limit_are_accepted(engine_factory):
    engine = engine_factory()
    times = [-62_135_596_800_000, -14_182_940_000, -1, 0, MAX_TIME_MS]  # year 1 .. 9999
    result = engine.step([("A", t, 1.0 + i) for i, t in enumerate(times)])
    assert not result.rejected and result.times.tolist() == times


def test_bar_files_reject_the_row_with_its_line_and_read_on(tmp_path):
    path = tmp_path / "bars.csv"
    path.write_text(
        "symbol,time,close\n"
        f"A,{T0},1\nA,{YEAR_10000},2\nA,{2**63 - 1},3\n"
        "A,9999-12-31T23:59:59-00:01,4\n"  # 10000-01-01T00:00:59Z
        f"A,{T0 + 60_000},5\n"
    )
    table = read_bars(path, time_unit="ms")
    assert table.times.tolist() == [T0, T0 + 60_000]
    assert table.bad_rows.counts == {"time_out_of_range": 3}
    assert table.bad_rows.examples == [
        f"bars.csv:3: time_out_of_range: '{YEAR_10000}'",
        f"bars.csv:4: time_out_of_range: '{2**63 - 1}'",
        "bars.csv:5: time_out_of_range: '9999-12-31T23:59:59-00:01'",
    ]
    old = tmp_path / "old.csv"
    old.write_text("symbol,time,close\nA,1969-07-20T20:17:00Z,1\nA,9999-12-31T23:59:59.999Z,2\n")
    assert read_bars(old).times.tolist() == [-14_182_980_000, MAX_TIME_MS]


def test_parquet_integer_and_timestamp_columns_are_checked_too(tmp_path):
    path = tmp_path / "bars.parquet"
    pq.write_table(
        pa.table({"symbol": ["A"] * 3, "time": pa.array([T0, 2**63 - 1, T0 + 60_000], pa.int64()),
                  "close": [1.0, 2.0, 3.0]}), path,
    )  # fmt: skip
    table = read_bars(path, time_unit="ms")
    assert table.times.tolist() == [T0, T0 + 60_000]
    assert table.bad_rows.examples == [f"bars.parquet:row 2: time_out_of_range: '{2**63 - 1}'"]
    stamps = tmp_path / "stamps.parquet"
    seconds = pa.array([T0 // 1000, YEAR_10000 // 1000], pa.timestamp("s"))
    pq.write_table(pa.table({"symbol": ["A", "A"], "time": seconds, "close": [1.0, 2.0]}), stamps)
    table = read_bars(stamps)
    assert table.times.tolist() == [T0] and table.bad_rows.counts == {"time_out_of_range": 1}


def test_tick_files_and_tick_arrays_reject_it_too(tmp_path):
    path = tmp_path / "ticks.csv"
    path.write_text(f"time,symbol,price,size\n{T0},A,1.5,1\n{2**63 - 1},A,2.5,1\n{T0 + 1},A,3,1\n")
    ticks = load_ticks(path, time_unit="ms")
    assert ticks.prices.tolist() == [1.5, 3.0] and ticks.rejected == {"time_out_of_range": 1}
    assert ticks.bad_rows.examples == [f"ticks.csv:3: time_out_of_range: '{2**63 - 1}'"]
    in_memory = ticks_from_arrays(np.array([T0, YEAR_10000]), ["A", "A"], [1.0, 2.0], [1, 1])
    assert in_memory.prices.tolist() == [1.0]
    assert +in_memory.rejected == {"time_out_of_range": 1}


def test_replay_reports_the_row_and_writes_every_later_bar(tmp_path, run_main):
    body = "".join(f"A,{T0 + 60_000 * i},{100 + i}\n" for i in range(30))
    path = tmp_path / "bars.csv"
    path.write_text(f"symbol,time,close\nA,{2**63 - 1},99\n" + body)
    out = tmp_path / "out.jsonl"
    args = ["replay", str(path), "-o", str(out), "--no-progress", "--time-unit", "ms"]
    code, err = run_main([*args, "--backend", "cpu"])
    assert code == 0, err
    assert f"bars.csv:2: time_out_of_range: '{2**63 - 1}'" in err
    times = [json.loads(line)["time"] for line in out.read_text().splitlines()]
    assert times == [T0 + 60_000 * i for i in range(30)]


def test_backtest_refuses_a_time_past_year_9999_naming_the_row():
    from atc_stream.engine.backtest import backtest

    bars = {
        "symbol": ["AAA"] * 3, "time": [60_000, 120_000, MAX_TIME_MS + 1],
        "open": [1.0] * 3, "high": [1.0] * 3, "low": [1.0] * 3, "close": [1.0] * 3,
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"bars row 2 \(symbol 'AAA'\): time 253402300800000"):
        backtest(bars, time_unit="ms")
