"""The CUDA backend's device-resident state: upload, download, change detection, growth table.

Design: docs/design/cuda.md, "State on the device, host mirror".
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda

from atc_stream.kernels import cuda_host
from atc_stream.kernels.cuda_host import SHADOW_COLUMNS, find_changed, growth_table
from atc_stream.kernels.cuda_io import Staging
from atc_stream.kernels.cuda_kernels import scatter_rows_kernel, scatter_values_kernel
from atc_stream.kernels.cuda_paper import DeviceStrategies
from atc_stream.state import layout as L
from atc_stream.state.arrays import StateStore, lanes_to_rows, set_values_of, values_of
from atc_stream.state.layout import N_COUNTER_FIELDS

#: First length of the growth table (bars after cutout); it doubles when outgrown.
GROWTH_TABLE_MIN = 4096


class DeviceState:
    """The device copy of a ``StateStore`` and what keeps it current.

    ``push``/``pull`` move the whole state; ``sync`` uploads the slots (re)initialised on
    the host since the device last saw them, or merges and re-pushes after the store was
    rebuilt. ``shadow`` holds what the device was last given of each slot's
    ``SHADOW_COLUMNS``, ``max_bar`` the largest bar index (the growth table covers it).
    The callbacks are the backend's: allocation, staging buffers, launches on its
    stream, waiting for submitted steps, and the note that device buffers moved.
    """

    def __init__(
        self,
        store: StateStore,
        stream: Any,
        device_empty: Callable[..., Any],
        staging: Callable[[Any], Staging],
        launch: Callable[..., None],
        drain: Callable[[], None],
        buffers_moved: Callable[[], None],
    ) -> None:
        self.store = store
        self.stream = stream
        self._device_empty = device_empty
        self._launch = launch
        self._drain = drain
        self._buffers_moved = buffers_moved
        self._rows = staging(np.float64)  # packed rows of host-initialised slots
        self._row_counters = staging(np.int64)
        self._dev: types.SimpleNamespace | None = None
        self._mirror: types.SimpleNamespace | None = None
        self.shadow = np.zeros((0, len(SHADOW_COLUMNS)), np.int64)
        self._changed = np.zeros(0, np.int64)
        self._generation = -1
        self.max_bar = 0
        self._table_rows = -1
        self._table_length = 0
        self._growth_table: Any = None
        #: the strategy state of a paper-trading engine, kept beside the ATC state
        self.strategies = DeviceStrategies(store, stream, launch, staging)

    @property
    def on_device(self) -> bool:
        """Whether the state was pushed (and not freed since)."""
        return self._dev is not None

    def arrays(self) -> tuple[Any, ...]:
        """The kernels' leading arguments: ring, values, counters, parameter tables, growth."""
        d = self._dev
        assert d is not None, "push() first"
        return d.ring, d.values, d.counters, d.param_lengths, d.param_values, self._growth_table

    def free(self) -> None:
        """Drop the device arrays (the host arrays keep whatever was last pulled)."""
        self._dev = None
        self._mirror = None
        self.strategies.free()
        self._growth_table = None
        self._table_rows = -1
        self._generation = -1

    def push(self) -> None:
        """Upload the store's host arrays (the whole state and the parameter table)."""
        s = self.store
        self._drain()
        self._buffers_moved()  # new parameter tables (and maybe state arrays) on the device
        # at least two rows: a one-row F-order array is also C-contiguous, which numba
        # types as layout "C", i.e. a second specialisation of every kernel
        rows = max(s.capacity, 2)
        shapes = (rows, s.ring.shape[1], s.values.shape)
        if self._mirror is None or self._mirror.shapes != shapes:
            self._mirror = types.SimpleNamespace(
                shapes=shapes,
                ring=cuda.pinned_array((rows, s.ring.shape[1]), np.float64, order="F"),
                values=cuda.pinned_array(s.values.shape, np.float64),
                counters=cuda.pinned_array((rows, s.counters.shape[1]), np.int64, order="F"),
            )
            self._mirror.counters[:] = 0
            self._dev = types.SimpleNamespace(
                ring=self._device_empty((rows, s.ring.shape[1]), np.float64, "F"),
                values=self._device_empty(s.values.shape, np.float64),
                counters=self._device_empty((rows, s.counters.shape[1]), np.int64, "F"),
            )
        m, d = self._mirror, self._dev
        assert m is not None and d is not None  # allocated above
        self.stream.synchronize()  # the mirrors may still be in use by a pending copy
        np.copyto(m.values, s.values)
        for name in ("ring", "counters"):
            np.copyto(getattr(m, name)[: s.capacity], getattr(s, name))
        for name in ("ring", "values", "counters"):
            getattr(d, name).copy_to_device(getattr(m, name), stream=self.stream)
        lengths = s.params.lengths if len(s.params) else np.zeros((1, L.N_LENGTH_COLUMNS), np.int64)
        values = s.params.values if len(s.params) else np.zeros((1, L.N_PARAM_VALUES))
        d.param_lengths = cuda.to_device(np.ascontiguousarray(lengths), stream=self.stream)
        d.param_values = cuda.to_device(np.ascontiguousarray(values), stream=self.stream)
        self.shadow = np.ascontiguousarray(s.counters[:, SHADOW_COLUMNS])
        self._changed = np.zeros(s.capacity, np.int64)
        self.max_bar = int(s.counters[:, L.BAR_INDEX].max(initial=0))
        self._generation = s.generation
        self.strategies.push()
        self.stream.synchronize()

    def pull(self) -> None:
        """Copy the device state into the store's host arrays (the host mirror)."""
        if self._dev is None:
            return  # nothing on the device yet: the host arrays are the state
        self._drain()
        self.sync(None)
        m, d = self._mirror, self._dev
        assert m is not None and d is not None  # sync pushed the state if it had to
        for name in ("ring", "values", "counters"):
            getattr(d, name).copy_to_host(getattr(m, name), stream=self.stream)
        self.stream.synchronize()
        capacity = self.store.capacity
        np.copyto(self.store.values, m.values)
        for name in ("ring", "counters"):
            np.copyto(getattr(self.store, name), getattr(m, name)[:capacity])
        self.strategies.pull()

    def _download_old(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        m, d = self._mirror, self._dev
        assert m is not None and d is not None, "push() first"
        for name in ("ring", "values", "counters"):
            getattr(d, name).copy_to_host(getattr(m, name), stream=self.stream)
        self.stream.synchronize()
        rows = self.shadow.shape[0]  # the capacity the device state was laid out for
        values = lanes_to_rows(m.values, rows)
        return np.array(m.ring[:rows]), values, np.array(m.counters[:rows])

    def _relayout(self) -> None:
        """The store was rebuilt (new capacity, ring width or parameter set): merge, push.

        The store copied its *host* rows, stale for every stream the device advanced.
        Rows whose counters still match what the device was given are replaced by the
        device's state, re-laid out for a new ring width by the store's own
        ``_grow_ring``; rows (re)initialised on the host since then are kept.
        """
        s = self.store
        ring, values, counters = self._download_old()
        old_capacity = values.shape[0]
        old_ring_capacity = ring.shape[1] // 2
        if old_ring_capacity != s.ring_capacity:
            relaid = StateStore(old_capacity)
            relaid.ring, relaid.counters = ring, counters
            relaid.ring_capacity = old_ring_capacity
            relaid._grow_ring(s.ring_capacity)
            ring, counters = relaid.ring, relaid.counters
        rows = min(old_capacity, s.capacity)
        same = (s.counters[:rows, SHADOW_COLUMNS] == self.shadow[:rows]).all(axis=1)
        keep = np.flatnonzero(same)
        s.ring[keep] = ring[keep]
        set_values_of(s.values, keep, values[keep])
        s.counters[keep] = counters[keep]
        self.strategies.merge_into_store(keep)
        self.push()

    def sync(self, slots: np.ndarray | None, count: int | None = None) -> None:
        """Bring the device up to date with host-side changes before a launch or pull.

        ``slots[:count]``: the slots about to be used (None: all).
        """
        s = self.store
        if self._dev is None:
            self.push()
            return
        if s.generation != self._generation:
            self._relayout()
            return
        if slots is None:
            slots = np.arange(s.capacity, dtype=np.int64)
        if count is None:
            count = slots.shape[0]
        n = find_changed(s.counters, self.shadow, slots, count, self._changed)
        if n == 0:
            return
        changed = self._changed[:n].copy()
        self.max_bar = max(self.max_bar, int(s.counters[changed, L.BAR_INDEX].max()))
        self._upload_rows(changed)

    def _upload_rows(self, changed: np.ndarray) -> None:
        s, d = self.store, self._dev
        assert d is not None, "push() first"
        n = changed.shape[0]
        ring_cols, value_cols = s.ring.shape[1], s.values.shape[1]
        floats_per_row = ring_cols + value_cols
        self.stream.synchronize()  # nothing pending may still read the staging buffers
        self._rows.reserve(n * floats_per_row)
        self._row_counters.reserve(n * (N_COUNTER_FIELDS + 1))
        host_rows = self._rows.host[: n * floats_per_row]
        host_rows[: n * ring_cols] = s.ring[changed].ravel()
        host_rows[n * ring_cols :] = values_of(s.values, changed).ravel()
        host_ints = self._row_counters.host[: n * (N_COUNTER_FIELDS + 1)]
        host_ints[:n] = changed
        host_ints[n:] = s.counters[changed].ravel()
        self._rows.upload(n * floats_per_row, self.stream)
        self._row_counters.upload(n * (N_COUNTER_FIELDS + 1), self.stream)
        dev_rows, dev_ints = self._rows.device, self._row_counters.device
        dev_slots = dev_ints[:n]
        self._launch(
            scatter_rows_kernel, n, d.ring, dev_slots,
            dev_rows[: n * ring_cols].reshape(n, ring_cols),
        )  # fmt: skip
        self._launch(
            scatter_values_kernel, n, d.values, dev_slots,
            dev_rows[n * ring_cols : n * floats_per_row].reshape(n, value_cols),
        )  # fmt: skip
        self._launch(
            scatter_rows_kernel, n, d.counters, dev_slots,
            dev_ints[n : n * (N_COUNTER_FIELDS + 1)].reshape(n, N_COUNTER_FIELDS),
        )  # fmt: skip
        self.strategies.upload_slots(changed)

    def ensure_growth(self, bars_ahead: int) -> None:
        """Make the growth table cover every bar index up to ``max_bar + bars_ahead``."""
        s = self.store
        needed = self.max_bar + bars_ahead + 1
        rows = len(s.params)
        if rows == self._table_rows and needed <= self._table_length:
            return
        length = self._table_length
        if needed > length:
            length = max(needed, 2 * length, GROWTH_TABLE_MIN)
        table = growth_table(s.params.lengths, s.params.values, length)
        self.stream.synchronize()  # a submitted step may still read the old table
        self._growth_table = cuda.to_device(table, stream=self.stream)
        self._buffers_moved()
        self._table_rows, self._table_length = rows, length

    def commit_step(
        self, plan: np.ndarray, m: int, times: np.ndarray, bar_index: np.ndarray
    ) -> None:
        """A planned step's counter changes, on the host (``cuda_host.commit_step``)."""
        self.max_bar = cuda_host.commit_step(
            self.store.counters, self.shadow, plan, m, times, self.max_bar, bar_index
        )

    def commit_warmup(self, ints: np.ndarray, n: int) -> None:
        """A warmup's counter changes, on the host (``cuda_host.commit_warmup``)."""
        self.max_bar = cuda_host.commit_warmup(
            self.store.counters, self.shadow, ints, n, self.max_bar
        )
