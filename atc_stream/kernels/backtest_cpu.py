"""The batched backtest on the CPU: ``kernels/strategy.py`` compiled with ``numba.njit``,
parallel over streams."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit, prange

from atc_stream.kernels import strategy
from atc_stream.kernels import threads as threading_policy
from atc_stream.kernels.cache import cached_jit
from atc_stream.kernels.compile import compile_module
from atc_stream.state.strategy_layout import (
    M_TRADES,
    N_METRICS,
    N_STRATEGY_COUNTERS,
    N_STRATEGY_VALUES,
    N_TRADE_FIELDS,
)

_strategy = compile_module(
    strategy, cached_jit(njit(error_model="numpy", inline="always", cache=True))
)
backtest_stream = _strategy.backtest_stream
strategy_bar = _strategy.strategy_bar
strategy_reset = _strategy.strategy_reset
strategy_metrics = _strategy.strategy_metrics


@cached_jit(njit(parallel=True, error_model="numpy", cache=True))
def backtest_streams(
    opens, highs, lows, closes, lengths, ready, longs, shorts,
    bar_series, signal_series, strategy_rows, spv, spi, sv, sc,
    equity, held, trades, metrics,
):  # fmt: skip
    """Every stream ``s`` over its whole bar series (``strategy.backtest_stream``)."""
    for s in prange(bar_series.shape[0]):
        backtest_stream(
            opens, highs, lows, closes, lengths, ready, longs, shorts,
            bar_series, signal_series, strategy_rows, spv, spi, sv, sc,
            equity, held, trades, metrics, s,
        )  # fmt: skip


def backtest_outputs(n_streams: int, n_bars: int, trade_capacity: int) -> dict[str, np.ndarray]:
    """Fresh state and output arrays of a batched backtest (equity NaN past a series' end)."""
    return {
        "sv": np.zeros((n_streams, N_STRATEGY_VALUES)),
        "sc": np.zeros((n_streams, N_STRATEGY_COUNTERS), np.int64),
        "equity": np.full((n_streams, n_bars), np.nan),
        "held": np.zeros((n_streams, n_bars), np.int8),
        "trades": np.full((n_streams, trade_capacity, N_TRADE_FIELDS), np.nan),
        "metrics": np.zeros((n_streams, N_METRICS)),
    }


def default_trade_capacity(n_bars: int) -> int:
    """Trades kept per stream in the first pass: enough for nearly every stream, small
    enough that the buffer is not the backtest's largest allocation."""
    return min(n_bars, max(32, n_bars // 16))


def with_room_for_every_trade(
    run_once: Callable[..., dict[str, np.ndarray]],
    per_stream: tuple[np.ndarray, np.ndarray, np.ndarray],
    capacity: int,
) -> dict[str, np.ndarray]:
    """``run_once(bar_series, signal_series, strategy_rows, capacity)`` for every stream,
    then again for the streams whose trades overflowed ``capacity``, with room for all
    of them (the kernels are deterministic: the rerun closes the same trades)."""
    out = run_once(*per_stream, capacity)
    counts = out["metrics"][:, M_TRADES]
    overflow = np.flatnonzero(counts > capacity)
    if overflow.size:
        room = int(counts[overflow].max())
        again = run_once(*(a[overflow] for a in per_stream), room)
        trades = np.full((counts.shape[0], room, N_TRADE_FIELDS), np.nan)
        trades[:, :capacity] = out["trades"]
        trades[overflow] = again["trades"]
        out["trades"] = trades
    return out


def run_backtest(
    opens: np.ndarray,
    highs: np.ndarray,
    lows: np.ndarray,
    closes: np.ndarray,
    lengths: np.ndarray,
    ready: np.ndarray,
    longs: np.ndarray,
    shorts: np.ndarray,
    bar_series: np.ndarray,
    signal_series: np.ndarray,
    strategy_rows: np.ndarray,
    strategy_values: np.ndarray,
    strategy_ints: np.ndarray,
    trade_capacity: int | None = None,
) -> dict[str, np.ndarray]:
    """Run every stream; returns ``equity``, ``held``, ``trades``, ``metrics`` (and the
    final state ``sv``/``sc``).

    Inputs: ``opens``..``closes`` ``(bar series, T)`` float64, padded past ``lengths[b]``;
    ``ready``/``longs``/``shorts`` ``(signal series, T)`` bool; per stream ``s`` its bar
    series ``bar_series[s]``, signal series ``signal_series[s]`` and strategy row
    ``strategy_rows[s]`` of ``strategy_values`` (``SP_*``) / ``strategy_ints`` (``SI_*``).
    Outputs: ``equity``/``held`` ``(streams, T)`` (NaN / 0 past a series' end),
    ``trades`` ``(streams, room, TR_*)``, ``metrics`` ``(streams, M_*)``; the trade
    count of stream ``s`` is ``metrics[s, M_TRADES]``, and every one of its trades is in
    ``trades[s]``: the first pass keeps ``trade_capacity`` (default
    ``default_trade_capacity``) a stream, and streams that closed more run again with
    room for all.
    """
    n_bars = opens.shape[1]

    def run_once(bar_series, signal_series, strategy_rows, capacity):
        out = backtest_outputs(bar_series.shape[0], n_bars, capacity)
        threading_policy.run_parallel(
            backtest_streams, opens, highs, lows, closes, lengths, ready, longs, shorts,
            bar_series, signal_series, strategy_rows, strategy_values, strategy_ints,
            out["sv"], out["sc"], out["equity"], out["held"], out["trades"], out["metrics"],
        )  # fmt: skip
        return out

    capacity = default_trade_capacity(n_bars) if trade_capacity is None else trade_capacity
    return with_room_for_every_trade(run_once, (bar_series, signal_series, strategy_rows), capacity)
