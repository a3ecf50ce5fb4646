"""``atc-stream compile`` and the global ``--threads`` option, run as real processes."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from atc_stream import compute


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "atc_stream.cli", *args], capture_output=True, text=True,
        timeout=600, env=env,
    )  # fmt: skip


def test_compile_command_fills_the_cache_and_says_so():
    done = _cli("compile")
    assert done.returncode == 0, done.stderr
    assert "kernels in" in done.stderr and "cache:" in done.stderr
    again = _cli("compile")
    assert again.returncode == 0 and "loaded compiled kernels" in again.stderr


def test_threads_option_gives_the_same_rows(tmp_path):
    rng = np.random.default_rng(5)
    closes = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, 200)))
    path = tmp_path / "bars.csv"
    path.write_text(
        "symbol,time,close\n" + "".join(f"A,{t},{float(c)!r}\n" for t, c in enumerate(closes))
    )
    rows = {}
    for threads in ("1", "2"):
        done = _cli("--threads", threads, "replay", str(path), "--backend", "cpu")
        assert done.returncode == 0, done.stderr
        rows[threads] = [json.loads(line) for line in done.stdout.splitlines()]
    assert rows["1"] == rows["2"]
    expected = compute(closes)["Average_Signal"]
    got = np.array([r["signal"] for r in rows["1"]], dtype=float)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9, equal_nan=True)


def test_bad_threads_value_is_a_usage_error():
    done = _cli("--threads", "-2", "compile")
    assert done.returncode == 2 and "Traceback" not in done.stderr
