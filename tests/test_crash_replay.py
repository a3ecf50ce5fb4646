"""Lossless resume of ``atc-stream replay`` across SIGKILLs.

A bar file is replayed with snapshots into a JSONL file, a CSV file and a Parquet
directory. The process is killed with SIGKILL at random moments (and once while a
snapshot is being written) and restarted with ``--resume`` into the same output each
time; at the end the output must equal an uninterrupted run's, row for row: every
(symbol, params_id, time) exactly once, in the same order, with the same values.

Kill points: 20 random ones each for JSONL and Parquet, 8 for CSV, plus 2 per format while
a snapshot file is being written. A fresh process would pay the numba compilation each
time (~20 s here), so ``tests/crash_driver.py`` compiles once and forks one child per
attempt that runs the real CLI; the parent SIGKILLs it. About a minute in all on a busy
2-core machine.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from atc_stream.connectors.replay.player import random_walk_table
from atc_stream.state.snapshot_stores import DirectorySnapshotStore

pytestmark = pytest.mark.timeout(600)

ATC = [sys.executable, "-m", "atc_stream"]
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


KILLS = {".jsonl": 20, ".parquet": 20, ".csv": 8}


@pytest.fixture(scope="module")
def crash_runs(bars, tmp_path_factory):
    """One driver process (one numba compilation) kills and resumes a replay into each
    output format; returns per suffix (reference path, output path, attempt statuses)."""
    root = tmp_path_factory.mktemp("crash")
    specs = [
        {
            "args": ["replay", str(bars), "--warmup", "50", "--no-progress", "--backend", "cpu"],
            "reference": str(root / f"full{suffix}"),
            "out": str(root / f"out{suffix}"),
            "snaps": str(root / f"snaps{suffix}"),
            "kills": kills,
            "snapshot_kills": 2,
            "seed": len(suffix),
        }
        for suffix, kills in KILLS.items()
    ]
    (root / "specs.json").write_text(json.dumps(specs))
    driver = Path(__file__).with_name("crash_driver.py")
    done = subprocess.run(
        [sys.executable, str(driver), str(root / "specs.json")],
        capture_output=True, text=True, timeout=500,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    by_out = {r["out"]: r["statuses"] for r in reports}
    return {
        Path(s["out"]).suffix: (Path(s["reference"]), Path(s["out"]), by_out[s["out"]])
        for s in specs
    }


@pytest.mark.parametrize("suffix", list(KILLS), ids=[s[1:] for s in KILLS])
def test_sigkill_then_resume_gives_the_uninterrupted_output(crash_runs, suffix):
    reference, out, statuses = crash_runs[suffix]
    killed = [s for s in statuses if s[1] == -signal.SIGKILL]
    assert all(code in (0, -signal.SIGKILL) for _, code in statuses), statuses
    assert statuses[-1] == ["finish", 0]
    assert len(killed) >= KILLS[suffix] // 2, statuses  # most kills landed mid-run
    assert any(how == "snapshot" for how, _ in killed), statuses
    expected = read_rows(reference)
    got = read_rows(out)
    assert len(got) == len(expected)
    assert got == expected


def cli(args):
    """Run ``atc-stream`` in this process (the kernels compile once per test session)."""
    from typer.testing import CliRunner

    from atc_stream.app.cli import app

    return CliRunner().invoke(app, args)


def test_resume_skips_by_time_not_by_row_count(bars, tmp_path):
    """Resumed from a mid-run snapshot on an input whose first 100 rows were cut away:
    no bar is skipped (a row count would skip 100 more) and none is written twice."""
    out, snaps = tmp_path / "out.jsonl", tmp_path / "snaps"
    first = cli(replay_args(bars, out, snaps)[len(ATC) :])
    assert first.exit_code == 0, first.output
    rows = [json.loads(line) for line in open(out)]
    store = DirectorySnapshotStore(snaps)
    size = out.stat().st_size
    # back to a mid-run snapshot, as if killed there; how many were taken depends on
    # timing (the snapshotter skips one while the previous is still being written)
    while True:
        position = store.latest().header.source_offsets["file"]["output"]["bytes"]
        if position < size or len(store.list()) == 1:
            break
        store.delete(store.list()[-1])
    assert 0 < position < size
    lines = open(bars).read().splitlines()
    trimmed = tmp_path / "trimmed.csv"
    trimmed.write_text("\n".join([lines[0], *lines[101:]]) + "\n")
    again = cli([*replay_args(trimmed, out, snaps)[len(ATC) :], "--resume"])
    assert again.exit_code == 0, again.output
    assert [json.loads(line) for line in open(out)] == rows


def test_resume_refuses_other_params_interval_or_columns(bars, tmp_path):
    out, snaps = tmp_path / "out.jsonl", tmp_path / "snaps"
    first = cli(replay_args(bars, out, snaps)[len(ATC) :])
    assert first.exit_code == 0, first.output
    size = out.stat().st_size
    params = tmp_path / "p.json"
    params.write_text(json.dumps({"ema_len": 20}))
    for extra, needle in [
        (["--params", str(params)], "--params differ"),
        (["--interval", "5m"], "--interval"),  # differs from the bars and the snapshot
        (["--close-column", "time"], "input columns"),
    ]:
        res = cli([*replay_args(bars, out, snaps)[len(ATC) :], "--resume", *extra])
        assert res.exit_code == 2, res.output
        assert needle in res.output
        assert res.output.strip().splitlines()[-1].startswith("atc-stream: error:")
        assert res.exception is None or isinstance(res.exception, SystemExit)
        assert out.stat().st_size == size  # the output is left alone


def test_run_stream_refuses_to_overwrite_existing_snapshots(tmp_path):
    from atc_stream import ATCParams, Engine

    snaps = tmp_path / "snaps"
    store = DirectorySnapshotStore(snaps)
    store.save(Engine(ATCParams(), backend="cpu", outputs="all").snapshot())
    res = cli(["run-stream", "--redis", "redis://127.0.0.1:1", "--input-stream", "in",
               "--output-stream", "out", "--snapshot-dir", str(snaps)])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "already holds snapshots" in res.output and "--resume" in res.output
    assert len(store.list()) == 1


def test_all_snapshots_damaged_is_one_line_and_exit_2(bars, tmp_path):
    out, snaps = tmp_path / "out.jsonl", tmp_path / "snaps"
    first = cli(replay_args(bars, out, snaps)[len(ATC) :])
    assert first.exit_code == 0, first.output
    for path in snaps.glob("*.atcsnap"):
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    res = cli([*replay_args(bars, out, snaps)[len(ATC) :], "--resume"])
    assert res.exit_code == 2, res.output
    last = res.output.strip().splitlines()[-1]
    assert last.startswith("atc-stream: error: no snapshot in") and "to start fresh" in last
    assert res.exception is None or isinstance(res.exception, SystemExit)
