"""``benchmarks/bench_cluster.py --quick`` runs to the end and prints its three tables, so
the cluster benchmark cannot rot (real redis-server and a local Ray; skipped without)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.redis, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[1]


def test_bench_cluster_quick_prints_every_table():
    if not (os.environ.get("ATC_REDIS_SERVER") or shutil.which("redis-server")):
        pytest.skip("no redis-server binary")
    paths = [str(REPO), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_cluster.py"), "--quick"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "20 symbols x 20 bars = 400 bars" in out
    for row in ("XADD pipelined, one stream (baseline)", "Router.send + flush, 2 shards",
                "StreamRouter", "one process (`RedisStreamRunner`)", "Router → 1 shard actor",
                "Router → 2 shard actors", "bar (symbol, time, close)", "output row"):  # fmt: skip
        assert f"| {row}" in out, (row, out)
