"""Crash driver for tests/test_crash_resume.py: SIGKILL ``atc-stream run-stream`` many times.

Run as ``python tests/crash_driver_streams.py SPEC.json``. A fresh process pays the numba
kernel load or compilation (seconds to ~20 s on a busy 2-core machine), so two dozen
kills as fresh processes would take minutes. Like ``crash_driver.py``, this driver
loads the kernels once, then **forks** one child per attempt that runs the real CLI
(``app(["run-stream", ...])``); each child is killed with SIGKILL:

- ``random``: by the parent, once the output stream has grown by a random number of
  rows, after a random few milliseconds more -- at any instant of the batch loop;
- ``snapshot``: by itself, while a snapshot file is being written (its bytes written,
  not yet fsynced or renamed: ``os.fsync`` of a ``.tmp`` file in the snapshot directory
  is the trigger), at its n-th snapshot;
- ``fault``: by itself at an injected point of the batch loop
  (``ATC_STREAM_FAULT=point:n``, see ``connectors/redis/streams.py``);
- ``finish``: the last attempt, not killed, ends with ``--stop-when-idle``.

Every attempt after the first runs with ``--resume``. A killed child leaves the input's
lease in Redis until it expires (``connectors/redis/lease.py``); the driver saw it die,
so it deletes the lease, as an operator who knows the holder is gone may, rather than
wait out its ttl before each restart. The spec (JSON): ``url``, ``args``
(run-stream arguments without --resume), ``snaps``, ``output`` (stream key), ``total``
(rows expected), ``plan`` (list of ``[how, n]``), ``seed``. Prints one JSON line: each
attempt's ``[how, n, exit status, output rows after it]``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

os.environ["NUMBA_THREADING_LAYER"] = "workqueue"  # GNU OpenMP is not fork-safe

from crash_driver import kill, poll, wait_exit  # noqa: E402  (this script's folder)
from crash_driver import run_child as run_cli_child  # noqa: E402


def run_child(args: list[str], how: str, n: int, snaps: Path) -> None:
    """In a forked child: arm the kill, run the CLI, leave with its exit status."""
    if how.startswith("fault:"):
        os.environ["ATC_STREAM_FAULT"] = f"{how[len('fault:') :]}:{n}"
    elif how == "snapshot":
        _kill_at_snapshot_write(snaps, n)
    run_cli_child(args)


def _kill_at_snapshot_write(snaps: Path, nth: int) -> None:
    """SIGKILL this process when it fsyncs its ``nth`` snapshot temp file: the bytes are
    written, the file is neither durable nor renamed into place."""
    real_fsync = os.fsync
    seen = [0]
    root = str(snaps.resolve())

    def fsync(fd: int) -> None:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target.startswith(root) and target.endswith(".tmp"):
            seen[0] += 1
            if seen[0] >= nth:
                os.kill(os.getpid(), signal.SIGKILL)
        real_fsync(fd)

    os.fsync = fsync


def _lease_key(args: list[str]) -> str:
    """The lease that the run-stream ``args`` take: their input stream's, for their group."""
    from atc_stream.connectors.redis.lease import stream_lease_key

    def option(name: str, default: str) -> str:
        return args[args.index(name) + 1] if name in args else default

    return stream_lease_key(option("--input-stream", ""), option("--group", "atc"))


def main() -> None:
    import redis

    import atc_stream.app.cli  # noqa: F401  (imported once, not in every child)
    from atc_stream import Engine

    spec = json.loads(Path(sys.argv[1]).read_text())
    Engine.compile()  # the one kernel load
    client = redis.Redis.from_url(spec["url"])
    rng = random.Random(spec["seed"])
    snaps = Path(spec["snaps"])

    lease = _lease_key(spec["args"])

    def out_len() -> int:
        return client.xlen(spec["output"]) if client.exists(spec["output"]) else 0

    results = []
    plan = [*spec["plan"], ["finish", 0]]
    for attempt, (how, n) in enumerate(plan):
        args = list(spec["args"])
        if attempt:
            args.append("--resume")
        if how == "finish":
            args += ["--stop-when-idle", "1.0"]
        before = out_len()
        pid = os.fork()
        if pid == 0:
            run_child(args, how, n, snaps)
        deadline = time.monotonic() + 60
        code = None
        if how == "random":
            while out_len() < min(before + n, spec["total"]):
                code = poll(pid)
                if code is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.002)
            if code is None:
                time.sleep(rng.uniform(0, 0.01))  # a random instant after that point
                kill(pid)
        # the others kill themselves (or finish); a hung child is killed at the deadline
        if code is None:
            code = wait_exit(pid, deadline)
        if code in (-signal.SIGKILL, "timeout"):
            client.delete(lease)
        results.append([how, n, code, out_len()])
    print(json.dumps(results))


if __name__ == "__main__":
    main()
