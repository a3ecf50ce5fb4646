"""Redis Streams in and out: the runner in-process, against a real redis-server."""

from __future__ import annotations

import time

import msgspec
import pytest
from redis_fixtures import redis_server, redis_url  # noqa: F401

from atc_stream import ATCParams, Engine
from atc_stream.connectors.redis.pubsub import SignalPublisher, SignalSubscriber
from atc_stream.connectors.redis.stream_output import parse_id, read_outputs
from atc_stream.connectors.redis.streams import (
    MALFORMED_CLOSE,
    MALFORMED_MISSING_FIELD,
    MALFORMED_SYMBOL,
    MALFORMED_TIME,
    RedisStreamRunner,
    source_key,
)
from atc_stream.connectors.replay.player import random_walk_table
from atc_stream.connectors.retry import Backoff
from atc_stream.core.messages import records_from_result

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]

INPUT, OUTPUT = "in", "out"


@pytest.fixture
def client(redis_url):  # noqa: F811
    import redis

    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def table_bars(table):
    return list(
        zip(table.symbols.tolist(), table.times.tolist(), table.closes.tolist(), strict=True)
    )


def push(client, entries):
    pipe = client.pipeline(transaction=False)
    for fields in entries:
        pipe.xadd(INPUT, fields)
    return [i.decode() for i in pipe.execute()]


def bar_fields(bars):
    return [{"symbol": s, "time": t, "close": repr(c)} for s, t, c in bars]


def reference(bars, params=None):
    engine = Engine(params or ATCParams(), backend="cpu", outputs="all")
    for symbol in dict.fromkeys(b[0] for b in bars):
        engine.add_symbol(symbol)
    return [msgspec.to_builtins(r) for r in records_from_result(engine.step(bars))]


def run(client, engine=None, *, resume=False, **kwargs):
    engine = engine or Engine(backend="cpu", outputs="all")
    runner = RedisStreamRunner(
        engine, client, INPUT, group="g", consumer="c", output_stream=OUTPUT, **kwargs
    )
    runner.prepare(resume=resume)
    runner.run(stop_when_idle=0.3)
    return runner


@pytest.mark.parametrize("batch_size", [1, 7, 1000])
def test_outputs_equal_one_uninterrupted_step_whatever_the_batching(client, batch_size):
    # more symbols than the engine's initial capacity: slots grow as symbols appear
    bars = table_bars(random_walk_table(100, 12, seed=1))
    push(client, bar_fields(bars))
    runner = run(client, batch_size=batch_size)
    outputs = read_outputs(client, OUTPUT)
    assert [o["record"] for o in outputs] == reference(bars)
    assert [o["key"] for o in outputs] == [f"{s}:1m:0" for s, _, _ in bars]
    ids = [e[0].decode() for e in client.xrange(INPUT)]
    assert [o["src"] for o in outputs] == ids
    assert runner.stats.bars == len(bars) and runner.stats.rows_out == len(bars)
    assert client.xpending(INPUT, "g")["pending"] == 0
    assert runner.engine.source_offsets[source_key(INPUT)] == ids[-1]


def test_the_summary_rate_counts_the_time_spent_applying_not_the_idle_wait(client):
    push(client, bar_fields(table_bars(random_walk_table(20, 10, seed=3))))
    stats = run(client).stats  # stops after 0.3 s without entries
    assert 0 < stats.busy_seconds < stats.seconds - 0.25
    line = next(line for line in stats.lines() if line.startswith("bars applied"))
    assert line == (
        f"bars applied     200 ({200 / stats.busy_seconds:,.0f} bars/s while busy, "
        f"{stats.seconds:,.1f} s in all)"
    )
    skipped = next(line for line in stats.lines() if line.startswith("skipped"))
    assert skipped == "skipped          0 (at or before the restored offset)"


def test_bad_entries_are_counted_acknowledged_and_skipped(client, caplog):
    good = table_bars(random_walk_table(3, 40, seed=2))
    bad = [
        {"time": 1, "close": 1.0},  # no symbol
        {"symbol": "SYM000", "close": 1.0},  # no time
        {"symbol": "SYM000", "time": 5},  # no close
        {"symbol": "SYM000", "time": "yesterday", "close": 1.0},
        {"symbol": "SYM000", "time": "1.5", "close": 1.0},
        {"symbol": "SYM001", "time": 10**6, "close": "a lot"},
        {"symbol": "", "time": 10**6, "close": 1.0},
        {"symbol": b"\xff\xfe", "time": 10**6, "close": 1.0},
        {"payload": "garbage"},
    ]
    rejected_by_engine = [
        {"symbol": "SYM002", "time": 2_000_000_000_000_000, "close": "nan"},  # non-finite
        {"symbol": "SYM002", "time": 2_000_000_000_000_000, "close": "-3"},  # non-positive
    ]
    entries = bar_fields(good[:30])
    entries += bad[:5]
    entries += bar_fields(good[30:31]) * 2  # the same bar twice: a duplicate for the engine
    entries += rejected_by_engine + bad[5:]
    entries += bar_fields(good[31:])
    push(client, entries)
    engine = Engine(backend="cpu", outputs="all")
    runner = run(client, engine, batch_size=8)
    assert runner.stats.malformed == {
        MALFORMED_MISSING_FIELD: 4,
        MALFORMED_TIME: 2,
        MALFORMED_CLOSE: 1,
        MALFORMED_SYMBOL: 2,
    }
    assert engine.rejections == {
        "duplicate_bar": 1,
        "non_finite_close": 1,
        "non_positive_close": 1,
    }
    assert runner.stats.entries == len(entries)
    # every entry is acknowledged, and the good bars' outputs are the uninterrupted ones
    assert client.xpending(INPUT, "g")["pending"] == 0
    assert [o["record"] for o in read_outputs(client, OUTPUT)] == reference(good)
    warnings = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert len(warnings) == 4  # logged once per reason


def iso_text(ms: int, style: int) -> str:
    """``ms`` as RFC 3339 text in one of several equivalent spellings."""
    from datetime import datetime, timedelta, timezone

    moment = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=ms)
    if style == 0:
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")  # whole seconds (bars are minutes)
    if style == 1:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%f") + "999+00:00"  # ns, floored to ms
    shifted = moment.astimezone(timezone(timedelta(hours=5, minutes=30)))
    return shifted.strftime("%Y-%m-%d %H:%M:%S.000%z")  # another zone, "+0530", a space


def test_iso_times_are_parsed_strictly_and_bad_ones_counted(client):
    bars = table_bars(random_walk_table(3, 30, seed=5))
    entries = [
        {"symbol": s, "time": iso_text(t, i % 3) if i % 2 else t, "close": repr(c)}
        for i, (s, t, c) in enumerate(bars)
    ]
    bad_times = [
        "2023-02-30T00:00:00Z",  # no such day
        "2023-W46-2",  # ISO week date: refused
        "20231114T221300Z",  # basic format: refused
        "1_700_000_000_000",  # Python's int() would take it
        "1.7e12",
        "2023-11-14T22:13:00Z trailing",
        "",
    ]
    malformed = [{"symbol": "SYM000", "time": t, "close": "1.0"} for t in bad_times]
    malformed.append({"symbol": "SYM000", "time": 1_700_000_000_000, "close": "1_0"})
    push(client, entries[:40] + malformed + entries[40:])
    engine = Engine(backend="cpu", outputs="all")
    runner = run(client, engine, batch_size=16)
    assert runner.stats.malformed == {MALFORMED_TIME: len(bad_times), MALFORMED_CLOSE: 1}
    assert [o["record"] for o in read_outputs(client, OUTPUT)] == reference(bars)
    assert not engine.rejections


@pytest.mark.parametrize("unit", ["s", "us", "ns", "auto"])
def test_integer_times_in_a_unit(client, unit):
    bars = table_bars(random_walk_table(2, 20, seed=6))  # whole minutes, epoch ms
    scale = {"s": 0.001, "us": 1000, "ns": 1_000_000}
    entries = []
    for i, (s, t, c) in enumerate(bars):
        as_unit = ("s", "us", "ns")[i % 3] if unit == "auto" else unit
        value = int(t * scale[as_unit]) + (7 if as_unit != "s" else 0)  # sub-ms: floored
        entries.append({"symbol": s, "time": value, "close": repr(c)})
    entries.append({"symbol": "SYM000", "time": 12345, "close": "1.0"})  # fits no unit
    push(client, entries)
    engine = Engine(backend="cpu", outputs="all")
    runner = run(client, engine, time_unit=unit, batch_size=9)
    assert [o["record"] for o in read_outputs(client, OUTPUT)] == reference(bars)
    # 12345 s/us/ns is a time in 1970, before the bars: the engine refuses it as out of
    # order; with auto it fits no unit and is malformed
    if unit == "auto":
        assert runner.stats.malformed == {MALFORMED_TIME: 1}
    else:
        assert not runner.stats.malformed and engine.rejections == {"out_of_order_bar": 1}
    with pytest.raises(ValueError, match="time_unit"):
        RedisStreamRunner(engine, client, INPUT, time_unit="minutes")


def test_resume_rewinds_to_the_snapshot_and_suppresses_written_outputs(client):
    """In-process version of the crash: state from a snapshot taken mid-way, outputs
    written further than the snapshot, entries acked further than the snapshot."""
    bars = table_bars(random_walk_table(5, 60, seed=3))
    ids = push(client, bar_fields(bars))
    engine = Engine(backend="cpu", outputs="all")
    runner = RedisStreamRunner(engine, client, INPUT, group="g", output_stream=OUTPUT)
    runner.prepare()
    runner.process(client.xreadgroup("g", "c", {INPUT: ">"}, count=100)[0][1])
    blob = engine.snapshot()  # state and offset after 100 entries
    assert engine.source_offsets[source_key(INPUT)] == ids[99]
    runner.process(client.xreadgroup("g", "c", {INPUT: ">"}, count=77)[0][1])  # "then crashed"
    assert client.xlen(OUTPUT) == 177

    restored = Engine.restore(blob, backend="cpu", outputs="all")
    resumed = run(client, restored, resume=True, batch_size=50)
    assert resumed.output_mark == parse_id(ids[176]) or resumed.output_mark is None
    assert resumed.stats.rows_suppressed == 77 and resumed.stats.skipped_old == 0
    assert resumed.stats.bars == len(bars) - 100
    outputs = read_outputs(client, OUTPUT)
    assert [o["record"] for o in outputs] == reference(bars)
    assert client.xpending(INPUT, "g")["pending"] == 0


def test_stale_pending_entries_at_or_before_the_offset_are_acked_at_resume(client):
    bars = table_bars(random_walk_table(2, 30, seed=4))
    ids = push(client, bar_fields(bars))
    engine = Engine(backend="cpu", outputs="all")
    runner = RedisStreamRunner(engine, client, INPUT, group="g", consumer="c")
    runner.prepare()
    entries = client.xreadgroup("g", "c", {INPUT: ">"}, count=20)[0][1]
    for symbol in ("SYM000", "SYM001"):
        engine.add_symbol(symbol)
    engine.step([(f[b"symbol"].decode(), int(f[b"time"]), float(f[b"close"])) for _, f in entries])
    engine.source_offsets[source_key(INPUT)] = ids[19]  # "snapshot taken, killed before XACK"
    assert client.xpending(INPUT, "g")["pending"] == 20
    resumed = run(client, engine, resume=True, output_maxlen=1000)
    assert client.xpending(INPUT, "g")["pending"] == 0
    assert resumed.stats.bars == 40 and resumed.stats.skipped_old == 0
    assert sum(engine.rejections.values()) == 0  # nothing was applied twice
    got = [o["record"] for o in read_outputs(client, OUTPUT)]
    assert got == reference(bars)[20:]


def test_output_stream_is_bounded_and_pubsub_gets_the_same_rows(client, redis_url):  # noqa: F811
    bars = table_bars(random_walk_table(10, 300, seed=5))
    push(client, bar_fields(bars))
    sub = SignalSubscriber(redis_url, batch=True)
    sub.wait_ready()
    with SignalPublisher(redis_url, per_symbol=False, events=False) as pub:
        run(client, publisher=pub, output_maxlen=500, batch_size=200)
    assert 500 <= client.xlen(OUTPUT) < len(bars)  # MAXLEN ~ trims in whole nodes
    received = [r for m in sub.messages(timeout=1.0) for r in m.data.records]
    sub.close()
    assert [msgspec.to_builtins(r) for r in received] == reference(bars)
    # the newest entries survive trimming, ending with the last bar
    assert read_outputs(client, OUTPUT)[-1]["record"] == reference(bars)[-1]


def test_dropped_connections_lose_nothing_and_duplicate_nothing(client):
    """CLIENT KILL cuts the runner's connections at random moments (a lost XREADGROUP
    reply leaves entries pending; a lost script reply leaves outputs written): the
    runner reconnects, re-reads its pending entries and checks the output mark."""
    import random
    import threading

    bars = table_bars(random_walk_table(10, 100, seed=6))
    push(client, bar_fields(bars))
    engine = Engine(backend="cpu", outputs="all")
    runner = RedisStreamRunner(
        engine, _url(client), INPUT,
        group="g", consumer="c", output_stream=OUTPUT, batch_size=5,
        backoff=Backoff(initial=0.02, maximum=0.2),  # reconnects at test speed
    )  # fmt: skip
    runner.prepare()
    worker = threading.Thread(target=runner.run, kwargs={"stop_when_idle": 1.0})
    worker.start()
    rng = random.Random(3)
    kills = 0
    while worker.is_alive() and kills < 30:
        time.sleep(rng.uniform(0.005, 0.05))
        kills += client.client_kill_filter(_type="normal", skipme=True)
    worker.join(240)  # a loaded 2-core machine: generous, the runner ends when idle
    assert not worker.is_alive()
    # (many kills hit idle pooled connections, which redis-py replaces silently)
    assert kills >= 10 and runner.connection_errors >= 1
    assert [o["record"] for o in read_outputs(client, OUTPUT)] == reference(bars)
    assert client.xpending(INPUT, "g")["pending"] == 0
    assert sum(engine.rejections.values()) == 0


def _url(client) -> str:
    kw = client.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/{kw.get('db', 0)}"
