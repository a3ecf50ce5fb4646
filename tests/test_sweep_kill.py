"""``atc-stream sweep`` killed (SIGKILL) while it writes OUTDIR over an earlier sweep's
tables: no table is torn, the set is not marked complete, and the next sweep leaves one
run's complete set and nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_sweep import GRID, ohlc_frame, run_cli

from atc_stream.app.jobs.sweep_output import MARKER, TABLES

ROOT = Path(__file__).resolve().parent.parent
#: Killed just before its rename number N (0-based) into OUTDIR: the first table, one in
#: the middle, the marker (renames: the five tables in TABLES order, then the marker).
KILL_BEFORE = (0, 2, 5)
# the sweep's own SIGKILL at a chosen rename: an audit hook runs before each os.replace
KILLED_SWEEP = textwrap.dedent("""
    import os, signal, sys
    from atc_stream.app.cli import main
    outdir, at = os.path.abspath(sys.argv[1]), int(sys.argv[2])
    seen = []
    def kill_at_rename(event, args):
        if event == "os.rename" and os.path.abspath(os.fsdecode(args[1])).startswith(outdir):
            seen.append(args[1])
            if len(seen) > at:
                os.kill(os.getpid(), signal.SIGKILL)
    sys.addaudithook(kill_at_rename)
    main(["sweep", *sys.argv[3:], "-o", outdir, "--no-progress", "--backend", "cpu"])
""")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweep_kill")
    data = folder / "bars.parquet"
    pq.write_table(ohlc_frame(bars=200), data)
    first = folder / "first.toml"
    first.write_text("[strategy]\nstop = [0.0, 0.03]\n")
    second = folder / "second.toml"
    second.write_text(GRID)
    return data, first, second


def sweep(capsys, data, grid, outdir) -> None:
    args = ["sweep", str(data), "--grid", str(grid), "-o", str(outdir), "--no-progress"]
    code, _, stderr = run_cli(capsys, [*args, "--backend", "cpu"])
    assert code == 0, stderr


@pytest.mark.parametrize("at", KILL_BEFORE)
def test_a_sweep_killed_while_writing_leaves_no_torn_table_and_a_rerun_is_whole(
    capsys, tmp_path, files, at
):
    data, first, second = files
    sweep(capsys, data, second, tmp_path / "clean")
    out = tmp_path / "out"
    sweep(capsys, data, first, out)
    assert (out / MARKER).is_file()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", KILLED_SWEEP, str(out), str(at), str(data), "--grid", str(second)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert not (out / MARKER).exists()
    for name in TABLES:  # the earlier run's or the killed run's, each one whole
        pq.read_table(out / f"{name}.parquet")
    sweep(capsys, data, second, out)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [MARKER, *(f"{name}.parquet" for name in TABLES)]
    )
    for name in TABLES:
        mine = pq.read_table(out / f"{name}.parquet")
        assert mine.equals(pq.read_table(tmp_path / "clean" / f"{name}.parquet")), name
