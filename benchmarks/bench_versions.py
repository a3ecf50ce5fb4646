#!/usr/bin/env python
"""Two checkouts of atc-stream side by side: the same CPU workloads, fresh processes, rotated.

Run from the repository root, naming the other checkout (e.g. a ``git worktree`` of an
older commit)::

    .venv/bin/python benchmarks/bench_versions.py --before ../atc-old --after . --rounds 7

Each sample is one fresh Python process that imports the package from one checkout
(``PYTHONPATH``), compiles or loads its kernels (not timed), and times three workloads
through the public API only, so any two versions can be compared:

- ``warmup``: ``Engine(threads=1).warmup`` of 512 random-walk series x 2,000 bars;
- ``step``: ``Engine().step_arrays`` of one bar for 1,000 warmed symbols (default threads),
  the median of 200 calls;
- ``compute``: ``compute`` of one 2,000-bar series, the median of 20 calls.

The checkouts alternate (before, after, after, before, ...) so that a slow phase of a
shared machine does not land on one of them. The table reports each workload's median
over the rounds, its 25th-75th percentile spread, throughput, and the ratio after/before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, time, sys
import numpy as np
from atc_stream import ATCParams, Engine, compute

rng = np.random.default_rng(2026)
def walk(n):
    return np.round(100 + np.cumsum(rng.normal(0, 0.5, n)), 2).clip(1.0)

times = np.arange(2000, dtype=np.int64) * 60_000
history = {f"S{i:04d}": (times, walk(2000)) for i in range(512)}

warm = Engine(ATCParams(), backend="cpu", threads=1)
warm.warmup({"W": (times[:300], walk(300))})  # compile/load kernels untimed
eng = Engine(ATCParams(), backend="cpu", threads=1)
t0 = time.perf_counter()
eng.warmup(history)
warmup_s = time.perf_counter() - t0

step_eng = Engine(ATCParams(), backend="cpu", capacity=1024)
step_eng.warmup({f"S{i:04d}": (times[:400], walk(400)) for i in range(1000)})
slots = np.concatenate([step_eng.slots_of(f"S{i:04d}") for i in range(1000)])
closes = walk(1000)
samples = []
for k in range(220):
    bar_times = np.full(1000, (400 + k) * 60_000, np.int64)
    t0 = time.perf_counter()
    step_eng.step_arrays(slots, bar_times, closes)
    samples.append(time.perf_counter() - t0)
step_s = float(np.median(samples[20:]))

series = walk(2000)
compute(series[:100], ATCParams())
csamples = []
for _ in range(20):
    t0 = time.perf_counter()
    compute(series, ATCParams())
    csamples.append(time.perf_counter() - t0)
print(json.dumps({"warmup": warmup_s, "step": step_s, "compute": float(np.median(csamples))}))
"""

#: Work units of each workload, for the throughput column.
UNITS = {
    "warmup": (512 * 2000, "stream-bars/s"),
    "step": (1000, "stream-bars/s"),
    "compute": (2000, "bars/s"),
}


def sample(checkout: Path) -> dict[str, float]:
    """One fresh process timing every workload on ``checkout``'s package."""
    env = {**os.environ, "PYTHONPATH": str(checkout.resolve())}
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        env=env,
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the baseline checkout")
    parser.add_argument("--after", type=Path, default=Path("."), help="the checkout to compare")
    parser.add_argument("--rounds", type=int, default=7, help="fresh processes per checkout")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    names = {"before": args.before, "after": args.after}
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for r in range(args.rounds):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for name in order:
            runs[name].append(sample(names[name]))
            print(f"round {r + 1}/{args.rounds} {name}: {runs[name][-1]}", file=sys.stderr)
    print(f"load average at end: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("| workload | path | median | p25-p75 | throughput | ratio to before |")
    print("|---|---|---|---|---|---|")
    for workload, (units, unit_name) in UNITS.items():
        base = statistics.median(s[workload] for s in runs["before"])
        for name in ("before", "after"):
            values = [s[workload] for s in runs[name]]
            med = statistics.median(values)
            lo, hi = quartiles(values)
            print(
                f"| {workload} | {name} ({names[name]}) | {med * 1e3:.3f} ms | "
                f"{lo * 1e3:.3f}-{hi * 1e3:.3f} ms | {units / med:,.0f} {unit_name} | "
                f"{med / base:.3f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
