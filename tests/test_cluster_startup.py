"""What a user gets wrong around `atc-stream cluster`: a backfill for another shard count,
a second start beside a running cluster, signals during start-up and the run, Redis
gone as the shards stop, `status` of a cluster never started, an unusable backfill
target (real redis-server, a local Ray where one starts)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from redis_fixtures import private_redis, redis_server, redis_url  # noqa: F401

from atc_stream.connectors.cluster.layout import layout_problem
from atc_stream.connectors.cluster.registry import beat, heartbeat_key, running_shard
from atc_stream.connectors.cluster.shard import ShardConfig, ShardWorker, shard_store
from atc_stream.core.shards import shard_of

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

COMMAND = [sys.executable, "-m", "atc_stream"]


@pytest.fixture
def client(redis_url):  # noqa: F811
    import redis

    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=120)


def bars_csv(tmp_path: Path, symbols: list[str], n: int = 30) -> Path:
    rows = [
        f"{s},{60_000 * (i + 1)},{100 + i + k}" for i in range(n) for k, s in enumerate(symbols)
    ]
    path = tmp_path / "bars.csv"
    path.write_text("symbol,time,close\n" + "\n".join(rows) + "\n")
    return path


def test_a_backfill_for_another_shard_count_is_refused(client, redis_url, tmp_path):  # noqa: F811
    symbols = ["BTC", "ETH", "SOL", "XRP", "DOGE"]
    csv = bars_csv(tmp_path, symbols)
    done = cli("replay", str(csv), "-o", str(tmp_path / "o.jsonl"), "--backend", "cpu",
               "--shard-snapshots", "3", "--snapshot-to", redis_url)  # fmt: skip
    assert done.returncode == 0, done.stderr
    # shard 0 of 2 would restore shard 0 of 3's symbols only, the others' history lost
    done = cli("cluster", "--shards", "2", "--redis", redis_url, "--ray-address", "127.0.0.1:1")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "shard 0 of 3" in lines[0] and "--shard-snapshots 2" in lines[0]
    assert client.hget("atc:cluster", "shards") is None  # nothing recorded

    # a snapshot of symbols that another shard owns (no backfill record) is named
    header = shard_store(redis_url, 2).latest().header
    header.source_offsets.pop("backfill")
    strays = [e.symbol for e in header.streams if shard_of(e.symbol, 2) != 0]
    assert strays
    assert f"holds {strays[0]!r}" in (layout_problem(header, 0, 2) or "")
    assert layout_problem(shard_store(redis_url, 0).latest().header, 0, 3) is None


def test_a_second_start_beside_running_shards_is_refused(client, redis_url):  # noqa: F811
    client.hset("atc:cluster", "shards", 2)
    beat(client, "atc", 1, {"state": "running", "starts": 1})
    assert running_shard(client, "atc", 2)[0] == 1
    # two sets of actors on one consumer group would each apply part of the bars
    done = cli("cluster", "--shards", "2", "--redis", redis_url, "--ray-address", "127.0.0.1:1")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "shard 1" in lines[0] and "already runs" in lines[0]
    # a heartbeat that stopped long ago (a driver killed with its actors) does not hold it
    later = int(time.time() * 1000) + 60_000
    assert running_shard(client, "atc", 2, now_ms=later) is None
    beat(client, "atc", 1, {"state": "stopped"})
    assert running_shard(client, "atc", 2) is None


def test_status_of_a_cluster_never_started_says_how_to_start_one(redis_url):  # noqa: F811
    done = cli("cluster", "status", "--redis", redis_url)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cluster --shards N" in lines[0] and "give --shards" not in lines[0]


def test_an_unusable_backfill_target_is_refused_before_the_replay(redis_url, tmp_path):  # noqa: F811
    csv = bars_csv(tmp_path, ["BTC", "ETH"])
    out = tmp_path / "o.jsonl"
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    for target, said in (
        ("redis://127.0.0.1:1/0", "cannot reach Redis"),
        (f"redis://127.0.0.1:{port}/99", "refused a command"),
        (str(csv), "it is a file"),
    ):
        done = cli("replay", str(csv), "-o", str(out), "--backend", "cpu",
                   "--shard-snapshots", "2", "--snapshot-to", target)  # fmt: skip
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and said in lines[0], done.stderr
        assert not out.exists()  # refused before any bar was read


def test_a_shard_stopped_while_redis_is_down_ends_with_a_warning(private_redis):  # noqa: F811
    worker = ShardWorker(ShardConfig(private_redis.url, 0, output_stream="out", backend="cpu"))
    result: dict[str, object] = {}
    thread = threading.Thread(target=lambda: result.update(worker.run()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while worker.state != "running" and time.monotonic() < deadline:
        time.sleep(0.02)
    private_redis.stop()
    worker.stop()
    thread.join(30)
    # every output was written: only the final snapshot is missing, which the next start
    # makes good (its previous snapshot and the output mark), so this is no failure
    assert result["warnings"] and "final snapshot not saved" in str(result["warnings"])


def start(redis_url: str) -> subprocess.Popen:  # noqa: F811
    args = ["cluster", "--shards", "2", "--redis", redis_url, "--output-stream", "out",
            "--backend", "cpu"]  # fmt: skip
    return subprocess.Popen([*COMMAND, *args], stderr=subprocess.PIPE, text=True)


def children(pid: int) -> list[str]:
    """The command names of ``pid``'s child processes."""
    names = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        if entry.name.isdigit() and int(rest.split()[1]) == pid:
            names.append(name)
    return names


@pytest.mark.ray
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_sigterm_while_ray_starts_is_one_line_and_exit_0(redis_url):  # noqa: F811
    pytest.importorskip("ray")
    driver = start(redis_url)
    deadline = time.monotonic() + 60
    while not any(n.startswith("gcs_server") for n in children(driver.pid)):
        assert driver.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    driver.send_signal(signal.SIGTERM)  # inside ray.init: Ray's handler would exit 15
    _, stderr = driver.communicate(timeout=60)
    assert driver.returncode == 0, stderr
    assert "SIGTERM: stopped during start-up" in stderr


@pytest.mark.ray
def test_ctrl_c_stops_the_shards_exits_130_and_counts_this_runs_restarts(client, redis_url):  # noqa: F811
    pytest.importorskip("ray")
    for shard in range(2):  # what earlier runs left: each start of theirs counted
        client.hset(heartbeat_key("atc", shard), mapping={"starts": 5, "state": "stopped"})
    driver = start(redis_url)
    deadline = time.monotonic() + 90
    while not all(client.hget(heartbeat_key("atc", s), "state") == b"running" for s in range(2)):
        assert driver.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    driver.send_signal(signal.SIGINT)
    _, stderr = driver.communicate(timeout=60)
    assert driver.returncode == 130, stderr  # as run-stream: a script tells it from an end
    assert "SIGINT: stopping the shards" in stderr and "cluster done" in stderr
    assert stderr.count(", 0 restarts,") == 2  # no crash in this run
