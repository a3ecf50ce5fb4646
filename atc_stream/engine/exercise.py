"""The kernel exercise of ``Engine.compile``: every CPU kernel an engine calls, run once
on tiny inputs so that ``kernels.prepare`` compiles or loads each before real work."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from atc_stream.core.strategy import Strategy
from atc_stream.engine.backtest import backtest


def exercise_kernels(
    engine_cls: type, threads: int, tick: Callable[[], object], strategies: bool = True
) -> None:
    """Every CPU kernel an engine calls, once, with the argument types of real calls
    (``kernels.prepare``'s exercise: ``kernels.prepare.CALLS_PER_EXERCISE`` calls, or
    ``ATC_CALLS_PER_EXERCISE`` without the ``strategies`` kernels)."""
    from atc_stream.kernels.cpu import BLOCKS_PER_TASK, LANES, MIN_BLOCK

    engine = engine_cls(backend="cpu", capacity=2, threads=threads)
    times = np.arange(3, dtype=np.int64)
    # streams of one phase in two units of parallel work (64 + 4 in lane blocks): with
    # one, the exercise would never run the lane driver beside helper threads
    names = [f"S{i}" for i in range(LANES * BLOCKS_PER_TASK + MIN_BLOCK)]
    engine.warmup({name: (times, np.array([1.0, 2.0, 3.0])) for name in names})
    tick()
    # two short histories, fewer than a lane block: the scalar warmup drivers
    engine.warmup({name: (times, np.array([1.0, 2.0, 3.0])) for name in ("T0", "T1")})
    tick()
    every = np.concatenate([engine.slots_of(name) for name in names])
    engine.step_arrays(every, np.full(every.shape[0], 3), np.full(every.shape[0], 4.0))
    tick()
    # two streams per call: with one, every call runs (and loads) only the serial driver
    both = np.concatenate([engine.slots_of(names[0]), engine.slots_of(names[1])])
    engine.step_arrays(both, [4, 4], [4.0, 2.0])
    tick()
    engine.preview_arrays(both, [5, 5], [5.0, 3.0])
    tick()
    # the same streams again, each once, all accepted: the steady step's shortcut (a
    # live feed's second bar), whose check would otherwise load in the middle of it
    engine.step_arrays(both, [5, 5], [5.0, 3.0])
    tick()
    engine.stream_state(engine.streams[0])
    tick()
    if strategies:
        _exercise_strategy_kernels(engine_cls, threads, tick)


def _exercise_strategy_kernels(engine_cls: type, threads: int, tick: Callable[[], object]) -> None:
    """The strategy kernels of paper trading (warmup, step) and of ``backtest``."""
    trader = engine_cls(backend="cpu", capacity=2, threads=threads, strategies=Strategy())
    times = np.arange(3, dtype=np.int64)
    prices = np.array([1.0, 2.0, 3.0])
    trader.warmup({s: (times, prices, prices, prices, prices) for s in ("A", "B")})
    tick()
    both = np.concatenate([trader.slots_of("A"), trader.slots_of("B")])
    four = np.array([4.0, 4.0])
    trader.step_arrays(both, [3, 3], four, opens=four, highs=four, lows=four)
    tick()
    table = {"symbol": np.array(["A", "A", "A"]), "time": times}
    backtest(table | {k: prices for k in ("open", "high", "low", "close")}, backend="cpu")
    tick()
