"""Loader for the golden test vectors (``tests/golden/*.csv`` + ``*.json``; see its README).

Each case is a CSV (``bar_index``, ``close`` and every output column per bar; ``na``
is written as an empty cell) with a JSON file of ``ATCParams`` fields beside it.
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

import numpy as np

from atc_stream.core.params import ATCParams

REPO_ROOT = Path(__file__).resolve().parent.parent
GOLDEN_DIR = Path(__file__).resolve().parent / "golden"

#: Columns holding integers (event flags and the bar counter).
INT_COLUMNS = frozenset({"bar_index", "long", "short"})


def golden_dir() -> Path:
    """The golden folder: ``$ATC_GOLDEN_DIR`` (to check new vectors elsewhere), else
    ``tests/golden`` of this repository."""
    env = os.environ.get("ATC_GOLDEN_DIR")
    return Path(env) if env else GOLDEN_DIR


def _parse_float(cell: str) -> float:
    cell = cell.strip()
    if cell == "" or cell.lower() == "nan":
        return math.nan
    return float(cell)


def load_case(csv_path: Path) -> tuple[str, ATCParams, np.ndarray, dict[str, np.ndarray]]:
    """One case: (name, params, closes, expected columns excluding ``close``)."""
    name = csv_path.stem
    with open(csv_path.with_suffix(".json"), encoding="utf-8") as fh:
        params = ATCParams.from_dict(json.load(fh))
    with open(csv_path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        rows = [row for row in reader if row]
    columns: dict[str, list[float]] = {h: [] for h in header}
    for lineno, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise ValueError(f"{csv_path}:{lineno}: {len(row)} cells, expected {len(header)}")
        for h, cell in zip(header, row, strict=True):
            columns[h].append(_parse_float(cell))
    expected: dict[str, np.ndarray] = {}
    for h, values in columns.items():
        if h in INT_COLUMNS:
            expected[h] = np.asarray(values, dtype=np.int64)
        else:
            expected[h] = np.asarray(values, dtype=np.float64)
    closes = expected.pop("close")
    return name, params, closes, expected


def load_golden_cases() -> list[tuple[str, ATCParams, np.ndarray, dict[str, np.ndarray]]]:
    """All golden cases, sorted by name: (name, ATCParams, closes, column -> ndarray)."""
    folder = golden_dir()
    return [load_case(p) for p in sorted(folder.glob("*.csv"))]
