"""Step I/O of the CUDA backend: pinned staging, two alternating buffer sets, pending
steps, and the optional CUDA graph of the steady step.

Double buffering. A step's host-side inputs (times, closes) and outputs (all rows, or
the packed requested columns and event bytes) live in one of two ``IoSet``s of pinned
host + device buffers, used alternately. ``CudaBackend.step_outputs_async`` fills set
``k % 2``, enqueues the copies and kernels on the backend's stream, commits the
counters on the host and returns a ``PendingOutputs`` without waiting; the host can
then validate, plan and stage step ``k + 1`` into the other set while step ``k``'s
copies and kernels are still in flight. Before a set is reused, the step that last
used it is waited for and its outputs copied out of the pinned buffers (so a pending
result stays valid however many steps follow). Device order is the stream's order, so
the results are those of the one-step-at-a-time path, bit for bit.

CUDA graph (optional, ``CudaBackend(cuda_graph=True)``). numba-cuda has no graph API;
CuPy does (``cupy.cuda.Stream.begin_capture`` / ``end_capture`` -> ``Graph.launch``).
With a graph the backend's numba stream is ``cuda.external_stream`` over a CuPy
stream, and the steady step (one round, the cached device plan, requested outputs) is
captured once per (buffer set, size, outputs, buffer layout): the two input uploads,
the step kernel, the packing kernel and the two downloads. Later steady steps copy
their inputs into the same pinned buffers and launch the graph: one driver call
instead of six. Any reallocation a graph refers to (a buffer grown, the state pushed,
the growth table extended) bumps ``StepGraphs.epoch`` and drops the graphs. A capture
that fails (no CuPy, the simulator, a driver that refuses) turns graphs off with one
warning and the step runs the ordinary launches.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
from numba import cuda

log = logging.getLogger("atc_stream")


class Staging:
    """A pinned host buffer and a device buffer of one dtype, grown by doubling.

    ``on_grow`` is called after a reallocation (device pointers changed: CUDA graphs
    that captured the old ones are stale).
    """

    def __init__(self, device_empty: Callable, dtype, on_grow: Callable[[], None]) -> None:
        self._device_empty = device_empty
        self._on_grow = on_grow
        self.dtype = np.dtype(dtype)
        self.size = 0
        self.host = None
        self.device = None

    def reserve(self, size: int) -> None:
        if size <= self.size:
            return
        size = max(size, 2 * self.size, 1024)
        self.host = cuda.pinned_array(size, self.dtype)
        self.device = self._device_empty(size, self.dtype)
        self.size = size
        self._on_grow()

    def upload(self, size: int, stream) -> None:
        if size:
            self.device[:size].copy_to_device(self.host[:size], stream=stream)

    def download(self, size: int, stream) -> None:
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


class PendingOutputs:
    """A submitted step: ``wait()`` returns its outputs (typed fields, or all rows)."""

    def __init__(self, read: Callable[[], object], event=None, io: IoSet | None = None) -> None:
        self._read = read
        self._event = event
        self._io = io
        self._value = None
        self._done = False

    @classmethod
    def ready(cls, value) -> PendingOutputs:
        pending = cls(lambda: value)
        pending.wait()
        return pending

    def wait(self):
        """Block until the step's copies are done; copy its outputs out (once)."""
        if not self._done:
            if self._event is not None:
                self._event.synchronize()
            self._value = self._read()
            self._done = True
            self._read = None
            if self._io is not None and self._io.pending is self:
                self._io.pending = None
        return self._value


class StepGraphs:
    """Captured CUDA graphs of the steady step, by key; see the module docstring."""

    def __init__(self, cupy_stream) -> None:
        self.stream = cupy_stream
        self.epoch = 0
        self.failed = False
        self.captures = 0
        self.launches = 0
        self._graphs: dict[tuple, object] = {}

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

    def _capture(self, enqueue: Callable[[], None]):
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
