"""Exactly-once Redis Streams processing across SIGKILLs, with a real redis-server.

20 symbols x 300 bars go into an input stream; ``atc-stream run-stream`` is killed with
SIGKILL 25 times and restarted with ``--resume`` each time: at 20 random instants (from
outside, after a random number of output rows plus a random few milliseconds), once
while a snapshot file is being written, and at each injected point inside the batch
loop (``ATC_STREAM_FAULT``: after the read, after the step, after the outputs were
written, after a snapshot became durable). ``tests/crash_driver_streams.py`` loads the
kernels once and forks one child per run (the real CLI), so each kill costs a fraction
of a second rather than a fresh process's start-up. At the end the output stream must
hold every (stream, bar) exactly once, equal to an uninterrupted engine run: no bar
lost, none applied twice, no duplicate output (the design writes none; see
``atc_stream/connectors/redis/streams.py``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from redis_fixtures import redis_server, redis_url  # noqa: F401

from atc_stream import ATCParams, Engine, compute
from atc_stream.connectors.redis.lease import LEASE_TTL_S, stream_lease_key
from atc_stream.connectors.redis.stream_output import read_outputs
from atc_stream.connectors.replay.player import random_walk_table
from atc_stream.core.messages import records_from_result

pytestmark = [pytest.mark.redis, pytest.mark.timeout(420)]

N_SYMBOLS, N_BARS = 20, 300
RANDOM_KILLS = 20
INPUT, OUTPUT = "bars:in", "signals:out"


def push_bars(client, table) -> None:
    """The bars as input entries; every other time as RFC 3339 text (same instant)."""
    pipe = client.pipeline(transaction=False)
    for i, (s, t, c) in enumerate(
        zip(table.symbols.tolist(), table.times.tolist(), table.closes.tolist(), strict=True)
    ):
        when = t if i % 2 else str(np.datetime64(t, "ms")) + "Z"
        pipe.xadd(INPUT, {"symbol": s, "time": when, "close": repr(c)})
    pipe.execute()


def command(url, snapshot_dir, *, resume=False, idle=None):
    cmd = [
        sys.executable, "-m", "atc_stream", "run-stream",
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
    total = N_SYMBOLS * N_BARS
    started = time.monotonic()
    # 20 kills at random instants (after a random number of output rows, plus a random few
    # ms), one while a snapshot file is being written, and one at each injected point of
    # the batch loop; in a random order, each run resuming from the previous one's
    plan = [["random", rng.randint(5, 150)] for _ in range(RANDOM_KILLS)]
    plan += [["snapshot", rng.randint(1, 2)]]
    plan += [[f"fault:{point}", rng.randint(3, 12)]
             for point in ("after_output", "after_step", "after_read")]  # fmt: skip
    plan += [["fault:after_snapshot", rng.randint(1, 3)]]
    rng.shuffle(plan)
    spec = {
        "url": redis_url, "args": command(redis_url, snapshots)[3:], "snaps": str(snapshots),
        "output": OUTPUT, "total": total, "plan": plan, "seed": 7,
    }  # fmt: skip
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    driver = Path(__file__).with_name("crash_driver_streams.py")
    done = subprocess.run(
        [sys.executable, str(driver), str(tmp_path / "spec.json")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    kills = json.loads(done.stdout.strip().splitlines()[-1])
    elapsed = time.monotonic() - started
    assert kills[-1][0] == "finish" and kills[-1][2] == 0, kills
    killed = [k for k in kills if k[2] == -signal.SIGKILL]
    assert len(killed) == len(plan), kills  # every planned kill hit a running process
    assert sum(1 for k in killed if k[0] == "random" and k[3] < total) >= 3 * RANDOM_KILLS // 4

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
    print(f"crash test: {len(killed)} kills, runs {kills}, {elapsed:.1f} s")


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
    # the killed process's lease on the input holds a restart back until it expires
    lease = stream_lease_key(INPUT, cmd[cmd.index("--group") + 1])
    deadline = time.monotonic() + LEASE_TTL_S + 2
    while client.exists(lease):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    cmd = command(redis_url, tmp_path / "snaps", resume=True, idle=0.5)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "+80 suppressed replays" in done.stderr
    outputs = read_outputs(client, OUTPUT)
    assert [o["record"]["bar_index"] for o in outputs if o["record"]["symbol"] == "SYM000"] == (
        list(range(60))
    )
    assert len(outputs) == 180
