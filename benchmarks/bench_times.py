#!/usr/bin/env python
"""Time column parsing: per-cell Python against the vectorized Arrow parser of timetext.

Run from the repository root::

    .venv/bin/python benchmarks/bench_times.py              # 500,000 rows
    .venv/bin/python benchmarks/bench_times.py --rows 100000 --repeats 3

The data set is deterministic: one time a second from 2023-11-14, as RFC 3339 text with
milliseconds and a zone (``2023-11-14T22:13:20.123Z``, ``...+02:00``), without a zone,
and as integer epoch milliseconds. Every path reads the same Arrow string column (as the
file readers get it from pyarrow's CSV reader) and must give the same epoch ms.

Paths:

- ``python fromisoformat``: ``datetime.fromisoformat`` cell by cell (how bar files were
  read before the one parser), which also takes forms the strict parser refuses;
- ``python strict``: ``timetext.iso_parts`` / ``text_to_ms`` cell by cell (the scalar
  parser of options and messages);
- ``arrow``: ``timetext.parse_time_column``, the whole column at once.

Printed (markdown): the median (and min) of ``--repeats`` runs per path, rows/s, and the
speed-up over the first path of the workload.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atc_stream.core.timetext import iso_parts, parse_time_column, text_to_ms  # noqa: E402

START_MS = 1_700_000_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def make_column(rows: int, form: str) -> tuple[pa.Array, np.ndarray]:
    """(Arrow string column, expected epoch ms) of ``rows`` times one second apart."""
    ms = START_MS + np.arange(rows, dtype=np.int64) * 1000 + np.arange(rows) % 1000
    stamps = ms.astype("datetime64[ms]").astype(str)
    if form == "iso_zoned":  # every third cell with an offset, the others with Z
        shifted = (ms + 7_200_000).astype("datetime64[ms]").astype(str)
        cells = [
            f"{s}+02:00" if i % 3 == 0 else f"{z}Z"
            for i, (s, z) in enumerate(zip(shifted.tolist(), stamps.tolist(), strict=True))
        ]
    elif form == "iso_naive":
        cells = stamps.tolist()
    else:
        cells = [str(v) for v in ms.tolist()]
    return pa.array(cells, pa.string()), ms


def fromisoformat_ms(column: pa.Array) -> np.ndarray:
    """Cell by cell with ``datetime.fromisoformat`` (no zone: UTC)."""
    out = np.zeros(len(column), np.int64)
    for i, text in enumerate(column.to_pylist()):
        text = text[:-1] + "+00:00" if text[-1] in "Zz" else text
        moment = datetime.fromisoformat(text)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        delta = moment - _EPOCH
        out[i] = delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000
    return out


def strict_cells_ms(column: pa.Array) -> np.ndarray:
    """Cell by cell with the strict scalar parser."""
    out = np.zeros(len(column), np.int64)
    for i, text in enumerate(column.to_pylist()):
        parts = iso_parts(text)
        out[i] = parts[0] if parts is not None else -1
    return out


def python_int_ms(column: pa.Array) -> np.ndarray:
    """Cell by cell: ``int()`` of each cell (epoch ms as they are)."""
    return np.array([text_to_ms(text, "ms") for text in column.to_pylist()], np.int64)


def arrow_ms(column: pa.Array) -> np.ndarray:
    ms, _, ok = parse_time_column(column)
    assert ok.all()
    return ms


def timed(fn: Callable[[pa.Array], np.ndarray], column: pa.Array, repeats: int):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn(column)
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    workloads = [
        ("ISO text, Z and +02:00", "iso_zoned",
         [("python fromisoformat", fromisoformat_ms), ("python strict", strict_cells_ms),
          ("arrow", arrow_ms)]),
        ("ISO text, no zone", "iso_naive",
         [("python fromisoformat", fromisoformat_ms), ("python strict", strict_cells_ms),
          ("arrow", arrow_ms)]),
        ("integer epoch ms", "int", [("python int", python_int_ms), ("arrow", arrow_ms)]),
    ]  # fmt: skip
    print(f"# Time column parsing: {args.rows:,} rows, median (min) of {args.repeats}")
    print(f"\n{platform.processor() or platform.machine()}, Python {platform.python_version()},"
          f" pyarrow {pa.__version__}\n")  # fmt: skip
    print("| workload | path | time (s) | rows/s | ratio |")
    print("|---|---|---:|---:|---:|")
    for title, form, paths in workloads:
        column, want = make_column(args.rows, form)
        base = None
        for name, fn in paths:
            median, best, got = timed(fn, column, args.repeats)
            assert np.array_equal(got, want), (title, name)
            base = base if base is not None else median
            print(f"| {title} | {name} | {median:.3f} ({best:.3f}) | "
                  f"{args.rows / median:,.0f} | {base / median:.1f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
