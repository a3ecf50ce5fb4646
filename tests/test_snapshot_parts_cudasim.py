"""Streams moved between engines on the CUDA backend under numba's simulator: split parts
restored on CUDA, exported from and imported into CUDA engines, equal to one CPU engine
that never split. Own process::

    NUMBA_ENABLE_CUDASIM=1 .venv/bin/python -m pytest -q -m cudasim tests/
"""

from __future__ import annotations

import pytest
from cuda_targets import cuda_kernels_run
from parts_helpers import canonical, make_engine, play, walks

from atc_stream import Engine
from atc_stream.state.snapshot_parts import merge_snapshots, split_snapshot

pytestmark = [
    pytest.mark.cudasim,
    cuda_kernels_run,
]

SYMBOLS = ["A", "B", "C"]


@pytest.mark.parametrize("trading", [False, True])
def test_split_parts_on_cuda_equal_one_cpu_engine(trading):
    closes = walks(11, SYMBOLS, 16)
    whole = make_engine("cpu", trading, SYMBOLS, closes, 12)
    pieces = split_snapshot(whole.snapshot(), {"A": 0, "B": 1, "C": 0}.__getitem__, 2)
    engines = [Engine.restore(p, backend="cuda", outputs="all") for p in pieces]
    got = sorted(x for e in engines for x in canonical(play(e, closes, 12, 3, trading)))
    assert got == canonical(play(whole, closes, 12, 3, trading))
    merged = Engine.restore(merge_snapshots(e.snapshot() for e in engines), backend="cpu")
    merged.outputs = "all"
    assert canonical(play(merged, closes, 15, 1, trading)) == canonical(
        play(whole, closes, 15, 1, trading)
    )


@pytest.mark.parametrize("trading", [False, True])
def test_export_import_between_cuda_engines(trading):
    closes = walks(12, SYMBOLS, 16)
    whole = make_engine("cpu", trading, SYMBOLS, closes, 12)
    left = make_engine("cuda", trading, ["A"], closes, 12)
    right = make_engine("cuda", trading, ["B", "C"], closes, 12)
    left.import_streams(right.export_streams(["C"]))
    right.remove_symbol("C")
    got = canonical(play(left, closes, 12, 3, trading)) + canonical(
        play(right, closes, 12, 3, trading)
    )
    assert sorted(got) == canonical(play(whole, closes, 12, 3, trading))
