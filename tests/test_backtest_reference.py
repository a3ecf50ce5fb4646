"""The reference backtest follows docs/spec.md, "Backtest", rule by rule, and agrees with
vectorbt's ``Portfolio.from_signals`` where their rules coincide."""

from __future__ import annotations

import numpy as np
import pytest

from atc_stream import ATCParams
from atc_stream.core.reference import compute_reference
from atc_stream.core.reference_backtest import backtest_reference
from atc_stream.core.schema import ready_bar
from atc_stream.core.strategy import Strategy, load_strategies


def run(bars, long_at=(), short_at=(), unready=(), **strategy):
    """``bars``: (open, high, low, close) rows; events at the given bar numbers."""
    o, h, l, c = (list(map(float, column)) for column in zip(*bars, strict=True))
    n = len(c)
    long_events = [int(j in long_at) for j in range(n)]
    short_events = [int(j in short_at) for j in range(n)]
    ready = [j not in unready for j in range(n)]
    return backtest_reference(o, h, l, c, long_events, short_events, ready, Strategy(**strategy))


FLAT = (100.0, 100.0, 100.0, 100.0)


def test_entry_fills_at_the_next_open_with_fees_and_slippage():
    bars = [FLAT, (100.0, 102.0, 99.0, 101.0), (101.0, 103.0, 100.0, 102.0)]
    result = run(bars, long_at={0}, fee_bps=10, slippage_bps=5)
    f, s = 0.001, 0.0005
    x = 100.0 * (1.0 + s)
    notional = 1.0 / (1.0 + f)
    units = notional / x
    assert result.equity[0] == 1.0  # the order waits for the next open
    assert result.equity[1] == units * 101.0
    assert result.equity[2] == units * 102.0
    assert result.trades == []  # still open at the last bar: marked, not closed
    assert result.side.tolist() == [0, 1, 1]


def test_short_value_and_exit_on_the_opposite_event_reverses_at_the_open():
    bars = [FLAT, FLAT, (98.0, 99.0, 97.0, 97.5), (96.0, 96.5, 95.0, 95.5), FLAT]
    result = run(bars, short_at={0}, long_at={2}, fee_bps=20)
    f = 0.002
    notional = 1.0 / (1.0 + f)
    units = notional / 100.0
    assert result.equity[2] == notional + units * (100.0 - 97.5)
    cash = (notional + units * (100.0 - 96.0)) - f * units * 96.0
    first = result.trades[0]
    assert (first.side, first.entry_bar, first.exit_bar, first.reason) == (-1, 1, 3, "signal")
    assert first.exit_price == 96.0 and first.ret == cash / 1.0 - 1.0
    # the long enters at the same open with the cash the short left
    long_units = (cash / (1.0 + f)) / 96.0
    assert result.equity[3] == long_units * 95.5
    assert result.side.tolist() == [0, -1, -1, 1, 1]


def test_stop_on_a_gap_exits_at_the_open_and_inside_the_bar_at_the_stop():
    gap = [FLAT, FLAT, (94.0, 95.0, 93.0, 94.5)]
    result = run(gap, long_at={0}, stop=0.05, slippage_bps=10)
    (trade,) = result.trades
    assert (trade.reason, trade.exit_bar) == ("stop", 2)
    assert trade.exit_price == 94.0 * (1.0 - 0.001)  # the open, not the stop level
    inside = [FLAT, FLAT, (99.0, 99.5, 94.0, 98.0)]
    (trade,) = run(inside, long_at={0}, stop=0.05).trades
    assert trade.exit_price == 100.0 * (1.0 - 0.05) and trade.reason == "stop"


def test_a_stop_can_hit_on_the_entry_bar_but_not_through_its_open():
    bars = [FLAT, (100.0, 100.5, 97.5, 99.0), FLAT]
    (trade,) = run(bars, long_at={0}, stop=0.02).trades
    assert (trade.entry_bar, trade.exit_bar, trade.exit_price) == (1, 1, 100.0 * (1.0 - 0.02))
    short = [FLAT, (100.0, 103.0, 99.5, 101.0), FLAT]
    (trade,) = run(short, short_at={0}, stop=0.02).trades
    assert (trade.side, trade.exit_bar, trade.exit_price) == (-1, 1, 100.0 * (1.0 + 0.02))


def test_stop_wins_over_take_profit_in_one_bar_and_take_profit_alone_exits_at_its_level():
    both = [FLAT, FLAT, (100.0, 106.0, 94.0, 100.0)]
    (trade,) = run(both, long_at={0}, stop=0.05, take_profit=0.05).trades
    assert trade.reason == "stop"
    profit = [FLAT, FLAT, (101.0, 106.0, 100.5, 103.0)]
    (trade,) = run(profit, long_at={0}, take_profit=0.05, slippage_bps=10).trades
    assert trade.reason == "take_profit"
    entry = 100.0 * (1.0 + 0.001)  # levels are fractions of the fill price
    assert trade.entry_price == entry
    assert trade.exit_price == (entry * (1.0 + 0.05)) * (1.0 - 0.001)
    gap_up = [FLAT, FLAT, (107.0, 108.0, 106.0, 107.5)]
    (trade,) = run(gap_up, long_at={0}, take_profit=0.05).trades
    assert (trade.reason, trade.exit_price) == ("take_profit", 107.0)


def test_time_exit_at_the_close_after_max_hold_bars():
    bars = [FLAT, FLAT, (100.0, 101.0, 99.0, 100.5), FLAT]
    (trade,) = run(bars, long_at={0}, max_hold=2, slippage_bps=10).trades
    assert (trade.entry_bar, trade.exit_bar, trade.reason) == (1, 2, "time")
    assert trade.exit_price == 100.5 * (1.0 - 0.001)
    (trade,) = run(bars, long_at={0}, max_hold=1).trades
    assert (trade.exit_bar, trade.exit_price) == (1, 100.0)


def test_events_when_not_ready_or_for_the_side_held_do_nothing():
    bars = [FLAT] * 6
    result = run(bars, long_at={0, 2}, unready={0})
    assert result.side.tolist() == [0, 0, 0, 1, 1, 1]
    result = run(bars, long_at={0, 2})  # a second long event while long: no order
    assert result.side.tolist() == [0, 1, 1, 1, 1, 1] and result.trades == []


def test_after_a_stop_the_next_entry_waits_for_an_event():
    bars = [FLAT, FLAT, (99.0, 99.0, 90.0, 95.0), FLAT, FLAT]
    result = run(bars, long_at={0}, stop=0.05)
    assert result.side.tolist() == [0, 1, 0, 0, 0] and len(result.trades) == 1


@pytest.mark.parametrize(
    ("direction", "sides"),
    [
        ("long_short", [0, 1, -1, -1]),
        ("long_only", [0, 1, 0, 0]),
        ("short_only", [0, 0, -1, -1]),
    ],
)
def test_directions(direction, sides):
    result = run([FLAT] * 4, long_at={0}, short_at={1}, direction=direction)
    assert result.side.tolist() == sides


def test_metrics():
    bars = [FLAT, FLAT, (110.0, 111.0, 109.0, 110.0), (90.0, 91.0, 89.0, 90.0), FLAT]
    result = run(bars, long_at={0}, short_at={2})
    # long from 100 to 90 (a loss), then short from 90, marked at 100 on the last bar
    assert result.side.tolist() == [0, 1, 1, -1, -1]
    (trade,) = result.trades
    assert (trade.exit_price, trade.ret) == (90.0, 90.0 / 100.0 - 1.0)
    equity = result.equity.tolist()
    assert equity[:4] == [1.0, 1.0, 1.1, 0.9]
    assert equity[4] == 0.9 + (0.9 / 90.0) * (90.0 - 100.0)
    assert result.metrics == {
        "trades": 1,
        "wins": 0,
        "total_return": equity[4] - 1.0,
        "max_drawdown": 1.0 - equity[4] / 1.1,
        "exposure": 4 / 5,
        "final_equity": equity[4],
    }


def test_strategy_validation_names_the_field(tmp_path):
    for bad, field in [
        ({"direction": "both"}, "direction"),
        ({"stop": -0.1}, "stop"),
        ({"stop": 1.0}, "stop"),
        ({"take_profit": 1.5}, "take_profit"),
        ({"max_hold": 2.5}, "max_hold"),
        ({"fee_bps": float("nan")}, "fee_bps"),
        ({"slippage_bps": 10_000}, "slippage_bps"),
    ]:
        with pytest.raises(ValueError, match=field):
            Strategy(**bad)
    assert Strategy(direction="long_only", take_profit=2.0).take_profit == 2.0
    path = tmp_path / "s.toml"
    path.write_text('[[strategy]]\nstop = 0.02\n\n[[strategy]]\ndirection = "long_only"\n')
    assert load_strategies(path) == [Strategy(stop=0.02), Strategy(direction="long_only")]
    path.write_text("[[strategy]]\nstopp = 0.02\n")
    with pytest.raises(ValueError, match="stopp"):
        load_strategies(path)


# -- vectorbt, where the rules coincide ---------------------------------------------------


def random_ohlc(n: int, seed: int):
    rng = np.random.default_rng(seed)
    close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, n)))
    open_ = np.r_[close[0], close[:-1]] * np.exp(rng.normal(0, 0.002, n))
    high = np.maximum(open_, close) * (1 + np.abs(rng.normal(0, 0.003, n)))
    low = np.minimum(open_, close) * (1 - np.abs(rng.normal(0, 0.003, n)))
    return open_, high, low, close


@pytest.mark.parametrize("direction", ["long_short", "long_only", "short_only"])
@pytest.mark.parametrize("costs", [(0.0, 0.0), (10.0, 5.0)])
def test_equals_vectorbt_from_signals_without_stops(direction, costs):
    vbt = pytest.importorskip("vectorbt")
    import pandas as pd

    open_, high, low, close = random_ohlc(1500, seed=7)
    params = ATCParams()
    atc = compute_reference(close, params)
    ready = np.arange(close.shape[0]) >= ready_bar(params)
    strategy = Strategy(direction=direction, fee_bps=costs[0], slippage_bps=costs[1])
    ours = backtest_reference(
        open_.tolist(), high.tolist(), low.tolist(), close.tolist(),
        atc["long"].tolist(), atc["short"].tolist(), ready.tolist(), strategy,
    )  # fmt: skip

    def next_open(events):  # the order of bar j fills at open[j + 1]
        return np.r_[False, (events == 1)[:-1] & ready[:-1]]

    longs, shorts, none = next_open(atc["long"]), next_open(atc["short"]), np.zeros_like(ready)
    common = dict(
        close=pd.Series(close), price=pd.Series(open_), size=np.inf, init_cash=1.0,
        fees=strategy.fee, slippage=strategy.slippage, freq="1min",
    )  # fmt: skip
    if direction == "long_short":
        pf = vbt.Portfolio.from_signals(
            entries=longs, exits=none, short_entries=shorts, short_exits=none,
            upon_opposite_entry="reverse", **common,
        )  # fmt: skip
    elif direction == "long_only":
        pf = vbt.Portfolio.from_signals(entries=longs, exits=shorts, direction="longonly", **common)
    else:
        pf = vbt.Portfolio.from_signals(
            entries=shorts, exits=longs, direction="shortonly", **common
        )
    np.testing.assert_allclose(pf.value().to_numpy(), ours.equity, rtol=0, atol=1e-9)
    theirs = pf.trades.records_readable
    closed = theirs[theirs["Status"] == "Closed"]
    assert len(closed) == len(ours.trades) > 10
    np.testing.assert_array_equal(closed["Entry Timestamp"], [t.entry_bar for t in ours.trades])
    np.testing.assert_array_equal(closed["Exit Timestamp"], [t.exit_bar for t in ours.trades])
    np.testing.assert_allclose(
        closed["Avg Entry Price"], [t.entry_price for t in ours.trades], rtol=0, atol=1e-9
    )
    np.testing.assert_allclose(
        closed["Avg Exit Price"], [t.exit_price for t in ours.trades], rtol=0, atol=1e-9
    )
    # vectorbt's trade return is PnL over the notional; the spec's is over the cash put in
    cash_in = closed["Size"] * closed["Avg Entry Price"] + closed["Entry Fees"]
    np.testing.assert_allclose(
        closed["PnL"] / cash_in, [t.ret for t in ours.trades], rtol=0, atol=1e-9
    )


def test_equals_vectorbt_with_a_stop_where_the_rules_coincide():
    """A stop inside a later bar (not on the entry bar, not through an open with an order
    pending), no slippage: vectorbt's ``sl_stop`` gives the same trades and equity."""
    vbt = pytest.importorskip("vectorbt")
    import pandas as pd

    rng = np.random.default_rng(3)
    close = np.round(100 + np.cumsum(rng.normal(0, 0.05, 60)), 2)
    open_ = np.r_[close[0], close[:-1]]
    high, low = np.maximum(open_, close) + 0.05, np.minimum(open_, close) - 0.05
    low[14] = 96.0  # the long entered at open[6] stops here, inside the bar
    high[40] = 104.0  # the short entered at open[31] stops here
    longs, shorts = np.zeros(60, int), np.zeros(60, int)
    longs[5], shorts[30] = 1, 1
    strategy = Strategy(stop=0.02, fee_bps=10)
    ours = backtest_reference(
        open_.tolist(), high.tolist(), low.tolist(), close.tolist(),
        longs.tolist(), shorts.tolist(), [True] * 60, strategy,
    )  # fmt: skip
    assert [(t.side, t.entry_bar, t.exit_bar, t.reason) for t in ours.trades] == [
        (1, 6, 14, "stop"),
        (-1, 31, 40, "stop"),
    ]
    shifted = [pd.Series(np.r_[False, events[:-1] == 1]) for events in (longs, shorts)]
    none = pd.Series(np.zeros(60, bool))
    pf = vbt.Portfolio.from_signals(
        close=pd.Series(close), price=pd.Series(open_), high=pd.Series(high),
        low=pd.Series(low), entries=shifted[0], exits=none, short_entries=shifted[1],
        short_exits=none, upon_opposite_entry="reverse", size=np.inf, init_cash=1.0,
        fees=strategy.fee, sl_stop=strategy.stop, stop_entry_price="fillprice", freq="1min",
    )  # fmt: skip
    np.testing.assert_allclose(pf.value().to_numpy(), ours.equity, rtol=0, atol=1e-9)
    closed = pf.trades.records_readable
    np.testing.assert_array_equal(closed["Exit Timestamp"], [t.exit_bar for t in ours.trades])
    np.testing.assert_allclose(
        closed["Avg Exit Price"], [t.exit_price for t in ours.trades], rtol=0, atol=1e-9
    )


def test_a_short_that_loses_all_its_cash_ruins_the_stream_and_it_enters_nothing_more():
    spike = (250.0, 255.0, 245.0, 250.0)
    bars = [FLAT, FLAT, spike, spike, spike, FLAT, FLAT, FLAT]
    result = run(bars, short_at={0, 5}, long_at={2})
    units = 1.0 / 100.0
    cash = 1.0 + units * (100.0 - 250.0)  # the short exits at 250: -0.5
    assert [(t.side, t.entry_bar, t.exit_bar, t.ret) for t in result.trades] == [
        (-1, 1, 3, cash / 1.0 - 1.0)
    ]
    # neither the long of the same open nor the later short enters
    assert result.side.tolist() == [0, -1, -1, 0, 0, 0, 0, 0]
    assert result.equity[3:].tolist() == [cash] * 5
    assert result.metrics["final_equity"] == cash and result.metrics["max_drawdown"] > 1.0
