"""The strategy kernels trade exactly like the reference backtest (trade for trade, bit for
bit), on the CPU and under the CUDA simulator, and ``atc_stream.backtest`` wraps them in
checked inputs and tables keyed like signal rows."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_targets import cuda_kernels_run
from golden_data import load_golden_cases
from hypothesis import given, settings
from hypothesis import strategies as st
from short_params import SHORT

from atc_stream import ATCParams, BacktestResult, Strategy, backtest
from atc_stream.core.reference_backtest import backtest_reference, backtest_series
from atc_stream.core.strategy import EXIT_REASONS
from atc_stream.kernels.backtest_cpu import run_backtest
from atc_stream.state import strategy_layout as SL

BASE_TIME = 1_700_000_000_000
BAR_MS = 60_000
STRATEGIES = [
    Strategy(),
    Strategy(direction="long_only", fee_bps=10, slippage_bps=5),
    Strategy(direction="short_only", stop=0.01, take_profit=0.02),
    Strategy(stop=0.02, take_profit=0.03, max_hold=5, fee_bps=7.5, slippage_bps=2),
]

simulated = cuda_kernels_run


def strategy_tables(strategies):
    spv = np.array([[s.stop, s.take_profit, s.fee, s.slippage] for s in strategies])
    spi = np.array([[s.max_hold, s.long_target, s.short_target] for s in strategies], np.int64)
    return spv, spi


def one_series_args(o, h, lo, c, longs, shorts, ready, strategies):
    """Kernel arguments: one bar series, one signal series, one stream per strategy."""
    n = len(strategies)
    zeros = np.zeros(n, np.int64)
    return (
        *(np.asarray(x, np.float64)[None, :] for x in (o, h, lo, c)),
        np.array([len(c)], np.int64),
        *(np.asarray(x, bool)[None, :] for x in (ready, longs, shorts)),
        zeros, zeros, np.arange(n, dtype=np.int64), *strategy_tables(strategies),
    )  # fmt: skip


def assert_stream_equals_reference(out, s, ref, n_bars):
    """Stream ``s`` of a kernel run has the reference's trades, equity, sides and metrics,
    every float to the last bit."""
    assert np.array_equal(out["equity"][s, :n_bars], ref.equity), "equity"
    assert out["held"][s, :n_bars].tolist() == ref.side.tolist(), "sides"
    count = int(out["metrics"][s, SL.M_TRADES])
    assert count == len(ref.trades)
    for row, trade in zip(out["trades"][s, :count], ref.trades, strict=True):
        got = (
            int(row[SL.TR_SIDE]), int(row[SL.TR_ENTRY_BAR]), int(row[SL.TR_EXIT_BAR]),
            EXIT_REASONS[int(row[SL.TR_REASON])],
        )  # fmt: skip
        assert got == (trade.side, trade.entry_bar, trade.exit_bar, trade.reason)
        assert row[SL.TR_ENTRY_PRICE] == trade.entry_price
        assert row[SL.TR_EXIT_PRICE] == trade.exit_price
        assert row[SL.TR_RETURN] == trade.ret
    expected = ref.metrics
    got = dict(zip(SL.METRIC_NAMES, out["metrics"][s].tolist(), strict=True))
    assert got == {name: float(expected[name]) for name in SL.METRIC_NAMES}


def check_against_reference(o, h, lo, c, longs, shorts, ready, strategies):
    out = run_backtest(*one_series_args(o, h, lo, c, longs, shorts, ready, strategies))
    for s, strategy in enumerate(strategies):
        ref = backtest_reference(
            [float(x) for x in o], [float(x) for x in h], [float(x) for x in lo],
            [float(x) for x in c], [int(x) for x in longs], [int(x) for x in shorts],
            [bool(x) for x in ready], strategy,
        )  # fmt: skip
        assert_stream_equals_reference(out, s, ref, len(c))
    return out


# -- the kernels equal the reference ------------------------------------------------------


def ohlc_from_closes(closes, seed):
    rng = np.random.default_rng(seed)
    opens = np.r_[closes[0], closes[:-1]] * np.exp(rng.normal(0, 0.004, closes.shape[0]))
    high = np.maximum(opens, closes) * (1 + np.abs(rng.normal(0, 0.006, closes.shape[0])))
    low = np.minimum(opens, closes) * (1 - np.abs(rng.normal(0, 0.006, closes.shape[0])))
    return opens, high, low, closes


@pytest.mark.parametrize("case", load_golden_cases(), ids=lambda case: case[0])
def test_backtest_equals_the_reference_on_the_golden_series(case):
    name, params, closes, _ = case
    o, h, lo, c = ohlc_from_closes(closes, seed=len(name))
    times = BASE_TIME + BAR_MS * np.arange(c.shape[0], dtype=np.int64)
    bars = {"symbol": ["X"] * c.shape[0], "time": times, "open": o, "high": h, "low": lo,
            "close": c}  # fmt: skip
    result = backtest(bars, params, STRATEGIES)
    metrics = result.metric_columns
    equity = result.equity_columns
    trades = result.trade_columns
    for s, strategy in enumerate(STRATEGIES):
        ref = backtest_series(o, h, lo, c, params, strategy)
        expected = ref.metrics
        for metric in SL.METRIC_NAMES:
            assert metrics[metric][s] == expected[metric], (s, metric)
        mine = equity["strategy_id"] == s
        assert np.array_equal(equity["equity"][mine], ref.equity)
        assert equity["side"][mine].tolist() == ref.side.tolist()
        mine = trades["strategy_id"] == s
        assert trades["exit_time"][mine].tolist() == [times[t.exit_bar] for t in ref.trades]
        assert trades["entry_time"][mine].tolist() == [times[t.entry_bar] for t in ref.trades]
        assert trades["reason"][mine].tolist() == [t.reason for t in ref.trades]
        assert trades["return"][mine].tolist() == [t.ret for t in ref.trades]
        assert trades["exit_price"][mine].tolist() == [t.exit_price for t in ref.trades]


@st.composite
def ohlc_and_events(draw):
    """Bars on a coarse price grid (ties with stop and take-profit levels happen), with
    gaps, wide ranges and events on consecutive bars."""
    n = draw(st.integers(1, 40))
    moves = draw(st.lists(st.integers(-6, 6), min_size=n, max_size=n))
    gaps = draw(st.lists(st.integers(-4, 4), min_size=n, max_size=n))
    ups = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    downs = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    o, h, lo, c = [], [], [], []
    previous = 100.0
    for k in range(n):
        opened = max(previous + 0.5 * gaps[k], 60.0)
        closed = max(opened + 0.5 * moves[k], 60.0)
        o.append(opened)
        c.append(closed)
        h.append(max(opened, closed) + 0.5 * ups[k])
        lo.append(min(opened, closed) - 0.5 * downs[k])
        previous = closed
    events = draw(st.lists(st.sampled_from([0, 0, 1, -1]), min_size=n, max_size=n))
    ready = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    longs = [e == 1 for e in events]
    shorts = [e == -1 for e in events]
    return o, h, lo, c, longs, shorts, ready


trading_rules = st.builds(
    Strategy,
    direction=st.sampled_from(["long_short", "long_only", "short_only"]),
    stop=st.sampled_from([0.0, 0.005, 0.01, 0.03]),
    take_profit=st.sampled_from([0.0, 0.005, 0.02]),
    max_hold=st.sampled_from([0, 1, 3]),
    fee_bps=st.sampled_from([0.0, 10.0, 2.5]),
    slippage_bps=st.sampled_from([0.0, 5.0, 1.0]),
)


@settings(max_examples=80)
@given(ohlc_and_events(), st.lists(trading_rules, min_size=1, max_size=6))
def test_kernels_equal_the_reference_on_generated_bars(data, strategies):
    check_against_reference(*data, strategies)


def test_gaps_through_stops_and_stop_with_take_profit_in_one_bar():
    flat = (100.0, 100.0, 100.0, 100.0)
    bars = [flat, flat, (94.0, 95.0, 93.0, 94.5), flat, (100.0, 106.0, 94.0, 100.0), flat,
            (100.0, 106.0, 99.0, 103.0)]  # fmt: skip
    o, h, lo, c = (list(x) for x in zip(*bars, strict=True))
    longs = [True, False, False, True, False, True, False]
    shorts = [False] * 7
    strategies = [Strategy(stop=0.05, take_profit=0.05, slippage_bps=10, fee_bps=3)]
    out = check_against_reference(o, h, lo, c, longs, shorts, [True] * 7, strategies)
    reasons = [EXIT_REASONS[int(r)] for r in out["trades"][0, :3, SL.TR_REASON]]
    assert reasons == ["stop", "stop", "take_profit"]


def test_a_signal_exit_then_a_stop_of_the_new_entry_closes_two_trades_in_one_bar():
    flat = (100.0, 100.0, 100.0, 100.0)
    bars = [flat, flat, (100.0, 103.0, 99.0, 101.0)]
    o, h, lo, c = (list(x) for x in zip(*bars, strict=True))
    out = check_against_reference(
        o, h, lo, c, [True, False, False], [False, True, False], [True] * 3,
        [Strategy(stop=0.02)],
    )  # fmt: skip
    assert out["metrics"][0, SL.M_TRADES] == 2  # the short is stopped out by bar 2's high
    assert out["trades"][0, :2, SL.TR_EXIT_BAR].tolist() == [2.0, 2.0]


# -- CPU and the CUDA simulator ---------------------------------------------------------


def sweep_args(n_series=3, n_signals_per=2, n_bars=50, seed=5):
    rng = np.random.default_rng(seed)
    closes = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, (n_series, n_bars)), axis=1))
    o, h, lo, c = ohlc_from_closes(closes.ravel(), seed)
    o, h, lo, c = (x.reshape(n_series, n_bars) for x in (o, h, lo, c))
    lengths = np.array([n_bars, n_bars - 7, n_bars // 2][:n_series], np.int64)
    n_signals = n_series * n_signals_per
    events = rng.choice([0, 0, 0, 1, -1], size=(n_signals, n_bars))
    ready = np.arange(n_bars)[None, :] >= rng.integers(0, 10, n_signals)[:, None]
    grid = np.indices((n_series, n_signals_per, len(STRATEGIES))).reshape(3, -1)
    bar_series = np.ascontiguousarray(grid[0], np.int64)
    signal_series = bar_series * n_signals_per + grid[1]
    return (
        o, h, lo, c, lengths, ready, events == 1, events == -1, bar_series, signal_series,
        np.ascontiguousarray(grid[2], np.int64), *strategy_tables(STRATEGIES),
    )  # fmt: skip


def test_each_stream_of_a_sweep_equals_its_reference():
    args = sweep_args()
    out = run_backtest(*args)
    o, h, lo, c, lengths, ready, longs, shorts, bars, signals, rows = args[:11]
    for s in range(bars.shape[0]):
        b, g, n = bars[s], signals[s], lengths[bars[s]]
        ref = backtest_reference(
            o[b, :n].tolist(), h[b, :n].tolist(), lo[b, :n].tolist(), c[b, :n].tolist(),
            longs[g, :n].tolist(), shorts[g, :n].tolist(), ready[g, :n].tolist(),
            STRATEGIES[rows[s]],
        )  # fmt: skip
        assert_stream_equals_reference(out, s, ref, n)
        assert np.isnan(out["equity"][s, n:]).all()


def test_streams_with_more_trades_than_the_first_pass_keeps_run_again_with_room():
    args = sweep_args()
    roomy = run_backtest(*args, trade_capacity=args[0].shape[1])
    counts = roomy["metrics"][:, SL.M_TRADES]
    assert counts.max() > 2 and (counts <= 2).any()  # some overflow a capacity of 2, some not
    tight = run_backtest(*args, trade_capacity=2)
    for name in ("equity", "held", "metrics", "sv", "sc"):
        assert np.array_equal(tight[name], roomy[name], equal_nan=True), name
    room = tight["trades"].shape[1]
    assert room == counts.max()
    assert np.array_equal(tight["trades"], roomy["trades"][:, :room], equal_nan=True)


@pytest.mark.cudasim
@simulated
def test_cuda_kernel_equals_the_cpu_driver_bit_for_bit():
    from atc_stream.kernels.backtest_cuda import run_backtest_cuda

    args = sweep_args(n_bars=40)
    cpu, gpu = run_backtest(*args), run_backtest_cuda(*args)
    assert cpu.keys() == gpu.keys()
    for name in cpu:
        assert np.array_equal(cpu[name], gpu[name], equal_nan=True), name


@pytest.mark.cudasim
@simulated
def test_backtest_on_the_cuda_backend_equals_the_cpu():
    bars = sample_bars(n=30, symbols=("A", "B"))
    cpu = backtest(bars, SHORT, STRATEGIES[:2], backend="cpu")
    gpu = backtest(bars, SHORT, STRATEGIES[:2], backend="cuda")
    for table in ("trade_columns", "metric_columns", "equity_columns"):
        a, b = getattr(cpu, table), getattr(gpu, table)
        for name in a:
            assert np.array_equal(a[name], b[name]), (table, name)


# -- backtest(): inputs and tables --------------------------------------------------------


def sample_bars(n=120, symbols=("AAA", "BBB"), seed=11):
    rng = np.random.default_rng(seed)
    columns = {k: [] for k in ("symbol", "time", "open", "high", "low", "close")}
    for k, symbol in enumerate(symbols):
        length = n - 10 * k
        c = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, length)))
        o, h, lo, c = ohlc_from_closes(c, seed + k)
        columns["symbol"] += [symbol] * length
        columns["time"] += (BASE_TIME + BAR_MS * np.arange(length)).tolist()
        for name, values in zip(("open", "high", "low", "close"), (o, h, lo, c), strict=True):
            columns[name] += values.tolist()
    return {name: np.array(values) for name, values in columns.items()}


def test_backtest_tables_have_one_row_per_stream_bar_and_trade():
    bars = sample_bars()
    result = backtest(bars, [SHORT, ATCParams()], STRATEGIES[:3], interval="5m")
    assert isinstance(result, BacktestResult)
    metrics = result.metrics
    assert len(metrics) == 2 * 2 * 3
    assert list(metrics.columns[:4]) == ["symbol", "interval", "params_id", "strategy_id"]
    assert metrics[["symbol", "params_id", "strategy_id"]].drop_duplicates().shape[0] == 12
    assert set(metrics["interval"]) == {"5m"}
    equity = result.equity
    assert len(equity) == (120 + 110) * 2 * 3
    assert str(equity["time"].dtype) == "datetime64[ms, UTC]"
    trades = result.trades
    assert list(trades.columns) == [
        "symbol", "interval", "params_id", "strategy_id", "side", "entry_time",
        "exit_time", "entry_price", "exit_price", "reason", "return",
    ]  # fmt: skip
    assert (trades["exit_time"] >= trades["entry_time"]).all()
    assert set(trades["side"]) <= {1, -1} and set(trades["reason"]) <= set(EXIT_REASONS)
    per_stream = trades.groupby(["symbol", "params_id", "strategy_id"]).size()
    counted = metrics.set_index(["symbol", "params_id", "strategy_id"])["trades"]
    assert (per_stream.reindex(counted.index, fill_value=0) == counted).all()
    table = result.trades_arrow()
    assert table.num_rows == len(trades) and table.column_names == list(trades.columns)
    assert result.metrics_arrow().num_rows == 12
    assert result.equity_arrow().schema.field("time").type.tz == "UTC"


def test_pandas_arrow_and_dict_inputs_give_the_same_result():
    pd = pytest.importorskip("pandas")
    pa = pytest.importorskip("pyarrow")
    bars = sample_bars(n=90)
    frame = pd.DataFrame(bars)
    frame["time"] = pd.to_datetime(frame["time"], unit="ms", utc=True)
    results = [backtest(x, SHORT, STRATEGIES) for x in (bars, frame, pa.table(bars))]
    for other in results[1:]:
        for table in ("trade_columns", "metric_columns", "equity_columns"):
            a, b = getattr(results[0], table), getattr(other, table)
            assert all(np.array_equal(a[name], b[name]) for name in a), table


def test_interleaved_symbols_are_split_by_symbol():
    bars = sample_bars(n=80)
    order = np.argsort(bars["time"], kind="stable")  # rows of both symbols interleaved
    shuffled = {name: values[order] for name, values in bars.items()}
    a, b = backtest(bars, SHORT), backtest(shuffled, SHORT)
    assert np.array_equal(a.equity_columns["equity"], b.equity_columns["equity"])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda b: b.pop("high"), "no column.*'high'"),
        (lambda b: b["high"].__setitem__(5, b["low"][5] * 0.99), "row 5 .*high .* < low"),
        (lambda b: b["open"].__setitem__(7, b["high"][7] * 1.01), "row 7 .*open .* outside"),
        (lambda b: b["close"].__setitem__(8, b["low"][8] * 0.99), "row 8 .*close .* outside"),
        (lambda b: b["low"].__setitem__(3, np.nan), "row 3 .*low nan is not a finite price"),
        (lambda b: b["close"].__setitem__(4, -1.0), "row 4 .*close -1.0 is not a finite"),
        (
            lambda b: (b["open"].__setitem__(9, np.inf), b["close"].__setitem__(6, 1e9)),
            "row 6 .*close 1000000000.0 is outside",
        ),  # the first bad row, not the first check
        (lambda b: b["time"].__setitem__(9, b["time"][8]), "row 9 .*repeats .* row 8"),
        (lambda b: b["time"].__setitem__(9, b["time"][2]), "row 9 .*is before"),
    ],
)
def test_bad_bars_raise_naming_the_problem_and_the_first_row(edit, message):
    bars = sample_bars(n=40)
    edit(bars)
    with pytest.raises(ValueError, match=message):
        backtest(bars, SHORT)


def test_invalid_strategies_raise_naming_the_field():
    bars = sample_bars(n=20)
    with pytest.raises(ValueError, match="stop"):
        backtest(bars, SHORT, [{"stop": 2.0}])
    with pytest.raises(ValueError, match="strategies\\[1\\]"):
        backtest(bars, SHORT, [Strategy(), "stop"])
    with pytest.raises(ValueError, match="strategies is empty"):
        backtest(bars, SHORT, [])


@pytest.mark.parametrize("interval", ["banana", "1min", "", "0m", 60])
def test_an_interval_label_that_is_not_one_is_refused(interval):
    """The label goes into every row's key columns: one nothing can read is refused."""
    with pytest.raises(ValueError, match="interval must look like 1s, 1m.*ms, s, m, h, d, w"):
        backtest(sample_bars(n=20), SHORT, interval=interval)
    assert backtest(sample_bars(n=20), SHORT, interval="4h").metrics["interval"][0] == "4h"


# -- vectorbt where the rules coincide ---------------------------------------------------


@pytest.mark.parametrize("direction", ["long_short"])
def test_backtest_equals_vectorbt_from_signals_without_stops(direction):
    vbt = pytest.importorskip("vectorbt")
    pd = pytest.importorskip("pandas")
    from test_backtest_reference import random_ohlc

    from atc_stream.core.reference import compute_reference
    from atc_stream.core.schema import ready_bar

    o, h, lo, c = random_ohlc(800, seed=3)
    bars = {"symbol": ["X"] * 800, "time": np.arange(800), "open": o, "high": h,
            "low": lo, "close": c}  # fmt: skip
    strategy = Strategy(direction=direction, fee_bps=10, slippage_bps=5)
    ours = backtest(bars, ATCParams(), strategy)
    atc = compute_reference(c, ATCParams())
    ready = np.arange(800) >= ready_bar(ATCParams())

    def next_open(events):
        return np.r_[False, (events == 1)[:-1] & ready[:-1]]

    longs, shorts = next_open(atc["long"]), next_open(atc["short"])
    common = dict(
        close=pd.Series(c), price=pd.Series(o), size=np.inf, init_cash=1.0,
        fees=strategy.fee, slippage=strategy.slippage, freq="1min",
    )  # fmt: skip
    if direction == "long_short":
        none = np.zeros_like(ready)
        pf = vbt.Portfolio.from_signals(
            entries=longs, exits=none, short_entries=shorts, short_exits=none,
            upon_opposite_entry="reverse", **common,
        )  # fmt: skip
    else:
        pf = vbt.Portfolio.from_signals(
            entries=shorts, exits=longs, direction="shortonly", **common
        )
    np.testing.assert_allclose(
        pf.value().to_numpy(), ours.equity_columns["equity"], rtol=0, atol=1e-9
    )
    theirs = pf.trades.records_readable
    closed = theirs[theirs["Status"] == "Closed"]
    trades = ours.trade_columns
    assert len(closed) == trades["side"].shape[0] > 5
    np.testing.assert_array_equal(closed["Exit Timestamp"], trades["exit_time"])
    np.testing.assert_allclose(closed["Avg Exit Price"], trades["exit_price"], atol=1e-9)


def test_a_ruined_stream_trades_like_the_reference_and_the_backtest_says_so(caplog):
    n = 400
    closes = np.r_[np.linspace(100, 60, 150), np.full(60, 200.0), np.linspace(200, 80, 140),
                   np.full(50, 80.0)] * (1 + 0.003 * np.sin(np.arange(n)))  # fmt: skip
    o, h, lo, c = ohlc_from_closes(closes, 5)
    strategies = [Strategy(direction="short_only"), Strategy()]
    bars = {
        "symbol": ["X"] * n, "time": BASE_TIME + BAR_MS * np.arange(n),
        "open": o, "high": h, "low": lo, "close": c,
    }  # fmt: skip
    with caplog.at_level("WARNING", logger="atc_stream"):
        result = backtest(bars, [ATCParams()], strategies)
    metrics = result.metric_columns
    short_only = metrics["strategy_id"] == 0
    assert (metrics["final_equity"][short_only] <= 0.0).all()
    assert "ended with no equity left (the first: X, params_id 0, strategy_id 0" in caplog.text
    for k, strategy in enumerate(strategies):
        ref = backtest_series(o, h, lo, c, ATCParams(), strategy)
        assert metrics["final_equity"][k] == ref.metrics["final_equity"]
        assert metrics["trades"][k] == len(ref.trades)
