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


def test_replay_with_strategies_trades_exactly_as_backtest(tmp_path, bars):
    path, frame = bars
    run_paper(tmp_path, path)
    expected = backtest(frame, None, STRATEGIES)
    got = sort_trades(read_jsonl(tmp_path / "trades.jsonl"))
    exact = sort_trades(records(expected.trade_columns))
    assert len(got) == len(exact) > 10
    for mine, theirs in zip(got, exact, strict=True):
        assert mine.keys() == theirs.keys()
        for key, value in theirs.items():
            assert mine[key] == value, (key, mine, theirs)
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
        (["--strategy", "stop=0.1", "--warmup", "10"], "--warmup"),
        (["--strategy", "stop=0.1", "--trades", "t.csv"], "use .jsonl or .parquet"),
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


def test_bad_ohlc_rows_are_counted_with_file_and_line(tmp_path):
    path = tmp_path / "bars.csv"
    path.write_text(
        "symbol,time,open,high,low,close\n"
        "A,60000,10,11,9,10.5\n"
        "A,120000,10,9,11,10\n"  # high < low
        "A,180000,10,11,9,10\n"
    )
    result = replay(str(path), "-o", str(tmp_path / "s.jsonl"), "--strategy", "stop=0.1")
    assert result.exit_code == 0, result.output
    assert "bars.csv:3: bad_ohlc" in result.output
    assert len(read_jsonl(tmp_path / "s.jsonl")) == 2


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
