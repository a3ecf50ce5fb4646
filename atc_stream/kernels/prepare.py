"""Compile (first run) or load (later runs) every CPU kernel before real work starts.

Design: docs/design/kernels.md, "Compiling before work".
"""

from __future__ import annotations

import _thread
import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atc_stream.core.progress import progress_bar

FIRST_RUN_MESSAGE = "compiling kernels (first run only)"


@dataclass(frozen=True)
class PrepareReport:
    """What ``prepare_kernels`` did: compiled or loaded, how long, where the cache lives."""

    compiled: bool
    seconds: float
    cache_dir: Path | None

    def summary(self) -> str:
        where = f" (cache: {self.cache_dir})" if self.cache_dir else " (no writable cache)"
        verb = "compiled" if self.compiled else "loaded compiled"
        return f"{verb} kernels in {self.seconds:.1f} s{where}"


def _dispatchers(strategies: bool = True):
    """The CPU kernels an engine calls; with ``strategies``, paper trading's and
    ``backtest``'s too."""
    from atc_stream.kernels import backtest_cpu, batch, cpu, paper_cpu

    planners = (
        batch.plan_rounds, batch.check_unique_step, batch.check_previews,
        batch.check_history, cpu.plan_blocks, cpu.steady_param_rows, cpu.event_columns,
    )  # fmt: skip
    if not strategies:
        return (*cpu.DRIVERS, *planners)
    return (*cpu.DRIVERS, *planners, *paper_cpu.DRIVERS, backtest_cpu.backtest_streams)


def _cache_misses(strategies: bool = True) -> int:
    return sum(sum(d.stats.cache_misses.values()) for d in _dispatchers(strategies))


def _pool_threads() -> int:
    from atc_stream.kernels.threads import available_cpus, numba_config

    return max(2, min(available_cpus(), numba_config().NUMBA_NUM_THREADS))


#: kernel calls one exercise makes (the progress bar's unit): ATC's, then the strategies'
ATC_CALLS_PER_EXERCISE = 7
CALLS_PER_EXERCISE = 10


def kernels_loaded(strategies: bool = True) -> bool:
    """True when this process already holds every CPU kernel (compiled or loaded); with
    ``strategies`` False, every kernel of an engine without strategies."""
    return all(d.signatures for d in _dispatchers(strategies))


def prepare_kernels(
    exercise: Callable[[int, Callable[[], object]], None],
    report: Callable[[str], None] | None = None,
    *,
    progress: bool = False,
    strategies: bool = True,
) -> PrepareReport:
    """Compile or load the CPU kernels by running ``exercise(threads, tick)`` serially and
    on the thread pool; ``report`` gets a line before a first-run compile, and
    ``progress`` shows the phase as a tqdm bar of its own.

    ``exercise`` makes ``CALLS_PER_EXERCISE`` kernel calls (``ATC_CALLS_PER_EXERCISE``
    without ``strategies``; ``tick`` after each) with the argument types real calls use
    (``Engine.compile`` passes an engine's warmup, step, preview and stream state, and
    with ``strategies`` a strategy engine's warmup and step and a ``backtest``), so every
    dispatcher those calls reach is compiled or loaded now.

    Later processes load from the cache in well under a second; a first run (or one
    after an upgrade or an edited kernel source) compiles, which takes about 3 minutes on
    2 vCPUs with the strategy kernels and about 80 s without them.
    """
    from atc_stream.kernels import cache

    try:
        directory: Path | None = cache.cache_dir()
    except OSError:
        directory = None
    started = time.perf_counter()
    misses_before = _cache_misses(strategies)
    first_run = not cache.is_populated()
    if report is not None and first_run:
        report(f"{FIRST_RUN_MESSAGE}; cached in {directory} ...")
    calls = CALLS_PER_EXERCISE if strategies else ATC_CALLS_PER_EXERCISE
    description = FIRST_RUN_MESSAGE if first_run else "loading kernels"
    with _interrupts_kept(), _phase_bar(progress, description, 2 * calls) as bar:
        exercise(1, bar.update)
        exercise(_pool_threads(), bar.update)
    compiled = _cache_misses(strategies) > misses_before or directory is None
    return PrepareReport(compiled, time.perf_counter() - started, directory)


@contextlib.contextmanager
def _interrupts_kept() -> Iterator[None]:
    """Ctrl-C while LLVM compiles: the first Python code to run after it is often one of
    llvmlite's ctypes callbacks, where the ``KeyboardInterrupt`` is only reported (a
    traceback on stderr) and the compile goes on for minutes, or fails for the callback's
    work left undone. Such an interrupt is not reported but stops the compile."""
    previous = sys.unraisablehook
    again: list[threading.Timer] = []

    def hook(unraisable: Any) -> None:
        if unraisable.exc_type is None or not issubclass(unraisable.exc_type, KeyboardInterrupt):
            previous(unraisable)
        elif not (again and again[-1].is_alive()):  # one lost again: delivered again
            # a moment later, from another thread: delivered now, it would be raised in
            # this hook, still inside the callback, and be lost the same way
            timer = threading.Timer(0.05, _thread.interrupt_main)
            timer.daemon = True
            timer.start()
            again.append(timer)

    sys.unraisablehook = hook
    try:
        yield
    except Exception:
        if not again:
            raise
        raise KeyboardInterrupt from None  # a failure of what the lost interrupt cut short
    finally:
        for timer in again:
            timer.cancel()
        sys.unraisablehook = previous


def _phase_bar(progress: bool, description: str, total: int):
    return progress_bar(
        progress, total=total, desc=description, unit="kernel",
        leave=False, bar_format="{desc}: {n_fmt}/{total_fmt} {bar} {elapsed}",
    )  # fmt: skip
