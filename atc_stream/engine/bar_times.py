"""Many bar times of update rows in one batched pass: each stream's rows as one history."""

from __future__ import annotations

from typing import Any

import numpy as np

from atc_stream.core.output_row import N_OUT
from atc_stream.core.results import Rejection, StepResult
from atc_stream.engine.parsing import as_update_arrays, pad_histories
from atc_stream.kernels import batch


def step_bar_times(engine: Any, slots, times, closes, inputs) -> StepResult:
    """``engine.step_arrays(slots, times, closes, inputs)`` of each bar time of these rows
    in turn, in one call: the same result rows (the accepted updates, in row order),
    values, rejections and state, at a warmup's cost a bar.

    The rows are in time order (a bar time's rows together, as a replay feeds them).
    Checked in that order, the rows of a stream meet the checks the steps would apply
    (``batch.plan_rounds`` checks each against the stream's previous accepted row), so
    the accepted rows of each stream are a history: all of them go through the warmup
    kernel together, every bar's outputs kept (docs/design/replay.md, "Many bar times a
    call"). An engine with strategies steps bar time by bar time instead.
    """
    if engine.strategies:
        raise ValueError("an engine with strategies steps its bars with step_arrays")
    slots, times, closes = as_update_arrays(slots, times, closes)
    inputs = np.asarray(inputs, np.int64)
    if np.any(times[1:] < times[:-1]):
        raise ValueError("step_bar_times needs its rows in time order")
    store = engine.store
    n = slots.shape[0]
    reasons = np.zeros(n, np.int64)
    batch.plan_rounds(
        store.counters, store.in_use, store.pending_last, store.pending_count,
        slots, times, closes, reasons,
    )  # fmt: skip
    rejected: list[Rejection] = []
    accepted = np.flatnonzero(reasons == batch.ACCEPTED)
    if accepted.shape[0] != n:
        engine._report_codes(reasons, slots, times, closes, inputs, rejected)
    outputs = np.empty((accepted.shape[0], N_OUT))
    if accepted.shape[0]:
        _apply_histories(engine, slots[accepted], times[accepted], closes[accepted], outputs)
    return engine._result(slots[accepted], times[accepted], closes[accepted], outputs, rejected)


def _apply_histories(engine: Any, slots, times, closes, outputs) -> None:
    """Apply accepted rows (time order) as one history per stream; write each row's
    outputs into ``outputs`` (row order)."""
    by_stream = np.argsort(slots, kind="stable")  # each stream's rows, still in time order
    stream_slots, starts, counts = np.unique(
        slots[by_stream], return_index=True, return_counts=True
    )
    bar = np.arange(by_stream.shape[0]) - np.repeat(starts, counts)  # its place in history
    stream = np.repeat(np.arange(stream_slots.shape[0]), counts)
    histories = [
        (slot, times[rows], closes[rows])
        for slot, rows in zip(stream_slots.tolist(), np.split(by_stream, starts[1:]), strict=True)
    ]
    recorded = engine.backend.warmup(*pad_histories(histories), True)
    outputs[by_stream] = recorded[stream, bar]
