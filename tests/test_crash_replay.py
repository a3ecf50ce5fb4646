"""Lossless resume of ``atc-stream replay`` across SIGKILLs (issue 10).

A bar file is replayed with snapshots into a JSONL file, a CSV file and a Parquet
directory. The process is killed with SIGKILL at random moments (and once while a
snapshot is being written) and restarted with ``--resume`` into the same output each
time; at the end the output must equal an uninterrupted run's, row for row: every
(symbol, params_id, time) exactly once, in the same order, with the same values.

Kill points: 8 random ones for JSONL (each restart pays the numba load, ~2-4 s on a busy
2-core machine), 4 each for CSV and Parquet, plus one during a snapshot write. That keeps
the module near a minute while every crash window (mid-step, mid-output-write, between
the state copy and the snapshot's rename) is hit.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from atc_stream.replay.player import random_walk_table
from atc_stream.state.stores import DirectorySnapshotStore

pytestmark = pytest.mark.timeout(600)

ATC = [sys.executable, "-m", "atc_stream.cli"]
N_SYMBOLS, N_BARS = 8, 600


def write_csv(path, table) -> None:
    with open(path, "w") as f:
        f.write("symbol,time,close\n")
        for s, t, c in zip(table.symbols, table.times, table.closes, strict=True):
            f.write(f"{s},{t},{float(c)!r}\n")


@pytest.fixture(scope="module")
def bars(tmp_path_factory):
    path = tmp_path_factory.mktemp("bars") / "bars.csv"
    write_csv(path, random_walk_table(N_SYMBOLS, N_BARS, seed=11))
    return path


def replay_args(bars, out, snaps=None, *, speed=None):
    args = [*ATC, "replay", str(bars), "--warmup", "50", "--no-progress", "--backend", "cpu"]
    args += ["-o", str(out)]
    if snaps is not None:
        args += ["--snapshot-dir", str(snaps), "--snapshot-every", "150"]
    if speed is not None:
        args += ["--speed", str(speed)]
    return args


def read_rows(path):
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in open(path)]
    if path.suffix == ".csv":
        return open(path).read().splitlines()
    table = pq.read_table(path)
    table = table.set_column(
        table.schema.get_field_index("time"), "time", table.column("time").cast(pa.int64())
    )
    return table.to_pylist()


def run_killed_and_resumed(bars, out, snaps, rng, kills: int, during_snapshot: bool):
    """Replay into ``out``, SIGKILL it ``kills`` times at random moments (and once while a
    snapshot file is being written), resume each time; the last run goes to the end."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    outcomes = []
    for attempt in range(kills + 2):
        resume = attempt > 0
        # paced so that a run lasts a few seconds and can be killed part-way
        args = replay_args(bars, out, snaps, speed=12_000)
        if resume:
            args.append("--resume")
        last = attempt == kills + 1
        proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if not last:
            if during_snapshot and attempt == 1:
                # kill as soon as a temporary snapshot file shows up (a write in progress)
                deadline = time.monotonic() + 60
                while proc.poll() is None and time.monotonic() < deadline:
                    if any(p.name.startswith(".") for p in snaps.iterdir()):
                        break
                    time.sleep(0.0005)
            else:
                time.sleep(rng.uniform(1.5, 4.0))  # numba load + some replay
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
        outcomes.append(proc.returncode)
        if proc.returncode not in (0, -signal.SIGKILL):
            pytest.fail(f"run {attempt} exited with {proc.returncode}:\n{err.decode()}")
        if last:
            assert proc.returncode == 0, err.decode()
    return outcomes


@pytest.mark.parametrize(
    ("suffix", "kills"), [(".jsonl", 8), (".parquet", 4), (".csv", 4)], ids=["jsonl", "parquet", "csv"]
)
def test_sigkill_then_resume_gives_the_uninterrupted_output(bars, tmp_path, suffix, kills):
    full = tmp_path / f"full{suffix}"
    done = subprocess.run(replay_args(bars, full), capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    expected = read_rows(full)

    out, snaps = tmp_path / f"out{suffix}", tmp_path / "snaps"
    rng = random.Random(hash(suffix) % 1000)
    outcomes = run_killed_and_resumed(bars, out, snaps, rng, kills, during_snapshot=True)
    assert outcomes.count(-signal.SIGKILL) >= kills // 2, outcomes  # most kills landed
    got = read_rows(out)
    assert len(got) == len(expected)
    assert got == expected


def test_resume_skips_by_time_not_by_row_count(bars, tmp_path):
    """Resumed from a mid-run snapshot on an input whose first 100 rows were cut away:
    no bar is skipped (a row count would skip 100 more) and none is written twice."""
    out, snaps = tmp_path / "out.jsonl", tmp_path / "snaps"
    first = subprocess.run(replay_args(bars, out, snaps), capture_output=True, timeout=120)
    assert first.returncode == 0, first.stderr.decode()
    rows = [json.loads(line) for line in open(out)]
    store = DirectorySnapshotStore(snaps)
    for newer in store.list()[-2:]:  # back to an earlier snapshot, as if killed there
        store.delete(newer)
    assert 0 < store.latest().header.source_offsets["file"]["output"]["bytes"] < out.stat().st_size
    lines = open(bars).read().splitlines()
    trimmed = tmp_path / "trimmed.csv"
    trimmed.write_text("\n".join([lines[0], *lines[101:]]) + "\n")
    again = subprocess.run(
        [*replay_args(trimmed, out, snaps), "--resume"], capture_output=True, timeout=120
    )
    assert again.returncode == 0, again.stderr.decode()
    assert [json.loads(line) for line in open(out)] == rows


def test_resume_refuses_other_params_interval_or_columns(bars, tmp_path):
    out, snaps = tmp_path / "out.jsonl", tmp_path / "snaps"
    first = subprocess.run(replay_args(bars, out, snaps), capture_output=True, timeout=120)
    assert first.returncode == 0
    params = tmp_path / "p.json"
    params.write_text(json.dumps({"ema_len": 20}))
    for extra, needle in [
        (["--params", str(params)], "--params differ"),
        (["--interval", "5m"], "--interval '5m' differs"),
        (["--close-column", "time"], "input columns"),
    ]:
        res = subprocess.run(
            [*replay_args(bars, out, snaps), "--resume", *extra],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 2, res.stderr
        assert needle in res.stderr
        assert "Traceback" not in res.stderr
        assert res.stderr.strip().splitlines()[-1].startswith("atc-stream: error:")
