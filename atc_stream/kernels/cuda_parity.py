"""The CUDA backend's parity check: the same bars on the CPU and on the device must give the
same bits before a process uses the GPU.

Why: docs/design/cuda.md, "Parity on the device".
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from atc_stream.core.params import ATCParams
from atc_stream.state.arrays import StateStore

#: "off" skips the check (to diagnose a device; its results are then unchecked)
SWITCH = "ATC_STREAM_CUDA_PARITY_CHECK"
#: two parameter sets of different lengths and robustness, one with a short cutout
CHECK_PARAMS = (
    ATCParams(),
    ATCParams(
        ema_len=10, hma_len=12, wma_len=14, dema_len=9, lsma_len=20, kama_len=8,
        robustness="Narrow", La=0.05, De=0.1, cutout=40,
    ),
)  # fmt: skip
BASE_TIME = 1_700_000_000_000
BAR_MS = 60_000

_result: str | None = None


def device_parity_problem() -> str:
    """'' when the CUDA backend gave the CPU backend's bits on ``compare_backends()`` (run
    once a process, on the first CUDA backend), else what differed and how to bypass.
    Always '' with ``ATC_STREAM_CUDA_PARITY_CHECK=off``."""
    global _result
    if os.environ.get(SWITCH, "on").strip().lower() == "off":
        return ""
    if _result is None:
        try:
            from atc_stream.kernels.cuda_backend import CudaBackend

            found = compare_backends(lambda store: CudaBackend(store))
        except Exception as exc:  # a compile or launch failure is as good a reason
            found = f"it could not run on the device ({type(exc).__name__}: {exc})"
        _result = (
            f"the CUDA kernels' results differ from the CPU's on this device: {found} "
            f"({SWITCH}=off uses the GPU regardless, unchecked)"
            if found
            else ""
        )
    return _result


def check_series(streams: int, bars: int, seed: int = 7) -> np.ndarray:
    """Random walks on a 0.01 price grid (exact ties happen), ``streams`` x ``bars``."""
    rng = np.random.default_rng(seed)
    start = rng.uniform(20.0, 200.0, streams)[:, None]
    prices = start * np.exp(np.cumsum(rng.normal(0.0, 0.004, (streams, bars)), axis=1))
    return np.maximum(np.round(prices, 2), 0.01)


def check_store(streams: int) -> tuple[StateStore, np.ndarray]:
    """A store with ``CHECK_PARAMS`` and ``streams`` streams of each; and their slots."""
    store = StateStore(streams * len(CHECK_PARAMS))
    rows = [store.add_params(params) for params in CHECK_PARAMS]
    slots = np.array([store.allocate(row) for row in rows for _ in range(streams)], np.int64)
    return store, slots


def compare_backends(
    make_other: Any, streams: int = 16, bars: int = 400, warmup_bars: int = 300
) -> str:
    """The CPU backend and ``make_other(store)`` on the same series: a warmup of
    ``warmup_bars``, then one step a bar; '' when every output and the whole state (ring,
    values, counters) are the same bits, else the first difference."""
    from atc_stream.kernels.cpu import CpuBackend

    stores, backends = [], []
    for make in (CpuBackend, make_other):
        store, slots = check_store(streams)  # the same slots in both stores
        stores.append(store)
        backends.append(make(store))
    try:
        return _first_difference(backends, stores, slots, bars, warmup_bars)
    finally:
        for backend in backends:
            backend.close()  # the device's arrays go now, not at garbage collection


def _first_difference(backends, stores, slots, bars: int, warmup_bars: int) -> str:
    closes = np.tile(check_series(len(slots) // len(CHECK_PARAMS), bars), (len(CHECK_PARAMS), 1))
    n = closes.shape[0]
    times = BASE_TIME + BAR_MS * np.arange(bars, dtype=np.int64)
    history = np.ascontiguousarray(np.broadcast_to(times[:warmup_bars], (n, warmup_bars)))
    warm = np.ascontiguousarray(closes[:, :warmup_bars])
    counts = np.full(n, warmup_bars, np.int64)
    outs = [b.warmup(slots, history, warm, counts, False) for b in backends]
    if found := differ(*outs):
        return f"after a warmup of {warmup_bars} bars, outputs {found}"
    order, round_starts = np.arange(n, dtype=np.int64), np.array([0, n], np.int64)
    for j in range(warmup_bars, bars):
        bar = np.full(n, times[j], np.int64)
        outs = [b.step(slots, bar, closes[:, j].copy(), order, round_starts) for b in backends]
        if found := differ(*outs):
            return f"at bar {j}, outputs {found}"
    for backend in backends:
        backend.pull_state()
    for name in ("ring", "values", "counters"):
        if found := differ(getattr(stores[0], name), getattr(stores[1], name)):
            return f"after {bars} bars, state {name} {found}"
    return ""


def differ(cpu: np.ndarray, other: np.ndarray) -> str:
    """'' when the arrays hold the same bits (NaN where NaN), else where they differ."""
    cpu, other = np.asarray(cpu), np.asarray(other)
    if cpu.shape != other.shape:
        return f"have shapes {cpu.shape} and {other.shape}"
    equal = cpu == other
    if cpu.dtype.kind == "f":
        equal |= np.isnan(cpu) & np.isnan(other)
    if equal.all():
        return ""
    where = np.argwhere(~equal)
    first = tuple(int(i) for i in where[0])
    return (
        f"differ in {len(where)} entries, first at {first}: "
        f"{cpu[first].item()!r} on the CPU, {other[first].item()!r} on the device"
    )
