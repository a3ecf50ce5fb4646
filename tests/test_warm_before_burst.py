"""Warming the live step's path before a burst changes nothing: the same results, state,
rejections and publisher counters as a feed that never warms up."""

from __future__ import annotations

import numpy as np
import pytest

from atc_stream import ATCParams, Engine, Strategy
from atc_stream.connectors.exchanges.kline_steps import KlineStepper
from atc_stream.connectors.exchanges.klines import Kline
from atc_stream.connectors.redis.loop import LoopPublisher
from atc_stream.core.messages import encoded_records

IV = 60_000
T0 = 1_700_000_040_000


def _klines(symbols: list[str], bar: int, closes: np.ndarray) -> list[Kline]:
    t = T0 + bar * IV
    return [Kline(s, t, t + IV - 1, c, c * 1.01, c * 0.99, c, 1.0, True)
            for s, c in zip(symbols, closes, strict=True)]  # fmt: skip


def _state(engine: Engine) -> list[np.ndarray]:
    store = engine.store
    return [store.ring, store.values, store.counters, store.strategy_values]


@pytest.mark.parametrize("kind", ["one parameter set", "two parameter sets", "strategies"])
def test_warming_up_before_each_step_changes_no_result_state_or_counter(kind):
    symbols = [f"S{i}USDT" for i in range(11)]
    closes = 100 + np.cumsum(np.random.default_rng(3).normal(size=(90, 11)), axis=0).round(2)
    closes[40, 2] = np.nan  # rejected by the engine: never a bar to warm up from
    closes[41:44, 5] = -1.0
    kw: dict = {"backend": "cpu", "outputs": "all"}
    if kind == "two parameter sets":
        kw["params"] = [ATCParams(), ATCParams(ema_len=9, kama_len=12)]
    if kind == "strategies":
        kw["strategies"] = [Strategy(stop=0.02, fee_bps=10)]
    warmed, plain = Engine(**kw), Engine(**kw)
    publisher = LoopPublisher("redis://127.0.0.1:1/0")  # never connected: warm sends nothing
    steppers = []
    for engine, pub in ((warmed, publisher), (plain, None)):
        engine.add_symbols(symbols)
        steppers.append(KlineStepper(engine, symbols, kind == "strategies", IV, pub))
    for bar in range(closes.shape[0]):
        steppers[0].warm()
        if bar % 7 == 0:
            steppers[0].warm()  # twice before a step: still nothing changes
        klines = _klines(symbols, bar, closes[bar])
        (got, _), (want, _) = (stepper.step(klines) for stepper in steppers)
        assert encoded_records(got) == encoded_records(want)
        assert got.rejected == want.rejected
    assert warmed.rejections == plain.rejections
    assert sum(plain.rejections.values()) > 0
    for a, b in zip(_state(warmed), _state(plain), strict=True):
        np.testing.assert_array_equal(a, b)
    assert publisher.stats() == {
        "enqueued": 0, "delivered": 0, "delivered_rows": 0, "dropped": 0, "dropped_rows": 0,
        "messages": 0, "errors": 0, "reconnects": 0, "queued": 0,
    }  # fmt: skip
    assert publisher._seq == 0


def test_nothing_to_warm_before_a_step_or_on_calendar_bars():
    engine = Engine(backend="cpu")
    engine.add_symbols(["AUSDT"])
    KlineStepper(engine, ["AUSDT"], False, IV).warm()  # nothing stepped yet
    months = KlineStepper(engine, ["AUSDT"], False, None)
    months.step(_klines(["AUSDT"], 0, np.array([10.0])))
    months.warm()
    assert engine.rejections == {}


def test_a_preview_that_counts_no_rejection_leaves_its_bad_rows_out():
    engine = Engine(backend="cpu")
    engine.add_symbols(["AUSDT", "BUSDT"])
    slots = np.array([engine.slots_of(s)[0] for s in ("AUSDT", "BUSDT")])
    engine.step_arrays(slots, np.array([T0, T0]), np.array([10.0, 20.0]))
    stale = np.array([T0 + IV, T0])  # BUSDT's bar is not after its last one
    quiet = engine.preview_arrays(slots, stale, np.array([11.0, 21.0]), count_rejected=False)
    assert quiet.slots.tolist() == [slots[0]] and quiet.rejected == []
    assert engine.rejections == {}
    loud = engine.preview_arrays(slots, stale, np.array([11.0, 21.0]))
    assert len(loud) == 1 and len(loud.rejected) == 1
    assert sum(engine.rejections.values()) == 1
