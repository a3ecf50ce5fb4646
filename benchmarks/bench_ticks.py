#!/usr/bin/env python
"""Tick replay benchmark: ticks → time bars → engine.

Run from the repository root::

    .venv/bin/python benchmarks/bench_ticks.py               # 1,000,000 ticks, 100 symbols
    .venv/bin/python benchmarks/bench_ticks.py --quick       # 100,000 ticks (smoke test)
    .venv/bin/python benchmarks/bench_ticks.py --ticks 5000000 --symbols 500 --interval 1m

The data set is deterministic (``np.random.default_rng(seed)``): ``--ticks`` trades over
one day, spread over ``--symbols`` symbols with unequal activity (the quietest ones have
empty intervals), each symbol's price a random walk on a 0.01 grid, sizes exponential,
trade times random and sorted (a time-ordered trade feed).

Printed (markdown), each the median (and min) of ``--repeats`` runs, numba compilation
excluded (every path runs once untimed first):

- aggregation: symbol encoding (``ticks_from_arrays``: strings → codes), the bar
  aggregation alone (``aggregate_ticks``, empty intervals skipped and carried), and the
  whole load + aggregate from Parquet and CSV files, in ticks/s;
- engine: the resulting bars replayed through ``Engine`` by ``BarPlayer`` at max speed
  (every bar stepped: one ``step`` per bar time with all symbols that have a bar then;
  and with a warmup of the first half of each symbol's bars), in bars/s.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atc_stream import Engine  # noqa: E402
from atc_stream.connectors.replay.player import BarPlayer  # noqa: E402
from atc_stream.connectors.replay.ticks import aggregate_ticks  # noqa: E402
from atc_stream.io.tick_reader import load_ticks, ticks_from_arrays  # noqa: E402

DAY_MS = 86_400_000
START_MS = 1_700_000_000_000 - 1_700_000_000_000 % DAY_MS


def make_ticks(n_ticks: int, n_symbols: int, seed: int):
    """Deterministic trades: (times, symbols, prices, sizes), time-ordered."""
    rng = np.random.default_rng(seed)
    times = START_MS + np.sort(rng.integers(0, DAY_MS, n_ticks))
    weights = 1.0 / np.arange(1, n_symbols + 1) ** 0.8  # a few busy, many quiet symbols
    codes = rng.choice(n_symbols, n_ticks, p=weights / weights.sum())
    names = np.array([f"SYM{i:04d}USDT" for i in range(n_symbols)])
    start_prices = rng.uniform(5, 500, n_symbols)
    steps = rng.normal(0, 0.0005, n_ticks)
    # per-symbol random walks: cumulative sum of each symbol's own steps
    order = np.argsort(codes, kind="stable")
    walk = np.empty(n_ticks)
    sorted_codes = codes[order]
    cums = np.cumsum(steps[order])
    firsts = np.searchsorted(sorted_codes, np.arange(n_symbols))
    base = np.where(firsts < n_ticks, cums[np.minimum(firsts, n_ticks - 1)], 0.0)
    walk[order] = cums - base[sorted_codes]
    prices = np.maximum(np.round(start_prices[codes] * np.exp(walk), 2), 0.01)
    sizes = np.round(rng.exponential(0.5, n_ticks), 4)
    return times, names[codes], prices, sizes


def timed(fn, repeats: int):
    fn()  # untimed: compilation, caches
    samples = []
    for _ in range(repeats):
        gc.collect()
        gc.disable()
        t = time.perf_counter()
        out = fn()
        samples.append(time.perf_counter() - t)
        gc.enable()
    return statistics.median(samples), min(samples), out


def row(name: str, items: int, unit: str, median: float, best: float) -> str:
    return (
        f"| {name} | {items:,} {unit} | {median:.3f} s | {best:.3f} s | "
        f"{items / median:,.0f} {unit}/s | {items / best:,.0f} {unit}/s |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ticks", type=int, default=1_000_000)
    ap.add_argument("--symbols", type=int, default=100)
    ap.add_argument("--interval", default="1m")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--engine-repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="100,000 ticks, 2 repeats")
    args = ap.parse_args()
    if args.quick:
        args.ticks, args.repeats, args.engine_repeats = 100_000, 2, 1

    print(
        f"# bench_ticks: {args.ticks:,} ticks, {args.symbols} symbols, one day, "
        f"{args.interval} bars"
    )
    print(
        f"python {platform.python_version()}, numpy {np.__version__}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    )
    times, symbols, prices, sizes = make_ticks(args.ticks, args.symbols, args.seed)
    n = args.ticks

    lines = [
        "| stage | items | median | min | throughput (median) | throughput (min) |",
        "|---|---|---|---|---|---|",
    ]
    med, best, ticks = timed(lambda: ticks_from_arrays(times, symbols, prices, sizes), args.repeats)
    lines.append(row("encode symbols (strings → codes)", n, "ticks", med, best))
    med, best, bars = timed(lambda: aggregate_ticks(ticks, args.interval), args.repeats)
    lines.append(row(f"aggregate {args.interval}, empty=skip", n, "ticks", med, best))
    med, best, carried = timed(
        lambda: aggregate_ticks(ticks, args.interval, empty="carry"), args.repeats
    )
    lines.append(row(f"aggregate {args.interval}, empty=carry", n, "ticks", med, best))

    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as tmp:
        table = pa.table({"time": times, "symbol": symbols, "price": prices, "size": sizes})
        parquet, csv = Path(tmp) / "ticks.parquet", Path(tmp) / "ticks.csv"
        pq.write_table(table, parquet)
        pacsv.write_csv(table, csv)
        for path in (parquet, csv):
            med, best, _ = timed(
                lambda path=path: aggregate_ticks(load_ticks(path), args.interval), args.repeats
            )
            size_mb = path.stat().st_size / 1e6
            name = f"load {path.suffix[1:]} ({size_mb:.0f} MB) + aggregate"
            lines.append(row(name, n, "ticks", med, best))
    print()
    print("## ticks → bars")
    print()
    print("\n".join(lines))
    print()
    print(
        f"{len(bars):,} bars (skip) / {len(carried):,} bars (carry) from {n:,} ticks; "
        f"{int((carried.trades == 0).sum()):,} carried empty intervals"
    )

    bar_table = bars.to_bar_table()
    n_bars = len(bar_table)
    per_symbol = np.bincount(bars.codes, minlength=len(bars.names))
    lines = [
        "| path | bars | median | min | throughput (median) | throughput (min) |",
        "|---|---|---|---|---|---|",
    ]

    def play(warmup: int):
        engine = Engine(backend="cpu", interval=args.interval, capacity=len(bars.names))
        return BarPlayer(engine, bar_table, warmup_bars=warmup).run()

    med, best, summary = timed(lambda: play(0), args.engine_repeats)
    steps = np.unique(bar_table.times).size
    lines.append(row(f"BarPlayer, all stepped ({steps:,} steps)", n_bars, "bars", med, best))
    half = int(np.median(per_symbol) // 2)
    med, best, summary = timed(lambda: play(half), args.engine_repeats)
    lines.append(
        row(
            f"BarPlayer, warmup {half} bars/symbol ({summary.warmup_bars:,} bars) + step",
            n_bars, "bars", med, best,
        )
    )  # fmt: skip
    print()
    print(f"## bars → engine (cpu backend, {os.environ.get('NUMBA_NUM_THREADS', 'all')} threads)")
    print()
    print("\n".join(lines))
    print()
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
