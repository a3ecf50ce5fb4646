"""Hypothesis strategies for close series and parameter sets that stress exact ties.

Prices live on a decimal grid (like real quotes), so closes often equal their moving
averages exactly; series mix random walks, flat stretches and spikes, and may be very
short. Parameter sets cover every robustness, cutout > 0, custom lengths and weights.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from atc_stream import ATCParams
from atc_stream.core.params import ROBUSTNESS_OFFSETS


@st.composite
def close_series(draw, min_size: int = 1, max_size: int = 160) -> np.ndarray:
    n = draw(st.integers(min_size, max_size))
    seed = draw(st.integers(0, 2**32 - 1))
    tick = draw(st.sampled_from([0.01, 0.05, 0.25, 1.0]))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["walk", "flat", "spiky", "oscillating"]))
    start = draw(st.sampled_from([1.0, 10.0, 100.0, 1234.5]))
    steps = rng.choice([-2, -1, 0, 0, 1, 2], size=n) * tick
    if kind == "flat":
        steps[rng.random(n) < 0.8] = 0.0
    elif kind == "spiky":
        spikes = rng.random(n) < 0.05
        steps[spikes] = rng.choice([-1, 1], spikes.sum()) * start * 0.2
    elif kind == "oscillating":
        steps = np.where(np.arange(n) % 2 == 0, tick, -tick)
    closes = np.maximum(start + np.cumsum(steps), tick)
    # snap to the grid so equal decimal prices are equal doubles
    return np.round(closes / tick) * tick


@st.composite
def atc_params(draw, max_len: int = 16) -> ATCParams:
    robustness = draw(st.sampled_from(sorted(ROBUSTNESS_OFFSETS)))
    widest = ROBUSTNESS_OFFSETS[robustness][-1]
    lengths = {
        f"{f}_len": draw(st.integers(widest + 1, widest + max_len))
        for f in ("ema", "hma", "wma", "dema", "lsma", "kama")
    }
    weights = {
        f"{f}_w": draw(st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0]))
        for f in ("ema", "hma", "wma", "dema", "lsma", "kama")
    }
    cut = draw(st.sampled_from([0.0, 0.25, 0.49, 0.75]))
    long_threshold = draw(st.sampled_from([0.0, 0.1, 0.3]))
    return ATCParams(
        robustness=robustness,
        cutout=draw(st.integers(0, 40)),
        La=draw(st.sampled_from([0.0, 0.02, 0.5, 3.0])),
        De=draw(st.sampled_from([0.0, 0.03, 1.0, 10.0])),
        cut=cut,
        long_threshold=long_threshold,
        short_threshold=-draw(st.sampled_from([0.0, 0.1, 0.3])) - 0.01,
        **lengths,
        **weights,
    )
