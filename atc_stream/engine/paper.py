"""Paper trading in the engine: bars with OHLC in (untradeable ones rejected and counted),
the strategy outputs and metrics of the live strategy streams."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import numpy as np

from atc_stream.core import inputs
from atc_stream.core.inputs import bad_ohlc
from atc_stream.core.strategy_outputs import StrategyRows
from atc_stream.engine.parsing import (
    BAD_HISTORY,
    BAD_TIME_TYPE,
    MALFORMED_UPDATE,
    UNKNOWN_SYMBOL,
    Reject,
    fan_out,
)
from atc_stream.kernels.backend import Ohlc
from atc_stream.state import strategy_layout as SL
from atc_stream.state.arrays import StateStore

#: a bar without open/high/low while the engine trades strategies
MISSING_OHLC = "missing_ohlc"
#: a bar whose open/high/low/close are not finite prices > 0 with low <= open, close <= high
BAD_OHLC = "bad_ohlc"
#: the price columns a bar of a strategy engine carries, besides ``close``
EXTRA_PRICES = ("open", "high", "low")

_INT64_MIN, _INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)


def _describe(o: float, h: float, lo: float, c: float) -> str:
    """A bar's prices as Python floats (a NumPy scalar's repr would name its type)."""
    return f"open {float(o)!r} high {float(h)!r} low {float(lo)!r} close {float(c)!r}"


# -- step input -----------------------------------------------------------------------------


def _frame_prices(frame: Any, columns: Mapping[str, str] | None, time_unit: str | None):
    """``(symbols, times, {price: values})`` of a long table with OHLC columns."""
    renames = dict(columns or {})
    base = {k: v for k, v in renames.items() if k not in EXTRA_PRICES}
    symbols, times, closes = inputs.frame_columns(frame, columns=base, time_unit=time_unit)
    sources = [renames.get(name, name) for name in EXTRA_PRICES]
    missing = inputs.missing_columns(frame, sources)
    unusable = [s for s in sources if s in missing or not isinstance(s, str)]
    if unusable:
        raise ValueError(
            f"bar table has no {unusable[0]!r} column: an engine with strategies steps bars "
            "with open, high, low and close (rename with columns={'open': ..., ...})"
        )
    prices = dict(zip(EXTRA_PRICES, inputs.float_columns(frame, sources), strict=True))
    prices["close"] = closes
    return symbols, times, prices


def parse_ohlc_bars(
    bars: Any,
    columns: Mapping[str, str] | None,
    time_unit: str | None,
    slot_lists: Mapping[str, list[int]],
    reject: Reject,
):
    """:func:`parse_ohlc_items`' result for bars in any accepted form; a long table is
    checked column by column, with the rejections (reasons, details, positions) that its
    rows as items would get."""
    if not inputs.is_frame(bars):
        return parse_ohlc_items(ohlc_items(bars, time_unit), slot_lists, reject)
    symbols, times, p = _frame_prices(bars, columns, time_unit)
    o, h, lo, c = (p[k] for k in ("open", "high", "low", "close"))
    found = _symbol_slots(symbols.tolist(), slot_lists)
    unknown = np.zeros(len(found), bool)
    if None in found:
        unknown[[i for i, s in enumerate(found) if s is None]] = True
    refused = unknown | bad_ohlc(o, h, lo, c)
    # a table's times and prices are numbers already: of the item checks, the symbol's
    # and then the prices' are left, in that order
    for i in np.flatnonzero(refused).tolist():
        symbol = symbols[i]
        if unknown[i]:
            reject(i, UNKNOWN_SYMBOL, f"symbol {symbol!r}", str(symbol))
        else:
            reject(i, BAD_OHLC, _describe(o[i], h[i], lo[i], c[i]), symbol)
    kept = np.flatnonzero(~refused).astype(np.int64)
    slots, fanned = fan_out([found[i] for i in kept.tolist()])
    origin = kept if fanned is None else kept[fanned]
    return slots, times[origin], c[origin], origin, (o[origin], h[origin], lo[origin])


def _symbol_slots(symbols: list, slot_lists: Mapping[str, list[int]]) -> list[list[int] | None]:
    """Each symbol's slots; None for one that is not a registered str."""
    if set(map(type, symbols)) <= {str}:
        return list(map(slot_lists.get, symbols))
    return [slot_lists.get(s) if isinstance(s, str) else None for s in symbols]


def ohlc_items(bars: Any, time_unit: str | None) -> list:
    """Bars that are not a long table as ``(symbol, time, open, high, low, close)`` items
    (times converted where needed); malformed items pass through for
    :func:`parse_ohlc_items`."""
    if isinstance(bars, Mapping):
        raise ValueError(
            "an engine with strategies steps a long table (symbol, time, open, high, low, "
            "close) or (symbol, time, open, high, low, close) tuples, not a mapping"
        )
    items = list(bars)
    out = []
    for item in items:
        if isinstance(item, (tuple, list)) and len(item) == 6:
            bar_time = item[1]
            datelike = inputs.is_datetime_like(bar_time)
            if datelike or (time_unit and isinstance(bar_time, (int, np.integer))):
                if not isinstance(bar_time, bool):
                    item = (item[0], inputs.time_to_ms(bar_time, time_unit), *item[2:])
        out.append(item)
    return out


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def parse_ohlc_items(items: list, slot_lists: Mapping[str, list[int]], reject: Reject):
    """``(slots, times, closes, origin, (opens, highs, lows))`` of OHLC items; each
    malformed, unknown or untradeable item is rejected with its reason, in item order."""
    refused: list[tuple[int, str, str, str | None]] = []
    good: list[tuple[int, str, int, float, float, float, float]] = []
    for index, item in enumerate(items):
        if isinstance(item, (tuple, list)) and len(item) == 3:
            refused.append((index, MISSING_OHLC, f"no open/high/low: {item!r}", str(item[0])))
            continue
        if not isinstance(item, (tuple, list)) or len(item) != 6:
            detail = f"not (symbol, time, open, high, low, close): {item!r}"
            refused.append((index, MALFORMED_UPDATE, detail, None))
            continue
        symbol, bar_time = item[0], item[1]
        if (
            not isinstance(bar_time, numbers.Integral)
            or isinstance(bar_time, bool)
            or not _INT64_MIN <= int(bar_time) <= _INT64_MAX
        ):
            refused.append((index, BAD_TIME_TYPE, f"time {bar_time!r}", str(symbol)))
            continue
        if not all(_real(v) for v in item[2:]):
            refused.append((index, BAD_OHLC, f"prices {item[2:]!r}", str(symbol)))
            continue
        if not isinstance(symbol, str) or symbol not in slot_lists:
            refused.append((index, UNKNOWN_SYMBOL, f"symbol {symbol!r}", str(symbol)))
            continue
        try:
            o, h, lo, c = (float(v) for v in item[2:])
        except OverflowError:  # an int beyond float's range
            refused.append((index, BAD_OHLC, f"prices {item[2:]!r}", symbol))
            continue
        good.append((index, symbol, int(bar_time), o, h, lo, c))
    prices = np.array([g[3:] for g in good], np.float64).reshape(-1, 4)
    bad = bad_ohlc(*prices.T).tolist()  # one call for every item that got this far
    checked = list(zip(good, bad, strict=True))
    refused += [(g[0], BAD_OHLC, _describe(*g[3:]), g[1]) for g, bad_bar in checked if bad_bar]
    for rejection in sorted(refused, key=lambda r: r[0]):
        reject(*rejection)
    good = [g for g, bad_bar in checked if not bad_bar]
    counts = [len(slot_lists[g[1]]) for g in good]
    origin = np.repeat(np.array([g[0] for g in good], np.int64), counts)
    slots = np.array([s for g in good for s in slot_lists[g[1]]], np.int64)

    def column(k: int, dtype: Any) -> np.ndarray:
        return np.repeat(np.array([g[k] for g in good], dtype), counts)

    ohlc = (column(3, np.float64), column(4, np.float64), column(5, np.float64))
    return slots, column(2, np.int64), column(6, np.float64), origin, ohlc


def check_array_ohlc(closes, opens, highs, lows, reject: Reject) -> tuple[np.ndarray, Ohlc | None]:
    """The array path's OHLC: a mask of the rows to keep and the arrays (None: none given,
    every row rejected as ``MISSING_OHLC``)."""
    n = closes.shape[0]
    if opens is None or highs is None or lows is None:
        for row in range(n):
            reject(row, MISSING_OHLC, "step_arrays without opens/highs/lows", None)
        return np.zeros(n, bool), None
    ohlc = tuple(np.ascontiguousarray(a, np.float64) for a in (opens, highs, lows))
    if any(a.shape != closes.shape for a in ohlc):
        raise ValueError("opens, highs and lows must have the shape of closes")
    bad = bad_ohlc(ohlc[0], ohlc[1], ohlc[2], closes)
    for i in np.flatnonzero(bad):
        reject(int(i), BAD_OHLC, _describe(ohlc[0][i], ohlc[1][i], ohlc[2][i], closes[i]), None)
    return ~bad, (ohlc[0], ohlc[1], ohlc[2])


# -- warmup input ---------------------------------------------------------------------------


def ohlc_history(
    history: Any, columns: Mapping[str, str] | None, time_unit: str | None, reject: Reject
) -> dict[str, tuple[np.ndarray, ...]]:
    """``{symbol: (times, opens, highs, lows, closes)}`` of a long table with OHLC
    columns or a mapping of such 5-tuples; a symbol's history of another form is
    rejected (``MISSING_OHLC`` for ``(times, closes)``, else ``BAD_HISTORY``), bad bars
    are rejected (``BAD_OHLC``, index = bar position) and left out."""
    if inputs.is_frame(history):
        symbols, times, p = _frame_prices(history, columns, time_unit)
        keys = symbols.astype(str)
        raw: dict[str, tuple] = {}
        for symbol in dict.fromkeys(keys.tolist()):
            rows = keys == symbol
            raw[symbol] = (times[rows], *(p[k][rows] for k in ("open", "high", "low", "close")))
    elif isinstance(history, Mapping):
        raw = dict(history)
    else:
        raise ValueError(
            "history must be a mapping {symbol: (times, opens, highs, lows, closes)} or a long "
            f"table with open/high/low/close columns, got {type(history).__name__}"
        )
    out: dict[str, tuple[np.ndarray, ...]] = {}
    for symbol, series in raw.items():
        if isinstance(series, tuple) and len(series) == 2:
            reject(-1, MISSING_OHLC, f"{symbol!r}: (times, closes) without open/high/low", symbol)
            continue
        try:
            times, o, h, lo, c = series
            times = inputs.times_to_ms(times, time_unit, what=f"history of {symbol!r} times")
            o, h, lo, c = (inputs.closes_array(v, name) for v, name in
                           ((o, "open"), (h, "high"), (lo, "low"), (c, "close")))  # fmt: skip
        except (TypeError, ValueError) as exc:
            reject(-1, BAD_HISTORY, f"{symbol!r}: {exc}", str(symbol))
            continue
        if times.ndim != 1 or any(v.shape != times.shape for v in (o, h, lo, c)):
            reject(-1, BAD_HISTORY, f"{symbol!r}: times and prices of different shapes", symbol)
            continue
        bad = bad_ohlc(o, h, lo, c)
        for i in np.flatnonzero(bad):
            reject(int(i), BAD_OHLC, _describe(o[i], h[i], lo[i], c[i]), symbol)
        keep = ~bad
        out[symbol] = (times[keep], o[keep], h[keep], lo[keep], c[keep])
    return out


# -- the strategy outputs -------------------------------------------------------------------


def rows_from_cells(out: dict[str, np.ndarray], n_strategies: int) -> StrategyRows:
    """A driver's outputs of cells ``row * n_strategies + k`` as ``StrategyRows``."""
    n = out["side"].shape[0] // n_strategies
    trades = out["trades"].reshape(n, n_strategies, *out["trades"].shape[1:])
    entry_times = out["trade_entry_times"]

    def field(k: int) -> np.ndarray:
        return trades[:, :, :, k]

    return StrategyRows(
        side=out["side"].reshape(n, n_strategies),
        equity=out["equity"].reshape(n, n_strategies),
        n_closed=out["n_closed"].reshape(n, n_strategies),
        trade_side=field(SL.TR_SIDE),
        trade_entry_time=entry_times.reshape(n, n_strategies, *entry_times.shape[1:]),
        trade_entry_price=field(SL.TR_ENTRY_PRICE),
        trade_exit_price=field(SL.TR_EXIT_PRICE),
        trade_reason=np.nan_to_num(field(SL.TR_REASON)).astype(np.int64),
        trade_return=field(SL.TR_RETURN),
    )


def pad_prices(jobs, width: int) -> Ohlc:
    """Each job's ``(slot, times, closes, opens, highs, lows)`` prices as ``(opens, highs,
    lows)`` padded to ``width`` bars (1.0)."""
    opens, highs, lows = (np.ones((len(jobs), max(width, 1))) for _ in range(3))
    for s, job in enumerate(jobs):
        for k, padded in enumerate((opens, highs, lows)):
            padded[s, : len(job[3 + k])] = job[3 + k]
    return opens, highs, lows


def metric_columns(store: StateStore, keys_slots: list[tuple[Any, int]]) -> dict[str, np.ndarray]:
    """One row per (stream, strategy): key columns and ``strategy_layout.METRIC_NAMES``, as
    ``BacktestResult.metric_columns`` (``strategy_metrics``' arithmetic)."""
    n = len(store.strategies)
    rows = np.array([slot * n + k for _, slot in keys_slots for k in range(n)], np.int64)
    sv, sc = store.strategy_values[rows], store.strategy_counters[rows]
    final = sv[:, SL.S_EQUITY]
    bars = sc[:, SL.S_BARS]
    exposure = np.zeros(rows.shape[0])
    seen = bars > 0
    exposure[seen] = sc[seen, SL.S_EXPOSED].astype(np.float64) / bars[seen].astype(np.float64)
    keys = [key for key, _ in keys_slots for _ in range(n)]
    return {
        "symbol": np.array([k.symbol for k in keys], dtype=object),
        "interval": np.array([k.interval for k in keys], dtype=object),
        "params_id": np.array([k.params_id for k in keys], np.int64),
        "strategy_id": np.tile(np.arange(n, dtype=np.int64), len(keys_slots)),
        "trades": sc[:, SL.S_TRADES].copy(),
        "wins": sc[:, SL.S_WINS].copy(),
        "total_return": final - 1.0,
        "max_drawdown": sv[:, SL.S_MAX_DRAWDOWN].copy(),
        "exposure": exposure,
        "final_equity": final.copy(),
    }


def concat_rows(parts) -> StrategyRows:
    """``StrategyRows`` of several chunks, in order."""
    return StrategyRows(
        *(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(StrategyRows))
    )
