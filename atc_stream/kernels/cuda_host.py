"""Compiled host-side work of the CUDA backend: plans, counter commits, the growth table.

These run on every step, so they are compiled (and cached like every kernel). Design:
docs/design/cuda.md.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from atc_stream.kernels import cpu
from atc_stream.kernels.cache import cached_jit
from atc_stream.state.layout import (
    BAR_INDEX,
    CUTOUT_COLUMN,
    LAST_TIME,
    PARAM_ROW,
    PV_LAM,
)

SHADOW_COLUMNS = (BAR_INDEX, LAST_TIME, PARAM_ROW)


@cached_jit(njit(cache=True))
def find_changed(counters, shadow, slots, count, changed):
    """Slots among ``slots[:count]`` whose host counters differ from what the device holds.

    Writes them to ``changed`` (each once) and returns how many; marks them current in
    ``shadow``.
    """
    n = 0
    for i in range(count):
        slot = slots[i]
        if (
            counters[slot, BAR_INDEX] != shadow[slot, 0]
            or counters[slot, LAST_TIME] != shadow[slot, 1]
            or counters[slot, PARAM_ROW] != shadow[slot, 2]
        ):
            shadow[slot, 0] = counters[slot, BAR_INDEX]
            shadow[slot, 1] = counters[slot, LAST_TIME]
            shadow[slot, 2] = counters[slot, PARAM_ROW]
            changed[n] = slot
            n += 1
    return n


@cached_jit(njit(cache=True))
def build_plan(slots, order, round_starts, plan, where):
    """The device plan: ``plan[k]`` slot, ``plan[m + k]`` host position, k in plan order.

    Within each round the updates are sorted by slot, so that neighbouring threads read
    neighbouring state (coalesced). A round whose slots span a range not much larger
    than itself is sorted by scattering into ``where`` (one entry per slot, all -1 on
    entry and on exit) and scanning the range; a sparse round by ``argsort``.
    """
    m = order.shape[0]
    for r in range(round_starts.shape[0] - 1):
        a, b = round_starts[r], round_starts[r + 1]
        if a == b:
            continue
        lo = hi = slots[order[a]]
        for k in range(a, b):
            lo = min(lo, slots[order[k]])
            hi = max(hi, slots[order[k]])
        if hi - lo + 1 <= 4 * (b - a) + 64:
            for k in range(a, b):
                where[slots[order[k]]] = order[k]
            k = a
            for slot in range(lo, hi + 1):
                u = where[slot]
                if u >= 0:
                    plan[k] = slot
                    plan[m + k] = u
                    where[slot] = -1
                    k += 1
        else:
            segment = np.empty(b - a, np.int64)
            for k in range(a, b):
                segment[k - a] = slots[order[k]]
            ranked = np.argsort(segment)
            for i in range(b - a):
                u = order[a + ranked[i]]
                plan[a + i] = slots[u]
                plan[m + a + i] = u


@cached_jit(njit(cache=True))
def plan_in_order(slots, order, plan):
    """A preview's plan: like ``build_plan`` but unsorted (a preview may hold one slot
    twice: each gets its own scratch row)."""
    m = order.shape[0]
    for k in range(m):
        plan[k] = slots[order[k]]
        plan[m + k] = order[k]


@cached_jit(njit(cache=True))
def commit_step(counters, shadow, plan, m, times, max_bar, bar_index):
    """Apply a step's counter changes on the host (as the kernel does on the device).

    Walks the host copy of the device plan (``plan[k]`` slot, ``plan[m + k]`` host
    position; rounds ascending, so a stream's bars in time order; slots ascending within
    a round, so the counters are read in memory order: with 100,000 shuffled streams
    1.3-5x faster than arrival order on the 2-core test VM, ``bench_cuda.py
    --host-costs``). ``bar_index[u]`` receives the index of the bar
    update ``u`` applied (the kernel's ``OUT_BAR_INDEX``), so that it is never copied back.
    """
    for k in range(m):
        slot = plan[k]
        u = plan[m + k]
        applied = counters[slot, BAR_INDEX]
        bar_index[u] = applied
        bar = applied + 1
        counters[slot, BAR_INDEX] = bar
        counters[slot, LAST_TIME] = times[u]
        shadow[slot, 0] = bar
        shadow[slot, 1] = times[u]
        if bar > max_bar:
            max_bar = bar
    return max_bar


@cached_jit(njit(cache=True))
def pack_warmup(slots, times, counts, ints):
    n = slots.shape[0]
    for s in range(n):
        ints[s] = slots[s]
        ints[n + s] = counts[s]
        ints[2 * n + s] = times[s, counts[s] - 1] if counts[s] > 0 else 0


@cached_jit(njit(cache=True))
def commit_warmup(counters, shadow, ints, n, max_bar):
    for s in range(n):
        count = ints[n + s]
        if count == 0:
            continue
        slot = ints[s]
        bar = counters[slot, BAR_INDEX] + count
        counters[slot, BAR_INDEX] = bar
        counters[slot, LAST_TIME] = ints[2 * n + s]
        shadow[slot, 0] = bar
        shadow[slot, 1] = ints[2 * n + s]
        if bar > max_bar:
            max_bar = bar
    return max_bar


_cpu_growth_factor = cpu.growth_factor


@cached_jit(njit(cache=True))
def _fill_growth_table(param_lengths, param_values, table):
    """``table[row, k] = cpu.growth_factor(lam_row, cutout_row + k, cutout_row)``.

    The same compiled function as the CPU step (glibc ``exp``). The loop is a ``while``
    with an exit on a NaN so that LLVM cannot vectorise it (a vectorised ``exp``, e.g.
    numba's SVML path, need not round like glibc's scalar one).
    """
    for row in range(table.shape[0]):
        cutout = param_lengths[row, CUTOUT_COLUMN]
        lam = param_values[row, PV_LAM]
        k = 0
        while k < table.shape[1]:
            g = _cpu_growth_factor(lam, cutout + k, cutout)
            table[row, k] = g
            if g != g:
                break
            k += 1


def growth_table(param_lengths: np.ndarray, param_values: np.ndarray, length: int) -> np.ndarray:
    """The host growth table for ``length`` bars after cutout (docs/design/cuda.md)."""
    table = np.empty((max(param_lengths.shape[0], 1), max(length, 1)), np.float64)
    if param_lengths.shape[0]:
        _fill_growth_table(param_lengths, param_values, table)
    else:
        table[:] = 1.0
    return table
