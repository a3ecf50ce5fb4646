"""Crash driver for tests/test_crash_replay.py: SIGKILL ``atc-stream replay`` many times.

Run as ``python tests/crash_driver.py SPECS.json`` (a JSON list of specs). Starting
a fresh ``atc-stream`` process costs the numba compilation (~20 s on a busy 2-core
machine), so 20 kills as fresh processes would take minutes. This driver compiles once
(an uninterrupted reference replay, in this process), then **forks** one child per
attempt: the child runs the real
CLI (``app(args)``) with the compiled kernels already in memory and the parent kills it
with SIGKILL -- once its output has grown past a random point (plus a random few
milliseconds), or as soon as a snapshot file is being written -- and forks the next one
with ``--resume``. Numba's ``workqueue`` threading layer is used
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
import select
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
    """Bytes of an output file, or of every file in an output directory. The writer runs
    meanwhile: a part it renames or removes between the listing and its ``stat`` counts 0."""

    def size(file: Path) -> int:
        try:
            return file.stat().st_size if file.is_file() else 0
        except FileNotFoundError:
            return 0

    try:
        if path.is_dir():
            return sum(size(file) for file in path.iterdir())
    except FileNotFoundError:  # the directory itself went between the check and the listing
        return 0
    return size(path)


def main() -> None:
    """Run every spec of the JSON list in SPEC.json; one JSON line of results per spec."""
    for spec in json.loads(Path(sys.argv[1]).read_text()):
        run_spec(spec)


#: Longest an attempt may run before it counts as hung (killed, reported as "timeout").
ATTEMPT_SECONDS = 120.0


def run_spec(spec: dict) -> None:
    from atc_stream.app.cli import app

    rng = random.Random(spec["seed"])
    started = time.perf_counter()
    try:  # the uninterrupted reference run (and the one numba compilation)
        app([*spec["args"], "-o", spec["reference"]], standalone_mode=False)
    except SystemExit as exc:
        assert not exc.code, exc.code
    full_seconds = time.perf_counter() - started
    snaps, out = Path(spec["snaps"]), Path(spec["out"])
    every = ["--snapshot-every", str(spec.get("snapshot_every", 150))]
    base = [*spec["args"], "-o", spec["out"], "--snapshot-dir", str(snaps), *every]
    full_size = output_size(Path(spec["reference"]))

    statuses = []
    plan = ["snapshot"] * spec["snapshot_kills"] + ["random"] * spec["kills"]
    rng.shuffle(plan)
    for attempt, how in enumerate([*plan, "finish"]):
        args = base + (["--resume"] if attempt else [])
        # kill points follow the run's progress, not the clock: a random share of the
        # output still to write (a resumed run first cuts the output back, then passes it)
        before = output_size(out)
        target = before + rng.uniform(0.0, 0.9) * (full_size - before)
        pid = os.fork()
        if pid == 0:
            run_child(args)
        deadline = time.monotonic() + ATTEMPT_SECONDS
        code = None
        if how == "random":
            code = poll_until(pid, lambda t=target: output_size(out) >= t, deadline, 0.001)
            if code is None:
                time.sleep(rng.uniform(0.0, 0.005))  # a random instant after that point
        elif how == "snapshot":
            code = poll_until(pid, lambda: writing_snapshot(snaps), deadline, 0.0002)
        if code is None and how != "finish":
            kill(pid)
        if code is None:
            code = wait_exit(pid, deadline)
        statuses.append([how, code])
    print(json.dumps({"out": spec["out"], "statuses": statuses, "full": full_seconds}))


def poll(pid: int) -> int | None:
    """The exit status of child ``pid`` (minus the signal that killed it), None if alive."""
    done, status = os.waitpid(pid, os.WNOHANG)
    if done == 0:
        return None
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def poll_until(pid: int, condition, deadline: float, every: float) -> int | None:
    """Check ``condition`` every ``every`` s until it holds (None), the child ends (its
    status) or ``deadline`` (``time.monotonic``) passes (None)."""
    while not condition():
        code = poll(pid)
        if code is not None:
            return code
        if time.monotonic() > deadline:
            return None
        time.sleep(every)
    return None


def wait_exit(pid: int, deadline: float) -> int | str:
    """Wait for child ``pid`` to end (woken by its pidfd, no polling) and return its
    status; a child still running at ``deadline`` is killed and reported as "timeout"."""
    fd = os.pidfd_open(pid)
    try:
        ended, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0.0))
    finally:
        os.close(fd)
    if not ended:
        kill(pid)
        os.waitpid(pid, 0)
        return "timeout"
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    main()
