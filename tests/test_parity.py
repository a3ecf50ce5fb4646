"""Step, preview, warmup and compute equal the reference bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from golden_data import load_golden_cases
from hypothesis import given
from hypothesis import strategies as st
from parity_helpers import GOLDEN_NAMES, assert_bit_identical, ma_signals, reference_outputs
from series_strategies import atc_params, close_series

from atc_stream import ATCParams, Engine, compute
from atc_stream.core import output_row
from atc_stream.core.params import N_MAS
from atc_stream.core.reference import compute_reference
from atc_stream.state.arrays import values_of

GOLDEN = load_golden_cases()


def run_steps(closes: np.ndarray, params: ATCParams, warmup: int = 0):
    """Feed a series through an engine: ``warmup`` bars batched, the rest one step each.

    Returns (outputs of every bar, per-MA sig after every stepped bar).
    """
    engine = Engine(params, backend="cpu", outputs="all")
    engine.add_symbol("X")
    slot = engine.slot_of(engine.streams[0])
    times = np.arange(closes.shape[0], dtype=np.int64)
    rows, sigs = [], []
    if warmup:
        res = engine.warmup({"X": (times[:warmup], closes[:warmup])})
        assert len(res) == 1
    for t in range(warmup, closes.shape[0]):
        preview = engine.preview([("X", int(times[t]), float(closes[t]))])
        res = engine.step([("X", int(times[t]), float(closes[t]))])
        assert not res.rejected
        assert_bit_identical(preview.outputs, res.outputs, "preview vs step")
        rows.append(res.outputs[0])
        sigs.append(ma_signals(values_of(engine.store.values, [slot])[0]))
    return np.array(rows).reshape(-1, output_row.N_OUT), np.array(sigs).reshape(-1, N_MAS)


@pytest.mark.parametrize("case", GOLDEN, ids=[c[0] for c in GOLDEN])
def test_compute_matches_golden_and_reference(case):
    name, params, closes, expected = case
    got = compute(closes, params)
    ref = compute_reference(closes, params)
    schema_name = {golden: schema for schema, golden in GOLDEN_NAMES.items()}
    assert set(expected) - {"close"} <= set(schema_name), sorted(expected)
    np.testing.assert_array_equal(got["close"], closes)
    for column, values in expected.items():
        if column in ("bar_index", "close"):
            continue
        mine = got[schema_name[column]]
        assert np.allclose(mine, values, atol=1e-9, rtol=0, equal_nan=True), column
        assert_bit_identical(mine, ref[column], f"{name} {column}")
    np.testing.assert_array_equal(got["bar_index"], expected["bar_index"])


@pytest.mark.parametrize("case", GOLDEN, ids=[c[0] for c in GOLDEN])
def test_step_matches_reference_on_golden(case):
    name, params, closes, _ = case
    warm = len(closes) // 3
    rows, sigs = run_steps(closes, params, warmup=warm)
    ref = compute_reference(closes, params)
    assert_bit_identical(rows, reference_outputs(ref)[warm:], name)
    assert np.array_equal(sigs, ref["sig"][warm:]), "per-MA sig differs"


@given(closes=close_series(max_size=120), params=atc_params(), data=st.data())
def test_step_preview_warmup_match_reference(closes, params, data):
    warm = data.draw(st.integers(0, len(closes)))
    rows, sigs = run_steps(closes, params, warmup=warm)
    ref = compute_reference(closes, params)
    expected = reference_outputs(ref)
    assert_bit_identical(rows, expected[warm:], "step")
    assert np.array_equal(sigs, ref["sig"][warm:])
    assert_bit_identical(reference_outputs(compute(closes, params)), expected, "compute")


@given(closes=close_series(min_size=2, max_size=200), params=atc_params(), data=st.data())
def test_warmup_then_step_equals_longer_warmup(closes, params, data):
    split = data.draw(st.integers(1, len(closes) - 1))
    times = np.arange(len(closes), dtype=np.int64)
    a = Engine(params, backend="cpu", outputs="all")
    a.warmup({"X": (times[:split], closes[:split])})
    for t in range(split, len(closes)):
        a.step([("X", int(times[t]), float(closes[t]))])
    b = Engine(params, backend="cpu", outputs="all")
    b.warmup({"X": (times, closes)})
    c = Engine(params, backend="cpu", outputs="all")  # two warmups back to back
    c.warmup({"X": (times[:split], closes[:split])})
    c.warmup({"X": (times[split:], closes[split:])})
    for other in (b, c):
        assert_bit_identical(other.store.values, a.store.values, "values")
        assert np.array_equal(other.store.counters, a.store.counters)
        assert_bit_identical(other.store.ring, a.store.ring, "ring")


def test_warmup_batch_of_many_streams_equals_compute():
    rng = np.random.default_rng(3)
    params = [ATCParams(), ATCParams(robustness="Wide", cutout=30, ema_len=12, kama_len=9)]
    engine = Engine(params, backend="cpu", outputs="all")
    series = {}
    for i in range(12):
        n = int(rng.integers(1, 300))
        closes = np.round(50 + np.cumsum(rng.integers(-3, 4, n)) * 0.05, 2)
        series[f"S{i}"] = np.maximum(closes, 0.05)
    history = {s: (np.arange(len(c)), c) for s, c in series.items()}
    last = engine.warmup(history)
    assert len(last) == 24
    for key, row in zip(last.keys, last.outputs, strict=True):
        full = reference_outputs(compute(series[key.symbol], params[key.params_id]))
        assert_bit_identical(row, full[-1], str(key))


def test_several_bars_per_stream_in_one_batch_apply_in_order():
    rng = np.random.default_rng(5)
    closes = {s: np.round(100 + np.cumsum(rng.integers(-2, 3, 90)) * 0.1, 1) for s in "ABC"}
    engine = Engine(
        ATCParams(ema_len=10, hma_len=10, wma_len=10, dema_len=10, lsma_len=10, kama_len=10),
        outputs="all",
    )
    for s in "ABC":
        engine.add_symbol(s)
    got = {s: [] for s in "ABC"}
    for start in range(0, 90, 6):
        batch = [(s, t, float(closes[s][t])) for t in range(start, start + 6) for s in "CAB"]
        res = engine.step(batch)
        assert len(res) == 18 and not res.rejected
        for key, t, row in zip(res.keys, res.times, res.outputs, strict=True):
            got[key.symbol].append((t, row))
    for s in "ABC":
        times = [t for t, _ in got[s]]
        assert times == sorted(times)
        expected = reference_outputs(compute(closes[s], engine.param_sets[0]))
        assert_bit_identical(np.array([r for _, r in got[s]]), expected, s)
