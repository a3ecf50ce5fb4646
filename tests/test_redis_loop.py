"""The event-loop publisher (``atc-stream live``'s): same messages as the thread publisher,
outages survived and counted, against a real redis-server (no mocks)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from redis_fixtures import free_port, private_redis, redis_server, redis_url  # noqa: F401
from test_redis_pubsub import Collector, step_results

from atc_stream.connectors.redis.loop import LoopPublisher
from atc_stream.connectors.redis.pubsub import SignalPublisher, SignalSubscriber
from atc_stream.connectors.redis.resp import ReplyError, read_reply
from atc_stream.connectors.retry import DEFAULT_BACKOFF, Backoff

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]


async def _publish_all(publisher: LoopPublisher, results, pause: float = 0.0) -> None:
    await publisher.start()
    for result in results:
        assert publisher.publish(result)
        await asyncio.sleep(pause)  # the loop runs between steps, as in live
    assert await publisher.aclose(10)


def _channel_messages(url: str, publish) -> list:
    sub = SignalSubscriber(url, all_symbols=True, batch=True, events=True)
    sub.wait_ready()
    collector = Collector(sub)
    collector.start()
    publish()
    messages = collector.drain(quiet=0.5)
    sub.close()
    return [(m.channel, m.data) for m in messages]


def test_same_messages_and_latest_as_the_thread_publisher(redis_url):  # noqa: F811
    """Every channel's messages (per symbol, batch, events) and the latest hash, as the
    thread publisher sends them; only the batch's ``published_at`` stamp differs."""
    results = step_results(5, 120, seed=7)
    client = __import__("redis").Redis.from_url(redis_url)

    def by_thread():
        with SignalPublisher(redis_url) as publisher:
            for r in results:
                publisher.publish(r)

    def by_loop():
        publisher = LoopPublisher(redis_url)
        asyncio.run(_publish_all(publisher, results))
        assert publisher.stats()["delivered"] == len(results)
        assert publisher.dropped == 0 and publisher.errors == 0
        assert publisher.plain_publishes  # its fan-out went as PUBLISHes without replies

    thread_messages = _channel_messages(redis_url, by_thread)
    thread_latest = client.hgetall("atc:latest")
    client.delete("atc:latest")
    loop_messages = _channel_messages(redis_url, by_loop)
    loop_latest = client.hgetall("atc:latest")
    client.close()

    def comparable(messages):
        # each channel's messages in order; how channels interleave depends on how many
        # steps share a round trip (the batch channel goes first in each)
        by_channel: dict[str, list] = {}
        for c, data in messages:
            by_channel.setdefault(c, []).append(
                (data.records if hasattr(data, "records") else data, getattr(data, "seq", None))
            )
        return by_channel

    assert len(loop_messages) > len(results)  # per-symbol, batch and event messages
    assert any(c == "atc:events" for c, _ in loop_messages)
    assert comparable(loop_messages) == comparable(thread_messages)
    assert loop_latest == thread_latest and len(loop_latest) == 5


def test_outage_is_survived_and_counted(private_redis):  # noqa: F811
    results = step_results(6, 45, seed=3)
    before, during, after = results[:15], results[15:30], results[30:]
    publisher = LoopPublisher(private_redis.url, backoff=Backoff(0.02, 0.2))

    async def run():
        await publisher.start()
        for r in before:
            publisher.publish(r)
        while publisher.delivered < len(before):
            await asyncio.sleep(0.01)
        await asyncio.to_thread(private_redis.stop)
        for r in during:
            publisher.publish(r)
            await asyncio.sleep(0.01)
        assert not publisher.connected
        await asyncio.to_thread(private_redis.start)  # same port
        deadline = time.monotonic() + 10
        while not publisher.connected and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert publisher.connected and publisher.reconnects == 1
        sub = SignalSubscriber(private_redis.url, batch=True)
        sub.wait_ready()
        for r in after:
            assert publisher.publish(r)
        assert await publisher.aclose(10)
        got = list(sub.messages(timeout=1.0))
        sub.close()
        return got

    got = asyncio.run(run())
    stats = publisher.stats()
    assert stats["delivered"] == len(before) + len(after)
    assert stats["dropped"] == len(during) and stats["dropped_rows"] == 6 * len(during)
    assert stats["errors"] >= 1 and stats["queued"] == 0
    # delivery resumed after the restart, and the batch seq shows the gap
    assert [m.data.seq for m in got] == list(range(31, 46))


def test_unreachable_redis_at_start_drops_counts_and_warns_once(caplog):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    results = step_results(3, 10, seed=5)
    publisher = LoopPublisher(url, backoff=Backoff(0.02, 0.05))

    async def run():
        await publisher.start()  # no exception: live keeps running without Redis
        for r in results:
            assert not publisher.publish(r)
            await asyncio.sleep(0.01)
        return await publisher.aclose(1)

    with caplog.at_level(logging.WARNING, logger="atc_stream.redis"):
        assert asyncio.run(run())
    assert publisher.dropped == len(results) and publisher.dropped_rows == 3 * len(results)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len([w for w in warnings if "redis publish failed" in w.getMessage()]) == 1
    assert len([w for w in warnings if "dropping signal messages" in w.getMessage()]) == 1


def test_close_outside_the_loop_counts_unacknowledged_steps(redis_url):  # noqa: F811
    results = step_results(2, 5, seed=2)
    publisher = LoopPublisher(redis_url)

    async def run():  # the loop ends before any reply is read
        await publisher.start()
        for r in results:
            publisher.publish(r)

    asyncio.run(run())
    assert not publisher.close()
    assert publisher.dropped == len(results) and publisher.delivered == 0
    with pytest.raises(RuntimeError, match="after close"):
        publisher.publish(results[0])


def test_reply_reader_parses_every_resp2_kind():
    data = b"+OK\r\n:42\r\n$3\r\nabc\r\n$-1\r\n*2\r\n:1\r\n$1\r\nx\r\n-ERR bad\r\n"

    async def all_replies():
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return [await read_reply(reader) for _ in range(6)]

    replies = asyncio.run(all_replies())
    assert replies[:5] == [b"OK", 42, b"abc", None, [1, b"x"]]
    assert isinstance(replies[5], ReplyError) and "ERR bad" in str(replies[5])


def test_bad_url_and_options_are_refused():
    with pytest.raises(ValueError, match="scheme"):
        LoopPublisher("http://127.0.0.1:6379")
    with pytest.raises(ValueError, match="prefix"):
        LoopPublisher("redis://127.0.0.1:1/0", prefix="")


def test_packed_commands_are_the_protocol_of_the_documented_arguments():
    """``SignalMessages._commands`` writes RESP by hand: parsed back, its commands are a
    PUBLISH to the batch channel per step (first: a batch subscriber does not wait for the
    fan-out), the EVAL (per-symbol and events messages, in that order per step) and the
    HSET of the latest hash that the records say, with the right argument counts."""
    import msgspec

    from atc_stream.connectors.redis.channels import PUBLISH_SCRIPT, SignalMessages
    from atc_stream.core.messages import records_from_result

    results = [r for r in step_results(4, 140, seed=11) if len(r)][-40:]
    items = list(enumerate(results, start=1))
    packer = SignalMessages(prefix="px")
    commands, messages = packer._commands(items)

    async def parse():
        reader = asyncio.StreamReader()
        reader.feed_data(b"".join(commands))
        reader.feed_eof()
        return [await read_reply(reader) for _ in commands]

    *batch_commands, eval_args, hset_args = asyncio.run(parse())
    assert len(batch_commands) == len(items)
    for (seq, result), command in zip(items, batch_commands, strict=True):
        assert command[:2] == [b"PUBLISH", b"px:batch"] and len(command) == 3
        batch = msgspec.json.decode(command[2])  # (it carries a clock: checked by parts)
        assert batch["seq"] == seq and batch["count"] == len(batch["records"]) == len(result)
        records = [msgspec.json.encode(r) for r in records_from_result(result)]
        assert [msgspec.json.encode(r) for r in batch["records"]] == records
    encode = msgspec.json.encode
    expected, latest = [b"EVAL", PUBLISH_SCRIPT, b"0"], {}
    for _, result in items:
        records = records_from_result(result)
        for r in records:
            expected += [f"px:signal:{r.symbol}".encode(), encode(r)]
        for r in records:
            if (r.long or r.short) and r.ready:
                expected += [b"px:events", encode(r)]
        for r in records:
            latest[r.key.encode()] = encode(r)
    assert eval_args == expected
    assert any(arg == b"px:events" for arg in eval_args)
    assert hset_args[:2] == [b"HSET", b"px:latest"]
    assert dict(zip(hset_args[2::2], hset_args[3::2], strict=True)) == latest
    assert messages == len(items) + (len(expected) - 3) // 2 + len(latest)


def test_packed_single_steps_send_what_the_switches_say():
    """One step at a time (the live path: per-slot channel names and latest fields laid
    out without per-row work), with ``per_symbol``, ``latest`` and
    ``events_before_ready`` switched, and a step that holds a stream twice: the EVAL and
    HSET carry the documented messages, each latest field once."""
    import msgspec

    from atc_stream import Engine
    from atc_stream.connectors.redis.channels import PUBLISH_SCRIPT, SignalMessages
    from atc_stream.core.messages import records_from_result

    encode = msgspec.json.encode
    results = [r for r in step_results(4, 140, seed=12) if len(r)][-30:]
    engine = Engine(interval="1m", backend="cpu")
    for symbol in ("AA", "BB"):
        engine.add_symbol(symbol)
    twice = engine.step([("AA", 0, 1.0), ("BB", 0, 2.0), ("AA", 60_000, 1.5)])
    assert len(twice) == 3 and len(set(twice.slots.tolist())) == 2
    switches = ({}, {"per_symbol": False}, {"latest": False},
                {"per_symbol": False, "latest": False}, {"events_before_ready": True})  # fmt: skip
    for options in switches:
        packer = SignalMessages(prefix="px", **options)
        for seq, result in enumerate([*results, twice], start=1):
            commands, messages = packer._commands([(seq, result)])

            async def parse(commands=commands):
                reader = asyncio.StreamReader()
                reader.feed_data(b"".join(commands))
                reader.feed_eof()
                return [await read_reply(reader) for _ in commands]

            batch, *fanout = asyncio.run(parse())
            assert batch[:2] == [b"PUBLISH", b"px:batch"]
            records = records_from_result(result)
            expected = []
            if options.get("per_symbol", True):
                expected += [(f"px:signal:{r.symbol}".encode(), encode(r)) for r in records]
            before_ready = options.get("events_before_ready", False)
            expected += [
                (b"px:events", encode(r))
                for r in records
                if (r.long or r.short) and (r.ready or before_ready)
            ]
            latest = {}
            if options.get("latest", True):
                latest = {r.key.encode(): encode(r) for r in records}
            evals = [c for c in fanout if c[0] == b"EVAL"]
            hsets = [c for c in fanout if c[0] == b"HSET"]
            assert len(fanout) == len(evals) + len(hsets) and len(evals) <= 1 >= len(hsets)
            args = evals[0][3:] if evals else []
            assert not evals or evals[0][:3] == [b"EVAL", PUBLISH_SCRIPT, b"0"]
            assert list(zip(args[::2], args[1::2], strict=True)) == expected
            fields = hsets[0][2::2] if hsets else []
            assert not hsets or hsets[0][:2] == [b"HSET", b"px:latest"]
            assert len(fields) == len(set(fields))
            stored = dict(zip(fields, hsets[0][3::2], strict=True)) if hsets else {}
            assert stored == latest
            assert messages == 1 + len(expected) + len(latest)


def test_plain_publishes_carry_the_eval_messages_and_a_server_without_client_reply_gets_eval():
    """With ``plain_publishes`` the fan-out is CLIENT REPLY OFF, a PUBLISH per message of
    the EVAL's (same channels and messages, same order), CLIENT REPLY ON, then the HSET;
    a server that refuses CLIENT REPLY (a proxy) leaves the publisher on the EVAL."""
    from atc_stream.connectors.redis.channels import SignalMessages

    async def parse_all(data: bytes) -> list[list[bytes]]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        commands = []
        while True:
            try:
                commands.append(await read_reply(reader))
            except asyncio.IncompleteReadError:  # every fed command read
                return commands

    evals, plains = SignalMessages(prefix="px"), SignalMessages(prefix="px")
    plains.plain_publishes = True
    for seq, result in enumerate([r for r in step_results(4, 140, seed=13) if len(r)][-20:]):
        by_eval, n_eval = evals._commands([(seq, result)])
        by_plain, n_plain = plains._commands([(seq, result)])
        assert n_plain == n_eval and len(by_plain) == len(by_eval)  # as many replies
        assert by_plain[2:] == by_eval[2:]  # the HSET (the batches differ by their clock)
        eval_args = asyncio.run(parse_all(by_eval[1]))[0][3:]
        off, *publishes, on = asyncio.run(parse_all(by_plain[1]))
        assert off == [b"CLIENT", b"REPLY", b"OFF"] and on == [b"CLIENT", b"REPLY", b"ON"]
        assert all(p[0] == b"PUBLISH" and len(p) == 3 for p in publishes)
        assert [a for p in publishes for a in p[1:]] == eval_args

    async def refuse_client_reply():
        async def serve(reader, writer):
            while True:
                try:
                    command = await read_reply(reader)
                except (asyncio.IncompleteReadError, ValueError):
                    return
                if command[0] == b"CLIENT":
                    writer.write(b"-ERR unknown command 'CLIENT'\r\n")
                else:
                    writer.write(b"+PONG\r\n" if command[0] == b"PING" else b":0\r\n")

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        publisher = LoopPublisher(f"redis://127.0.0.1:{port}/0")
        await publisher.start()
        assert publisher.connected and not publisher.plain_publishes
        for result in [r for r in step_results(3, 80, seed=14) if len(r)][-5:]:
            assert publisher.publish(result)
        assert await publisher.aclose(5)
        assert publisher.delivered == 5 and publisher.errors == 0
        server.close()

    asyncio.run(refuse_client_reply())


def test_every_redis_retry_loop_waits_on_the_shared_backoff_policy(redis_url):  # noqa: F811
    """Both publishers, the subscriber and the stream runner retry on ``DEFAULT_BACKOFF``
    unless their caller passes another ``Backoff``."""
    from atc_stream import Engine
    from atc_stream.connectors.redis.streams import RedisStreamRunner

    policy = Backoff(0.01, 0.04, jitter=0.0)
    for chosen in (None, policy):
        kwargs = {} if chosen is None else {"backoff": chosen}
        expected = DEFAULT_BACKOFF if chosen is None else chosen
        with SignalPublisher(redis_url, **kwargs) as thread_publisher:
            assert thread_publisher.backoff is expected
        assert LoopPublisher(redis_url, **kwargs).backoff is expected
        with SignalSubscriber(redis_url, **kwargs) as subscriber:
            assert subscriber.backoff is expected
        runner = RedisStreamRunner(Engine(backend="cpu"), redis_url, "bars", **kwargs)
        assert runner.backoff is expected
        runner.client.close()
