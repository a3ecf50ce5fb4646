"""The scripts in examples/ run as a user would run them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from redis_fixtures import redis_server, redis_url  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def run_example(name: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    return done.stdout


def test_backtest_csv(tmp_path):
    chart = tmp_path / "chart.png"
    out = run_example("backtest_csv.py", "--plot", str(chart))
    assert "bars             1000" in out
    closed = next(line for line in out.splitlines() if line.startswith("trades"))
    assert int(closed.split()[1]) > 0
    assert "strategy return" in out and chart.stat().st_size > 10_000


def test_parameter_sweep():
    out = run_example("parameter_sweep.py")
    assert "12 parameter sets x 1000 bars = 12000 signal rows" in out
    lines = out.splitlines()
    assert lines[1].split()[:2] == ["params_id", "length"] and len(lines) == 2 + 12


@pytest.mark.redis
def test_live_to_redis(redis_url):  # noqa: F811
    out = run_example("live_to_redis.py", "--redis", redis_url, "--bars", "40")
    published = next(line for line in out.splitlines() if line.startswith("published"))
    received = next(line for line in out.splitlines() if line.startswith("received"))
    assert published.split()[1:3] == ["120", "signal"]
    assert published.split()[1] == received.split()[1]
    assert published.split()[4] == received.split()[4]  # events
