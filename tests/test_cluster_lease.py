"""One owner per shard stream and one cluster driver per prefix: leases in Redis (real
redis-server; a local Ray where a driver starts one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cluster_helpers import bar_list, check_outputs, fields, reference
from redis_fixtures import redis_server, redis_url  # noqa: F401

from atc_stream.connectors.cluster.registry import driver_lease_key, heartbeat_key
from atc_stream.connectors.cluster.shard import ShardConfig, ShardWorker, shard_lease_key
from atc_stream.connectors.redis.lease import LEASE_TTL_S, LeaseHeld, LeaseLost
from atc_stream.core.shards import bars_stream

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

COMMAND = [sys.executable, "-m", "atc_stream"]
SHARD_KEY = shard_lease_key("atc", 0, "atc")


@pytest.fixture
def client(redis_url):  # noqa: F811
    import redis

    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


class InThread:
    """``worker.run(stop_when_idle)`` in a thread: its summary or its exception."""

    def __init__(self, worker: ShardWorker, stop_when_idle: float | None = None) -> None:
        self.worker = worker
        self.result: dict | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(stop_when_idle,), daemon=True)
        self.thread.start()

    def _run(self, stop_when_idle: float | None) -> None:
        try:
            self.result = self.worker.run(stop_when_idle=stop_when_idle)
        except BaseException as exc:
            self.error = exc

    def wait_running(self) -> None:
        deadline = time.monotonic() + 60
        while self.worker.state != "running":
            assert self.thread.is_alive() and time.monotonic() < deadline, self.error
            time.sleep(0.02)

    def join(self, timeout: float = 30) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive()


def worker(url: str, **options) -> ShardWorker:
    return ShardWorker(ShardConfig(url, 0, output_stream="out", backend="cpu", **options))


def test_a_second_owner_of_a_shard_stream_waits_then_is_refused(client, redis_url, run_main):  # noqa: F811
    first = InThread(worker(redis_url))
    try:
        first.wait_running()
        # a second actor (or run-stream on the shard's stream) would take part of its bars
        second = InThread(worker(redis_url, lease_wait_s=0.5), stop_when_idle=0.5)
        second.join()
        assert isinstance(second.error, LeaseHeld), second.result
        assert f"holds the lease {SHARD_KEY}" in str(second.error)
        code, stderr = run_main(["run-stream", "--redis", redis_url, "--input-stream",
                                 bars_stream("atc", 0), "--namespace", "shard-0", "--resume",
                                 "--output-stream", "out", "--backend", "cpu",
                                 "--stop-when-idle", "0.5"])  # fmt: skip
        assert code == 2
        assert f"run-stream is already running: {client.get(SHARD_KEY).decode()} " in stderr
    finally:
        first.worker.stop()
        first.join()
    assert first.error is None and not client.exists(SHARD_KEY)  # released on its stop
    # an actor restarted after its predecessor died waits for the lease to come free
    client.set(SHARD_KEY, "a killed actor", px=1000)
    third = InThread(worker(redis_url), stop_when_idle=0.5)
    third.join()
    assert third.error is None and third.result is not None


def test_a_shard_that_lost_its_lease_stops_without_a_final_snapshot(client, redis_url):  # noqa: F811
    bars = bar_list(2, 30)
    for bar in bars:
        client.xadd(bars_stream("atc", 0), fields(bar))
    holder = InThread(worker(redis_url, snapshot_every=1_000_000), stop_when_idle=3)
    holder.wait_running()
    deadline = time.monotonic() + 30
    while client.xlen("out") < len(bars):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    snapshots = client.keys("*snapshot:blob:*")
    # what another process does once this one's lease expired (paused, cut off)
    assert client.set(SHARD_KEY, "another node pid 1", xx=True, px=60_000)
    holder.join()
    assert isinstance(holder.error, LeaseLost), holder.result
    assert "another node pid 1 holds it" in str(holder.error)
    assert client.keys("*snapshot:blob:*") == snapshots  # its state is not the newest
    assert client.get(SHARD_KEY) == b"another node pid 1"


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


def driver(url: str, *extra: str) -> list[str]:
    return [*COMMAND, "cluster", "--shards", "1", "--redis", url, "--output-stream", "out",
            "--backend", "cpu", "--snapshot-every", "40", "--batch-size", "10", *extra]  # fmt: skip


def refused(url: str) -> str:
    """A second driver (pointed at no Ray, so none starts): exit 2, one line."""
    done = subprocess.run(
        driver(url, "--ray-address", "127.0.0.1:1"), capture_output=True, text=True, timeout=60
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    return lines[0]


def test_a_reshard_beside_a_driver_is_refused(client, redis_url):  # noqa: F811
    client.hset("atc:cluster", "shards", 2)
    # a driver starting Ray: no shard beats yet, only its lease says it is there
    client.set(driver_lease_key("atc"), "host1 pid 42 (ab)", px=60_000)
    args = ["cluster", "reshard", "--to", "3", "--redis", redis_url]
    done = subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "host1 pid 42 (ab) holds the lease atc:cluster:lease" in lines[0]
    assert client.hget("atc:cluster", "shards") == b"2"  # nothing rewritten
    client.delete(driver_lease_key("atc"))
    done = subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert client.hget("atc:cluster", "shards") == b"3"
    assert not client.exists(driver_lease_key("atc"))  # let go when done


@pytest.mark.ray
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_second_driver_is_refused_even_while_the_first_starts(client, redis_url):  # noqa: F811
    pytest.importorskip("ray")
    first = subprocess.Popen(driver(redis_url), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not any(n.startswith("gcs_server") for n in children(first.pid)):
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        # no shard beats yet, so only the lease tells that a driver is starting
        assert client.hget(heartbeat_key("atc", 0), "state") is None
        line = refused(redis_url)
        assert line.startswith("atc-stream: error: atc-stream cluster 'atc' (or its reshard) is")
        assert f"pid {first.pid} " in line and f"holds the lease {driver_lease_key('atc')}" in line
        first.send_signal(signal.SIGTERM)
        _, stderr = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, stderr
    assert not client.exists(driver_lease_key("atc"))  # let go on the way out
    assert "Ray" in refused(redis_url)  # now only Ray's address stops it


@pytest.mark.ray
def test_a_driver_killed_is_continued_exactly_once_its_leases_expired(client, redis_url):  # noqa: F811
    pytest.importorskip("ray")
    bars = bar_list(3, 60)
    for bar in bars:
        client.xadd(bars_stream("atc", 0), fields(bar))
    first = subprocess.Popen(driver(redis_url), stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while client.xlen("out") < len(bars) // 2:
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:  # the driver and the local Ray it started, its actor among them
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    assert f"pid {first.pid} " in refused(redis_url)
    deadline = time.monotonic() + max(LEASE_TTL_S, 10) + 5  # leases, and the heartbeat's age
    while True:
        done = subprocess.run(
            driver(redis_url, "--stop-when-idle", "2"), capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        if done.returncode != 2 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert done.returncode == 0, done.stderr
    check_outputs(client, "out", reference(bars))
