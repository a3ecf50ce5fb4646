"""Threading policy and its promise: serial and parallel drivers give bit-identical results."""

from __future__ import annotations

import numpy as np
import pytest
from numba import config

from atc_stream.core.params import ATCParams
from atc_stream.engine.engine import Engine
from atc_stream.engine.series import compute
from atc_stream.kernels import threads as policy

PARALLEL = max(2, config.NUMBA_NUM_THREADS)


def _history(n_symbols: int, n_bars: int, seed: int = 7):
    rng = np.random.default_rng(seed)
    closes = 100.0 * np.exp(np.cumsum(rng.normal(0, 0.01, (n_symbols, n_bars)), axis=1))
    times = np.arange(n_bars, dtype=np.int64)
    return {f"S{i}": (times, closes[i]) for i in range(n_symbols)}


def _run(threads: int):
    params = [ATCParams(), ATCParams(ema_len=14, cutout=10)]
    engine = Engine(params, backend="cpu", capacity=8, threads=threads, outputs="all")
    history = _history(40, 120)
    warm = engine.warmup(history)
    rng = np.random.default_rng(1)
    steps = []
    for t in range(120, 126):
        bars = [(s, t, float(c[-1] * (1 + rng.normal(0, 0.01)))) for s, (_, c) in history.items()]
        steps.append(engine.step(bars).outputs.copy())
    preview = engine.preview([(s, 126, 101.0) for s in history]).outputs.copy()
    return warm.outputs.copy(), steps, preview, engine.store.values.copy()


def test_serial_and_parallel_drivers_are_bit_identical():
    serial, parallel = _run(1), _run(PARALLEL)
    np.testing.assert_array_equal(serial[0], parallel[0])
    for a, b in zip(serial[1], parallel[1], strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(serial[2], parallel[2])
    np.testing.assert_array_equal(serial[3], parallel[3])


def test_compute_threads_setting_gives_the_same_columns():
    closes = 100.0 + np.cumsum(np.random.default_rng(3).normal(0, 1, 400)) * 0.1 + 50
    auto, one, many = compute(closes), compute(closes, threads=1), compute(closes, threads=4)
    for name in auto:
        np.testing.assert_array_equal(auto[name], one[name])
        np.testing.assert_array_equal(auto[name], many[name])


def test_small_batches_run_serially_and_big_ones_use_the_free_cpus():
    two = 2 * policy.MIN_WORK_PER_THREAD
    assert policy.choose_threads(two - 1, two) == 1  # under two threads' worth of work
    assert policy.choose_threads(100, 100) == 1  # a small batch never wakes the pool
    assert policy.choose_threads(two, two) == min(policy.available_cpus(), 2)
    big = policy.choose_threads(100_000, 100_000)
    assert big == min(policy.available_cpus(), 100_000 // policy.MIN_WORK_PER_THREAD)
    assert policy.choose_threads(100_000, 1) == 1  # one stream cannot be split
    assert policy.choose_threads(10, 10, threads=1) == 1
    assert policy.choose_threads(10, 10, threads=2) == min(2, config.NUMBA_NUM_THREADS)


def test_available_cpus_respects_the_affinity_mask():
    import os

    assert 1 <= policy.available_cpus() <= len(os.sched_getaffinity(0))


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_bad_thread_settings_are_rejected_clearly(bad):
    with pytest.raises(ValueError, match="threads"):
        Engine(backend="cpu", threads=bad, outputs="all")


def test_tuple_fast_path_matches_the_checked_path():
    """Same outputs whether a batch takes the column fast path or the per-item path."""
    history = _history(20, 60)
    fast_engine = Engine([ATCParams(), ATCParams(ema_len=14)], backend="cpu", outputs="all")
    slow_engine = Engine([ATCParams(), ATCParams(ema_len=14)], backend="cpu", outputs="all")
    fast_engine.warmup(history)
    slow_engine.warmup(history)
    bars = [(s, 60, np.float32(100.5)) if i % 2 else (s, np.int64(60), 99) for i, s in
            enumerate(history)]  # fmt: skip
    fast = fast_engine.step(bars)
    # one bad item sends the whole batch down the per-item path
    slow = slow_engine.step([*bars, ("A", "x", 1.0)])
    assert [r.reason for r in slow.rejected] == ["bad_time_type"]
    assert not fast.rejected
    np.testing.assert_array_equal(fast.outputs, slow.outputs)
    np.testing.assert_array_equal(fast.slots, slow.slots)


@pytest.mark.parametrize(
    "item, reason",
    [((["S1"], 60, 1.0), "unknown_symbol"), (("S1", True, 1.0), "bad_time_type"),
     (("S1", 60, False), "bad_close_type"), (("S1", np.uint64(60), 1.0), None),
     ([("S1", 60, 1.0)], "malformed_update"), ("S1x", "malformed_update")],
)  # fmt: skip
def test_items_the_fast_path_must_not_accept_are_checked(item, reason):
    engine = Engine(backend="cpu", outputs="all")
    engine.warmup(_history(2, 60))
    result = engine.step([("S0", 60, 100.0), item])
    assert [r.reason for r in result.rejected] == ([] if reason is None else [reason])
    assert len(result) == (2 if reason is None else 1)


def test_parallel_calls_from_two_python_threads_are_safe():
    """The workqueue layer cannot run two parallel kernels at once; the policy serialises them."""
    import threading

    expected = _run(1)[0]
    results, errors = [], []

    def work():
        try:
            for _ in range(3):
                results.append(_run(PARALLEL)[0])
        except Exception as exc:  # reported below, not swallowed
            errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors
    assert len(results) == 6
    for r in results:
        np.testing.assert_array_equal(r, expected)


def test_compiled_kernels_run_on_the_preferred_threading_layer():
    """Loading every kernel (the backtest's parallel kernel included) leaves numba on the
    preferred layer: the first parallel kernel a process loads fixes it for good."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}
    script = (
        "import numba\n"
        "from atc_stream import Engine\n"
        "Engine(backend='cpu').compile()\n"
        "print(numba.threading_layer())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == policy.PREFERRED_LAYER
