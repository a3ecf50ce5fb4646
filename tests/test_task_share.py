"""Tasks shared between the calling thread and helper threads: the atomic counter, the
shared lane driver (same bits however many threads take part, a late helper changes
nothing) and the helper threads themselves."""

from __future__ import annotations

import logging
import threading

import numpy as np
from numba import njit
from parity_helpers import assert_bit_identical

from atc_stream.engine.engine import Engine
from atc_stream.kernels import cpu, task_share


@njit(nogil=True)
def _take_all(counter, total, taken):
    """Take numbers from ``counter`` until ``total``; mark each taken one."""
    while True:
        number = task_share.fetch_add(counter, 0, 1)
        if number >= total:
            return
        taken[number] += 1


def test_fetch_add_hands_each_number_to_exactly_one_thread():
    total = 200_000
    counter = np.zeros(2, np.int64)
    taken = [np.zeros(total, np.int64) for _ in range(4)]
    _take_all(counter, 1, np.zeros(1, np.int64))  # compiled before the threads race
    counter[:] = 0
    threads = [threading.Thread(target=_take_all, args=(counter, total, t)) for t in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    np.testing.assert_array_equal(sum(taken), np.ones(total, np.int64))
    assert counter[0] == total + len(threads)  # each thread's last take found none left
    assert _read(counter, 0) == total + len(threads) == counter[0]  # an add of 0 reads


@njit
def _read(counter, index):
    return task_share.fetch_add(counter, index, 0)


def _warmed_engine(n: int, threads: int = 1) -> tuple[Engine, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    closes = np.round(100 * np.exp(np.cumsum(rng.normal(0, 0.01, (n, 81)), axis=1)), 2)
    times = np.arange(81, dtype=np.int64) * 60_000
    engine = Engine(backend="cpu", threads=threads, outputs="all")
    engine.warmup({f"S{i}": (times[:80], closes[i, :80]) for i in range(n)})
    slots = np.concatenate([engine.slots_of(f"S{i}") for i in range(n)])
    return engine, slots, closes[:, 80]


def _block_call(engine: Engine, slots: np.ndarray, closes: np.ndarray):
    """The arguments ``CpuBackend`` gives a one-bar lane step of ``slots`` (planned)."""
    store, n = engine.store, slots.shape[0]
    ones = np.ones(n, np.int64)
    members, block_starts, _, in_place = cpu.plan_blocks(
        store.counters, store.params.lengths, slots, ones, cpu.MIN_BLOCK
    )
    out = np.full((n, 1, cpu.N_OUT), np.nan)
    times = np.full((n, 1), 80 * 60_000, np.int64)
    arrays = (store.ring, store.values, store.counters, store.params.lengths, store.params.values)
    return (*arrays, slots, times, closes.reshape(n, 1).copy(), ones, out, False, members,
            block_starts, in_place)  # fmt: skip


def test_shared_driver_run_by_three_threads_at_once_equals_the_serial_driver():
    n = 300  # 38 lane blocks: 19 tasks for three threads to take from
    serial_engine, slots, closes = _warmed_engine(n)
    serial_args = _block_call(serial_engine, slots, closes)
    cpu.run_blocks(serial_args, 1, 1)
    shared_engine, slots, closes = _warmed_engine(n)
    progress = np.zeros(task_share.N_COUNTERS, np.int64)
    shared_args = (*_block_call(shared_engine, slots, closes), progress, 2)
    cpu.warmup_blocks(*shared_args[:-2], np.full_like(progress, 10**6), 2)  # compiles
    start = threading.Barrier(3)

    def run():
        start.wait()
        cpu.warmup_blocks(*shared_args)

    helpers = [threading.Thread(target=run) for _ in range(2)]
    for helper in helpers:
        helper.start()
    run()
    for helper in helpers:
        helper.join()
    tasks = -(-(shared_args[12].shape[0] - 1) // 2)
    assert progress[task_share.DONE_TASKS] == tasks
    np.testing.assert_array_equal(shared_args[9], serial_args[9])  # output rows
    for field in ("ring", "values", "counters"):
        np.testing.assert_array_equal(
            getattr(shared_engine.store, field), getattr(serial_engine.store, field)
        )
    # a helper that arrives after the call finds no task left and changes nothing
    values = shared_engine.store.values.copy()
    cpu.warmup_blocks(*shared_args)
    np.testing.assert_array_equal(shared_engine.store.values, values)


def test_steps_with_helper_threads_equal_one_thread():
    n = 600
    one, slots, _ = _warmed_engine(n)
    helped, _, _ = _warmed_engine(n, threads=2)  # explicit: helpers join on any machine
    rng = np.random.default_rng(9)
    for bar in range(80, 100):
        closes = np.round(100 * np.exp(rng.normal(0, 0.02, n)), 2)
        times = np.full(n, bar * 60_000, np.int64)
        if bar % 5 == 0:
            closes[::97] = np.nan  # rejected rows: the planned (non-steady) path
        a, b = one.step_arrays(slots, times, closes), helped.step_arrays(slots, times, closes)
        assert_bit_identical(a.outputs, b.outputs, f"bar {bar}")
    np.testing.assert_array_equal(one.store.values, helped.store.values)
    np.testing.assert_array_equal(one.store.ring, helped.store.ring)


def test_helpers_keep_no_engine_alive():
    import gc
    import time
    import weakref

    engine, slots, closes = _warmed_engine(64, threads=2)
    engine.step_arrays(slots, np.full(slots.shape[0], 80 * 60_000), closes)
    values = weakref.ref(engine.store.values)
    del engine
    for _ in range(100):  # a helper still inside the call holds its arguments a moment
        gc.collect()
        if values() is None:
            break
        time.sleep(0.01)
    assert values() is None


def test_a_failing_helper_is_logged_once_and_stops_helping(caplog):
    helpers = task_share.HelperThreads()
    ran = threading.Event()
    calls = []

    def fail() -> None:
        calls.append("fail")
        ran.set()
        raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR, logger="atc_stream"):
        helpers.post(fail, (), 1)
        assert ran.wait(10)
        for _ in range(100):
            if caplog.records:
                break
            threading.Event().wait(0.01)
        ran.clear()
        helpers.post(fail, (), 1)
        assert not ran.wait(0.2)  # the failed helper runs no more jobs
    assert calls == ["fail"]
    assert sum("helper thread failed" in r.getMessage() for r in caplog.records) == 1


def test_a_forked_child_starts_its_own_helpers():
    """The helper threads stay in the parent; a forked child steps with helpers of its
    own and gets the same results."""
    import multiprocessing

    engine, slots, closes = _warmed_engine(300, threads=2)
    engine.step_arrays(slots, np.full(slots.shape[0], 80 * 60_000), closes)  # helpers start
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        child = pool.apply(_step_in_child, (closes,))
    one, slots, closes = _warmed_engine(300)
    expected = one.step_arrays(slots, np.full(slots.shape[0], 80 * 60_000), closes)
    np.testing.assert_array_equal(child, expected.fields["signal"])


def _step_in_child(closes: np.ndarray) -> np.ndarray:
    engine, slots, _ = _warmed_engine(300, threads=2)
    result = engine.step_arrays(slots, np.full(slots.shape[0], 80 * 60_000), closes)
    helpers = task_share.helper_threads()._threads
    assert any(thread.is_alive() for thread in helpers), "the child has helpers of its own"
    return result.fields["signal"]
