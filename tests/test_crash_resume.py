"""Exactly-once Redis Streams processing across SIGKILLs (issue 4), with a real redis-server.

20 symbols x 300 bars go into an input stream; ``atc-stream run-stream`` runs as a
subprocess and is killed with SIGKILL several times -- at injected points inside the
batch loop (``ATC_STREAM_FAULT``: after the read, after the step, after the outputs
were written, after a snapshot became durable) and from outside at random moments --
and restarted with ``--resume`` each time. At the end the output stream must hold
every (stream, bar) exactly once, equal to an uninterrupted engine run: no bar lost,
none applied twice, no duplicate output (the design writes none; see
``atc_stream/adapters/redis_streams.py``).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from redis_fixtures import redis_server, redis_url  # noqa: F401

from atc_stream import ATCParams, Engine, compute
from atc_stream.adapters.redis_pubsub import records_from_result
from atc_stream.adapters.redis_streams import read_outputs
from atc_stream.replay.player import random_walk_table

pytestmark = [pytest.mark.redis, pytest.mark.timeout(420)]

N_SYMBOLS, N_BARS = 20, 300
INPUT, OUTPUT = "bars:in", "signals:out"


def push_bars(client, table) -> None:
    pipe = client.pipeline(transaction=False)
    for s, t, c in zip(
        table.symbols.tolist(), table.times.tolist(), table.closes.tolist(), strict=True
    ):
        pipe.xadd(INPUT, {"symbol": s, "time": t, "close": repr(c)})
    pipe.execute()


def command(url, snapshot_dir, *, resume, idle=None):
    cmd = [
        sys.executable, "-m", "atc_stream.cli", "run-stream",
        "--redis", url, "--input-stream", INPUT, "--output-stream", OUTPUT,
        "--group", "g", "--consumer", "c1", "--snapshot-dir", str(snapshot_dir),
        "--snapshot-every", "250", "--batch-size", "40", "--backend", "cpu",
    ]  # fmt: skip
    if resume:
        cmd.append("--resume")
    if idle is not None:
        cmd += ["--stop-when-idle", str(idle)]
    return cmd


def reference_rows(table):
    """Every (stream, bar) record of an uninterrupted engine fed the same bars."""
    engine = Engine(ATCParams(), backend="cpu", outputs="all")
    bars = list(
        zip(table.symbols.tolist(), table.times.tolist(), table.closes.tolist(), strict=True)
    )
    rows = []
    for i in range(0, len(bars), 40):
        batch = bars[i : i + 40]
        for symbol in {b[0] for b in batch} - set(engine.symbols):
            engine.add_symbol(symbol)
        rows += records_from_result(engine.step(batch))
    return rows


def test_sigkill_anywhere_then_resume_is_exactly_once(redis_url, tmp_path):  # noqa: F811
    import msgspec
    import redis

    client = redis.Redis.from_url(redis_url)
    table = random_walk_table(N_SYMBOLS, N_BARS, seed=5)
    push_bars(client, table)
    snapshots = tmp_path / "snapshots"
    rng = random.Random(20240611)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    total = N_SYMBOLS * N_BARS
    started = time.monotonic()
    kills = []

    def out_len():
        return client.xlen(OUTPUT) if client.exists(OUTPUT) else 0

    # 1) injected kills inside the loop, one per crash window, then 2) random outside kills
    plan = [
        ("after_output", rng.randint(3, 12)),
        ("after_step", rng.randint(3, 12)),
        ("after_snapshot", rng.randint(1, 3)),
        ("after_read", rng.randint(3, 12)),
        (None, rng.randint(150, 600)),
        (None, rng.randint(150, 600)),
    ]
    for run, (fault, arg) in enumerate(plan):
        before = out_len()
        if before >= total:
            break
        run_env = dict(env)
        if fault is not None:
            run_env["ATC_STREAM_FAULT"] = f"{fault}:{arg}"
        proc = subprocess.Popen(
            command(redis_url, snapshots, resume=run > 0),
            env=run_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        if fault is None:
            # kill once at least `arg` more rows are out, plus a random few milliseconds
            deadline = time.monotonic() + 60
            while proc.poll() is None and out_len() < before + arg:
                assert time.monotonic() < deadline, "run-stream made no progress"
                time.sleep(0.005)
            time.sleep(rng.uniform(0, 0.05))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        stderr = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
        kills.append((fault, arg, proc.returncode, out_len()))
        if proc.returncode not in (-signal.SIGKILL, 0):
            pytest.fail(f"run {run} exited with {proc.returncode}:\n{stderr}")

    final = subprocess.run(
        command(redis_url, snapshots, resume=True, idle=1.0),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert final.returncode == 0, final.stderr
    assert sum(1 for k in kills if k[2] == -signal.SIGKILL) >= 4, kills
    elapsed = time.monotonic() - started

    outputs = read_outputs(client, OUTPUT)
    keys = [(o["key"], o["time"]) for o in outputs]
    assert len(keys) == len(set(keys)), "a bar was written twice"
    assert len(outputs) == total, f"{total - len(outputs)} bars lost ({kills})"
    srcs = [tuple(map(int, o["src"].split("-"))) for o in outputs]
    assert srcs == sorted(srcs)  # output in input order
    # every input entry acknowledged, nothing left pending
    assert client.xpending(INPUT, "g")["pending"] == 0

    expected = reference_rows(table)
    got = [o["record"] for o in outputs]
    assert got == [msgspec.to_builtins(r) for r in expected]
    # and the final signals equal a full recomputation of each series
    for symbol in table.symbol_names:
        mine = [r["signal"] for r in got if r["symbol"] == symbol]
        assert [r["bar_index"] for r in got if r["symbol"] == symbol] == list(range(N_BARS))
        full = compute(table.closes[table.symbols == symbol], ATCParams())["signal"]
        np.testing.assert_array_equal(np.array(mine, dtype=float), full)
    print(f"crash test: {len(kills)} killed runs {kills}, {elapsed:.1f} s")


def test_resume_without_any_snapshot_replays_from_the_start(redis_url, tmp_path):  # noqa: F811
    """Killed before the first snapshot: --resume finds none, rewinds the group to 0 and
    the output mark keeps what was already written from being written again."""
    import redis

    client = redis.Redis.from_url(redis_url)
    table = random_walk_table(3, 60, seed=9)
    push_bars(client, table)
    env = dict(os.environ, ATC_STREAM_FAULT="after_output:2")
    cmd = command(redis_url, tmp_path / "snaps", resume=False)
    cmd[cmd.index("--snapshot-every") + 1] = "100000"
    first = subprocess.run(cmd, env=env, capture_output=True, timeout=120)
    assert first.returncode == -signal.SIGKILL
    assert client.xlen(OUTPUT) == 80  # two batches of 40 written, then killed
    assert not list((tmp_path / "snaps").glob("*.atcsnap"))
    cmd = command(redis_url, tmp_path / "snaps", resume=True, idle=0.5)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "+80 suppressed replays" in done.stderr
    outputs = read_outputs(client, OUTPUT)
    assert [o["record"]["bar_index"] for o in outputs if o["record"]["symbol"] == "SYM000"] == (
        list(range(60))
    )
    assert len(outputs) == 180
