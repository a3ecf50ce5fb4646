"""Crash driver for tests/test_crash_replay.py: SIGKILL ``atc-stream replay`` many times.

Run as ``python tests/crash_driver.py SPECS.json`` (a JSON list of specs). Starting
a fresh ``atc-stream`` process costs the numba compilation (~20 s on a busy 2-core
machine), so 20 kills as fresh processes would take minutes. This driver compiles once
(an uninterrupted reference replay, in this process), then **forks** one child per
attempt: the child runs the real
CLI (``app(args)``) with the compiled kernels already in memory and the parent kills it
with SIGKILL at a random moment -- or as soon as a snapshot file is being written -- and
forks the next one with ``--resume``. Numba's ``workqueue`` threading layer is used
because GNU OpenMP is not fork-safe.

The spec (JSON): ``args`` (replay arguments without -o/--resume), ``reference`` (output
path of the uninterrupted run), ``out`` (output path of the killed runs), ``snaps``
(snapshot dir), ``kills``, ``snapshot_kills`` (kills while a snapshot is written),
``seed``. Prints a JSON line: the exit status of every attempt.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

os.environ["NUMBA_THREADING_LAYER"] = "workqueue"


def run_child(args: list[str]) -> None:
    """In a forked child: run the CLI and leave with its exit status (never return)."""
    from atc_stream.app.cli import app

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    code = 0
    try:
        app(args, standalone_mode=False)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        code = 3
    os._exit(code if isinstance(code, int) else 1)


def writing_snapshot(snaps: Path) -> bool:
    try:
        return any(name.endswith(".tmp") for name in os.listdir(snaps))
    except FileNotFoundError:
        return False


def output_size(path: Path) -> int:
    """Bytes of an output file, or of every file in an output directory."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    return path.stat().st_size if path.exists() else 0


def main() -> None:
    """Run every spec of the JSON list in SPEC.json; one JSON line of results per spec."""
    for spec in json.loads(Path(sys.argv[1]).read_text()):
        run_spec(spec)


def run_spec(spec: dict) -> None:
    from atc_stream.app.cli import app

    rng = random.Random(spec["seed"])
    started = time.perf_counter()
    try:  # the uninterrupted reference run (and the one numba compilation)
        app([*spec["args"], "-o", spec["reference"]], standalone_mode=False)
    except SystemExit as exc:
        assert not exc.code, exc.code
    full_seconds = time.perf_counter() - started
    # duration of one run with snapshots, measured by a child that is not killed
    snaps = Path(spec["snaps"])
    every = ["--snapshot-every", str(spec.get("snapshot_every", 150))]
    base = [*spec["args"], "-o", spec["out"], "--snapshot-dir", str(snaps), *every]
    timing = Path(str(snaps) + "-timing")
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        out = str(timing / ("out" + Path(spec["out"]).suffix))
        run_child([*spec["args"], "-o", out, "--snapshot-dir", str(timing), *every])
    os.waitpid(pid, 0)
    run_seconds = max(time.perf_counter() - t0, 0.05)
    full_size = output_size(Path(spec["reference"]))

    statuses = []
    plan = ["snapshot"] * spec["snapshot_kills"] + ["random"] * spec["kills"]
    rng.shuffle(plan)
    for attempt, how in enumerate([*plan, "finish"]):
        args = base + (["--resume"] if attempt else [])
        pid = os.fork()
        if pid == 0:
            run_child(args)
        if how == "random":
            # a random moment of what is left to do (resumed runs have less to do)
            left = 1.0 - output_size(Path(spec["out"])) / full_size
            time.sleep(rng.uniform(0.0, run_seconds * max(left, 0.1)))
        elif how == "snapshot":
            deadline = time.perf_counter() + 2 * run_seconds
            while not writing_snapshot(snaps) and time.perf_counter() < deadline:
                time.sleep(0.0002)
        if how != "finish":
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        statuses.append([how, code])
    print(
        json.dumps(
            {
                "out": spec["out"],
                "statuses": statuses,
                "run_seconds": run_seconds,
                "full": full_seconds,
            }
        )
    )


if __name__ == "__main__":
    main()
