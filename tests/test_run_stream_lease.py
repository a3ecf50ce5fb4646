"""Two `atc-stream run-stream` processes on one input stream: the second is refused while
the first holds the input's lease, a SIGKILLed holder is continued exactly once its lease
has expired, and a holder that lost its lease stops without writing (real redis-server,
real processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from cluster_helpers import bar_list, check_outputs, fields, reference
from redis_fixtures import redis_server, redis_url  # noqa: F401

from atc_stream.connectors.redis.lease import LEASE_TTL_S, stream_lease_key

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

KEY = stream_lease_key("bars", "atc")


@pytest.fixture
def client(redis_url):  # noqa: F811
    import redis

    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def command(url: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "atc_stream", "run-stream", "--redis", url,
            "--input-stream", "bars", "--output-stream", "out", "--backend", "cpu",
            "--interval", "1m", "--resume", "--snapshot-every", "50", "--batch-size", "10",
            *extra]  # fmt: skip


class Running:
    """A run-stream process whose stderr is collected as it comes."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            args, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
        )
        self.lines: list[str] = []
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_reading(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(" reading bars after entry" in line for line in self.lines):
            assert self.proc.poll() is None, self.lines
            assert time.monotonic() < deadline, self.lines
            time.sleep(0.02)

    def finish(self, timeout: float = 60.0) -> int:
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self._pump.join(5)
        return code


def refused(url: str) -> str:
    """A second run-stream beside the holder: exit 2 and one line, which it returns."""
    done = subprocess.run(
        command(url, "--stop-when-idle", "1"), capture_output=True, text=True, timeout=60
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    return lines[0]


def push(client, bars) -> None:
    pipe = client.pipeline(transaction=False)
    for bar in bars:
        pipe.xadd("bars", fields(bar))
    pipe.execute()


def test_a_second_process_is_refused_and_a_killed_one_is_continued_exactly(client, redis_url):  # noqa: F811
    bars = bar_list(4, 100)
    first = Running(command(redis_url), env={"ATC_STREAM_FAULT": "after_output:25"})
    try:
        first.wait_reading()
        line = refused(redis_url)  # two consumers of one group would each get part of the bars
        assert line.startswith("atc-stream: error: run-stream is already running: ")
        assert f"pid {first.proc.pid} " in line and f"holds the lease {KEY}" in line
        assert f"({LEASE_TTL_S:g} s after its last renewal)" in line
        push(client, bars)
        assert first.finish() == -signal.SIGKILL  # after the outputs of its 25th batch
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
    written = client.xlen("out")
    assert 0 < written < len(bars)
    assert client.pttl(KEY) > 0  # killed: its lease holds until it expires
    assert f"pid {first.proc.pid} " in refused(redis_url)
    deadline = time.monotonic() + LEASE_TTL_S + 2
    while client.exists(KEY):
        assert time.monotonic() < deadline, "the lease of a killed process did not expire"
        time.sleep(0.05)
    done = subprocess.run(
        command(redis_url, "--stop-when-idle", "1"), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    check_outputs(client, "out", reference(bars))  # every row once, as one engine's
    assert not client.exists(KEY)  # a clean exit lets go at once


def test_a_process_that_lost_its_lease_stops_without_writing(client, redis_url):  # noqa: F811
    holder = Running(command(redis_url))
    try:
        holder.wait_reading()
        snapshots = client.keys("*snapshot:blob:*")
        # paused past its lease's ttl while another process took the input over
        holder.proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + LEASE_TTL_S + 2
        while not client.set(KEY, "another host pid 1", nx=True, px=60_000):
            assert time.monotonic() < deadline, "the lease of a paused process did not expire"
            time.sleep(0.05)
        push(client, bar_list(2, 20))
        holder.proc.send_signal(signal.SIGCONT)
        assert holder.finish(30) == 2, holder.lines
    finally:
        if holder.proc.poll() is None:
            holder.proc.send_signal(signal.SIGCONT)
            holder.proc.kill()
    errors = [line for line in holder.lines if line.startswith("atc-stream: error:")]
    assert len(errors) == 1, holder.lines
    assert f"the lease {KEY} was lost (another host pid 1 holds it)" in errors[0]
    assert "without a final snapshot" in errors[0]
    # not one bar applied or written, no snapshot, and the new holder's lease left alone
    assert client.xlen("out") == 0
    assert client.keys("*snapshot:blob:*") == snapshots
    assert client.get(KEY) == b"another host pid 1"


def test_a_runner_whose_lease_was_taken_unseen_writes_nothing(client, redis_url):  # noqa: F811
    """The lease checked valid before a batch, then taken by another process before the
    batch's output script ran (this one paused past the ttl in between): the script is
    fenced by the lease's token, so it writes and acknowledges nothing, and the runner
    stops with ``LeaseLost``. Without the fence the batch would be written beside the
    new holder's."""
    from atc_stream import Engine
    from atc_stream.connectors.redis.lease import Lease, LeasedStreamRunner, LeaseLost

    bars = bar_list(3, 4)
    push(client, bars)
    lease = Lease(redis_url, KEY, what="run-stream", ttl=30.0)
    lease.acquire()
    try:
        runner = LeasedStreamRunner(
            Engine(backend="cpu", outputs="all"), redis_url, "bars", group="atc",
            consumer="c", output_stream="out", batch_size=5,
        )  # fmt: skip
        runner.lease = lease
        runner.prepare(resume=False)
        entries = runner.client.xreadgroup("atc", "c", {"bars": ">"}, count=5)[0][1]
        assert lease.valid()  # checked before the batch: still valid by its own clock
        client.set(KEY, "another process")  # ...while another took it meanwhile
        with pytest.raises(LeaseLost, match="before this batch was written"):
            runner.process(entries)
        assert client.xlen("out") == 0
        assert client.xpending("bars", "atc")["pending"] == 5  # not acknowledged
        assert client.get(KEY) == b"another process"
    finally:
        lease.release()
    assert client.get(KEY) == b"another process"  # a lost lease is not deleted
