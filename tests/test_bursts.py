"""Garbage collection and start-up work go between the bursts of closed klines, not inside
them; the step's path is warmed up once just before each."""

from __future__ import annotations

import asyncio
import gc
import math
import time
import weakref

from atc_stream.connectors.exchanges.bursts import BurstClock
from atc_stream.connectors.exchanges.idle_gc import IdleCollector

IV = 1_000
T0 = 1_700_000_000_000  # an open time on the grid


def test_no_burst_is_expected_before_a_step_or_on_calendar_bars():
    now = [T0 + 500]
    assert BurstClock(IV, lambda: now[0]).room_s() == math.inf
    months = BurstClock(None, lambda: now[0])
    months.stepped(T0)
    assert months.room_s() == math.inf


def test_the_room_runs_from_the_end_of_a_burst_to_just_before_the_next_close():
    now = [0]
    clock = BurstClock(IV, lambda: now[0])
    clock.stepped(T0, now_ms=T0 + IV + 3)  # the bar opening at T0 closed 3 ms ago
    assert clock.settle_ms == BurstClock.MIN_SETTLE_MS  # 3 + 10 < the least settle
    for phase, room_ms in [(0, 0), (5, 0), (19, 0), (20, 975), (500, 495), (994, 1),
                           (996, 0)]:  # fmt: skip
        now[0] = T0 + 7 * IV + phase  # any later bar: the grid's phase is what counts
        assert math.isclose(clock.room_s(), room_ms / 1000), (phase, clock.room_s())


def test_slow_bursts_are_given_longer_to_settle_and_backfills_do_not_count():
    now = [0]
    clock = BurstClock(IV, lambda: now[0])
    clock.stepped(T0, now_ms=T0 + IV + 40)  # a burst stepped 40 ms after its close
    assert clock.settle_ms == 50
    clock.stepped(T0 - 100 * IV, now_ms=T0 + IV + 41)  # a backfill of old bars
    assert clock.settle_ms == 50
    clock.stepped(T0, now_ms=T0 + IV + 700, burst=False)  # histories caught up
    assert clock.settle_ms == 50
    clock.stepped(T0, now_ms=T0 + IV + 900)
    assert clock.settle_ms == IV / 2  # at most half an interval
    now[0] = T0 + IV + 100
    assert clock.room_s() == 0.0
    hours = BurstClock(3_600_000, lambda: now[0])
    hours.stepped(T0, now_ms=T0 + 3_600_000 + 600_000)  # a burst stepped 10 min late
    assert hours.settle_ms == BurstClock.MAX_SETTLE_MS


def test_work_waits_for_the_room_after_the_next_burst():
    iv = 200
    clock = BurstClock(iv, lambda: int(time.time() * 1000))

    async def main() -> None:
        now = int(time.time() * 1000)
        # the latest close was 170 ms ago: 25 ms of room left, too little for 50 ms
        clock.stepped(now - 170 - iv, now_ms=now)
        started = time.monotonic()
        await clock.wait_for_room(0.05)
        waited = time.monotonic() - started
        assert clock.room_s() >= 0.05
        assert 0.03 + clock.settle_ms / 1000 - 0.01 <= waited < 0.15, waited
        # work longer than the room between two bursts starts right after one
        started = time.monotonic()
        await clock.wait_for_room(10.0)
        assert time.monotonic() - started < iv / 1000 + 0.05
        assert clock.room_s() > 0

    asyncio.run(main())


def test_a_rest_page_waits_for_the_burst_due_before_it_would_be_parsed():
    """A REST page (``clear_for_page``) due 3 ms before a close waits until that close's
    burst has settled; one in the middle of an interval goes at once."""
    iv = 200
    clock = BurstClock(iv, lambda: int(time.time() * 1000))

    async def main() -> None:
        now = int(time.time() * 1000)
        clock.stepped(now + 3 - 2 * iv, now_ms=now)  # the next close is 3 ms away
        await clock.clear_for_page()
        assert clock.room_s() >= BurstClock.PAGE_S
        assert clock._phase(int(time.time() * 1000)) >= clock.settle_ms
        clock.stepped(int(time.time() * 1000) - iv - iv // 2)  # half an interval to go
        started = time.monotonic()
        await clock.clear_for_page()
        assert time.monotonic() - started < iv / 2000

    asyncio.run(main())


class _Node:
    pass


def _cycles(n: int) -> list[weakref.ref]:
    """Weak references to ``n`` new objects that only the cyclic collector frees."""
    refs = []
    for _ in range(n):
        node = _Node()
        node.self = node  # type: ignore[attr-defined]
        refs.append(weakref.ref(node))
    return refs


def test_the_garbage_collector_runs_between_bursts_not_within_them():
    async def main() -> None:
        queue: asyncio.Queue = asyncio.Queue()
        with IdleCollector() as collector:
            assert not gc.isenabled()
            threshold = gc.get_threshold()[0]
            refs = _cycles(threshold + 10)
            queue.put_nowait("kline")
            assert await collector.get(queue) == "kline"  # within a burst: not yet
            assert all(r() is not None for r in refs)
            # the queue stays empty longer than ``quiet``: collected before the next item
            asyncio.get_running_loop().call_later(4 * collector.quiet, queue.put_nowait, "next")
            assert await collector.get(queue) == "next"
            assert all(r() is None for r in refs)
            refs = _cycles(100 * threshold + 10)
            queue.put_nowait("kline")
            assert await collector.get(queue) == "kline"  # long overdue: collected anyway
            assert all(r() is None for r in refs)
        assert gc.isenabled()

    assert gc.isenabled()
    asyncio.run(main())


def test_the_start_ups_survivors_are_frozen_once_the_feed_is_quiet():
    async def main() -> None:
        queue: asyncio.Queue = asyncio.Queue()
        with IdleCollector() as collector:
            survivors = [[i] for i in range(1000)]  # tracked containers, still referenced
            frozen = gc.get_freeze_count()
            collector.freeze_when_quiet()
            queue.put_nowait("kline")
            assert await collector.get(queue) == "kline"  # a kline waits: not in its burst
            assert gc.get_freeze_count() == frozen
            asyncio.get_running_loop().call_later(4 * collector.quiet, queue.put_nowait, "next")
            assert await collector.get(queue) == "next"
            assert gc.get_freeze_count() >= frozen + len(survivors)
            frozen = gc.get_freeze_count()
            later = [[i] for i in range(1000)]
            asyncio.get_running_loop().call_later(4 * collector.quiet, queue.put_nowait, "last")
            assert await collector.get(queue) == "last"
            assert gc.get_freeze_count() < frozen + len(later)  # once: later ones stay young
            del survivors, later

    try:
        asyncio.run(main())
    finally:
        gc.unfreeze()


def test_a_collection_that_does_not_fit_before_the_next_burst_waits_for_one_that_does():
    room = [0.001]

    async def main() -> None:
        queue: asyncio.Queue = asyncio.Queue()
        with IdleCollector(lambda: room[0]) as collector:
            refs = _cycles(2 * gc.get_threshold()[0])
            loop = asyncio.get_running_loop()
            loop.call_later(4 * collector.quiet, queue.put_nowait, "burst")
            assert await collector.get(queue) == "burst"  # 1 ms of room: not collected
            assert all(r() is not None for r in refs)
            room[0] = 0.5
            loop.call_later(4 * collector.quiet, queue.put_nowait, "next")
            assert await collector.get(queue) == "next"
            assert all(r() is None for r in refs)
            assert 0 < min(collector.took[:3]) and max(collector.took[:3]) < 0.5

    asyncio.run(main())


def test_the_freeze_waits_for_room_too():
    room = [0.0]

    async def main() -> None:
        queue: asyncio.Queue = asyncio.Queue()
        with IdleCollector(lambda: room[0]) as collector:
            survivors = [[i] for i in range(1000)]
            frozen = gc.get_freeze_count()
            collector.freeze_when_quiet()
            loop = asyncio.get_running_loop()
            loop.call_later(4 * collector.quiet, queue.put_nowait, "burst")
            assert await collector.get(queue) == "burst"
            assert gc.get_freeze_count() == frozen
            room[0] = 1.0
            loop.call_later(4 * collector.quiet, queue.put_nowait, "next")
            assert await collector.get(queue) == "next"
            assert gc.get_freeze_count() >= frozen + len(survivors)
            assert collector.took[3] < 1.0

    try:
        asyncio.run(main())
    finally:
        gc.unfreeze()


def test_a_long_overdue_collection_also_waits_for_room():
    room = [0.0]

    async def main() -> None:
        queue: asyncio.Queue = asyncio.Queue()
        with IdleCollector(lambda: room[0]) as collector:
            refs = _cycles(101 * gc.get_threshold()[0])
            queue.put_nowait("kline")
            assert await collector.get(queue) == "kline"  # a backlog, but a burst is due
            assert all(r() is not None for r in refs)
            room[0] = 1.0
            queue.put_nowait("kline")
            assert await collector.get(queue) == "kline"  # the backlog goes on: collected
            assert all(r() is None for r in refs)

    asyncio.run(main())


def test_the_next_burst_is_expected_a_close_plus_the_shortest_lag_less_its_applying():
    now = [0]
    clock = BurstClock(IV, lambda: now[0])
    assert clock.next_burst_ms() is None  # no grid before the first step
    months = BurstClock(None, lambda: now[0])
    months.stepped(T0)
    assert months.next_burst_ms() is None
    clock.stepped(T0, now_ms=T0 + IV + 4)  # applied 4 ms after its close: ~ no lag
    for phase, ahead in [(0, 0), (1, IV - 1), (500, 500), (999, 1)]:
        now[0] = T0 + 9 * IV + phase
        assert clock.next_burst_ms() == now[0] + ahead, phase
    # a remote exchange: every burst stepped 60 or more ms after its close is expected
    # 50 ms after it (the 10 ms of applying taken off), the one under way included
    for lag in (80, 60, 95):
        clock.stepped(T0, now_ms=T0 + IV + lag)
    clock._lags.popleft()  # the 4 ms one
    now[0] = T0 + 3 * IV + 20
    assert clock.next_burst_ms() == T0 + 3 * IV + 50
    now[0] = T0 + 3 * IV + 51
    assert clock.next_burst_ms() == T0 + 4 * IV + 50
    # backfills and caught-up histories teach no lag
    clock.stepped(T0 - 50 * IV, now_ms=T0 + IV + 30)
    clock.stepped(T0, now_ms=T0 + IV + 30, burst=False)
    assert clock.next_burst_ms(T0 + 3 * IV + 20) == T0 + 3 * IV + 50


def _warm_ups(clock: BurstClock, lead_s: float, seconds: float, warm=None) -> list[float]:
    """Runs ``clock.before_bursts(lead_s, ...)`` for ``seconds``; the clock times (ms) of
    its calls."""
    calls: list[float] = []

    def record() -> None:
        calls.append(clock.clock_ms())
        if warm is not None:
            warm()

    async def main() -> None:
        task = asyncio.ensure_future(clock.before_bursts(lead_s, record))
        await asyncio.sleep(seconds)
        assert not task.done() or task.exception() is None
        task.cancel()

    asyncio.run(main())
    return calls


def test_the_step_path_is_warmed_once_just_before_each_burst():
    iv = 200
    clock = BurstClock(iv, lambda: int(time.time() * 1000))
    assert _warm_ups(clock, 0.02, 0.3) == []  # no grid yet: nothing to warm up for
    now = clock.clock_ms()
    clock.stepped(now - now % iv - iv, now_ms=now - now % iv + 3)  # closes: multiples of iv
    calls = _warm_ups(clock, 0.02, 1.1)
    assert 4 <= len(calls) <= 6, calls
    # 20 ms before each close: the loop's timers are late by a few ms, by ~10 on a loaded
    # machine (one call of a CI run came 11 ms late), never after the close
    phases = [(t % iv) - iv for t in calls]
    assert all(-25 <= p <= -2 for p in phases), phases
    assert sorted(phases)[len(phases) // 2] <= -12, phases
    assert len({(t + 30) // iv for t in calls}) == len(calls)  # one a close


def test_a_failing_warm_up_is_logged_once_and_the_feed_goes_on(caplog):
    iv = 100
    clock = BurstClock(iv, lambda: int(time.time() * 1000))
    now = clock.clock_ms()
    clock.stepped(now - now % iv - iv, now_ms=now - now % iv + 3)

    def broken() -> None:
        raise RuntimeError("boom")

    calls = _warm_ups(clock, 0.01, 0.5, broken)
    assert len(calls) == 1
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    assert "warming up before bursts failed" in caplog.records[0].getMessage()


def test_a_standing_clock_warms_up_once_not_again_and_again():
    stopped = int(time.time() * 1000)
    iv = 200
    frozen = BurstClock(iv, lambda: stopped)
    # 10 ms before a close (no lag learnt: the burst is due at the close)
    frozen.stepped(stopped - 2 * iv + 10, now_ms=stopped, burst=False)
    assert frozen.next_burst_ms() == stopped + 10
    assert len(_warm_ups(frozen, 0.02, 0.4)) == 1
