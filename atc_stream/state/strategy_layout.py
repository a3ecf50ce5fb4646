"""The strategy field table: where each piece of a strategy stream's state lives
(docs/spec.md, "Backtest: strategy streams")."""

from __future__ import annotations

# -- strategy values (float64), per stream --------------------------------------------
#: cash while flat (the cash a closed position left)
S_CASH = 0
#: cash ``C`` the open position was entered with
S_OPENED_CASH = 1
#: notional ``N`` of the open position
S_NOTIONAL = 2
#: units of the open position
S_UNITS = 3
#: fill price of the open position's entry
S_ENTRY_PRICE = 4
#: equity marked at the last bar's close
S_EQUITY = 5
#: running maximum of the equity (starts at 1.0)
S_PEAK = 6
#: largest ``1 - equity / peak`` so far
S_MAX_DRAWDOWN = 7
N_STRATEGY_VALUES = 8

# -- strategy counters (int64), per stream -------------------------------------------
#: side held: +1, -1 or 0
S_SIDE = 0
#: 1 while an order waits for the next open
S_HAS_ORDER = 1
#: the waiting order's side (+1, -1 or 0 = flat)
S_ORDER = 2
#: bar number of the open position's entry
S_ENTRY_BAR = 3
#: bars this stream has seen
S_BARS = 4
#: closed trades
S_TRADES = 5
#: closed trades with return > 0
S_WINS = 6
#: bars with a position open at the close
S_EXPOSED = 7
N_STRATEGY_COUNTERS = 8

# -- strategy parameter table: float64 columns ----------------------------------------
#: stop distance (fraction of the entry price, 0 = none)
SP_STOP = 0
#: take-profit distance (fraction, 0 = none)
SP_TAKE_PROFIT = 1
#: ``f = fee_bps / 10000.0``
SP_FEE = 2
#: ``s = slippage_bps / 10000.0``
SP_SLIPPAGE = 3
N_STRATEGY_PARAM_VALUES = 4
# -- strategy parameter table: int64 columns ------------------------------------------
#: bars a position may stay open (0 = no limit)
SI_MAX_HOLD = 0
#: side a long event asks for (+1, or 0 for short_only)
SI_LONG_TARGET = 1
#: side a short event asks for (-1, or 0 for long_only)
SI_SHORT_TARGET = 2
N_STRATEGY_PARAM_INTS = 3

# -- a closed trade: one row of float64 (bars and codes are exact small integers) -----
TR_SIDE = 0
TR_ENTRY_BAR = 1
TR_EXIT_BAR = 2
TR_ENTRY_PRICE = 3
TR_EXIT_PRICE = 4
#: index into ``core.strategy.EXIT_REASONS``
TR_REASON = 5
TR_RETURN = 6
N_TRADE_FIELDS = 7

# -- reason codes (``core.strategy.EXIT_REASONS`` order) ------------------------------
REASON_SIGNAL = 0
REASON_STOP = 1
REASON_TAKE_PROFIT = 2
REASON_TIME = 3

# -- metrics per stream (float64) -----------------------------------------------------
M_TRADES = 0
M_WINS = 1
M_TOTAL_RETURN = 2
M_MAX_DRAWDOWN = 3
M_EXPOSURE = 4
M_FINAL_EQUITY = 5
N_METRICS = 6
#: metric names, in column order
METRIC_NAMES = ("trades", "wins", "total_return", "max_drawdown", "exposure", "final_equity")


__all__ = [name for name in dir() if name.isupper()]
