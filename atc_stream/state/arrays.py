"""The state store: per-stream state arrays, slots, the parameter table and growth.

``StateStore`` owns the host copy of every state array described in
``state/layout.py``: slots are handed out and taken back at any time, capacity and
ring length grow without losing any stream's state, and the parameter table lets
one kernel launch serve many parameter sets. Backends that keep state elsewhere
(the GPU) mirror these arrays; ``generation`` tells them when shapes changed.
"""

from __future__ import annotations

import numpy as np

from atc_stream.core.params import ATCParams
from atc_stream.core.schema import ready_bar
from atc_stream.core.strategy import Strategy
from atc_stream.state import layout as L
from atc_stream.state import strategy_layout as SL


class ParameterTable:
    """Parameter sets as two small arrays, one row per set (``param_lengths``, ``param_values``)."""

    def __init__(self) -> None:
        self.params: list[ATCParams] = []
        self.lengths = np.zeros((0, L.N_LENGTH_COLUMNS), np.int64)
        self.values = np.zeros((0, L.N_PARAM_VALUES), np.float64)
        #: first ready bar per row (``schema.ready_bar``), for the ``ready`` column
        self.ready_bars = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self.params)

    def add(self, params: ATCParams) -> int:
        """Row of ``params``, adding it if it is new."""
        if params in self.params:
            return self.params.index(params)
        lengths = np.zeros((1, L.N_LENGTH_COLUMNS), np.int64)
        lengths[0, : L.CUTOUT_COLUMN] = np.array(params.lengths, np.int64).ravel()
        lengths[0, L.CUTOUT_COLUMN] = params.cutout
        values = np.zeros((1, L.N_PARAM_VALUES), np.float64)
        values[0, L.PV_WEIGHT : L.PV_WEIGHT + 6] = params.weights
        values[0, L.PV_LAM] = params.lam
        values[0, L.PV_DECAY] = params.decay
        values[0, L.PV_CUT] = params.cut
        values[0, L.PV_LONG] = params.long_threshold
        values[0, L.PV_SHORT] = params.short_threshold
        self.params.append(params)
        self.ready_bars = np.append(self.ready_bars, np.int64(ready_bar(params)))
        self.lengths = np.concatenate([self.lengths, lengths])
        self.values = np.concatenate([self.values, values])
        return len(self.params) - 1

    @property
    def ring_capacity_needed(self) -> int:
        """Closes a stream must remember: its longest window plus one (KAMA reads c[L])."""
        return max((p.max_length for p in self.params), default=0) + 1


class StrategyTable:
    """Strategies as two small arrays, one row per strategy (``SP_*`` floats, ``SI_*`` ints)."""

    def __init__(self, strategies: list[Strategy] | None = None) -> None:
        self.strategies: list[Strategy] = list(strategies or [])
        self.values = np.array(
            [[s.stop, s.take_profit, s.fee, s.slippage] for s in self.strategies], np.float64
        ).reshape(-1, SL.N_STRATEGY_PARAM_VALUES)
        self.ints = np.array(
            [[s.max_hold, s.long_target, s.short_target] for s in self.strategies], np.int64
        ).reshape(-1, SL.N_STRATEGY_PARAM_INTS)

    def __len__(self) -> int:
        return len(self.strategies)


def _initial_values() -> np.ndarray:
    """The values of a stream that has seen no bar (docs/spec.md initial values)."""
    values = np.zeros(L.N_VALUE_FIELDS)  # sig, a, KAMA, DEMA seed sum start at 0
    ma = values[L.MA_BASE : L.FAMILY_BASE].reshape(-1, L.MA_FIELDS)
    ma[:, L.MA_PREV] = np.nan
    ma[:, L.MA_EQUITY] = np.nan
    fam = values[L.FAMILY_BASE : L.STREAM_BASE].reshape(-1, L.FAMILY_FIELDS)
    fam[:, L.FAM_SIGNAL_PREV] = np.nan
    fam[:, L.FAM_EQUITY] = np.nan
    values[L.AVG_PREV] = np.nan
    values[L.GROWTH] = np.nan
    values.flags.writeable = False
    return values


_INITIAL_VALUES = _initial_values()


def lane_blocks(slots: int) -> int:
    """Blocks of ``LANES`` streams the values array needs for ``slots`` slots."""
    return -(-slots // L.LANES)


def values_of(values: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """The values of ``slots``, one row per slot (``[slot, field]``), from the lane
    layout ``values[block, field, lane]`` (a copy)."""
    slots = np.asarray(slots, np.int64)
    return values[slots // L.LANES, :, slots % L.LANES]


def set_values_of(values: np.ndarray, slots: np.ndarray, rows: np.ndarray) -> None:
    """``values_of``'s inverse: the rows ``rows[i]`` (or one row for all) into ``slots[i]``."""
    slots = np.asarray(slots, np.int64)
    values[slots // L.LANES, :, slots % L.LANES] = rows


def rows_to_lanes(rows: np.ndarray) -> np.ndarray:
    """Values as rows ``[slot, field]`` (the snapshot format) in the lane layout, the
    last block's missing lanes zero."""
    n = rows.shape[0]
    padded = np.zeros((lane_blocks(n) * L.LANES, rows.shape[1]))
    padded[:n] = rows
    return np.ascontiguousarray(padded.reshape(-1, L.LANES, rows.shape[1]).transpose(0, 2, 1))


def lanes_to_rows(values: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` slots of lane-layout ``values`` as rows ``[slot, field]`` (only
    their blocks are converted)."""
    return values[: lane_blocks(n)].transpose(0, 2, 1).reshape(-1, values.shape[1])[:n]


class StateStore:
    """Host state arrays (``ring`` and ``counters`` indexed ``[slot, field]``, ``values``
    ``[block, field, lane]``), plus slot allocation and growth."""

    def __init__(self, capacity: int = 64) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.params = ParameterTable()
        self.ring_capacity = 1
        self.ring = np.full((capacity, 2), np.nan)
        self.values = np.zeros((lane_blocks(capacity), L.N_VALUE_FIELDS, L.LANES))
        self.counters = np.zeros((capacity, L.N_COUNTER_FIELDS), np.int64)
        self.in_use = np.zeros(capacity, np.bool_)
        # per-slot scratch for batch planning (kernels/batch.py); always zero between calls
        self.pending_last = np.zeros(capacity, np.int64)
        self.pending_count = np.zeros(capacity, np.int64)
        self.strategies = StrategyTable()
        #: strategy state, row ``slot * len(strategies) + k`` for strategy ``k`` of a slot
        self.strategy_values = np.zeros((0, SL.N_STRATEGY_VALUES))
        self.strategy_counters = np.zeros((0, SL.N_STRATEGY_COUNTERS), np.int64)
        #: open time of the open position's entry bar, per strategy row
        self.strategy_entry_times = np.zeros(0, np.int64)
        #: bumped whenever array shapes or the parameter table change
        self.generation = 0
        #: every slot below this one is in use (so allocation never rescans them)
        self._free_hint = 0

    # -- capacity ---------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self.in_use.shape[0]

    @property
    def n_streams(self) -> int:
        return int(self.in_use.sum())

    @property
    def bytes_per_stream(self) -> int:
        """State bytes one slot occupies (ring, values, counters, scratch)."""
        return (
            self.ring.strides[0]
            + self.values.strides[0] // L.LANES
            + self.counters.strides[0]
            + self.in_use.itemsize
            + self.pending_last.itemsize
            + self.pending_count.itemsize
        )

    def reserve(self, capacity: int) -> None:
        """Grow to at least ``capacity`` slots (doubling), keeping every stream's state."""
        if capacity <= self.capacity:
            return
        new = max(capacity, 2 * self.capacity)
        extra = new - self.capacity
        self.ring = np.concatenate([self.ring, np.full((extra, self.ring.shape[1]), np.nan)])
        blocks = lane_blocks(new) - self.values.shape[0]
        self.values = np.concatenate([self.values, np.zeros((blocks, L.N_VALUE_FIELDS, L.LANES))])
        self.counters = np.concatenate(
            [self.counters, np.zeros((extra, self.counters.shape[1]), np.int64)]
        )
        self.in_use = np.concatenate([self.in_use, np.zeros(extra, np.bool_)])
        self.pending_last = np.concatenate([self.pending_last, np.zeros(extra, np.int64)])
        self.pending_count = np.concatenate([self.pending_count, np.zeros(extra, np.int64)])
        n = len(self.strategies)
        self.strategy_values = np.concatenate(
            [self.strategy_values, np.zeros((extra * n, SL.N_STRATEGY_VALUES))]
        )
        self.strategy_counters = np.concatenate(
            [self.strategy_counters, np.zeros((extra * n, SL.N_STRATEGY_COUNTERS), np.int64)]
        )
        self.strategy_entry_times = np.concatenate(
            [self.strategy_entry_times, np.zeros(extra * n, np.int64)]
        )
        self.generation += 1

    def _grow_ring(self, ring_capacity: int) -> None:
        """Lengthen every ring to ``ring_capacity`` closes, keeping the newest closes."""
        old = self.ring_capacity
        if ring_capacity <= old:
            return
        heads = self.counters[:, L.RING_HEAD]
        # the `old` newest closes of each slot, oldest first (one slice of the doubled ring)
        newest = self.ring[np.arange(self.capacity)[:, None], heads[:, None] + 1 + np.arange(old)]
        ring = np.full((self.capacity, 2 * ring_capacity), np.nan)
        ring[:, ring_capacity - old : ring_capacity] = newest
        ring[:, 2 * ring_capacity - old :] = newest
        self.ring = ring
        self.ring_capacity = ring_capacity
        self.counters[:, L.RING_HEAD] = ring_capacity - 1
        self.generation += 1

    # -- parameter sets -------------------------------------------------------------

    def add_params(self, params: ATCParams) -> int:
        n_before = len(self.params)
        row = self.params.add(params)
        if len(self.params) != n_before:
            self._grow_ring(self.params.ring_capacity_needed)
            self.generation += 1
        return row

    # -- strategies ---------------------------------------------------------------------

    def set_strategies(self, strategies: list[Strategy]) -> None:
        """Every stream trades these strategies (one state row per slot and strategy); only
        while no slot is in use."""
        if self.in_use.any():
            raise ValueError("strategies can only be set before any stream is added")
        self.strategies = StrategyTable(strategies)
        rows = self.capacity * len(self.strategies)
        self.strategy_values = np.zeros((rows, SL.N_STRATEGY_VALUES))
        self.strategy_counters = np.zeros((rows, SL.N_STRATEGY_COUNTERS), np.int64)
        self.strategy_entry_times = np.zeros(rows, np.int64)
        for slot in range(self.capacity):
            self._reset_strategies(slot)
        self.generation += 1

    def strategy_rows(self, slot: int) -> slice:
        """The strategy state rows of ``slot``."""
        n = len(self.strategies)
        return slice(slot * n, (slot + 1) * n)

    def _reset_strategies(self, slot: int) -> None:
        """Flat with cash 1.0, no order, no bars (``kernels/strategy.py``'s
        ``strategy_reset``)."""
        rows = self.strategy_rows(slot)
        self.strategy_values[rows] = 0.0
        self.strategy_counters[rows] = 0
        self.strategy_entry_times[rows] = 0
        self.strategy_values[rows, SL.S_CASH] = 1.0
        self.strategy_values[rows, SL.S_EQUITY] = 1.0
        self.strategy_values[rows, SL.S_PEAK] = 1.0
        self.strategy_counters[rows, SL.S_ENTRY_BAR] = -1

    # -- slots ----------------------------------------------------------------------

    def allocate(self, param_row: int) -> int:
        """A fresh slot (the lowest free one) initialised for parameter row ``param_row``."""
        if not 0 <= param_row < len(self.params):
            raise ValueError(f"param_row {param_row} is not in the parameter table")
        slot = self._free_hint
        while slot < self.capacity and self.in_use[slot]:
            slot += 1
        if slot == self.capacity:
            self.reserve(self.capacity + 1)
        self.reset_slot(slot, param_row)
        self.in_use[slot] = True
        self._free_hint = slot + 1
        return slot

    def allocate_many(self, param_rows: np.ndarray) -> np.ndarray:
        """Fresh slots, one per entry of ``param_rows`` and initialised for it: the lowest
        free ones, ascending, as ``allocate`` called for each in turn would give."""
        param_rows = np.asarray(param_rows, np.int64)
        bad = (param_rows < 0) | (param_rows >= len(self.params))
        if bad.any():
            raise ValueError(f"param_row {int(param_rows[bad][0])} is not in the parameter table")
        n = param_rows.shape[0]
        if n == 0:
            return np.zeros(0, np.int64)
        free = np.flatnonzero(~self.in_use[self._free_hint :])[:n] + self._free_hint
        if free.shape[0] < n:  # the rest come from the new slots, which follow
            first_new = self.capacity
            self.reserve(self.capacity + n - free.shape[0])
            free = np.concatenate([free, np.arange(first_new, first_new + n - free.shape[0])])
        slots = free.astype(np.int64)
        self.reset_slots(slots, param_rows)
        self.in_use[slots] = True
        self._free_hint = int(slots[-1]) + 1
        return slots

    def release(self, slot: int) -> None:
        if not self.in_use[slot]:
            raise ValueError(f"slot {slot} is not in use")
        self.in_use[slot] = False
        self.reset_slot(slot, 0)
        self._free_hint = min(self._free_hint, slot)

    def reset_slot(self, slot: int, param_row: int) -> None:
        """State of a stream that has seen no bar (docs/spec.md initial values)."""
        self.reset_slots(np.array([slot], np.int64), np.array([param_row], np.int64))

    def reset_slots(self, slots: np.ndarray, param_rows: np.ndarray) -> None:
        """``reset_slot`` of each of ``slots`` for the parameter row beside it."""
        self.ring[slots] = np.nan
        set_values_of(self.values, slots, _INITIAL_VALUES)
        counters = np.zeros((param_rows.shape[0], L.N_COUNTER_FIELDS), np.int64)
        counters[:, L.RING_HEAD] = self.ring_capacity - 1
        counters[:, L.LAST_TIME] = L.NO_TIME
        counters[:, L.PARAM_ROW] = param_rows
        self.counters[slots] = counters
        if len(self.strategies):
            for slot in slots.tolist():
                self._reset_strategies(slot)
