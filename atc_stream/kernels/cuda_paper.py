"""The strategy step of live streams on the GPU: ``paper_cpu.slot_strategies`` over
``kernels/strategy.py`` device functions, on strategy state kept on the device, queued
after the ATC kernels on their stream and reading their output rows there.

Design: docs/design/cuda.md, "Strategies".
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda

from atc_stream.kernels import paper_cpu
from atc_stream.kernels.backtest_cuda import device_strategy
from atc_stream.kernels.cuda_io import Staging
from atc_stream.kernels.cuda_kernels import scatter_rows_kernel
from atc_stream.kernels.paper_cpu import MAX_TRADES_PER_BAR, strategy_outputs
from atc_stream.kernels.ptx_guard import kernel as ptx_kernel
from atc_stream.state.arrays import StateStore
from atc_stream.state.strategy_layout import N_TRADE_FIELDS

_kernel = ptx_kernel  # compiled from the checked -fma=0 PTX (link-time optimisation off)


def _on_device(function: Any, **device_functions: Any) -> Any:
    """``function`` (a CPU dispatcher's Python source) compiled as a device function
    whose calls of ``device_functions``' names go to those device functions: one source
    for both backends."""
    source = function.py_func
    namespace = {**source.__globals__, **device_functions}
    clone = types.FunctionType(source.__code__, namespace, source.__name__)
    return cuda.jit(device=True)(clone)


live_bar = _on_device(paper_cpu.live_bar, strategy_bar=device_strategy.strategy_bar)
atc_events = _on_device(paper_cpu.atc_events)
slot_strategies = _on_device(paper_cpu.slot_strategies, live_bar=live_bar, atc_events=atc_events)


@_kernel
def paper_step_kernel(
    sv, sc, entry_times, spv, spi, counters, ready_bars, plan, m, start, stop,
    times, opens, highs, lows, closes, atc_out,
    side_out, equity_out, trades, trade_entry_times, n_closed,
):  # fmt: skip
    """One round of ``paper_cpu.strategy_step``, launched after the round's
    ``step_kernel`` with its plan, inputs and output rows: thread ``k - start`` steps
    every strategy of slot ``plan[k]`` on update ``u = plan[m + k]``'s bar and row."""
    k = start + cuda.grid(1)  # type: ignore[call-arg]
    if k < stop:
        u = plan[m + k]
        slot_strategies(
            sv, sc, entry_times, spv, spi, counters, ready_bars, plan[k], times[u],
            opens[u], highs[u], lows[u], closes[u], atc_out, u,
            u, side_out, equity_out, trades, trade_entry_times, n_closed,
        )  # fmt: skip


@_kernel
def paper_warmup_kernel(
    sv, sc, entry_times, spv, spi, counters, ready_bars, ints, n,
    times, opens, highs, lows, closes, atc_out,
    side_out, equity_out, trades, trade_entry_times, n_closed,
):  # fmt: skip
    """``paper_cpu.strategy_warmup`` after ``warmup_kernel`` kept every bar's output
    rows: thread ``s`` runs history row ``s`` (slot ``ints[s]``, ``ints[n + s]`` bars)."""
    s: int = cuda.grid(1)  # type: ignore[call-arg]
    if s < n:
        width = times.shape[1]
        for t in range(ints[n + s]):
            slot_strategies(
                sv, sc, entry_times, spv, spi, counters, ready_bars, ints[s], times[s, t],
                opens[s, t], highs[s, t], lows[s, t], closes[s, t], atc_out, s * width + t,
                s, side_out, equity_out, trades, trade_entry_times, n_closed,
            )  # fmt: skip


@_kernel
def reset_cells_kernel(floats, ints):
    """The strategy outputs before a step: floats NaN, ints 0 (``strategy_outputs``)."""
    i: int = cuda.grid(1)  # type: ignore[call-arg]
    if i < floats.shape[0]:
        floats[i] = math.nan
    if i < ints.shape[0]:
        ints[i] = 0


#: per output cell: equity and the trades (floats); side, n_closed, entry times (ints)
CELL_FLOATS = 1 + MAX_TRADES_PER_BAR * N_TRADE_FIELDS
CELL_INTS = 2 + MAX_TRADES_PER_BAR


def cell_views(floats: Any, ints: Any, n_cells: int) -> dict[str, Any]:
    """``strategy_outputs``' arrays as views of one float and one int block (device or
    host arrays): one copy each way."""
    c = n_cells
    return {
        "side": ints[:c],
        "equity": floats[:c],
        "trades": floats[c : c * CELL_FLOATS].reshape((c, MAX_TRADES_PER_BAR, N_TRADE_FIELDS)),
        "trade_entry_times": ints[2 * c : c * CELL_INTS].reshape((c, MAX_TRADES_PER_BAR)),
        "n_closed": ints[c : 2 * c],
    }


def paper_signatures() -> dict[str, tuple[Any, tuple]]:
    """The paper kernels and the scatters of strategy rows, with their launch types
    (for their PTX check, as ``cuda_kernels.kernel_signatures``)."""
    from numba import types as nt

    f1, f2, f3 = (nt.Array(nt.float64, d, "C") for d in (1, 2, 3))
    i1, i2 = (nt.Array(nt.int64, d, "C") for d in (1, 2))
    counters = nt.Array(nt.int64, 2, "F")  # the ATC state's, F order on the device
    i64 = nt.int64
    table = (f2, i2, i1, f2, i2, counters, i1)
    outputs = (i1, f1, f3, i2, i1)
    step = (*table, i1, i64, i64, i64, i1, f1, f1, f1, f1, f2, *outputs)
    warmup = (*table, i1, i64, i2, f2, f2, f2, f2, f2, *outputs)
    return {
        "paper_step_kernel": (paper_step_kernel, step),
        "paper_warmup_kernel": (paper_warmup_kernel, warmup),
        "reset_cells_kernel": (reset_cells_kernel, (f1, i1)),
        "scatter_rows_kernel(strategy)": (scatter_rows_kernel, (f2, i1, f2)),
        "scatter_rows_kernel(strategy int64)": (scatter_rows_kernel, (i2, i1, i2)),
    }


_STATE = ("strategy_values", "strategy_counters", "strategy_entry_times")
#: the output arrays in the paper kernels' argument order
_CELLS = ("side", "equity", "trades", "trade_entry_times", "n_closed")


class DeviceStrategies:
    """A ``StateStore``'s strategy state on the device, authoritative there; the store's
    strategy arrays are its host mirror, brought current by ``pull``. ``DeviceState``
    calls ``push``/``pull``/``upload_slots``/``merge_into_store`` with its own; the
    backend queues the paper kernels after its ATC kernels (``launch_round``,
    ``launch_warmup``) with the inputs and output cells in pinned staging blocks."""

    def __init__(
        self,
        store: StateStore,
        stream: Any,
        launch: Callable[..., None],
        staging: Callable[[Any], Staging],
    ) -> None:
        self.store = store
        self.stream = stream
        self._launch = launch
        self._dev: dict[str, Any] | None = None
        self._prices = staging(np.float64)  # a step's opens, highs, lows
        self._cell_floats = staging(np.float64)
        self._cell_ints = staging(np.int64)
        self._n_rows = 0
        self._n_cells = 0
        self._cells: tuple[Any, ...] = ()

    def free(self) -> None:
        self._dev = None

    def push(self) -> None:
        """Upload the store's strategy state and table (nothing without strategies)."""
        s = self.store
        if not len(s.strategies):
            self._dev = None
            return
        dev = {name: cuda.to_device(getattr(s, name), stream=self.stream) for name in _STATE}
        dev["spv"] = cuda.to_device(s.strategies.values, stream=self.stream)
        dev["spi"] = cuda.to_device(s.strategies.ints, stream=self.stream)
        ready_bars = s.params.ready_bars if len(s.params) else np.zeros(1, np.int64)
        dev["ready_bars"] = cuda.to_device(ready_bars, stream=self.stream)
        self._dev = dev

    def _download(self) -> dict[str, np.ndarray]:
        assert self._dev is not None
        host = {name: self._dev[name].copy_to_host(stream=self.stream) for name in _STATE}
        self.stream.synchronize()
        return host

    def pull(self) -> None:
        """Copy the device strategy state into the store's arrays."""
        if self._dev is None:
            return
        for name, values in self._download().items():
            np.copyto(getattr(self.store, name)[: values.shape[0]], values)

    def merge_into_store(self, keep: np.ndarray) -> None:
        """Before a relayout's push: the device rows of slots ``keep`` into the store
        (whose rows were copied from a stale host mirror)."""
        if self._dev is None:
            return
        rows = self._rows(keep)
        for name, values in self._download().items():
            getattr(self.store, name)[rows] = values[rows]

    def _rows(self, slots: np.ndarray) -> np.ndarray:
        n = len(self.store.strategies)
        return (np.asarray(slots, np.int64)[:, None] * n + np.arange(n)).ravel()

    def upload_slots(self, slots: np.ndarray) -> None:
        """The strategy rows of slots (re)initialised on the host, to the device."""
        if self._dev is None:
            return
        s, d = self.store, self._dev
        rows = self._rows(slots)
        dev_rows = cuda.to_device(rows, stream=self.stream)
        for name in _STATE:
            host = np.ascontiguousarray(getattr(s, name)[rows].reshape(rows.shape[0], -1))
            target = d[name] if d[name].ndim == 2 else d[name].reshape(d[name].shape[0], 1)
            src = cuda.to_device(host, stream=self.stream)
            self._launch(scatter_rows_kernel, rows.shape[0], target, dev_rows, src)
        self.stream.synchronize()

    def _table(self, counters: Any) -> tuple[Any, ...]:
        """The paper kernels' leading arguments (``counters``: the ATC state's)."""
        d = self._dev
        assert d is not None, "push() first"
        return (*(d[name] for name in (*_STATE, "spv", "spi")), counters, d["ready_bars"])

    # -- a step or warmup's strategy outputs: two pinned blocks, one copy back each -------

    def enqueue_reset_cells(self, n_rows: int) -> None:
        """Room for the output cells of ``n_rows`` updates or history rows, reset on
        the device (``strategy_outputs``' values) by a launch on the stream."""
        n_cells = n_rows * len(self.store.strategies)
        self._n_rows = n_rows
        self._cell_floats.reserve(n_cells * CELL_FLOATS)
        self._cell_ints.reserve(n_cells * CELL_INTS)
        self._n_cells = n_cells
        floats = self._cell_floats.device[: n_cells * CELL_FLOATS]
        ints = self._cell_ints.device[: n_cells * CELL_INTS]
        self._launch(reset_cells_kernel, n_cells * CELL_FLOATS, floats, ints)
        views = cell_views(self._cell_floats.device, self._cell_ints.device, n_cells)
        self._cells = tuple(views[name] for name in _CELLS)

    def enqueue_download_cells(self) -> None:
        """Copy the output cells back (two copies on the stream)."""
        self._cell_floats.download(self._n_cells * CELL_FLOATS, self.stream)
        self._cell_ints.download(self._n_cells * CELL_INTS, self.stream)

    def cells(self) -> dict[str, np.ndarray]:
        """After the stream synchronised: the output cells, copied out of the pinned
        blocks (reused by the next call)."""
        views = cell_views(self._cell_floats.host, self._cell_ints.host, self._n_cells)
        return {name: np.array(views[name]) for name in strategy_outputs(0)}

    # -- launches ----------------------------------------------------------------------------

    def stage_step(self, ohlc: tuple[np.ndarray, ...]) -> None:
        """A step's opens, highs and lows into one pinned block (no copy yet)."""
        n = ohlc[0].shape[0]
        self._prices.reserve(3 * n)
        for k, values in enumerate(ohlc):
            self._prices.host[k * n : (k + 1) * n] = values

    def enqueue_step_inputs(self, n: int) -> None:
        """Upload the staged prices of ``n`` updates (one copy) and reset their cells."""
        self._prices.upload(3 * n, self.stream)
        self.enqueue_reset_cells(n)

    def launch_round(
        self, counters, plan, m: int, start: int, stop: int, times, closes, atc_out
    ) -> None:  # fmt: skip
        """``paper_step_kernel`` over plan entries ``[start, stop)`` of the step whose
        inputs and output rows are on the device (``enqueue_step_inputs`` first)."""
        n, p = self._n_rows, self._prices.device
        self._launch(
            paper_step_kernel, stop - start, *self._table(counters), plan, m, start, stop,
            times, p[:n], p[n : 2 * n], p[2 * n : 3 * n], closes, atc_out, *self._cells,
        )  # fmt: skip

    def launch_warmup(self, counters, ints, n: int, times, prices, closes, atc_out) -> None:
        """``paper_warmup_kernel`` over ``n`` history rows after the ATC warmup kept
        every bar's output rows ``atc_out`` (``enqueue_reset_cells(n)`` first)."""
        o, h, lo = prices
        self._launch(
            paper_warmup_kernel, n, *self._table(counters), ints, n, times, o, h, lo, closes,
            atc_out, *self._cells,
        )  # fmt: skip
