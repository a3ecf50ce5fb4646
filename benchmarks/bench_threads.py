#!/usr/bin/env python
"""Threading benchmark: the default thread choice against fixed settings.

Run from the repository root::

    .venv/bin/python benchmarks/bench_threads.py            # ~2 minutes
    .venv/bin/python benchmarks/bench_threads.py --quick    # seconds (smoke test)

For ``Engine.step_arrays`` of 100, 1,000 and 10,000 warmed symbols and ``compute`` of
one 1,500-bar series it times three settings side by side: default (``threads=None``,
chosen per call), one thread (the serial drivers) and all threads (the parallel
drivers on every CPU numba may use); each back to back and at a 50 ms cadence (a
live feed: threads fall asleep between bars), on the machine as it is and again with
one competing busy process. The settings are timed side by side: in 5 rounds, each
setting gets a block of consecutive calls (rotated order; each block's first call is
not counted), so that a slow phase of the shared host falls on all of them alike.
Figures are the median of wall-clock samples and, in brackets, their 25th–75th
percentiles; compilation is excluded (``Engine.compile()`` first). Targets: default
within 15 % of the fastest setting on every row; 10,000 symbols with all threads
>= 1.5x one thread when 2 cores are free. The threading layer is numba's default
(``NUMBA_THREADING_LAYER`` to try another).
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import time

import numpy as np


def _spin() -> None:
    while True:
        pass


def _engine(n: int, history: int, threads: int | None):
    from atc_stream import Engine

    rng = np.random.default_rng(n)
    closes = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, (n, history + 4000)), axis=1))
    times = np.arange(closes.shape[1], dtype=np.int64)
    engine = Engine(backend="cpu", capacity=n, threads=threads)
    engine.warmup({f"S{i}": (times[:history], closes[i, :history]) for i in range(n)})
    slots = np.concatenate([engine.slots_of(f"S{i}") for i in range(n)])
    return engine, slots, times, closes


def _stats_ms(samples: list[float]) -> tuple[float, float, float]:
    """Median, 25th and 75th percentile, in ms."""
    q25, q50, q75 = np.percentile(samples, [25, 50, 75]) * 1e3
    return float(q50), float(q25), float(q75)


def _interleaved(calls: dict, repeats: int, cadence: float, blocks: int) -> dict:
    """Times ``calls`` (label -> a callable) side by side: ``blocks`` rounds, each giving
    every setting a block of consecutive calls, in rotated order, so that a slow
    phase of the machine (a busy neighbour on the host) falls on every setting alike.
    A block's first call warms the setting up again and is not counted."""
    labels = list(calls)
    per_block = max(2, -(-repeats // blocks))
    samples: dict[str, list[float]] = {label: [] for label in labels}
    gc.disable()
    try:
        for b in range(blocks):
            for label in labels[b % len(labels) :] + labels[: b % len(labels)]:
                call = calls[label]
                for j in range(per_block + 1):
                    if cadence:
                        time.sleep(cadence)
                    t = time.perf_counter()
                    call()
                    if j:
                        samples[label].append(time.perf_counter() - t)
    finally:
        gc.enable()
    return {label: _stats_ms(samples[label]) for label in labels}


def time_steps(n: int, history: int, settings: dict, repeats: int, cadence: float, blocks=5):
    """``step_arrays`` of ``n`` warmed symbols under each thread setting."""
    calls = {}
    for label, threads in settings.items():
        engine, slots, times, closes = _engine(n, history, threads)
        bar = iter(range(history, closes.shape[1]))

        def call(engine=engine, slots=slots, times=times, closes=closes, bar=bar):
            k = next(bar)
            engine.step_arrays(slots, np.full(n, times[k]), closes[:, k])

        calls[label] = call
    return _interleaved(calls, repeats, cadence, blocks)


def time_compute(n_bars: int, settings: dict, repeats: int, cadence: float, blocks=5):
    """``compute`` of one ``n_bars`` series under each thread setting."""
    from atc_stream import compute

    closes = 100 * np.exp(np.cumsum(np.random.default_rng(1).normal(0, 0.01, n_bars)))
    calls = {
        label: (lambda threads=threads: compute(closes, threads=threads))
        for label, threads in settings.items()
    }
    return _interleaved(calls, repeats, cadence, blocks)


def run_rows(args, competing: bool, all_threads: int) -> list[tuple]:
    settings = {"default": None, "1 thread": 1, f"{all_threads} threads": all_threads}
    rows = []
    workloads = [(f"step_arrays {n:,} sym", n) for n in args.symbols] + [
        (f"compute {args.bars:,} bars", None)
    ]
    for cadence in (0.0, args.cadence):
        for name, n in workloads:
            if n is None:
                times = time_compute(args.bars, settings, args.repeats, cadence)
            else:
                times = time_steps(n, args.history, settings, args.repeats, cadence)
            pace = "back to back" if not cadence else f"every {cadence * 1e3:.0f} ms"
            load = "+1 busy process" if competing else "as is"
            rows.append((name, pace, load, times))
    return rows


def print_rows(rows, header_load: str) -> None:
    labels = list(rows[0][3])
    print(f"\n{header_load}\n")
    print("| workload | pace | load | " + " | ".join(labels) + " | default / fastest |")
    print("|---|---|---|" + "---|" * len(labels) + "---|")
    for name, pace, load, times in rows:
        fastest = min(median for median, _, _ in times.values())
        cells = " | ".join(
            f"{times[k][0]:.3f} ms ({times[k][1]:.3f}–{times[k][2]:.3f})" for k in labels
        )
        ratio = times["default"][0] / fastest
        flag = "" if ratio <= 1.15 else " (over 15 %)"
        print(f"| {name} | {pace} | {load} | {cells} | {ratio:.2f}x{flag} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--history", type=int, default=300)
    parser.add_argument("--bars", type=int, default=1500)
    parser.add_argument("--cadence", type=float, default=0.05)
    parser.add_argument("--symbols", type=int, nargs="+", default=[100, 1000, 10000])
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.history, args.symbols = 5, 60, [100, 2000]

    import numba

    from atc_stream import Engine
    from atc_stream.kernels.threads import available_cpus

    Engine(backend="cpu").compile(print)
    all_threads = numba.config.NUMBA_NUM_THREADS
    print(f"CPUs available: {available_cpus()}; numba threads: {all_threads}; layer: ", end="")
    time_steps(200, 10, {"all": all_threads}, 1, 0.0, blocks=1)
    print(numba.threading_layer())
    quiet = run_rows(args, False, all_threads)
    print_rows(quiet, f"1-min load average before: {os.getloadavg()[0]:.2f}")
    busy = multiprocessing.Process(target=_spin, daemon=True)
    busy.start()
    try:
        time.sleep(1.0)
        loaded = run_rows(args, True, all_threads)
    finally:
        busy.terminate()
        busy.join()
    print_rows(loaded, f"1-min load average with the busy process: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
