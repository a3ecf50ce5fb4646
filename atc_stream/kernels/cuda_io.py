"""Step I/O of the CUDA backend: pinned staging, two alternating buffer sets, pending
steps, and the optional CUDA graph of the steady step.

Design: docs/design/cuda.md, "Double buffering" and "CUDA graph".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numba import cuda

from atc_stream.core import schema
from atc_stream.core.output_row import N_OUT
from atc_stream.kernels import cuda_simulated

log = logging.getLogger("atc_stream")


def import_cupy() -> Any:
    """CuPy, or None under the simulator or where it is not installed or cannot run."""
    if cuda_simulated():
        return None
    try:
        import cupy
    except Exception:  # not installed, or no usable CUDA runtime for it
        return None
    return cupy


class Staging:
    """A pinned host buffer and a device buffer of one dtype, grown by doubling.

    ``on_grow`` is called after a reallocation (device pointers changed: CUDA graphs
    that captured the old ones are stale).
    """

    def __init__(self, device_empty: Callable, dtype: Any, on_grow: Callable[[], None]) -> None:
        self._device_empty = device_empty
        self._on_grow = on_grow
        self.dtype = np.dtype(dtype)
        self.size = 0
        self._host: np.ndarray | None = None
        self._device: Any = None

    @property
    def host(self) -> np.ndarray:
        """The pinned host buffer (``reserve`` first)."""
        assert self._host is not None, "Staging.reserve() was not called"
        return self._host

    @property
    def device(self) -> Any:
        """The device buffer, a numba device array (``reserve`` first)."""
        assert self._device is not None, "Staging.reserve() was not called"
        return self._device

    def reserve(self, size: int) -> None:
        if size <= self.size:
            return
        size = max(size, 2 * self.size, 1024)
        self._host = cuda.pinned_array(size, self.dtype)
        self._device = self._device_empty(size, self.dtype)
        self.size = size
        self._on_grow()

    def upload(self, size: int, stream: Any) -> None:
        if size:
            self.device[:size].copy_to_device(self.host[:size], stream=stream)

    def download(self, size: int, stream: Any) -> None:
        if size:
            self.device[:size].copy_to_host(self.host[:size], stream=stream)


class IoSet:
    """One set of a step's buffers: host-order inputs, output rows, packed outputs."""

    def __init__(self, index: int, device_empty: Callable, on_grow: Callable[[], None]) -> None:
        self.index = index
        self.times = Staging(device_empty, np.int64, on_grow)
        self.closes = Staging(device_empty, np.float64, on_grow)
        self.out = Staging(device_empty, np.float64, on_grow)  # rows [u, OUT_*] (device)
        self.packed = Staging(device_empty, np.float64, on_grow)  # requested float columns
        self.flags = Staging(device_empty, np.uint8, on_grow)  # long, short: a byte each
        #: the step whose outputs are (being) copied into this set, until it is waited for
        self.pending: PendingOutputs | None = None

    def reserve(self, n: int, n_out: int, k: int) -> None:
        """Room for ``n`` updates: inputs, ``n_out`` output columns, ``k`` packed floats."""
        self.times.reserve(n)
        self.closes.reserve(n)
        self.out.reserve(n * n_out)
        self.packed.reserve(n * max(k, 1))
        self.flags.reserve(2 * n)

    def stage(self, times: np.ndarray, closes: np.ndarray) -> None:
        """The step's inputs into the pinned buffers (host memcpys; uploads come later)."""
        n = times.shape[0]
        self.times.host[:n] = times
        self.closes.host[:n] = closes

    def rows(self, n: int, order: np.ndarray) -> np.ndarray:
        """A copy of the pinned output rows (the buffer is reused); rows of updates not
        in ``order`` (rejected) NaN."""
        result = self.out.host[: n * N_OUT].reshape((n, N_OUT)).copy()
        if order.shape[0] != n:
            rejected = np.ones(n, np.bool_)
            rejected[order] = False
            result[rejected] = np.nan
        return result

    def fields(
        self,
        n: int,
        groups: Sequence[str],
        layout: list[tuple[str, int, int]],
        bar_index: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """The typed fields of ``groups``, copied out of the pinned buffers (reused):
        one contiguous block per float field (``layout``: ``pack_layout(groups)[1]``)."""
        fields = {"bar_index": bar_index}
        packed = self.packed.host
        for name, c0, width in layout:
            block = packed[n * c0 : n * (c0 + width)]
            fields[name] = block.copy() if width == 1 else block.reshape(n, width).copy()
        if "events" in groups:
            flags = self.flags.host[: 2 * n].view(np.bool_)
            fields["long"] = flags[:n].copy()
            fields["short"] = flags[n:].copy()
        return fields


def empty_fields(n: int, groups: Sequence[str], bar_index: np.ndarray) -> dict[str, np.ndarray]:
    """Typed fields of ``groups`` for ``n`` rows none of which holds a result."""
    return schema.kernel_fields(np.full((n, N_OUT), np.nan), groups) | {"bar_index": bar_index}


class PendingOutputs:
    """A submitted step: ``wait()`` returns its outputs (typed fields, or all rows)."""

    def __init__(self, read: Callable[[], Any], event: Any = None, io: IoSet | None = None) -> None:
        self._read: Callable[[], Any] | None = read  # None once read
        self._event = event
        self._io = io
        self._value: Any = None

    @classmethod
    def ready(cls, value: Any) -> PendingOutputs:
        pending = cls(lambda: value)
        pending.wait()
        return pending

    def wait(self) -> Any:
        """Block until the step's copies are done; copy its outputs out (once)."""
        read = self._read
        if read is not None:
            if self._event is not None:
                self._event.synchronize()
            self._value = read()
            self._read = None
            if self._io is not None and self._io.pending is self:
                self._io.pending = None
        return self._value


class StepGraphs:
    """Captured CUDA graphs of the steady step, by key; see the module docstring."""

    def __init__(self, cupy_stream: Any) -> None:
        self.stream = cupy_stream
        self.epoch = 0
        self.failed = False
        self.captures = 0
        self.launches = 0
        self._graphs: dict[tuple, Any] = {}

    def invalidate(self) -> None:
        """Buffers a graph may refer to were reallocated: drop every graph."""
        self.epoch += 1
        self._graphs.clear()

    def run(self, key: tuple, enqueue: Callable[[], None]) -> bool:
        """Launch the graph of ``key`` (capturing ``enqueue`` first if new); False when
        graphs are off or the capture failed (the caller then runs ``enqueue`` itself)."""
        if self.failed:
            return False
        key = (self.epoch, *key)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._capture(enqueue)
            if graph is None:
                return False
            self._graphs[key] = graph
        graph.launch(self.stream)
        self.launches += 1
        return True

    def _capture(self, enqueue: Callable[[], None]) -> Any:
        stream = self.stream
        try:
            stream.begin_capture()
            try:
                enqueue()
            finally:
                graph = stream.end_capture()
        except Exception as exc:  # the driver refused an operation, or CuPy is too old
            self.fail(f"capturing the step failed ({type(exc).__name__}: {exc})")
            return None
        self.captures += 1
        return graph

    def fail(self, why: str) -> None:
        self.failed = True
        self._graphs.clear()
        log.warning("CUDA graph of the steady step disabled: %s; using ordinary launches", why)


def make_graphs(cupy: Any) -> tuple[StepGraphs, Any] | None:
    """The steady step's graphs and the numba stream over their CuPy stream; None (and one
    warning) where graphs cannot run: they need CuPy's stream capture on a real device."""
    if cuda_simulated() or cupy is None:
        why = "the CUDA simulator" if cuda_simulated() else "CuPy is not installed"
        log.warning(
            "cuda_graph=True: CUDA graphs need CuPy on a real device (%s here); "
            "using ordinary launches",
            why,
        )
        return None
    try:
        cupy_stream = cupy.cuda.Stream(non_blocking=True)
        stream = cuda.external_stream(cupy_stream.ptr)
    except Exception as exc:  # an old CuPy, a driver without capture
        log.warning("cuda_graph=True: no capturable stream (%s); using ordinary launches", exc)
        return None
    return StepGraphs(cupy_stream), stream
