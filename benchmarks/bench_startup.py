#!/usr/bin/env python
"""Start-up benchmark: wall time of a new process, first run vs later runs.

Run from the repository root::

    .venv/bin/python benchmarks/bench_startup.py          # ~2 minutes (one cold compile each)
    .venv/bin/python benchmarks/bench_startup.py --later 5

Each workload runs as a fresh ``python`` process against a private, initially empty
kernel cache (``ATC_STREAM_CACHE_DIR`` in a temporary directory): the first run
compiles and fills it, later runs load from it. Times include interpreter start and
the numpy/numba imports. Targets for later runs: ``atc-stream replay`` of 600 bars
<= 1.5 s, ``compute`` <= 1.0 s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

COMPUTE = (
    "import numpy as np; from atc_stream import compute; "
    "compute(100 + np.sin(np.arange(1500) / 9.0))"
)


def _run(command: list[str], env: dict) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{command} failed:\n{done.stderr}")
    return elapsed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--later", type=int, default=3, help="later runs per workload")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        bars = Path(tmp) / "bars.csv"
        closes = 100 * np.exp(np.cumsum(np.random.default_rng(2).normal(0, 0.01, 600)))
        bars.write_text("symbol,time,close\n" + "".join(f"A,{t},{float(c)!r}\n" for t, c in
                                                          enumerate(closes)))  # fmt: skip
        workloads = {
            "`atc-stream replay` 600 bars": [
                sys.executable, "-m", "atc_stream", "replay", str(bars), "--backend", "cpu",
                "--output", str(Path(tmp) / "out.jsonl"),
            ],
            "`python -c 'compute(1,500 bars)'`": [sys.executable, "-c", COMPUTE],
        }  # fmt: skip
        targets = {"`atc-stream replay` 600 bars": 1.5, "`python -c 'compute(1,500 bars)'`": 1.0}
        print(f"1-min load average before: {os.getloadavg()[0]:.2f}\n")
        print("| workload | first run (compiles) | later runs, median | min | target |")
        print("|---|---|---|---|---|")
        for name, command in workloads.items():
            env = dict(os.environ, ATC_STREAM_CACHE_DIR=str(Path(tmp) / name[:5].strip("`")))
            first = _run(command, env)
            later = [_run(command, env) for _ in range(args.later)]
            median = float(np.median(later))
            ok = "met" if median <= targets[name] else "missed"
            print(f"| {name} | {first:.2f} s | {median:.2f} s | {min(later):.2f} s | "
                  f"<= {targets[name]} s ({ok}) |")  # fmt: skip
    print(f"\n1-min load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
