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
from redis_fixtures import collected_messages, private_redis, redis_server, redis_url  # noqa: F401
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


@pytest.mark.parametrize("stop, status", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_run_stream_stopped_then_resumed(stop, status, tmp_path, redis_url):  # noqa: F811
    """Either signal stops it after its batch with a final snapshot; a Ctrl-C (SIGINT)
    ends with status 130, so that a script tells it from a finished run, and a SIGTERM,
    how a service is stopped, with 0."""
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
    proc.send_signal(stop)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    assert f"{stop.name}: stopping" in err and "final snapshot" in err
    assert "run-stream done" in err and "Traceback" not in err
    written = client.xlen("sig")
    assert client.xpending("bars", "atc")["pending"] == 0  # every batch read was acknowledged
    assert 500 <= written < 4000
    done = subprocess.run(
        [*base, "--resume", "--stop-when-idle", "0.5"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "+0 suppressed replays" in done.stderr  # a clean stop leaves nothing to replay
    assert f"bars applied     {4000 - written}" in done.stderr
    outputs = read_outputs(client, "sig")
    assert len({(o["key"], o["time"]) for o in outputs}) == len(outputs) == 4000


def add_bars(client, key, n_symbols=4, n_bars=60, seed=5):
    table = random_walk_table(n_symbols, n_bars, seed=seed)
    pipe = client.pipeline(transaction=False)
    for s, t, c in zip(table.symbols, table.times.tolist(), table.closes.tolist(), strict=True):
        pipe.xadd(key, {"symbol": s, "time": t, "close": repr(c)})
    pipe.execute()
    return len(table.times)


def one_error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("atc-stream: error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def test_run_stream_refuses_a_group_already_read_without_resume(redis_url, run_main):  # noqa: F811
    """A fresh engine on a group that delivered entries would compute every later row
    from a stream starting there: refused; --resume applies the stream again instead."""
    import redis

    client = redis.Redis.from_url(redis_url)
    total = add_bars(client, "bars")
    base = ["run-stream", "--redis", redis_url, "--input-stream", "bars", "--output-stream",
            "sig", "--backend", "cpu", "--stop-when-idle", "0.3"]  # fmt: skip
    code, _ = run_main(base)
    assert code == 0 and client.xlen("sig") == total
    client.xadd("bars", {"symbol": "SYM000", "time": 1_900_000_000_000, "close": "100.5"})
    code, stderr = run_main(base)
    assert code == 2
    line = one_error_line(stderr)
    assert "consumer group 'atc' has already read bars" in line and "--resume" in line
    assert client.xlen("sig") == total  # nothing written from a fresh engine
    code, stderr = run_main([*base, "--resume"])
    assert code == 0, stderr
    assert f"+{total} suppressed replays" in stderr
    outputs = read_outputs(client, "sig")
    assert len(outputs) == total + 1
    last = outputs[-1]["record"]
    assert last["symbol"] == "SYM000" and last["bar_index"] == 60  # after its 60 bars
    client.close()


@pytest.mark.parametrize(
    "command",
    [["run-stream", "--input-stream", "bars", "--output-stream", "sig"], ["subscribe"],
     ["live", "--symbols", "BTCUSDT"], ["replay", "bars.csv"]],
)  # fmt: skip
@pytest.mark.parametrize(
    "database, says",
    [(None, "cannot reach Redis at redis://127.0.0.1:1/0"), ("99", "DB index is out of range")],
)
def test_an_unusable_redis_is_one_line_and_exit_2(
    command,
    database,
    says,
    redis_url,  # noqa: F811
    run_main,
    tmp_path,
    monkeypatch,
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bars.csv").write_text("symbol,time,close\nA,1700000000000,1\n")
    url = "redis://127.0.0.1:1/0" if database is None else redis_url.rsplit("/", 1)[0] + "/99"
    code, stderr = run_main([*command, "--redis", url, "--backend", "cpu"][: len(command) + 2])
    assert code == 2
    assert says in one_error_line(stderr)


def test_keys_of_the_wrong_type_are_one_line_and_exit_2(redis_url, run_main):  # noqa: F811
    import redis

    client = redis.Redis.from_url(redis_url)
    client.set("text", "not a stream")
    client.set("atc:latest", "not a hash")
    add_bars(client, "bars", n_bars=5)
    client.close()
    run = ["run-stream", "--redis", redis_url, "--backend", "cpu", "--stop-when-idle", "0.3"]
    for args in (
        ["--input-stream", "text", "--output-stream", "sig"],
        ["--input-stream", "bars", "--output-stream", "text"],
    ):
        code, stderr = run_main([*run, *args])
        assert code == 2
        assert "refused a command: WRONGTYPE" in one_error_line(stderr)
    code, stderr = run_main(["subscribe", "--redis", redis_url, "--latest", "--timeout", "0"])
    assert code == 2
    assert "(reading the latest records): WRONGTYPE" in one_error_line(stderr)


def test_subscribe_to_a_server_that_never_answers_is_one_line(redis_url, run_main, monkeypatch):  # noqa: F811
    """rediss:// on a plain port: the TLS handshake gets no answer, and the subscriber gives
    up after its socket timeout instead of waiting forever."""
    from atc_stream.connectors.redis import pubsub

    monkeypatch.setattr(pubsub, "SUBSCRIBER_SOCKET_TIMEOUT", 1.0)
    started = time.monotonic()
    code, stderr = run_main(["subscribe", "--redis", "rediss" + redis_url[len("redis") :]])
    assert code == 2 and time.monotonic() - started < 30
    assert "cannot reach Redis at rediss://" in one_error_line(stderr)


@pytest.mark.parametrize(
    "args",
    [
        ["run-stream", "--input-stream", "bars", "--stop-when-idle", "nan"],
        ["run-stream", "--input-stream", "bars", "--stop-when-idle", "-1"],
        ["subscribe", "--timeout", "nan"],
        ["cluster", "route", "--input-stream", "bars", "--stop-when-idle", "nan"],
    ],
)
def test_a_wait_that_is_not_a_finite_number_of_seconds_is_refused(args, run_main):
    code, stderr = run_main([*args, "--redis", "redis://127.0.0.1:1/0"])
    assert code == 2
    assert "must be a finite number of seconds >= 0" in one_error_line(stderr)


def test_a_namespace_that_cannot_name_snapshot_files_is_one_line(tmp_path, run_main):
    args = ["--input-stream", "bars", "--output-stream", "sig", "--snapshot-dir", str(tmp_path)]
    args += ["--namespace", "a/b"]
    code, stderr = run_main(["run-stream", "--redis", "redis://127.0.0.1:1/0", *args])
    assert code == 2
    assert "namespace 'a/b' cannot name snapshot files" in one_error_line(stderr)


def test_run_stream_stopped_while_redis_is_down_is_one_line_without_final_snapshot(
    private_redis,  # noqa: F811
    tmp_path,
):
    """SIGTERM while a batch's outputs wait for Redis: the batch is applied in memory only,
    so the run says so in one line (exit 2) and leaves no final snapshot."""
    client = private_redis.client()
    add_bars(client, "bars", n_symbols=40, n_bars=1500)
    snaps = tmp_path / "snaps"
    proc = subprocess.Popen(
        [*ATC, "run-stream", "--redis", private_redis.url, "--input-stream", "bars",
         "--output-stream", "sig", "--batch-size", "60000", "--backend", "cpu",
         "--snapshot-dir", str(snaps), "--snapshot-every", "1000000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    # read (the entries are pending) and the whole reply handed to the socket (no client's
    # output buffer holds any of it), not yet written: the 60,000 bars' step is under way
    while not (
        any(g["pending"] for g in client.xinfo_groups("bars"))
        and all(int(c["omem"]) == 0 for c in client.client_list())
    ):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.002)
    private_redis.stop(kill=True)
    client.close()
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    line = one_error_line(err)
    assert "cannot reach Redis" in line and "--resume applies it again" in line
    assert DirectorySnapshotStore(snaps).list() == []
