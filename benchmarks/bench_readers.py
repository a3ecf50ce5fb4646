#!/usr/bin/env python
"""Bar reader benchmark: ``iter_bar_batches`` typed against its text reading.

Run from the repository root::

    .venv/bin/python benchmarks/bench_readers.py            # Parquet 10 M rows, CSV 2 M rows
    .venv/bin/python benchmarks/bench_readers.py --quick    # 200 k / 100 k rows (smoke test)
    .venv/bin/python benchmarks/bench_readers.py --parquet 200x50000 --csv 200x10000 --repeats 5
    git show REV:atc_stream/io/readers.py > /tmp/readers_before.py
    .venv/bin/python benchmarks/bench_readers.py --before /tmp/readers_before.py

The files are deterministic (``np.random.default_rng(seed)``), written once into
``--dir`` (a temporary directory by default): a Parquet file of ``--parquet SxN``
(symbols x bars, one symbol after another, a row group per symbol: float64 prices, int64
epoch-ms times, as an exchange export gives them) and a CSV file of ``--csv SxN`` (every
symbol's bar of a minute, then the next minute). Each is read with open, high, low and
close (``ohlc_columns``), every batch consumed and dropped.

Two paths, timed side by side in this process, alternating run by run (a slow phase of
the machine falls on both; there is nothing compiled to exclude): *text*, every cell cast
to text and parsed strictly (``iter_bar_batches(..., _text_path=True)``, the reader as it
was; the CSV read and its checks are shared), and *typed*, the default. ``--before
FILE`` adds a third path, *before*: the ``iter_bar_batches`` of another version of
``io/readers.py`` (a file of a past commit, importing this checkout's other modules).
An untimed first read of each path checks that all give the same batches and bad rows.
Printed (markdown): workload, path, median time (min and max beside it), rows/s at the
median, and the ratio of the first path's median (before, else text) to it.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.util
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atc_stream.io import readers  # noqa: E402

START_MS = 1_704_067_200_000  # 2024-01-01
MINUTE_MS = 60_000


def walks(n_symbols: int, n_bars: int, seed: int) -> np.ndarray:
    """Closes on a 0.01 grid, one random walk per symbol: shape (symbols, bars)."""
    rng = np.random.default_rng(seed)
    steps = rng.normal(0.0, 0.01, (n_symbols, n_bars))
    return np.round(100.0 * np.exp(np.cumsum(steps, axis=1)), 2) + 0.01


def bar_columns(close: np.ndarray) -> dict[str, np.ndarray]:
    """open, high, low and close of ``close``'s last axis (each bar opens at the last close)."""
    open_ = np.concatenate([close[..., :1], close[..., :-1]], axis=-1)
    high = np.maximum(open_, close) + 0.01
    low = np.minimum(open_, close) - 0.005
    return {"open": open_, "high": high, "low": low, "close": close}


def write_parquet(path: Path, n_symbols: int, n_bars: int, seed: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    prices = bar_columns(walks(n_symbols, n_bars, seed))
    times = START_MS + MINUTE_MS * np.arange(n_bars, dtype=np.int64)
    writer = None
    for k in range(n_symbols):
        table = pa.table({
            "symbol": pa.array([f"S{k:04d}USDT"] * n_bars),
            "time": times,
            **{name: values[k] for name, values in prices.items()},
        })  # fmt: skip
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    if writer is not None:
        writer.close()


def write_csv(path: Path, n_symbols: int, n_bars: int, seed: int) -> None:
    import pyarrow as pa
    import pyarrow.csv as pcsv

    prices = bar_columns(walks(n_symbols, n_bars, seed + 1))
    names = np.array([f"S{k:04d}USDT" for k in range(n_symbols)])
    table = pa.table({
        "symbol": np.tile(names, n_bars),
        "time": np.repeat(START_MS + MINUTE_MS * np.arange(n_bars, dtype=np.int64), n_symbols),
        **{name: values.T.ravel() for name, values in prices.items()},
    })  # fmt: skip
    pcsv.write_csv(table, path)


def load_before(path: Path):
    """The module of another version of ``io/readers.py``."""
    spec = importlib.util.spec_from_file_location("readers_before", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def read(path: Path, how: str, before=None, digest: bool = False) -> tuple[int, str]:
    """(rows read by path ``how``, a digest of every batch and the bad rows when
    ``digest``)."""
    module = before if how == "before" else readers
    bad = module.BadRows()
    options = {"_text_path": True} if how == "text" else {}
    rows = 0
    seen = hashlib.sha256()
    for batch in module.iter_bar_batches(
        path, ohlc_columns=readers.PRICE_NAMES, bad=bad, **options
    ):
        rows += len(batch)
        if digest:
            for values in (batch.codes, batch.times, batch.closes, batch.lines, *batch.ohlc):
                seen.update(values.tobytes())
    seen.update("\n".join(bad.lines()).encode())
    return rows, seen.hexdigest()


def timed_paths(path: Path, paths: tuple[str, ...], repeats: int, before) -> dict:
    """Samples of each path, in rotated order (the first path of a round rotates)."""
    samples: dict[str, list[float]] = {name: [] for name in paths}
    for r in range(repeats):
        k = r % len(paths)
        for name in paths[k:] + paths[:k]:
            gc.collect()
            t = time.perf_counter()
            read(path, name, before)
            samples[name].append(time.perf_counter() - t)
    return samples


def size_of(text: str) -> tuple[int, int]:
    symbols, bars = text.lower().split("x")
    return int(symbols), int(bars)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parquet", default="200x50000", help="symbols x bars (10 M rows)")
    ap.add_argument("--csv", default="200x10000", help="symbols x bars (2 M rows)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", type=Path, help="keep the generated files here (reused)")
    ap.add_argument("--before", type=Path, help="another version of io/readers.py, timed too")
    ap.add_argument("--quick", action="store_true", help="20x10000 and 20x5000, 2 repeats")
    args = ap.parse_args()
    before = load_before(args.before) if args.before else None
    paths = ("before",) * bool(before) + ("text", "typed")
    if args.quick:
        args.parquet, args.csv, args.repeats = "20x10000", "20x5000", 2

    print(f"# bench_readers: Parquet {args.parquet}, CSV {args.csv} (symbols x bars), OHLC")
    print(
        f"python {platform.python_version()}, numpy {np.__version__}, "
        f"pyarrow {__import__('pyarrow').__version__}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        where = args.dir or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        files = []
        for kind, size, write in (("parquet", args.parquet, write_parquet),
                                  ("csv", args.csv, write_csv)):  # fmt: skip
            n_symbols, n_bars = size_of(size)
            path = where / f"bars_{size}_{args.seed}.{kind}"
            if not path.exists():
                write(path, n_symbols, n_bars, args.seed)
            files.append((kind, n_symbols * n_bars, path))
        lines = [
            "| workload | path | time (s): median (min–max) | rows/s | ratio |",
            "|---|---|---:|---:|---:|",
        ]
        for kind, n_rows, path in files:
            (rows, digest), *others = (read(path, name, before, True) for name in paths)
            if any(other != digest for _, other in others):
                raise SystemExit(f"{path.name}: the paths' batches or bad rows differ")
            samples = timed_paths(path, paths, args.repeats, before)
            baseline = statistics.median(samples[paths[0]])
            size_mb = path.stat().st_size / 1e6
            workload = f"{kind} {n_rows / 1e6:g} M rows ({size_mb:.0f} MB)"
            for name in paths:
                median = statistics.median(samples[name])
                spread = f"{min(samples[name]):.2f}–{max(samples[name]):.2f}"
                lines.append(
                    f"| {workload} | {name} | {median:.2f} ({spread}) | "
                    f"{rows / median:,.0f} | {baseline / median:.1f}x |"
                )
        print()
        print("\n".join(lines))
        print()
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
