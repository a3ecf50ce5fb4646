#!/usr/bin/env python
"""Encoding benchmark: how long a step's batch message takes to be ready to send.

Run from the repository root::

    .venv/bin/python benchmarks/bench_encode.py                 # 20, 200 and 1,000 rows
    .venv/bin/python benchmarks/bench_encode.py --rows 200 --steps 500

Each step is a fresh ``Engine.step_arrays`` of N warmed symbols with every output column
(what ``atc-stream live`` publishes). Two paths encode its records into the JSON of a
batch message, alternated step by step in one process:

* **per record** (the baseline): one msgspec call per record, the records joined;
* **one array** (what ``SignalMessages`` does): ``messages.encoded_records_array``, one
  msgspec call for the step, the single records cut from it afterwards (timed apart:
  the batch is sent before they are needed).

Both start from the step's result, so the time includes building the rows' structs.
Each is measured back to back and after a ``--idle-ms`` sleep before every step (a live
burst comes after an idle: caches cold). Prints medians and the p10-p90 spread.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from atc_stream import Engine
from atc_stream.core.messages import (
    SignalRecord,
    _encoding_structs,
    encoded_records,
    encoded_records_array,
)

_RECORD = __import__("msgspec").json.Encoder().encode
_BATCH = b'{"v":2,"seq":%d,"published_at":%d,"count":%d,"records":[%s]}'


def _stepper(n: int, bars: int):
    rng = np.random.default_rng(7)
    closes = np.round(100 * np.exp(np.cumsum(rng.normal(0, 0.01, (n, bars)), axis=1)), 2)
    times = np.arange(bars, dtype=np.int64) * 60_000
    engine = Engine(threads=1, outputs="all")
    engine.warmup({f"S{i:04d}USDT": (times[:300], closes[i, :300]) for i in range(n)})
    slots = np.concatenate([engine.slots_of(f"S{i:04d}USDT") for i in range(n)])
    bar = iter(range(300, bars))

    def step():
        k = next(bar)
        return engine.step_arrays(slots, np.full(n, times[k]), closes[:, k])

    return step


def _per_record(result) -> float:
    start = time.perf_counter_ns()
    records = [_RECORD(s) for s in _encoding_structs(result, SignalRecord)]
    _BATCH % (1, time.time_ns(), len(records), b",".join(records))
    return (time.perf_counter_ns() - start) / 1000


def _one_array(result) -> tuple[float, float]:
    start = time.perf_counter_ns()
    array = encoded_records_array(result)
    b'{"v":2,"seq":%d,"published_at":%d,"count":%d,"records":%s}' % (
        1,
        time.time_ns(),
        len(result),
        array,
    )
    ready = time.perf_counter_ns()
    encoded_records(result)
    return (ready - start) / 1000, (time.perf_counter_ns() - ready) / 1000


def _spread(values: list[float]) -> str:
    p10, p50, p90 = np.percentile(values, [10, 50, 90])
    return f"{p50:,.0f} us ({p10:,.0f}-{p90:,.0f})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--rows", type=int, nargs="+", default=[20, 200, 1000])
    parser.add_argument("--steps", type=int, default=300, help="steps per path and case")
    parser.add_argument("--idle-ms", type=float, default=20.0)
    args = parser.parse_args(argv)
    print("| rows | case | path | batch ready, median (p10-p90) | rows/s | ratio | cut after |")
    print("|---:|---|---|---|---:|---:|---|")
    for n in args.rows:
        step = _stepper(n, 300 + 2 * (args.steps + 20) * 2 + 1)
        for case, idle in (
            ("back to back", 0.0),
            (f"after {args.idle_ms:g} ms idle", args.idle_ms),
        ):
            base, array, cut = [], [], []
            for k in range(args.steps + 20):
                result = step()
                if idle:
                    time.sleep(idle / 1000)
                t = _per_record(result)
                result = step()
                if idle:
                    time.sleep(idle / 1000)
                a, c = _one_array(result)
                if k >= 20:  # the first steps compile and fill caches
                    base.append(t)
                    array.append(a)
                    cut.append(c)
            b50, a50 = float(np.median(base)), float(np.median(array))
            print(f"| {n:,} | {case} | per record | {_spread(base)} | {n / b50 * 1e6:,.0f} "
                  f"| 1.00 | |")  # fmt: skip
            print(f"| {n:,} | {case} | one array | {_spread(array)} | {n / a50 * 1e6:,.0f} "
                  f"| {a50 / b50:.2f} | {_spread(cut)} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
