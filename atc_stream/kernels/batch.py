"""Host-side batch planning shared by every backend: validation and rounds.

Design: docs/design/kernels.md, "Batch planning".
"""

from __future__ import annotations

import numpy as np
from numba import njit

from atc_stream.core.timetext import MAX_TIME_MS
from atc_stream.kernels.cache import cached_jit
from atc_stream.state.layout import LAST_TIME, PARAM_ROW

ACCEPTED = 0
UNKNOWN_STREAM = 1
NON_FINITE_CLOSE = 2
NON_POSITIVE_CLOSE = 3
DUPLICATE_BAR = 4
OUT_OF_ORDER_BAR = 5
TIME_OUT_OF_RANGE = 6

#: reason code -> name used in rejection counters and reports
REASON_NAMES = {
    UNKNOWN_STREAM: "unknown_stream",
    NON_FINITE_CLOSE: "non_finite_close",
    NON_POSITIVE_CLOSE: "non_positive_close",
    DUPLICATE_BAR: "duplicate_bar",
    OUT_OF_ORDER_BAR: "out_of_order_bar",
    TIME_OUT_OF_RANGE: "time_out_of_range",
}


@cached_jit(njit(cache=True))
def _check_close_and_slot(slot, close, in_use):
    if slot < 0 or slot >= in_use.shape[0] or not in_use[slot]:
        return UNKNOWN_STREAM
    if not np.isfinite(close):
        return NON_FINITE_CLOSE
    if close <= 0.0:
        return NON_POSITIVE_CLOSE
    return ACCEPTED


@cached_jit(njit(cache=True))
def _time_reason(bar_time, last_time):
    if bar_time > MAX_TIME_MS:
        return TIME_OUT_OF_RANGE
    if bar_time == last_time:
        return DUPLICATE_BAR
    if bar_time < last_time:
        return OUT_OF_ORDER_BAR
    return ACCEPTED


@cached_jit(njit(cache=True))
def plan_rounds(counters, in_use, pending_last, pending_count, slots, times, closes, reasons):
    """Validate a step batch; return ``(order, round_starts)`` of the accepted updates.

    ``reasons[u]`` receives each update's code. ``pending_last``/``pending_count`` are
    per-slot scratch arrays that must be all zero on entry; they are zero again on exit.
    Accepted updates of round ``r`` are ``order[round_starts[r]:round_starts[r + 1]]``.
    """
    n = slots.shape[0]
    rounds = np.empty(n, np.int64)
    n_rounds = 0
    for u in range(n):
        slot = slots[u]
        reason = _check_close_and_slot(slot, closes[u], in_use)
        if reason == ACCEPTED:
            last = pending_last[slot] if pending_count[slot] > 0 else counters[slot, LAST_TIME]
            reason = _time_reason(times[u], last)
        reasons[u] = reason
        rounds[u] = -1
        if reason == ACCEPTED:
            rounds[u] = pending_count[slot]
            pending_count[slot] += 1
            pending_last[slot] = times[u]
            n_rounds = max(n_rounds, pending_count[slot])
    round_starts = np.zeros(n_rounds + 1, np.int64)
    for u in range(n):
        if rounds[u] >= 0:
            round_starts[rounds[u] + 1] += 1
            pending_count[slots[u]] = 0
            pending_last[slots[u]] = 0
    for r in range(n_rounds):
        round_starts[r + 1] += round_starts[r]
    order = np.empty(round_starts[n_rounds], np.int64)
    fill = round_starts[:n_rounds].copy()
    for u in range(n):
        if rounds[u] >= 0:
            order[fill[rounds[u]]] = u
            fill[rounds[u]] += 1
    return order, round_starts


@cached_jit(njit(cache=True))
def check_unique_step(
    counters, in_use, ready_bars, last_slots, slots, times, closes, reasons, ready_from
):
    """Validate a step batch whose slots are ``last_slots``, a batch known to hold each
    stream at most once (one round); return the number of accepted updates, or -1
    (nothing checked) when the slots are not ``last_slots``. Same reasons as
    ``plan_rounds`` gives such a batch; ``ready_from[u]`` gets an accepted update's
    ``ready_bars`` entry (its parameter row's first ready bar index)."""
    n = slots.shape[0]
    if last_slots.shape[0] != n:
        return -1
    for u in range(n):
        if slots[u] != last_slots[u]:
            return -1
    n_ok = 0
    for u in range(n):
        slot = slots[u]
        reason = _check_close_and_slot(slot, closes[u], in_use)
        if reason == ACCEPTED:
            reason = _time_reason(times[u], counters[slot, LAST_TIME])
            ready_from[u] = ready_bars[counters[slot, PARAM_ROW]]
        reasons[u] = reason
        if reason == ACCEPTED:
            n_ok += 1
    return n_ok


@cached_jit(njit(cache=True))
def check_previews(counters, in_use, slots, times, closes, reasons):
    """Validate a preview batch: each update is checked against committed state only."""
    n_ok = 0
    for u in range(slots.shape[0]):
        reason = _check_close_and_slot(slots[u], closes[u], in_use)
        if reason == ACCEPTED:
            reason = _time_reason(times[u], counters[slots[u], LAST_TIME])
        reasons[u] = reason
        if reason == ACCEPTED:
            n_ok += 1
    return n_ok


@cached_jit(njit(cache=True))
def check_history(in_use, slot, times, closes, last_time, reasons):
    """Validate one stream's history (for warmup); return the number of accepted bars."""
    n_ok = 0
    for t in range(times.shape[0]):
        reason = _check_close_and_slot(slot, closes[t], in_use)
        if reason == ACCEPTED:
            reason = _time_reason(times[t], last_time)
        reasons[t] = reason
        if reason == ACCEPTED:
            last_time = times[t]
            n_ok += 1
    return n_ok
