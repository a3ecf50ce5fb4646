"""``Engine.request_outputs``: only the asked-for output groups, the rest NaN (CPU path).

The CUDA side (only those columns copied back from the device) is checked against the
CPU under the simulator in ``test_cuda_sim.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from atc_stream.engine import Engine
from atc_stream.kernels import batch
from atc_stream.params import ATCParams
from atc_stream.state import layout as L

T0, BAR = 1_700_000_000_000, 60_000


def test_requested_outputs_are_a_nan_masked_copy_of_all_outputs():
    rng = np.random.default_rng(5)
    closes = np.round(100 * np.exp(np.cumsum(rng.normal(0, 0.01, (2, 80)), 1)), 2)
    t = T0 + BAR * np.arange(80, dtype=np.int64)
    full, subset = Engine(ATCParams(), backend="cpu"), Engine(ATCParams(), backend="cpu")
    for eng in (full, subset):
        eng.warmup({"A": (t[:70], closes[0, :70]), "B": (t[:70], closes[1, :70])})
    subset.request_outputs("layers", "growth")
    cols = batch.output_columns(["layers", "growth"])
    assert L.OUT_BAR_INDEX in cols and L.OUT_SIGNAL not in cols
    for j in range(70, 80):
        bars = [("A", int(t[j]), float(closes[0, j])), ("B", int(t[j]), float(closes[1, j]))]
        a, b = full.step(bars).outputs, subset.step(bars).outputs
        np.testing.assert_array_equal(b[:, cols], a[:, cols])
        others = np.setdiff1d(np.arange(L.N_OUT), cols)
        assert np.isnan(b[:, others]).all()
    assert batch.output_columns(list(batch.OUTPUT_GROUPS)) is None  # everything: no mask
    with pytest.raises(ValueError, match="outputs must be among"):
        subset.request_outputs("signals")
