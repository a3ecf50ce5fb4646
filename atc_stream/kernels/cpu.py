"""CPU drivers: the core update compiled with ``numba.njit`` and run over streams in parallel.

Every driver loops ``prange`` over streams (one stream's state is one contiguous row
in C order, so its windows are contiguous in cache) and calls the same core
functions as the CUDA drivers. ``error_model="numpy"`` makes float division follow
IEEE (x/0 → inf/nan) like the GPU, instead of raising.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..state.layout import N_OUT
from .compile import compile_core

# inline="always": numba otherwise calls each core function out of line with ~30 words of
# array arguments (54 MA calls per bar); inlining halves the per-bar cost, same doubles.
_core = compile_core(njit(error_model="numpy", inline="always"))
update_stream = _core.update_stream
stream_growth = _core.stream_growth
growth_factor = _core.growth_factor

_driver = njit(parallel=True, error_model="numpy")


@_driver
def step(
    ring,
    values,
    counters,
    param_lengths,
    param_values,
    slots,
    times,
    closes,
    order,
    round_starts,
    out,
):
    """Apply planned rounds of updates (see ``batch.plan_rounds``); ``out[u]`` gets update u."""
    for r in range(round_starts.shape[0] - 1):
        for k in prange(round_starts[r], round_starts[r + 1]):
            u = order[k]
            slot = slots[u]
            growth = stream_growth(counters, param_lengths, param_values, slot)
            update_stream(
                ring,
                values,
                counters,
                slot,
                times[u],
                closes[u],
                growth,
                param_lengths,
                param_values,
                out,
                u,
            )


@_driver
def preview(
    ring, values, counters, param_lengths, param_values, slots, times, closes, accepted, out
):
    """Outputs for in-progress bars without touching state: each runs on a private copy."""
    n = slots.shape[0]
    scratch_ring = np.empty((n, ring.shape[1]), ring.dtype)
    scratch_values = np.empty((n, values.shape[1]), values.dtype)
    scratch_counters = np.empty((n, counters.shape[1]), counters.dtype)
    for u in prange(n):
        if not accepted[u]:
            continue
        slot = slots[u]
        scratch_ring[u, :] = ring[slot, :]
        scratch_values[u, :] = values[slot, :]
        scratch_counters[u, :] = counters[slot, :]
        growth = stream_growth(scratch_counters, param_lengths, param_values, u)
        update_stream(
            scratch_ring,
            scratch_values,
            scratch_counters,
            u,
            times[u],
            closes[u],
            growth,
            param_lengths,
            param_values,
            out,
            u,
        )


@_driver
def warmup(
    ring,
    values,
    counters,
    param_lengths,
    param_values,
    slots,
    times,
    closes,
    counts,
    out,
    record_all,
):
    """Apply ``counts[s]`` bars of ``times[s]``/``closes[s]`` to stream ``slots[s]``, in time order.

    With ``record_all`` every bar's outputs go to ``out[s, t]``; otherwise only the last
    bar's, to ``out[s, 0]`` (so 5,000 x 2,000 warmups need no output of that size).
    """
    for s in prange(slots.shape[0]):
        slot = slots[s]
        rows = out[s]
        for t in range(counts[s]):
            growth = stream_growth(counters, param_lengths, param_values, slot)
            update_stream(
                ring,
                values,
                counters,
                slot,
                times[s, t],
                closes[s, t],
                growth,
                param_lengths,
                param_values,
                rows,
                t if record_all else 0,
            )


class CpuBackend:
    """Runs the CPU drivers directly on the store's host arrays (C order: one stream per row)."""

    name = "cpu"

    def __init__(self, store) -> None:
        self.store = store

    def _arrays(self):
        s = self.store
        return s.ring, s.values, s.counters, s.params.lengths, s.params.values

    def step(self, slots, times, closes, order, round_starts) -> np.ndarray:
        out = np.full((slots.shape[0], N_OUT), np.nan)  # rows of rejected updates stay NaN
        step(*self._arrays(), slots, times, closes, order, round_starts, out)
        return out

    def preview(self, slots, times, closes, accepted) -> np.ndarray:
        out = np.full((slots.shape[0], N_OUT), np.nan)
        preview(*self._arrays(), slots, times, closes, accepted, out)
        return out

    def warmup(self, slots, times, closes, counts, record_all: bool) -> np.ndarray:
        rows = times.shape[1] if record_all else 1
        out = np.full((slots.shape[0], max(rows, 1), N_OUT), np.nan)
        warmup(*self._arrays(), slots, times, closes, counts, out, record_all)
        return out

    def pull_state(self) -> None:
        """Host arrays are the state on the CPU: nothing to copy."""

    def push_state(self) -> None:
        """Host arrays are the state on the CPU: nothing to copy."""
