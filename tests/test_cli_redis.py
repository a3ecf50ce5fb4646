"""The CLI with Redis: --redis, --snapshot-dir, --snapshot-every, --resume, SIGTERM, and
the run-stream / subscribe commands (real redis-server, real subprocesses)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import msgspec
import pytest
from redis_fixtures import collected_messages, redis_server, redis_url  # noqa: F401
from typer.testing import CliRunner

from atc_stream.app.cli import app
from atc_stream.connectors.redis.pubsub import SignalSubscriber
from atc_stream.connectors.redis.stream_output import read_outputs
from atc_stream.connectors.replay.player import random_walk_table
from atc_stream.core.schema import SCHEMA_VERSION
from atc_stream.state.snapshot_stores import DirectorySnapshotStore

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]

cli = CliRunner(env={"COLUMNS": "240", "TERMINAL_WIDTH": "240", "NO_COLOR": "1"})
ATC = [sys.executable, "-m", "atc_stream"]


def write_csv(path, table):
    with open(path, "w") as f:
        f.write("symbol,time,close\n")
        for s, t, c in zip(table.symbols, table.times, table.closes, strict=True):
            f.write(f"{s},{t},{float(c)!r}\n")


def read_jsonl(path):
    return [json.loads(line) for line in open(path)]


def test_replay_publishes_to_redis(tmp_path, redis_url):  # noqa: F811
    table = random_walk_table(3, 50, seed=1)
    write_csv(tmp_path / "bars.csv", table)
    sub = SignalSubscriber(redis_url, batch=True)
    sub.wait_ready()
    with collected_messages(sub) as got:
        result = cli.invoke(
            app,
            ["replay", str(tmp_path / "bars.csv"), "-o", str(tmp_path / "o.jsonl"),
             "--no-progress", "--warmup", "10", "--redis", redis_url, "--backend", "cpu"],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    sub.close()
    assert "41 steps delivered, 0 dropped" in result.output  # 1 warmup + 40 bar times
    rows = [r for m in got for r in m.data.records]
    file_rows = read_jsonl(tmp_path / "o.jsonl")
    assert [msgspec.to_builtins(r) for r in rows] == [
        dict(row, v=SCHEMA_VERSION) for row in file_rows
    ]


def test_snapshot_options_need_a_store(tmp_path):
    table = random_walk_table(2, 20, seed=1)
    write_csv(tmp_path / "bars.csv", table)
    result = cli.invoke(app, ["replay", str(tmp_path / "bars.csv"), "--snapshot-every", "5"])
    assert result.exit_code == 2
    assert "--snapshot-dir" in result.output


def test_replay_killed_then_resumed_continues_at_the_recorded_row(tmp_path):
    table = random_walk_table(4, 300, seed=2)
    bars = tmp_path / "bars.csv"
    write_csv(bars, table)
    common = ["replay", str(bars), "--warmup", "20", "--no-progress", "--backend", "cpu"]
    full = cli.invoke(app, [*common, "-o", str(tmp_path / "full.jsonl")])
    assert full.exit_code == 0, full.output
    full_rows = read_jsonl(tmp_path / "full.jsonl")

    snaps = tmp_path / "snaps"
    # paced (1 bar time per 10 ms) so that it can be killed half-way
    paced = [*common, "--speed", "6000", "--snapshot-dir", str(snaps), "--snapshot-every", "100"]
    proc = subprocess.Popen(
        [*ATC, *paced, "-o", str(tmp_path / "first.jsonl")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while len(list(snaps.glob("*.atcsnap"))) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    proc.stderr.close()
    found = DirectorySnapshotStore(snaps).latest()
    position = found.header.source_offsets["file"]["rows"]
    assert 0 < position < len(table)

    second = subprocess.run(
        [*ATC, *common, "--snapshot-dir", str(snaps), "--resume", "-o", str(tmp_path / "2.jsonl")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert second.returncode == 0, second.stderr
    assert f"resuming: {position} rows at or before" in second.stderr
    resumed_rows = read_jsonl(tmp_path / "2.jsonl")
    # the resumed run writes exactly the rows after the snapshot's position
    assert resumed_rows == full_rows[len(full_rows) - len(resumed_rows) :]
    warm_rows = 4  # one warmup row per stream
    assert len(resumed_rows) == len(table) - position
    assert len(full_rows) == warm_rows + len(table) - 4 * 20


def test_demo_sigterm_writes_a_final_snapshot_and_resume_finishes(tmp_path, redis_url):  # noqa: F811
    snaps = tmp_path / "snaps"
    args = ["demo", "--symbols", "10", "--bars", "4000", "--warmup", "200", "--no-progress"]
    args += ["--snapshot-dir", str(snaps), "--snapshot-every", "5000", "--redis", redis_url]
    proc = subprocess.Popen(
        [*ATC, *args, "-o", str(tmp_path / "1.jsonl")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not list(snaps.glob("*.atcsnap")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "SIGTERM: stopping" in err and "final snapshot" in err
    first = read_jsonl(tmp_path / "1.jsonl")
    position = DirectorySnapshotStore(snaps).latest().header.source_offsets["demo"]["rows"]
    assert position == 10 * 200 + (len(first) - 10)  # the final snapshot is where it stopped

    second = subprocess.run(
        [*ATC, *args, "--resume", "-o", str(tmp_path / "2.jsonl")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert second.returncode == 0, second.stderr
    assert "full recomputation check: last signal of 10 symbols identical" in second.stderr
    rest = read_jsonl(tmp_path / "2.jsonl")
    assert len(first) - 10 + len(rest) == 10 * 3800  # every stepped bar exactly once
    assert [r["bar_index"] for r in rest if r["symbol"] == "SYM003"][-1] == 3999


def test_run_stream_sigterm_then_resume(tmp_path, redis_url):  # noqa: F811
    import redis

    client = redis.Redis.from_url(redis_url)
    table = random_walk_table(10, 400, seed=3)
    pipe = client.pipeline(transaction=False)
    for s, t, c in zip(table.symbols, table.times.tolist(), table.closes.tolist(), strict=True):
        pipe.xadd("bars", {"symbol": s, "time": t, "close": repr(c)})
    pipe.execute()
    base = [*ATC, "run-stream", "--redis", redis_url, "--input-stream", "bars"]
    base += ["--output-stream", "sig", "--batch-size", "20", "--backend", "cpu"]
    base += ["--snapshot-every", "100000"]  # only the final snapshot (in Redis: no --snapshot-dir)
    proc = subprocess.Popen(base, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not client.exists("sig") or client.xlen("sig") < 500:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "final snapshot" in err
    written = client.xlen("sig")
    assert 500 <= written < 4000
    done = subprocess.run(
        [*base, "--resume", "--stop-when-idle", "0.5"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "+0 suppressed replays" in done.stderr  # a clean stop leaves nothing to replay
    assert f"bars applied     {4000 - written}" in done.stderr
    outputs = read_outputs(client, "sig")
    assert len({(o["key"], o["time"]) for o in outputs}) == len(outputs) == 4000
