"""Reference backtest: docs/spec.md, "Backtest", for one stream as a plain loop (the oracle).

Written to be read beside the spec: Python floats, one bar at a time, every expression
in the spec's order. The kernels must reproduce its trades and equity bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from atc_stream.core.params import ATCParams
from atc_stream.core.reference import compute_reference
from atc_stream.core.schema import ready_bar
from atc_stream.core.strategy import Strategy

__all__ = ["ReferenceTrade", "ReferenceBacktest", "backtest_reference", "backtest_series"]


@dataclass(frozen=True)
class ReferenceTrade:
    """One closed trade: bars are positions in the stream's bar sequence."""

    side: int
    entry_bar: int
    exit_bar: int
    entry_price: float
    exit_price: float
    reason: str
    ret: float


@dataclass
class ReferenceBacktest:
    """Closed trades, the marked equity and the side held at each bar's close, metrics."""

    trades: list[ReferenceTrade]
    equity: np.ndarray
    side: np.ndarray

    @property
    def metrics(self) -> dict[str, float | int]:
        equity = self.equity.tolist()
        peak = 1.0
        max_drawdown = 0.0
        for value in equity:
            peak = max(peak, value)
            max_drawdown = max(max_drawdown, 1.0 - value / peak)
        final = equity[-1] if equity else 1.0
        return {
            "trades": len(self.trades),
            "wins": sum(1 for t in self.trades if t.ret > 0.0),
            "total_return": final - 1.0,
            "max_drawdown": max_drawdown,
            "exposure": float(np.count_nonzero(self.side)) / len(equity) if equity else 0.0,
            "final_equity": final,
        }


def backtest_reference(
    open_: Sequence[float],
    high: Sequence[float],
    low: Sequence[float],
    close: Sequence[float],
    long_events: Sequence[int],
    short_events: Sequence[int],
    ready: Sequence[bool],
    strategy: Strategy,
) -> ReferenceBacktest:
    """Trade one stream's events by the spec's five steps per bar."""
    f = strategy.fee_bps / 10000.0
    s = strategy.slippage_bps / 10000.0
    stop, take_profit, max_hold = strategy.stop, strategy.take_profit, strategy.max_hold
    n = len(close)

    cash = 1.0
    side = 0  # position held: +1, -1 or 0
    has_order = False  # an order waits for the next open
    order = 0  # its side
    opened_cash = notional = units = entry_price = 0.0
    entry_bar = -1
    trades: list[ReferenceTrade] = []
    equity = np.empty(n)
    held = np.zeros(n, np.int64)

    def value(p: float) -> float:
        if side == 1:
            return units * p
        return notional + units * (entry_price - p)

    def fill(p: float, buying: bool) -> float:
        return p * (1.0 + s) if buying else p * (1.0 - s)

    def exit_at(x: float, j: int, reason: str) -> None:
        nonlocal cash, side
        cash = value(x) - f * units * x
        trades.append(
            ReferenceTrade(side, entry_bar, j, entry_price, x, reason, cash / opened_cash - 1.0)
        )
        side = 0

    def enter(new_side: int, x: float, j: int) -> None:
        nonlocal side, opened_cash, notional, units, entry_price, entry_bar
        side = new_side
        opened_cash = cash
        notional = cash / (1.0 + f)
        units = notional / x
        entry_price = x
        entry_bar = j

    for j in range(n):
        # 1. the pending order fills at the open
        if has_order:
            if side != 0 and order != side:
                exit_at(fill(open_[j], buying=side == -1), j, "signal")
            if order != 0 and side == 0 and cash > 0.0:
                enter(order, fill(open_[j], buying=order == 1), j)
            has_order = False
        # 2. stop, then take-profit (one exit at most)
        if side == 1:
            stop_level = entry_price * (1.0 - stop)
            profit_level = entry_price * (1.0 + take_profit)
            if stop > 0 and j > entry_bar and open_[j] <= stop_level:
                exit_at(fill(open_[j], buying=False), j, "stop")
            elif stop > 0 and low[j] <= stop_level:
                exit_at(fill(stop_level, buying=False), j, "stop")
            elif take_profit > 0 and j > entry_bar and open_[j] >= profit_level:
                exit_at(fill(open_[j], buying=False), j, "take_profit")
            elif take_profit > 0 and high[j] >= profit_level:
                exit_at(fill(profit_level, buying=False), j, "take_profit")
        elif side == -1:
            stop_level = entry_price * (1.0 + stop)
            profit_level = entry_price * (1.0 - take_profit)
            if stop > 0 and j > entry_bar and open_[j] >= stop_level:
                exit_at(fill(open_[j], buying=True), j, "stop")
            elif stop > 0 and high[j] >= stop_level:
                exit_at(fill(stop_level, buying=True), j, "stop")
            elif take_profit > 0 and j > entry_bar and open_[j] <= profit_level:
                exit_at(fill(open_[j], buying=True), j, "take_profit")
            elif take_profit > 0 and low[j] <= profit_level:
                exit_at(fill(profit_level, buying=True), j, "take_profit")
        # 3. time exit
        if side != 0 and max_hold > 0 and j - entry_bar + 1 >= max_hold:
            exit_at(fill(close[j], buying=side == -1), j, "time")
        # 4. mark
        equity[j] = value(close[j]) if side != 0 else cash
        held[j] = side
        # 5. event -> order for the next open
        if ready[j]:
            target = None
            if long_events[j]:
                target = strategy.long_target
            elif short_events[j]:
                target = strategy.short_target
            if target is not None and target != side:
                order, has_order = target, True
    return ReferenceBacktest(trades, equity, held)


def backtest_series(
    open_: Sequence[float],
    high: Sequence[float],
    low: Sequence[float],
    close: Sequence[float],
    params: ATCParams,
    strategy: Strategy,
) -> ReferenceBacktest:
    """ATC of the closes (``reference.compute_reference``), then ``backtest_reference``."""
    atc = compute_reference(np.asarray(close, dtype=np.float64), params)
    ready_from = ready_bar(params)
    ready = [j >= ready_from for j in range(len(close))]
    return backtest_reference(
        [float(x) for x in open_], [float(x) for x in high], [float(x) for x in low],
        [float(x) for x in close], atc["long"].tolist(), atc["short"].tolist(), ready,
        strategy,
    )  # fmt: skip
