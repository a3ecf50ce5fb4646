"""The cluster on a local multi-node Ray cluster: shard actors SIGKILLed at random points
and a whole node lost while bars flow, with every output exactly once and equal to one
engine's (real redis-server; skipped without ray)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cluster_helpers import bar_list, check_outputs, fields, reference
from redis_fixtures import redis_server, redis_url  # noqa: F401

from atc_stream.connectors.cluster.registry import heartbeat_key
from atc_stream.connectors.cluster.router import Router
from atc_stream.core.shards import shard_of

pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.redis, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[1]
PATHS = [str(REPO), os.environ.get("PYTHONPATH")]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in PATHS if p)}
#: generous, event-driven waits (a restart imports the package and loads the kernels)
WAIT_S = 120.0


@pytest.fixture(scope="module")
def ray_cluster():
    """A head and two workers, one CPU each: a shard actor takes a node's CPU."""
    from ray.cluster_utils import Cluster

    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = ENV["PYTHONPATH"]  # the raylets' workers import this tree
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()
    if before is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = before


@pytest.fixture
def client(redis_url):  # noqa: F811
    import redis

    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def start(redis_url: str, address: str, shards: int) -> subprocess.Popen:  # noqa: F811
    args = ["cluster", "--shards", str(shards), "--redis", redis_url, "--ray-address", address,
            "--output-stream", "out", "--snapshot-every", "30", "--batch-size", "20",
            "--backend", "cpu"]  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "atc_stream", *args], env=ENV, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_for(what: str, check, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def beat(client, shard: int) -> dict[str, str]:
    raw = client.hgetall(heartbeat_key("atc", shard))
    return {k.decode(): v.decode() for k, v in raw.items()}


def running(client, shard: int, starts: int) -> dict[str, str] | None:
    """The heartbeat of the shard's ``starts``-th start once its loop runs."""
    b = beat(client, shard)
    return b if b.get("starts") == str(starts) and b.get("state") == "running" else None


def stop(proc: subprocess.Popen, client, expected: int) -> str:
    """Wait until the output stream holds ``expected`` entries, then SIGTERM the driver."""
    try:
        wait_for("every output", lambda: proc.poll() is not None or client.xlen("out") >= expected)
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    return stderr


def test_shard_actors_sigkilled_ten_times_lose_and_repeat_nothing(ray_cluster, client, redis_url):  # noqa: F811
    bars = bar_list(8, 150)
    assert {shard_of(s, 2) for s, _, _ in bars} == {0, 1}
    steps = [bars[i : i + 8] for i in range(0, len(bars), 8)]
    groups = [steps[len(steps) * g // 11 : len(steps) * (g + 1) // 11] for g in range(11)]
    proc = start(redis_url, ray_cluster.address, 2)
    kills = threading.Semaphore(0)
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            router = Router(redis_url, 2)
            for g, group in enumerate(groups):
                if g:
                    kills.acquire()  # each group flows while the next kill comes
                for step in group:
                    for bar in step:
                        router.send(fields(bar))
                    router.flush()
                    time.sleep(0.03)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    producer = threading.Thread(target=produce)
    rng = random.Random(5)
    starts = {0: 1, 1: 1}
    try:
        for shard in (0, 1):
            wait_for(f"shard {shard}", lambda s=shard: running(client, s, 1))
        producer.start()
        for _ in range(10):
            shard = rng.randrange(2)
            now = starts[shard]
            pid = int(
                wait_for("a running shard", lambda s=shard, n=now: running(client, s, n))["pid"]
            )
            time.sleep(rng.uniform(0.0, 0.6))
            os.kill(pid, signal.SIGKILL)
            starts[shard] += 1
            kills.release()
        producer.join(WAIT_S)
        assert not errors, errors
        stderr = stop(proc, client, len(bars))
    finally:
        if proc.poll() is None:
            proc.kill()
    check_outputs(client, "out", reference(bars))
    assert "cluster done" in stderr
    for shard in (0, 1):
        assert int(beat(client, shard)["starts"]) >= starts[shard]
    status = subprocess.run(
        [sys.executable, "-m", "atc_stream", "cluster", "status", "--redis", redis_url],
        env=ENV, capture_output=True, text=True, timeout=WAIT_S,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0] == "cluster 'atc': 2 shards" and len(lines) == 3
    assert f"restarts {starts[0] - 1}" in lines[1] and "lag 0" in lines[1]
    assert "stopped" in lines[1] and "backend cpu" in lines[2]


def test_a_lost_node_moves_its_shard_and_loses_nothing(ray_cluster, client, redis_url):  # noqa: F811
    bars = bar_list(6, 80)
    half = len(bars) // 2
    proc = start(redis_url, ray_cluster.address, 2)
    try:
        router = Router(redis_url, 2)
        for bar in bars[:half]:
            router.send(fields(bar))
        router.flush()
        wait_for("half the outputs", lambda: client.xlen("out") >= half)
        head = ray_cluster.head_node.node_id
        nodes = {beat(client, s)["node"]: s for s in (0, 1)}
        victim = next(n for n in ray_cluster.worker_nodes if n.node_id in nodes)
        shard = nodes[victim.node_id]
        ray_cluster.remove_node(victim, allow_graceful=False)
        for bar in bars[half:]:
            router.send(fields(bar))
        router.flush()
        moved = wait_for("the shard on another node", lambda: (
            (b := running(client, shard, 2)) and b["node"] not in (victim.node_id, "") and b
        ))  # fmt: skip
        assert moved["node"] != victim.node_id and head
        stop(proc, client, len(bars))
    finally:
        if proc.poll() is None:
            proc.kill()
        ray_cluster.add_node(num_cpus=1)
    check_outputs(client, "out", reference(bars))


def test_reshard_2_3_2_between_cluster_runs_gives_the_single_process_outputs(
    ray_cluster,
    client,
    redis_url,  # noqa: F811
):
    every = bar_list(7, 36)
    thirds = [every[: 7 * 12], every[7 * 12 : 7 * 24], every[7 * 24 :]]
    written = 0
    for part, shards in zip(thirds, (2, 3, 2), strict=True):
        if written:
            done = subprocess.run(
                [sys.executable, "-m", "atc_stream", "cluster", "reshard", "--to", str(shards),
                 "--redis", redis_url], env=ENV, capture_output=True, text=True, timeout=WAIT_S,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
        proc = start(redis_url, ray_cluster.address, shards)
        router = Router(redis_url, shards)
        for bar in part:
            router.send(fields(bar))
        router.flush()
        written += len(part)
        stop(proc, client, written)
    check_outputs(client, "out", reference(every))
