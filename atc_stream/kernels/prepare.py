"""Compile (first run) or load (later runs) every CPU kernel before real work starts.

``prepare_kernels`` drives a one-stream engine through warmup, step and preview on
the serial and the parallel drivers, so each dispatcher gets exactly the argument
types real calls use and is compiled or loaded from the keyed on-disk cache
(``kernels/cache.py``) now rather than inside a live event loop or a timed bar.
It reports what it did: ``Engine.compile()``, ``atc-stream compile`` and the CLI
commands that connect to a feed call it first.
"""

from __future__ import annotations

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


def _exercise(threads: int) -> None:
    from ..engine import Engine

    engine = Engine(backend="cpu", capacity=2, threads=threads)
    times = np.arange(3, dtype=np.int64)
    engine.warmup({"A": (times, np.array([1.0, 2.0, 3.0])), "B": (times, np.ones(3))})
    engine.step_arrays(engine.slots_of("A"), [3], [4.0])
    engine.preview_arrays(engine.slots_of("A"), [4], [5.0])
    engine.stream_state(engine.streams[0])


def prepare_kernels(report: Callable[[str], None] | None = None) -> PrepareReport:
    """Compile or load every CPU kernel; ``report`` gets a line before a first-run compile.

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
    if report is not None and not cache.is_populated():
        report(f"{FIRST_RUN_MESSAGE}; cached in {directory} ...")
    _exercise(threads=1)
    _exercise(threads=_pool_threads())
    compiled = _cache_misses() > misses_before or directory is None
    return PrepareReport(compiled, time.perf_counter() - started, directory)


def prepare_for_cli(engine, err: Callable[[str], None]) -> None:
    """Before a command reads input: compile/load the CPU kernels, saying so on a first run.

    So progress bars, ``--max-seconds`` and the event loop never include compilation.
    Other backends compile their own kernels; only the CPU kernels are cached here.
    """
    if getattr(engine.backend, "name", None) != "cpu":
        return
    result = prepare_kernels(lambda line: err(f"atc-stream: {line}"))
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
