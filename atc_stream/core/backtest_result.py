"""``BacktestResult``: the trades, metrics and marked equity of a batched backtest, as
pandas DataFrames or Arrow tables (pandas imported only when asked for)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

#: the key columns of every table: those of a signal row, plus the strategy
KEY_COLUMNS = ("symbol", "interval", "params_id", "strategy_id")
TRADE_COLUMNS = KEY_COLUMNS + (
    "side", "entry_time", "exit_time", "entry_price", "exit_price", "reason", "return",
)  # fmt: skip
METRIC_COLUMNS = KEY_COLUMNS + (
    "trades", "wins", "total_return", "max_drawdown", "exposure", "final_equity",
)  # fmt: skip
EQUITY_COLUMNS = KEY_COLUMNS + ("time", "equity", "side")
_TIME_COLUMNS = ("time", "entry_time", "exit_time")
_STRING_COLUMNS = ("symbol", "interval", "reason")


@dataclass(frozen=True)
class EquityCurves:
    """Every stream's marked equity and side held at each close, flat in the order of the
    metrics' streams: stream ``k``'s bars are ``starts[k]:starts[k+1]``, in time order.

    A backtest keeps these (17 bytes a stream-bar) and builds the long ``equity`` table
    from them only when asked: its four key columns and int64 side take about 40 bytes
    more a stream-bar."""

    starts: np.ndarray  # int64, streams + 1
    times: np.ndarray  # int64 epoch ms
    equity: np.ndarray  # float64
    side: np.ndarray  # int8: +1 long, -1 short, 0 flat

    @property
    def counts(self) -> np.ndarray:
        """Bars of each stream."""
        return np.diff(self.starts)


@dataclass(frozen=True)
class BacktestResult:
    """One row per closed trade (``trades``), per stream (``metrics``) and per bar and
    stream (``equity``: the equity marked at the close and the side held then).

    Each table is a dict of NumPy columns (``*_columns``); ``.trades``, ``.metrics`` and
    ``.equity`` give pandas DataFrames (times as UTC timestamps), ``trades_arrow()``,
    ``metrics_arrow()``, ``equity_arrow()`` Arrow tables. A stream is one (symbol,
    parameter set, strategy) triple: ``params_id`` and ``strategy_id`` are positions in
    the ``params`` and ``strategies`` lists given to ``backtest``.
    """

    trade_columns: dict[str, np.ndarray]
    metric_columns: dict[str, np.ndarray]
    curves: EquityCurves

    @cached_property
    def equity_columns(self) -> dict[str, np.ndarray]:
        """The ``equity`` table's columns (built on first use from ``curves``)."""
        counts = self.curves.counts
        columns = {name: np.repeat(self.metric_columns[name], counts) for name in KEY_COLUMNS}
        columns.update(
            time=self.curves.times, equity=self.curves.equity,
            side=self.curves.side.astype(np.int64),
        )  # fmt: skip
        return columns

    @property
    def trades(self) -> Any:
        """Closed trades: keys, ``side`` (+1/-1), entry/exit time and price, ``reason``
        (signal, stop, take_profit, time) and ``return``, as a pandas DataFrame."""
        return _to_pandas(self.trade_columns)

    @property
    def metrics(self) -> Any:
        """One row per stream: keys, trades, wins, total_return, max_drawdown, exposure,
        final_equity, as a pandas DataFrame."""
        return _to_pandas(self.metric_columns)

    @property
    def equity(self) -> Any:
        """One row per bar and stream: keys, time, equity, side, as a pandas DataFrame."""
        return _to_pandas(self.equity_columns)

    def trades_arrow(self) -> Any:
        """``trades`` as a ``pyarrow.Table``."""
        return _to_arrow(self.trade_columns)

    def metrics_arrow(self) -> Any:
        """``metrics`` as a ``pyarrow.Table``."""
        return _to_arrow(self.metric_columns)

    def equity_arrow(self) -> Any:
        """``equity`` as a ``pyarrow.Table``."""
        return _to_arrow(self.equity_columns)


def _to_pandas(columns: dict[str, np.ndarray]) -> Any:
    try:
        import pandas as pd
    except ImportError:
        raise ImportError(
            "pandas output needs pandas, not installed: pip install 'atc-stream[pandas]' "
            "(or use the *_arrow() tables)"
        ) from None
    data: dict[str, Any] = {}
    for name, values in columns.items():
        if name in _TIME_COLUMNS:
            stamps = np.asarray(values, np.int64).astype("datetime64[ms]")
            data[name] = pd.DatetimeIndex(stamps).tz_localize("UTC")
        else:
            data[name] = values
    return pd.DataFrame(data)


def _to_arrow(columns: dict[str, np.ndarray]) -> Any:
    import pyarrow as pa

    arrays = {}
    for name, values in columns.items():
        if name in _TIME_COLUMNS:
            arrays[name] = pa.array(np.asarray(values, np.int64), pa.timestamp("ms", tz="UTC"))
        elif name in _STRING_COLUMNS:
            arrays[name] = pa.array(values.tolist(), pa.string())
        else:
            arrays[name] = pa.array(values)
    return pa.table(arrays)
