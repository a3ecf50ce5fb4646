"""The README's Python examples run as written, on data the test provides for the names
they leave to the reader (times, closes, a CSV file, frames of new bars)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)
T0 = 1_700_000_040_000
MINUTE = 60_000


def walk(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.round(64_000 + np.cumsum(rng.normal(0, 25, n)), 2)


def test_the_readme_has_python_examples():
    assert len(BLOCKS) >= 3


def test_api_example_then_snapshot_example_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    times = T0 + MINUTE * np.arange(400, dtype=np.int64)
    closes = walk(400, 1)
    names = {"times": times, "closes": closes, "next_time": int(times[-1]) + MINUTE}
    api = next(b for b in BLOCKS if "Engine(ATCParams(), backend=" in b)
    exec(compile(api, "README.md (Python API)", "exec"), names)
    assert names["res"].signal.shape == (1,)
    snapshots = next(b for b in BLOCKS if "eng.snapshot(" in b)
    exec(compile(snapshots, "README.md (snapshots)", "exec"), names)
    assert (tmp_path / "snaps").is_dir()
    eng, eng2 = names["eng"], names["eng2"]
    assert eng2.streams == eng.streams
    for key in eng.streams:
        before, after = eng.stream_state(key), eng2.stream_state(key)
        assert before.keys() == after.keys()
        for name in before:
            np.testing.assert_array_equal(np.asarray(after[name]), np.asarray(before[name]))


def test_pandas_example_runs(tmp_path, monkeypatch):
    pd = pytest.importorskip("pandas")
    monkeypatch.chdir(tmp_path)
    times = pd.date_range("2024-01-01", periods=300, freq="h", tz="UTC")
    pd.DataFrame({"time": times, "close": walk(300, 2)}).to_csv("btc_1h.csv", index=False)
    history = pd.DataFrame({"symbol": "ETHUSDT", "time": times, "close": walk(300, 3)})
    new_bars = pd.DataFrame(
        {"symbol": ["ETHUSDT"], "time": [times[-1] + pd.Timedelta(hours=1)], "close": [3000.0]}
    )
    names = {"bars_df": history, "new_bars_df": new_bars}
    example = next(b for b in BLOCKS if "pd.read_csv" in b)
    exec(compile(example, "README.md (pandas)", "exec"), names)
    assert len(names["frame"]) == 300
