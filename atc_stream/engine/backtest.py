"""``backtest``: every (symbol, parameter set, strategy) stream of a bar table, ATC on the
kernels then the strategy kernels, in one batched call (docs/spec.md, "Backtest")."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from atc_stream.core import inputs, output_row
from atc_stream.core.backtest_result import BacktestResult, EquityCurves
from atc_stream.core.intervals import validate_interval
from atc_stream.core.params import ATCParams
from atc_stream.core.schema import ready_bar
from atc_stream.core.strategy import EXIT_REASONS, Strategy
from atc_stream.core.timetext import MAX_TIME_MS
from atc_stream.engine.backends import make_backend
from atc_stream.kernels.backtest_cpu import run_backtest
from atc_stream.state import strategy_layout as SL
from atc_stream.state.arrays import StateStore

log = logging.getLogger("atc_stream")

PRICE_COLUMNS = ("open", "high", "low", "close")
#: bytes of ATC outputs one warmup call may hold (chunks of streams x bars x outputs)
SIGNAL_CHUNK_BYTES = 256 * 2**20


def backtest(
    bars: Any,
    params: ATCParams | Sequence[ATCParams] | None = None,
    strategies: Strategy | Sequence[Strategy] | None = None,
    *,
    interval: str = "1m",
    time_unit: str | None = None,
    backend: str = "cpu",
) -> BacktestResult:
    """Backtest every (symbol, ``params``, ``strategies``) triple of ``bars`` (docs/spec.md,
    "Backtest: strategy streams").

    ``bars``: a long table (pandas DataFrame, Arrow table or dict of arrays) with columns
    ``symbol, time, open, high, low, close``, each symbol's rows in strictly increasing
    time; times as ``Engine.step`` takes them (``time_unit`` for integer epochs, None =
    ms). ``params`` (default ``ATCParams()``) and ``strategies`` (default ``Strategy()``)
    may be lists; ``params_id``/``strategy_id`` in the result are positions in them and
    ``interval`` labels the rows (a label ``core.intervals`` accepts: ``1m``, ``4h``...;
    any other is a ``ValueError``). ``backend``: "cpu", "cuda" or "auto" (both the ATC and
    the strategy kernels run there; results are the same bits).

    Bad input raises ``ValueError`` naming the problem and the first offending row (its
    position in ``bars``): a missing column, a non-finite or non-positive price,
    ``high < low``, an open or close outside ``[low, high]``, a time not after the
    symbol's previous one, an invalid strategy. Nothing is skipped silently.
    """
    validate_interval(interval)  # a label of every row: refused before any work
    param_sets = _param_list(params)
    strategy_list = as_strategy_list(strategies)
    symbols, times, prices = _bar_columns(bars, time_unit)
    _check_prices(symbols, times, prices)
    names, rows_of = _group_rows(symbols, times)
    n_sym, n_par, n_str = len(names), len(param_sets), len(strategy_list)
    lengths = np.array([r.shape[0] for r in rows_of], np.int64)
    width = max(int(lengths.max(initial=0)), 1)
    padded_times = np.zeros((n_sym, width), np.int64)
    padded = {name: np.ones((n_sym, width)) for name in PRICE_COLUMNS}
    for b, rows in enumerate(rows_of):
        padded_times[b, : rows.shape[0]] = times[rows]
        for name in PRICE_COLUMNS:
            padded[name][b, : rows.shape[0]] = prices[name][rows]

    store = StateStore(capacity=max(n_sym * n_par, 1))
    atc = make_backend(backend, store)
    ready, longs, shorts = _signals(atc, store, param_sets, padded_times, padded["close"], lengths)

    grid = np.indices((n_sym, n_par, n_str)).reshape(3, -1)
    bar_series, param_ids, strategy_ids = (np.ascontiguousarray(g, np.int64) for g in grid)
    signal_series = bar_series * n_par + param_ids
    spv = np.array([[s.stop, s.take_profit, s.fee, s.slippage] for s in strategy_list])
    spi = np.array([[s.max_hold, s.long_target, s.short_target] for s in strategy_list], np.int64)
    run = run_backtest
    if atc.name == "cuda":
        from atc_stream.kernels.backtest_cuda import run_backtest_cuda  # loads numba.cuda

        run = run_backtest_cuda
    out = run(
        padded["open"], padded["high"], padded["low"], padded["close"], lengths,
        ready, longs, shorts, bar_series, signal_series, strategy_ids, spv, spi,
    )  # fmt: skip
    atc.close()
    keys = {
        "symbol": np.array(names, dtype=object)[bar_series],
        "interval": np.full(bar_series.shape[0], interval, dtype=object),
        "params_id": param_ids,
        "strategy_id": strategy_ids,
    }
    metrics = _metric_columns(out, keys)
    _warn_no_equity(metrics)
    return BacktestResult(
        _trade_columns(out, keys, bar_series, padded_times),
        metrics,
        _curves(out, bar_series, padded_times, lengths),
    )


# -- inputs ---------------------------------------------------------------------------------


def check_param_set(params: Any, what: str = "params") -> ATCParams:
    """``params`` when it is an ATCParams, else the ``ValueError`` naming what it is."""
    if not isinstance(params, ATCParams):
        hint = " (make one with ATCParams(**params))" if isinstance(params, Mapping) else ""
        raise ValueError(f"{what} must be an ATCParams, got {type(params).__name__}{hint}")
    return params


def _param_list(params: Any) -> list[ATCParams]:
    items = [ATCParams()] if params is None else params
    items = [items] if isinstance(items, ATCParams) else list(items)
    for i, p in enumerate(items):
        check_param_set(p, f"params[{i}]")
    if not items:
        raise ValueError("params is empty: give at least one ATCParams")
    return items


def as_strategy_list(strategies: Any) -> list[Strategy]:
    items = [Strategy()] if strategies is None else strategies
    items = [items] if isinstance(items, (Strategy, Mapping)) else list(items)
    out = []
    for i, s in enumerate(items):
        if isinstance(s, Mapping):
            try:
                s = Strategy.from_dict(dict(s))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"strategies[{i}]: {exc}") from None
        if not isinstance(s, Strategy):
            raise ValueError(f"strategies[{i}] must be a Strategy, got {type(s).__name__}")
        out.append(s)
    if not out:
        raise ValueError("strategies is empty: give at least one Strategy")
    return out


def _bar_columns(bars: Any, time_unit: str | None):
    """``(symbols, times_ms, {price column: float64})`` of a pandas/Arrow/dict table."""
    if inputs.is_arrow(bars, "RecordBatch"):
        import pyarrow as pa

        bars = pa.Table.from_batches([bars])
    if inputs.is_arrow(bars, "Table"):
        names = list(bars.column_names)
    elif inputs.is_pandas(bars, "DataFrame") or isinstance(bars, Mapping):
        names = list(bars.keys())
    else:
        raise ValueError(
            "bars must be a pandas DataFrame, an Arrow table or a dict of columns, "
            f"got {type(bars).__name__}"
        )
    missing = [c for c in ("symbol", "time", *PRICE_COLUMNS) if c not in names]
    if missing:
        raise ValueError(
            f"bars has no column(s) {', '.join(map(repr, missing))} (columns: {names}); "
            "a backtest needs symbol, time, open, high, low, close"
        )

    def column(name: str) -> Any:
        return bars.column(name) if inputs.is_arrow(bars, "Table") else bars[name]

    symbols = _symbol_codes(column("symbol"))
    times = inputs.times_to_ms(column("time"), time_unit, what="column 'time'")
    prices = {name: inputs.closes_array(column(name), name) for name in PRICE_COLUMNS}
    n = symbols.codes.shape[0]
    for name, values in [("time", times), *prices.items()]:
        if values.shape != (n,):
            raise ValueError(f"bars column {name!r} has shape {values.shape}, expected ({n},)")
    if n == 0:
        raise ValueError("bars has no rows")
    return symbols, times, prices


class _Symbols:
    """A symbol column as codes into ``names`` (names in order of first appearance)."""

    def __init__(self, names: list[str], codes: np.ndarray) -> None:
        self.names = names
        self.codes = codes

    def __getitem__(self, row: int) -> str:
        return self.names[int(self.codes[row])]


def _symbol_codes(raw: Any) -> _Symbols:
    """Dictionary-encode the symbol column with Arrow (no Python object per row); a cell
    that is not a string raises naming its row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        if inputs.is_arrow(raw, "ChunkedArray"):
            raw = raw.combine_chunks()
        if inputs.is_arrow(raw, "Array"):
            text = raw.cast(pa.string())  # a dictionary column too: its unused entries go
        else:
            values = raw.to_numpy(dtype=object) if inputs.is_pandas(raw, "Series") else raw
            text = pa.array(np.asarray(values, dtype=object), type=pa.string())
        if text.null_count:
            raise TypeError("a missing symbol")
        encoded = pc.dictionary_encode(text)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError):
        cells = raw.to_pylist() if inputs.is_arrow(raw, "Array") else list(raw)
        i, bad = next((i, x) for i, x in enumerate(cells) if not isinstance(x, str))
        raise ValueError(f"bars row {i}: symbol must be a string, got {bad!r}") from None
    names = [str(name) for name in encoded.dictionary.to_pylist()]
    return _Symbols(names, encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64))


def _check_prices(symbols: _Symbols, times: np.ndarray, prices: dict[str, np.ndarray]):
    """Raise naming the first bar ``inputs.bad_ohlc`` refuses and the check it fails, or
    the first time past ``MAX_TIME_MS`` (the engine rejects those too)."""
    late = np.flatnonzero(times > MAX_TIME_MS)
    if late.size:
        i = int(late[0])
        raise ValueError(
            f"bars row {i} (symbol {symbols[i]!r}): time {int(times[i])} is after "
            "9999-12-31T23:59:59.999Z, the latest a bar may have"
        )
    o, h, lo, c = (prices[name] for name in PRICE_COLUMNS)
    bad = np.flatnonzero(inputs.bad_ohlc(o, h, lo, c))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"bars row {i} (symbol {symbols[i]!r}, time {int(times[i])}): "
            f"{inputs.ohlc_problem(o[i], h[i], lo[i], c[i])}"
        )


def _group_rows(symbols: _Symbols, times: np.ndarray) -> tuple[list[str], list[np.ndarray]]:
    """Symbols in order of first appearance and each one's rows; a time that does not
    follow its symbol's previous one raises naming the row."""
    codes = symbols.codes
    order = np.argsort(codes, kind="stable")
    sorted_codes, sorted_times = codes[order], times[order]
    bad = (sorted_codes[1:] == sorted_codes[:-1]) & (sorted_times[1:] <= sorted_times[:-1])
    if bad.any():
        i = int(order[1:][bad].min())
        rows = np.flatnonzero(codes == codes[i])
        prev = int(rows[np.searchsorted(rows, i) - 1])
        what = "repeats" if times[prev] == times[i] else "is before"
        raise ValueError(
            f"bars row {i} (symbol {symbols[i]!r}): time {int(times[i])} {what} the time "
            f"{int(times[prev])} of row {prev}; each symbol's times must increase"
        )
    starts = np.searchsorted(sorted_codes, np.arange(len(symbols.names) + 1))
    rows_of = [order[starts[k] : starts[k + 1]] for k in range(len(symbols.names))]
    return list(symbols.names), rows_of


# -- ATC signals on the kernels -----------------------------------------------------------


def _signals(backend, store, param_sets, times, closes, lengths):
    """``ready``, ``long``, ``short`` (signal series x bars, bool) of every (symbol, params)
    pair, signal series ``symbol * len(param_sets) + params``: the warmup kernel with
    every bar kept, in chunks of streams bounded by ``SIGNAL_CHUNK_BYTES``."""
    n_sym, width = closes.shape
    n_par = len(param_sets)
    rows = [store.add_params(p) for p in param_sets]
    ready_from = np.array([ready_bar(p) for p in param_sets], np.int64)
    shape = (n_sym * n_par, width)
    ready, longs, shorts = np.zeros(shape, bool), np.zeros(shape, bool), np.zeros(shape, bool)
    chunk = max(1, SIGNAL_CHUNK_BYTES // (8 * width * output_row.N_OUT))
    series = np.arange(n_sym * n_par)
    for a in range(0, series.shape[0], chunk):
        part = series[a : a + chunk]
        symbol, param = part // n_par, part % n_par
        slots = np.array([store.allocate(rows[p]) for p in param], np.int64)
        counts = lengths[symbol]
        out = backend.warmup(slots, times[symbol], closes[symbol], counts, True)
        bar = np.arange(width)[None, :]
        valid = bar < counts[:, None]
        ready[part] = valid & (bar >= ready_from[param][:, None])
        longs[part] = valid & (out[:, :, output_row.OUT_LONG] == 1.0)
        shorts[part] = valid & (out[:, :, output_row.OUT_SHORT] == 1.0)
        for slot in slots:
            store.release(int(slot))
    return ready, longs, shorts


# -- outputs --------------------------------------------------------------------------------


def _trade_columns(out, keys, bar_series, times) -> dict[str, np.ndarray]:
    counts = out["metrics"][:, SL.M_TRADES].astype(np.int64)
    trades = out["trades"]
    if counts.max(initial=0) > trades.shape[1]:  # cannot happen: one entry bar per trade
        raise RuntimeError("a stream closed more trades than the trade buffer holds")
    kept = np.arange(trades.shape[1])[None, :] < counts[:, None]
    rows = trades[kept]
    stream = np.repeat(np.arange(counts.shape[0]), counts)
    series = bar_series[stream]
    reasons = np.array(EXIT_REASONS, dtype=object)
    columns = {name: values[stream] for name, values in keys.items()}
    columns.update(
        side=rows[:, SL.TR_SIDE].astype(np.int64),
        entry_time=times[series, rows[:, SL.TR_ENTRY_BAR].astype(np.int64)],
        exit_time=times[series, rows[:, SL.TR_EXIT_BAR].astype(np.int64)],
        entry_price=rows[:, SL.TR_ENTRY_PRICE].copy(),
        exit_price=rows[:, SL.TR_EXIT_PRICE].copy(),
        reason=reasons[rows[:, SL.TR_REASON].astype(np.int64)],
    )
    columns["return"] = rows[:, SL.TR_RETURN].copy()
    return columns


def _metric_columns(out, keys) -> dict[str, np.ndarray]:
    metrics = out["metrics"]
    columns = dict(keys)
    for k, name in enumerate(SL.METRIC_NAMES):
        values = metrics[:, k]
        columns[name] = values.astype(np.int64) if name in ("trades", "wins") else values.copy()
    return columns


def _warn_no_equity(metrics: dict[str, np.ndarray]) -> None:
    """Say so when strategy streams end with no equity left: the numbers are the spec's,
    but a drawdown above 100 % needs its cause next to it."""
    gone = np.flatnonzero(metrics["final_equity"] <= 0.0)
    if gone.size:
        first = int(gone[0])
        log.warning(
            "%d of %d strategy streams ended with no equity left (the first: %s, params_id "
            "%d, strategy_id %d, final_equity %.4g): a short lost more than its cash; a "
            "stream with no cash enters nothing more (docs/spec.md, \"Backtest\")",
            gone.size, metrics["final_equity"].size, metrics["symbol"][first],
            metrics["params_id"][first], metrics["strategy_id"][first],
            metrics["final_equity"][first],
        )  # fmt: skip


def _curves(out, bar_series, times, lengths) -> EquityCurves:
    counts = lengths[bar_series]
    kept = np.arange(times.shape[1])[None, :] < counts[:, None]
    return EquityCurves(
        starts=np.r_[0, np.cumsum(counts)].astype(np.int64),
        times=times[bar_series][kept],
        equity=out["equity"][kept],
        side=out["held"][kept],
    )
