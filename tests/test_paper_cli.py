"""``atc-stream replay --strategy``: paper trading of an OHLC bar file, equal to ``backtest``."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from redis_fixtures import collected_messages, redis_server, redis_url  # noqa: F401
from typer.testing import CliRunner

from atc_stream import Strategy, backtest
from atc_stream.app.cli import app, main
from atc_stream.core.schema import SCHEMA_VERSION
from atc_stream.core.strategy import parse_strategy, strategies_from_specs
from atc_stream.core.strategy_outputs import records
from atc_stream.state.snapshot_stores import DirectorySnapshotStore

runner = CliRunner(env={"COLUMNS": "240", "TERMINAL_WIDTH": "240", "NO_COLOR": "1"})

SPECS = ["stop=0.02,fee_bps=10,slippage_bps=5", "direction=long_only,take_profit=0.03,max_hold=40"]
STRATEGIES = [
    Strategy(stop=0.02, fee_bps=10, slippage_bps=5),
    Strategy(direction="long_only", take_profit=0.03, max_hold=40),
]


def ohlc_frame(n_bars: int = 300) -> pd.DataFrame:
    rng = np.random.default_rng(11)
    parts = []
    for symbol in ("AAA", "BBB"):
        close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, n_bars)))
        open_ = np.r_[close[0], close[:-1]] * np.exp(rng.normal(0, 0.003, n_bars))
        high = np.maximum(open_, close) * (1 + rng.uniform(0, 0.01, n_bars))
        low = np.minimum(open_, close) * (1 - rng.uniform(0, 0.01, n_bars))
        time = 1_700_000_000_000 + 60_000 * np.arange(n_bars, dtype=np.int64)
        parts.append(
            pd.DataFrame(
                {"symbol": symbol, "time": time, "open": open_, "high": high, "low": low,
                 "close": close}
            )
        )  # fmt: skip
    return pd.concat(parts).sort_values(["time", "symbol"], kind="stable")


@pytest.fixture(scope="module")
def bars(tmp_path_factory):
    path = tmp_path_factory.mktemp("paper") / "bars.csv"
    frame = ohlc_frame()
    # 17 digits: the file holds exactly the prices of the frame
    frame.to_csv(path, index=False, float_format="%.17g")
    return path, frame


def replay(*args: str):
    return runner.invoke(app, ["replay", *args, "--no-progress"])


def command_error(capsys, *args: str) -> tuple[int, list[str]]:
    """The exit status and stderr lines of the console entry point on ``args``."""
    with pytest.raises(SystemExit) as exit_info:
        main(["replay", *args, "--no-progress"])
    return exit_info.value.code, capsys.readouterr().err.strip().splitlines()


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in open(path)]


def sort_trades(records: list[dict]) -> list[dict]:
    keys = ("symbol", "params_id", "strategy_id", "exit_time", "entry_time")
    return sorted(records, key=lambda r: tuple(r[k] for k in keys))


def run_paper(tmp_path, bars_path, *extra: str, trades: str = "trades.jsonl"):
    out = tmp_path / "signals.jsonl"
    args = [str(bars_path), "-o", str(out), "--trades", str(tmp_path / trades)]
    for spec in SPECS:
        args += ["--strategy", spec]
    result = replay(*args, "--positions", str(tmp_path / "positions.parquet"), *extra)
    assert result.exit_code == 0, result.output
    return out


def assert_same_trades(written: list[dict], trade_columns) -> None:
    """The trade records written are exactly ``trade_columns`` (any order), bit for bit."""
    got = sort_trades(written)
    exact = sort_trades(records(trade_columns))
    assert len(got) == len(exact) > 10
    for mine, theirs in zip(got, exact, strict=True):
        assert mine.keys() == theirs.keys()
        for key, value in theirs.items():
            assert mine[key] == value, (key, mine, theirs)


def test_replay_with_strategies_trades_exactly_as_backtest(tmp_path, bars):
    path, frame = bars
    run_paper(tmp_path, path)
    expected = backtest(frame, None, STRATEGIES)
    assert_same_trades(read_jsonl(tmp_path / "trades.jsonl"), expected.trade_columns)
    positions = pq.read_table(tmp_path / "positions.parquet").to_pandas()
    assert len(positions) == len(frame) * len(STRATEGIES)
    last = positions.groupby(["symbol", "params_id", "strategy_id"]).tail(1)
    metrics = expected.metrics.set_index(["symbol", "params_id", "strategy_id"])
    for row in last.itertuples():
        assert row.equity == metrics.loc[(row.symbol, row.params_id, row.strategy_id),
                                         "final_equity"]  # fmt: skip


def test_signal_rows_are_unchanged_by_strategies(tmp_path, bars):
    path, frame = bars
    with_paper = run_paper(tmp_path, path)
    plain = tmp_path / "plain.jsonl"
    assert replay(str(path), "-o", str(plain)).exit_code == 0
    closes_only = tmp_path / "closes.csv"
    frame[["symbol", "time", "close"]].to_csv(closes_only, index=False, float_format="%.17g")
    from_closes = tmp_path / "from_closes.jsonl"
    assert replay(str(closes_only), "-o", str(from_closes)).exit_code == 0
    assert with_paper.read_bytes() == plain.read_bytes() == from_closes.read_bytes()


def test_resume_continues_the_trades_exactly_once(tmp_path, bars):
    path, frame = bars
    whole = tmp_path / "whole"
    whole.mkdir()
    run_paper(whole, path)
    half = tmp_path / "half.csv"
    frame.iloc[: len(frame) // 2].to_csv(half, index=False, float_format="%.17g")
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    snapshots = ["--snapshot-dir", str(tmp_path / "snaps")]
    run_paper(resumed, half, *snapshots)
    run_paper(resumed, path, *snapshots, "--resume")
    assert (resumed / "trades.jsonl").read_bytes() == (whole / "trades.jsonl").read_bytes()
    assert (resumed / "signals.jsonl").read_bytes() == (whole / "signals.jsonl").read_bytes()
    got = pq.read_table(resumed / "positions.parquet").to_pandas()
    want = pq.read_table(whole / "positions.parquet").to_pandas()
    pd.testing.assert_frame_equal(got, want)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_resume_from_an_older_snapshot_cuts_the_outputs_back(tmp_path, bars, suffix):
    path, _ = bars
    whole = tmp_path / "whole"
    whole.mkdir()
    run_paper(whole, path, trades=f"t{suffix}")
    snaps = tmp_path / "snaps"
    again = tmp_path / "again"
    again.mkdir()
    options = ["--snapshot-dir", str(snaps)]
    run_paper(again, path, *options, "--snapshot-every", "200", trades=f"t{suffix}")
    store = DirectorySnapshotStore(snaps)
    kept = store.list()
    # the first periodic snapshot and the final one are always written (a periodic one
    # due while another is being written is skipped, so a busy machine may keep fewer)
    assert len(kept) >= 2
    for newer in kept[1:]:  # as if the run had been killed after the first snapshot
        store.delete(newer)
    run_paper(again, path, *options, "--resume", trades=f"t{suffix}")
    if suffix == ".jsonl":
        assert (again / "t.jsonl").read_bytes() == (whole / "t.jsonl").read_bytes()
    else:
        got = pq.read_table(again / "t.parquet").to_pandas()
        pd.testing.assert_frame_equal(got, pq.read_table(whole / "t.parquet").to_pandas())
    got = pq.read_table(again / "positions.parquet").to_pandas()
    pd.testing.assert_frame_equal(got, pq.read_table(whole / "positions.parquet").to_pandas())
    assert (again / "signals.jsonl").read_bytes() == (whole / "signals.jsonl").read_bytes()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--strategy", "stop=abc"], "stop must be a number"),
        (["--strategy", "stopp=0.1"], "unknown strategy parameter 'stopp'"),
        (["--strategy", "direction=sideways"], "direction must be one of"),
        (["--trades", "t.jsonl"], "--trades needs --strategy"),
        (["--strategy", "stop=0.1", "--trades", "t.csv"], "use .jsonl or .parquet"),
        (["--strategy", "stop=0.1", "--trades", "trades"], "trades: use .jsonl or .parquet"),
        (["--strategy", "stop=0.1", "--positions", "p.txt"], "p.txt: use .jsonl or .parquet"),
        (["--strategy", "stop=0.1", "--positions", "-"], "stdout is the signal output's"),
    ],
)
def test_bad_paper_options_are_one_line_and_exit_2(capsys, tmp_path, bars, args, named):
    code, lines = command_error(capsys, str(bars[0]), "-o", str(tmp_path / "s.jsonl"), *args)
    assert code == 2
    assert len(lines) == 1 and named in lines[0], lines


def test_a_file_without_ohlc_is_one_line_and_exit_2(capsys, tmp_path, bars):
    closes_only = tmp_path / "closes.csv"
    bars[1][["symbol", "time", "close"]].to_csv(closes_only, index=False)
    code, lines = command_error(capsys, str(closes_only), "--strategy", "stop=0.1")
    assert code == 2
    assert len(lines) == 1 and "no column 'open'" in lines[0], lines


def test_a_missing_renamed_price_column_is_one_line_and_exit_2(capsys, tmp_path, bars):
    code, lines = command_error(
        capsys, str(bars[0]), "-o", str(tmp_path / "s.jsonl"), "--strategy", "stop=0.1",
        "--high-column", "hi",
    )  # fmt: skip
    assert code == 2
    assert len(lines) == 1 and "no column 'hi'" in lines[0] and "--high-column" in lines[0]


def test_bad_ohlc_rows_are_counted_with_file_and_line(capsys, tmp_path):
    path = tmp_path / "bars.csv"
    path.write_text(
        "symbol,time,open,high,low,close\n"
        "A,60000,10,11,9,10.5\n"
        "A,120000,10,9,11,10\n"  # high < low
        "A,180000,10,11,9,10\n"
        "A,240000,x,11,9,10\n"  # an open that is not a number
        "A,300000,12,11,9,10\n"  # the open above the high
        "A,360000,10,11,9,10\n"
        "A,180000,10,11,9,10\n"  # a second bar at 180000: the engine's to reject
    )
    result = replay(str(path), "-o", str(tmp_path / "s.jsonl"), "--strategy", "stop=0.1")
    assert result.exit_code == 0, result.output
    assert "rejected inputs  bad_ohlc=2, bad_open=1, duplicate_bar=1" in result.output
    assert "rejected rows: bad_ohlc=2, bad_open=1" in result.output
    assert "bars.csv:3: bad_ohlc: open=10 high=9 low=11 close=10" in result.output
    assert "bars.csv:5: bad_open: 'x'" in result.output
    assert "bars.csv:6: bad_ohlc" in result.output
    assert [r["time"] for r in read_jsonl(tmp_path / "s.jsonl")] == [60000, 180000, 360000]
    code, lines = command_error(capsys, str(path), "--strategy", "stop=0.1", "--strict")
    assert code == 2
    assert lines[-1] == f"atc-stream: error: 3 rejected rows in {path} (--strict)", lines


def test_strategy_specs_inline_and_toml(tmp_path):
    toml = tmp_path / "s.toml"
    toml.write_text('[[strategy]]\nstop = 0.05\n[[strategy]]\ndirection = "short_only"\n')
    got = strategies_from_specs(["max_hold=3,fee_bps=2.5", str(toml)])
    assert got == [Strategy(max_hold=3, fee_bps=2.5), Strategy(stop=0.05),
                   Strategy(direction="short_only")]  # fmt: skip
    assert parse_strategy(" direction = long_only ") == Strategy(direction="long_only")
    with pytest.raises(ValueError, match="given twice"):
        parse_strategy("stop=0.1,stop=0.2")


@pytest.mark.redis
def test_replay_publishes_a_trade_message_per_closed_trade(tmp_path, bars, redis_url):  # noqa: F811
    pytest.importorskip("redis")
    from atc_stream.connectors.redis.pubsub import SignalSubscriber

    sub = SignalSubscriber(redis_url, trades=True, patterns=["atc:trade:*"])
    sub.wait_ready()
    with collected_messages(sub) as got:
        run_paper(tmp_path, bars[0], "--redis", redis_url)
    sub.close()
    written = sort_trades(read_jsonl(tmp_path / "trades.jsonl"))
    on_all = [m for m in got if m.channel == "atc:trades"]
    per_symbol = [m for m in got if m.channel.startswith("atc:trade:")]
    assert {m.kind for m in got} == {"trade"}
    assert len(on_all) == len(per_symbol) == len(written)
    assert all(m.channel == f"atc:trade:{m.data.symbol}" for m in per_symbol)
    published = [json.loads(msgspec.json.encode(m.data)) for m in on_all]
    assert all(p.pop("v") == SCHEMA_VERSION for p in published)
    assert sort_trades(published) == written


@pytest.mark.redis
def test_run_stream_trades_entries_with_ohlc_as_backtest(capsys, bars, redis_url):  # noqa: F811
    redis = pytest.importorskip("redis")
    from atc_stream.connectors.redis.pubsub import SignalSubscriber

    frame = bars[1]
    client = redis.Redis.from_url(redis_url)
    pipe = client.pipeline(transaction=False)
    for row in frame.itertuples(index=False):
        pipe.xadd("bars", {"symbol": row.symbol, "time": row.time, "open": repr(row.open),
                           "high": repr(row.high), "low": repr(row.low),
                           "close": repr(row.close)})  # fmt: skip
    pipe.xadd("bars", {"symbol": "AAA", "time": 1, "close": "1.0"})  # no open/high/low
    pipe.execute()
    client.close()
    sub = SignalSubscriber(redis_url, prefix="paper", trades=True)
    sub.wait_ready()
    with pytest.raises(SystemExit) as exit_info:
        main(["run-stream", "--redis", redis_url, "--input-stream", "bars", "--publish",
              "--redis-prefix", "paper", "--stop-when-idle", "0.3", "--backend", "cpu",
              "--strategy", SPECS[0], "--strategy", SPECS[1]])  # fmt: skip
    assert exit_info.value.code == 0, capsys.readouterr().err
    assert "missing_ohlc=1" in capsys.readouterr().err
    got = [json.loads(msgspec.json.encode(m.data)) for m in sub.messages(timeout=1.0)]
    sub.close()
    for record in got:
        record.pop("v")
    want = sort_trades(records(backtest(frame, None, STRATEGIES).trade_columns))
    assert sort_trades(got) == want and want


# -- the streamed replay: renames, unsorted files, warmup, ticks, memory -------------------


def run_job(tmp_path, bars_path=None, *, warmup=0, ticks=None, interval=None, specs=SPECS):
    """The replay job in this process (its engine is returned, for the metrics); with
    ``SPECS`` it writes trades and positions too."""
    from atc_stream.app.durability import Durability
    from atc_stream.app.jobs.replay import replay as replay_job
    from atc_stream.app.paper import check_paper_options

    files = specs == SPECS
    paper = check_paper_options(
        specs, trades=tmp_path / "trades.jsonl" if files else None,
        positions=tmp_path / "positions.jsonl" if files else None,
    )  # fmt: skip
    engine, _ = replay_job(
        bars=bars_path, ticks=ticks, columns={"symbol": "symbol", "time": "time", "close": "close"},
        symbol=None, time_unit="auto", strict=False, output=str(tmp_path / "signals.jsonl"),
        warmup=warmup, speed=None, progress=False, backend="cpu", interval=interval,
        durability=Durability(redis=None, snapshot_dir=None, snapshot_every=None, resume=False),
        paper=paper,
    )  # fmt: skip
    return engine


def assert_same_metrics(engine, expected) -> None:
    keys = ["symbol", "params_id", "strategy_id"]
    want = expected.metrics.sort_values(keys).reset_index(drop=True)
    got = pd.DataFrame(engine.strategy_metrics()).sort_values(keys).reset_index(drop=True)
    assert len(want) == 2 * len(STRATEGIES)
    for column in want.columns:
        assert got[column].tolist() == want[column].tolist(), column


def test_renamed_columns_of_an_unsorted_file_trade_as_backtest(tmp_path, bars):
    frame = bars[1]
    names = {"symbol": "ticker", "time": "ts", "open": "o", "high": "h", "low": "l", "close": "c"}
    path = tmp_path / "renamed.csv"
    frame.rename(columns=names).sample(frac=1.0, random_state=3).to_csv(
        path, index=False, float_format="%.17g"
    )
    options = [f"--{role}-column={name}" for role, name in names.items()]
    run_paper(tmp_path, path, *options)
    expected = backtest(frame, None, STRATEGIES)
    assert_same_trades(read_jsonl(tmp_path / "trades.jsonl"), expected.trade_columns)


def test_warmup_then_the_rest_trades_as_backtest_on_all_bars(tmp_path, bars):
    path, frame = bars
    warmup = 120
    engine = run_job(tmp_path, path, warmup=warmup)
    expected = backtest(frame, None, STRATEGIES)
    assert_same_metrics(engine, expected)
    # as live --history: of the warmup bars only the last one's trades and positions
    last_warm = np.sort(frame["time"].unique())[warmup - 1]
    after = expected.trade_columns["exit_time"] >= last_warm
    assert 0 < after.sum() < len(after)
    later = {name: values[after] for name, values in expected.trade_columns.items()}
    assert_same_trades(read_jsonl(tmp_path / "trades.jsonl"), later)
    positions = read_jsonl(tmp_path / "positions.jsonl")
    assert min(p["time"] for p in positions) == last_warm
    assert len(positions) == (len(frame) // 2 - warmup + 1) * 2 * len(STRATEGIES)


def write_ticks(path, n: int = 2_000, minutes: int = 300) -> None:
    rng = np.random.default_rng(5)
    start = 1_699_999_980_000  # a whole minute
    times = start + np.sort(rng.integers(0, minutes * 60_000, n))
    symbols = rng.choice(["AAA", "BBB"], n)
    prices = np.round(100 * np.exp(np.cumsum(rng.normal(0, 0.003, n))), 2)
    sizes = np.round(rng.exponential(1.0, n), 3)
    pd.DataFrame({"time": times, "symbol": symbols, "price": prices, "size": sizes}).to_csv(
        path, index=False
    )


@pytest.mark.parametrize("empty", ["skip", "carry"])
def test_ticks_trade_as_backtest_on_their_bars(tmp_path, empty):
    from atc_stream.connectors.replay.ticks import aggregate_ticks
    from atc_stream.io.tick_reader import load_ticks

    ticks = tmp_path / "ticks.csv"
    write_ticks(ticks)
    bars = aggregate_ticks(load_ticks(ticks), "1m", empty=empty)
    frame = pd.DataFrame({"symbol": bars.symbols.astype(str), "time": bars.times,
                          "open": bars.open, "high": bars.high, "low": bars.low,
                          "close": bars.close})  # fmt: skip
    if empty == "skip":
        assert len(frame) < 2 * 300  # some minutes have no trade of a symbol
    out = tmp_path / "signals.jsonl"
    args = ["--ticks", str(ticks), "--interval", "1m", "--empty", empty, "-o", str(out)]
    for spec in SPECS:
        args += ["--strategy", spec]
    result = replay(*args, "--trades", str(tmp_path / "trades.jsonl"))
    assert result.exit_code == 0, result.output
    expected = backtest(frame, None, STRATEGIES)
    assert_same_trades(read_jsonl(tmp_path / "trades.jsonl"), expected.trade_columns)
    if empty == "skip":  # the job in this process, for the engine's metrics
        (tmp_path / "job").mkdir()
        assert_same_metrics(run_job(tmp_path / "job", ticks=ticks, interval="1m"), expected)


def write_wide_bars(path, n_symbols: int, n_times: int) -> None:
    """Time-major OHLC bars of ``n_symbols`` symbols at ``n_times`` times."""
    rng = np.random.default_rng(3)
    steps = rng.normal(0, 0.01, (n_times, n_symbols))
    close = np.round(100 * np.exp(np.cumsum(steps, axis=0)), 2).ravel()
    names = np.array([f"S{i:04d}" for i in range(n_symbols)])
    times = 1_700_000_000_000 + 60_000 * np.arange(n_times)
    pd.DataFrame({"symbol": np.tile(names, n_times), "time": np.repeat(times, n_symbols),
                  "open": close, "high": close * 1.01, "low": close * 0.99,
                  "close": close}).to_csv(path, index=False)  # fmt: skip


def test_replay_memory_follows_the_streams_not_the_rows(tmp_path, monkeypatch):
    """The traced peak of a replay --strategy grows by far less per row than reading
    the file whole needs (its eight 8-byte columns alone: 64 B per row)."""
    import tracemalloc

    from atc_stream.io import readers

    monkeypatch.setattr(readers, "BLOCK_BYTES", 1 << 16)  # many record batches
    symbols, times = 400, 100
    big, small = tmp_path / "big.csv", tmp_path / "small.csv"
    write_wide_bars(big, symbols, times)
    write_wide_bars(small, symbols, 2)  # the same streams: their state is the same

    def traced_peak(path, where) -> int:
        where.mkdir()
        tracemalloc.start()
        try:
            run_job(where, path, specs=SPECS[:1])
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    run_job(tmp_path, small, specs=SPECS[:1])  # kernels loaded before anything is traced
    base = traced_peak(small, tmp_path / "small")
    peak = traced_peak(big, tmp_path / "big")
    per_row = (peak - base) / (symbols * times)
    assert per_row < 64, f"{per_row:.0f} B per row"


def test_a_resume_with_other_strategies_says_what_differs():
    from atc_stream.app.durability import _strategy_difference
    from atc_stream.core.strategy import parse_strategy

    def specs(*texts):
        return [parse_strategy(text).to_dict() for text in texts]

    assert _strategy_difference(specs("stop=0.05"), specs("stop=0.02")) == (
        "strategy 0: stop=0.05 (snapshot: 0.02)"
    )
    assert _strategy_difference(specs("stop=0.05"), specs("stop=0.05", "stop=0.02")) == (
        "1 strategies asked, the snapshot trades 2"
    )
