#!/usr/bin/env python
"""atc-stream against TA-Lib computing only the 54 moving averages ATC is built on.

Run from the repository root (TA-Lib: ``pip install 'atc-stream[bench]'``)::

    .venv/bin/python benchmarks/bench_vs_talib.py               # full sizes
    .venv/bin/python benchmarks/bench_vs_talib.py --quick       # tiny sizes (smoke test)

Prints one markdown table (workload, path, median time, throughput, ratio to TA-Lib):
ATC ``Engine.warmup`` of 512 random walks x 2,000 bars versus TA-Lib's EMA, SMA, WMA,
DEMA, LINEARREG and KAMA at the 9 default lengths of each family over the same series;
``Engine.step_arrays`` of one bar for 1,000 warmed symbols per stream-bar versus TA-Lib's
per-bar cost; both at 1 and 2 threads; ``compute()`` of one 1,500-bar series. Default
parameters; inputs on a 0.01 grid; compilation excluded; medians of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
from bench_cpu import kernel_target

import atc_stream
from atc_stream import ATCParams, Engine

BAR_MS = 60_000


def _walks(n: int, bars: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    steps = rng.normal(0.0, 0.001, (n, bars))
    return np.round(100.0 * np.exp(np.cumsum(steps, axis=1)), 2)


def _median(fn: Callable[[], object], repeats: int) -> float:
    fn()
    samples = []
    gc.disable()
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
    finally:
        gc.enable()
    return statistics.median(samples)


def _ma_lengths(params: ATCParams) -> list[int]:
    return list(params.family_lengths("EMA"))


def talib_mas(closes: np.ndarray, lengths: list[int]) -> None:
    import talib

    for row in closes:
        for n in lengths:
            talib.EMA(row, n)
            talib.SMA(row, n)
            talib.WMA(row, n)
            talib.DEMA(row, n)
            talib.LINEARREG(row, n)
            talib.KAMA(row, n)


def _stepper(threads: int, closes: np.ndarray, times: np.ndarray) -> Callable[[], object]:
    """One ``step_arrays`` of every symbol after a 200-bar warmup, a new bar each call."""
    symbols = closes.shape[0]
    engine = Engine(threads=threads)
    engine.warmup({f"S{i}": (times[:200], closes[i, :200]) for i in range(symbols)})
    slots = np.concatenate([engine.slots_of(f"S{i}") for i in range(symbols)])
    clock = iter(range(200, 10**9))
    return lambda: engine.step_arrays(slots, np.full(symbols, next(clock) * BAR_MS), closes[:, 200])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    n, bars, step_symbols, series = (16, 300, 50, 300) if args.quick else (512, 2000, 1000, 1500)
    Engine.compile()
    closes = _walks(n, bars)
    times = np.arange(bars, dtype=np.int64) * BAR_MS
    lengths = _ma_lengths(ATCParams())
    history = {f"S{i}": (times, closes[i]) for i in range(n)}
    rows: list[tuple[str, str, float, float, float]] = []
    talib_warmup = _median(lambda: talib_mas(closes, lengths), args.repeats)
    talib_bar = talib_warmup / (n * bars)
    rows.append(("54 MAs of all series", "TA-Lib", talib_warmup, n * bars, 1.0))
    step_closes = _walks(step_symbols, 201, seed=2)
    for threads in (1, 2):
        t = _median(lambda: Engine(threads=threads).warmup(history), args.repeats)  # noqa: B023
        rows.append((f"ATC warmup {n} x {bars}", f"threads={threads}", t, n * bars,
                     t / talib_warmup))  # fmt: skip
        t = _median(_stepper(threads, step_closes, times), args.repeats * 40)
        rows.append((f"ATC step {step_symbols} symbols", f"threads={threads}", t, step_symbols,
                     t / (talib_bar * step_symbols)))  # fmt: skip
    one = closes[0, :series]
    t = _median(lambda: atc_stream.compute(one, threads=1), args.repeats)
    t_talib = _median(lambda: talib_mas(one[None, :], lengths), args.repeats)
    rows.append((f"compute() of {series} bars", "threads=1", t, series, t / t_talib))
    rows.append((f"54 MAs of {series} bars", "TA-Lib", t_talib, series, 1.0))
    load = os.getloadavg()[0]
    print(f"one CPU thread unless noted; load average {load:.2f}; medians of {args.repeats}; "
          f"kernels compiled for {kernel_target()}")  # fmt: skip
    print("| workload | path | time | stream-bars/s | ratio to TA-Lib |")
    print("|---|---|---|---|---|")
    for workload, path, seconds, stream_bars, ratio in rows:
        print(f"| {workload} | {path} | {seconds * 1e3:.3f} ms | "
              f"{stream_bars / seconds:,.0f} | {ratio:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
