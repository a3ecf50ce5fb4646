"""A sweep's verdict: metrics per period (before/after a split time), sets ranked over symbols.

How a period's metrics come from the one full-history run: docs/design/sweep.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: The metrics of a stream (``BacktestResult.metrics``), in column order.
METRICS = ("trades", "wins", "total_return", "max_drawdown", "exposure", "final_equity")
#: What ``--rank-by`` accepts, and whether a larger value ranks higher.
RANK_METRICS: dict[str, bool] = {
    "total_return": True,
    "final_equity": True,
    "max_drawdown": False,
    "win_rate": True,
    "exposure": True,
    "trades": True,
    "wins": True,
}
KEYS = ("symbol", "interval", "params_id", "strategy_id")
SET_KEYS = ("params_id", "strategy_id")


@dataclass
class Curves:
    """Marked equity and the side held at each close, stream by stream: stream ``k``'s
    bars are ``starts[k]:starts[k+1]`` of the flat arrays, in time order."""

    keys: pa.Table  # KEYS, one row per stream
    starts: np.ndarray  # int64, len(keys) + 1
    times: np.ndarray  # int64 epoch ms
    equity: np.ndarray  # float64
    held: np.ndarray  # bool: a position is open at the close


def period_metrics(curves: Curves, trades: pa.Table, split: int, period: str) -> pa.Table:
    """Metrics of every stream over the bars before ``split`` (``period="train"``) or from
    it on (``"test"``): a trade belongs to the period of its exit; returns, drawdown and
    exposure come from the marked equity of that period's bars, the test period's
    measured from the equity at the last bar before ``split`` (1.0 when none). A stream
    without bars in the period has null returns, drawdown, exposure and equity there."""
    n = len(curves.keys)
    out = {name: np.zeros(n, np.int64 if name in ("trades", "wins") else np.float64)
           for name in METRICS}  # fmt: skip
    empty = np.zeros(n, bool)
    for k in range(n):
        lo, hi = int(curves.starts[k]), int(curves.starts[k + 1])
        cut = lo + int(np.searchsorted(curves.times[lo:hi], split, side="left"))
        first, last = (lo, cut) if period == "train" else (cut, hi)
        empty[k] = first == last
        start = 1.0 if period == "train" or cut == lo else float(curves.equity[cut - 1])
        equity = curves.equity[first:last]
        end = float(equity[-1]) if equity.size else start
        peak = np.maximum.accumulate(np.r_[start, equity])
        out["total_return"][k] = end / start - 1.0
        out["max_drawdown"][k] = float(np.max(1.0 - np.r_[start, equity] / peak))
        out["exposure"][k] = float(curves.held[first:last].mean()) if equity.size else 0.0
        out["final_equity"][k] = end
    counted = _period_trades(trades, split, period)
    if counted.num_rows:
        index = _stream_index(curves.keys, counted)
        returns = counted.column("return").to_numpy()
        np.add.at(out["trades"], index, 1)
        np.add.at(out["wins"], index, (returns > 0.0).astype(np.int64))
    return _with_period(curves.keys, out, period, empty)


def _period_trades(trades: pa.Table, split: int, period: str) -> pa.Table:
    exit_ms = pc.cast(trades.column("exit_time"), pa.int64())
    before = pc.less(exit_ms, split)
    return trades.filter(before if period == "train" else pc.invert(before))


def trade_periods(trades: pa.Table, split: int) -> pa.Array:
    """``"train"``/``"test"`` of each trade: the period of its exit bar."""
    before = pc.less(pc.cast(trades.column("exit_time"), pa.int64()), split)
    return pc.if_else(before, "train", "test")


def _stream_index(keys: pa.Table, rows: pa.Table) -> np.ndarray:
    """For each row of ``rows``, the row of ``keys`` with the same (symbol, ids)."""
    lookup = {
        key: i
        for i, key in enumerate(zip(*(keys.column(c).to_pylist() for c in KEYS), strict=True))
    }
    columns = [rows.column(c).to_pylist() for c in KEYS]
    return np.array([lookup[key] for key in zip(*columns, strict=True)], np.int64)


def _with_period(
    keys: pa.Table, values: dict[str, np.ndarray], period: str, empty: np.ndarray
) -> pa.Table:
    table = keys
    for name in METRICS:
        counted = name in ("trades", "wins")  # no bars: no trade, and nothing to measure
        table = table.append_column(name, pa.array(values[name], mask=None if counted else empty))
    return table.append_column("period", pa.array([period] * len(keys), pa.string()))


def aggregate(metrics: pa.Table) -> pa.Table:
    """One row per (params_id, strategy_id): metrics averaged over the symbols with bars
    in the period (null metrics left out), ``symbols`` counting those; ``trades`` and
    ``wins`` summed over all, ``win_rate`` = wins / trades."""
    grouped = metrics.group_by(list(SET_KEYS)).aggregate(
        [("total_return", "count"), ("trades", "sum"), ("wins", "sum"),
         *((name, "mean") for name in ("total_return", "max_drawdown", "exposure",
                                       "final_equity"))]
    )  # fmt: skip
    rename = {"total_return_count": "symbols", "trades_sum": "trades", "wins_sum": "wins"}
    rename.update({f"{n}_mean": n for n in ("total_return", "max_drawdown", "exposure",
                                            "final_equity")})  # fmt: skip
    grouped = grouped.rename_columns([rename.get(c, c) for c in grouped.column_names])
    trades = grouped.column("trades").to_numpy().astype(np.float64)
    wins = grouped.column("wins").to_numpy().astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        win_rate = np.where(trades > 0, wins / trades, np.nan)
    grouped = grouped.append_column("win_rate", pa.array(win_rate))
    return grouped.sort_by([(k, "ascending") for k in SET_KEYS])


def rank(sets: pa.Table, by: str, period: str | None = None) -> np.ndarray:
    """Row order of ``sets`` best first by the metric ``by`` (of ``period``'s columns,
    ``train.total_return``..., when given); NaN last, ties by the ids. Sets that made no
    trade and held no position (never ready, or no event) come after every set that did,
    whatever ``by``: their 0 return and 0 drawdown measure nothing."""
    prefix = f"{period}." if period else ""
    values = _floats(sets, prefix + by)
    score = -values if RANK_METRICS[by] else values
    score = np.where(np.isnan(score), np.inf, score)
    idle = ~((_floats(sets, prefix + "trades") > 0) | (_floats(sets, prefix + "exposure") > 0))
    ids = [sets.column(k).to_numpy() for k in reversed(SET_KEYS)]
    return np.lexsort((*ids, score, idle))


def _floats(sets: pa.Table, column: str) -> np.ndarray:
    """A column as float64, nulls (no bars in the period) as NaN."""
    return sets.column(column).to_numpy(zero_copy_only=False).astype(np.float64)


def side_by_side(tables: dict[str, pa.Table]) -> pa.Table:
    """Aggregated tables of several periods joined on the set keys, columns prefixed by
    the period (``train.total_return``, ``test.total_return``...)."""
    out: pa.Table | None = None
    for period, table in tables.items():
        renamed = table.rename_columns(
            [c if c in SET_KEYS else f"{period}.{c}" for c in table.column_names]
        )
        out = renamed if out is None else out.join(renamed, list(SET_KEYS))
    assert out is not None
    return out.sort_by([(k, "ascending") for k in SET_KEYS])


def format_table(table: pa.Table, columns: list[str]) -> str:
    """``columns`` of ``table`` as aligned text, one row per line, with a header."""
    cells = [columns]
    data = [table.column(c).to_pylist() for c in columns]
    for row in zip(*data, strict=True):
        cells.append([_cell(v) for v in row])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in cells)


def _cell(value) -> str:
    if value is None:  # a period without bars for every symbol
        return "nan"
    if isinstance(value, float):
        return "nan" if value != value else f"{value:.6g}"
    return str(value)
