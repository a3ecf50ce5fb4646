"""The blocks of a sweep: which symbols run together, and one block's backtest turned into
its trades and per-period metrics (the same in one process and on Ray: docs/design/sweep.md)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from atc_stream.app.grid import Grid
from atc_stream.app.ranking import KEYS, METRICS, Curves, period_metrics, trade_periods
from atc_stream.engine.backtest import backtest
from atc_stream.io.ohlc import OhlcTable


def symbol_groups(bars: OhlcTable, sets: Grid, chunk: int) -> list[np.ndarray]:
    """The symbols of each chunk: whole symbols, about ``chunk`` streams (at least one
    symbol) a chunk, in name order."""
    names = np.array(bars.symbol_names, dtype=object)
    per_call = max(1, chunk // sets.sets)
    return [names[i : i + per_call] for i in range(0, len(names), per_call)]


def sweep_block(
    table: pa.Table, params: list, strategies: list, split: int | None, backend: str,
    interval: str,
) -> tuple[pa.Table, list[pa.Table]]:  # fmt: skip
    """One backtest of the bars of ``table`` with ``params`` x ``strategies``, rows
    labelled ``interval``: its trades (with ``period`` under a split) and its metrics,
    one table per period."""
    result = backtest(table, params, strategies, interval=interval, backend=backend)
    trades = result.trades_arrow()
    metrics = result.metrics_arrow()
    if split is None:
        return trades, [_tag(metrics.select([*KEYS, *METRICS]), "all")]
    curves = _curves(result.equity_arrow(), metrics)
    periods = [period_metrics(curves, trades, split, period) for period in ("train", "test")]
    return trades.append_column("period", trade_periods(trades, split)), periods


def _curves(equity: pa.Table, metrics: pa.Table) -> Curves:
    """The per-bar equity frame as ``Curves`` in the order of ``metrics``' streams."""
    keys = metrics.select(list(KEYS))
    equity = equity.sort_by([(k, "ascending") for k in (*KEYS, "time")])
    keys = keys.sort_by([(k, "ascending") for k in KEYS])
    counts = equity.group_by(list(KEYS)).aggregate([("time", "count")])
    counts = counts.sort_by([(k, "ascending") for k in KEYS])
    starts = np.r_[0, np.cumsum(counts.column("time_count").to_numpy())].astype(np.int64)
    return Curves(
        counts.select(list(KEYS)), starts,
        pa.compute.cast(equity.column("time"), pa.int64()).to_numpy(),
        equity.column("equity").to_numpy(), equity.column("side").to_numpy() != 0,
    )  # fmt: skip


def _tag(table: pa.Table, period: str) -> pa.Table:
    return table.append_column("period", pa.array([period] * table.num_rows, pa.string()))
