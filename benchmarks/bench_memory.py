"""Peak memory of ``atc-stream replay`` with snapshots: bounded by streams, not rows.

Replays 200 symbols x N one-minute bars (N = 10,000 and 40,000 by default) from CSV and
from Parquet (time-major rows), and from a CSV with one block of rows per symbol (not in
time order: the external sort of ``replay/stream.py``), with ``--warmup 1000``,
``--snapshot-dir`` and ``--snapshot-every 500000``, each in a fresh process, and prints
its peak RSS (``wait4`` rusage), the snapshot size and the time. Targets:
peak RSS <= 800 MB for both sizes, the two within 10 %, snapshots under 1 MB. Also
times the bar reader -- streamed (``io.readers.iter_bar_batches``, each of replay's two
passes) and materialised (``read_bars``) -- against the old loader (Python ``csv``
module into lists, kept here for the comparison only).

    python benchmarks/bench_memory.py [--bars 10000 40000] [--symbols 200] [--pythonpath DIR]
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def make_bars(directory: Path, n_symbols: int, n_bars: int) -> tuple[Path, Path, Path]:
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    t0 = 1_700_000_040_000
    times = np.repeat(t0 + 60_000 * np.arange(n_bars, dtype=np.int64), n_symbols)
    symbols = np.tile(np.array([f"S{i:03d}" for i in range(n_symbols)]), n_bars)
    walk = 100 * np.exp(np.cumsum(rng.normal(0, 0.002, (n_bars, n_symbols)), axis=0))
    table = pa.table({"symbol": symbols, "time": times, "close": np.round(walk, 2).ravel()})
    csv_path = directory / f"bars_{n_symbols}x{n_bars}.csv"
    parquet_path = directory / f"bars_{n_symbols}x{n_bars}.parquet"
    blocks_path = directory / f"blocks_{n_symbols}x{n_bars}.csv"
    pcsv.write_csv(table, csv_path)
    pq.write_table(table, parquet_path)
    by_symbol = np.argsort(np.arange(n_bars * n_symbols) % n_symbols, kind="stable")
    pcsv.write_csv(table.take(by_symbol), blocks_path)
    return csv_path, parquet_path, blocks_path


#: Runs a command (its stdout dropped) and prints its peak RSS (KiB) and exit status.
#: Measuring through this small process matters: Linux starts a child's ``ru_maxrss`` at
#: the RSS of the process that forked it (the hiwater mark of the image replaced at
#: exec), and a benchmark holds its generated tables (the old loader's lists: 3 GB at
#: 8 M rows).
_PEAK_OF = (
    "import os, subprocess, sys; "
    "p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL); "
    "_, status, usage = os.wait4(p.pid, 0); print(usage.ru_maxrss, status)"
)


def replay_peak(path: Path, work: Path, pythonpath: str | None = None) -> tuple[float, float, int]:
    """(peak RSS MB, seconds, snapshot bytes) of one replay in a fresh process."""
    snaps = work / f"snaps_{path.suffix[1:]}_{path.stem}"
    out = work / f"out_{path.stem}_{path.suffix[1:]}.parquet"
    args = [sys.executable, "-m", "atc_stream", "replay", str(path), "--no-progress"]
    args += ["--backend", "cpu", "--warmup", "1000", "-o", str(out)]
    args += ["--snapshot-dir", str(snaps), "--snapshot-every", "500000"]
    peak, seconds, _ = peak_rss(args, work, pythonpath, f"replay of {path}")
    sizes = [p.stat().st_size for p in snaps.glob("*.atcsnap")]
    return peak, seconds, max(sizes)


def peak_rss(args: list[str], work: Path, pythonpath: str | None, what: str):
    """(peak RSS MB, seconds, stderr) of ``args`` run in a fresh process in ``work`` (not
    this checkout, which ``-m`` would put first), stdout dropped; ``pythonpath``: another
    checkout's atc_stream (before/after comparisons). Exits naming ``what`` if it fails."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK_OF, *args], capture_output=True, text=True, env=env,
        cwd=work,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    peak_kib, status = (int(x) for x in proc.stdout.split())
    if status != 0:
        raise SystemExit(f"{what} failed ({status}):\n{proc.stderr}")
    return peak_kib / 1024, seconds, proc.stderr


def old_loader(path: Path) -> int:
    """The csv-module CSV loader (csv module into lists, then numpy) -- for comparison."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = list(reader)
    columns = {name: [r[j] for r in rows] for j, name in enumerate(header)}
    times = np.asarray(columns["time"]).astype(np.int64)
    closes = np.asarray(columns["close"], dtype=object).astype(np.float64)
    symbols = np.asarray(columns["symbol"], dtype=object)
    return len(times) + len(closes) + len(symbols) * 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bars", type=int, nargs="+", default=[10_000, 40_000])
    parser.add_argument("--symbols", type=int, default=200)
    parser.add_argument(
        "--pythonpath",
        help="replay with the atc_stream package of this directory (e.g. an older checkout)",
    )
    args = parser.parse_args()
    from atc_stream.io.readers import iter_bar_batches, read_bars

    print(f"load average: {os.getloadavg()} ({os.cpu_count()} CPUs, machine shared)")
    loads, replays = [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for n_bars in args.bars:
            csv_path, parquet_path, blocks_path = make_bars(work, args.symbols, n_bars)
            n_rows = args.symbols * n_bars
            t = time.perf_counter()
            for _ in iter_bar_batches(csv_path):
                pass
            streamed = time.perf_counter() - t
            t = time.perf_counter()
            read_bars(csv_path)
            materialised = time.perf_counter() - t
            t = time.perf_counter()
            old_loader(csv_path)
            old_seconds = time.perf_counter() - t
            label = f"CSV {args.symbols}x{n_bars}"
            loads.append((label, n_rows, streamed, materialised, old_seconds))
            for path, kind in ((csv_path, "csv"), (parquet_path, "parquet"),
                               (blocks_path, "csv, blocks")):  # fmt: skip
                peak, seconds, snap = replay_peak(path, work, args.pythonpath)
                replays.append((f"{kind} {args.symbols}x{n_bars}", peak, seconds, snap))
    print("\nloader: workload | path | time | rows/s | ratio vs old csv-module loader")
    for label, n_rows, streamed, materialised, old in loads:
        for path, seconds in (("streamed", streamed), ("read_bars", materialised), ("old", old)):
            print(
                f"  {label:<16} | {path:<10} | {seconds:6.2f} s | {n_rows / seconds:>11,.0f} | "
                f"{old / seconds:.2f}x"
            )
    print("\nreplay with snapshots: workload | peak RSS | time | snapshot size")
    for label, peak, seconds, snap in replays:
        print(f"  {label:<20} | {peak:7,.0f} MB | {seconds:6.1f} s | {snap:,} B")
    peaks = [r[1] for r in replays]
    by_kind: dict[str, list[float]] = {}
    for label, peak, _, _ in replays:  # one kind of file, every size
        by_kind.setdefault(label.rsplit(" ", 1)[0], []).append(peak)
    spreads = ", ".join(
        f"{kind} {100 * (max(p) / min(p) - 1):.1f} %" for kind, p in by_kind.items()
    )
    print(
        f"\npeak RSS max {max(peaks):,.0f} MB (target <= 800); spread over the sizes: "
        f"{spreads} (target <= 10 %); largest snapshot {max(r[3] for r in replays):,} B "
        "(target < 1 MB)"
    )


if __name__ == "__main__":
    main()
