"""The lane warmup (kernels/lanes.py through CpuBackend.warmup) against the scalar core
(the step driver, bar by bar), bit for bit: every output row and the whole final state."""

from __future__ import annotations

import numpy as np
import pytest

from atc_stream.core.output_row import N_OUT
from atc_stream.core.params import ATCParams
from atc_stream.engine import Engine
from atc_stream.kernels import cpu
from atc_stream.state.arrays import StateStore

pytestmark = pytest.mark.timeout(600)

PARAM_SETS = (
    ATCParams(),
    ATCParams(ema_len=5, hma_len=7, wma_len=9, dema_len=6, lsma_len=8, kama_len=5,
              robustness="Narrow", cutout=40, La=0.5, De=1.0),
    ATCParams(robustness="Wide", cutout=3, cut=0.1, long_threshold=0.05, short_threshold=-0.05),
)  # fmt: skip


def _store(n: int, param_rows: np.ndarray) -> tuple[StateStore, np.ndarray]:
    store = StateStore(n)
    for params in PARAM_SETS:
        store.add_params(params)
    slots = np.array([store.allocate(int(row)) for row in param_rows], np.int64)
    return store, slots


def _walks(rng, n: int, bars: int) -> np.ndarray:
    """Random walks on a 0.01 grid with flat runs, so closes tie their averages."""
    steps = rng.choice([-0.02, -0.01, 0.0, 0.0, 0.01, 0.02], size=(n, bars))
    return np.maximum(np.round(50.0 + np.cumsum(steps, axis=1), 2), 0.01)


def _arrays(store: StateStore):
    return store.ring, store.values, store.counters, store.params.lengths, store.params.values


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def _scalar_warmup(store, slots, times, closes, counts, record_all=True):
    """The scalar core bar by bar: ``cpu.step_serial`` of bar ``t`` of every stream that
    has one, for t = 0, 1, ..."""
    rows = times.shape[1] if record_all else 1
    out = np.full((slots.shape[0], rows, N_OUT), np.nan)
    for t in range(int(counts.max(initial=0))):
        live = np.flatnonzero(counts > t)
        stepped = np.full((live.shape[0], N_OUT), np.nan)
        cpu.step_serial(
            *_arrays(store), slots[live], times[live, t], closes[live, t],
            np.arange(live.shape[0]), np.array([0, live.shape[0]]), stepped,
        )  # fmt: skip
        if record_all:
            out[live, t] = stepped
        else:
            last = counts[live] == t + 1
            out[live[last], 0] = stepped[last]
    return out


def _warmed_pair(rng, param_rows: np.ndarray, bars: int, warm: int):
    """Two equal stores (one for the scalar driver, one for the lanes) of random walks
    of ``bars`` bars, the first ``warm`` applied by the scalar core: ``(scalar, lanes,
    slots, times, closes)``, times 1, 2, ... for every stream."""
    n = param_rows.shape[0]
    scalar, slots = _store(n, param_rows)
    lanes, _ = _store(n, param_rows)
    closes = _walks(rng, n, bars)
    times = np.tile(np.arange(1, bars + 1, dtype=np.int64), (n, 1))
    for store in (scalar, lanes):
        _scalar_warmup(store, slots, times[:, :warm], closes[:, :warm], np.full(n, warm))
    return scalar, lanes, slots, times, closes


def _assert_same_state(a: StateStore, b: StateStore) -> None:
    assert _same(a.values, b.values)
    assert _same(a.ring, b.ring)
    assert _same(a.counters, b.counters)


@pytest.mark.parametrize("threads", [1, 2])
def test_lane_warmup_is_bit_identical_in_two_phases(threads):
    """Several parameter sets, part-full blocks, uneven and zero counts, NaN warm-up,
    then a second warmup continuing from uneven bar indices (steady and not)."""
    rng = np.random.default_rng(7)
    n = 53
    param_rows = rng.integers(0, len(PARAM_SETS), n)
    scalar, slots = _store(n, param_rows)
    lanes, _ = _store(n, param_rows)
    backend = cpu.CpuBackend(lanes, threads=threads)
    start = 0
    for bars, low in ((90, 0), (120, 30)):
        closes = _walks(rng, n, bars)
        counts = rng.integers(low, bars + 1, n)
        counts[:20] = bars  # whole blocks of one phase
        counts[-1] = 0
        times = np.tile(np.arange(start + 1, start + bars + 1, dtype=np.int64), (n, 1))
        start += bars
        expected = _scalar_warmup(scalar, slots, times, closes, counts)
        got = backend.warmup(slots, times, closes, counts, True)
        for s in range(n):
            assert _same(got[s, : counts[s]], expected[s, : counts[s]]), s
        _assert_same_state(scalar, lanes)
        last = backend.warmup(slots, times[:, :0], closes[:, :0], np.zeros(n, np.int64), False)
        assert np.isnan(last).all()


def test_last_row_only_and_plan_covers_every_stream():
    rng = np.random.default_rng(3)
    n = 37
    param_rows = np.zeros(n, np.int64)
    scalar, slots = _store(n, param_rows)
    lanes, _ = _store(n, param_rows)
    closes = _walks(rng, n, 200)
    counts = rng.integers(1, 201, n)
    times = np.tile(np.arange(1, 201, dtype=np.int64), (n, 1))
    for min_block in (1, cpu.MIN_BLOCK):
        members, starts, alone, _ = cpu.plan_blocks(
            lanes.counters, lanes.params.lengths, slots, counts, min_block
        )
        assert sorted([*members, *alone]) == list(range(n))
        assert (np.diff(starts) <= cpu.LANES).all() and (np.diff(starts) >= min_block).all()
    expected = _scalar_warmup(scalar, slots, times, closes, counts, record_all=False)
    got = cpu.CpuBackend(lanes, threads=1).warmup(slots, times, closes, counts, False)
    assert _same(got, expected)
    _assert_same_state(scalar, lanes)


def test_snapshot_after_lane_warmup_continues_with_the_scalar_step():
    rng = np.random.default_rng(11)
    symbols = [f"S{i}" for i in range(20)]
    closes = _walks(rng, len(symbols), 300)
    times = np.arange(300, dtype=np.int64) * 60_000
    history = {s: (times[:250], closes[i, :250]) for i, s in enumerate(symbols)}
    by_lanes = Engine(backend="cpu", threads=1)
    by_lanes.warmup(history)
    one_by_one = Engine(backend="cpu", threads=1)
    for i, symbol in enumerate(symbols):  # one stream, one bar a call: the scalar step
        one_by_one.warmup({symbol: (times[:1], closes[i, :1])})
        slot = one_by_one.slots_of(symbol)
        for t in range(1, 250):
            one_by_one.step_arrays(slot, times[t : t + 1], closes[i, t : t + 1])
    restored = Engine.restore(by_lanes.snapshot(), backend="cpu", threads=1)
    for t in range(250, 300):
        stepped = [
            engine.step_arrays(
                np.concatenate([engine.slots_of(s) for s in symbols]),
                np.full(len(symbols), times[t]),
                closes[:, t],
            )
            for engine in (restored, one_by_one)
        ]
        assert _same(stepped[0].signal, stepped[1].signal)
        assert _same(stepped[0].bar_index, stepped[1].bar_index)
    assert restored.streams == one_by_one.streams
    for key in restored.streams:
        assert repr(restored.stream_state(key)) == repr(one_by_one.stream_state(key))


@pytest.mark.parametrize("threads", [1, 2])
def test_lane_step_is_bit_identical(threads):
    """One-round steps of random subsets (3 streams: scalar; more: lane blocks) from
    uneven bar indices, several parameter sets, ties on the 0.01 grid."""
    rng = np.random.default_rng(5)
    n = 61
    param_rows = rng.integers(0, len(PARAM_SETS), n)
    scalar, slots = _store(n, param_rows)
    lanes, _ = _store(n, param_rows)
    closes = _walks(rng, n, 160)
    counts = rng.integers(0, 100, n)
    times = np.tile(np.arange(1, 101, dtype=np.int64), (n, 1))
    for store in (scalar, lanes):
        _scalar_warmup(store, slots, times, closes[:, :100], counts)
    backend = cpu.CpuBackend(lanes, threads=threads)
    for t in range(100, 160):
        size = 3 if t % 5 == 0 else int(rng.integers(4, n + 1))
        chosen = np.sort(rng.choice(n, size, replace=False))
        step_slots = slots[chosen]
        step_times = np.full(size, t + 1, np.int64)
        step_closes = closes[chosen, t].copy()
        order = np.arange(size, dtype=np.int64)
        starts = np.array([0, size], np.int64)
        expected = np.full((size, N_OUT), np.nan)
        cpu.step_serial(*_arrays(scalar), step_slots, step_times, step_closes, order, starts,
                        expected)  # fmt: skip
        got = backend.step(step_slots, step_times, step_closes, order, starts)
        assert _same(got, expected), t
        _assert_same_state(scalar, lanes)


@pytest.mark.parametrize("n", [1, 3])
def test_few_long_histories_run_in_one_block_bit_identically(n):
    """One stream (``compute()``) or a few: a block with unused lanes, every row and the
    final state equal to the scalar driver's, for each parameter set."""
    rng = np.random.default_rng(17 + n)
    for row in range(len(PARAM_SETS)):
        param_rows = np.full(n, row, np.int64)
        scalar, slots = _store(n, param_rows)
        lanes, _ = _store(n, param_rows)
        closes = _walks(rng, n, 300)
        counts = np.full(n, 300, np.int64)
        times = np.tile(np.arange(1, 301, dtype=np.int64), (n, 1))
        members, _, alone, _ = cpu.plan_blocks(
            lanes.counters, lanes.params.lengths, slots, counts, 1
        )
        assert len(members) == n and len(alone) == 0
        expected = _scalar_warmup(scalar, slots, times, closes, counts)
        got = cpu.CpuBackend(lanes, threads=1).warmup(slots, times, closes, counts, True)
        assert _same(got, expected)
        _assert_same_state(scalar, lanes)


def _in_stored_block(slots: np.ndarray) -> bool:
    return bool((slots // cpu.LANES == slots[0] // cpu.LANES).all())


@pytest.mark.parametrize("threads", [1, 2])
def test_steps_update_stored_blocks_in_place_bit_identically(threads):
    """Steps whose streams fill stored blocks of values wholly or in part (updated where
    they are stored, the idle lanes left as they were) and steps that mix blocks: the
    outputs and the whole state, idle and padding lanes included, equal the scalar
    driver's."""
    rng = np.random.default_rng(23)
    n = 45  # the last stored block is part-used
    scalar, lanes, slots, _, closes = _warmed_pair(rng, np.zeros(n, np.int64), 180, 100)
    backend = cpu.CpuBackend(lanes, threads=threads)
    seen_whole = seen_part = False
    for t in range(100, 180):
        chosen = np.flatnonzero(rng.random(n) < (1.0 if t % 7 == 0 else 0.7))
        step_slots = slots[chosen]
        members, starts, _, in_place = cpu.plan_blocks(
            lanes.counters, lanes.params.lengths, step_slots, np.ones(chosen.shape[0], np.int64),
            cpu.MIN_BLOCK,
        )  # fmt: skip
        for a, b, stays in zip(starts[:-1], starts[1:], in_place, strict=True):
            if stays:
                seen_whole |= b - a == cpu.LANES
                seen_part |= b - a < cpu.LANES
        step_times = np.full(chosen.shape[0], t + 1, np.int64)
        order = np.arange(chosen.shape[0], dtype=np.int64)
        round_starts = np.array([0, chosen.shape[0]], np.int64)
        expected = np.full((chosen.shape[0], N_OUT), np.nan)
        cpu.step_serial(*_arrays(scalar), step_slots, step_times, closes[chosen, t].copy(), order,
                        round_starts, expected)  # fmt: skip
        got = backend.step(step_slots, step_times, closes[chosen, t].copy(), order, round_starts)
        assert _same(got, expected), t
        _assert_same_state(scalar, lanes)
    assert seen_whole and seen_part


def test_a_part_used_stored_block_runs_in_place_only_without_its_other_streams():
    """A block of part of a stored block computes on its idle lanes and puts them back,
    so no other block of the same call (another thread) may hold a stream of that stored
    block; blocks of whole stored blocks and copies are free to mix."""
    rng = np.random.default_rng(29)
    n = 64
    param_rows = rng.integers(0, 2, n)
    store, slots = _store(n, param_rows)
    _scalar_warmup(store, slots, np.tile(np.arange(1, 3, dtype=np.int64), (n, 1)),
                   _walks(rng, n, 2), rng.integers(0, 3, n))  # fmt: skip
    for _ in range(50):
        counts = rng.choice([0, 1, 1, 1, 2, 30], n)
        for min_block in (1, cpu.MIN_BLOCK):
            members, starts, alone, in_place = cpu.plan_blocks(
                store.counters, store.params.lengths, slots, counts, min_block
            )
            assert sorted([*members, *alone]) == list(np.flatnonzero(counts > 0))
            for a, b, stays in zip(starts[:-1], starts[1:], in_place, strict=True):
                block_slots = slots[members[a:b]]
                if stays:
                    assert _in_stored_block(block_slots)
                    stored = block_slots[0] // cpu.LANES
                    in_call = np.flatnonzero((slots // cpu.LANES == stored) & (counts > 0))
                    assert len(in_call) == b - a


@pytest.mark.parametrize("threads", [1, 2])
def test_a_steady_step_reuses_its_plan_only_while_it_is_the_plan(threads):
    """The same slots stepped bar after bar reuse the last plan once every stream is
    steady; a stream that is not steady yet, or a slot given to a steady stream of
    another parameter set, makes a new one. Each plan used equals a fresh
    ``plan_blocks``, and the outputs and the state equal the scalar driver's."""
    rng = np.random.default_rng(31)
    n = 40
    scalar, lanes, slots, times, closes = _warmed_pair(rng, np.repeat([0, 1], n // 2), 260, 60)
    backend = cpu.CpuBackend(lanes, threads=threads)
    ones = np.ones(n, np.int64)
    reused = 0
    for t in range(60, 260):
        if t == 200:  # slot 5 now holds a new stream of another parameter set, steady
            for store in (scalar, lanes):
                store.reset_slot(int(slots[5]), 1)
                _scalar_warmup(store, slots[5:6], times[5:6, :50], closes[5:6, :50],
                               np.array([50]))  # fmt: skip
        before = backend._last_plan
        plan = backend._step_plan(lanes.counters, lanes.params.lengths, slots, ones)
        fresh = cpu.plan_blocks(lanes.counters, lanes.params.lengths, slots, ones, cpu.MIN_BLOCK)
        assert all(_same(a, b) for a, b in zip(plan, fresh, strict=True)), t
        reused += before is not None and plan is before[3]
        if t == 200:
            assert plan is not before[3]
        step_times = times[:, t]
        order = np.arange(n, dtype=np.int64)
        round_starts = np.array([0, n], np.int64)
        expected = np.full((n, N_OUT), np.nan)
        cpu.step_serial(*_arrays(scalar), slots, step_times, closes[:, t].copy(), order,
                        round_starts, expected)  # fmt: skip
        got = backend.step(slots, step_times, closes[:, t].copy(), order, round_starts)
        assert _same(got, expected), t
        _assert_same_state(scalar, lanes)
        if t % 20 == 0:  # a preview plans its private copies without touching the kept plan
            kept, some = backend._last_plan, slots[: n - 10]
            backend.preview(some, step_times[: n - 10] + 1, closes[: n - 10, t] * 1.01,
                            np.ones(n - 10, bool))  # fmt: skip
            assert backend._last_plan is kept, t
    assert reused > 100


def _family_sums_in_parts(parts: int):
    """``lanes.family_sums`` compiled with its window sums in ``parts`` parts of a row
    (``simd.SUM_PARTS``: the host's choice is one of them; both are tested here)."""
    from numba import njit

    from atc_stream.kernels import lanes, simd
    from atc_stream.kernels.compile import compile_module

    load, store, splat = (
        (simd.load_whole, simd.store_whole, simd.splat_whole)
        if parts == 1
        else (simd.load_half, simd.store_half, simd.splat_half)
    )
    variant = compile_module(
        lanes,
        njit(error_model="numpy", inline="always"),
        compiled_imports={"SUM_PARTS": parts, "load_sum": load, "store_sum": store,
                          "splat_sum": splat},
    )  # fmt: skip
    family_sums = variant.family_sums

    @njit(error_model="numpy")
    def run(x, first, last, lengths, k0, weight, sums, row, weights):
        family_sums(x, first, last, lengths, k0, weight, sums, row, weights)

    return run


def _python_window_sum(column, first, last, length, weight) -> float:
    """One lane's window sum the canonical way: from 0.0, oldest row first."""
    total = 0.0
    for n, k in enumerate(range(last - length + 1, last + 1)):
        y = float(column[k - first])
        total += y if weight < 0 else float(n + weight) * y
    return total


@pytest.mark.parametrize("parts", [1, 2])
def test_family_sums_in_row_parts_add_each_chain_in_the_canonical_order(parts):
    from atc_stream.core.params import LENGTHS_PER_FAMILY
    from atc_stream.kernels.simd import LANES

    rng = np.random.default_rng(parts)
    run = _family_sums_in_parts(parts)
    x = np.ascontiguousarray(_walks(rng, LANES, 80).T)  # rows: positions, columns: lanes
    x[5:40:3] *= 1.0 + 1e-9 * rng.standard_normal((12, LANES))  # bits beyond the grid too
    weights = np.repeat(np.arange(80.0)[:, None], LANES, axis=1)
    length_sets = (
        [28, 19, 37, 23, 33, 17, 39, 14, 42],  # the default lengths, unordered
        [1, 2, 3, 4, 5, 6, 7, 8, 9],
        [9, 9, 9, 9, 9, 9, 9, 9, 9],  # no older part at all
        [60, 1, 30, 2, 45, 3, 50, 4, 61],
    )
    for lengths in length_sets:
        for weight in (-1, 0, 1):
            for first, last in ((0, 79), (10, 70)):
                sums = np.full((2 * LENGTHS_PER_FAMILY, LANES), np.nan)
                lengths_row = np.array([0] * 9 + lengths, np.int64)
                run(x[first:], first, last, lengths_row, 9, weight, sums, 9, weights)
                for j, length in enumerate(lengths):
                    if last - length + 1 < first:
                        continue  # a window longer than the rows: never read
                    expected = [
                        _python_window_sum(x[first:, i], first, last, length, weight)
                        for i in range(LANES)
                    ]
                    assert sums[9 + j].tolist() == expected, (lengths, weight, j)
