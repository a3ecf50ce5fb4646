"""Routing bars to shard streams, a shard's engine without Ray, and the cluster command's
refusals (real redis-server; no Ray cluster is started here)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from cluster_helpers import bar_list, check_outputs, fields, reference
from redis_fixtures import private_redis, redis_server, redis_url  # noqa: F401

from atc_stream.connectors.cluster.registry import heartbeat_key, recorded_shards
from atc_stream.connectors.cluster.router import Router, StreamRouter
from atc_stream.connectors.cluster.shard import ShardConfig, ShardWorker, shard_store
from atc_stream.connectors.retry import Backoff
from atc_stream.core.shards import bars_stream, shard_of
from atc_stream.state.snapshot import SnapshotWarning

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]

FAST = Backoff(initial=0.02, maximum=0.2)


@pytest.fixture
def client(redis_url):  # noqa: F811
    import redis

    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def shard_contents(client, shards: int) -> dict[int, list[tuple[str, int]]]:
    out = {}
    for shard in range(shards):
        entries = client.xrange(bars_stream("atc", shard))
        out[shard] = [(f[b"symbol"].decode(), int(f[b"time"])) for _, f in entries]
    return out


def test_router_writes_each_bar_to_its_shard_stream_in_order(client):
    bars = bar_list(6, 20)
    router = Router(client, 3, batch=7)
    for bar in bars:
        router.send(fields(bar))
    router.send({"time": 1, "close": "1"})  # no symbol: counted, dropped
    router.flush()
    assert router.routed == len(bars) and router.unroutable == 1
    got = shard_contents(client, 3)
    for shard in range(3):
        assert got[shard] == [(s, t) for s, t, _ in bars if shard_of(s, 3) == shard]


def test_router_waits_out_a_redis_outage_and_loses_nothing(private_redis):  # noqa: F811
    bars = bar_list(4, 30)
    router = Router(private_redis.url, 2, batch=10, backoff=FAST)
    for bar in bars[:40]:
        router.send(fields(bar))
    private_redis.stop()
    for bar in bars[40:]:  # queued; the flushes at each 10th fail and are retried
        router.pending.append(
            (shard_of(bar[0], 2), [k for kv in fields(bar).items() for k in (kv[0], str(kv[1]))])
        )
    assert router.flush(timeout=0.5) == 0 and router.connection_errors >= 1
    assert len(router.pending) == len(bars) - 40
    private_redis.start()
    assert router.flush(timeout=60) == len(bars) - 40
    got = shard_contents(private_redis.client(), 2)
    # the restarted server is empty: everything queued since the outage was written
    assert sorted(got[0] + got[1]) == sorted((s, t) for s, t, _ in bars[40:])


def test_stream_router_moves_each_entry_once_through_dropped_connections(private_redis):  # noqa: F811
    import redis

    bars = bar_list(5, 400)
    c = redis.Redis.from_url(private_redis.url)
    pipe = c.pipeline(transaction=False)
    for bar in bars:
        pipe.xadd("in", fields(bar))
    pipe.xadd("in", {"close": "1"})  # unroutable: acknowledged and counted
    pipe.execute()
    router = StreamRouter(private_redis.url, "in", 3, batch_size=3, backoff=FAST)
    router.prepare()
    done = threading.Event()

    def drop_connections() -> None:  # the router's connections die mid-batch, replies lost
        for _ in range(15):
            if done.wait(0.02):
                return
            c.client_kill_filter(_type="normal", skipme=True)

    killer = threading.Thread(target=drop_connections)
    killer.start()
    router.run(stop_when_idle=0.5)
    done.set()
    killer.join()
    assert router.stats.connection_errors >= 1
    # a second router process (same consumer) finds nothing left to move
    again = StreamRouter(private_redis.url, "in", 3, batch_size=9, backoff=FAST)
    again.run(stop_when_idle=0.3)
    assert again.stats.entries == 0
    got = shard_contents(c, 3)
    assert sorted(got[0] + got[1] + got[2]) == sorted((s, t) for s, t, _ in bars)
    for shard in range(3):  # in order, once each
        assert got[shard] == [(s, t) for s, t, _ in bars if shard_of(s, 3) == shard]
    # a batch whose reply was lost is moved but not counted
    assert router.stats.unroutable <= 1 and len(bars) - 3 * 15 <= router.stats.routed <= len(bars)
    assert c.xpending("in", "atc-router")["pending"] == 0


def test_shard_worker_falls_back_to_the_previous_snapshot_with_a_warning(client, redis_url):  # noqa: F811
    every = bar_list(6, 80)
    bars = every[: 6 * 60]
    mine = [b for b in bars if shard_of(b[0], 2) == 1]
    for bar in mine:
        client.xadd(bars_stream("atc", 1), fields(bar))
    config = ShardConfig(redis_url, 1, output_stream="out", batch_size=25, snapshot_every=25,
                         backend="cpu")  # fmt: skip
    first = ShardWorker(config).run(stop_when_idle=0.3)
    assert first["restored_from"] is None and first["bars"] == len(mine)
    store = shard_store(redis_url, 1)
    newest = store.list()[-1]
    client.set(store.blob_key(newest), b"damaged")
    more = every[len(bars) :]
    for bar in more:
        if shard_of(bar[0], 2) == 1:
            client.xadd(bars_stream("atc", 1), fields(bar))
    with pytest.warns(SnapshotWarning, match="damaged"):
        second = ShardWorker(config).run(stop_when_idle=0.3)
    assert second["restored_from"] is not None and second["restored_from"] < newest
    assert second["starts"] == 2 and second["warnings"]
    expected = reference([b for b in every if shard_of(b[0], 2) == 1])
    check_outputs(client, "out", expected)
    beat = client.hgetall(heartbeat_key("atc", 1))
    assert b"damaged" in beat[b"warning"] and int(beat[b"streams"]) == len({b[0] for b in mine})
    assert int(beat[b"last_bar_time"]) == max(t for s, t, _ in every if shard_of(s, 2) == 1)
    assert beat[b"state"] == b"stopped"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "atc_stream", *args], capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def test_a_second_start_with_another_shard_count_is_refused(client, redis_url):  # noqa: F811
    client.hset("atc:cluster", "shards", 2)
    done = cli("cluster", "--shards", "3", "--redis", redis_url, "--ray-address", "127.0.0.1:1")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "has 2 shards, not 3" in lines[0] and "reshard" in lines[0]
    assert recorded_shards(client, "atc") == 2


def test_an_unreachable_or_unknown_ray_address_is_one_line_and_exit_2(redis_url):  # noqa: F811
    pytest.importorskip("ray")
    import redis

    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    for address in ("127.0.0.1:1", f"127.0.0.1:{port}", "nowhere.invalid:6379"):
        done = cli("cluster", "--shards", "2", "--redis", redis_url, "--ray-address", address)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and f"cannot reach the Ray cluster at {address!r}" in lines[0]
    client = redis.Redis.from_url(redis_url)
    assert recorded_shards(client, "atc") is None  # a cluster that never ran records nothing
    done = cli("cluster", "--shards", "3", "--redis", redis_url, "--ray-address", "127.0.0.1:1")
    assert "cannot reach the Ray cluster" in done.stderr  # not "has 2 shards, not 3"


def test_single_machine_paths_do_not_import_ray(tmp_path):
    csv = tmp_path / "bars.csv"
    csv.write_text("symbol,time,close\nA,1,1.0\nA,2,2.0\n")
    out = tmp_path / "o.jsonl"
    code = (
        "import sys, atc_stream\n"
        "from atc_stream.app.cli import main\n"
        "try:\n"
        f"    main(['replay', {str(csv)!r}, '--backend', 'cpu', '-o', {str(out)!r}])\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "assert 'ray' not in sys.modules, 'ray imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr


def run_shards(redis_url: str, shards: int) -> None:  # noqa: F811
    """Each shard's engine until idle, one after the other (what the actors do at once)."""
    for shard in range(shards):
        config = ShardConfig(redis_url, shard, output_stream="out", batch_size=30,
                             snapshot_every=40, backend="cpu")  # fmt: skip
        ShardWorker(config).run(stop_when_idle=0.3)


def test_reshard_2_3_2_between_runs_gives_the_single_process_outputs(client, redis_url):  # noqa: F811
    every = bar_list(7, 45)
    thirds = [every[: 7 * 15], every[7 * 15 : 7 * 30], every[7 * 30 :]]
    client.hset("atc:cluster", "shards", 2)
    for part, shards in zip(thirds, (2, 3, 2), strict=True):
        if recorded_shards(client, "atc") != shards:
            done = cli("cluster", "reshard", "--to", str(shards), "--redis", redis_url)
            assert done.returncode == 0, done.stderr
            assert recorded_shards(client, "atc") == shards
        router = Router(client, shards)
        for bar in part:
            router.send(fields(bar))
        router.flush()
        run_shards(redis_url, shards)
    check_outputs(client, "out", reference(every))


def test_reshard_refuses_undrained_streams_and_a_missing_cluster(client, redis_url):  # noqa: F811
    done = cli("cluster", "reshard", "--to", "3", "--redis", redis_url)
    assert done.returncode == 2 and "no cluster under prefix 'atc'" in done.stderr
    client.hset("atc:cluster", "shards", 2)
    router = Router(client, 2)
    for bar in bar_list(4, 5):
        router.send(fields(bar))
    router.flush()
    done = cli("cluster", "reshard", "--to", "3", "--redis", redis_url)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "drain them first" in lines[0]
    assert recorded_shards(client, "atc") == 2


def test_replay_route_shards_writes_a_files_bars_to_the_shard_streams(client, redis_url, tmp_path):  # noqa: F811
    bars = bar_list(5, 20)
    csv = tmp_path / "bars.csv"
    csv.write_text("symbol,time,close\n" + "".join(f"{s},{t},{c!r}\n" for s, t, c in bars))
    done = cli("replay", str(csv), "--route-shards", "3", "--redis", redis_url, "--no-progress")
    assert done.returncode == 0, done.stderr
    got = shard_contents(client, 3)
    for shard in range(3):
        assert got[shard] == [(s, t) for s, t, _ in bars if shard_of(s, 3) == shard]
    closes = {(f[b"symbol"].decode(), int(f[b"time"])): float(f[b"close"])
              for _, f in client.xrange(bars_stream("atc", 0))}  # fmt: skip
    assert all(closes[(s, t)] == c for s, t, c in bars if shard_of(s, 3) == 0)
    again = cli("replay", str(csv), "--route-shards", "2", "--redis", redis_url)
    assert again.returncode == 2 and "has 3 shards, not 2" in again.stderr


def test_redis_errors_of_the_cluster_commands_are_one_line_and_exit_2(client, redis_url):  # noqa: F811
    client.set("text", "not a stream")
    bad_db = redis_url.rsplit("/", 1)[0] + "/99"
    for args, says in (
        (["status", "--redis", bad_db], "DB index is out of range"),
        (["route", "--redis", redis_url, "--input-stream", "text", "--shards", "2",
          "--stop-when-idle", "0.2"], "refused a command: WRONGTYPE"),
    ):  # fmt: skip
        done = cli("cluster", *args)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0] and "Traceback" not in done.stderr


def test_a_shard_summary_counts_malformed_entries_and_rejected_bars(client, redis_url):  # noqa: F811
    every = bar_list(4, 20)
    shard = shard_of(every[0][0], 2)
    bars = [b for b in every if shard_of(b[0], 2) == shard]
    stream = bars_stream("atc", shard)
    for bar in bars:
        client.xadd(stream, fields(bar))
    client.xadd(stream, {"symbol": bars[0][0], "time": "yesterday", "close": "1"})
    client.xadd(stream, fields(bars[-1]))  # again: a duplicate bar
    config = ShardConfig(redis_url, shard, output_stream="out", backend="cpu")
    summary = ShardWorker(config).run(stop_when_idle=0.3)
    assert summary["bars"] == len(bars)  # applied: not the duplicate the engine rejected
    assert summary["malformed"] == {"bad_time": 1}
    assert summary["rejected"] == {"duplicate_bar": 1}
