"""The chart of one backtested stream: price with its entries and exits, equity below.

``plot_backtest`` draws a ``BacktestResult`` (or its trades and equity frames) with the
stream's bars; matplotlib and pandas come with the ``plot`` extra, imported when used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from atc_stream.app.extras import require
from atc_stream.app.plot import PlotError, few_points, fit_one_point

#: Marker colour of each exit reason.
REASON_COLOURS = {"signal": "0.35", "stop": "#c62828", "take_profit": "#2e7d32", "time": "#ef6c00"}
_LONG, _SHORT = "#2e7d32", "#c62828"


def plot_backtest(
    result: Any,
    bars: Any,
    symbol: str | None = None,
    params_id: int = 0,
    strategy_id: int = 0,
    path: str | Path | None = None,
    *,
    title: str | None = None,
    figsize: tuple[float, float] = (11.0, 6.5),
):
    """A matplotlib Figure of one stream; written to ``path`` when given.

    ``result``: a ``BacktestResult`` (or an object with ``trades`` and ``equity``
    DataFrames); ``bars``: the bars it ran on (pandas, Arrow or a dict of columns with
    symbol, time, close; high and low drawn as a band when present). Top: close, entries
    (▲ long, ▼ short) and exits (● coloured by reason); bottom: the marked equity with
    the spans a position was held shaded. Without the extra: ``MissingExtra``.
    """
    require("plot", "plot_backtest")
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    trades, equity = _frames(result)
    price = _frame(bars)
    symbol = _pick_symbol(equity, symbol)
    key = (
        (equity["symbol"].astype(str) == symbol)
        & (equity["params_id"] == params_id)
        & (equity["strategy_id"] == strategy_id)
    )
    equity = equity[key].sort_values("time")
    if len(equity) == 0:
        raise PlotError(f"no stream {symbol!r} params_id={params_id} strategy_id={strategy_id}")
    trades = trades[
        (trades["symbol"].astype(str) == symbol)
        & (trades["params_id"] == params_id)
        & (trades["strategy_id"] == strategy_id)
    ]
    if "symbol" in price:
        price = price[price["symbol"].astype(str) == symbol]
    price = price.sort_values("time")
    if len(price) == 0:
        raise PlotError(f"the bars have no rows of {symbol!r}")

    fig, (top, bottom) = plt.subplots(
        2, 1, sharex=True, figsize=figsize, height_ratios=(2, 1), layout="constrained"
    )
    x = _times(price["time"])
    if "high" in price and "low" in price:
        top.fill_between(x, price["low"].to_numpy(float), price["high"].to_numpy(float),
                         color="#1f4e79", alpha=0.12, linewidth=0, label="low..high")  # fmt: skip
    top.plot(x, price["close"].to_numpy(float), color="#1f4e79", linewidth=1.0, label="close",
             **few_points(x))  # fmt: skip
    _draw_trades(top, trades)
    top.set_ylabel("price")
    top.legend(loc="upper left", fontsize=8, ncol=2)
    ex = _times(equity["time"])
    bottom.plot(ex, equity["equity"].to_numpy(float), color="#6a1b9a", linewidth=1.0,
                label="equity", **few_points(ex))  # fmt: skip
    fit_one_point(x, top)
    bottom.axhline(1.0, color="0.5", linewidth=0.6)
    _shade_held(bottom, ex, equity["side"].to_numpy(np.int64))
    bottom.set_ylabel("equity")
    bottom.legend(loc="upper left", fontsize=8)
    closed = len(trades)
    wins = int((trades["return"] > 0).sum()) if closed else 0
    final = float(equity["equity"].iloc[-1])
    top.set_title(
        title
        or f"{symbol}  params {params_id}  strategy {strategy_id}: {closed} trades, "
        f"{wins} wins, equity {final:.4g}"
    )
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def _frames(result: Any):
    trades, equity = result.trades, result.equity
    for name, frame, needed in (
        ("trades", trades, ("symbol", "params_id", "strategy_id", "entry_time", "exit_time")),
        ("equity", equity, ("symbol", "params_id", "strategy_id", "time", "equity", "side")),
    ):
        missing = [c for c in needed if c not in frame]
        if missing:
            raise PlotError(f"{name} lack column(s) {missing}")
    return trades, equity


def _frame(rows: Any):
    import pandas as pd

    if isinstance(rows, pd.DataFrame):
        frame = rows
    elif hasattr(rows, "to_pandas"):  # an Arrow table
        frame = rows.to_pandas()
    else:
        frame = pd.DataFrame(dict(rows))
    missing = [c for c in ("time", "close") if c not in frame]
    if missing:
        raise PlotError(f"bars lack column(s) {missing}")
    return frame


def _pick_symbol(equity, symbol: str | None) -> str:
    symbols = sorted(equity["symbol"].astype(str).unique())
    if symbol is None:
        if len(symbols) != 1:
            raise PlotError(f"the result holds {len(symbols)} symbols ({symbols[:10]}): pick one")
        return symbols[0]
    if symbol not in symbols:
        raise PlotError(f"no symbol {symbol!r} in the result (symbols: {symbols[:10]})")
    return symbol


def _times(column) -> np.ndarray:
    """Datetimes (UTC, naive) of a time column: timestamps or epoch milliseconds."""
    import pandas as pd

    if pd.api.types.is_datetime64_any_dtype(column):
        return (column.dt.tz_convert(None) if column.dt.tz else column).to_numpy()
    return column.to_numpy(np.int64).astype("datetime64[ms]")


def _draw_trades(ax, trades) -> None:
    if len(trades) == 0:
        return
    entry, exit_ = _times(trades["entry_time"]), _times(trades["exit_time"])
    side = trades["side"].to_numpy(np.int64)
    entry_price = trades["entry_price"].to_numpy(float)
    exit_price = trades["exit_price"].to_numpy(float)
    for sign, marker, colour, label in ((1, "^", _LONG, "long entry"),
                                        (-1, "v", _SHORT, "short entry")):  # fmt: skip
        hit = side == sign
        if hit.any():
            ax.scatter(entry[hit], entry_price[hit], marker=marker, color=colour, s=40,
                       zorder=4, label=f"{label} ({int(hit.sum())})")  # fmt: skip
    reasons = trades["reason"].astype(str).to_numpy()
    for reason, colour in REASON_COLOURS.items():
        hit = reasons == reason
        if hit.any():
            ax.scatter(exit_[hit], exit_price[hit], marker="o", facecolors="none",
                       edgecolors=colour, s=40, zorder=4,
                       label=f"exit: {reason} ({int(hit.sum())})")  # fmt: skip
    won = trades["return"].to_numpy(float) > 0
    for k in range(len(trades)):
        ax.plot((entry[k], exit_[k]), (entry_price[k], exit_price[k]), linewidth=0.8,
                color=_LONG if won[k] else _SHORT, alpha=0.6, zorder=3)  # fmt: skip


def _shade_held(ax, x: np.ndarray, side: np.ndarray) -> None:
    """Light spans over the bars a long (green) or short (red) position was held."""
    for sign, colour, label in ((1, _LONG, "long held"), (-1, _SHORT, "short held")):
        held = side == sign
        edges = np.flatnonzero(np.diff(np.r_[False, held, False].astype(np.int8)))
        for k, (start, stop) in enumerate(zip(edges[::2], edges[1::2], strict=True)):
            right = x[stop] if stop < len(x) else x[stop - 1]
            ax.axvspan(x[start], right, color=colour, alpha=0.08, zorder=0,
                       label=label if k == 0 else None)  # fmt: skip
