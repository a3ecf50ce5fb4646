"""Compile (first run) or load (later runs) every CPU kernel before real work starts.

``prepare_kernels`` drives a one-stream engine through warmup, step and preview on
the serial and the parallel drivers, so each dispatcher gets exactly the argument
types real calls use and is compiled or loaded from the keyed on-disk cache
(``kernels/cache.py``) now rather than inside a live event loop or a timed bar.
It reports what it did: ``Engine.compile()``, ``atc-stream compile`` and the CLI
commands call it first, and ``Engine.warmup(progress=True)`` runs it as a phase of its
own, so a progress bar's bars/s and ETA never include compilation. With ``progress``
the phase is a tqdm bar of its own ("compiling kernels (first run only)" or "loading
kernels").
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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


def _dispatchers():
    from . import batch, cpu

    planners = (batch.plan_rounds, batch.check_previews, batch.check_history)
    return (*cpu.DRIVERS, *planners)


def _cache_misses() -> int:
    return sum(sum(d.stats.cache_misses.values()) for d in _dispatchers())


def _pool_threads() -> int:
    from numba import config

    from .threads import available_cpus

    return max(2, min(available_cpus(), config.NUMBA_NUM_THREADS))


#: kernel calls one ``_exercise`` makes (the progress bar's unit)
_CALLS_PER_EXERCISE = 4


def _exercise(threads: int, tick: Callable[[], object]) -> None:
    from ..engine import Engine

    engine = Engine(backend="cpu", capacity=2, threads=threads)
    times = np.arange(3, dtype=np.int64)
    engine.warmup({"A": (times, np.array([1.0, 2.0, 3.0])), "B": (times, np.ones(3))})
    tick()
    # two streams per call: with one, every call runs (and loads) only the serial driver
    both = np.concatenate([engine.slots_of("A"), engine.slots_of("B")])
    engine.step_arrays(both, [3, 3], [4.0, 2.0])
    tick()
    engine.preview_arrays(both, [4, 4], [5.0, 3.0])
    tick()
    engine.stream_state(engine.streams[0])
    tick()


def kernels_loaded() -> bool:
    """True when this process already holds every CPU kernel (compiled or loaded)."""
    return all(d.signatures for d in _dispatchers())


def prepare_kernels(
    report: Callable[[str], None] | None = None, *, progress: bool = False
) -> PrepareReport:
    """Compile or load every CPU kernel; ``report`` gets a line before a first-run compile,
    and ``progress`` shows the phase as a tqdm bar of its own.

    Later processes load from the cache in well under a second; a first run (or one
    after an upgrade or an edited kernel source) compiles, which takes 10-60 s.
    """
    from . import cache

    try:
        directory: Path | None = cache.cache_dir()
    except OSError:
        directory = None
    started = time.perf_counter()
    misses_before = _cache_misses()
    first_run = not cache.is_populated()
    if report is not None and first_run:
        report(f"{FIRST_RUN_MESSAGE}; cached in {directory} ...")
    with _phase_bar(progress, FIRST_RUN_MESSAGE if first_run else "loading kernels") as bar:
        _exercise(threads=1, tick=bar.update)
        _exercise(threads=_pool_threads(), tick=bar.update)
    compiled = _cache_misses() > misses_before or directory is None
    return PrepareReport(compiled, time.perf_counter() - started, directory)


class _NoBar:
    """Stands in for the phase bar when no progress is shown (tqdm is then not imported:
    ``Engine.compile()`` runs where only numpy and numba are installed)."""

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self) -> None:
        pass


def _phase_bar(progress: bool, description: str):
    if not progress:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(
        total=2 * _CALLS_PER_EXERCISE, desc=description, unit="kernel",
        leave=False, bar_format="{desc}: {n_fmt}/{total_fmt} {bar} {elapsed}",
    )  # fmt: skip


def prepare_for_cli(engine, err: Callable[[str], None]) -> None:
    """Before a command reads input: compile/load the CPU kernels, saying so on a first run.

    So progress bars, ``--max-seconds`` and the event loop never include compilation.
    Other backends compile their own kernels; only the CPU kernels are cached here.
    """
    if getattr(engine.backend, "name", None) != "cpu":
        return
    result = prepare_kernels(lambda line: err(f"atc-stream: {line}"), progress=sys.stderr.isatty())
    if result.compiled:
        err(f"atc-stream: {result.summary()}")


def compile_command(err: Callable[[str], None]) -> int:
    """``atc-stream compile``: fill the cache (e.g. in a Docker build step); exit status."""
    try:
        result = prepare_kernels(lambda line: err(f"atc-stream: {line}"))
    except OSError as exc:
        err(f"atc-stream: cannot compile kernels: {exc}")
        return 2
    err(f"atc-stream: {result.summary()}")
    return 0
