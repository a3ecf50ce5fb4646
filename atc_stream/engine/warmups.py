"""``Engine.warmup``: each symbol's history applied in one batched pass per chunk of
streams (the strategies too, every bar, when the engine trades them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from atc_stream.core import inputs, output_row
from atc_stream.core.progress import progress_bar
from atc_stream.core.results import Rejection, StepResult
from atc_stream.engine import paper
from atc_stream.engine.backtest import SIGNAL_CHUNK_BYTES
from atc_stream.engine.parsing import pad_histories, parse_history
from atc_stream.kernels import batch
from atc_stream.kernels.prepare import kernels_loaded
from atc_stream.state import layout as L


def warmup(
    engine: Any,
    history: Any,
    progress: bool,
    time_unit: str | None,
    columns: Mapping[str, str] | None,
) -> StepResult:
    """``engine.warmup(history, ...)`` (an ``Engine``; see its docstring)."""
    rejected: list[Rejection] = []
    trading = bool(engine.strategies)
    if trading:
        series_of = paper.ohlc_history(history, columns, time_unit, engine._rejecter(rejected))
        history = {sym: (v[0], v[4]) for sym, v in series_of.items()}
    else:
        history = inputs.history_from(history, columns=columns, time_unit=time_unit)
    parsed_of = {}
    for symbol, series in history.items():
        parsed = parse_history(symbol, series, engine._rejecter(rejected))
        if parsed is not None:
            parsed_of[symbol] = parsed
    # the new symbols' streams, in history order, allocated and initialised at once
    engine.add_symbols(s for s in parsed_of if s not in engine.symbol_slots)
    jobs: list[tuple] = []  # (slot, times, closes[, opens, highs, lows]): accepted bars only
    for symbol, (times, closes) in parsed_of.items():
        arrays = (times, closes, *series_of[symbol][1:4]) if trading else (times, closes)
        for slot in engine.slots_of(symbol):
            ok = _accepted_history(engine, slot, times, closes, rejected)
            # every bar accepted (None): the arrays themselves, no copies
            accepted = arrays if ok is None else tuple(v[ok] for v in arrays)
            jobs.append((int(slot), *accepted))
    results = []
    chunk = engine.backend.warmup_chunk
    if trading:  # every bar's outputs are kept: bound them like backtest()
        longest = max((len(job[1]) for job in jobs), default=1)
        chunk = max(1, min(chunk, SIGNAL_CHUNK_BYTES // (8 * max(longest, 1) * output_row.N_OUT)))
    chunks = range(0, len(jobs), chunk)
    if progress:
        _load_kernels_first(engine)
    with progress_bar(progress, total=len(chunks), desc="warmup", unit="chunk", leave=False) as bar:
        for start in chunks:
            results.append(_warmup_chunk(engine, jobs[start : start + chunk]))
            bar.update()
    if not results:
        empty = np.zeros(0, np.int64)
        return engine._result(empty, empty, np.zeros(0), np.zeros((0, output_row.N_OUT)), rejected)
    parts = list(zip(*results, strict=True))
    slots, times, closes, outs = (np.concatenate(p) for p in parts[:4])
    applied = ~np.isnan(outs[:, output_row.OUT_BAR_INDEX])
    strategy = paper.concat_rows(parts[4]).take(applied) if trading else None
    return engine._result(
        slots[applied], times[applied], closes[applied], outs[applied], rejected,
        strategy=strategy,
    )  # fmt: skip


def _load_kernels_first(engine: Any) -> None:
    """A phase of its own before a progress bar, so its rate and ETA leave compiling
    (or loading) the kernels out."""
    if engine.backend.name != "cpu":
        return
    trading = bool(engine.strategies)
    if not kernels_loaded(strategies=trading):
        engine.compile(progress=True, strategies=trading)


def _accepted_history(engine: Any, slot, times, closes, rejected) -> np.ndarray | None:
    """Which bars of a history the stream in ``slot`` accepts (the others reported);
    None when it accepts them all."""
    reasons = np.zeros(times.shape[0], np.int64)
    store = engine.store
    last_time = store.counters[slot, L.LAST_TIME]
    if batch.check_history(store.in_use, slot, times, closes, last_time, reasons) == len(times):
        return None
    ok = reasons == batch.ACCEPTED
    engine._report_codes(
        reasons, np.full(times.shape[0], slot), times, closes,
        np.arange(times.shape[0]), rejected,
    )  # fmt: skip
    return ok


def _warmup_chunk(engine: Any, jobs):
    slots, times, closes, counts = pad_histories([job[:3] for job in jobs])
    last = np.maximum(counts - 1, 0)
    rows = np.arange(len(jobs))
    if not engine.strategies:
        out = engine.backend.warmup(slots, times, closes, counts, False)[:, 0]
        return slots, times[rows, last], closes[rows, last], out
    ohlc = paper.pad_prices(jobs, times.shape[1])
    out, cells = engine.backend.warmup_with_strategies(slots, times, closes, ohlc, counts)
    strategy = paper.rows_from_cells(cells, len(engine.store.strategies))
    return slots, times[rows, last], closes[rows, last], out, strategy
