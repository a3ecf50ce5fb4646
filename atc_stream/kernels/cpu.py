"""CPU drivers: the core update compiled with ``numba.njit``, serial and parallel over streams.

Design: docs/design/kernels.md, "CPU drivers".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit, prange

from atc_stream.core import schema
from atc_stream.core.output_row import N_OUT, OUT_BAR_INDEX, OUT_LONG, OUT_SHORT
from atc_stream.kernels import lanes as lane_source
from atc_stream.kernels import task_share
from atc_stream.kernels import threads as threading_policy
from atc_stream.kernels.backend import Ohlc, ReadyFields
from atc_stream.kernels.cache import cached_jit
from atc_stream.kernels.compile import compile_both, compile_core, compile_module
from atc_stream.kernels.paper_cpu import run_strategy_step, run_strategy_warmup
from atc_stream.kernels.task_share import DONE_TASKS, NEXT_TASK, fetch_add
from atc_stream.state.arrays import StateStore, rows_to_lanes, values_of
from atc_stream.state.layout import BAR_INDEX, PARAM_ROW

# inline="always": numba otherwise calls each core function out of line with ~30 words of
# array arguments (54 MA calls per bar); inlining halves the per-bar cost, same doubles.
_inlined = cached_jit(njit(error_model="numpy", inline="always", cache=True))
_core = compile_core(_inlined)
update_stream = _core.update_stream
stream_growth = _core.stream_growth
growth_factor = _core.growth_factor
# The lane kernel touches no reference counts: numba would otherwise increment and
# decrement (atomically) the count of every array passed to each inlined function, ~100
# atomic pairs a block-bar, more than half of the serial warmup's time. Its scratch comes
# from the caller, and ``block_warmup`` is called out of line so the caller keeps NRT.
_lanes = compile_module(
    lane_source,
    cached_jit(njit(error_model="numpy", inline="always", cache=True, _nrt=False)),  # type: ignore[call-overload]
    {"block_warmup": cached_jit(njit(error_model="numpy", cache=True, _nrt=False))},  # type: ignore[call-overload]
    {"growth_factor": growth_factor},
)
block_warmup = _lanes.block_warmup
steady_bar = _lanes.steady_bar
LANES = lane_source.LANES
#: smallest block worth running in lanes: a block's gather and scatter cost about three
#: streams alone
MIN_BLOCK = 4
#: bars from which even one stream runs faster alone in a block than in the scalar driver:
#: the block interleaves its nine window sums a family (twice the scalar speed on one
#: stream), and a few bars repay the gather and scatter
LONG_HISTORY = 8
#: stream-bars of lane work one update of the scalar step driver counts for in the
#: thread choice: it costs 3-5 us a stream against 0.5-1 us in a lane block, so 1,000
#: streams of it go parallel, as before the lane blocks (RESULTS.md, bench_threads)
SCALAR_WORK = 3
#: lane blocks that make one unit of parallel work in the thread choice (``n_tasks``): a
#: call of fewer than two (16 blocks) stays on one thread
BLOCKS_PER_TASK = 8
#: lane blocks a thread takes at a time from a call's shared counter (``warmup_blocks``)
#: in a step (~3 us of work) and in a warmup (a block's whole histories): few, so that
#: the threads finish together and a thread that waits waits for little
STEP_TASK_BLOCKS = 2
WARMUP_TASK_BLOCKS = 1


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


def warmup_blocks(
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
    members,
    block_starts,
    in_place,
    progress,
    task_blocks,
):
    """``warmup`` of the streams ``members`` in blocks of up to LANES (``plan_blocks``),
    each block through ``lanes.block_warmup``: the same bits, LANES chains at a time.

    Every thread that calls it with the same ``progress`` (``task_share`` counters, from
    zero) takes ``task_blocks`` blocks at a time until none is left, then waits until
    every taken task is finished, whoever took it; one thread alone runs them all."""
    capacity = ring.shape[1] // 2
    rows = capacity + times.shape[1]
    n_blocks = block_starts.shape[0] - 1
    tasks = (n_blocks + task_blocks - 1) // task_blocks
    # every allocation before the first task: a thread that fails does so holding none
    h = np.empty((rows, LANES))
    vals = np.empty((values.shape[1], LANES))
    o = np.empty((N_OUT, LANES))
    lane = np.empty((lane_source.N_LANE_ROWS, LANES))
    starts = np.empty((lane_source.N_START_ROWS, LANES), np.int64)
    sums = np.empty((lane_source.N_SUM_ROWS, LANES))
    diffs = np.empty((capacity, LANES))
    weights = np.empty((capacity, LANES))
    for i in range(capacity):
        weights[i, :] = float(i)
    while True:
        task = fetch_add(progress, NEXT_TASK, 1)
        if task >= tasks:
            break
        for b in range(task * task_blocks, min(n_blocks, (task + 1) * task_blocks)):
            start = block_starts[b]
            block_warmup(
                ring, values, counters, param_lengths, param_values, slots, times, closes,
                counts, out, record_all, members[start:block_starts[b + 1]],
                block_starts[b + 1] - start, in_place[b], h, vals, o, lane, starts, sums, diffs,
                weights,
            )  # fmt: skip
        fetch_add(progress, DONE_TASKS, 1)
    while fetch_add(progress, DONE_TASKS, 0) < tasks:
        pass


@cached_jit(njit(cache=True))
def append_rows(source, start, stop, target, n):
    """``target[n : n + stop - start] = source[start:stop]``; returns the new length ``n``."""
    for q in range(start, stop):
        target[n] = source[q]
        n += 1
    return n


@cached_jit(njit(cache=True))
def add_block(source, start, stop, members, n_members, block_starts, n_blocks):
    """``source[start:stop]`` as the next lane block; returns ``(n_members, n_blocks)``."""
    n_members = append_rows(source, start, stop, members, n_members)
    block_starts[n_blocks + 1] = n_members
    return n_members, n_blocks + 1


@cached_jit(njit(cache=True))
def plan_blocks(counters, param_lengths, slots, counts, min_block):
    """Group rows (warmup histories or step updates) into lane blocks: ``(members,
    block_starts, scalar_rows, in_place)``. A block holds streams of one parameter row
    whose bar indices are equal or all steady (``lanes.steady_bar``). The streams of one
    stored block of values (``state/layout.py``, LANES) with one history length, in slot
    order, make a block of their own when they are the whole stored block, or when they
    are at least ``min_block`` streams with one bar each and the call has no other stream
    of that stored block: ``lanes.block_warmup`` updates it where it is stored
    (``in_place``, one flag a block). The rest go longest histories first, so a block's
    lanes end together; the rows of a group's last block when it would be under
    ``min_block`` streams go to ``scalar_rows``."""
    steady = np.empty(param_lengths.shape[0], np.int64)
    for r in range(param_lengths.shape[0]):
        steady[r] = steady_bar(param_lengths[r])
    rows = np.flatnonzero(counts > 0)
    # by slot first: the stable sort below keeps a stored block's rows neighbours
    rows = rows[np.argsort(slots[rows], kind="mergesort")]
    n = rows.shape[0]
    in_block = np.zeros(counters.shape[0] // LANES + 1, np.int64)  # rows per stored block
    longest = 0
    widest = 0
    for s in rows:
        in_block[slots[s] // LANES] += 1
        longest = max(longest, counts[s])
        widest = max(widest, steady[counters[slots[s], PARAM_ROW]])
    keys = np.empty(n, np.int64)
    for i in range(n):
        s = rows[i]
        param_row = counters[slots[s], PARAM_ROW]
        phase = min(counters[slots[s], BAR_INDEX], steady[param_row])
        keys[i] = (param_row * (widest + 1) + phase) * (longest + 1) + longest - counts[s]
    sorting = np.argsort(keys, kind="mergesort")
    order = rows[sorting]
    keys = keys[sorting]
    members = np.empty(n, np.int64)
    block_starts = np.empty(n + 1, np.int64)
    scalar_rows = np.empty(n, np.int64)
    in_place = np.zeros(n, np.bool_)
    left = np.empty(n, np.int64)
    n_members = 0
    n_blocks = 0
    n_scalar = 0
    block_starts[0] = 0
    i = 0
    while i < n:
        group = keys[i] // (longest + 1)
        end = i
        while end < n and keys[end] // (longest + 1) == group:
            end += 1
        n_left = 0
        k = i
        while k < end:
            # the run of rows in one stored block with one history length
            run = k + 1
            while (
                run < end
                and keys[run] == keys[k]
                and slots[order[run]] // LANES == slots[order[k]] // LANES
            ):
                run += 1
            # a part of a stored block only for one bar (a step): over a longer history
            # its idle lanes would cost more than copying the values in and out. And only
            # when no other block of this call has a stream of it: the idle lanes are
            # computed on and put back, which another thread must not see or undo
            block = slots[order[k]] // LANES
            part = run - k >= min_block and counts[order[k]] == 1
            if run - k == LANES or (part and run - k == in_block[block]):
                n_members, n_blocks = add_block(order, k, run, members, n_members, block_starts,
                                                n_blocks)  # fmt: skip
                in_place[n_blocks - 1] = True
            else:
                n_left = append_rows(order, k, run, left, n_left)
            k = run
        a = 0
        while a < n_left:
            b = min(a + LANES, n_left)
            if b - a >= min_block:
                n_members, n_blocks = add_block(left, a, b, members, n_members, block_starts,
                                                n_blocks)  # fmt: skip
            else:
                n_scalar = append_rows(left, a, b, scalar_rows, n_scalar)
            a = b
        i = end
    return (
        members[:n_members],
        block_starts[: n_blocks + 1],
        scalar_rows[:n_scalar],
        in_place[:n_blocks],
    )


@cached_jit(njit(cache=True))
def steady_param_rows(counters, param_lengths, slots, counts, param_rows, last_slots,
                      last_counts, last_rows):  # fmt: skip
    """``param_rows[i]``: the parameter row of ``slots[i]``. Returns ``(steady, same)``:
    ``steady`` when every row with a bar (``counts[i] > 0``) is at or past its row's
    ``steady_bar``, ``same`` when the slots, counts and parameter rows are ``last_slots``,
    ``last_counts`` and ``last_rows``. ``plan_blocks`` of a steady call depends on those
    alone, so a plan made for the same ones, all steady then too, is this call's plan."""
    n = slots.shape[0]
    same = last_slots.shape[0] == n
    steady = np.full(param_lengths.shape[0], -1, np.int64)
    all_steady = True
    for i in range(n):
        slot = slots[i]
        row = counters[slot, PARAM_ROW]
        param_rows[i] = row
        if same and (last_slots[i] != slot or last_counts[i] != counts[i] or last_rows[i] != row):
            same = False
        if counts[i] > 0:
            if steady[row] < 0:
                steady[row] = steady_bar(param_lengths[row])
            if counters[slot, BAR_INDEX] < steady[row]:
                all_steady = False
    return all_steady, same


@cached_jit(njit(cache=True))
def event_columns(out, bar_index, long, short):
    """``schema.kernel_fields``'s integer and bool columns of output rows ``out`` in one
    pass: ``bar_index`` (-1 where a row holds no result), ``long`` and ``short``."""
    for u in range(out.shape[0]):
        b = out[u, OUT_BAR_INDEX]
        bar_index[u] = -1 if np.isnan(b) else np.int64(b)
        long[u] = out[u, OUT_LONG] == 1.0
        short[u] = out[u, OUT_SHORT] == 1.0


def kernel_fields(out: np.ndarray, groups: Sequence[str]) -> dict[str, np.ndarray]:
    """``schema.kernel_fields`` of ``out``, its events converted by ``event_columns``
    (one compiled pass instead of four over strided columns)."""
    n = out.shape[0]
    events = (np.empty(n, np.int64), np.empty(n, np.bool_), np.empty(n, np.bool_))
    event_columns(out, *events)
    return schema.kernel_fields(out, groups, events)


_NO_PLAN = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))


def n_tasks(n_blocks: int) -> int:
    """Units of parallel work in ``n_blocks`` lane blocks, for the thread choice."""
    return (n_blocks + BLOCKS_PER_TASK - 1) // BLOCKS_PER_TASK


step_serial, step_parallel = compile_both(step)
# nogil: the calling thread and the helpers run it at once
warmup_blocks = cached_jit(njit(error_model="numpy", cache=True, nogil=True))(warmup_blocks)
# the plain name stays the parallel driver, as before the serial variant existed
step = step_parallel
DRIVERS = (step_serial, step_parallel, warmup_blocks, growth_factor)


def run_blocks(args: tuple, n_threads: int, task_blocks: int) -> None:
    """``warmup_blocks`` (``args``: its arguments up to ``in_place``) on ``n_threads``:
    on the calling thread at once, joined by ``n_threads - 1`` helper threads as they
    wake (``task_share``), each taking ``task_blocks`` blocks at a time."""
    if n_threads <= 1:  # one task: no counter traffic between blocks
        *_, block_starts, _in_place = args
        task_blocks = max(block_starts.shape[0] - 1, 1)
    args = (*args, np.zeros(task_share.N_COUNTERS, np.int64), task_blocks)
    if n_threads <= 1:
        warmup_blocks(*args)
        return
    helpers = task_share.helper_threads()
    helpers.post(warmup_blocks, args, n_threads - 1)
    try:
        warmup_blocks(*args)
    finally:
        helpers.retire(args)


class CpuBackend:
    """Runs the CPU drivers directly on the store's host arrays.

    A ``kernels.backend.Backend``. ``threads``: None picks serial or parallel per call
    (``kernels/threads.py``); an int fixes the thread count (1 = the serial drivers).
    """

    name = "cpu"
    #: streams per warmup call: bounds the padded history arrays the engine builds
    warmup_chunk = 1024

    def __init__(self, store: StateStore, threads: int | None = None) -> None:
        self.store = store
        self.threads = threading_policy.resolve_threads(threads)

    def _arrays(self):
        s = self.store
        return s.ring, s.values, s.counters, s.params.lengths, s.params.values

    def _threads(self, work: int, units: int) -> int:
        return threading_policy.choose_threads(work, units, self.threads)

    def step(
        self,
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        order: np.ndarray,
        round_starts: np.ndarray,
    ) -> np.ndarray:
        return self._step(self._arrays(), slots, times, closes, order, round_starts)

    def _step(
        self, arrays, slots, times, closes, order, round_starts, keep_plan=True
    ) -> np.ndarray:
        """``step`` on ``arrays`` (ring, values, counters, param_lengths, param_values):
        the store's, or the private copies of a preview (``keep_plan`` False: the
        copies' plan is not the store's, so it neither uses nor replaces the kept one)."""
        # every update writes its whole row; only rejected updates' rows stay NaN
        n = slots.shape[0]
        out = np.empty((n, N_OUT)) if order.shape[0] == n else np.full((n, N_OUT), np.nan)
        if round_starts.shape[0] == 2 and order.shape[0] >= MIN_BLOCK:
            order = self._step_blocks(arrays, slots, times, closes, order, out, keep_plan)
            if not order.shape[0]:
                return out
            round_starts = np.array([0, order.shape[0]], np.int64)
        n_rounds = max(round_starts.shape[0] - 1, 1)
        widest = order.shape[0] if n_rounds == 1 else int(np.diff(round_starts).max())
        threading_policy.run(
            step_serial, step_parallel,
            self._threads(SCALAR_WORK * (order.shape[0] // n_rounds), widest),
            *arrays, slots, times, closes, order, round_starts, out,
        )  # fmt: skip
        return out

    def _step_blocks(self, arrays, slots, times, closes, order, out, keep_plan) -> np.ndarray:
        """A one-round step in lane blocks (``plan_blocks``, one bar per stream); returns
        the updates left to the scalar driver."""
        n = slots.shape[0]
        if order.shape[0] == n:  # every update accepted (the usual step): kept, never written
            if self._all_ones.shape[0] != n:
                self._all_ones = np.ones(n, np.int64)
            ones = self._all_ones
        else:
            ones = np.zeros(n, np.int64)
            ones[order] = 1
        _ring, _values, counters, param_lengths, _param_values = arrays
        members, block_starts, scalar_rows, in_place = self._step_plan(
            counters, param_lengths, slots, ones, keep_plan
        )
        if not members.shape[0]:
            return scalar_rows
        args = (
            *arrays, slots, np.ascontiguousarray(times, np.int64).reshape(n, 1),
            np.ascontiguousarray(closes, np.float64).reshape(n, 1), ones,
            out.reshape(n, 1, N_OUT), False, members, block_starts, in_place,
        )  # fmt: skip
        n_threads = self._threads(members.shape[0], n_tasks(block_starts.shape[0] - 1))
        run_blocks(args, n_threads, STEP_TASK_BLOCKS)
        return scalar_rows

    def _step_plan(self, counters, param_lengths, slots, counts, keep=True):
        """``plan_blocks`` of a step, or the last step's plan while the same streams step
        again, every one steady (``steady_param_rows``): a loop over the same slots plans
        once, where planning 1,000 streams cost about a sixth of their step. ``keep``
        False (a preview's copies): planned apart, the kept plan neither used nor
        replaced."""
        if not keep:
            return plan_blocks(counters, param_lengths, slots, counts, MIN_BLOCK)
        param_rows = np.empty(slots.shape[0], np.int64)
        last = self._last_plan
        steady, same = steady_param_rows(
            counters, param_lengths, slots, counts, param_rows, *(last or _NO_PLAN)[:3]
        )
        if steady and same and last is not None:
            return last[3]
        plan = plan_blocks(counters, param_lengths, slots, counts, MIN_BLOCK)
        self._last_plan = (slots.copy(), counts, param_rows, plan) if steady else None
        return plan

    _last_plan: tuple | None = None
    _all_ones = np.zeros(0, np.int64)

    def step_outputs(
        self,
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        order: np.ndarray,
        round_starts: np.ndarray,
        groups: Sequence[str],
    ) -> dict[str, np.ndarray]:
        """``step``'s outputs as the typed fields of output ``groups``
        (``schema.kernel_fields``: floats are views of the rows, events bool)."""
        return kernel_fields(self.step(slots, times, closes, order, round_starts), groups)

    def step_outputs_async(
        self,
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        order: np.ndarray,
        round_starts: np.ndarray,
        groups: Sequence[str],
    ) -> ReadyFields:
        """``step_outputs``, run to completion before returning (the CPU has nothing to
        overlap with the host's next step)."""
        return ReadyFields(self.step_outputs(slots, times, closes, order, round_starts, groups))

    def preview_outputs(
        self,
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        accepted: np.ndarray,
        groups: Sequence[str],
    ) -> dict[str, np.ndarray]:
        """``preview``'s outputs as the typed fields of output ``groups``."""
        return kernel_fields(self.preview(slots, times, closes, accepted), groups)

    def preview(
        self, slots: np.ndarray, times: np.ndarray, closes: np.ndarray, accepted: np.ndarray
    ) -> np.ndarray:
        """Outputs for in-progress bars without touching state: each accepted update steps
        a private copy of its stream's state (one copy per update, so two previews of a
        stream are both taken from its committed state), with the step's own drivers."""
        ring, values, counters, param_lengths, param_values = self._arrays()
        rows = np.where(accepted, slots, 0)  # a rejected update's slot may not exist
        copies = (
            ring[rows], rows_to_lanes(values_of(values, rows)), counters[rows], param_lengths,
            param_values,
        )  # fmt: skip
        order = np.flatnonzero(accepted).astype(np.int64)
        return self._step(
            copies, np.arange(slots.shape[0], dtype=np.int64),
            np.ascontiguousarray(times, np.int64), np.ascontiguousarray(closes, np.float64),
            order, np.array([0, order.shape[0]], np.int64), False,
        )  # fmt: skip

    def warmup(
        self,
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        counts: np.ndarray,
        record_all: bool,
    ) -> np.ndarray:
        rows = times.shape[1] if record_all else 1
        out = np.full((slots.shape[0], max(rows, 1), N_OUT), np.nan)
        longest = int(counts.max()) if counts.shape[0] else 0
        members, block_starts, scalar_rows, in_place = plan_blocks(
            self.store.counters, self.store.params.lengths, slots, counts,
            1 if longest >= LONG_HISTORY else MIN_BLOCK,
        )  # fmt: skip
        if members.shape[0]:
            run_blocks(
                (*self._arrays(), slots, times, closes, counts, out, record_all, members,
                 block_starts, in_place),
                self._threads(int(counts[members].sum()), n_tasks(block_starts.shape[0] - 1)),
                WARMUP_TASK_BLOCKS,
            )  # fmt: skip
        if scalar_rows.shape[0]:
            self._warmup_as_steps(scalar_rows, slots, times, closes, counts, out, record_all)
        return out

    def _warmup_as_steps(self, rows, slots, times, closes, counts, out, record_all) -> None:
        """The histories ``rows`` the lane blocks left (a few streams, under
        ``LONG_HISTORY`` bars each) as steps: round ``t`` applies bar ``t`` of each of
        them that has one, so the scalar step driver serves warmups too."""
        bars = np.arange(int(counts[rows].max()))
        has = bars[None, :] < counts[rows][:, None]  # [row, bar]: the row has that bar
        stream, bar = np.nonzero(has.T)[::-1]  # by bar, then row: one round a bar
        row = rows[stream]
        round_starts = np.searchsorted(bar, np.arange(bars.shape[0] + 1)).astype(np.int64)
        stepped = self._step(
            self._arrays(), slots[row], np.ascontiguousarray(times[row, bar], np.int64),
            np.ascontiguousarray(closes[row, bar], np.float64),
            np.arange(row.shape[0], dtype=np.int64), round_starts,
        )  # fmt: skip
        if record_all:
            out[row, bar] = stepped
        else:
            last = bar == counts[row] - 1
            out[row[last], 0] = stepped[last]

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
        """``step_outputs``, then the strategy driver over the same output rows (a second
        compiled call: each update's strategies read its row)."""
        out = self.step(slots, times, closes, order, round_starts)
        cells = run_strategy_step(
            self.store, slots, times, *ohlc, closes, out, order, round_starts, self.threads
        )
        return kernel_fields(out, groups), cells

    def warmup_with_strategies(
        self,
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        ohlc: Ohlc,
        counts: np.ndarray,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``warmup`` keeping every bar's outputs, then the strategy driver over them."""
        every = self.warmup(slots, times, closes, counts, True)
        cells = run_strategy_warmup(
            self.store, slots, times, *ohlc, closes, counts, every, self.threads
        )
        return every[np.arange(slots.shape[0]), np.maximum(counts - 1, 0)], cells

    def pull_state(self) -> None:
        """Host arrays are the state on the CPU: nothing to copy."""

    def push_state(self) -> None:
        """Host arrays are the state on the CPU: nothing to copy."""

    def close(self) -> None:
        """The CPU backend holds nothing besides the store."""
