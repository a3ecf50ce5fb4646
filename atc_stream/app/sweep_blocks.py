"""The blocks of a sweep: which streams run together, and one block's backtest turned into
its trades and per-period metrics (the same in one process and on Ray: docs/design/sweep.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from atc_stream.app.grid import Grid
from atc_stream.app.ranking import KEYS, METRICS, Curves, period_metrics, trade_periods
from atc_stream.core.backtest_result import EquityCurves
from atc_stream.engine.backtest import backtest
from atc_stream.io.ohlc import OhlcTable

#: Streams per backtest call at most (whole symbols: every set of the grid for each symbol).
CHUNK_STREAMS = 4096
#: Stream-bars per backtest call at most: a call holds ~40 bytes a stream-bar (signals,
#: equity, the side held, the trade buffer, the curves), so a sweep's memory is bounded by
#: this, however long the history (a single stream longer than this still runs whole).
CHUNK_STREAM_BARS = 8_000_000


@dataclass(frozen=True)
class Block:
    """One backtest call: a chunk of symbols with a slice of the parameter sets and strategies."""

    index: int
    group: int  #: the symbol chunk (``symbol_groups``) it belongs to
    params: slice
    strategies: slice
    streams: int


def streams_per_call(bars: OhlcTable, chunk: int = CHUNK_STREAMS) -> int:
    """Streams per call: ``chunk`` at most, fewer where the longest symbol's history would
    make a call hold more than ``CHUNK_STREAM_BARS`` stream-bars (a call pads every
    stream to its longest symbol)."""
    longest = max(1, int(np.diff(bars.starts).max(initial=0)))
    return max(1, min(chunk, CHUNK_STREAM_BARS // longest))


def plan_blocks(bars: OhlcTable, sets: Grid, chunk: int) -> tuple[list[np.ndarray], list[Block]]:
    """The symbol chunks of a sweep, and the blocks that run them: a chunk is one block,
    unless one symbol alone has more than ``chunk`` streams; then its parameter sets (and
    strategies, if they alone exceed ``chunk``) are cut in slices. Blocks are in stream
    order (symbol, parameter set, strategy), so their trades concatenate in that order."""
    groups = symbol_groups(bars, sets, chunk)
    n_par, n_str = len(sets.params), len(sets.strategies)
    per_str = min(n_str, max(1, chunk))
    per_par = max(1, chunk // per_str)
    blocks: list[Block] = []
    for g, group in enumerate(groups):
        if len(group) * sets.sets <= chunk:
            cuts = [(slice(0, n_par), slice(0, n_str))]
        else:
            cuts = [
                (slice(p, min(p + per_par, n_par)), slice(s, min(s + per_str, n_str)))
                for p in range(0, n_par, per_par)
                for s in range(0, n_str, per_str)
            ]
        for par, strat in cuts:
            streams = len(group) * (par.stop - par.start) * (strat.stop - strat.start)
            blocks.append(Block(len(blocks), g, par, strat, streams))
    return groups, blocks


def shift_ids(table: pa.Table, first_ids: tuple[int, int]) -> pa.Table:
    """``params_id``/``strategy_id`` of a block's table made the grid's (a block's ids count
    from its slices' starts)."""
    for name, first in zip(("params_id", "strategy_id"), first_ids, strict=True):
        if first:
            i = table.schema.get_field_index(name)
            column = pa.compute.add(table.column(name), pa.scalar(first, table.schema[i].type))
            table = table.set_column(i, name, column)
    return table


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
    curves = _curves(result.curves, metrics)
    periods = [period_metrics(curves, trades, split, period) for period in ("train", "test")]
    return trades.append_column("period", trade_periods(trades, split)), periods


def _curves(curves: EquityCurves, metrics: pa.Table) -> Curves:
    """The backtest's curves as ``Curves``, keyed by ``metrics``' streams (the same order)."""
    keys = metrics.select(list(KEYS))
    return Curves(keys, curves.starts, curves.times, curves.equity, curves.side != 0)


def _tag(table: pa.Table, period: str) -> pa.Table:
    return table.append_column("period", pa.array([period] * table.num_rows, pa.string()))
