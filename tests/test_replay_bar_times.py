"""A replay's calls of many bar times (``engine.bar_times.step_bar_times``) give what one
``step_arrays`` a bar time gives: the same rows, bits, rejections, summary and state,
on tables with bad rows, duplicates, gaps, late symbols and several parameter sets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atc_stream import ATCParams, Engine
from atc_stream.connectors.replay import player as player_module
from atc_stream.connectors.replay.player import BarPlayer
from atc_stream.core.timetext import MAX_TIME_MS
from atc_stream.engine.bar_times import step_bar_times
from atc_stream.io.readers import BarTable

MINUTE = 60_000
T0 = 1_700_000_040_000


def hostile_table(seed: int, n_symbols: int, n_bars: int) -> BarTable:
    """Time-major bars of random walks with every kind of row the engine rejects or
    must keep apart: gaps, late starts, repeated bars (same and other close), closes
    that are 0, negative, NaN or inf, and a time beyond the last one allowed."""
    rng = np.random.default_rng(seed)
    symbols, times, closes = [], [], []
    for k in range(n_symbols):
        start = int(rng.integers(0, n_bars // 3 + 1)) if k % 2 else 0
        steps = np.arange(start, n_bars)
        steps = steps[rng.random(steps.shape[0]) > 0.1]  # gaps
        walk = np.round(100 * np.exp(np.cumsum(rng.normal(0, 0.01, steps.shape[0]))), 2)
        symbols += [f"S{k}"] * steps.shape[0]
        times += (T0 + MINUTE * steps).tolist()
        closes += walk.tolist()
    symbols = np.array(symbols + ["S0"], object)
    times = np.array(times + [MAX_TIME_MS + 1], np.int64)  # out of range, the last row
    closes = np.array(closes + [5.0])
    extra = rng.choice(len(times), size=len(times) // 15 + 1)
    bad = rng.choice(np.array([0.0, -1.5, np.nan, np.inf, -1.0]), size=extra.shape[0])
    keep_close = bad == -1.0  # a repeat with its twin's close
    symbols = np.concatenate([symbols, symbols[extra]])
    times = np.concatenate([times, times[extra]])
    closes = np.concatenate([closes, np.where(keep_close, closes[extra], bad)])
    hit = rng.choice(len(closes), size=len(closes) // 20)
    closes[hit] = rng.choice([0.0, np.nan, -2.0], size=hit.shape[0])
    order = np.argsort(times, kind="stable")  # replay plays rows by time, stable
    return BarTable(symbols[order], times[order], closes[order])


def play(table: BarTable, warmup: int, batch_rows: int):
    if warmup:  # (a warmup history is checked whole: one time out of range is refused)
        keep = table.times <= MAX_TIME_MS
        table = BarTable(table.symbols[keep], table.times[keep], table.closes[keep])
    engine = Engine([ATCParams(), ATCParams(cutout=3, long_threshold=0.2)], backend="cpu")
    results = []
    player = BarPlayer(
        engine, table, warmup_bars=warmup, on_result=results.append, batch_rows=batch_rows
    )
    summary = player.run()
    rows = [row for r in results for row in zip(*r.column_values(), strict=True)]
    return rows, summary, engine


def assert_same_state(a: Engine, b: Engine) -> None:
    one, other = a.capture_snapshot(), b.capture_snapshot()
    assert one.arrays.keys() == other.arrays.keys()
    for name, values in one.arrays.items():
        assert np.array_equal(values, other.arrays[name], equal_nan=True), name
    assert one.registry == other.registry and one.rejections == other.rejections


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    n_symbols=st.integers(1, 6),
    n_bars=st.integers(1, 90),
    warmup=st.sampled_from([0, 3, 40]),
    batch_rows=st.sampled_from([1, 2, 7, 64, 65_536]),
    cells=st.sampled_from([1, 5, 40, 1 << 20]),
)
def test_many_bar_times_a_call_equal_one_a_call(seed, n_symbols, n_bars, warmup, batch_rows, cells):
    table = hostile_table(seed, n_symbols, n_bars)
    want, want_summary, want_engine = play(table, warmup, 0)
    old_cells = player_module.MAX_CALL_CELLS
    player_module.MAX_CALL_CELLS = cells  # small: calls cut down to fit
    try:
        got, summary, engine = play(table, warmup, batch_rows)
    finally:
        player_module.MAX_CALL_CELLS = old_cells
    assert got == want  # (column_values: NaN is None)

    def float_bits(rows) -> bytes:
        return np.array([v for row in rows for v in row if isinstance(v, float)]).tobytes()

    assert float_bits(got) == float_bits(want)  # to the bit, -0.0 apart from 0.0 too
    assert summary.rows_out == want_summary.rows_out
    assert (summary.long_events, summary.short_events, summary.unready_events) == (
        want_summary.long_events, want_summary.short_events, want_summary.unready_events,
    )  # fmt: skip
    assert summary.rejected == want_summary.rejected
    assert summary.engine_rows.counts == want_summary.engine_rows.counts
    assert summary.engine_rows.examples == want_summary.engine_rows.examples
    assert_same_state(engine, want_engine)


def test_calls_hold_whole_bar_times_within_the_row_and_cell_bounds(monkeypatch):
    times = np.repeat(np.arange(10), [3, 1, 4, 1, 1, 5, 2, 2, 1, 3])
    codes = np.arange(times.shape[0]) % 4
    bounds = np.flatnonzero(np.diff(times)) + 1
    starts, ends = np.r_[0, bounds], np.r_[bounds, times.shape[0]]
    calls = list(zip(*player_module._calls(starts, ends, codes, 2, 8), strict=True))
    assert calls[0][0] == 0 and calls[-1][1] == times.shape[0]
    for (_, b), (c, _) in zip(calls, calls[1:], strict=False):
        assert b == c
    for a, b in calls:
        assert a in starts and b in ends  # whole bar times
        assert 2 * (b - a) <= 8 or np.unique(times[a:b]).shape[0] == 1  # rows x fan
    monkeypatch.setattr(player_module, "MAX_CALL_CELLS", 3)
    for a, b in zip(*player_module._calls(starts, ends, codes, 2, 1000), strict=True):
        bar_times = np.unique(times[a:b]).shape[0]
        assert bar_times == 1 or np.unique(codes[a:b]).shape[0] * 2 * bar_times <= 3


def test_step_bar_times_continues_warm_streams_and_refuses_what_it_cannot_do():
    table = hostile_table(7, 3, 60)
    engines = [Engine([ATCParams()], backend="cpu") for _ in range(2)]
    for engine in engines:
        engine.warmup({"S0": ([T0 - 5 * MINUTE, T0 - MINUTE], [99.0, 100.0])})
        engine.add_symbols(["S1", "S2"])
    slots = np.concatenate([engines[0].slots_of(s) for s in table.symbols])
    inputs = np.arange(slots.shape[0])
    got = step_bar_times(engines[0], slots, table.times, table.closes, inputs)
    want_rows, want_rejected = [], []
    for t in np.unique(table.times):
        rows = np.flatnonzero(table.times == t)
        r = engines[1].step_arrays(slots[rows], table.times[rows], table.closes[rows], rows)
        want_rows += list(zip(*r.column_values(), strict=True))
        want_rejected += r.rejected
    assert list(zip(*got.column_values(), strict=True)) == want_rows
    assert got.rejected == want_rejected and len(want_rejected) > 0
    assert_same_state(*engines)
    with pytest.raises(ValueError, match="time order"):
        step_bar_times(engines[0], slots[::-1], table.times[::-1], table.closes[::-1], inputs)
