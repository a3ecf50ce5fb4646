"""Threading policy for the CPU drivers: how many threads one call should use.

Design: docs/design/kernels.md, "Threads".
"""

from __future__ import annotations

import functools
import math
import os
import threading
from pathlib import Path
from typing import Any

#: Stream-bars of work each thread must get before a call goes parallel. In lane blocks a
#: step costs ~0.5-0.7 us a stream and a warmup ~0.2 us a stream-bar, and on the 2-vCPU
#: machine two threads start to beat one at ~3,000 streams a step (1,000: 0.73 ms on one,
#: 0.77 on two; 4,000: 2.81 / 2.78; 5,000: 3.16 / 2.02 ms; RESULTS.md, bench_threads): the
#: wake-up of a sleeping workqueue pool and each thread's cold caches cost about as
#: much as a thousand streams. Two threads' worth of work is therefore 3,000. Lane blocks
#: now run on helper threads (``task_share``), which pay from 1,000 streams back to back
#: on a quiet machine but not at a live cadence or beside a busy process (same page).
MIN_WORK_PER_THREAD = 1_500


def numba_config() -> Any:
    """``numba.core.config``, whose settings (``NUMBA_NUM_THREADS``...) are set from the
    environment at import time: invisible to a type checker, hence ``Any``."""
    from numba.core import config

    return config


def _cgroup_cpu_limit() -> float | None:
    """CPUs allowed by the cgroup CPU quota (v2 ``cpu.max`` or v1 cfs), None if unlimited."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        base = Path("/sys/fs/cgroup/cpu")
        cfs_quota = int((base / "cpu.cfs_quota_us").read_text())
        cfs_period = int((base / "cpu.cfs_period_us").read_text())
        return None if cfs_quota <= 0 else cfs_quota / cfs_period
    except (OSError, ValueError):
        return None


@functools.lru_cache(maxsize=1)
def available_cpus() -> int:
    """CPUs this process can run on: affinity mask, cgroup quota and numba's thread cap."""
    config = numba_config()

    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = _cgroup_cpu_limit()
    if quota is not None:
        cpus = min(cpus, max(1, math.floor(quota)))
    return max(1, min(cpus, config.NUMBA_NUM_THREADS))


#: Process-wide thread setting for engines created without ``threads=`` (``--threads``).
_default_threads: int | None = None


def set_default_threads(threads: int | None) -> None:
    """Set the thread count used when an engine or ``compute`` gets no ``threads=``."""
    global _default_threads
    _default_threads = check_threads(threads)


def resolve_threads(threads: int | None) -> int | None:
    """A validated explicit setting, else the process default (None: automatic)."""
    threads = check_threads(threads)
    return _default_threads if threads is None else threads


def check_threads(threads: int | None) -> int | None:
    """Validate a user's ``threads`` setting (None or 0 = automatic)."""
    if threads is None or threads == 0:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ValueError(f"threads must be a positive int or None (automatic), got {threads!r}")
    return threads


def choose_threads(work: int, parallel_units: int, threads: int | None = None) -> int:
    """Threads for a call with ``work`` stream-bars spread over ``parallel_units`` streams.

    ``threads`` (from the user) wins, capped by numba's pool size and the units there
    are to share; otherwise one thread per ``MIN_WORK_PER_THREAD`` of work, at most
    ``available_cpus()``.
    """
    config = numba_config()

    if threads is not None:
        return max(1, min(threads, config.NUMBA_NUM_THREADS, max(parallel_units, 1)))
    by_work = work // MIN_WORK_PER_THREAD
    return max(1, min(by_work, parallel_units, available_cpus()))


#: numba threading layer used unless ``NUMBA_THREADING_LAYER`` says otherwise. On the
#: 2-vCPU machine, shared with other work, omp's spin-then-sleep workers cost more than
#: the work (1,000 symbols back to back: 12 ms on 2 omp threads vs 1.6 ms on 2 workqueue
#: threads and 2.4 ms on one), and at a 50 ms cadence workqueue was again fastest
#: (RESULTS.md, "threads"). tbb is not a dependency. workqueue must not run two
#: parallel kernels at once, hence ``_parallel_lock``.
PREFERRED_LAYER = "workqueue"
_parallel_lock = threading.Lock()
_layer_chosen = False


def _choose_layer() -> None:
    global _layer_chosen
    config = numba_config()
    from numba.np.ufunc import parallel as numba_parallel

    if not _layer_chosen:
        _layer_chosen = True
        if "NUMBA_THREADING_LAYER" not in os.environ and not numba_parallel._is_initialized:
            config.THREADING_LAYER = PREFERRED_LAYER


def run_parallel(parallel, *args) -> None:
    """Call a parallel-only kernel (numba's current thread count) under the same layer
    choice and lock as ``run``: the first parallel kernel a process loads fixes the layer
    for good, so every one goes through here or ``run``."""
    _choose_layer()
    with _parallel_lock:
        parallel(*args)


def run(serial, parallel, n_threads: int, *args) -> None:
    """Call the serial driver for one thread, else the parallel one on ``n_threads``."""
    if n_threads <= 1:
        serial(*args)
        return
    import numba

    _choose_layer()
    with _parallel_lock:  # one parallel kernel at a time (they use every core anyway)
        numba.set_num_threads(n_threads)
        parallel(*args)
