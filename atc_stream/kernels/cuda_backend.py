"""``CudaBackend``: the CUDA kernels on device-resident state, the CPU backend's interface.

Design (state mirror, transfers, plans): docs/design/cuda.md.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import cuda

from atc_stream.core.output_row import N_OUT
from atc_stream.kernels import cuda_simulated
from atc_stream.kernels.backend import Ohlc
from atc_stream.kernels.cuda_host import build_plan, pack_warmup, plan_in_order
from atc_stream.kernels.cuda_io import (
    IoSet,
    PendingOutputs,
    Staging,
    StepGraphs,
    empty_fields,
    import_cupy,
    make_graphs,
)
from atc_stream.kernels.cuda_kernels import (
    kernel_signatures,
    last_rows_kernel,
    local_warmup_kernel,
    pack_layout,
    pack_outputs_kernel,
    preview_kernel,
    step_kernel,
    transpose_kernel,
    warmup_kernel,
)
from atc_stream.kernels.cuda_launch import Launches
from atc_stream.kernels.cuda_paper import CELL_FLOATS, CELL_INTS, paper_signatures
from atc_stream.kernels.cuda_state import DeviceState
from atc_stream.kernels.paper_cpu import strategy_outputs
from atc_stream.kernels.ptx_guard import FmaContractionError, check_no_fma, no_fma
from atc_stream.state.arrays import StateStore, lane_blocks
from atc_stream.state.layout import BAR_INDEX, LANES, N_COUNTER_FIELDS, N_VALUE_FIELDS

log = logging.getLogger("atc_stream")

#: Threads per block of every launch unless ``CudaBackend(threads_per_block=...)`` says
#: otherwise: a conservative choice for register-heavy kernels; tune it with
#: ``benchmarks/bench_cuda.py --threads`` on a GPU.
THREADS_PER_BLOCK = 128
#: The local-state warmup keeps a stream's ring in a ``cuda.local.array``; above this
#: many ring columns (2 x (longest length + 1)) the global-state kernel is used.
LOCAL_RING_MAX_COLUMNS = 512


def _launch_shape(count: int, threads: int = THREADS_PER_BLOCK) -> tuple[int, int]:
    if cuda_simulated():  # one Python thread per CUDA thread: do not start idle ones
        threads = max(1, min(threads, count))
    return (count + threads - 1) // threads, threads


class CudaBackend:
    """Runs the CUDA kernels on device-resident state; a ``kernels.backend.Backend``.

    ``step``/``preview``/``warmup`` take and return host arrays, exactly like the CPU
    backend (float64 only). ``pull_state``/``push_state`` move the whole state between
    the device and the store's host arrays; ``close`` frees the device memory.

    Code that writes the store's host arrays directly (a restore) must call
    ``push_state`` afterwards; slot (re)initialisation and store growth are detected.
    """

    name = "cuda"
    #: streams per warmup launch: enough threads to fill a large GPU
    warmup_chunk = 131_072
    #: device bytes one warmup launch may use for histories and outputs (chunked to fit)
    warmup_memory_budget = 2 << 30

    def __init__(
        self,
        store: StateStore,
        *,
        warmup_state: str = "global",
        threads_per_block: int = THREADS_PER_BLOCK,
        precompile: bool = True,
        cuda_graph: bool = False,
    ) -> None:
        if warmup_state not in ("local", "global"):
            raise ValueError(f"warmup_state must be 'local' or 'global', got {warmup_state!r}")
        if not (isinstance(threads_per_block, int) and 32 <= threads_per_block <= 1024) or (
            threads_per_block % 32
        ):
            raise ValueError(
                "threads_per_block must be a multiple of 32 in [32, 1024], "
                f"got {threads_per_block!r}"
            )
        self.store = store
        #: threads per block of every launch: a tuning parameter (benchmarks/bench_cuda.py)
        self.threads_per_block = threads_per_block
        #: "global": warmup updates the F-order state in place; "local": in per-thread
        #: local arrays (``local_warmup_kernel``; see there why it is not the default)
        self.warmup_state = warmup_state
        self._cupy = import_cupy()
        self.stream: Any = cuda.stream()
        #: the CUDA graph of the steady step (``cuda_graph=True``; None: off or unavailable)
        self.graphs: StepGraphs | None = None
        if cuda_graph:
            made = make_graphs(self._cupy)
            if made is not None:
                self.graphs, self.stream = made
        self._launches = Launches(self.stream)
        self._ints = self._staging(np.int64)
        self._floats = self._staging(np.float64)
        self._warm_out = self._staging(np.float64)  # warmup output rows
        self._plan = self._staging(np.int64)  # step plan: slots, then host positions
        self._preview_plan = self._staging(np.int64)
        self._history = self._staging(np.float64)  # warmup closes before the transpose
        # step/preview inputs and outputs: two sets, used alternately (cuda_io.py)
        self._io = [IoSet(i, self._device_empty, self._buffers_moved) for i in (0, 1)]
        self._next_io = 0
        #: the slots of the last fully accepted one-round step, whose plan is on the device
        self._plan_slots: np.ndarray | None = None
        self._where = np.zeros(0, np.int64)
        #: the device copy of the store's state (``cuda_state.py``)
        self.state = DeviceState(
            store, self.stream, self._device_empty, self._staging, self._launch, self._drain,
            self._buffers_moved,
        )  # fmt: skip
        self._scratch: types.SimpleNamespace | None = None
        self._local_failed: set[int] = set()
        #: with ``time_kernels``, each step/preview/warmup stores the device time of its
        #: kernels (CUDA events on the backend's stream) in ``last_kernel_seconds``
        self.time_kernels = False
        self.last_kernel_seconds: float | None = None
        # requested outputs (``step_outputs``): packed floats and event bytes
        self._packed_groups: tuple[str, ...] | None = None
        self._packed_columns = None  # device: ``pack_layout`` spec of those groups
        self._packed_k = 0
        self._packed_fields: list[tuple[str, int, int]] = []
        if precompile:
            self.precompile()

    def precompile(self) -> None:
        """Compile (and check for FMA) every kernel specialisation a step, preview or
        warmup launches (with strategies, the paper kernels too), so that none compiles
        inside a live step. The local-state warmup kernel is compiled and checked at its
        first launch; the simulator compiles nothing.
        """
        if cuda_simulated():
            return
        signatures = kernel_signatures(local_ring_columns=None)
        if len(self.store.strategies):
            signatures.update(paper_signatures())
        for name, (kernel, argtypes) in signatures.items():
            with no_fma():
                kernel.compile(argtypes)
            check_no_fma(kernel, name)

    # -- device arrays ---------------------------------------------------------------------

    def _staging(self, dtype) -> Staging:
        return Staging(self._device_empty, dtype, self._buffers_moved)

    def _buffers_moved(self) -> None:
        """A device buffer was (re)allocated: CUDA graphs that captured it are stale."""
        if self.graphs is not None:
            self.graphs.invalidate()

    def _take_io(self) -> IoSet:
        """The next buffer set; the step that last used it is waited for first."""
        io = self._io[self._next_io]
        self._next_io ^= 1
        if io.pending is not None:
            io.pending.wait()
        return io

    def _drain(self) -> None:
        """Wait for every submitted step (their outputs are copied out)."""
        for io in self._io:
            if io.pending is not None:
                io.pending.wait()

    def _device_empty(self, shape, dtype, order: str = "C"):
        if self._cupy is not None:
            # CuPy's pool allocates; a numba view keeps one code path for copies/launches
            return cuda.as_cuda_array(self._cupy.empty(shape, dtype, order=order))
        return cuda.device_array(shape, dtype, order=order)

    def _launch(self, kernel, count: int, *args) -> None:
        if count <= 0:
            return
        blocks, threads = _launch_shape(count, self.threads_per_block)
        launch = self._launches(kernel, blocks, threads)
        with no_fma():
            launch(*args)
        check_no_fma(kernel)  # a specialisation compiled by this launch is read once

    def _timer_start(self):
        if not self.time_kernels:
            return None
        start = cuda.event()
        start.record(self.stream)
        return start

    def _timer_stop(self, start):
        if start is None:
            return None
        end = cuda.event()
        end.record(self.stream)
        return start, end

    def _timer_read(self, events) -> None:
        """After the stream synchronised: the kernels' device time in seconds."""
        if events is not None:
            self.last_kernel_seconds = events[0].elapsed_time(events[1]) / 1e3

    def close(self) -> None:
        """Free the device state (the host arrays keep whatever was last pulled)."""
        self._drain()
        self._buffers_moved()
        self.state.free()
        self._scratch = None

    # -- host <-> device -----------------------------------------------------------------

    def push_state(self) -> None:
        """Upload the store's host arrays (the whole state and the parameter table)."""
        self.state.push()

    def pull_state(self) -> None:
        """Copy the device state into the store's host arrays (the host mirror)."""
        self.state.pull()

    # -- the backend interface -------------------------------------------------------------

    def step(
        self,
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        order: np.ndarray,
        round_starts: np.ndarray,
    ) -> np.ndarray:
        """Apply planned rounds (``batch.plan_rounds``); row ``u`` of the result is update u.

        Every output column comes back (rows ``[u, OUT_*]``, rejected rows NaN);
        ``step_outputs`` copies back only requested ones.
        """
        n, m = slots.shape[0], order.shape[0]
        if m == 0:
            return np.full((n, N_OUT), np.nan)
        bar_index = np.empty(n, np.int64)
        return self._submit_step(slots, times, closes, order, round_starts, None, bar_index).wait()

    def step_outputs(
        self,
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        order: np.ndarray,
        round_starts: np.ndarray,
        groups: Sequence[str],
    ) -> dict[str, np.ndarray]:
        """``step`` returning only the typed fields of output ``groups``
        (``schema.kernel_fields``); only those are copied back from the device.
        Fields of rejected rows are unspecified (the engine drops those rows)."""
        return self.step_outputs_async(slots, times, closes, order, round_starts, groups).wait()

    def step_outputs_async(
        self,
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        order: np.ndarray,
        round_starts: np.ndarray,
        groups: Sequence[str],
    ) -> PendingOutputs:
        """``step_outputs`` without waiting: the state and host counters advance now, the
        outputs are ``.wait()``-ed for. Two steps may be in flight (``cuda_io.py``)."""
        n, m = slots.shape[0], order.shape[0]
        bar_index = np.full(n, -1, np.int64)
        if m == 0:
            return PendingOutputs.ready(empty_fields(n, groups, bar_index))
        return self._submit_step(slots, times, closes, order, round_starts, groups, bar_index)

    def step_with_strategies(
        self,
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        ohlc: Ohlc,
        order: np.ndarray,
        round_starts: np.ndarray,
        groups: Sequence[str],
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``step_outputs`` with ``paper_step_kernel`` queued after each round's
        ``step_kernel`` on the backend's stream, reading the round's output rows where
        the step kernel wrote them: no copy or wait between the two. Returns once both
        are done (docs/design/cuda.md, "Strategies")."""
        n, m = slots.shape[0], order.shape[0]
        bar_index = np.full(n, -1, np.int64)
        if m == 0:
            cells = strategy_outputs(n * len(self.store.strategies))
            return empty_fields(n, groups, bar_index), cells
        pending = self._submit_step(
            slots, times, closes, order, round_starts, groups, bar_index, ohlc
        )
        fields = pending.wait()
        return fields, self.state.strategies.cells()

    def _submit_step(
        self, slots, times, closes, order, round_starts, groups, bar_index, ohlc=None
    ) -> PendingOutputs:
        """Plan, stage, enqueue the copies and kernels (or launch the step's CUDA graph),
        commit the counters on the host; the outputs (all rows for ``groups`` None) are
        read when the returned step is waited for (docs/design/cuda.md, "Step plan").
        With ``ohlc``, each round's strategies follow its ATC kernel on the stream."""
        n, m = slots.shape[0], order.shape[0]
        n_rounds = round_starts.shape[0] - 1
        io = self._take_io()
        plan, reused = self._step_plan(slots, order, round_starts)
        self.state.sync(self._plan.host, m)
        self.state.ensure_growth(n_rounds)
        k = self._prepare_packing(groups)
        layout = self._packed_fields
        io.reserve(n, N_OUT, k)
        io.stage(times, closes)
        paper = None if ohlc is None else self.state.strategies
        if paper is not None:
            paper.stage_step(ohlc)

        def enqueue() -> None:
            io.times.upload(n, self.stream)
            io.closes.upload(n, self.stream)
            if paper is not None:
                paper.enqueue_step_inputs(n)
            out = io.out.device[: n * N_OUT].reshape((n, N_OUT))
            arrays = self.state.arrays()
            for r in range(n_rounds):
                start, stop = int(round_starts[r]), int(round_starts[r + 1])
                self._launch(
                    step_kernel, stop - start, *arrays, plan, m, start, stop,
                    io.times.device, io.closes.device, out,
                )  # fmt: skip
                if paper is not None:  # the round's strategies, on its rows in ``out``
                    paper.launch_round(
                        arrays[2], plan, m, start, stop, io.times.device, io.closes.device, out
                    )
            self._enqueue_outputs(io, n, out, groups, k)
            if paper is not None:
                paper.enqueue_download_cells()

        timer = self._timer_start()
        graphs = self.graphs
        steady = reused and groups is not None and timer is None and paper is None
        key = (io.index, n, groups, self.threads_per_block)
        if not (steady and graphs is not None and graphs.run(key, enqueue)):
            enqueue()
        timer = self._timer_stop(timer)
        # while the device works: the same counter changes on the host
        self.state.commit_step(self._plan.host, m, times, bar_index)
        # numba's typing sees the simulator's Event, which takes no ``timing``
        done = cuda.event() if cuda_simulated() else cuda.event(timing=False)  # type: ignore[call-arg]
        done.record(self.stream)

        def read():
            self._timer_read(timer)
            if groups is None:
                return io.rows(n, order)
            return io.fields(n, groups, layout, bar_index)

        pending = PendingOutputs(read, done, io)
        io.pending = pending
        return pending

    def _step_plan(self, slots, order, round_starts):
        """The step's device plan (``build_plan``), reused while the slots repeat;
        returns ``(plan, reused)``."""
        n, m = slots.shape[0], order.shape[0]
        steady = m == n and round_starts.shape[0] == 2
        cached = self._plan_slots
        if steady and cached is not None and np.array_equal(cached, slots):
            return self._plan.device, True
        self._plan_slots = None
        if self._where.shape[0] < self.store.capacity:
            self._where = np.full(self.store.capacity, -1, np.int64)
        self.stream.synchronize()  # a submitted step may still read the plan (pinned/device)
        self._plan.reserve(2 * m)
        build_plan(slots, order, round_starts, self._plan.host, self._where)
        self._plan.upload(2 * m, self.stream)
        if steady:
            self._plan_slots = slots.copy()
        return self._plan.device, False

    def _prepare_packing(self, groups) -> int:
        """The device list of the float columns of ``groups``; returns how many."""
        if groups is None:
            return 0
        if groups != self._packed_groups:
            spec, self._packed_fields = pack_layout(groups)
            padded = np.zeros(max(spec.shape[0], 1), np.int64)  # no zero-size arrays
            padded[: spec.shape[0]] = spec
            self.stream.synchronize()  # a submitted step may still read the old spec
            self._packed_columns = cuda.to_device(padded, stream=self.stream)
            self._packed_k = spec.shape[0] // 4
            self._packed_groups = groups
            self._buffers_moved()
        return self._packed_k

    def _enqueue_outputs(self, io: IoSet, n: int, out, groups, k: int) -> None:
        """Enqueue the copy back: every column (``groups`` None), or the ``k`` float
        columns and the event bytes of ``groups``, packed on the device first."""
        if groups is None:
            io.out.download(n * N_OUT, self.stream)
            return
        events = "events" in groups
        floats = io.packed.device[: n * max(k, 1)]
        flags = io.flags.device[: 2 * n]
        self._launch(pack_outputs_kernel, n, out, n, self._packed_columns, k, floats, flags, events)
        io.packed.download(n * k, self.stream)
        if events:
            io.flags.download(2 * n, self.stream)

    def preview(
        self, slots: np.ndarray, times: np.ndarray, closes: np.ndarray, accepted: np.ndarray
    ) -> np.ndarray:
        """Outputs for in-progress bars on scratch copies of the slots; state is untouched."""
        n = slots.shape[0]
        order = np.flatnonzero(accepted)
        if order.shape[0] == 0:
            return np.full((n, N_OUT), np.nan)
        io, _ = self._run_preview(slots, times, closes, order, None)
        return io.rows(n, order)

    def preview_outputs(
        self,
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        accepted: np.ndarray,
        groups: Sequence[str],
    ) -> dict[str, np.ndarray]:
        """``preview`` returning only the typed fields of output ``groups``."""
        n = slots.shape[0]
        order = np.flatnonzero(accepted)
        bar_index = np.full(n, -1, np.int64)
        bar_index[order] = self.store.counters[slots[order], BAR_INDEX]
        if order.shape[0] == 0:
            return empty_fields(n, groups, bar_index)
        io, _ = self._run_preview(slots, times, closes, order, groups)
        return io.fields(n, groups, self._packed_fields, bar_index)

    def _run_preview(self, slots, times, closes, order, groups):
        n, m = slots.shape[0], order.shape[0]
        self._drain()
        io = self._take_io()
        pp = self._preview_plan
        self.stream.synchronize()  # a pending upload may still read the pinned plan
        pp.reserve(2 * m)
        plan_in_order(slots, order, pp.host)
        self.state.sync(pp.host, m)
        self.state.ensure_growth(1)
        pp.upload(2 * m, self.stream)
        k = self._prepare_packing(groups)
        io.reserve(n, N_OUT, k)
        io.stage(times, closes)
        io.times.upload(n, self.stream)
        io.closes.upload(n, self.stream)
        scratch = self._scratch_rows(m)
        out = io.out.device[: n * N_OUT].reshape((n, N_OUT))
        timer = self._timer_start()
        self._launch(
            preview_kernel, m, *self.state.arrays(), pp.device, m, io.times.device,
            io.closes.device, scratch.ring, scratch.values, scratch.counters, out,
        )  # fmt: skip
        timer = self._timer_stop(timer)
        self._enqueue_outputs(io, n, out, groups, k)
        self.stream.synchronize()
        self._timer_read(timer)
        return io, k

    def _scratch_rows(self, m: int):
        ring_cols = self.store.ring.shape[1]
        sc = self._scratch
        if sc is None or sc.rows < m or sc.ring_cols != ring_cols:
            rows = max(m, 2 * sc.rows if sc is not None else 0, 64)
            sc = self._scratch = types.SimpleNamespace(
                rows=rows,
                ring_cols=ring_cols,
                ring=self._device_empty((rows, ring_cols), np.float64, "F"),
                values=self._device_empty((lane_blocks(rows), N_VALUE_FIELDS, LANES), np.float64),
                counters=self._device_empty((rows, N_COUNTER_FIELDS), np.int64, "F"),
            )
        return sc

    def warmup(
        self,
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        counts: np.ndarray,
        record_all: bool,
    ) -> np.ndarray:
        """Apply ``counts[s]`` bars of ``closes[s]`` to stream ``slots[s]`` (as
        ``CpuBackend.warmup``).

        Streams are taken in chunks whose device buffers (histories twice: as uploaded
        and transposed, plus outputs) fit ``warmup_memory_budget`` bytes.
        """
        self._drain()
        n = slots.shape[0]
        width = times.shape[1] if record_all else 1
        result = np.full((n, max(width, 1), N_OUT), np.nan)
        longest = int(counts.max(initial=0))
        rows = longest if record_all else 1
        for a, b in self._warmup_chunks(counts, 2 * longest + rows * N_OUT + 3):
            self._warmup_chunk(
                slots[a:b], times[a:b], closes[a:b], counts[a:b], record_all, result[a:b]
            )
        if record_all:
            result[np.arange(result.shape[1])[None, :] >= counts[:, None]] = np.nan
        else:
            result[counts == 0] = np.nan
        return result

    def warmup_with_strategies(
        self,
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        ohlc: Ohlc,
        counts: np.ndarray,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``warmup`` keeping every bar's output rows on the device, with
        ``paper_warmup_kernel`` queued after the ATC warmup kernel on the backend's
        stream over those rows; only each row's last bar's outputs come back."""
        self._drain()
        n, n_strategies = slots.shape[0], len(self.store.strategies)
        last = np.full((n, N_OUT), np.nan)
        cells = strategy_outputs(n * n_strategies)
        longest = int(counts.max(initial=0))
        cell_words = n_strategies * (CELL_FLOATS + CELL_INTS)
        for a, b in self._warmup_chunks(counts, 6 * longest + (longest + 1) * N_OUT + cell_words):
            part = self._warmup_chunk(
                slots[a:b], times[a:b], closes[a:b], counts[a:b], True, last[a:b],
                tuple(prices[a:b] for prices in ohlc),
            )  # fmt: skip
            for name, values in (part or {}).items():
                cells[name][a * n_strategies : b * n_strategies] = values
        last[counts == 0] = np.nan
        return last, cells

    def _warmup_chunks(self, counts: np.ndarray, words_per_stream: int) -> list[tuple[int, int]]:
        """``[a, b)`` ranges of streams whose warmup buffers (``words_per_stream`` 8-byte
        words each) fit ``warmup_memory_budget``; none when no stream has a bar."""
        n = counts.shape[0]
        if n == 0 or int(counts.max(initial=0)) == 0:
            return []
        chunk = max(1, min(n, self.warmup_memory_budget // (8 * words_per_stream)))
        return [(a, min(n, a + chunk)) for a in range(0, n, chunk)]

    def _warmup_chunk(self, slots, times, closes, counts, record_all, result, ohlc=None):
        """One launch's streams. With ``ohlc`` (``record_all``): the bars' times and
        prices go up with the closes, the strategies step over the kept rows on the
        device, and only the last rows (``result``: ``(n, N_OUT)``) and the strategy
        cells (returned) come back."""
        n = slots.shape[0]
        longest = int(counts.max(initial=0))
        if longest == 0:
            return None
        self.state.sync(np.ascontiguousarray(slots, dtype=np.int64))
        self.state.ensure_growth(longest)
        rows = longest if record_all else 1
        trading = ohlc is not None
        time_words = n * longest if trading else 0  # the bars' times, after the 3n ints
        lasts = n * N_OUT if trading else 0  # the last rows, before every bar's
        series = (closes, *ohlc) if trading else (closes,)
        self._ints.reserve(3 * n + time_words)
        self._floats.reserve(longest * n)
        self._history.reserve(len(series) * n * longest)
        self._warm_out.reserve(lasts + n * rows * N_OUT)
        pack_warmup(slots, times, counts, self._ints.host)
        # the histories as they are (one stream per row: a memcpy); the device transposes
        for k, values in enumerate(series):
            block = self._history.host[k * n * longest : (k + 1) * n * longest]
            np.copyto(block.reshape(n, longest), values[:, :longest])
        if trading:
            bar_times = self._ints.host[3 * n : 3 * n + time_words].reshape(n, longest)
            np.copyto(bar_times, times[:, :longest])
        self._ints.upload(3 * n + time_words, self.stream)
        self._history.upload(len(series) * n * longest, self.stream)

        def history(k: int) -> Any:
            return self._history.device[k * n * longest : (k + 1) * n * longest].reshape(n, longest)

        closes_tn = self._floats.device[: longest * n].reshape(longest, n)
        out = self._warm_out.device[lasts : lasts + n * rows * N_OUT].reshape((n * rows, N_OUT))
        arrays = self.state.arrays()
        args = (*arrays, self._ints.device, n, closes_tn, out, bool(record_all))
        timer = self._timer_start()
        self._launch(transpose_kernel, n, history(0), n, longest, closes_tn)
        self._launch_warmup(n, args)
        paper = self.state.strategies
        if trading:  # the strategies over the kept rows, then the last rows gathered
            paper.enqueue_reset_cells(n)
            times_dev = self._ints.device[3 * n : 3 * n + time_words].reshape(n, longest)
            prices = (history(1), history(2), history(3))
            paper.launch_warmup(arrays[2], self._ints.device, n, times_dev, prices, history(0), out)
            last = self._warm_out.device[:lasts].reshape((n, N_OUT))
            self._launch(last_rows_kernel, n, out, self._ints.device, n, last)
        timer = self._timer_stop(timer)
        self._warm_out.download(lasts if trading else n * rows * N_OUT, self.stream)
        if trading:
            paper.enqueue_download_cells()
        self.state.commit_warmup(self._ints.host, n)
        self.stream.synchronize()
        self._timer_read(timer)
        if trading:
            result[:] = self._warm_out.host[:lasts].reshape((n, N_OUT))
            return paper.cells()
        result[:, :rows] = self._warm_out.host[: n * rows * N_OUT].reshape((n, rows, N_OUT))
        return None

    def _launch_warmup(self, n: int, args) -> None:
        ring_cols = self.store.ring.shape[1]
        use_local = (
            self.warmup_state == "local"
            and ring_cols <= LOCAL_RING_MAX_COLUMNS
            and ring_cols not in self._local_failed
        )
        if use_local:
            kernel = local_warmup_kernel(ring_cols)
            try:
                if not cuda_simulated():  # compile and read the PTX before the first launch
                    name = f"local_warmup_kernel({ring_cols})"
                    with no_fma():
                        kernel.compile(kernel_signatures(ring_cols)[name][1])
                    check_no_fma(kernel, name)
                self._launch(kernel, n, *args)
                return
            except FmaContractionError:
                raise
            except Exception as exc:  # a compile error: never expected, but never fatal
                if cuda_simulated():
                    raise
                self._local_failed.add(ring_cols)
                log.warning("local-state warmup kernel failed (%s); using global state", exc)
        self._launch(warmup_kernel, n, *args)
