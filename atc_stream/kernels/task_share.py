"""Tasks of one CPU call shared by the calling thread and helper threads: an atomic task
counter for numba kernels, and the helper threads that join a call when they wake.

Design: docs/design/kernels.md, "Threads". numba's parallel drivers hand the work to
pool threads and wait: on a VM, waking them costs 60-90 us a call, a third of a step of
1,000 symbols. Here the calling thread starts on the work at once and helpers take tasks
from the same counter when they arrive; a helper that arrives late finds no task left,
so a call is never slower than one thread by more than the tasks in flight.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

log = logging.getLogger("atc_stream")


def _fetch_add(typingctx, counters, index, amount):
    """``counters[index] += amount`` as one atomic (sequentially consistent) operation;
    returns the value before. ``amount`` 0 is an atomic read."""
    if (
        isinstance(counters, types.Array)
        and counters.dtype == types.int64
        and counters.ndim == 1
        and isinstance(index, types.Integer)
        and isinstance(amount, types.Integer)
    ):

        def codegen(context, builder, signature, args):
            array = context.make_array(signature.args[0])(context, builder, args[0])
            position = context.cast(builder, args[1], signature.args[1], types.intp)
            value = context.cast(builder, args[2], signature.args[2], types.int64)
            pointer = cgutils.gep(builder, array.data, position)
            return builder.atomic_rmw("add", pointer, value, "seq_cst")

        return types.int64(counters, index, amount), codegen
    return None


fetch_add: Any = intrinsic(_fetch_add)

#: the counters of one shared call: ``[NEXT_TASK]`` the next task to take,
#: ``[DONE_TASKS]`` the tasks finished
NEXT_TASK = 0
DONE_TASKS = 1
N_COUNTERS = 2


class HelperThreads:
    """Daemon threads that run the job last posted, then wait for the next post.

    ``post(job, args, helpers)`` wakes up to ``helpers`` of them; each calls
    ``job(*args)`` unless the caller has ``retire``d it by then. A job must be safe to
    run by any number of threads at any time after it was posted, including after its
    caller has finished it (``fetch_add`` counters whose tasks are all taken make a late
    run a no-op): a helper that wakes late may run the newest job rather than the one it
    was woken for.
    """

    def __init__(self) -> None:
        self._wake = threading.Semaphore(0)
        self._job: tuple[Callable[..., object], tuple] | None = None
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def post(self, job: Callable[..., object], args: tuple, helpers: int) -> None:
        with self._lock:
            while len(self._threads) < helpers:
                thread = threading.Thread(
                    target=self._serve, name=f"atc-stream-helper-{len(self._threads)}",
                    daemon=True,
                )  # fmt: skip
                thread.start()
                self._threads.append(thread)
        self._job = (job, args)
        self._wake.release(helpers)

    def retire(self, args: tuple) -> None:
        """The caller finished the job it posted with ``args``: a helper waking later
        finds nothing to run, and the job's arrays are not kept alive by the helpers."""
        posted = self._job
        if posted is not None and posted[1] is args:
            self._job = None

    def _serve(self) -> None:
        failed = False
        while True:
            self._wake.acquire()
            posted = self._job
            if posted is None or failed:
                continue
            job, args = posted
            try:
                job(*args)
            except Exception:  # the caller finishes every task itself; never again
                log.exception("a helper thread failed; CPU calls continue without helpers")
                failed = True


_helpers: HelperThreads | None = None
_helpers_lock = threading.Lock()


def _forget_helpers() -> None:
    """In a forked child: the helper threads stayed in the parent, so start anew."""
    global _helpers, _helpers_lock
    _helpers = None
    _helpers_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_helpers)


def helper_threads() -> HelperThreads:
    """The process's helper threads (started when a call first asks for them)."""
    global _helpers
    with _helpers_lock:
        if _helpers is None:
            _helpers = HelperThreads()
        return _helpers
