"""The strategy step of live streams on the GPU: ``paper_cpu.live_bar`` over
``kernels/strategy.py`` device functions, on strategy state kept on the device.

Design: docs/design/cuda.md, "Strategies".
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda

from atc_stream.kernels import cuda_simulated, paper_cpu
from atc_stream.kernels.backtest_cuda import device_strategy
from atc_stream.kernels.cuda_kernels import scatter_rows_kernel
from atc_stream.kernels.paper_cpu import strategy_outputs
from atc_stream.state.arrays import StateStore

_kernel = cuda.jit if cuda_simulated() else cuda.jit(lto=False)  # type: ignore[call-arg]


def _on_device(function: Any, **device_functions: Any) -> Any:
    """``function`` (a CPU dispatcher's Python source) compiled as a device function
    whose calls of ``device_functions``' names go to those device functions: one source
    for both backends."""
    source = function.py_func
    namespace = {**source.__globals__, **device_functions}
    clone = types.FunctionType(source.__code__, namespace, source.__name__)
    return cuda.jit(device=True)(clone)


live_bar = _on_device(paper_cpu.live_bar, strategy_bar=device_strategy.strategy_bar)
slot_strategies = _on_device(paper_cpu.slot_strategies, live_bar=live_bar)


@_kernel
def paper_step_kernel(
    sv, sc, entry_times, spv, spi, slots, order, start, stop, times, opens, highs, lows,
    closes, ready, longs, shorts, side_out, equity_out, trades, trade_entry_times, n_closed,
):  # fmt: skip
    """One round of ``paper_cpu.strategy_step``: thread ``q - start`` steps every
    strategy of update ``order[q]``'s slot."""
    q = start + cuda.grid(1)  # type: ignore[call-arg]
    if q < stop:
        u = order[q]
        slot_strategies(
            sv, sc, entry_times, spv, spi, slots[u], times[u],
            opens[u], highs[u], lows[u], closes[u], ready[u], longs[u], shorts[u],
            u, side_out, equity_out, trades, trade_entry_times, n_closed,
        )  # fmt: skip


@_kernel
def paper_warmup_kernel(
    sv, sc, entry_times, spv, spi, slots, times, opens, highs, lows, closes, counts,
    ready, longs, shorts, side_out, equity_out, trades, trade_entry_times, n_closed,
):  # fmt: skip
    """``paper_cpu.strategy_warmup``: thread ``s`` runs history row ``s``."""
    s: int = cuda.grid(1)  # type: ignore[call-arg]
    if s < slots.shape[0]:
        for t in range(counts[s]):
            slot_strategies(
                sv, sc, entry_times, spv, spi, slots[s], times[s, t],
                opens[s, t], highs[s, t], lows[s, t], closes[s, t],
                ready[s, t], longs[s, t], shorts[s, t],
                s, side_out, equity_out, trades, trade_entry_times, n_closed,
            )  # fmt: skip


def paper_signatures() -> dict[str, tuple[Any, tuple]]:
    """The paper kernels and the scatters of strategy rows, with their launch types
    (for their PTX check, as ``cuda_kernels.kernel_signatures``)."""
    from numba import types as nt

    f1, f2, f3 = (nt.Array(nt.float64, d, "C") for d in (1, 2, 3))
    i1, i2 = (nt.Array(nt.int64, d, "C") for d in (1, 2))
    b1, b2 = (nt.Array(nt.boolean, d, "C") for d in (1, 2))
    table = (f2, i2, i1, f2, i2)
    outputs = (i1, f1, f3, i2, i1)
    step = (*table, i1, i1, nt.int64, nt.int64, i1, f1, f1, f1, f1, b1, b1, b1, *outputs)
    warmup = (*table, i1, i2, f2, f2, f2, f2, i1, b2, b2, b2, *outputs)
    return {
        "paper_step_kernel": (paper_step_kernel, step),
        "paper_warmup_kernel": (paper_warmup_kernel, warmup),
        "scatter_rows_kernel(strategy)": (scatter_rows_kernel, (f2, i1, f2)),
        "scatter_rows_kernel(strategy int64)": (scatter_rows_kernel, (i2, i1, i2)),
    }


_STATE = ("strategy_values", "strategy_counters", "strategy_entry_times")


class DeviceStrategies:
    """A ``StateStore``'s strategy state on the device, authoritative there; the store's
    strategy arrays are its host mirror, brought current by ``pull``. ``DeviceState``
    calls ``push``/``pull``/``upload_slots``/``merge_into_store`` with its own."""

    def __init__(self, store: StateStore, stream: Any, launch: Callable[..., None]) -> None:
        self.store = store
        self.stream = stream
        self._launch = launch
        self._dev: dict[str, Any] | None = None

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

    def _table(self) -> tuple[Any, ...]:
        d = self._dev
        assert d is not None, "push() first"
        return tuple(d[name] for name in (*_STATE, "spv", "spi"))

    def _to_device(self, *arrays: np.ndarray) -> list[Any]:
        return [cuda.to_device(np.ascontiguousarray(a), stream=self.stream) for a in arrays]

    def _outputs(self, n_cells: int) -> tuple[dict[str, np.ndarray], list[Any]]:
        host = strategy_outputs(n_cells)
        return host, self._to_device(*host.values())

    def _collect(self, host: dict[str, np.ndarray], dev: list[Any]) -> dict[str, np.ndarray]:
        for values, array in zip(host.values(), dev, strict=True):
            array.copy_to_host(values, stream=self.stream)
        self.stream.synchronize()
        return host

    def step(
        self, slots, times, opens, highs, lows, closes, ready, longs, shorts, order, round_starts
    ) -> dict[str, np.ndarray]:
        """``paper_cpu.run_strategy_step`` on the device state, one launch per round."""
        n_cells = slots.shape[0] * len(self.store.strategies)
        if order.shape[0] == 0:
            return strategy_outputs(n_cells)
        host, out = self._outputs(n_cells)
        ids = self._to_device(slots, order)
        bars = self._to_device(times, opens, highs, lows, closes, ready, longs, shorts)
        for r in range(round_starts.shape[0] - 1):
            a, b = int(round_starts[r]), int(round_starts[r + 1])
            self._launch(paper_step_kernel, b - a, *self._table(), *ids, a, b, *bars, *out)
        return self._collect(host, out)

    def warmup(
        self, slots, times, opens, highs, lows, closes, counts, ready, longs, shorts
    ) -> dict[str, np.ndarray]:
        """``paper_cpu.run_strategy_warmup`` on the device state, one thread per row."""
        n_cells = slots.shape[0] * len(self.store.strategies)
        if n_cells == 0:
            return strategy_outputs(n_cells)
        host, out = self._outputs(n_cells)
        args = self._to_device(
            slots, times, opens, highs, lows, closes, counts, ready, longs, shorts
        )
        self._launch(paper_warmup_kernel, slots.shape[0], *self._table(), *args, *out)
        return self._collect(host, out)
