"""Signals over Redis pub/sub, against a real redis-server (no mocks)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import msgspec
import numpy as np
import pytest
from redis_fixtures import private_redis, redis_server, redis_url  # noqa: F401

from atc_stream import ATCParams, Engine
from atc_stream.connectors.redis.channels import SignalBatch
from atc_stream.connectors.redis.pubsub import SignalPublisher, SignalSubscriber
from atc_stream.connectors.replay.player import random_walk_table
from atc_stream.connectors.retry import Backoff
from atc_stream.core.messages import (
    PositionRecord,
    SignalRecord,
    TradeRecord,
    records_from_result,
)
from atc_stream.core.schema import COLUMNS, SCHEMA_VERSION

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]


def bars_of(table, rows):
    return list(
        zip(
            table.symbols[rows],
            table.times[rows].tolist(),
            table.closes[rows].tolist(),
            strict=True,
        )
    )


def step_results(n_symbols, n_bars, params=None, seed=1):
    """One StepResult per bar time of a random walk (all symbols each step)."""
    table = random_walk_table(n_symbols, n_bars, seed=seed)
    engine = Engine(params or ATCParams(), backend="cpu", outputs="all")
    for symbol in table.symbol_names:
        engine.add_symbol(symbol)
    return [engine.step(bars_of(table, table.times == t)) for t in np.unique(table.times)]


@pytest.fixture(scope="module")
def results():
    # two parameter sets: each symbol's channel carries one record per set and bar
    return step_results(4, 400, params=[ATCParams(), ATCParams(ema_len=14, robustness="Wide")])


class Collector(threading.Thread):
    """Reads a subscriber in the background (so the server never has to buffer for it)."""

    def __init__(self, sub: SignalSubscriber) -> None:
        super().__init__(daemon=True)
        self.sub = sub
        self.messages = []
        self.running = True

    def run(self) -> None:
        while self.running:
            msg = self.sub.get(timeout=0.1)
            if msg is not None:
                self.messages.append(msg)

    def drain(self, quiet: float = 0.5, limit: float = 30.0) -> list:
        """Wait until nothing arrived for ``quiet`` seconds, stop, return the messages."""
        deadline = time.monotonic() + limit
        seen = -1
        while len(self.messages) != seen and time.monotonic() < deadline:
            seen = len(self.messages)
            time.sleep(quiet)
        self.running = False
        self.join(5)
        return self.messages


def test_records_match_stepresult_records(results):
    result = results[-1]
    mine = [msgspec.to_builtins(r) for r in records_from_result(result)]
    theirs = result.records()
    for m, t in zip(mine, theirs, strict=True):
        assert m.pop("v") == SCHEMA_VERSION
        assert m == t


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_subscribers_receive_every_message_in_order(redis_url, results, encoding):  # noqa: F811
    every = SignalSubscriber(redis_url, encoding=encoding, all_symbols=True, events=True)
    one = SignalSubscriber(redis_url, encoding=encoding, symbols=["SYM001"])
    batches = SignalSubscriber(redis_url, encoding=encoding, batch=True)
    collectors = []
    for sub in (every, one, batches):
        sub.wait_ready()
        collectors.append(Collector(sub))
        collectors[-1].start()
    with SignalPublisher(redis_url, encoding=encoding) as pub:
        for result in results:
            assert pub.publish(result)
        assert pub.flush(30)
        assert pub.stats()["dropped"] == 0 and pub.delivered == len(results)
    got_every, got_one, got_batches = (c.drain() for c in collectors)

    expected = [r for result in results for r in records_from_result(result)]
    # per-symbol channels: every record of that symbol, in bar order
    for symbol in ("SYM000", "SYM001", "SYM002", "SYM003"):
        want = [r for r in expected if r.symbol == symbol]
        have = [m.data for m in got_every if m.kind == "signal" and m.data.symbol == symbol]
        assert have == want
        assert {m.channel for m in got_every if m.kind == "signal" and m.data.symbol == symbol} == {
            f"atc:signal:{symbol}"
        }
    assert [m.data for m in got_one] == [r for r in expected if r.symbol == "SYM001"]
    # events channel: exactly the rows with a long or short event, in order
    # the events channel carries events of ready rows only (docs/spec.md, "Readiness")
    events = [r for r in expected if (r.long or r.short) and r.ready]
    assert any((r.long or r.short) and not r.ready for r in expected), "no unready event left out"
    assert events, "the data set should raise some events"
    assert [m.data for m in got_every if m.kind == "event"] == events
    # batch channel: one message per step, seq 1..N, same records
    assert [m.kind for m in got_batches] == ["batch"] * len(results)
    assert [m.data.seq for m in got_batches] == list(range(1, len(results) + 1))
    for message, result in zip(got_batches, results, strict=True):
        assert isinstance(message.data, SignalBatch) and message.data.v == SCHEMA_VERSION
        assert message.data.count == len(result)
        assert message.data.records == records_from_result(result)
    # latest hash: the last record of every stream, for late joiners
    late = SignalSubscriber(redis_url, encoding=encoding, as_dict=True)
    latest = late.latest()
    assert sorted(latest) == sorted(r.key for r in records_from_result(results[-1]))
    for record in records_from_result(results[-1]):
        assert latest[record.key] == msgspec.to_builtins(record)
    for sub in (every, one, batches, late):
        sub.close()


def test_json_message_is_documented_shape(redis_url):  # noqa: F811
    engine = Engine(
        ATCParams(cutout=5), backend="cpu", outputs="all"
    )  # NaN outputs before the cutout
    engine.add_symbol("SYM000")
    sub = SignalSubscriber(redis_url, symbols=["SYM000"])
    sub.wait_ready()
    with SignalPublisher(redis_url, batch=False, events=False, latest=False) as pub:
        pub.publish(engine.step([("SYM000", 60_000, 101.5)]))
    raw = None
    deadline = time.monotonic() + 5
    while raw is None and time.monotonic() < deadline:
        m = sub._pubsub.get_message(timeout=0.5)
        if m and m["type"] == "message":
            raw = m["data"]
    sub.close()
    obj = msgspec.json.decode(raw)
    assert list(obj) == [*COLUMNS, "v"]  # the one output schema, in order, plus v
    assert obj["ema_signal"] is None and obj["kama_equity"] is None and obj["ready"] is False
    assert obj["signal"] is None and obj["growth"] is None  # NaN is written as null
    assert obj["time"] == 60_000 and obj["close"] == 101.5 and obj["v"] == SCHEMA_VERSION
    assert msgspec.json.decode(raw, type=SignalRecord).symbol == "SYM000"


def bar_batches(n_symbols, n_bars, seed):
    table = random_walk_table(n_symbols, n_bars, seed=seed)
    return table.symbol_names, [
        bars_of(table, rows) for rows in np.split(np.arange(len(table)), n_bars)
    ]


def _timed_loop(engine, batches, pub):
    """Seconds for the step loop (step + publish), and the slowest publish() call."""
    worst = 0.0
    start = time.perf_counter()
    for bars in batches:
        result = engine.step(bars)
        t = time.perf_counter()
        pub.publish(result)
        worst = max(worst, time.perf_counter() - t)
    return time.perf_counter() - start, worst


def test_slow_and_killed_subscribers_do_not_slow_the_step_loop(redis_url):  # noqa: F811
    symbols, batches = bar_batches(200, 150, seed=2)
    host, port = redis_url.split("//")[1].split("/")[0].split(":")

    def engine():
        eng = Engine(backend="cpu", outputs="all")
        for symbol in symbols:
            eng.add_symbol(symbol)
        return eng

    engine().step(batches[0])  # compile before timing anything
    # baseline: nobody listening
    with SignalPublisher(redis_url) as pub:
        base, base_worst = _timed_loop(engine(), batches, pub)
    # a subscriber that never reads (raw socket: subscribed, then silent) ...
    silent = socket.create_connection((host, int(port)))
    silent.sendall(b"PSUBSCRIBE atc:*\r\n")
    # ... and one that is killed mid-run
    killed = subprocess.Popen(
        [sys.executable, "-m", "atc_stream", "subscribe", "--redis", redis_url, "--batch"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_for_subscriber(redis_url, "atc:batch", killed)
    eng = engine()
    with SignalPublisher(redis_url) as pub:
        half = len(batches) // 2
        t1, w1 = _timed_loop(eng, batches[:half], pub)
        killed.send_signal(signal.SIGKILL)
        t2, w2 = _timed_loop(eng, batches[half:], pub)
        flushed = pub.flush(60)
        stats = pub.stats()
    killed.wait(10)
    silent.close()
    slow, slow_worst = t1 + t2, max(w1, w2)
    print(f"step loop: {base:.3f} s alone, {slow:.3f} s with a silent + a killed subscriber")
    assert flushed and stats["dropped"] == 0
    # publish() only enqueues: it never waits for Redis or a subscriber (generous bounds)
    assert slow_worst < 0.25 and base_worst < 0.25
    assert slow < 3 * base + 2.0


def _wait_for_subscriber(url: str, channel: str, proc: subprocess.Popen, limit: float = 60) -> None:
    """Return once ``channel`` has a subscriber (the process ``proc`` subscribing)."""
    import redis

    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + limit
    try:
        while client.pubsub_numsub(channel)[0][1] == 0:
            assert time.monotonic() < deadline and proc.poll() is None, "no subscriber came"
            time.sleep(0.05)
    finally:
        client.close()


def test_full_queue_drops_and_counts_instead_of_blocking(private_redis):  # noqa: F811
    results = step_results(50, 40, seed=3)
    pub = SignalPublisher(private_redis.url, queue_size=2, max_steps_per_send=1)
    admin = private_redis.client()
    admin.execute_command("CLIENT", "PAUSE", 1500, "ALL")  # Redis stalls for 1.5 s
    time.sleep(0.05)
    t = time.perf_counter()
    accepted = [pub.publish(r) for r in results]
    elapsed = time.perf_counter() - t
    assert elapsed < 0.5  # never blocked on the stalled server
    assert accepted.count(False) >= len(results) - 3
    assert pub.close(timeout=10)
    stats = pub.stats()
    assert stats["dropped"] == accepted.count(False)
    assert stats["delivered"] + stats["dropped"] == len(results)
    assert stats["dropped_rows"] == 50 * stats["dropped"]


def test_redis_outage_is_survived_and_counted(private_redis):  # noqa: F811
    results = step_results(10, 60, seed=4)
    before, during, after = results[:20], results[20:40], results[40:]
    pub = SignalPublisher(private_redis.url, backoff=Backoff(0.02, 0.2))
    sub = SignalSubscriber(private_redis.url, batch=True)
    sub.wait_ready()
    for r in before:
        pub.publish(r)
    assert pub.flush(10) and pub.delivered == 20
    got_before = list(sub.messages(timeout=1.0))
    assert [m.data.seq for m in got_before] == list(range(1, 21))
    sub.close()

    private_redis.stop()
    for r in during:
        pub.publish(r)
        time.sleep(0.01)
    assert pub.flush(10)  # handled = dropped: nobody to deliver to
    assert pub.dropped == len(during) and pub.dropped_rows == 10 * len(during)
    assert not pub.connected

    private_redis.start()  # same port
    deadline = time.monotonic() + 10
    while not pub.connected and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pub.connected and pub.reconnects == 1
    sub = SignalSubscriber(private_redis.url, batch=True)
    sub.wait_ready()
    for r in after:
        assert pub.publish(r)
    assert pub.close(10)
    got_after = list(sub.messages(timeout=1.0))
    sub.close()
    # delivery resumed; the batch seq shows the gap of the dropped steps
    assert [m.data.seq for m in got_after] == list(range(41, 61))
    assert [m.data.records for m in got_after] == [records_from_result(r) for r in after]
    stats = pub.stats()
    assert stats["delivered"] == 40 and stats["dropped"] == 20 and stats["errors"] >= 1
    # the latest hash is written again after the restart
    assert private_redis.client().hlen("atc:latest") == 10


def test_subscribe_cli_prints_messages(redis_url, results):  # noqa: F811
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "atc_stream", "subscribe", "--redis", redis_url,
            "--symbols", "SYM000,SYM002", "--events", "--count", "6",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    _wait_for_subscriber(redis_url, "atc:signal:SYM002", proc)
    with SignalPublisher(redis_url) as pub:
        for result in results[:5]:
            pub.publish(result)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    lines = [msgspec.json.decode(line) for line in out.splitlines()]
    assert len(lines) == 6
    assert {line["channel"] for line in lines} <= {"atc:signal:SYM000", "atc:signal:SYM002"}
    assert lines[0]["kind"] == "signal" and lines[0]["data"]["symbol"] in ("SYM000", "SYM002")


def test_subscriber_survives_a_redis_restart_and_counts_malformed(private_redis):  # noqa: F811
    """A real redis-server is restarted under a subscriber, and garbage is published on its
    channel: the subscriber reconnects with backoff, skips and counts the garbage, and
    receives what is published after the restart."""
    from atc_stream.connectors.redis.pubsub import SignalSubscriber, signal_channel

    good = msgspec.json.encode(SignalRecord(**{name: _example_value(name) for name in COLUMNS}))
    channel = signal_channel("atc", "SYM000")
    sub = SignalSubscriber(private_redis.url, symbols=["SYM000"])
    sub.wait_ready()
    client = private_redis.client()
    client.publish(channel, b"not json {")
    client.publish(channel, good)
    msg = sub.get(timeout=5)
    assert msg is not None and msg.data.symbol == "SYM000" and sub.malformed == 1
    client.close()

    private_redis.restart()
    msg = _publish_until_received(private_redis, sub, channel, good, timeout=20)
    assert msg is not None and msg.data.symbol == "SYM000"
    assert sub.reconnects >= 1
    sub.close()


def _publish_until_received(server, sub, channel, message, timeout):
    """Publish ``message`` on ``channel`` every 50 ms until ``sub`` gets one (a subscriber
    coming back from an outage resubscribes at a moment of its own); what it got."""
    done = threading.Event()

    def publish() -> None:
        client = server.client()
        try:
            while not done.is_set():
                client.publish(channel, message)
                time.sleep(0.05)
        finally:
            client.close()

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    try:
        return sub.get(timeout=timeout)
    finally:
        done.set()
        publisher.join(5)


def _example_value(name: str):
    from atc_stream.core.schema import COLUMN_TYPES

    kind = COLUMN_TYPES[name]
    return {"str": "SYM000" if name == "symbol" else "1m", "int": 1, "float": 1.0,
            "bool": False, "time": 1_700_000_040_000}[kind]  # fmt: skip


def test_subscriber_comes_back_after_an_outage_longer_than_its_first_retries(private_redis):  # noqa: F811
    """Redis stays down while the subscriber tries again several times: each failed
    resubscription leaves it trying, and it receives what is published once Redis is
    back."""
    good = msgspec.json.encode(SignalRecord(**{name: _example_value(name) for name in COLUMNS}))
    channel = signal_channel_of("SYM000")
    sub = SignalSubscriber(
        private_redis.url, symbols=["SYM000"], backoff=Backoff(0.02, 0.1, jitter=0)
    )
    sub.wait_ready()
    private_redis.stop()
    assert sub.get(timeout=1.5) is None  # the connection is lost, every retry refused
    assert sub.reconnects == 0
    private_redis.start()
    msg = _publish_until_received(private_redis, sub, channel, good, timeout=10)
    sub.close()
    assert msg is not None and msg.data.symbol == "SYM000"
    assert sub.reconnects == 1


def test_a_channel_name_that_is_not_utf8_is_counted_and_skipped(redis_url):  # noqa: F811
    import redis

    good = msgspec.json.encode(SignalRecord(**{name: _example_value(name) for name in COLUMNS}))
    sub = SignalSubscriber(redis_url)  # every signal channel: atc:signal:*
    sub.wait_ready()
    client = redis.Redis.from_url(redis_url)
    client.publish(b"atc:signal:\xff", good)
    client.publish(signal_channel_of("SYM000"), good)
    client.close()
    msg = sub.get(timeout=5)
    sub.close()
    assert msg is not None and msg.channel == "atc:signal:SYM000"
    assert sub.malformed == 1


def test_latest_skips_and_counts_fields_that_do_not_decode(redis_url):  # noqa: F811
    import redis

    good = msgspec.json.encode(SignalRecord(**{name: _example_value(name) for name in COLUMNS}))
    client = redis.Redis.from_url(redis_url)
    client.hset("atc:latest", mapping={"SYM000:1m:0": good, "SYM001:1m:0": b"not json {"})
    client.hset("atc:latest", b"\xff", good)
    client.close()
    sub = SignalSubscriber(redis_url, symbols=["SYM000"])
    latest = sub.latest()
    sub.close()
    assert list(latest) == ["SYM000:1m:0"] and sub.malformed == 2


def test_subscriber_with_symbols_narrows_the_shared_channels_and_hashes(redis_url, results):  # noqa: F811
    """The events, trades and positions channels and the latest hashes carry every
    symbol's records: a subscriber given symbols gets only theirs (as Structs or dicts),
    one with ``all_symbols`` gets them all."""
    import redis

    shared = {"events": True, "trades": True, "positions": True}
    narrow = SignalSubscriber(redis_url, symbols=["SYM001"], **shared)
    as_dicts = SignalSubscriber(redis_url, symbols=["SYM001"], as_dict=True, **shared)
    wide = SignalSubscriber(redis_url, symbols=["SYM001"], all_symbols=True, **shared)
    # a shared channel named in ``channels`` is given whole, as all named there are
    named = SignalSubscriber(redis_url, symbols=["SYM001"], channels=["atc:events"])
    readers = []
    for sub in (narrow, as_dicts, wide, named):
        sub.wait_ready()
        readers.append(Collector(sub))
        readers[-1].start()
    with SignalPublisher(redis_url) as pub:  # events of four symbols, and the latest hash
        for result in results:
            pub.publish(result)
    client = redis.Redis.from_url(redis_url)
    for symbol in ("SYM000", "SYM001"):
        trade = TradeRecord(symbol, "1m", 0, 0, 1, 1, 2, 1.0, 2.0, "flip", 1.0)
        position = PositionRecord(symbol, "1m", 0, 0, 2, 1, 1.0)
        client.publish("atc:trades", msgspec.json.encode(trade))
        client.publish("atc:positions", msgspec.json.encode(position))
        client.hset("atc:positions:latest", position.key, msgspec.json.encode(position))
    client.close()
    got = [reader.drain() for reader in readers]
    events_of = {}
    for result in results:
        for r in result.records():
            if r["ready"] and (r["long"] or r["short"]):
                events_of[r["symbol"]] = events_of.get(r["symbol"], 0) + 1
    assert len(events_of) == 4

    def symbols_of(messages, kind):
        return [m.data["symbol"] if isinstance(m.data, dict) else m.data.symbol
                for m in messages if m.kind == kind]  # fmt: skip

    for messages in got[:2]:
        assert symbols_of(messages, "event") == ["SYM001"] * events_of["SYM001"]
        assert symbols_of(messages, "trade") == ["SYM001"]
        assert symbols_of(messages, "position") == ["SYM001"]
    assert sorted(set(symbols_of(got[2], "event"))) == sorted(events_of)
    assert len(symbols_of(got[2], "event")) == sum(events_of.values())
    assert symbols_of(got[2], "trade") == ["SYM000", "SYM001"]
    assert symbols_of(got[2], "position") == ["SYM000", "SYM001"]
    assert sorted(symbols_of(got[3], "event")) == sorted(symbols_of(got[2], "event"))
    for sub in (narrow, as_dicts):
        assert {key.split(":")[0] for key in sub.latest()} == {"SYM001"}
        assert list(sub.latest_positions()) == ["SYM001:1m:0:0"]
    assert {key.split(":")[0] for key in wide.latest()} == set(events_of)
    assert sorted(wide.latest_positions()) == ["SYM000:1m:0:0", "SYM001:1m:0:0"]
    for sub in (narrow, as_dicts, wide, named):
        sub.close()


def signal_channel_of(symbol: str) -> str:
    from atc_stream.connectors.redis.channels import signal_channel

    return signal_channel("atc", symbol)


def test_subscribe_cli_with_symbols_prints_only_their_events_and_latest(redis_url, results):  # noqa: F811
    """The events channel and the latest hash carry every symbol's records: --symbols
    narrows them too, and --count counts the lines printed."""
    with SignalPublisher(redis_url) as pub:  # the latest hash of every symbol
        pub.publish(results[0])
    ready_events = [
        r["symbol"] for result in results for r in result.records()
        if r["ready"] and (r["long"] or r["short"])
    ]  # fmt: skip
    assert set(ready_events) == {"SYM000", "SYM001", "SYM002", "SYM003"}
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "atc_stream", "subscribe", "--redis", redis_url,
            "--symbols", "SYM001", "--events", "--latest", "--count", "400",
            "--timeout", "5",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    _wait_for_subscriber(redis_url, "atc:events", proc)
    with SignalPublisher(redis_url) as pub:
        for result in results:
            pub.publish(result)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lines = [msgspec.json.decode(line) for line in out.splitlines()]
    assert {line["data"]["symbol"] for line in lines} == {"SYM001"}
    kinds = [line["kind"] for line in lines]
    assert kinds[:2] == ["latest", "latest"]  # SYM001's two parameter sets
    assert "event" in kinds
    assert len(lines) == 2 + 400  # then 400 messages of SYM001 (its signals alone are 800)


def test_subscribe_timeout_counts_what_prints_not_other_symbols_records(redis_url, results):  # noqa: F811
    """--timeout ends the command when nothing it prints arrived for that long, also while
    other symbols' events keep coming on the events channel it follows."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "atc_stream", "subscribe", "--redis", redis_url,
         "--symbols", "NOT-PUBLISHED", "--events", "--timeout", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    _wait_for_subscriber(redis_url, "atc:events", proc)
    started = time.monotonic()
    with SignalPublisher(redis_url) as pub:
        while proc.poll() is None and time.monotonic() - started < 20:
            for result in results:  # every symbol's events, for as long as it runs
                pub.publish(result)
            time.sleep(0.05)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out == b"" and time.monotonic() - started < 10
