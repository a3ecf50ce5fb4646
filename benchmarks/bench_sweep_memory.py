"""Peak memory and time of ``atc-stream sweep``: bounded by a backtest call, not by the
history's length times the grid.

Sweeps 2 symbols x N one-minute bars (N = 20,000 and 100,000 by default) with a grid of
16 parameter sets x 16 strategies (512 streams), with and without ``--train-until``,
each in a fresh process, and prints its peak RSS (``wait4`` rusage) and time. Target:
the peak RSS of the longest history within 1.5x of the shortest's. ``--pythonpath``
runs another checkout's package (before/after comparisons).

``--many SxN`` sweeps a wide file instead: S symbols x N bars (e.g. 200x50000, 10 M
rows) with a grid of one set and one of four, where reading the file and cutting it
into the backtest calls' symbols weigh most (the grid is small).

    python benchmarks/bench_sweep_memory.py [--bars 20000 100000] [--pythonpath DIR]
    python benchmarks/bench_sweep_memory.py --many 200x50000 [--pythonpath DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_memory import peak_rss

GRID = """
[atc]
ema_len = [10, 14, 20, 28]
cut = [0.3, 0.5]
robustness = ["Medium", "Wide"]
[strategy]
direction = ["long_short", "long_only"]
stop = [0.01, 0.02]
take_profit = [0.0, 0.05]
fee_bps = [5, 10]
"""
SMALL_GRIDS = {
    "1 set": "[atc]\nema_len = [28]\n[strategy]\nstop = [0.02]\n",
    "4 sets": "[atc]\nema_len = [14, 28]\n[strategy]\nstop = [0.01, 0.02]\n",
}
SYMBOLS = 2
MINUTE = 60_000
START = 1_704_067_200_000  # 2024-01-01


def make_bars(path: Path, n_bars: int, symbols: int = SYMBOLS) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(3)
    parts = []
    for k in range(symbols):
        close = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 0.01, n_bars)))
        open_ = np.r_[100.0, close[:-1]] * np.exp(rng.normal(0.0, 0.002, n_bars))
        high = np.maximum(open_, close) * (1.0 + rng.uniform(0.0, 0.006, n_bars))
        low = np.minimum(open_, close) * (1.0 - rng.uniform(0.0, 0.006, n_bars))
        parts.append(pa.table({
            "symbol": [f"S{k:04d}"] * n_bars,
            "time": START + MINUTE * np.arange(n_bars, dtype=np.int64),
            "open": open_, "high": high, "low": low, "close": close,
        }))  # fmt: skip
    pq.write_table(pa.concat_tables(parts), path)


def sweep_peak(data: Path, grid: Path, work: Path, split: str | None, pythonpath: str | None):
    """(peak RSS MB, seconds, the sweep's summary line) of one sweep in a fresh process."""
    args = [sys.executable, "-m", "atc_stream", "sweep", str(data), "--grid", str(grid)]
    args += ["-o", str(work / "out"), "--no-progress", "--backend", "cpu"]
    if split:
        args += ["--train-until", split]
    peak, seconds, stderr = peak_rss(args, work, pythonpath, f"sweep of {data}")
    return peak, seconds, stderr.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bars", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--pythonpath", help="sweep with the atc_stream package of this directory")
    parser.add_argument("--many", metavar="SxN", help="a wide file: S symbols x N bars")
    args = parser.parse_args()
    print(f"load average: {os.getloadavg()} ({os.cpu_count()} CPUs, machine shared)")
    if args.many:
        symbols, n_bars = (int(x) for x in args.many.lower().split("x"))
        return wide(symbols, n_bars, args.pythonpath)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        grid = work / "grid.toml"
        grid.write_text(GRID)
        for n_bars in args.bars:
            data = work / f"bars_{n_bars}.parquet"
            make_bars(data, n_bars)
            half = START + MINUTE * (n_bars // 2)
            split = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(half / 1000))
            for label, cut in (("no split", None), ("--train-until", split)):
                peak, seconds, summary = sweep_peak(data, grid, work, cut, args.pythonpath)
                rows.append((n_bars, label, peak, seconds))
                print(f"  {summary}", flush=True)
    streams = SYMBOLS * 256
    print("\nworkload | path | peak RSS | time | stream-bars/s")
    for n_bars, label, peak, seconds in rows:
        rate = streams * n_bars / seconds
        print(f"  {streams} streams x {n_bars:,} bars | {label:<13} | {peak:7,.0f} MB | "
              f"{seconds:6.1f} s | {rate:12,.0f}")  # fmt: skip
    for label in ("no split", "--train-until"):
        peaks = [r[2] for r in rows if r[1] == label]
        print(f"{label}: longest / shortest history's peak RSS {max(peaks) / min(peaks):.2f}x "
              "(target <= 1.5x)")  # fmt: skip


def wide(symbols: int, n_bars: int, pythonpath: str | None) -> None:
    """``--many``: the small grids over ``symbols`` x ``n_bars`` bars."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = work / "wide.parquet"
        make_bars(data, n_bars, symbols)
        for label, text in SMALL_GRIDS.items():
            grid = work / "grid.toml"
            grid.write_text(text)
            peak, seconds, summary = sweep_peak(data, grid, work, None, pythonpath)
            rows.append((label, peak, seconds))
            print(f"  {summary}", flush=True)
    print("\nworkload | grid | peak RSS | time | bars/s")
    for label, peak, seconds in rows:
        print(f"  {symbols} symbols x {n_bars:,} bars | {label:<6} | {peak:7,.0f} MB | "
              f"{seconds:6.1f} s | {symbols * n_bars / seconds:12,.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
