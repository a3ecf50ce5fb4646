#!/usr/bin/env python
"""CUDA backend benchmarks, side by side with the CPU backend.

Run from the repository root on a machine with an NVIDIA GPU::

    .venv/bin/python benchmarks/bench_cuda.py                 # full sizes
    .venv/bin/python benchmarks/bench_cuda.py --repeats 9 --json cuda.json
    .venv/bin/python benchmarks/bench_cuda.py --quick         # small sizes (smoke test)

Without a real CUDA device (or under ``NUMBA_ENABLE_CUDASIM=1``) it says so and runs
the CPU column only; use ``--quick`` there to keep it short.

Workloads (one parameter set, the ATC defaults; deterministic random walks on a 0.01
price grid, one bar per minute):

step latency, 1,000 / 10,000 / 100,000 streams, one new bar for every stream:
    ``end to end``  ``Engine.step_arrays(slots, times, closes)``: host arrays in,
                    validated, planned, uploaded, computed, downloaded, ``StepResult``
                    out (what a live loop pays per bar);
    ``kernel only`` CPU: ``CpuBackend.step`` (the lane drivers) on pre-planned arrays;
                    CUDA: CUDA events around the step's device work (``time_kernels``:
                    the uploads, the step kernel, the output packing and download, and
                    the gaps where the device waits for the host to launch them).
warmup throughput, 100 x 1,500 / 10,000 x 2,000 / 100,000 x 2,000 (streams x bars):
    ``backend.warmup`` on fresh state, last-bar outputs only (what ``Engine.warmup``
    calls per chunk), for the CPU and both CUDA warmup kernels (global / local state),
    plus ``Engine.warmup`` itself (chunks of the backend's ``warmup_chunk`` streams) at the
    middle size.

host-side cost per step, 10,000 / 100,000 streams (``--host-costs``; no GPU needed):
    the host work of ``CudaBackend.step`` around the kernels, before (the code of
    commit 4723466, reproduced below: gather into plan order, F-order outputs
    transposed to C order and scattered back) and after (cached slot-sorted plan, two
    input memcpys, host-order C outputs: one memcpy) and now (the requested outputs
    only, typed: signal + events by default, or all), the host counter update in
    arrival vs plan order, the engine's ``plan_rounds`` (unchanged), the whole
    ``Engine.step_arrays`` host path with the device work left out, and the warmup's
    host transpose vs memcpy.
step variants (with a GPU): the default outputs (signal + events), all outputs,
    double-buffered (``step_arrays_async``, two in flight), the CUDA graph
    (``cuda_graph=True``) and both; all in the ``--json`` record's ``step_us``.
CPU-vs-GPU mismatches (with a GPU): 10,000 streams, 20 steps after a warmup, every
    output compared (discrete columns exactly, continuous ones to 1e-9).
``--gpu-tests``: runs ``pytest -m gpu tests/test_cuda_gpu.py`` and records the outcome.

Each figure is the median of ``--repeats`` wall-clock samples after one untimed call
(which also compiles); the largest CPU warmup takes one sample (minutes per run).
The ratio column is the row's speed relative to the workload's CPU end-to-end row
(>1: faster than the CPU).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
import types
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
from numba import njit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from atc_stream.core import (
    output_row,
    schema,  # noqa: E402
)
from atc_stream.core.output_row import N_OUT  # noqa: E402
from atc_stream.core.params import ATCParams  # noqa: E402
from atc_stream.engine.engine import Engine  # noqa: E402
from atc_stream.kernels import batch, cpu, cuda_available  # noqa: E402
from atc_stream.state import layout as L  # noqa: E402
from atc_stream.state.arrays import StateStore  # noqa: E402

BASE_TIME = 1_700_000_000_000
BAR_MS = 60_000

FULL_STEP = (1_000, 10_000, 100_000)
FULL_WARMUP = ((100, 1_500), (10_000, 2_000), (100_000, 2_000))
QUICK_STEP = (100, 1_000)
QUICK_WARMUP = ((20, 300), (500, 300))
STEP_HISTORY = 200  # bars of warmup before the step benchmark (state is then realistic)


def random_walks(n: int, t: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    start = rng.uniform(20.0, 200.0, n)
    steps = rng.normal(0.0, 0.002, (n, t))
    return np.maximum(np.round(start[:, None] * np.exp(np.cumsum(steps, axis=1)), 2), 0.01)


def bar_times(t: int) -> np.ndarray:
    return BASE_TIME + BAR_MS * np.arange(t, dtype=np.int64)


@dataclass
class Row:
    workload: str
    path: str
    median_s: float | None
    work: float  # stream-updates or stream-bars per call
    unit: str
    samples: int = 0
    note: str = ""
    ratio: float | None = None

    @property
    def rate(self) -> float | None:
        return None if not self.median_s else self.work / self.median_s


def timed(fn: Callable[[], object], repeats: int, warm: bool = True) -> list[float]:
    if warm:
        fn()
    samples = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return samples


def fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1.0:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def fmt_rate(rate: float | None, unit: str) -> str:
    if rate is None:
        return "-"
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if rate >= scale:
            return f"{rate / scale:.3g} {prefix}{unit}/s"
    return f"{rate:.3g} {unit}/s"


def print_table(title: str, rows: list[Row]) -> None:
    print(f"\n### {title}\n")
    print("| workload | path | median | throughput | vs CPU end to end | note |")
    print("|---|---|---:|---:|---:|---|")
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        print(
            f"| {r.workload} | {r.path} | {fmt_time(r.median_s)} | {fmt_rate(r.rate, r.unit)} "
            f"| {ratio} | {r.note} |"
        )


def set_ratios(rows: list[Row]) -> None:
    base = {r.workload: r.median_s for r in rows if r.path == "cpu end to end"}
    for r in rows:
        b = base.get(r.workload)
        r.ratio = None if not (b and r.median_s) else b / r.median_s


# -- step latency -------------------------------------------------------------------------


#: step variants beside the plain one (default outputs, one synchronous step at a time)
STEP_VARIANTS = {
    "": {},
    "all outputs": {"outputs": "all"},
    "double-buffered": {"pipelined": True},
    "cuda graph": {"cuda_graph": True},
    "cuda graph, double-buffered": {"cuda_graph": True, "pipelined": True},
}


def step_rows(
    n: int, backend: str, repeats: int, threads: int | None = None, variant: str = ""
) -> list[Row]:
    """End-to-end and kernel-only step latency for ``n`` streams on ``backend``.

    ``variant`` (``STEP_VARIANTS``): "all outputs" returns every column instead of the
    default signal + events; "double-buffered" submits each step with
    ``step_arrays_async`` and reads the previous step's result after it (two in
    flight; the time per call is one step's share); "cuda graph" builds the engine with
    ``cuda_graph=True``. Kernel-only time is taken for the plain variant only.
    """
    options = STEP_VARIANTS[variant]
    pipelined = options.get("pipelined", False)
    work = f"step, {n:,} streams"
    total = STEP_HISTORY + 2 * repeats + 8
    closes = random_walks(n, total, seed=n)
    times = bar_times(total)
    eng = Engine(
        ATCParams(), backend=backend, capacity=n, outputs=options.get("outputs"),
        cuda_graph=options.get("cuda_graph", False),
    )  # fmt: skip
    if threads is not None and backend == "cuda":
        eng.backend.threads_per_block = threads
    for i in range(n):
        eng.add_stream(f"S{i}")
    slots = np.array([eng.slot_of(k) for k in eng.streams], np.int64)
    sym = np.array([int(k.symbol[1:]) for k in eng.streams])
    eng.backend.warmup(
        slots,
        np.broadcast_to(times[:STEP_HISTORY], (n, STEP_HISTORY)),
        np.ascontiguousarray(closes[sym, :STEP_HISTORY]),
        np.full(n, STEP_HISTORY, np.int64),
        False,
    )
    position = [STEP_HISTORY]
    in_flight: list = []

    def one_step():
        j = position[0]
        position[0] += 1
        if not pipelined:
            eng.step_arrays(slots, np.full(n, times[j]), closes[sym, j])
            return
        in_flight.append(eng.step_arrays_async(slots, np.full(n, times[j]), closes[sym, j]))
        if len(in_flight) == 2:
            in_flight.pop(0).result()

    rows = []
    kernel_s: list[float] = []
    if variant:
        label = f"{backend} {variant}"
        e2e = timed(one_step, repeats)
        note = "per call, 2 steps in flight" if pipelined else ""
        graphs = getattr(eng.backend, "graphs", None)
        if options.get("cuda_graph"):
            note = (
                "graphs off (see the log)" if graphs is None or graphs.failed
                else f"{graphs.launches} graph launches"
            )  # fmt: skip
        return [Row(work, f"{label} end to end", float(np.median(e2e)), n, "upd", repeats, note)]
    if backend == "cuda":
        eng.backend.time_kernels = True
        one_step()  # compile

        def one_step_timed():
            one_step()
            kernel_s.append(eng.backend.last_kernel_seconds)

        e2e = timed(one_step_timed, repeats, warm=False)
        label = "cuda" if threads is None else f"cuda {threads} thr/block"
        rows.append(Row(work, f"{label} end to end", float(np.median(e2e)), n, "upd", repeats))
        rows.append(
            Row(work, f"{label} kernel only", float(np.median(kernel_s)), n, "upd", repeats,
                "CUDA events around the step's device work, launch gaps included")
        )  # fmt: skip
        return rows
    e2e = timed(one_step, repeats)
    rows.append(Row(work, "cpu end to end", float(np.median(e2e)), n, "upd", repeats))

    # kernel only: the backend's step (the lane drivers the engine calls) on a pre-planned
    # batch; the state advances one bar per call
    store = eng.store

    def one_kernel():
        j = position[0]
        position[0] += 1
        t = np.full(n, times[j])
        c = closes[sym, j]
        reasons = np.zeros(n, np.int64)
        order, starts = batch.plan_rounds(
            store.counters, store.in_use, store.pending_last, store.pending_count,
            slots, t, c, reasons,
        )  # fmt: skip
        t0 = time.perf_counter()
        eng.backend.step(slots, t, c, order, starts)
        kernel_s.append(time.perf_counter() - t0)

    one_kernel()
    kernel_s.clear()
    for _ in range(repeats):
        one_kernel()
    rows.append(
        Row(work, "cpu kernel only", float(np.median(kernel_s)), n, "upd", repeats,
            "CpuBackend.step, pre-planned")
    )  # fmt: skip
    return rows


# -- warmup throughput ---------------------------------------------------------------------


def warmup_rows(n: int, t: int, backends: list[str], repeats: int, largest: bool) -> list[Row]:
    work = f"warmup, {n:,} x {t:,}"
    closes = random_walks(n, t, seed=t + n)
    times = np.broadcast_to(bar_times(t), (n, t))
    counts = np.full(n, t, np.int64)
    rows = []
    for path in backends:
        state = {}

        def fresh(path=path, state=state):
            store = StateStore(n)
            store.add_params(ATCParams())
            slots = np.array([store.allocate(0) for _ in range(n)], np.int64)
            if path == "cpu":
                backend = cpu.CpuBackend(store)
            else:
                from atc_stream.kernels.cuda_backend import CudaBackend

                # keep one backend (its compiled kernels, pinned buffers) across repeats
                backend = state.get("backend")
                if backend is None:
                    backend = state["backend"] = CudaBackend(store)
                    backend.time_kernels = True
                backend.store = store
                backend.warmup_state = "local" if path == "cuda (local state)" else "global"
                backend.push_state()
            state["args"] = (backend, slots)

        def run(state=state):
            backend, slots = state["args"]
            backend.warmup(slots, times, closes, counts, False)

        samples: list[float] = []
        kernel: list[float] = []
        n_repeats = 1 if (largest and path == "cpu") else repeats
        if not (largest and path == "cpu"):  # that one compiled at the smaller sizes
            fresh()
            run()  # compile / first touch
        for _ in range(n_repeats):
            fresh()
            gc.collect()
            t0 = time.perf_counter()
            run()
            samples.append(time.perf_counter() - t0)
            b = state["args"][0]
            if getattr(b, "last_kernel_seconds", None) is not None:
                kernel.append(b.last_kernel_seconds)
        note = "1 sample" if n_repeats == 1 else ""
        if kernel:
            note = f"kernel {fmt_time(float(np.median(kernel)))}; includes upload/download"
        label = "cpu end to end" if path == "cpu" else f"{path} end to end"
        rows.append(Row(work, label, float(np.median(samples)), n * t, "bar", n_repeats, note))
    return rows


def engine_warmup_row(n: int, t: int, backend: str, repeats: int) -> Row:
    closes = random_walks(n, t, seed=3)
    times = bar_times(t)
    history = {f"S{i}": (times, closes[i]) for i in range(n)}
    samples = []
    for k in range(repeats + 1):
        eng = Engine(ATCParams(), backend=backend, capacity=n)
        t0 = time.perf_counter()
        eng.warmup(history)
        if k:
            samples.append(time.perf_counter() - t0)
    return Row(
        f"warmup, {n:,} x {t:,}", f"{backend} Engine.warmup", float(np.median(samples)), n * t,
        "bar", repeats, f"chunks of {eng.backend.warmup_chunk} streams",
    )  # fmt: skip


# -- host-side costs per step (no GPU needed) ---------------------------------------------


@njit(cache=True)
def _before_pack_step(slots, times, closes, order, ints, floats):
    """The host gather of ``CudaBackend.step`` before this change (commit 4723466)."""
    m = order.shape[0]
    identity = m == slots.shape[0]
    for k in range(m):
        u = order[k]
        identity = identity and u == k
        ints[k] = slots[u]
        ints[m + k] = times[u]
        floats[k] = closes[u]
    return identity


def host_cost_rows(n: int, repeats: int) -> list[Row]:
    """Host work of one step around the kernels, before and after, for ``n`` streams.

    The steady case: every stream once, in a shuffled (arrival) order that repeats.
    Buffers are ordinary host memory here (pinned on a GPU machine: same memcpy cost);
    the kernels and transfers are left out. "after" is the host path before the
    requested outputs (17 float64 columns copied out); "now" copies only the typed
    requested fields; ``commit_step`` is timed on its own (arrival order before,
    plan order now); the last row is the engine's whole host path per step.
    """
    from atc_stream.kernels import cuda_host
    from atc_stream.kernels.cuda_io import IoSet
    from atc_stream.kernels.cuda_kernels import pack_layout

    work = f"host per step, {n:,} streams"
    rng = np.random.default_rng(n)
    slots = rng.permutation(n).astype(np.int64)
    times = np.full(n, BASE_TIME, np.int64)
    closes = rng.uniform(10, 100, n)
    order = np.arange(n, dtype=np.int64)
    starts = np.array([0, n], np.int64)
    device_out_f = np.asfortranarray(rng.normal(size=(n, N_OUT)))  # stands in for the download
    device_out_c = np.ascontiguousarray(device_out_f)
    ints, floats = np.empty(2 * n, np.int64), np.empty(n)
    plan, where = np.empty(2 * n, np.int64), np.full(n, -1, np.int64)
    t_in, c_in = np.empty(n, np.int64), np.empty(n)
    cached = slots.copy()

    def before():
        identity = _before_pack_step(slots, times, closes, order, ints, floats)
        compact = device_out_f
        if identity:
            return np.array(compact, order="C")
        result = np.full((n, N_OUT), np.nan)
        result[order] = compact
        return result

    def after_cached():
        assert np.array_equal(cached, slots)  # the plan on the device is reused
        t_in[:] = times
        c_in[:] = closes
        return device_out_c.copy()

    def after_new_plan():
        cuda_host.build_plan(slots, order, starts, plan, where)
        t_in[:] = times
        c_in[:] = closes
        return device_out_c.copy()

    def planning():
        store_counters = np.zeros((n, L.N_COUNTER_FIELDS), np.int64)
        in_use = np.ones(n, np.bool_)
        pending = np.zeros(n, np.int64), np.zeros(n, np.int64)
        reasons = np.zeros(n, np.int64)

        def run():
            batch.plan_rounds(store_counters, in_use, *pending, slots, times, closes, reasons)

        return run

    def checks_only():
        store_counters = np.zeros((n, L.N_COUNTER_FIELDS), np.int64)
        in_use = np.ones(n, np.bool_)
        reasons = np.zeros(n, np.int64)

        def run():
            batch.check_unique_step(store_counters, in_use, slots, times, closes, reasons)

        return run

    def typed_outputs(groups):
        """Now: inputs staged, then the requested fields copied out of packed buffers."""
        k = schema.float_columns(groups).shape[0]
        layout = pack_layout(groups)[1]
        io = types.SimpleNamespace(
            packed=types.SimpleNamespace(host=rng.normal(size=n * max(k, 1))),
            flags=types.SimpleNamespace(host=np.zeros(2 * n, np.uint8)),
        )
        bar_index = np.zeros(n, np.int64)

        def run():
            assert np.array_equal(cached, slots)  # the plan on the device is reused
            t_in[:] = times
            c_in[:] = closes
            return IoSet.fields(io, n, groups, layout, bar_index)

        return run

    def commit(in_plan_order: bool):
        """The host counter update: before in arrival order, now in the plan's slot order."""
        counters = np.zeros((n, L.N_COUNTER_FIELDS), np.int64)
        shadow, bar_index = np.zeros((n, 3), np.int64), np.zeros(n, np.int64)
        step_times = np.zeros(n, np.int64)
        walk = np.empty(2 * n, np.int64)
        if in_plan_order:
            cuda_host.build_plan(slots, order, starts, walk, np.full(n, -1, np.int64))
        else:
            walk[:n], walk[n:] = slots[order], order  # arrival order, as before

        def run():
            step_times[:] += 1
            cuda_host.commit_step(counters, shadow, walk, n, step_times, 0, bar_index)

        return run

    rows = []
    for label, fn, note in (
        ("before: gather + F->C outputs", before, "commit 4723466"),
        ("after: cached plan, host-order outputs", after_cached, "steady case, 17 columns"),
        ("after: new plan (slot sort)", after_new_plan, "first step / slot set changed"),
        ("now: signal + events, typed", typed_outputs(schema.DEFAULT_OUTPUTS),
         "steady case, default outputs"),
        ("now: all outputs, typed", typed_outputs(schema.ALL_OUTPUTS), "steady case"),
        ("before: commit_step in arrival order", commit(False), "host counters"),
        ("now: commit_step in plan order", commit(True), "host counters + bar_index"),
        ("before: plan_rounds (engine)", planning(), "validation + rounds"),
        ("now: check_unique_step (engine, steady)", checks_only(), "slots as last step"),
        ("Engine.step_arrays host path, no device", engine_host_path(n), "default outputs"),
    ):  # fmt: skip
        samples = timed(fn, repeats)
        rows.append(Row(work, label, float(np.median(samples)), n, "upd", repeats, note))
    return rows


def engine_host_path(n: int) -> Callable[[], object]:
    """``Engine.step_arrays`` with the device replaced by its host share: validation (the
    steady shortcut), the cached-plan check, ``find_changed``, staging,
    ``commit_step``, the typed fields copied out of packed buffers, the ``StepResult``
    (no kernels, no transfers)."""
    from atc_stream.kernels import cuda_host
    from atc_stream.kernels.cuda_io import IoSet, PendingOutputs
    from atc_stream.kernels.cuda_kernels import pack_layout

    eng = Engine(ATCParams(), backend="cpu", capacity=n)
    for i in range(n):
        eng.add_stream(f"S{i}")
    rng = np.random.default_rng(n)
    slots = rng.permutation([eng.slot_of(k) for k in eng.streams]).astype(np.int64)
    closes = rng.uniform(10, 100, n)
    groups = eng.outputs
    k = schema.float_columns(groups).shape[0]
    layout = pack_layout(groups)[1]
    io = types.SimpleNamespace(
        packed=types.SimpleNamespace(host=rng.normal(size=n * max(k, 1))),
        flags=types.SimpleNamespace(host=np.zeros(2 * n, np.uint8)),
    )
    store, cached = eng.store, slots.copy()
    plan = np.empty(2 * n, np.int64)  # the cached plan's host copy, built once
    cuda_host.build_plan(slots, np.arange(n), np.array([0, n]), plan, np.full(n, -1, np.int64))
    shadow = np.ascontiguousarray(store.counters[:, [L.BAR_INDEX, L.LAST_TIME, L.PARAM_ROW]])
    changed = np.zeros(n, np.int64)
    t_in, c_in = np.empty(n, np.int64), np.empty(n)

    class HostShare:
        def step_outputs_async(self, slots, times, closes, order, round_starts, groups):
            assert np.array_equal(cached, slots)
            t_in[:] = times
            c_in[:] = closes
            cuda_host.find_changed(store.counters, shadow, plan, n, changed)  # DeviceState.sync
            bar_index = np.full(n, -1, np.int64)
            cuda_host.commit_step(store.counters, shadow, plan, n, times, 0, bar_index)
            fields = IoSet.fields(io, n, groups, layout, bar_index)
            return PendingOutputs.ready(fields)

    eng.backend = HostShare()
    step = [0]

    def run():
        step[0] += 1
        return eng.step_arrays(slots, np.full(n, BASE_TIME + step[0] * BAR_MS), closes)

    return run


def warmup_host_rows(n: int, t: int, repeats: int) -> list[Row]:
    """The warmup's host-side copy of the histories into the staging buffer."""
    work = f"warmup host copy, {n:,} x {t:,}"
    closes = random_walks(n, t, seed=1)
    staging = np.empty(n * t)

    def before():  # host transpose into the time-major layout
        np.copyto(staging.reshape(t, n), closes.T)

    def after():  # as they are; the device transposes
        np.copyto(staging.reshape(n, t), closes)

    return [
        Row(work, "before: host transpose", float(np.median(timed(before, repeats))), n * t,
            "bar", repeats),
        Row(work, "after: memcpy (device transposes)", float(np.median(timed(after, repeats))),
            n * t, "bar", repeats),
    ]  # fmt: skip


# -- CPU vs GPU, and the GPU tests -------------------------------------------------------------

DISCRETE = [
    output_row.OUT_BAR_INDEX,
    output_row.OUT_LONG,
    output_row.OUT_SHORT,
    output_row.OUT_SIGNAL,
] + list(range(output_row.OUT_LAYER1, output_row.OUT_LAYER1 + 6))


def mismatches(n: int, steps: int = 20) -> dict:
    """CPU vs CUDA on the same ``n`` streams: outputs that differ (discrete / continuous)."""
    total = STEP_HISTORY + steps
    closes = random_walks(n, total, seed=11)
    times = bar_times(total)
    history = {f"S{i}": (times[:STEP_HISTORY], closes[i, :STEP_HISTORY]) for i in range(n)}
    engines = [Engine(ATCParams(), backend=b, capacity=n, outputs="all") for b in ("cpu", "cuda")]
    for eng in engines:
        eng.warmup(history)
    slots = [np.array([e.slot_of(e.streams[i]) for i in range(n)]) for e in engines]
    discrete = continuous = 0
    continuous_cols = [c for c in range(N_OUT) if c not in DISCRETE]
    for j in range(STEP_HISTORY, total):
        outs = [
            e.step_arrays(s, np.full(n, times[j]), closes[:, j]).outputs
            for e, s in zip(engines, slots, strict=True)
        ]
        a, b = outs
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        discrete += int((~same[:, DISCRETE]).sum())
        close = np.isclose(a, b, rtol=0, atol=1e-9) | (np.isnan(a) & np.isnan(b))
        continuous += int((~close[:, continuous_cols]).sum())
    return {"streams": n, "steps": steps, "discrete": discrete, "continuous_over_1e-9": continuous}


# -- backtest sweep ------------------------------------------------------------------------


def backtest_sweep_rows(
    symbols: int, strategies: int, bars: int, backends: list[str]
) -> tuple[list[Row], int | None]:
    """``backtest()`` of ``symbols`` random-walk OHLC series x ``strategies`` strategies
    (default ATC parameters) on each backend, end to end (one sample: the first call
    compiles, so it runs once untimed at a tenth of the size); the trades, metrics and
    equity of the backends compared (entries that differ; None with one backend)."""
    from atc_stream import Strategy, backtest

    rng = np.random.default_rng(5)
    close = random_walks(symbols, bars, seed=17)
    spread = np.round(close * rng.uniform(0.0, 0.004, close.shape), 2)
    opens = np.clip(np.round(close * (1 + rng.normal(0, 0.001, close.shape)), 2), 0.01, None)
    table = {
        "symbol": np.repeat(np.array([f"S{i:05d}" for i in range(symbols)]), bars),
        "time": np.tile(bar_times(bars), symbols),
        "open": opens.ravel(),
        "high": np.maximum(close, opens).ravel() + spread.ravel(),
        "low": np.maximum(np.minimum(close, opens).ravel() - spread.ravel(), 0.005),
        "close": close.ravel(),
    }
    strategy_list = [
        Strategy(stop=0.01 * (1 + k % 3), fee_bps=5 + k, slippage_bps=k % 4,
                 max_hold=0 if k % 2 else 240)
        for k in range(strategies)
    ]  # fmt: skip
    small = {k: v.reshape(symbols, bars)[: max(1, symbols // 10)].ravel() for k, v in table.items()}
    work = f"backtest sweep, {symbols * strategies:,} streams x {bars:,}"
    rows, results = [], []
    for backend in backends:
        backtest(small, None, strategy_list, backend=backend)
        t0 = time.perf_counter()
        results.append(backtest(table, None, strategy_list, backend=backend))
        elapsed = time.perf_counter() - t0
        trades = len(next(iter(results[-1].trade_columns.values())))
        rows.append(
            Row(work, f"{backend} end to end", elapsed, symbols * strategies * bars, "bar", 1,
                f"{trades:,} trades")
        )  # fmt: skip
    if len(results) < 2:
        return rows, None
    differences = 0
    for name in ("trade_columns", "metric_columns", "equity_columns"):
        a, b = getattr(results[0], name), getattr(results[1], name)
        for column in a:
            x, y = np.asarray(a[column]), np.asarray(b[column])
            if x.shape != y.shape:
                differences += max(x.size, y.size)
            elif x.dtype.kind == "f":
                differences += int((~((x == y) | (np.isnan(x) & np.isnan(y)))).sum())
            else:
                differences += int((x != y).sum())
    return rows, differences


def by_streams(rows: list[Row], path: str) -> dict:
    """``{stream count: µs}`` of the step rows of one ``path`` (the JSON record's keys)."""
    return {
        int(r.work): r.median_s * 1e6
        for r in rows
        if r.path == path and r.median_s is not None and r.workload.startswith("step,")
    }


def step_us(rows: list[Row]) -> dict:
    """``{workload: {path: µs}}`` of the step rows (end to end and kernel only)."""
    table: dict = {}
    for r in rows:
        table.setdefault(r.workload, {})[r.path] = None if r.median_s is None else r.median_s * 1e6
    return table


def run_gpu_tests() -> dict:
    import subprocess

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/test_cuda_gpu.py"],
        cwd=root, capture_output=True, text=True, check=False,
    )  # fmt: skip
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()]
    return {"returncode": proc.returncode, "passed": proc.returncode == 0,
            "summary": lines[-1] if lines else ""}  # fmt: skip


# -- main ------------------------------------------------------------------------------------


def environment(have_gpu: bool) -> dict:
    import numba

    env = {
        "python": platform.python_version(),
        "numba": numba.__version__,
        "cpu_count": os.cpu_count(),
        "numba_threads": numba.get_num_threads(),
        "machine": platform.machine(),
        "gpu": None,
    }
    try:
        import numba_cuda

        env["numba_cuda"] = numba_cuda.__version__
    except Exception:
        pass
    if have_gpu:
        from numba import cuda

        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        env["gpu"] = f"{name} (cc {dev.compute_capability[0]}.{dev.compute_capability[1]})"
        try:
            import cupy

            env["cupy"] = cupy.__version__
        except Exception:
            env["cupy"] = None
    return env


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--repeats", type=int, default=5, help="timed samples per figure")
    parser.add_argument("--json", help="also write the rows and the environment here")
    parser.add_argument(
        "--host-costs", action="store_true",
        help="only the host-side per-step costs (before/after; no GPU needed), then stop",
    )  # fmt: skip
    parser.add_argument(
        "--threads", default="",
        help="with a GPU: also time the step at these threads/block (up to --variants-up-to)",
    )  # fmt: skip
    parser.add_argument("--gpu-tests", action="store_true", help="run and record the GPU tests")
    parser.add_argument(
        "--step-sizes", default="",
        help="stream counts of the step table, comma-separated (default 1000,10000,100000)",
    )  # fmt: skip
    parser.add_argument(
        "--variants-up-to", type=int, default=100_000,
        help="step variants (all outputs, double-buffered, graphs) only up to this many streams",
    )  # fmt: skip
    parser.add_argument(
        "--no-host-costs", action="store_true", help="leave out the host-side cost table"
    )
    parser.add_argument(
        "--backtest-sweep", default="",
        help="also a backtest sweep CPU vs GPU: SYMBOLS,STRATEGIES,BARS (e.g. 2500,4,5000)",
    )  # fmt: skip
    args = parser.parse_args(argv)

    host = []
    if not args.no_host_costs:
        for n in (1_000,) if args.quick else (10_000, 100_000):
            host += host_cost_rows(n, max(args.repeats, 5))
        host += warmup_host_rows(*((500, 300) if args.quick else (10_000, 2_000)), args.repeats)
        print_table("Host-side cost per step around the CUDA kernels (CPU only)", host)
    record: dict = {"host_costs": [asdict(r) | {"rate": r.rate} for r in host]}
    if args.host_costs:
        record["environment"] = environment(False) | {"loadavg": os.getloadavg()}
        if args.json:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(record, fh, indent=1)
        return 0

    have_gpu, why = cuda_available()
    if not have_gpu:
        print(f"No CUDA device: {why}. The CUDA columns are skipped; CPU column only.")
        if not args.quick:
            print("(full sizes on the CPU take several minutes; --quick for small ones)")
    step_sizes = QUICK_STEP if args.quick else FULL_STEP
    if args.step_sizes:
        step_sizes = tuple(int(x) for x in args.step_sizes.split(",") if x.strip())
    warmup_sizes = QUICK_WARMUP if args.quick else FULL_WARMUP
    backends = ["cpu"] + (["cuda"] if have_gpu else [])
    env = environment(have_gpu)
    print("environment:", json.dumps(env))

    step: list[Row] = []
    warm: list[Row] = []
    record |= {"mismatches": None, "gpu_tests": None}

    def save() -> None:
        """Write the record so far (each table adds to it: a run cut short keeps what it did)."""
        if not args.json:
            return
        record.update(
            environment=env | {"loadavg": os.getloadavg()},
            device=env["gpu"],
            step_us=step_us(step),
            step_e2e_us=by_streams(step, "cuda end to end"),
            step_kernel_us=by_streams(step, "cuda kernel only"),
            cpu_step_e2e_us=by_streams(step, "cpu end to end"),
            cpu_gpu_discrete_mismatches=(record["mismatches"] or {}).get("discrete"),
            gpu_tests_passed=(record["gpu_tests"] or {}).get("passed"),
            warmup_symbol_bars_per_s={f"{r.workload} / {r.path}": r.rate for r in warm},
            rows=[asdict(r) | {"rate": r.rate} for r in step + warm],
        )
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=1)

    # parity first: the record says whether the GPU's numbers are the CPU's even when a
    # device run is cut short
    record["mismatches"] = mismatches(1_000 if args.quick else 10_000) if have_gpu else None
    if record["mismatches"]:
        print("\nCPU vs CUDA mismatches:", json.dumps(record["mismatches"]))
    save()

    for n in step_sizes:
        variants = n <= args.variants_up_to
        for backend in backends:
            step += step_rows(n, backend, args.repeats)
            if variants:
                step += step_rows(n, backend, args.repeats, variant="all outputs")
        if have_gpu and variants:
            for variant in ("double-buffered", "cuda graph", "cuda graph, double-buffered"):
                step += step_rows(n, "cuda", args.repeats, variant=variant)
        if have_gpu and variants:
            for threads in [int(x) for x in args.threads.split(",") if x.strip()]:
                step += step_rows(n, "cuda", args.repeats, threads)
        set_ratios(step)
        save()
    print_table("Step latency (one bar for every stream)", step)

    paths = ["cpu"] + (["cuda (global state)", "cuda (local state)"] if have_gpu else [])
    for i, (n, t) in enumerate(warmup_sizes):
        largest = i == len(warmup_sizes) - 1
        warm += warmup_rows(n, t, paths, max(1, args.repeats // 2), largest and not args.quick)
        if i == 1:
            for backend in backends:
                warm.append(engine_warmup_row(n, t, backend, max(1, args.repeats // 2)))
    set_ratios(warm)
    print_table("Warmup throughput (stream-bars/s; last-bar outputs)", warm)
    save()

    if args.backtest_sweep:
        symbols, strategies, bars = (int(x) for x in args.backtest_sweep.split(","))
        sweep, record["backtest_trade_differences"] = backtest_sweep_rows(
            symbols, strategies, bars, backends
        )
        set_ratios(sweep)
        print_table("Backtest sweep, end to end (backtest(); trades compared)", sweep)
        warm += sweep
    record["gpu_tests"] = run_gpu_tests() if args.gpu_tests else None
    if record["gpu_tests"]:
        print("GPU tests:", json.dumps(record["gpu_tests"]))
    save()
    if not have_gpu:
        print(f"\nNo GPU measured ({why}).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
