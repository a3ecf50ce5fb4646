"""``StrategyRows``: the strategy outputs of a step, per row and strategy: the side and
equity at the bar's close and the trades closed on the bar (docs/messages.md, "Paper
trading")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from atc_stream.core.backtest_result import TRADE_COLUMNS
from atc_stream.core.strategy import EXIT_REASONS

#: the columns of a position row: the stream and strategy, the bar, the side held at
#: its close (+1, -1, 0) and the equity marked there
POSITION_COLUMNS = ("symbol", "interval", "params_id", "strategy_id", "time", "side", "equity")


@dataclass(frozen=True)
class StrategyRows:
    """Arrays ``[row, strategy]``: ``side`` (int64) and ``equity`` (float64) at the close;
    ``n_closed`` trades closed on the bar, described by the ``trade_*`` arrays
    ``[row, strategy, i]``, ``i < n_closed``: ``side``, ``entry_time`` (epoch ms),
    ``entry_price``, ``exit_price``, ``reason`` (index into ``EXIT_REASONS``), ``return``."""

    side: np.ndarray
    equity: np.ndarray
    n_closed: np.ndarray
    trade_side: np.ndarray
    trade_entry_time: np.ndarray
    trade_entry_price: np.ndarray
    trade_exit_price: np.ndarray
    trade_reason: np.ndarray
    trade_return: np.ndarray

    def take(self, rows: np.ndarray) -> StrategyRows:
        """These rows only."""
        return StrategyRows(*(getattr(self, f.name)[rows] for f in fields(self)))

    def position_columns(self, keys: Sequence[Any], times: np.ndarray) -> dict[str, np.ndarray]:
        """One row per (row, strategy), rows first (``POSITION_COLUMNS``)."""
        n, n_strategies = self.side.shape
        row = np.repeat(np.arange(n), n_strategies)
        columns = _key_columns(keys, row)
        columns["strategy_id"] = np.tile(np.arange(n_strategies, dtype=np.int64), n)
        columns["time"] = np.asarray(times, np.int64)[row]
        columns["side"] = self.side.reshape(-1).astype(np.int64)
        columns["equity"] = self.equity.reshape(-1).astype(np.float64)
        return {name: columns[name] for name in POSITION_COLUMNS}

    def trade_columns(self, keys: Sequence[Any], times: np.ndarray) -> dict[str, np.ndarray]:
        """One row per trade closed on these rows' bars (``backtest_result.TRADE_COLUMNS``,
        as ``BacktestResult.trade_columns``), rows then strategies then close order."""
        kept = np.arange(self.trade_side.shape[2])[None, None, :] < self.n_closed[:, :, None]
        row, strategy, _ = np.nonzero(kept)
        columns = _key_columns(keys, row)
        columns.update(
            strategy_id=strategy.astype(np.int64),
            side=self.trade_side[kept].astype(np.int64),
            entry_time=self.trade_entry_time[kept].astype(np.int64),
            exit_time=np.asarray(times, np.int64)[row],
            entry_price=self.trade_entry_price[kept].astype(np.float64),
            exit_price=self.trade_exit_price[kept].astype(np.float64),
            reason=np.array(EXIT_REASONS, dtype=object)[self.trade_reason[kept].astype(np.int64)],
        )
        columns["return"] = self.trade_return[kept].astype(np.float64)
        return {name: columns[name] for name in TRADE_COLUMNS}


def _key_columns(keys: Sequence[Any], row: np.ndarray) -> dict[str, np.ndarray]:
    symbols = np.array([k.symbol for k in keys] or [""], dtype=object)
    intervals = np.array([k.interval for k in keys] or [""], dtype=object)
    params = np.array([k.params_id for k in keys] or [0], np.int64)
    return {"symbol": symbols[row], "interval": intervals[row], "params_id": params[row]}


def records(columns: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """One plain dict per row of ``columns`` (NumPy scalars as Python ones)."""
    lists = [values.tolist() for values in columns.values()]
    return [dict(zip(columns, row, strict=True)) for row in zip(*lists, strict=True)]
