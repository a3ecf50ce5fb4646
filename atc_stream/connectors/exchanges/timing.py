"""Timings of the live feed at a tiny cost: fixed-bucket histograms and a queue that notes
when each item was put in (the start of a kline's way to the publisher)."""

from __future__ import annotations

import asyncio
import collections
from bisect import bisect_left
from collections.abc import Sequence
from time import perf_counter
from typing import Any

import numpy as np

#: Upper bounds (seconds) of the buckets of one engine step's time.
STEP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                0.25, 0.5, 1.0, 2.5)  # fmt: skip
#: Upper bounds (seconds) of the buckets of a closed kline's time from receipt to publisher.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0)  # fmt: skip


class BucketHistogram:
    """Observations counted in fixed buckets (``counts[i]``: values in ``(bounds[i-1],
    bounds[i]]``, the last one above every bound), with their sum: what a Prometheus
    histogram exposes, kept without an object per observation."""

    def __init__(self, bounds: Sequence[float]) -> None:
        edges = [float(b) for b in bounds]
        if not edges or edges != sorted(set(edges)):
            raise ValueError(f"bounds must be increasing and not empty, got {bounds!r}")
        self.bounds = tuple(edges)
        self._edges = np.array(edges)
        self.counts = np.zeros(len(edges) + 1, np.int64)
        self.sum = 0.0

    @property
    def count(self) -> int:
        """Observations so far."""
        return int(self.counts.sum())

    def observe(self, value: float) -> None:
        """One observation (about 0.5 us)."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def observe_many(self, values: np.ndarray) -> None:
        """A batch of observations in one pass."""
        if values.size:
            where = np.searchsorted(self._edges, values, side="left")
            self.counts += np.bincount(where, minlength=self.counts.size)
            self.sum += float(values.sum())

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations <= it)`` per bucket, ``inf`` last."""
        totals = np.cumsum(self.counts).tolist()
        return list(zip([*self.bounds, float("inf")], totals, strict=True))


class StampedQueue(asyncio.Queue[Any]):
    """An ``asyncio.Queue`` that notes when each item was put in (``perf_counter``);
    ``taken`` holds those times of the items got since the consumer last cleared it, in
    the order they were got. About 0.2 us an item more than a plain queue."""

    # the queue's documented overridable methods, written out: super() calls cost more
    def _init(self, maxsize: int) -> None:
        self._queue: collections.deque[Any] = collections.deque()
        self._stamps: collections.deque[float] = collections.deque()
        self.taken: list[float] = []

    def _put(self, item: Any) -> None:
        self._queue.append(item)
        self._stamps.append(perf_counter())

    def _get(self) -> Any:
        self.taken.append(self._stamps.popleft())
        return self._queue.popleft()

    def take(self, limit: int) -> list[Any]:
        """Up to ``limit`` items, without waiting: what ``get_nowait`` in a loop gives
        (their put times go to ``taken``), without its per-item calls when no producer
        waits for room (a burst of 200 klines is taken in one go)."""
        queue, stamps = self._queue, self._stamps
        n = min(limit, len(queue))
        # a producer waits for room (asyncio.Queue's own list of them): each get wakes one
        if self._putters:  # type: ignore[attr-defined]
            return [self.get_nowait() for _ in range(n)]
        if n == len(queue):
            items = list(queue)
            queue.clear()
            self.taken += stamps
            stamps.clear()
            return items
        self.taken += [stamps.popleft() for _ in range(n)]
        return [queue.popleft() for _ in range(n)]
