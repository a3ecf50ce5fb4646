"""The live feed's queue: items taken in bulk come with their put times, in order."""

from __future__ import annotations

import asyncio

from atc_stream.connectors.exchanges.timing import StampedQueue


def test_take_gives_what_get_nowait_gives_and_wakes_a_waiting_producer():
    async def run():
        queue = StampedQueue(maxsize=3)
        for item in "abc":
            queue.put_nowait(item)
        waiting = asyncio.ensure_future(queue.put("d"))  # the queue is full: it waits
        await asyncio.sleep(0)
        assert not waiting.done()
        assert queue.take(2) == ["a", "b"]  # a producer waits: taken one by one
        await asyncio.sleep(0)
        assert waiting.done() and list(queue._queue) == ["c", "d"]
        assert queue.take(10) == ["c", "d"] and queue.take(5) == []
        for item in "efg":
            queue.put_nowait(item)
        assert queue.take(2) == ["e", "f"] and queue.take(2) == ["g"]
        assert len(queue.taken) == 7 and queue.taken == sorted(queue.taken)
        assert queue.empty() and not queue._stamps

    asyncio.run(run())
