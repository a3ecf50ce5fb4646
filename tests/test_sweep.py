"""``atc-stream sweep``: the grid file, the OHLC reader, the ranked tables on disk and on
stdout, the train/test split, and the chart of one backtested stream."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from atc_stream.app.grid import GridError, load_grid, parse_grid
from atc_stream.app.jobs.sweep import run_sweep
from atc_stream.app.ranking import Curves, period_metrics
from atc_stream.core.params import MAX_LENGTH, ATCParams
from atc_stream.core.reference_backtest import backtest_series
from atc_stream.core.strategy import (
    Strategy,
    load_strategies,
    parse_strategy,
    strategies_from_specs,
)
from atc_stream.engine.backtest import backtest
from atc_stream.io.ohlc import read_ohlc
from atc_stream.io.readers import InputError

START = 1_704_067_200_000  # 2024-01-01T00:00:00Z
MINUTE = 60_000
GRID = """
[atc]
ema_len = [10, 14]
cut = 0.3
[strategy]
direction = ["long_short", "long_only"]
stop = 0.01
fee_bps = 5
"""


def ohlc_frame(symbols=("AAA", "BBB", "CCC"), bars=240, seed=3) -> pa.Table:
    """Random-walk OHLC bars of a few symbols, one per minute."""
    rng = np.random.default_rng(seed)
    columns: dict[str, list] = {k: [] for k in ("symbol", "time", "open", "high", "low", "close")}
    for name in symbols:
        close = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 0.01, bars)))
        open_ = np.r_[100.0, close[:-1]] * np.exp(rng.normal(0.0, 0.002, bars))
        high = np.maximum(open_, close) * (1.0 + rng.uniform(0.0, 0.006, bars))
        low = np.minimum(open_, close) * (1.0 - rng.uniform(0.0, 0.006, bars))
        columns["symbol"] += [name] * bars
        columns["time"] += (START + MINUTE * np.arange(bars)).tolist()
        for key, values in (("open", open_), ("high", high), ("low", low), ("close", close)):
            columns[key] += values.tolist()
    return pa.table(columns)


@pytest.fixture(scope="module")
def sweep_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweep")
    data = folder / "bars.parquet"
    pq.write_table(ohlc_frame(), data)
    grid = folder / "grid.toml"
    grid.write_text(GRID)
    return data, grid


def run_cli(capsys, args):
    """``atc-stream ARGS`` in this process: (exit status, stdout, stderr)."""
    from atc_stream.app.cli import main

    with pytest.raises(SystemExit) as info:
        main(args)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return info.value.code, captured.out, captured.err


# -- the grid ----------------------------------------------------------------------------


def test_grid_is_the_product_of_the_lists_last_key_fastest():
    grid = parse_grid(
        {"atc": {"ema_len": [10, 14], "robustness": ["Medium", "Wide"], "cut": 0.3},
         "strategy": {"stop": [0.0, 0.02], "fee_bps": 5}}
    )  # fmt: skip
    assert [(p.ema_len, p.robustness) for p in grid.params] == [
        (10, "Medium"), (10, "Wide"), (14, "Medium"), (14, "Wide"),
    ]  # fmt: skip
    assert all(p.cut == 0.3 for p in grid.params)
    assert grid.strategies == [Strategy(stop=0.0, fee_bps=5), Strategy(stop=0.02, fee_bps=5)]
    assert grid.varied_params == ("ema_len", "robustness")
    assert grid.varied_strategies == ("stop",)
    assert grid.sets == 8
    table = grid.params_table()
    assert table.column("params_id").to_pylist() == [0, 1, 2, 3]
    assert table.column("robustness").to_pylist() == ["Medium", "Wide", "Medium", "Wide"]
    assert grid.strategies_table().column("stop").to_pylist() == [0.0, 0.02]


def test_a_missing_or_empty_table_is_the_defaults_but_an_empty_grid_is_refused():
    grid = parse_grid({"atc": {}})
    assert grid.params == [ATCParams()] and grid.strategies == [Strategy()]
    assert parse_grid({"strategy": {"stop": 0.1}}).params == [ATCParams()]
    with pytest.raises(GridError, match="the grid is empty"):
        parse_grid({}, where="g.toml")


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ({"atc": {"ema_lenn": [10]}}, "'ema_lenn'"),
        ({"strategy": {"stopp": 0.1}}, "'stopp'"),
        ({"strategies": {"stop": 0.1}}, "'strategies'"),
        ({"atc": {"ema_len": []}}, "ema_len is an empty list"),
        ({"atc": {"ema_len": [10, 10]}}, "ema_len repeats"),
        ({"atc": {"ema_len": [10, 3]}}, "ema_len"),
        ({"strategy": {"direction": ["sideways"]}}, "direction"),
        ({"strategy": {"stop": [-0.1]}}, "stop"),
        ({"atc": {"ema_len": [[10]]}}, "ema_len"),
        ({"atc": [1, 2]}, "[atc]"),
        ({"title": "x", "zz": 1, "atc": {}}, "'title', 'zz'"),
        ({"atc": {"wma_len": 10**12}}, "wma_len must be <= 10000"),
        ({"strategy": {"fee_bps": 10_000}}, "fee_bps must be < 10000"),
        ({"strategy": {"fee_bps": [5, 5.0]}}, "fee_bps repeats"),
        ({"strategy": {"stop": [0, 0.0]}}, "stop repeats"),
        ({"strategy": {"stop": [0.0, -0.0]}}, "stop repeats"),
    ],
)
def test_grid_errors_name_the_key(document, named):
    with pytest.raises(GridError) as info:
        parse_grid(document, where="g.toml")
    message = str(info.value)
    assert named in message and message.startswith("g.toml") and "\n" not in message


def test_a_grid_of_too_many_sets_in_all_is_refused_though_each_table_is_not():
    grid = {"atc": {"ema_len": list(range(7, 407))}, "strategy": {"fee_bps": list(range(300))}}
    with pytest.raises(GridError) as info:
        parse_grid(grid, where="g.toml")
    message = str(info.value)
    assert "400 [atc] sets x 300 [strategy] sets = 120000 sets (at most 100000)" in message
    assert message.startswith("g.toml") and "\n" not in message


def test_an_unreadable_grid_file_is_one_error(tmp_path):
    bad = tmp_path / "g.toml"
    bad.write_text("[atc\nema_len = 1")
    with pytest.raises(GridError, match="cannot read grid"):
        load_grid(bad)
    with pytest.raises(GridError, match="cannot read grid"):
        load_grid(tmp_path / "missing.toml")


# -- the OHLC reader ---------------------------------------------------------------------


def test_ohlc_reader_counts_bad_bars_with_file_and_line(tmp_path):
    path = tmp_path / "bars.csv"
    path.write_text(
        "symbol,time,open,high,low,close\n"
        "A,2024-01-01T00:00:00Z,10,11,9,10.5\n"
        "A,2024-01-01T00:01:00Z,10,9,11,10.5\n"  # high < low
        "A,2024-01-01T00:02:00Z,12,11,9,10.5\n"  # open above the high
        "A,2024-01-01T00:03:00Z,10,11,9,nan\n"  # not a number
        "B,2024-01-01T00:01:00Z,10,11,9,10.5\n"
        "B,2024-01-01T00:00:00Z,10,11,9,10.5\n"
        "A,2024-01-01T00:00:00Z,10,11,9,10.5\n"  # a repeated time
        "A,2024-01-01T00:04:00Z,10,11,0,10.5\n"  # a price not > 0
    )
    table = read_ohlc(path)
    assert table.symbols.tolist() == ["A", "B", "B"]
    assert np.all(np.diff(table.times[1:]) > 0)
    bad = table.bad_rows
    assert dict(bad.counts) == {"bad_ohlc": 3, "bad_close": 1, "duplicate_time": 1}
    assert "bars.csv:3: bad_ohlc" in "\n".join(bad.lines())
    assert "bars.csv:8: duplicate_time" in "\n".join(bad.lines())


def test_ohlc_reader_names_a_missing_price_column(tmp_path):
    path = tmp_path / "bars.csv"
    path.write_text("symbol,time,close\nA,2024-01-01,1\n")
    with pytest.raises(InputError, match="no column 'open'"):
        read_ohlc(path)


# -- period metrics ----------------------------------------------------------------------


def test_period_metrics_split_the_equity_curve_and_the_trades():
    keys = pa.table({"symbol": ["A"], "interval": ["1m"], "params_id": [0], "strategy_id": [0]})
    equity = np.array([1.0, 1.1, 0.99, 1.2, 1.08, 1.32])
    held = np.array([False, True, True, False, True, True])
    curves = Curves(keys, np.array([0, 6]), np.arange(6) * 10, equity, held)
    trades = pa.table({
        "symbol": ["A", "A"], "interval": ["1m"] * 2, "params_id": [0, 0],
        "strategy_id": [0, 0], "exit_time": [30, 50], "return": [0.2, -0.01],
    })  # fmt: skip
    train = period_metrics(curves, trades, 30, "train").to_pylist()[0]
    test = period_metrics(curves, trades, 30, "test").to_pylist()[0]
    assert (train["trades"], train["wins"], test["trades"], test["wins"]) == (0, 0, 2, 1)
    assert train["total_return"] == pytest.approx(-0.01)
    assert train["max_drawdown"] == pytest.approx(1 - 0.99 / 1.1)
    assert train["exposure"] == pytest.approx(2 / 3)
    assert test["total_return"] == pytest.approx(1.32 / 0.99 - 1)
    assert test["max_drawdown"] == pytest.approx(1 - 1.08 / 1.2)
    assert test["final_equity"] == 1.32 and test["period"] == "test"


# -- the command -------------------------------------------------------------------------


def test_sweep_shows_the_file_being_read_then_the_streams(
    capsys, monkeypatch, tmp_path, sweep_files
):
    import atc_stream.app.jobs.sweep as job

    monkeypatch.setattr(job, "READ_BAR_DELAY_S", 0.0)  # as a file that takes seconds to read
    data, grid = sweep_files
    code, _, stderr = run_cli(
        capsys, ["sweep", str(data), "--grid", str(grid), "-o", str(tmp_path / "out"),
                 "--progress", "--backend", "cpu"],
    )  # fmt: skip
    assert code == 0, stderr
    reading = stderr.index(f"reading {data.name}")
    assert stderr.index("sweep") > reading and " bar" in stderr[reading:]


def test_sweep_writes_the_tables_and_prints_the_top_sets(capsys, tmp_path, sweep_files):
    data, grid = sweep_files
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(
        capsys, ["sweep", str(data), "--grid", str(grid), "-o", str(out), "--top", "3",
                 "--no-progress", "--backend", "cpu"],
    )  # fmt: skip
    assert code == 0, stderr
    metrics = pq.read_table(out / "metrics.parquet")
    trades = pq.read_table(out / "trades.parquet")
    assert metrics.num_rows == 3 * 2 * 2
    for column in ("symbol", "params_id", "strategy_id", "trades", "total_return", "period"):
        assert column in metrics.column_names
    assert set(metrics.column("period").to_pylist()) == {"all"}
    for column in ("symbol", "params_id", "strategy_id", "side", "entry_time", "exit_time",
                   "reason", "return"):  # fmt: skip
        assert column in trades.column_names
    assert pq.read_table(out / "params.parquet").column("ema_len").to_pylist() == [10, 14]
    strategies = pq.read_table(out / "strategies.parquet")
    assert strategies.column("direction").to_pylist() == ["long_short", "long_only"]
    ranking = pq.read_table(out / "ranking.parquet")
    assert ranking.num_rows == 4 and ranking.column("rank").to_pylist() == [1, 2, 3, 4]
    returns = ranking.column("total_return").to_pylist()
    assert returns == sorted(returns, reverse=True)
    lines = stdout.strip().splitlines()
    assert lines[0].split()[:5] == ["rank", "params_id", "strategy_id", "ema_len", "direction"]
    assert len(lines) == 1 + 3
    assert "swept 3 symbols x 2 parameter sets x 2 strategies = 12 streams" in stderr
    umask = os.umask(0)
    os.umask(umask)
    for table in out.iterdir():  # readable as any file the user writes, not private
        assert table.stat().st_mode & 0o777 == 0o666 & ~umask, table.name


def test_sweep_notes_parameter_sets_that_never_became_ready(capsys, tmp_path, sweep_files):
    _, grid = sweep_files  # ema_len 10 and 14 with the other lengths 28: ready at bar 66
    short = tmp_path / "short.parquet"
    pq.write_table(ohlc_frame(bars=20), short)
    code, _, stderr = run_cli(
        capsys, ["sweep", str(short), "--grid", str(grid), "-o", str(tmp_path / "out"),
                 "--no-progress"],
    )  # fmt: skip
    assert code == 0, stderr
    assert "note: 2 of 2 parameter sets never became ready: they need 67+ bars" in stderr
    assert "the longest history has 20" in stderr
    code, _, stderr = run_cli(
        capsys, ["sweep", str(sweep_files[0]), "--grid", str(grid), "-o", str(tmp_path / "out2"),
                 "--no-progress"],
    )  # fmt: skip
    assert code == 0 and "never became ready" not in stderr, stderr


def test_sweep_into_a_file_is_one_line(capsys, tmp_path, sweep_files):
    data, grid = sweep_files
    a_file = tmp_path / "afile.txt"
    a_file.write_text("mine")
    code, _, stderr = run_cli(capsys, ["sweep", str(data), "--grid", str(grid), "-o", str(a_file)])
    assert code == 2, stderr
    assert "is a file: a sweep writes a directory of tables" in stderr.strip().splitlines()[-1]
    assert a_file.read_text() == "mine"


def test_sweep_metrics_equal_backtest_and_the_reference(capsys, tmp_path, sweep_files):
    data, grid_path = sweep_files
    out = tmp_path / "out"
    code, _, stderr = run_cli(
        capsys, ["sweep", str(data), "--grid", str(grid_path), "-o", str(out), "--no-progress"]
    )
    assert code == 0, stderr
    grid = load_grid(grid_path)
    bars = pq.read_table(data)
    expected = backtest(bars, grid.params, grid.strategies).metrics_arrow()
    swept = pq.read_table(out / "metrics.parquet").drop_columns(["period"])
    order = [(k, "ascending") for k in ("symbol", "params_id", "strategy_id")]
    assert swept.sort_by(order).equals(expected.select(swept.column_names).sort_by(order))
    frame = bars.filter(pc.equal(bars.column("symbol"), "BBB"))
    oracle = backtest_series(
        *(frame.column(c).to_numpy() for c in ("open", "high", "low", "close")),
        grid.params[1], grid.strategies[0],
    ).metrics  # fmt: skip
    row = (
        swept.filter(
            pc.and_(pc.equal(swept.column("symbol"), "BBB"), pc.equal(swept.column("params_id"), 1))
        )
        .filter(pc.equal(pc.field("strategy_id"), 0))
        .to_pylist()[0]
    )
    assert {k: row[k] for k in oracle} == oracle


def test_train_until_ranks_on_train_and_shows_test_beside_it(capsys, tmp_path, sweep_files):
    data, grid_path = sweep_files
    out = tmp_path / "out"
    split = "2024-01-01T02:30:00Z"  # bar 150 of 240
    code, stdout, stderr = run_cli(
        capsys, ["sweep", str(data), "--grid", str(grid_path), "-o", str(out),
                 "--train-until", split, "--rank-by", "max_drawdown", "--no-progress"],
    )  # fmt: skip
    assert code == 0, stderr
    header = stdout.splitlines()[0].split()
    assert header[5:7] == ["train.max_drawdown", "test.max_drawdown"]
    metrics = pq.read_table(out / "metrics.parquet")
    assert sorted(set(metrics.column("period").to_pylist())) == ["test", "train"]
    trades = pq.read_table(out / "trades.parquet")
    split_ms = START + 150 * MINUTE
    exits = pc.cast(trades.column("exit_time"), pa.int64()).to_numpy()
    periods = np.array(trades.column("period").to_pylist())
    assert np.array_equal(periods == "train", exits < split_ms)
    grid = load_grid(grid_path)
    full = backtest(pq.read_table(data), grid.params, grid.strategies)
    whole = full.metrics_arrow()
    equity = full.equity_arrow()
    for row in whole.to_pylist():
        key = {k: row[k] for k in ("symbol", "params_id", "strategy_id")}
        mine = [r for r in metrics.to_pylist() if all(r[k] == v for k, v in key.items())]
        train, test = sorted(mine, key=lambda r: r["period"], reverse=True)
        assert train["trades"] + test["trades"] == row["trades"]
        assert test["final_equity"] == row["final_equity"]
        curve = equity.filter(
            pc.and_(pc.and_(pc.equal(equity.column("symbol"), key["symbol"]),
                            pc.equal(equity.column("params_id"), key["params_id"])),
                    pc.equal(equity.column("strategy_id"), key["strategy_id"]))
        )  # fmt: skip
        at_split = curve.column("equity").to_numpy()[149]
        assert train["total_return"] == at_split - 1.0
        assert test["total_return"] == row["final_equity"] / at_split - 1.0
    ranking = pq.read_table(out / "ranking.parquet")
    drawdowns = ranking.column("train.max_drawdown").to_pylist()
    assert drawdowns == sorted(drawdowns)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--rank-by", "luck"], "--rank-by"),
        (["--train-until", "soon"], "--train-until"),
        (["--train-until", "2030-01-01"], "--train-until"),
    ],
)
def test_sweep_refuses_bad_options_in_one_line(capsys, tmp_path, sweep_files, extra, says):
    data, grid = sweep_files
    code, _, stderr = run_cli(
        capsys, ["sweep", str(data), "--grid", str(grid), "-o", str(tmp_path), *extra]
    )
    assert code == 2 and says in stderr and len(stderr.strip().splitlines()) == 1


def test_sweep_reports_a_bad_grid_or_unreadable_data_in_one_line(capsys, tmp_path, sweep_files):
    data, _ = sweep_files
    grid = tmp_path / "g.toml"
    grid.write_text("[atc]\nema_lenn = [10]\n")
    code, _, stderr = run_cli(capsys, ["sweep", str(data), "--grid", str(grid)])
    assert code == 2 and "'ema_lenn'" in stderr and len(stderr.strip().splitlines()) == 1
    grid.write_text(GRID)
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet")
    code, _, stderr = run_cli(capsys, ["sweep", str(broken), "--grid", str(grid)])
    assert code == 2 and "cannot read Parquet" in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_sweep_refuses_a_length_beyond_the_maximum_in_one_line(capsys, tmp_path, sweep_files):
    data, _ = sweep_files
    assert ATCParams(ema_len=MAX_LENGTH).max_length == MAX_LENGTH + 6
    with pytest.raises(ValueError, match=f"ema_len must be <= {MAX_LENGTH}"):
        ATCParams(ema_len=MAX_LENGTH + 1)
    grid = tmp_path / "big.toml"
    grid.write_text("[atc]\nwma_len = 1000000000000\n")
    code, _, stderr = run_cli(
        capsys, ["sweep", str(data), "--grid", str(grid), "-o", str(tmp_path)]
    )
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    assert "wma_len must be <= 10000" in stderr


def test_a_sweep_stopped_by_ctrl_c_says_so_and_exits_130(
    capsys, tmp_path, sweep_files, monkeypatch
):
    import atc_stream.app.jobs.sweep as job

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(job, "read_ohlc", interrupted)
    data, grid = sweep_files
    args = ["sweep", str(data), "--grid", str(grid), "-o", str(tmp_path), "--no-progress"]
    code, _, stderr = run_cli(capsys, args)
    assert code == 130 and stderr == "atc-stream: interrupted\n"


def test_a_sweep_out_of_memory_is_one_line(capsys, tmp_path, sweep_files, monkeypatch):
    import atc_stream.app.jobs.sweep as job

    def too_big(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(job, "sweep_block", too_big)
    data, grid = sweep_files
    args = ["sweep", str(data), "--grid", str(grid), "-o", str(tmp_path), "--no-progress"]
    code, _, stderr = run_cli(capsys, [*args, "--backend", "cpu"])
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    assert "out of memory sweeping 4 sets over 720 bars" in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # the trades' temporary file too


def test_a_full_disk_while_trades_are_written_is_one_line(
    capsys, tmp_path, sweep_files, monkeypatch
):
    """A disk cannot be filled here: the Parquet writer fails as a full one makes it."""
    import pyarrow.parquet as parquet

    def full(self, table, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(parquet.ParquetWriter, "write_table", full)
    data, grid = sweep_files
    out = tmp_path / "out"
    args = ["sweep", str(data), "--grid", str(grid), "-o", str(out), "--no-progress"]
    code, _, stderr = run_cli(capsys, [*args, "--backend", "cpu"])
    assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert f"cannot write {out / 'trades.parquet'}: [Errno 28] No space left" in stderr
    assert sorted(p.name for p in out.iterdir()) == []


def test_a_sweep_stopped_between_blocks_leaves_no_temporary_file(
    tmp_path, sweep_files, monkeypatch
):
    """Ctrl-C after the first block's trades were written: no table, no temporary file."""
    import atc_stream.app.jobs.sweep as job

    calls = []
    job_block = job.sweep_block

    def second_interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return job_block(*args, **kwargs)

    monkeypatch.setattr(job, "sweep_block", second_interrupted)
    data, grid = sweep_files
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):  # the CLI turns it into one line and 130
        run_sweep(
            data=data, grid=grid, outdir=out, train_until=None, top=3, rank_by="total_return",
            backend="cpu", progress=False, chunk_streams=4,  # a symbol a block
        )  # fmt: skip
    assert len(calls) == 2 and sorted(p.name for p in out.iterdir()) == []


def test_sweep_backend_cuda_without_cuda_is_one_line(capsys, tmp_path, sweep_files):
    from atc_stream.kernels import cuda_available

    if cuda_available(allow_simulator=True)[0]:
        pytest.skip("CUDA runs here")
    data, grid = sweep_files
    args = ["sweep", str(data), "--grid", str(grid), "-o", str(tmp_path), "--backend", "cuda"]
    code, _, stderr = run_cli(capsys, args)
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    assert stderr.startswith("atc-stream: error: --backend cuda")


@pytest.mark.parametrize("where", ["data", "grid", "beside", "a table"])
def test_sweep_refuses_an_output_over_its_inputs_before_reading(
    capsys, tmp_path, sweep_files, where
):
    data, grid = sweep_files
    if where == "a table":  # DATA is a file the sweep would write
        data = tmp_path / "trades.parquet"
        data.write_bytes(sweep_files[0].read_bytes())
    before = (data.read_bytes(), grid.read_text())
    outdir = {"data": data, "grid": grid, "beside": data.parent / "out", "a table": tmp_path}
    outdir = outdir[where]
    source = data.parent if where == "beside" else data  # a directory DATA holds the output
    code, _, stderr = run_cli(
        capsys, ["sweep", str(source), "--grid", str(grid), "-o", str(outdir)]
    )
    assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert stderr.startswith(f"atc-stream: error: -o {outdir} ") and "choose another path" in stderr
    assert (data.read_bytes(), grid.read_text()) == before and not (data.parent / "out").exists()


def test_sweep_says_it_compiles_before_a_first_run_compile(tmp_path, sweep_files):
    """With an empty kernel cache the first line on stderr says so (killed right then:
    the compile itself takes minutes)."""
    data, grid = sweep_files
    env = {**os.environ, "ATC_STREAM_CACHE_DIR": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "atc_stream", "sweep", str(data), "--grid", str(grid),
               "-o", str(tmp_path / "out"), "--no-progress", "--backend", "cpu"]  # fmt: skip
    with subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True) as proc:
        try:
            first = proc.stderr.readline()
        finally:
            proc.kill()
    assert first.startswith("atc-stream: compiling kernels (first run only)"), first


def test_sweep_labels_rows_with_the_bars_interval(capsys, tmp_path):
    hourly = ohlc_frame(symbols=("AAA", "BBB"), bars=200)
    times = pc.add(pc.multiply(pc.subtract(hourly.column("time"), START), 60), START)
    data = tmp_path / "hourly.parquet"
    pq.write_table(hourly.set_column(1, "time", times), data)
    grid = tmp_path / "g.toml"
    grid.write_text("[strategy]\nstop = 0.02\n")
    args = ["sweep", str(data), "--grid", str(grid), "--no-progress"]
    code, _, stderr = run_cli(capsys, [*args, "-o", str(tmp_path / "a")])
    assert code == 0, stderr
    assert "of 1h bars" in stderr
    for name in ("metrics", "trades"):
        table = pq.read_table(tmp_path / "a" / f"{name}.parquet")
        assert set(table.column("interval").to_pylist()) == {"1h"}, name
    code, _, stderr = run_cli(capsys, [*args, "-o", str(tmp_path / "b"), "--interval", "1h"])
    assert code == 0, stderr
    code, _, stderr = run_cli(capsys, [*args, "-o", str(tmp_path / "c"), "--interval", "1m"])
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    assert "--interval 1m does not match the bars, which are 1h apart" in stderr
    assert not (tmp_path / "c").exists()


def test_train_until_averages_only_the_symbols_with_bars_in_the_period(tmp_path, capsys):
    """DDD's bars all come before the split: no test metrics of its own, and the test
    averages are those of the other symbols. The metrics do not depend on the chunking."""
    bars = pa.concat_tables(
        [ohlc_frame(symbols=("AAA", "BBB", "CCC"), bars=240), ohlc_frame(("DDD",), bars=100)]
    )
    data = tmp_path / "bars.parquet"
    pq.write_table(bars, data)
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    outs = []
    for chunk in (4096, 1):
        outs.append(tmp_path / f"out{chunk}")
        assert run_sweep(
            data=data, grid=grid, outdir=outs[-1], train_until="2024-01-01T02:30:00Z", top=3,
            rank_by="total_return", backend="cpu", progress=False, chunk_streams=chunk,
        ) == 0  # fmt: skip
    capsys.readouterr()
    metrics = pq.read_table(outs[0] / "metrics.parquet")
    assert metrics.equals(pq.read_table(outs[1] / "metrics.parquet"))
    assert metrics.column("period").to_pylist() == ["train"] * 16 + ["test"] * 16
    keys = [(r["symbol"], r["params_id"], r["strategy_id"]) for r in metrics.to_pylist()]
    assert keys[:16] == sorted(keys[:16]) and keys[16:] == sorted(keys[16:])
    rows = metrics.to_pylist()
    ddd = [r for r in rows if r["symbol"] == "DDD" and r["period"] == "test"]
    assert len(ddd) == 4
    assert all(r["total_return"] is None and r["trades"] == 0 for r in ddd)
    ranking = pq.read_table(outs[0] / "ranking.parquet").to_pylist()
    for row in ranking:
        mine = [r for r in rows if (r["params_id"], r["strategy_id"]) == (row["params_id"],
                row["strategy_id"])]  # fmt: skip
        test = [r["total_return"] for r in mine if r["period"] == "test" and r["symbol"] != "DDD"]
        assert row["test.symbols"] == 3 and row["train.symbols"] == 4
        assert row["test.total_return"] == pytest.approx(np.mean(test), rel=1e-12)


@pytest.mark.parametrize("train_until", [None, "2024-01-01T02:00:00Z"])
@pytest.mark.parametrize("chunk", [3, 1])
def test_the_tables_do_not_depend_on_how_the_streams_are_cut(
    capsys, tmp_path, sweep_files, train_until, chunk
):
    """3: one symbol a call, its parameter sets cut in two; 1: a stream a call. Every table
    is the one of a single call, row for row."""
    data, grid = sweep_files
    for name, streams in (("whole", 4096), ("cut", chunk)):
        assert run_sweep(
            data=data, grid=grid, outdir=tmp_path / name, train_until=train_until, top=3,
            rank_by="total_return", backend="cpu", progress=False, chunk_streams=streams,
        ) == 0  # fmt: skip
    capsys.readouterr()
    for table in ("metrics", "trades", "params", "strategies", "ranking"):
        whole = pq.read_table(tmp_path / "whole" / f"{table}.parquet")
        assert whole.equals(pq.read_table(tmp_path / "cut" / f"{table}.parquet")), table
    assert pq.read_table(tmp_path / "whole" / "trades.parquet").num_rows > 0


def test_a_sweep_holds_a_bounded_number_of_stream_bars_at_a_time(capsys, tmp_path, monkeypatch):
    """16x the streams over the same bars, calls of at most 8,000 stream-bars: the peak of
    the memory Python and NumPy allocate stays that of the small grid (one call with
    every stream took 6x), and the tables are those of one call."""
    import tracemalloc

    import atc_stream.app.sweep_blocks as blocks
    from atc_stream.app.durability import load_cpu_kernels

    data = tmp_path / "bars.parquet"
    pq.write_table(ohlc_frame(symbols=("AAA", "BBB"), bars=2000), data)
    small, big = tmp_path / "small.toml", tmp_path / "big.toml"
    small.write_text("[atc]\nema_len = [10, 14]\n[strategy]\nstop = [0.01, 0.02]\n")
    big.write_text(
        "[atc]\nema_len = [10, 12, 14, 16, 18, 20, 24, 28]\n"
        "[strategy]\nstop = [0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07]\n"
    )
    load_cpu_kernels(strategies=True, progress=False)

    def sweep(grid, outdir) -> float:
        tracemalloc.start()
        try:
            assert run_sweep(
                data=data, grid=grid, outdir=outdir, train_until="2024-01-01T12:00:00Z",
                top=3, rank_by="total_return", backend="cpu", progress=False,
            ) == 0  # fmt: skip
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    whole = tmp_path / "whole"
    sweep(big, whole)
    monkeypatch.setattr(blocks, "CHUNK_STREAM_BARS", 8000)
    assert blocks.streams_per_call(read_ohlc(data)) == 4
    small_peak = sweep(small, tmp_path / "small")
    big_peak = sweep(big, tmp_path / "big")
    capsys.readouterr()
    assert big_peak < 1.5 * small_peak, (big_peak, small_peak)
    for table in ("metrics", "trades", "ranking"):
        one = pq.read_table(whole / f"{table}.parquet")
        assert one.equals(pq.read_table(tmp_path / "big" / f"{table}.parquet")), table


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: parse_strategy("max_hold=99999999999999999999"), "max_hold must be an int in"),
        (lambda: Strategy(max_hold=2**63), "max_hold must be an int in"),
        (lambda: ATCParams(cutout=2**63), "cutout must be an int in"),
    ],
)
def test_a_count_beyond_int64_is_refused_not_overflowed(make, named):
    with pytest.raises(ValueError, match=named):
        make()
    assert Strategy(max_hold=2**63 - 1).max_hold == 2**63 - 1  # the largest count still runs


def test_an_empty_strategy_spec_or_a_stray_key_is_refused(tmp_path):
    with pytest.raises(ValueError, match="an empty strategy"):
        strategies_from_specs([""])
    with pytest.raises(ValueError, match="fee_bps must be < 10000"):
        parse_strategy("fee_bps=10000")
    path = tmp_path / "s.toml"
    path.write_text('title = "x"\n[[strategy]]\nstop = 0.1\n')
    with pytest.raises(ValueError, match="unknown key.*title"):
        load_strategies(path)
    path.write_text("")
    with pytest.raises(ValueError, match="no strategy"):
        load_strategies(path)
    path.write_text("[[strategy]]\n")  # an empty table: the defaults, said so in the docs
    assert load_strategies(path) == [Strategy()]


def test_strategy_help_shows_the_table_name_and_replay_interval_default():
    from typer.testing import CliRunner

    from atc_stream.app.cli import app

    runner = CliRunner(env={"COLUMNS": "240", "TERMINAL_WIDTH": "240", "NO_COLOR": "1"})
    for command in ("replay", "live", "run-stream"):
        text = runner.invoke(app, [command, "--help"]).output
        assert "TOML file of [[strategy]] tables" in text, command
    text = runner.invoke(app, ["replay", "--help"]).output
    assert "inferred from their spacing" in text and "default 1m" not in text


# -- the chart ---------------------------------------------------------------------------


def test_plot_backtest_and_plot_trades_write_pngs(capsys, tmp_path, sweep_files):
    pytest.importorskip("matplotlib")
    from atc_stream.app.plot_backtest import plot_backtest

    data, grid_path = sweep_files
    bars = pq.read_table(data)
    grid = load_grid(grid_path)
    result = backtest(bars, grid.params, grid.strategies)
    png = tmp_path / "one.png"
    plot_backtest(result, bars, "AAA", params_id=1, strategy_id=0, path=png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    out = tmp_path / "out"
    code, _, stderr = run_cli(
        capsys, ["sweep", str(data), "--grid", str(grid_path), "-o", str(out), "--no-progress"]
    )
    assert code == 0, stderr
    chart = tmp_path / "chart.png"
    code, _, stderr = run_cli(
        capsys, ["plot", "--trades", str(out / "trades.parquet"), "--bars", str(data),
                 "--symbol", "CCC", "--params-id", "1", "--strategy-id", "1", "-o", str(chart)],
    )  # fmt: skip
    assert code == 0, stderr
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, _, stderr = run_cli(
        capsys, ["plot", "--trades", str(out / "trades.parquet"), "--symbol", "CCC"]
    )
    assert code == 2 and "--bars" in stderr
