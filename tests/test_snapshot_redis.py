"""RedisSnapshotStore against a real redis-server (fixtures in tests/redis_fixtures.py)."""

from __future__ import annotations

import time
import warnings

import pytest
from redis_fixtures import RedisServer, private_redis, redis_server, redis_url  # noqa: F401
from test_snapshot import MINUTE, _flip, assert_same_state, next_bars, warmed_engine

from atc_stream import Engine
from atc_stream.app.durability import open_snapshot_store
from atc_stream.connectors.redis.snapshots import RedisSnapshotStore
from atc_stream.state.snapshot import SnapshotError, SnapshotWarning, read_header
from atc_stream.state.snapshotter import Snapshotter

redis = pytest.importorskip("redis")
pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def blobs() -> list[bytes]:
    eng, rest = warmed_engine(n_bars=30)
    out = []
    for i in range(6):
        eng.step(next_bars(rest, i, 1, 30 * MINUTE))
        out.append(eng.snapshot({"i": i, "redis_stream": f"{1000 + i}-0"}))
    return out


def test_redis_round_trip_restores_the_engine(redis_url):  # noqa: F811
    eng, rest = warmed_engine(n_bars=80)
    store = RedisSnapshotStore(redis_url, prefix="atc-stream:test", keep=3)
    assert store.list() == [] and store.load_latest() is None
    snapshot_id = store.save(eng.snapshot({"redis_stream": "1700000000000-0"}))
    assert store.list() == [snapshot_id]
    restored = Engine.restore(store.load_latest(), backend="cpu", outputs="all")
    assert_same_state(eng, restored)
    assert restored.source_offsets == {"redis_stream": "1700000000000-0"}
    bars = next_bars(rest, 0, 2, 80 * MINUTE)
    r1, r2 = eng.step(bars), restored.step(bars)
    assert (r1.outputs.view("i8") == r2.outputs.view("i8")).all()


def test_redis_keep_last_k_and_latest_pointer(redis_url, blobs):  # noqa: F811
    store = RedisSnapshotStore(redis_url, prefix="atc-stream:test", keep=3)
    ids = [store.save(b) for b in blobs]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert store.list() == ids[-3:]
    client = redis.Redis.from_url(redis_url)
    assert client.get(store.latest_key).decode() == ids[-1]
    blob_keys = sorted(k.decode() for k in client.keys(store.blob_key_prefix + "*"))
    assert blob_keys == [store.blob_key(i) for i in ids[-3:]]  # older blobs deleted
    assert all(k.startswith("{atc-stream:test}:snapshot:") for k in blob_keys)  # one slot
    found = store.latest()
    assert found.id == ids[-1] and found.blob == blobs[-1]
    assert found.header.source_offsets == {"i": 5, "redis_stream": "1005-0"}
    assert store.load(ids[-2]) == blobs[-2]
    store.delete(ids[-1])
    assert store.list() == ids[-3:-1]
    # the pointer now names a deleted blob: fall back to the newest one that exists
    with pytest.warns(SnapshotWarning, match="missing"):
        assert store.load_latest() == blobs[-2]


def test_redis_falls_back_on_a_damaged_newest(redis_url, blobs):  # noqa: F811
    store = RedisSnapshotStore(redis_url, prefix="atc-stream:test", keep=5)
    ids = [store.save(b) for b in blobs[:3]]
    client = redis.Redis.from_url(redis_url)
    client.set(store.blob_key(ids[-1]), _flip(blobs[2], len(blobs[2]) // 2))
    with pytest.warns(SnapshotWarning, match=f"snapshot {ids[-1]} .* damaged.*checksum"):
        found = store.latest()
    assert found.id == ids[-2] and found.blob == blobs[1]
    client.set(store.blob_key(ids[-2]), blobs[1][:-7])
    with pytest.warns(SnapshotWarning):
        assert store.load_latest() == blobs[0]
    client.set(store.blob_key(ids[0]), b"junk")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SnapshotWarning)
        with pytest.raises(SnapshotError, match="no snapshot in redis 'atc-stream:test' verifies"):
            store.latest()


def test_redis_prefixes_are_isolated_and_clients_accepted(redis_url, blobs):  # noqa: F811
    client = redis.Redis.from_url(redis_url)
    a = RedisSnapshotStore(client, prefix="atc-stream:shard-0", keep=2)
    b = open_snapshot_store(redis_url, keep=2, namespace="shard-1")
    assert isinstance(b, RedisSnapshotStore) and b.prefix == "atc-stream:shard-1"
    a.save(blobs[0])
    b.save(blobs[1])
    b.save(blobs[2])
    assert len(a.list()) == 1 and len(b.list()) == 2
    assert a.load_latest() == blobs[0] and b.load_latest() == blobs[2]
    tagged = RedisSnapshotStore(client, prefix="app:{shard-9}")
    assert tagged.latest_key == "app:{shard-9}:snapshot:latest"  # an explicit hash tag is kept
    with pytest.raises(ValueError, match="decode_responses"):
        RedisSnapshotStore(redis.Redis.from_url(redis_url, decode_responses=True))
    with pytest.raises(ValueError, match="keep"):
        RedisSnapshotStore(client, keep=0)
    with pytest.raises(SnapshotError):
        a.save(b"not a snapshot")
    assert len(a.list()) == 1


def test_redis_outage_save_fails_cleanly_then_recovers(private_redis, blobs):  # noqa: F811
    server: RedisServer = private_redis
    store = RedisSnapshotStore(
        redis.Redis.from_url(server.url, socket_timeout=2, socket_connect_timeout=2), keep=3
    )
    store.save(blobs[0])
    eng, rest = warmed_engine(n_bars=40)
    snap = Snapshotter(eng, store, every_bars=len(eng.streams), every_seconds=None)
    server.stop()
    res = eng.step(next_bars(rest, 0, 1, 40 * MINUTE))
    assert snap.maybe_snapshot(len(res), {"bar": 1}) is True  # never raises into the loop
    snap.wait(30)
    assert snap.failures == 1 and isinstance(snap.last_error, redis.ConnectionError)
    port = server.port
    server.start()
    assert server.port == port  # same address after the outage
    # the server came back empty (no persistence); the script is loaded again by itself
    res = eng.step(next_bars(rest, 1, 1, 40 * MINUTE))
    assert snap.maybe_snapshot(len(res), {"bar": 2}) is True
    snap.wait(30)
    assert snap.snapshots_written == 1 and snap.failures == 1
    final = snap.close({"bar": 2})
    assert store.list()[-1] == final
    restored = Engine.restore(store.load_latest(), backend="cpu", outputs="all")
    assert_same_state(eng, restored)
    assert read_header(store.load_latest()).source_offsets == {"bar": 2}


def test_redis_server_helper_restart(private_redis):  # noqa: F811
    server = private_redis
    client = server.client()
    client.set("k", "v")
    assert server.ping()
    server.restart()
    assert server.ping() and server.client().get("k") is None  # no persistence
    server.stop()
    assert not server.ping() and not server.running
    server.start()
    assert server.running and server.url == f"redis://127.0.0.1:{server.port}/0"


def test_shared_fixture_is_one_server(redis_server, redis_url):  # noqa: F811
    assert redis_server.url == redis_url and redis_server.running


def test_replay_with_the_redis_snapshot_store_down_goes_on_and_says_what_was_not_saved(
    tmp_path,
    private_redis,  # noqa: F811
):
    """The Redis snapshot store stops mid-run: one log line (no traceback per attempt),
    the replay finishes, and the summary says how many snapshots were not saved. (Down
    from the start, it is one line and exit 2: ``test_cli_redis``.)"""
    import subprocess
    import sys

    from atc_stream.connectors.replay.player import random_walk_table

    table = random_walk_table(4, 400, seed=3)
    bars = tmp_path / "bars.csv"
    with open(bars, "w") as f:
        f.write("symbol,time,close\n")
        for s, t, c in zip(table.symbols, table.times, table.closes, strict=True):
            f.write(f"{s},{t},{float(c)!r}\n")
    args = [sys.executable, "-m", "atc_stream", "replay", str(bars), "--no-progress",
            "--backend", "cpu", "--redis", private_redis.url, "--snapshot-every", "100",
            "-o", str(tmp_path / "out.jsonl")]  # fmt: skip
    # paced (100 bar times a second): Redis goes away while the replay runs
    process = subprocess.Popen([*args, "--speed", "6000"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "out.jsonl").exists() or (tmp_path / "out.jsonl").stat().st_size == 0:
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)
    private_redis.stop()
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert stderr.count("snapshot write to") <= 1, stderr
    assert "final snapshot NOT saved" in stderr
    assert "failed" in stderr
    assert len(open(tmp_path / "out.jsonl").readlines()) == len(table)
