"""The strategy update of one stream for one bar (docs/spec.md, "Backtest"), written once
for every backend.

Plain functions over float64/int64 state arrays and a stream row, compiled by
``compile.compile_module`` for numba on the CPU and as numba-cuda device functions. Every
expression is the reference backtest's (``core/reference_backtest.py``), in its order,
so every backend gives its bits.
"""

from atc_stream.state.strategy_layout import (
    M_EXPOSURE,
    M_FINAL_EQUITY,
    M_MAX_DRAWDOWN,
    M_TOTAL_RETURN,
    M_TRADES,
    M_WINS,
    REASON_SIGNAL,
    REASON_STOP,
    REASON_TAKE_PROFIT,
    REASON_TIME,
    S_BARS,
    S_CASH,
    S_ENTRY_BAR,
    S_ENTRY_PRICE,
    S_EQUITY,
    S_EXPOSED,
    S_HAS_ORDER,
    S_MAX_DRAWDOWN,
    S_NOTIONAL,
    S_OPENED_CASH,
    S_ORDER,
    S_PEAK,
    S_SIDE,
    S_TRADES,
    S_UNITS,
    S_WINS,
    SI_LONG_TARGET,
    SI_MAX_HOLD,
    SI_SHORT_TARGET,
    SP_FEE,
    SP_SLIPPAGE,
    SP_STOP,
    SP_TAKE_PROFIT,
    TR_ENTRY_BAR,
    TR_ENTRY_PRICE,
    TR_EXIT_BAR,
    TR_EXIT_PRICE,
    TR_REASON,
    TR_RETURN,
    TR_SIDE,
)


def strategy_reset(sv, sc, slot):
    """A fresh stream: flat with cash 1.0, no order, no bars."""
    for k in range(sv.shape[1]):
        sv[slot, k] = 0.0
    for k in range(sc.shape[1]):
        sc[slot, k] = 0
    sv[slot, S_CASH] = 1.0
    sv[slot, S_EQUITY] = 1.0
    sv[slot, S_PEAK] = 1.0
    sc[slot, S_ENTRY_BAR] = -1


def fill_price(p, buying, s):
    """Selling fills at ``p * (1.0 - s)``, buying at ``p * (1.0 + s)``."""
    if buying:
        return p * (1.0 + s)
    return p * (1.0 - s)


def position_value(sv, sc, slot, p):
    """Long ``units * p``; short ``N + units * (entry_price - p)``."""
    if sc[slot, S_SIDE] == 1:
        return sv[slot, S_UNITS] * p
    return sv[slot, S_NOTIONAL] + sv[slot, S_UNITS] * (sv[slot, S_ENTRY_PRICE] - p)


def close_position(sv, sc, slot, x, j, reason, f, trades, trade_row):
    """Exit at fill price ``x``: ``cash = value(x) - f * units * x``; the trade is written to
    ``trades[trade_row, k]`` (k = closed trades so far) while the buffer has room."""
    cash = position_value(sv, sc, slot, x) - f * sv[slot, S_UNITS] * x
    ret = cash / sv[slot, S_OPENED_CASH] - 1.0
    sv[slot, S_CASH] = cash
    k = sc[slot, S_TRADES]
    if k < trades.shape[1]:
        trades[trade_row, k, TR_SIDE] = sc[slot, S_SIDE]
        trades[trade_row, k, TR_ENTRY_BAR] = sc[slot, S_ENTRY_BAR]
        trades[trade_row, k, TR_EXIT_BAR] = j
        trades[trade_row, k, TR_ENTRY_PRICE] = sv[slot, S_ENTRY_PRICE]
        trades[trade_row, k, TR_EXIT_PRICE] = x
        trades[trade_row, k, TR_REASON] = reason
        trades[trade_row, k, TR_RETURN] = ret
    sc[slot, S_TRADES] = k + 1
    if ret > 0.0:
        sc[slot, S_WINS] += 1
    sc[slot, S_SIDE] = 0


def open_position(sv, sc, slot, side, x, j, f):
    """Enter ``side`` at fill price ``x`` with all the cash: ``N = C / (1.0 + f)``,
    ``units = N / x``."""
    cash = sv[slot, S_CASH]
    notional = cash / (1.0 + f)
    sc[slot, S_SIDE] = side
    sv[slot, S_OPENED_CASH] = cash
    sv[slot, S_NOTIONAL] = notional
    sv[slot, S_UNITS] = notional / x
    sv[slot, S_ENTRY_PRICE] = x
    sc[slot, S_ENTRY_BAR] = j


def stop_or_take_profit(sv, sc, slot, stop, take_profit, s, f, j, o, h, lo, trades, trade_row):
    """Step 2: the stop, then the take-profit, during bar ``j`` (one exit at most)."""
    side = sc[slot, S_SIDE]
    entry_price = sv[slot, S_ENTRY_PRICE]
    after_entry = j > sc[slot, S_ENTRY_BAR]
    if side == 1:
        stop_level = entry_price * (1.0 - stop)
        profit_level = entry_price * (1.0 + take_profit)
        if stop > 0 and after_entry and o <= stop_level:
            close_position(
                sv, sc, slot, fill_price(o, False, s), j, REASON_STOP, f, trades, trade_row
            )
        elif stop > 0 and lo <= stop_level:
            x = fill_price(stop_level, False, s)
            close_position(sv, sc, slot, x, j, REASON_STOP, f, trades, trade_row)
        elif take_profit > 0 and after_entry and o >= profit_level:
            x = fill_price(o, False, s)
            close_position(sv, sc, slot, x, j, REASON_TAKE_PROFIT, f, trades, trade_row)
        elif take_profit > 0 and h >= profit_level:
            x = fill_price(profit_level, False, s)
            close_position(sv, sc, slot, x, j, REASON_TAKE_PROFIT, f, trades, trade_row)
    elif side == -1:
        stop_level = entry_price * (1.0 + stop)
        profit_level = entry_price * (1.0 - take_profit)
        if stop > 0 and after_entry and o >= stop_level:
            close_position(
                sv, sc, slot, fill_price(o, True, s), j, REASON_STOP, f, trades, trade_row
            )
        elif stop > 0 and h >= stop_level:
            x = fill_price(stop_level, True, s)
            close_position(sv, sc, slot, x, j, REASON_STOP, f, trades, trade_row)
        elif take_profit > 0 and after_entry and o <= profit_level:
            x = fill_price(o, True, s)
            close_position(sv, sc, slot, x, j, REASON_TAKE_PROFIT, f, trades, trade_row)
        elif take_profit > 0 and lo <= profit_level:
            x = fill_price(profit_level, True, s)
            close_position(sv, sc, slot, x, j, REASON_TAKE_PROFIT, f, trades, trade_row)


def strategy_bar(
    sv, sc, slot, spv, spi, row, o, h, lo, c, ready, long_event, short_event, trades, trade_row
):
    """Steps 1-5 of the spec for the stream's next bar; returns the equity marked at ``c``.

    ``spv[row]``/``spi[row]``: the stream's strategy parameters; the bar's number ``j``
    is the stream's bar counter.
    """
    f = spv[row, SP_FEE]
    s = spv[row, SP_SLIPPAGE]
    max_hold = spi[row, SI_MAX_HOLD]
    j = sc[slot, S_BARS]
    # 1. the pending order fills at the open
    if sc[slot, S_HAS_ORDER] != 0:
        order = sc[slot, S_ORDER]
        side = sc[slot, S_SIDE]
        if side != 0 and order != side:
            x = fill_price(o, side == -1, s)
            close_position(sv, sc, slot, x, j, REASON_SIGNAL, f, trades, trade_row)
        # no cash left (a short lost more than it had): ruined, it enters no more
        if order != 0 and sc[slot, S_SIDE] == 0 and sv[slot, S_CASH] > 0.0:
            open_position(sv, sc, slot, order, fill_price(o, order == 1, s), j, f)
        sc[slot, S_HAS_ORDER] = 0
    # 2. stop, then take-profit
    stop_or_take_profit(
        sv, sc, slot, spv[row, SP_STOP], spv[row, SP_TAKE_PROFIT], s, f, j, o, h, lo,
        trades, trade_row,
    )  # fmt: skip
    # 3. time exit
    side = sc[slot, S_SIDE]
    if side != 0 and max_hold > 0 and j - sc[slot, S_ENTRY_BAR] + 1 >= max_hold:
        close_position(
            sv, sc, slot, fill_price(c, side == -1, s), j, REASON_TIME, f, trades, trade_row
        )
    # 4. mark (and the running metrics)
    side = sc[slot, S_SIDE]
    if side != 0:
        equity = position_value(sv, sc, slot, c)
        sc[slot, S_EXPOSED] += 1
    else:
        equity = sv[slot, S_CASH]
    sv[slot, S_EQUITY] = equity
    if equity > sv[slot, S_PEAK]:
        sv[slot, S_PEAK] = equity
    drawdown = 1.0 - equity / sv[slot, S_PEAK]
    if drawdown > sv[slot, S_MAX_DRAWDOWN]:
        sv[slot, S_MAX_DRAWDOWN] = drawdown
    # 5. event -> order for the next open
    if ready:
        has_target = False
        target = 0
        if long_event:
            target = spi[row, SI_LONG_TARGET]
            has_target = True
        elif short_event:
            target = spi[row, SI_SHORT_TARGET]
            has_target = True
        if has_target and target != side:
            sc[slot, S_ORDER] = target
            sc[slot, S_HAS_ORDER] = 1
    sc[slot, S_BARS] = j + 1
    return equity


def strategy_metrics(sv, sc, slot, metrics, row):
    """The stream's metrics so far into ``metrics[row]`` (``strategy_layout.M_*``)."""
    bars = sc[slot, S_BARS]
    final = sv[slot, S_EQUITY]
    metrics[row, M_TRADES] = sc[slot, S_TRADES]
    metrics[row, M_WINS] = sc[slot, S_WINS]
    metrics[row, M_TOTAL_RETURN] = final - 1.0
    metrics[row, M_MAX_DRAWDOWN] = sv[slot, S_MAX_DRAWDOWN]
    if bars > 0:
        metrics[row, M_EXPOSURE] = float(sc[slot, S_EXPOSED]) / float(bars)
    else:
        metrics[row, M_EXPOSURE] = 0.0
    metrics[row, M_FINAL_EQUITY] = final


def backtest_stream(
    opens, highs, lows, closes, lengths, ready, longs, shorts,
    bar_series, signal_series, strategy_rows, spv, spi, sv, sc,
    equity, held, trades, metrics, s,
):  # fmt: skip
    """Stream ``s`` from a fresh state over its whole bar series: every bar's equity and
    side to ``equity[s]``/``held[s]``, closed trades to ``trades[s]``, metrics to
    ``metrics[s]``. One stream of the batched drivers (a CPU iteration, a CUDA thread)."""
    b = bar_series[s]
    g = signal_series[s]
    row = strategy_rows[s]
    strategy_reset(sv, sc, s)
    for j in range(lengths[b]):
        equity[s, j] = strategy_bar(
            sv, sc, s, spv, spi, row, opens[b, j], highs[b, j], lows[b, j], closes[b, j],
            ready[g, j], longs[g, j], shorts[g, j], trades, s,
        )  # fmt: skip
        held[s, j] = sc[s, S_SIDE]
    strategy_metrics(sv, sc, s, metrics, s)
