"""Periodic snapshots written in the background, never stalling the step loop
(docs/design/snapshots.md)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any

from atc_stream.state.snapshot import CapturedState, encode_snapshot, normalize_offsets

log = logging.getLogger("atc_stream.snapshots")

__all__ = ["Snapshotter"]


class Snapshotter:
    """Takes a snapshot of ``engine`` into ``store`` every ``every_bars`` bars and/or
    every ``every_seconds`` seconds (either may be None to disable that trigger).

    ``store`` is anything with ``save(blob) -> id`` (``DirectorySnapshotStore``,
    ``RedisSnapshotStore``). ``clock`` is for tests.
    """

    def __init__(
        self,
        engine: Any,
        store: Any,
        *,
        every_bars: int | None = 10_000,
        every_seconds: float | None = 60.0,
        compression: str = "zlib",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if every_bars is not None and (
            isinstance(every_bars, bool) or not isinstance(every_bars, int) or every_bars < 1
        ):
            raise ValueError(f"every_bars must be an int >= 1 or None, got {every_bars!r}")
        if every_seconds is not None and not every_seconds > 0:
            raise ValueError(f"every_seconds must be > 0 or None, got {every_seconds!r}")
        from atc_stream.state.snapshot import COMPRESSIONS

        if compression not in COMPRESSIONS:
            raise ValueError(
                f"compression must be one of {sorted(COMPRESSIONS)}, got {compression!r}"
            )
        self.engine = engine
        self.store = store
        self.every_bars = every_bars
        self.every_seconds = every_seconds
        self.compression = compression
        self._clock = clock
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="atc-snapshot")
        self._future: Future | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._last_capture = clock()
        #: bars applied since the last snapshot was captured
        self.bars_since_snapshot = 0
        self._dirty = False
        #: snapshots written successfully (background and final)
        self.snapshots_written = 0
        #: due snapshots put off because a write was still in flight
        self.skipped = 0
        #: failed background writes
        self.failures = 0
        self._failing = False
        self.last_id: str | None = None
        self.last_error: BaseException | None = None
        #: seconds spent copying on the caller's thread by the last capture
        self.last_capture_seconds = 0.0
        #: seconds the last background encode + write took
        self.last_write_seconds = 0.0

    # -- state ----------------------------------------------------------------------------

    @property
    def in_flight(self) -> bool:
        """True while a background write is running."""
        return self._future is not None and not self._future.done()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no write is in flight (or ``timeout``); True if none is."""
        future = self._future
        if future is None:
            return True
        try:
            future.result(timeout)
        except FutureTimeoutError:
            return False
        except Exception:  # failures are recorded by the worker
            pass
        return True

    def due(self) -> bool:
        """Whether a snapshot is due now (ignoring a write in flight)."""
        if self.every_bars is not None and self.bars_since_snapshot >= self.every_bars:
            return True
        return (
            self.every_seconds is not None
            and self._dirty
            and self._clock() - self._last_capture >= self.every_seconds
        )

    # -- the run loop's calls -------------------------------------------------------------------

    def maybe_snapshot(
        self,
        bars_applied: int = 0,
        source_offsets: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
    ) -> bool:
        """Count ``bars_applied`` (bars applied since the previous call, e.g.
        ``len(step_result)``) and record ``source_offsets`` into ``engine.source_offsets``;
        start a background snapshot if one is due and none is in flight.

        ``source_offsets`` may be a callable: it is called only when a snapshot is taken,
        right before the state is copied (for offsets that cost something to make durable,
        such as flushing and fsyncing an output file).

        Returns True when a snapshot was started. Never blocks on the store.
        """
        self._check_open()
        if bars_applied < 0:
            raise ValueError(f"bars_applied must be >= 0, got {bars_applied!r}")
        self.bars_since_snapshot += int(bars_applied)
        if bars_applied:
            self._dirty = True
        if source_offsets and not callable(source_offsets):
            offsets = normalize_offsets(source_offsets)
            if any(self.engine.source_offsets.get(k) != v for k, v in offsets.items()):
                self._dirty = True
                self.engine.source_offsets.update(offsets)
        if not self.due():
            return False
        if self.in_flight:
            self.skipped += 1
            return False
        if callable(source_offsets):
            self.engine.source_offsets.update(normalize_offsets(source_offsets()))
        self._start()
        return True

    def snapshot_now(self, source_offsets: Mapping[str, Any] | None = None) -> bool:
        """Start a background snapshot now unless one is in flight (then False)."""
        self._check_open()
        if source_offsets:
            self.engine.source_offsets.update(normalize_offsets(source_offsets))
        if self.in_flight:
            self.skipped += 1
            return False
        self._start()
        return True

    def _capture(self) -> CapturedState:
        t0 = time.perf_counter()
        captured = self.engine.capture_snapshot(copy=True)
        self.last_capture_seconds = time.perf_counter() - t0
        self._last_capture = self._clock()
        self.bars_since_snapshot = 0
        self._dirty = False
        return captured

    def _start(self) -> None:
        captured = self._capture()
        self._future = self._executor.submit(self._write, captured, True)

    def _write(self, captured: CapturedState, background: bool) -> str | None:
        t0 = time.perf_counter()
        try:
            snapshot_id = self.store.save(encode_snapshot(captured, self.compression))
        except Exception as exc:
            if not background:
                raise
            with self._lock:
                self.failures += 1
                self.last_error = exc
                self._dirty = True  # the state is still unsaved: the next trigger retries
                first = not self._failing
                self._failing = True
            if first:  # once per outage, not once per attempt
                log.error(
                    "snapshot write to %r failed: %s (retried at each later trigger; "
                    "further failures are only counted)", self.store, exc,
                )  # fmt: skip
            return None
        with self._lock:
            if self._failing:
                log.warning("snapshot writes to %r work again", self.store)
            self._failing = False
            self.snapshots_written += 1
            self.last_id = snapshot_id
            self.last_write_seconds = time.perf_counter() - t0
        log.info(
            "snapshot %s written (%.3f s, %d bars behind now at most)",
            snapshot_id,
            self.last_write_seconds,
            self.bars_since_snapshot,
        )
        return snapshot_id

    # -- shutdown -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this Snapshotter is closed")

    def close(self, source_offsets: Mapping[str, Any] | None = None) -> str | None:
        """Wait for the write in flight, then write a final snapshot synchronously.

        Returns the final snapshot's id; errors of the final write propagate. A second
        call does nothing and returns None.
        """
        if self._closed:
            return None
        self._closed = True
        try:
            self.wait()
            if source_offsets:
                self.engine.source_offsets.update(normalize_offsets(source_offsets))
            return self._write(self._capture(), False)
        finally:
            self._executor.shutdown(wait=True)

    def __enter__(self) -> Snapshotter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
