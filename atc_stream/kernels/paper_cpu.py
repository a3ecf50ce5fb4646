"""The strategy step of live streams on the CPU: ``kernels/strategy.py``'s ``strategy_bar``
over the strategy rows of the slots an engine step or warmup updated, on the events of
their ATC output rows (``atc_events``, the one rule for every backend)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from atc_stream.core.output_row import OUT_BAR_INDEX, OUT_LONG, OUT_SHORT
from atc_stream.kernels import threads as threading_policy
from atc_stream.kernels.backtest_cpu import strategy_bar
from atc_stream.kernels.cache import cached_jit
from atc_stream.kernels.compile import compile_both
from atc_stream.state.layout import PARAM_ROW
from atc_stream.state.strategy_layout import (
    N_TRADE_FIELDS,
    S_BARS,
    S_ENTRY_BAR,
    S_SIDE,
    S_TRADES,
    TR_ENTRY_BAR,
)

#: trades one strategy stream can close on one bar: the position held at the open (by
#: the order's fill) and the one the order opened (by a stop, take-profit or time exit)
MAX_TRADES_PER_BAR = 2


@cached_jit(njit(error_model="numpy", inline="always", cache=True))
def live_bar(
    sv, sc, entry_times, spv, spi, k, row, t, o, h, lo, c, ready, long_event, short_event,
    cell, side_out, equity_out, trades, trade_entry_times, n_closed,
):  # fmt: skip
    """``strategy_bar`` for strategy row ``row`` (strategy ``k``) at the bar opened at ``t``.

    Its outputs go to ``[cell]``: the side and equity at the close, the trades closed on
    this bar (``trades[cell, i]``, ``i < n_closed[cell]``) with their entry times. The
    trade counter is zeroed around the call so that ``strategy_bar`` writes this bar's
    trades from position 0 of the cell; its count is restored (plus the new ones) after.
    """
    closed_before = sc[row, S_TRADES]
    entry_time_before = entry_times[row]
    j = sc[row, S_BARS]
    sc[row, S_TRADES] = 0
    equity = strategy_bar(
        sv, sc, row, spv, spi, k, o, h, lo, c, ready, long_event, short_event, trades, cell
    )
    m = sc[row, S_TRADES]
    sc[row, S_TRADES] = closed_before + m
    for i in range(m):
        # a trade closed on its own entry bar entered at this bar; any other at the
        # entry of the position held before it
        trade_entry_times[cell, i] = t if trades[cell, i, TR_ENTRY_BAR] == j else entry_time_before
    if sc[row, S_SIDE] != 0 and sc[row, S_ENTRY_BAR] == j:
        entry_times[row] = t
    side_out[cell] = sc[row, S_SIDE]
    equity_out[cell] = equity
    n_closed[cell] = m


@cached_jit(njit(error_model="numpy", inline="always", cache=True))
def atc_events(atc_out, atc_row, counters, ready_bars, slot):
    """``(ready, long, short)`` of the bar whose ATC outputs are ``atc_out[atc_row]``, a bar
    of ``slot``: ready from its parameter set's first ready bar on (``ready_bars``, as the
    ``ready`` column), an event where its column holds 1.0."""
    ready = atc_out[atc_row, OUT_BAR_INDEX] >= ready_bars[counters[slot, PARAM_ROW]]
    return ready, atc_out[atc_row, OUT_LONG] == 1.0, atc_out[atc_row, OUT_SHORT] == 1.0


@cached_jit(njit(error_model="numpy", inline="always", cache=True))
def slot_strategies(
    sv, sc, entry_times, spv, spi, counters, ready_bars, slot, t, o, h, lo, c,
    atc_out, atc_row, row, side_out, equity_out, trades, trade_entry_times, n_closed,
):  # fmt: skip
    """``live_bar`` of every strategy ``k`` of ``slot`` at one bar, on the events of its
    ATC outputs ``atc_out[atc_row]``: strategy row ``slot * n_strategies + k``, outputs
    to cell ``row * n_strategies + k``."""
    ready, long_event, short_event = atc_events(atc_out, atc_row, counters, ready_bars, slot)
    n = spv.shape[0]
    for k in range(n):
        live_bar(
            sv, sc, entry_times, spv, spi, k, slot * n + k, t, o, h, lo, c,
            ready, long_event, short_event,
            row * n + k, side_out, equity_out, trades, trade_entry_times, n_closed,
        )  # fmt: skip


def strategy_step(
    sv, sc, entry_times, spv, spi, counters, ready_bars, slots, times, opens, highs, lows,
    closes, atc_out, order, round_starts,
    side_out, equity_out, trades, trade_entry_times, n_closed,
):  # fmt: skip
    """Every strategy of the slot of each update ``u`` in the planned rounds
    (``batch.plan_rounds``), after the ATC step of those rounds (its output rows
    ``atc_out[u]``); outputs to cells ``u * n_strategies + k``."""
    for r in range(round_starts.shape[0] - 1):
        for q in prange(round_starts[r], round_starts[r + 1]):
            u = order[q]
            slot_strategies(
                sv, sc, entry_times, spv, spi, counters, ready_bars, slots[u], times[u],
                opens[u], highs[u], lows[u], closes[u], atc_out, u,
                u, side_out, equity_out, trades, trade_entry_times, n_closed,
            )  # fmt: skip


def strategy_warmup(
    sv, sc, entry_times, spv, spi, counters, ready_bars, slots, times, opens, highs, lows,
    closes, counts, atc_out, side_out, equity_out, trades, trade_entry_times, n_closed,
):  # fmt: skip
    """``counts[s]`` bars of history row ``s`` through every strategy of slot
    ``slots[s]``, in time order, after the ATC warmup that kept every bar's outputs
    (bar ``t``'s in ``atc_out[s * width + t]``, ``width = times.shape[1]``); the cells
    ``s * n_strategies + k`` keep the outputs of the last bar."""
    width = times.shape[1]
    for s in prange(slots.shape[0]):
        for t in range(counts[s]):
            slot_strategies(
                sv, sc, entry_times, spv, spi, counters, ready_bars, slots[s], times[s, t],
                opens[s, t], highs[s, t], lows[s, t], closes[s, t], atc_out, s * width + t,
                s, side_out, equity_out, trades, trade_entry_times, n_closed,
            )  # fmt: skip


strategy_step_serial, strategy_step_parallel = compile_both(strategy_step)
strategy_warmup_serial, strategy_warmup_parallel = compile_both(strategy_warmup)
#: the dispatchers ``kernels.prepare`` compiles or loads before work
DRIVERS = (strategy_step_serial, strategy_step_parallel,
           strategy_warmup_serial, strategy_warmup_parallel)  # fmt: skip


def strategy_outputs(n_cells: int) -> dict[str, np.ndarray]:
    """Output arrays of ``n_cells`` (update or history row, strategy) cells."""
    return {
        "side": np.zeros(n_cells, np.int64),
        "equity": np.full(n_cells, np.nan),
        "trades": np.full((n_cells, MAX_TRADES_PER_BAR, N_TRADE_FIELDS), np.nan),
        "trade_entry_times": np.zeros((n_cells, MAX_TRADES_PER_BAR), np.int64),
        "n_closed": np.zeros(n_cells, np.int64),
    }


def _outputs_args(out: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    return out["side"], out["equity"], out["trades"], out["trade_entry_times"], out["n_closed"]


def _table(store) -> tuple[np.ndarray, ...]:
    """The drivers' leading arguments: strategy state and table, ATC counters, ready bars."""
    return (
        store.strategy_values, store.strategy_counters, store.strategy_entry_times,
        store.strategies.values, store.strategies.ints, store.counters, store.params.ready_bars,
    )  # fmt: skip


def run_strategy_step(
    store, slots, times, opens, highs, lows, closes, atc_out, order, round_starts,
    threads: int | None = None,
) -> dict[str, np.ndarray]:  # fmt: skip
    """``strategy_step`` on ``store``'s strategy state after the ATC step whose output
    rows are ``atc_out``; returns the cells' outputs."""
    out = strategy_outputs(slots.shape[0] * len(store.strategies))
    n_rounds = max(round_starts.shape[0] - 1, 1)
    widest = order.shape[0] if n_rounds == 1 else int(np.diff(round_starts).max())
    # a strategy bar costs a small fraction of an ATC update: the streams' updates, not
    # times the strategies, are the work that decides the threads
    threading_policy.run(
        strategy_step_serial, strategy_step_parallel,
        threading_policy.choose_threads(order.shape[0] // n_rounds, widest, threads),
        *_table(store), slots, times, opens, highs, lows, closes, atc_out, order,
        round_starts, *_outputs_args(out),
    )  # fmt: skip
    return out


def run_strategy_warmup(
    store, slots, times, opens, highs, lows, closes, counts, atc_out,
    threads: int | None = None,
) -> dict[str, np.ndarray]:  # fmt: skip
    """``strategy_warmup`` on ``store``'s strategy state after the ATC warmup whose every
    bar's output rows are ``atc_out`` (``(rows, width, N_OUT)``); returns the last bars'
    outputs."""
    out = strategy_outputs(slots.shape[0] * len(store.strategies))
    threading_policy.run(
        strategy_warmup_serial, strategy_warmup_parallel,
        threading_policy.choose_threads(int(counts.sum()), slots.shape[0], threads),
        *_table(store), slots, times, opens, highs, lows, closes, counts,
        atc_out.reshape(-1, atc_out.shape[-1]), *_outputs_args(out),
    )  # fmt: skip
    return out
