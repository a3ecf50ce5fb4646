#!/usr/bin/env python
"""CPU benchmarks for atc-stream: recomputation vs incremental step, warmup, the reference.

Run from the repository root::

    .venv/bin/python benchmarks/bench_cpu.py              # full sizes (a few minutes)
    .venv/bin/python benchmarks/bench_cpu.py --quick      # tiny sizes, < 60 s (CI smoke test)
    .venv/bin/python benchmarks/bench_cpu.py --repeats 7 --json results.json

One run prints, side by side, markdown tables with columns
(workload, path, median time, min time, throughput, ratio to the table's baseline):

(a) per new bar: full recomputation of every symbol's whole history (``compute`` per
    symbol, and the batched ``Engine.warmup`` into a fresh engine) versus the
    incremental ``Engine.step_arrays`` of one bar for all symbols (after warmup), the
    Python-API ``Engine.step`` and the bare kernel; plus where the time of a
    1,000-symbol step goes (validation/planning, allocation, kernel, result assembly);
(b) warmup throughput in symbol-bars/s;
(c) the reference implementation's throughput (``atc_stream.reference``) for comparison;
(d) memory: state bytes per stream and the peak RSS of a separate process that warms
    up 100,000 streams on 100 bars each and steps them once.

Timing rules: numba compilation is excluded (every compiled function is called once
before any timing, and paths are called once more untimed before their timed
repeats, except the largest warmups); each figure is the median of ``--repeats``
wall-clock samples (``time.perf_counter``; steps use 40x more samples), with the
garbage collector disabled while sampling. Inputs are deterministic random walks
(``np.random.default_rng(seed)``) rounded to a 0.01 price grid, one bar per minute.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

BASE_TIME = 1_700_000_000_000  # ms since epoch of bar 0
BAR_MS = 60_000
TICK_DECIMALS = 2  # prices on a 0.01 grid


# -- sizes ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    step_symbols: tuple[int, ...]
    history: int
    warmup: tuple[tuple[int, int], ...]  # (symbols, bars)
    reference: tuple[int, int]  # (symbols, bars)
    memory: tuple[int, int]  # (streams, bars)
    step_repeat_factor: int = 40


FULL = Sizes(
    step_symbols=(1, 100, 1000),
    history=1500,
    warmup=((100, 1500), (500, 2000), (5000, 2000)),
    reference=(2, 1500),
    memory=(100_000, 100),
)
QUICK = Sizes(
    step_symbols=(1, 10, 50),
    history=300,
    warmup=((10, 300), (20, 400), (50, 400)),
    reference=(1, 200),
    memory=(2_000, 100),
    step_repeat_factor=10,
)

#: the speed targets this benchmark checks
TARGET_STEP_RATIO = 500.0  # step of 1,000 symbols vs the fastest full recompute of all
# the CPU-lanes targets, at the default threads on the 2-core machine (were 1 ms and 1.5 M)
TARGET_STEP_SECONDS = 0.15e-3  # step of 1,000 symbols, median
TARGET_WARMUP_RATE = 10_000_000.0  # symbol-bars/s
TARGET_BYTES_PER_STREAM = 4096


# -- inputs ---------------------------------------------------------------------------


def random_walks(n_symbols: int, n_bars: int, seed: int) -> np.ndarray:
    """Deterministic geometric random walks, shape (n_symbols, n_bars), on a 0.01 grid."""
    rng = np.random.default_rng(seed)
    start = rng.uniform(20.0, 200.0, n_symbols)
    steps = rng.normal(0.0, 0.002, (n_symbols, n_bars))
    prices = start[:, None] * np.exp(np.cumsum(steps, axis=1))
    return np.maximum(np.round(prices, TICK_DECIMALS), 10.0**-TICK_DECIMALS)


def bar_times(n_bars: int) -> np.ndarray:
    return BASE_TIME + BAR_MS * np.arange(n_bars, dtype=np.int64)


def symbol_names(n: int) -> list[str]:
    return [f"SYM{i:06d}" for i in range(n)]


def history_dict(names, times, prices, n_bars):
    """``{symbol: (times, closes)}`` with the first ``n_bars`` bars (views, no copies)."""
    return {name: (times[:n_bars], prices[i, :n_bars]) for i, name in enumerate(names)}


# -- timing ---------------------------------------------------------------------------


@dataclass
class Timing:
    samples: list[float]

    @property
    def median(self) -> float:
        return float(np.median(self.samples))

    @property
    def min(self) -> float:
        return float(np.min(self.samples))


def bench(
    fn: Callable[[Any], Any],
    repeats: int,
    *,
    setup: Callable[[], Any] | None = None,
    warm: bool = True,
) -> Timing:
    """Median-ready wall-clock samples of ``fn(setup())`` (setup is not timed)."""
    if warm:
        fn(setup() if setup else None)
    samples = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            arg = setup() if setup else None
            t0 = time.perf_counter()
            fn(arg)
            samples.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return Timing(samples)


# -- tables ---------------------------------------------------------------------------


@dataclass
class Row:
    workload: str
    path: str
    timing: Timing | None
    work: float  # units of work per call (for throughput)
    unit: str
    baseline: bool = False
    note: str = ""
    ratio: float | None = field(default=None, init=False)

    @property
    def rate(self) -> float | None:
        return None if self.timing is None else self.work / self.timing.median


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_rate(rate: float | None, unit: str) -> str:
    if rate is None:
        return "-"
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if rate >= scale:
            return f"{rate / scale:.3g} {prefix} {unit}"
    return f"{rate:.3g} {unit}"


def fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    if ratio >= 100:
        return f"{ratio:,.0f}x"
    if ratio >= 10:
        return f"{ratio:.1f}x"
    return f"{ratio:.2f}x"


def fill_ratios(rows: list[Row], *, by_rate: bool = False) -> None:
    """Ratio to the preceding baseline row: baseline time / time (or rate / baseline rate).

    Both read "how many times faster than the baseline" (> 1 is better).
    """
    base = None
    for row in rows:
        if row.baseline:
            base = row
        if base is None or row.timing is None or base.timing is None:
            continue
        if by_rate:
            row.ratio = row.rate / base.rate
        else:
            row.ratio = base.timing.median / row.timing.median


def load_note() -> str:
    """The 1-minute load average now (other processes skew timings on a small machine)."""
    return f"1-min load average before this table: {os.getloadavg()[0]:.2f}"


def print_table(title: str, rows: list[Row], ratio_header: str, load: str = "") -> None:
    print(f"\n### {title}\n")
    if load:
        print(f"({load})\n")
    print(f"| workload | path | time (median) | min | throughput | {ratio_header} |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        path = f"{r.path} *(baseline)*" if r.baseline else r.path
        if r.note:
            path += f" — {r.note}"
        median = None if r.timing is None else r.timing.median
        low = None if r.timing is None else r.timing.min
        print(
            f"| {r.workload} | {path} | {fmt_time(median)} | {fmt_time(low)} "
            f"| {fmt_rate(r.rate, r.unit)} | {fmt_ratio(r.ratio)} |"
        )
    sys.stdout.flush()


def row_json(r: Row) -> dict[str, Any]:
    return {
        "workload": r.workload,
        "path": r.path,
        "median_s": None if r.timing is None else r.timing.median,
        "min_s": None if r.timing is None else r.timing.min,
        "samples_s": None if r.timing is None else r.timing.samples,
        "throughput": r.rate,
        "unit": r.unit,
        "ratio": r.ratio,
        "baseline": r.baseline,
    }


# -- machine --------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def kernel_target() -> str:
    """What numba compiles the kernels for: the CPU name, its widest vector extension, and
    the parts the lane kernel's window sums run in (``simd.SUM_PARTS``)."""
    import llvmlite.binding as llvm
    from numba.core import config as numba_config

    from atc_stream.kernels import simd

    features = simd.target_features()
    widest = next(
        (name for flag, name in (("+avx512f", "AVX-512"), ("+avx2", "AVX2"), ("+avx", "AVX"))
         if flag in features),
        "no AVX",
    )  # fmt: skip
    cpu = numba_config.CPU_NAME or llvm.get_host_cpu_name()
    return f"{cpu} ({widest}; window sums in {simd.SUM_PARTS} part(s) of a lane block)"


def machine_info() -> dict[str, Any]:
    import numba

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        layer = numba.threading_layer()
    except ValueError:
        layer = "not initialised"
    mem_gib = None
    try:
        with open("/proc/meminfo") as f:
            mem_gib = int(f.readline().split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable,
        "memory_gib": None if mem_gib is None else round(mem_gib, 1),
        "numba_threads": numba.get_num_threads(),
        "numba_threading_layer": layer,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "platform": platform.platform(),
        "kernels_compiled_for": kernel_target(),
        "load_average": os.getloadavg(),
    }


# -- compile everything once (excluded from timings) -----------------------------------


def compile_all() -> float:
    """Call every compiled function once with the benchmark's argument types."""
    from atc_stream import Engine, compute
    from atc_stream.core.output_row import N_OUT
    from atc_stream.core.reference import compute_reference
    from atc_stream.kernels import batch, cpu, threads

    t0 = time.perf_counter()
    prices = random_walks(2, 80, seed=12345)
    times = bar_times(80)
    compute(prices[0, :60])
    compute_reference(prices[0, :40])
    eng = Engine(backend="cpu")
    eng.warmup(history_dict(["A", "B"], times, prices, 60))
    slots = np.concatenate([eng.slots_of("A"), eng.slots_of("B")])
    eng.step_arrays(slots, np.full(2, times[60]), prices[:, 60])
    eng.step([("A", int(times[61]), float(prices[0, 61]))])
    # the bare drivers, as the breakdowns call them
    st = eng.store
    reasons = np.zeros(2, np.int64)
    t62 = np.full(2, times[62])
    c62 = np.ascontiguousarray(prices[:, 62])
    order, starts = batch.plan_rounds(
        st.counters, st.in_use, st.pending_last, st.pending_count, slots, t62, c62, reasons
    )
    out = np.full((2, N_OUT), np.nan)
    # through threads.run, as the engine calls them: the first parallel call picks
    # numba's threading layer for the process (workqueue unless NUMBA_THREADING_LAYER
    # says otherwise), so calling a parallel driver bare would time another layer
    arrays = (st.ring, st.values, st.counters, st.params.lengths, st.params.values)
    threads.run(cpu.step_serial, cpu.step_parallel, 2, *arrays, slots, t62, c62, order, starts, out)
    return time.perf_counter() - t0


# -- (a) per new bar --------------------------------------------------------------------


def bench_per_bar(sizes: Sizes, repeats: int, seed: int, results: dict) -> None:
    load = load_note()
    step_repeats = max(repeats * sizes.step_repeat_factor, 20)
    rows: list[Row] = []
    breakdown_rows: list[tuple[str, Timing | None, str]] = []
    for n in sizes.step_symbols:
        more, breakdown = per_bar_rows(
            n, sizes.history, repeats, step_repeats, seed + n, n == max(sizes.step_symbols)
        )
        rows += more
        breakdown_rows = breakdown or breakdown_rows

    fill_ratios(rows)
    print_table(
        "(a) Per new bar: full recomputation vs incremental step",
        rows,
        "× faster than baseline",
        load,
    )
    results["per_bar"] = [row_json(r) for r in rows]
    results["_rows_per_bar"] = rows

    n = max(sizes.step_symbols)
    print(f"\n### (a2) Where the time of one step of {n:,} symbols goes (medians)\n")
    print("| part | time (median) | share of `step_arrays` | note |")
    print("|---|---:|---:|---|")
    total = breakdown_rows[0][1].median
    for name, timing, note in breakdown_rows:
        t = None if timing is None else timing.median
        share = "-" if t is None else f"{100 * t / total:.1f} %"
        print(f"| {name} | {fmt_time(t)} | {share} | {note} |")
    results["step_breakdown"] = [
        {"part": name, "median_s": None if t is None else t.median, "note": note}
        for name, t, note in breakdown_rows
    ]


def per_bar_rows(n, history, repeats, step_repeats, seed, with_breakdown):
    """Rows of table (a) for ``n`` symbols (and the step breakdown when asked)."""
    from atc_stream import Engine, compute
    from atc_stream.kernels import batch

    names = symbol_names(n)
    n_bars = history + 1 + 6 * (step_repeats + 2) + 8
    prices = random_walks(n, n_bars, seed)
    times = bar_times(n_bars)
    by_bar = np.ascontiguousarray(prices.T)  # by_bar[k] = every symbol's close of bar k
    workload = f"{n:,} sym × {history:,} bars, +1 bar"
    rows = []

    # baseline: recompute every symbol's whole history (history + the new bar)
    full = [np.ascontiguousarray(prices[i, : history + 1]) for i in range(n)]

    def recompute_each(_):
        for closes in full:
            compute(closes)

    rows.append(
        Row(
            workload,
            "full recompute: `compute` per symbol",
            bench(recompute_each, repeats),
            n,
            "signals/s",
            baseline=True,
        )
    )
    hist_full = history_dict(names, times, prices, history + 1)

    def recompute_batched(_):
        Engine(backend="cpu", capacity=n).warmup(hist_full)

    rows.append(
        Row(
            workload,
            "full recompute batched: fresh `Engine` + `warmup`",
            bench(recompute_batched, repeats),
            n,
            "signals/s",
        )
    )

    # incremental: an engine warmed on `history` bars, then one new bar per step
    eng = Engine(backend="cpu", capacity=n)
    eng.warmup(history_dict(names, times, prices, history))
    slots = np.concatenate([eng.slots_of(s) for s in names])
    cursor = [history]

    def next_bar():
        k = cursor[0]
        cursor[0] += 1
        return np.full(n, times[k]), by_bar[k]

    def next_items():
        k = cursor[0]
        cursor[0] += 1
        t = int(times[k])
        return [(s, t, c) for s, c in zip(names, by_bar[k].tolist(), strict=True)]

    t_arrays = bench(lambda arg: eng.step_arrays(slots, *arg), step_repeats, setup=next_bar)
    rows.append(Row(workload, "incremental: `Engine.step_arrays`", t_arrays, n, "signals/s"))
    t_items = bench(lambda items: eng.step(items), step_repeats, setup=next_items)
    rows.append(
        Row(
            workload,
            "incremental: `Engine.step([(sym, t, close), ...])`",
            t_items,
            n,
            "signals/s",
            note=f"{(t_items.median - t_arrays.median) / n * 1e6:+.2f} µs/item vs arrays",
        )
    )

    # kernel only: the backend's lane blocks with pre-planned rounds
    st = eng.store
    t_first, c_first = next_bar()
    reasons = np.zeros(n, np.int64)
    order, starts = batch.plan_rounds(
        st.counters, st.in_use, st.pending_last, st.pending_count, slots, t_first, c_first, reasons
    )
    eng.backend.step(slots, t_first, c_first, order, starts)  # applies that bar

    # the backend's step as the engine calls it (lane blocks, the thread count the
    # default policy picks for this batch), without the engine
    backend = eng.backend
    n_threads = cpu_threads(n)

    def kernel(arg, n_threads=None):
        default = backend.threads
        backend.threads = n_threads
        try:
            backend.step(slots, arg[0], arg[1], order, starts)
        finally:
            backend.threads = default

    t_kernel = bench(kernel, step_repeats, setup=next_bar)
    rows.append(
        Row(
            workload,
            f"incremental, kernel only: `CpuBackend.step` on {n_threads} thread(s), pre-planned",
            t_kernel,
            n,
            "signals/s",
        )
    )
    breakdown = None
    if with_breakdown:
        breakdown = step_breakdown(
            eng, slots, next_bar, step_repeats, t_arrays, t_items, t_kernel, kernel
        )
    return rows, breakdown


def cpu_threads(n: int) -> int:
    """Threads the default policy (kernels/threads.py) gives a step of ``n`` streams in
    full lane blocks."""
    from atc_stream.kernels import cpu
    from atc_stream.kernels.threads import choose_threads

    return choose_threads(n, cpu.n_tasks(-(-n // cpu.LANES)))


def step_breakdown(eng, slots, next_bar, repeats, t_arrays, t_items, t_kernel, kernel):
    """Time each piece of ``Engine.step_arrays`` separately (same calls as the engine)."""
    from atc_stream.core import output_row
    from atc_stream.core.results import StepResult
    from atc_stream.engine.parsing import as_update_arrays
    from atc_stream.kernels import batch

    n = slots.shape[0]
    st = eng.store
    tk, ck = next_bar()
    ck = np.ascontiguousarray(ck)
    reasons = np.zeros(n, np.int64)
    order, starts = batch.plan_rounds(
        st.counters, st.in_use, st.pending_last, st.pending_count, slots, tk, ck, reasons
    )
    out = np.full((n, output_row.N_OUT), np.nan)
    keys = eng._keys_by_slot

    def gather(_):
        keep = np.sort(order)
        return slots[keep], tk[keep], ck[keep], out[keep]

    items_list = [(k.symbol, int(tk[0]), float(c)) for k, c in zip(eng.streams, ck, strict=True)]
    parts = [
        ("`as_update_arrays` (dtype/shape checks)", lambda _: as_update_arrays(slots, tk, ck)),
        ("`np.zeros` reasons", lambda _: np.zeros(n, np.int64)),
        (
            "`batch.plan_rounds` (validate + rounds)",
            lambda _: batch.plan_rounds(
                st.counters, st.in_use, st.pending_last, st.pending_count, slots, tk, ck, reasons
            ),
        ),
        ("`np.sort(order)` + 4 gathers", gather),
        ("`StepResult(...)`", lambda _: StepResult(keys, slots, tk, ck, out, [])),
    ]
    rows = [("`Engine.step_arrays` total (measured)", t_arrays, "")]
    overhead = 0.0
    for name, fn in parts:
        t = bench(fn, repeats)
        overhead += t.median
        rows.append((name, t, ""))
    rows.append(
        ("kernel `CpuBackend.step` (default threads, pre-planned)", t_kernel, "the ATC math")
    )
    cursor_kernel = bench(kernel, repeats, setup=next_bar)  # re-measure next to 1-thread run
    threads = cpu_threads(n)
    t_one = bench(lambda arg: kernel(arg, n_threads=1), repeats, setup=next_bar)  # serial
    rows.append(
        (
            "kernel, 1 numba thread",
            t_one,
            f"{t_one.median / n * 1e6:.2f} µs per stream-bar per core; parallel speed-up "
            f"{t_one.median / cursor_kernel.median:.2f}x on {threads} threads",
        )
    )
    rows.append(
        (
            "sum of parts (host overhead + kernel)",
            Timing([overhead + t_kernel.median]),
            f"host overhead {fmt_time(overhead)} = "
            f"{100 * overhead / t_arrays.median:.1f} % of step_arrays",
        )
    )
    t_parse = bench(lambda _: eng._parse_bars(items_list, []), repeats)
    rows.append(
        (
            "`Engine._parse_bars` (Python API only)",
            t_parse,
            f"{t_parse.median / n * 1e6:.2f} µs per item; `Engine.step` total "
            f"{fmt_time(t_items.median)}",
        )
    )
    return rows


# -- (b) warmup -------------------------------------------------------------------------


def bench_warmup(sizes: Sizes, repeats: int, seed: int, results: dict) -> None:
    from atc_stream import Engine

    load = load_note()
    rows: list[Row] = []
    for n, bars in sizes.warmup:
        names = symbol_names(n)
        prices = random_walks(n, bars, seed + 7 * n + bars)
        times = bar_times(bars)
        hist = history_dict(names, times, prices, bars)
        work = n * bars
        big = work >= 5_000_000
        reps = min(repeats, 3) if big else repeats
        workload = f"{n:,} × {bars:,}"

        def fresh(n=n):
            return Engine(backend="cpu", capacity=n)

        def registered(n=n, names=names):
            eng = Engine(backend="cpu", capacity=n)
            for name in names:
                eng.add_symbol(name)
            return eng

        rows.append(
            Row(
                workload,
                "`Engine.warmup`, new symbols (includes registering them)",
                bench(lambda eng, hist=hist: eng.warmup(hist), reps, setup=fresh, warm=not big),
                work,
                "symbol-bars/s",
                baseline=True,
            )
        )
        rows.append(
            Row(
                workload,
                "`Engine.warmup`, symbols already registered",
                bench(
                    lambda eng, hist=hist: eng.warmup(hist), reps, setup=registered, warm=not big
                ),
                work,
                "symbol-bars/s",
            )
        )
        times2d = np.ascontiguousarray(np.broadcast_to(times, (n, bars)))
        counts = np.full(n, bars, np.int64)

        def kernel_setup(registered=registered, names=names):
            eng = registered()
            slots = np.concatenate([eng.slots_of(s) for s in names])
            return eng, slots

        def kernel(arg, times2d=times2d, prices=prices, counts=counts):
            eng, slots = arg
            eng.backend.warmup(slots, times2d, prices, counts, False)

        rows.append(
            Row(
                workload,
                "kernel only: `CpuBackend.warmup`, one call, pre-padded",
                bench(kernel, reps, setup=kernel_setup, warm=not big),
                work,
                "symbol-bars/s",
            )
        )
        del hist, prices, times2d
        gc.collect()
    fill_ratios(rows, by_rate=True)
    print_table("(b) Warmup throughput (symbols × bars)", rows, "× vs `Engine.warmup`", load)
    results["warmup"] = [row_json(r) for r in rows]
    results["_rows_warmup"] = rows


# -- (c) reference -----------------------------------------------------------------------


def bench_reference(sizes: Sizes, repeats: int, seed: int, results: dict) -> None:
    from atc_stream import compute
    from atc_stream.core.reference import compute_reference

    load = load_note()
    n, bars = sizes.reference
    prices = random_walks(n, bars, seed + 99)
    series = [np.ascontiguousarray(prices[i]) for i in range(n)]
    reps = max(min(repeats, 3), 1)

    def reference(_):
        for closes in series:
            compute_reference(closes)

    def fast(_):
        for closes in series:
            compute(closes)

    workload = f"{n} sym × {bars:,} bars"
    rows = [
        Row(
            workload,
            "`reference.compute_reference` per symbol",
            bench(reference, reps),
            n * bars,
            "symbol-bars/s",
            baseline=True,
        ),
        Row(workload, "`compute` per symbol", bench(fast, repeats), n * bars, "symbol-bars/s"),
    ]
    # agreement check (not a test; the test suite owns parity)
    ref = compute_reference(series[0])
    got = compute(series[0])
    same = np.array_equal(ref["Average_Signal"], got["signal"], equal_nan=True)
    warm_rows = [r for r in results.get("_rows_warmup", []) if "already registered" in r.path]
    for r in warm_rows:
        rows.append(Row(r.workload, "`Engine.warmup` (from table b)", r.timing, r.work, r.unit))
    fill_ratios(rows, by_rate=True)
    print_table("(c) The reference implementation, for comparison", rows, "× vs reference", load)
    print(f"\n`compute` and `compute_reference` signal bit-identical on {workload}: {same}")
    results["reference"] = [row_json(r) for r in rows]
    results["reference_agrees"] = bool(same)


# -- (d) memory --------------------------------------------------------------------------


def vm_status() -> dict[str, int]:
    """VmRSS / VmHWM of this process in bytes (Linux)."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value, _unit = line.split()
                    out[key[:-1]] = int(value) * 1024
    except OSError:
        pass
    return out


def memory_child(n_streams: int, n_bars: int, seed: int) -> None:
    """Runs in a subprocess: warm up ``n_streams`` streams on ``n_bars`` bars, step once."""
    from atc_stream import Engine

    phases: dict[str, Any] = {"start": vm_status()}
    compile_all()
    phases["after_import_and_compile"] = vm_status()
    prices = random_walks(n_streams, n_bars + 1, seed)
    times = bar_times(n_bars + 1)
    names = symbol_names(n_streams)
    hist = history_dict(names, times, prices, n_bars)
    phases["after_input_data"] = vm_status()
    eng = Engine(backend="cpu")
    t0 = time.perf_counter()
    eng.warmup(hist)
    t_warmup = time.perf_counter() - t0
    phases["after_warmup"] = vm_status()
    slots = np.concatenate([eng.slots_of(s) for s in names])
    t0 = time.perf_counter()
    res = eng.step_arrays(slots, np.full(n_streams, times[n_bars]), prices[:, n_bars])
    t_step = time.perf_counter() - t0
    phases["after_step"] = vm_status()
    st = eng.store
    state_bytes = sum(
        a.nbytes
        for a in (st.ring, st.values, st.counters, st.in_use, st.pending_last, st.pending_count)
    )
    report = {
        "streams": eng.store.n_streams,
        "capacity": eng.store.capacity,
        "bars": n_bars,
        "stepped": len(res),
        "bytes_per_stream": st.bytes_per_stream,
        "state_bytes": state_bytes,
        "input_bytes": prices.nbytes + times.nbytes,
        "warmup_s": t_warmup,
        "step_s": t_step,
        "phases": phases,
    }
    print("MEMORY_REPORT " + json.dumps(report))


def bench_memory(sizes: Sizes, seed: int, results: dict) -> None:
    from atc_stream import ATCParams, Engine

    eng = Engine(ATCParams(), backend="cpu")
    st = eng.store
    per_stream = st.bytes_per_stream
    parts = {
        "ring (doubled)": st.ring.strides[0],
        "values": st.values.strides[0] // st.values.shape[2],  # a block holds LANES streams
        "counters": st.counters.strides[0],
        "in_use + planning scratch": st.in_use.itemsize
        + st.pending_last.itemsize
        + st.pending_count.itemsize,
    }
    n_streams, n_bars = sizes.memory
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--memory-child",
        str(n_streams),
        str(n_bars),
        "--seed",
        str(seed),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
    report = None
    for line in proc.stdout.splitlines():
        if line.startswith("MEMORY_REPORT "):
            report = json.loads(line.split(" ", 1)[1])
    print("\n### (d) Memory\n")
    print(f"State bytes per stream (default `ATCParams`): **{per_stream:,} B** (", end="")
    print(", ".join(f"{k} {v:,} B" for k, v in parts.items()) + ")")
    results["memory"] = {"bytes_per_stream": per_stream, "parts": parts}
    if proc.returncode != 0 or report is None:
        print(f"\nmemory child failed (rc {proc.returncode}):\n{proc.stderr[-2000:]}")
        results["memory"]["child_error"] = proc.stderr[-2000:]
        return

    def mib(b):
        return f"{b / 2**20:,.0f} MiB"

    ph = report["phases"]
    print(
        f"\nSeparate process: `Engine()` (default capacity, grows by doubling), "
        f"`warmup` of {n_streams:,} streams × {n_bars} bars, then one `step_arrays` "
        f"of all {report['stepped']:,} streams (process wall time {wall:.1f} s):\n"
    )
    print("| measure | value |")
    print("|---|---:|")
    print(f"| peak RSS, `getrusage(RUSAGE_CHILDREN).ru_maxrss` | {mib(maxrss)} |")
    print(f"| peak RSS, child's VmHWM after the step | {mib(ph['after_step']['VmHWM'])} |")
    print(
        f"| RSS after import + numba compile (baseline) | "
        f"{mib(ph['after_import_and_compile']['VmRSS'])} |"
    )
    print(f"| input histories (closes + times) | {mib(report['input_bytes'])} |")
    print(
        f"| state arrays ({report['capacity']:,} slots × {report['bytes_per_stream']:,} B) "
        f"| {mib(report['state_bytes'])} |"
    )
    print(f"| RSS after warmup | {mib(ph['after_warmup']['VmRSS'])} |")
    print(
        f"| warmup time (includes registering {n_streams:,} symbols) | {report['warmup_s']:.2f} s |"
    )
    print(f"| one step of all {report['stepped']:,} streams | {fmt_time(report['step_s'])} |")
    results["memory"].update(report)
    results["memory"]["ru_maxrss_children"] = maxrss
    results["memory"]["child_wall_s"] = wall


# -- summary ----------------------------------------------------------------------------


def summary(sizes: Sizes, results: dict) -> None:
    """Each target judged on the medians and, for reference, on the fastest samples.

    On a shared machine the median includes time stolen by other processes; the
    minimum is the better estimate of what the code itself costs.
    """
    print("\n### Targets\n")
    print("| target | median | met | best sample | met (best) |")
    print("|---|---:|:---:|---:|:---:|")
    checks = []  # (name, median value, ok, best value, ok)
    n = max(sizes.step_symbols)
    rows = [r for r in results.get("_rows_per_bar", []) if r.workload.startswith(f"{n:,} sym")]
    by_path = {r.path: r for r in rows}
    full = [r for r in rows if r.path.startswith("full recompute")]
    step = by_path.get("incremental: `Engine.step_arrays`")
    if full and step:
        fastest = min(full, key=lambda r: r.timing.median)
        fastest_min = min(r.timing.min for r in full)
        ratio = fastest.timing.median / step.timing.median
        ratio_min = fastest_min / step.timing.min
        checks.append(
            (
                f"step of {n:,} symbols ≥ {TARGET_STEP_RATIO:.0f}x cheaper than the fastest "
                f"full recompute ({fastest.path.split(':')[0]})",
                f"{ratio:,.0f}x",
                ratio >= TARGET_STEP_RATIO,
                f"{ratio_min:,.0f}x",
                ratio_min >= TARGET_STEP_RATIO,
            )
        )
        checks.append(
            (
                f"step of {n:,} symbols ≤ {fmt_time(TARGET_STEP_SECONDS)}",
                fmt_time(step.timing.median),
                step.timing.median <= TARGET_STEP_SECONDS,
                fmt_time(step.timing.min),
                step.timing.min <= TARGET_STEP_SECONDS,
            )
        )
    warm = [r for r in results.get("_rows_warmup", []) if r.baseline]
    for r in warm:
        best = r.work / r.timing.min
        checks.append(
            (
                f"warmup {r.workload} ≥ {TARGET_WARMUP_RATE / 1e6:.1f} M symbol-bars/s",
                fmt_rate(r.rate, "symbol-bars/s"),
                r.rate >= TARGET_WARMUP_RATE,
                fmt_rate(best, "symbol-bars/s"),
                best >= TARGET_WARMUP_RATE,
            )
        )
    mem = results.get("memory", {})
    if "bytes_per_stream" in mem:
        b = mem["bytes_per_stream"]
        ok = b <= TARGET_BYTES_PER_STREAM
        checks.append(
            (f"state ≤ {TARGET_BYTES_PER_STREAM:,} B per stream", f"{b:,} B", ok, f"{b:,} B", ok)
        )

    def yes(ok):
        return "yes" if ok else "**no**"

    for name, value, ok, best, ok_best in checks:
        print(f"| {name} | {value} | {yes(ok)} | {best} | {yes(ok_best)} |")
    if sizes is QUICK:
        print("\n(--quick sizes: the targets are defined for the full sizes.)")
    results["targets"] = [
        {"target": c[0], "median": c[1], "met": bool(c[2]), "best": c[3], "met_best": bool(c[4])}
        for c in checks
    ]


# -- main -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke test, < 60 s)")
    parser.add_argument("--repeats", type=int, default=5, help="timed samples per figure")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--json", metavar="PATH", help="also write the raw samples as JSON")
    parser.add_argument(
        "--skip", default="", help="comma-separated sections to skip: a,b,c,d (e.g. --skip d)"
    )
    parser.add_argument(
        "--memory-child", nargs=2, type=int, metavar=("STREAMS", "BARS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.memory_child:
        memory_child(*args.memory_child, seed=args.seed)
        return 0
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    sizes = QUICK if args.quick else FULL
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    started = time.perf_counter()
    results: dict[str, Any] = {"argv": sys.argv, "quick": args.quick, "repeats": args.repeats}

    compile_s = compile_all()
    info = machine_info()
    results["machine"] = info
    results["compile_s"] = compile_s
    print("## atc-stream CPU benchmark\n")
    print(f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}")
    exe = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd()) else "python"
    print(f"- command: `{' '.join([exe, *sys.argv])}`")
    print(
        f"- machine: {info['cpu']}, {info['logical_cpus']} logical CPUs "
        f"({info['usable_cpus']} usable), {info['memory_gib']} GiB; "
        f"numba {info['numba']} with {info['numba_threads']} threads "
        f"({info['numba_threading_layer']} layer); numpy {info['numpy']}, "
        f"Python {info['python']}; kernels compiled for {info['kernels_compiled_for']}; "
        f"load average at start "
        f"{' / '.join(f'{x:.2f}' for x in info['load_average'])} (1 / 5 / 15 min)"
    )
    print(
        f"- numba compilation ({compile_s:.1f} s in this process) is excluded: every "
        "compiled function ran once before timing, and each path once more untimed "
        "before its timed repeats (except warmups of ≥ 5 M symbol-bars)."
    )
    print(
        f"- each figure: median of {args.repeats} samples (steps: "
        f"{max(args.repeats * sizes.step_repeat_factor, 20)} samples; warmups of ≥ 5 M "
        f"symbol-bars: {min(args.repeats, 3)}; reference: {max(min(args.repeats, 3), 1)}); "
        f"inputs: random walks, seed {args.seed}, 0.01 price grid; default `ATCParams`."
    )
    sys.stdout.flush()

    if "a" not in skip:
        bench_per_bar(sizes, args.repeats, args.seed, results)
    if "b" not in skip:
        bench_warmup(sizes, args.repeats, args.seed, results)
    if "c" not in skip:
        bench_reference(sizes, args.repeats, args.seed, results)
    if "d" not in skip:
        bench_memory(sizes, args.seed, results)
    summary(sizes, results)
    print(f"\n(total benchmark wall time {time.perf_counter() - started:.0f} s)")
    if args.json:
        clean = {k: v for k, v in results.items() if not k.startswith("_")}
        with open(args.json, "w") as f:
            json.dump(clean, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
