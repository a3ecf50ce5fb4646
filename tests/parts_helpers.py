"""Engines, bars and comparable outputs for the tests of streams moved between engines
(test_snapshot_parts*.py)."""

from __future__ import annotations

import numpy as np
from short_params import SHORT, SHORT_UNCUT

from atc_stream import Engine, Strategy

MINUTE = 60_000
PARAMS = [SHORT, SHORT_UNCUT]
STRATEGIES = [Strategy(), Strategy(stop=0.01, max_hold=5)]


def walks(seed: int, symbols, n_bars: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        s: np.round(100.0 * np.exp(np.cumsum(rng.normal(0.0, 0.01, n_bars))), 4) for s in symbols
    }


def bars_of(closes: np.ndarray, start: int, stop: int, trading: bool) -> tuple:
    """A warmup history: times and closes (with opens, highs and lows when trading)."""
    c = closes[start:stop]
    times = np.arange(start, stop, dtype=np.int64) * MINUTE
    if not trading:
        return (times, c)
    return (times, c * 0.999, c * 1.002, c * 0.997, c)


def make_engine(backend: str, trading: bool, symbols, closes, warm: int) -> Engine:
    """An engine with ``PARAMS`` (and ``STRATEGIES`` when ``trading``) warmed up on the
    first ``warm`` bars of each symbol."""
    eng = Engine(PARAMS, backend=backend, outputs="all", strategies=STRATEGIES if trading else None)
    for s in symbols:
        eng.add_symbol(s)
    if warm:
        eng.warmup({s: bars_of(closes[s], 0, warm, trading) for s in symbols})
    return eng


def play(eng: Engine, closes, start: int, steps: int, trading: bool) -> list:
    """One step per bar time ``start .. start+steps-1`` over the engine's symbols."""
    results = []
    for j in range(start, start + steps):
        bars = []
        for s in eng.symbols:
            c = float(closes[s][j])
            bars.append((s, j * MINUTE, c * 0.999, c * 1.002, c * 0.997, c) if trading else
                        (s, j * MINUTE, c))  # fmt: skip
        results.append(eng.step(bars))
    return results


def canonical(results) -> list:
    """Every output row (its bits), position and trade of ``results`` keyed by stream, as
    sortable text, sorted: equal lists mean bit-identical outputs whatever the slots."""
    out = []
    for res in results:
        rows = np.ascontiguousarray(res.outputs).view(np.int64)
        for key, time, row in zip(res.keys, res.times.tolist(), rows, strict=True):
            out.append(repr((str(key), time, row.tobytes())))
        if res.strategy is not None:
            out += [repr(sorted(r.items())) for r in res.position_records()]
            out += [repr(sorted(r.items())) for r in res.trade_records()]
    return sorted(out)
