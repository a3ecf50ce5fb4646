"""`atc-stream cluster` labels its rows with the interval of the bars its shard streams hold:
chosen once by the driver before Ray starts, an `--interval` the bars contradict refused
(real redis-server; the run itself on a local Ray, skipped without ray)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from redis_fixtures import redis_server, redis_url  # noqa: F401
from test_cli_redis import one_error_line

from atc_stream.app.console import RunError
from atc_stream.app.stream_interval import StreamInterval, choose_stream_interval
from atc_stream.connectors.redis.stream_spacing import streams_interval
from atc_stream.core.shards import bars_stream, shard_of

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

T0 = 1_700_000_000_000
MINUTE = 60_000
HOUR = 3_600_000
SYMBOLS = ("BTC", "ETH", "SOL", "XRP")  # shard 0 of 2 holds BTC, SOL and XRP; shard 1 ETH
SHARD_STREAMS = "the shard streams atc:bars:{shard-0} .. atc:bars:{shard-1}"


@pytest.fixture
def client(redis_url):  # noqa: F811
    import redis

    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def hourly_shard_bars(client, n: int = 30, shards: int = 2) -> None:
    """``n`` hourly bars of each symbol, each in its shard's stream (as `cluster route`
    leaves them)."""
    assert {shard_of(s, shards) for s in SYMBOLS} == set(range(shards))
    for i in range(n):
        for symbol in SYMBOLS:
            bar = {"symbol": symbol, "time": T0 + i * HOUR, "close": 100 + i % 7}
            client.xadd(bars_stream("atc", shard_of(symbol, shards)), bar)


def test_an_interval_the_shard_bars_contradict_is_refused_before_ray(client, redis_url, run_main):  # noqa: F811
    hourly_shard_bars(client)
    start = ["cluster", "--shards", "2", "--redis", redis_url, "--ray-address", "127.0.0.1:1"]
    code, stderr = run_main([*start, "--interval", "1m"])
    assert code == 2
    line = one_error_line(stderr)
    assert stderr.strip().splitlines() == [line]
    assert f"--interval 1m does not match the bars of {SHARD_STREAMS}, which are 1h apart" in line
    assert line.endswith("give --interval 1h"), line
    assert client.hget("atc:cluster", "shards") is None  # refused before anything recorded
    # one the bars fit goes on to Ray (here an address where none answers)
    code, stderr = run_main([*start, "--interval", "1h"])
    assert code == 2 and "cannot reach the Ray cluster" in one_error_line(stderr), stderr


def test_the_interval_is_chosen_from_every_shard_stream(client):
    streams = [bars_stream("atc", shard) for shard in range(3)]
    assert choose_stream_interval(client, streams, None, named="the shard streams") == (
        StreamInterval(
            "1m",
            "the default: the shard streams hold no two bars of a symbol to infer it from; "
            "give --interval to label the rows",
            "default",
        )
    )
    for i in range(5):  # shards 0 and 1 stay empty
        client.xadd(streams[2], {"symbol": "ETH", "time": T0 + i * HOUR, "close": 1})
    chosen = choose_stream_interval(client, streams, None)
    assert chosen.said() == "1h, inferred from the spacing of the bars they hold"
    assert choose_stream_interval(client, streams, "1h").said() == "1h, from --interval"
    with pytest.raises(RunError, match="most common spacing of their first 100,000 entries"):
        choose_stream_interval(client, streams, "4h")
    one = choose_stream_interval(client, streams[2:], None)  # run-stream's wording
    assert one.said() == "1h, inferred from the spacing of the bars it holds"


def test_shard_streams_are_read_in_order_up_to_the_sample(client):
    first, second = bars_stream("atc", 0), bars_stream("atc", 1)
    for i in range(10):  # A every 5 minutes in the first stream, B every hour in the second
        client.xadd(first, {"symbol": "A", "time": T0 + i * 5 * MINUTE, "close": 1})
    for i in range(30):
        client.xadd(second, {"symbol": "B", "time": T0 + i * HOUR, "close": 1})
    assert streams_interval(client, [first, second], page=3, sample=10) == "5m"
    assert streams_interval(client, [first, second], page=4) == "1h"  # 29 gaps of 1h, 9 of 5m
    assert streams_interval(client, [second, first], sample=12) == "1h"
    assert streams_interval(client, ["missing", "absent"]) is None


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_the_shards_label_hourly_bars_1h(client, redis_url):  # noqa: F811
    pytest.importorskip("ray")
    hourly_shard_bars(client)
    done = subprocess.run(
        [sys.executable, "-m", "atc_stream", "cluster", "--shards", "2", "--redis", redis_url,
         "--output-stream", "out", "--backend", "cpu", "--stop-when-idle", "1"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "; interval 1h, inferred from the spacing of the bars they hold" in done.stderr
    rows = client.xrange("out")
    assert len(rows) == 30 * len(SYMBOLS)
    assert {fields[b"key"].split(b":")[1] for _, fields in rows} == {b"1h"}


def test_shard_snapshots_of_another_interval(client, redis_url, run_main, tmp_path):  # noqa: F811
    """A restored shard keeps its snapshot's interval: snapshots of hourly bars decide
    the label where the streams cannot (empty), and are refused when the streams' bars
    say otherwise, before Ray starts."""
    rows = [f"{s},{T0 + i * HOUR},{100 + i % 7}" for i in range(30) for s in SYMBOLS]
    csv = tmp_path / "bars.csv"
    csv.write_text("symbol,time,close\n" + "\n".join(rows) + "\n")
    backfill = ["replay", str(csv), "-o", str(tmp_path / "o.jsonl"), "--backend", "cpu",
                "--shard-snapshots", "2", "--snapshot-to", redis_url]  # fmt: skip
    code, stderr = run_main(backfill)
    assert code == 0, stderr
    start = ["cluster", "--shards", "2", "--redis", redis_url, "--ray-address", "127.0.0.1:1"]
    code, stderr = run_main(start)  # empty streams: the snapshots' 1h, then Ray
    assert code == 2 and "cannot reach the Ray cluster" in one_error_line(stderr), stderr
    for i in range(30, 40):  # minute bars after them in the streams: contradicted
        for symbol in SYMBOLS:
            bar = {"symbol": symbol, "time": T0 + 30 * HOUR + i * MINUTE, "close": 1}
            client.xadd(bars_stream("atc", shard_of(symbol, 2)), bar)
    code, stderr = run_main(start)
    assert code == 2
    line = one_error_line(stderr)
    assert stderr.strip().splitlines() == [line]
    assert "the shard snapshots label their rows 1h, but the interval is 1m (inferred" in line
    assert "give --interval 1h to go on from the snapshots" in line, line
    assert client.hget("atc:cluster", "shards") is None
