"""Engine behaviour: streams registry, capacity, bad input policy, preview, the backend seam."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from parity_helpers import assert_bit_identical, reference_outputs
from short_params import SHORT_8

from atc_stream import ATCParams, Engine, compute
from atc_stream.state.arrays import values_of
from atc_stream.state.layout import GROWTH


def walk(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.round(100 + np.cumsum(rng.integers(-3, 4, n)) * 0.05, 2)


def feed(engine: Engine, symbol: str, closes: np.ndarray, start: int = 0) -> np.ndarray:
    rows = []
    for t in range(start, len(closes)):
        res = engine.step([(symbol, t, float(closes[t]))])
        assert not res.rejected, res.rejected
        rows.append(res.outputs[0])
    return np.array(rows)


def snapshot_of(engine: Engine, symbol: str):
    slot = engine.slots_of(symbol)[0]
    s = engine.store
    return s.ring[slot].copy(), values_of(s.values, [slot])[0], s.counters[slot].copy()


def assert_same_state(a, b):
    for x, y in zip(a, b, strict=True):
        assert_bit_identical(x, y, "state")


# -- streams registry -----------------------------------------------------------


def test_streams_added_later_removed_and_readded_do_not_disturb_others():
    a, b = walk(1, 150), walk(2, 150)
    engine = Engine(SHORT_8, backend="cpu", capacity=1, outputs="all")
    engine.add_symbol("A")
    got = list(feed(engine, "A", a[:50]))
    engine.add_symbol("B")  # forces capacity growth while A holds state
    for t in range(50, 100):
        res = engine.step([("A", t, float(a[t])), ("B", t, float(b[t]))])
        got.append(res.outputs[0])
    engine.remove_symbol("B")
    assert engine.symbols == ["A"]
    rejected = engine.step([("B", 100, 1.0)]).rejected
    assert [r.reason for r in rejected] == ["unknown_symbol"]
    engine.add_symbol("B")  # re-added: starts from scratch in a recycled slot
    b_rows = []
    for t in range(100, 150):
        res = engine.step([("B", t, float(b[t])), ("A", t, float(a[t]))])
        b_rows.append(res.outputs[0])
        got.append(res.outputs[1])
    assert_bit_identical(np.array(got), reference_outputs(compute(a, SHORT_8)), "A")
    assert_bit_identical(np.array(b_rows), reference_outputs(compute(b[100:], SHORT_8)), "B again")


def test_a_slot_given_to_another_symbol_names_it_in_the_rows():
    """Rows take their symbol, interval and params_id from per-slot columns kept between
    steps: a slot freed and given to another symbol (or another engine's slots in
    between) names the new stream at once."""
    engine = Engine(SHORT_8, backend="cpu", capacity=2, outputs="all")
    other = Engine(SHORT_8, backend="cpu", interval="1h", capacity=2, outputs="all")
    engine.add_symbols(["A", "B"])
    other.add_symbols(["X"])
    assert engine.step([("A", 0, 1.0), ("B", 0, 1.0)]).columns()["symbol"].tolist() == ["A", "B"]
    slot = engine.slots_of("B")[0]
    engine.remove_symbol("B")
    engine.add_symbol("C")
    assert engine.slots_of("C")[0] == slot  # the freed slot, reused
    columns = other.step([("X", 0, 1.0)]).columns()
    assert (columns["symbol"].tolist(), columns["interval"].tolist()) == (["X"], ["1h"])
    columns = engine.step([("C", 0, 2.0), ("A", 1, 2.0)]).columns()
    assert columns["symbol"].tolist() == ["C", "A"]
    assert columns["interval"].tolist() == ["1m", "1m"]
    assert [str(k) for k in engine.step([("C", 1, 2.0)]).keys] == ["C:1m:0"]


def _registry(engine: Engine):
    store = engine.store
    used = np.flatnonzero(store.in_use)
    return (
        engine.streams,
        {k: v.tolist() for k, v in engine.symbol_slots.items()},
        [engine.slot_of(key) for key in engine.streams],
        used.tolist(),
        store.ring[used],
        values_of(store.values, used),
        store.counters[used],
    )


def test_add_symbols_gives_the_slots_and_state_of_add_symbol_one_at_a_time():
    two_sets = [ATCParams(), SHORT_8]
    one, many = (Engine(two_sets, backend="cpu", capacity=2) for _ in range(2))
    for engine in (one, many):  # holes below the free slots, then growth past capacity
        engine.add_symbol("A")
        engine.add_symbol("B")
        engine.warmup({"A": (np.arange(40), walk(3, 40))})
        engine.remove_symbol("A")
    symbols = ["C", "B", "D", "E", "C"]  # B exists, C comes twice: each stream once
    assert many.add_symbols(symbols) == [key for s in symbols for key in one.add_symbol(s)]
    for a, b in zip(_registry(one), _registry(many), strict=True):
        if isinstance(a, np.ndarray):
            assert_bit_identical(a, b, "state")
        else:
            assert a == b


def test_add_symbols_with_a_bad_symbol_adds_none_of_them():
    engine = Engine(backend="cpu")
    with pytest.raises(ValueError, match="non-empty str"):
        engine.add_symbols(["A", ""])
    assert engine.symbols == []
    assert engine.add_symbols([]) == []


def test_parameter_sweep_fans_out_one_bar_to_every_parameter_set():
    sets = [SHORT_8, ATCParams(), ATCParams(robustness="Wide", cutout=20)]
    engine = Engine(sets, backend="cpu", outputs="all")
    engine.add_symbol("X")
    closes = walk(3, 120)
    rows = {i: [] for i in range(3)}
    for t in range(120):
        res = engine.step([("X", t, float(closes[t]))])
        assert len(res) == 3
        for key, row in zip(res.keys, res.outputs, strict=True):
            rows[key.params_id].append(row)
    for i, p in enumerate(sets):
        assert_bit_identical(np.array(rows[i]), reference_outputs(compute(closes, p)), str(p))


def test_a_bad_input_fanned_out_to_several_parameter_sets_counts_once():
    engine = Engine([SHORT_8, ATCParams()], backend="cpu", outputs="all")
    engine.add_symbol("X")
    res = engine.step([("X", 0, float("nan")), ("X", 1, 10.0), ("X", 1, 11.0)])
    assert [(r.index, r.reason) for r in res.rejected] == [
        (0, "non_finite_close"),
        (2, "duplicate_bar"),
    ]
    assert engine.rejections == {"non_finite_close": 1, "duplicate_bar": 1}
    assert len(res) == 2  # the good bar applied to both parameter sets


def test_adding_a_longer_parameter_set_later_keeps_existing_streams_exact():
    closes = walk(4, 200)
    engine = Engine(SHORT_8, backend="cpu", outputs="all")
    engine.add_symbol("X")
    got = list(feed(engine, "X", closes[:100]))
    ring_before = engine.store.ring_capacity
    pid = engine.add_params(ATCParams(ema_len=60))  # longer windows: the ring grows
    assert engine.store.ring_capacity > ring_before
    engine.add_stream("X", pid)
    longer = []
    for t in range(100, 200):
        res = engine.step([("X", t, float(closes[t]))])
        got.append(res.outputs[0])
        longer.append(res.outputs[1])
    assert_bit_identical(np.array(got), reference_outputs(compute(closes, SHORT_8)), "short")
    assert_bit_identical(
        np.array(longer), reference_outputs(compute(closes[100:], ATCParams(ema_len=60))), "long"
    )


def test_preview_never_changes_state_and_matches_step():
    closes = walk(5, 80)
    engine = Engine(SHORT_8, backend="cpu", outputs="all")
    engine.warmup({"X": (np.arange(60), closes[:60])})
    before = snapshot_of(engine, "X")
    previews = engine.preview([("X", 60, 99.0), ("X", 60, 101.5), ("X", 61, float(closes[60]))])
    assert previews.provisional and len(previews) == 3
    assert_same_state(before, snapshot_of(engine, "X"))
    res = engine.step([("X", 61, float(closes[60]))])
    assert_bit_identical(res.outputs, previews.outputs[2:], "preview == step")


def test_stream_state_reports_position_and_growth():
    engine = Engine(ATCParams(cutout=5), backend="cpu", outputs="all")
    engine.warmup({"X": (np.arange(10) * 60_000, walk(6, 10))})
    state = engine.stream_state(engine.streams[0])
    assert state["bar_index"] == 10 and state["last_time"] == 9 * 60_000
    slot = engine.slot_of(engine.streams[0])
    assert state["growth"] == values_of(engine.store.values, [slot])[0, GROWTH]
    assert state["growth"] == pytest.approx(np.exp(0.02 / 1000 * (9 - 5)))


# -- bad input --------------------------------------------------------------------


@pytest.fixture
def warm_engine():
    engine = Engine(SHORT_8, backend="cpu", outputs="all")
    engine.warmup({"A": (np.arange(30), walk(7, 30)), "B": (np.arange(30), walk(8, 30))})
    return engine


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (("A", 30, float("nan")), "non_finite_close"),
        (("A", 30, float("inf")), "non_finite_close"),
        (("A", 30, 0.0), "non_positive_close"),
        (("A", 30, -5.0), "non_positive_close"),
        (("ZZZ", 30, 10.0), "unknown_symbol"),
        ((None, 30, 10.0), "unknown_symbol"),
        (("A", 29, 10.0), "duplicate_bar"),
        (("A", 3, 10.0), "out_of_order_bar"),
        (("A", "30", 10.0), "bad_time_type"),
        (("A", 30.5, 10.0), "bad_time_type"),
        (("A", 30, "10.0"), "bad_close_type"),
        (("A", 30, None), "bad_close_type"),
        (("A", 30), "malformed_update"),
        (42, "malformed_update"),
    ],
)
def test_each_bad_input_is_rejected_counted_and_the_rest_applies(warm_engine, bad, reason, caplog):
    engine = warm_engine
    reference = Engine(SHORT_8, backend="cpu", outputs="all")
    reference.warmup({"B": (np.arange(30), walk(8, 30))})
    expected = reference.step([("B", 30, 100.0)]).outputs
    a_before = snapshot_of(engine, "A")
    with caplog.at_level(logging.WARNING, logger="atc_stream"):
        res = engine.step([bad, ("B", 30, 100.0)])
    assert [r.reason for r in res.rejected] == [reason]
    assert res.rejected[0].index == 0
    assert engine.rejections[reason] == 1
    assert reason in caplog.text  # logged once per kind, with the offending value
    assert res.symbols == ["B"]
    assert_bit_identical(res.outputs, expected, "good input still applies")
    assert_same_state(a_before, snapshot_of(engine, "A"))  # bad input never touches a stream


def test_rejections_are_logged_once_per_reason_but_always_counted(warm_engine, caplog):
    with caplog.at_level(logging.WARNING, logger="atc_stream"):
        for _ in range(5):
            warm_engine.step([("A", 1, 1.0)])
    assert warm_engine.rejections["out_of_order_bar"] == 5
    assert caplog.text.count("out_of_order_bar") == 1


def test_duplicate_inside_one_batch_is_rejected(warm_engine):
    res = warm_engine.step([("A", 30, 10.0), ("A", 30, 11.0), ("A", 31, 12.0), ("A", 30, 9.0)])
    assert [r.reason for r in res.rejected] == ["duplicate_bar", "out_of_order_bar"]
    assert list(res.times) == [30, 31]


def test_bad_bars_in_warmup_history_are_skipped_and_counted():
    closes = walk(9, 50)
    dirty = closes.copy()
    dirty[[10, 20]] = [np.nan, -1.0]
    times = np.arange(50)
    engine = Engine(SHORT_8, backend="cpu", outputs="all")
    res = engine.warmup({"X": (times, dirty), "Y": ("not", "arrays")})
    assert engine.rejections["non_finite_close"] == 1
    assert engine.rejections["non_positive_close"] == 1
    assert engine.rejections["bad_history"] == 1
    keep = np.isfinite(dirty) & (dirty > 0)
    expected = reference_outputs(compute(closes[keep], SHORT_8))[-1]
    assert_bit_identical(res.outputs[0], expected, "clean part applied")


def test_step_arrays_rejects_unknown_slots_and_raises_on_bad_shapes(warm_engine):
    slot_a = warm_engine.slots_of("A")[0]
    res = warm_engine.step_arrays([slot_a, 999, -1], [30, 30, 30], [10.0, 10.0, 10.0])
    assert [r.reason for r in res.rejected] == ["unknown_stream", "unknown_stream"]
    assert len(res) == 1
    with pytest.raises(ValueError, match="slots, times and closes"):
        warm_engine.step_arrays([slot_a], [30, 31], [1.0])


def test_invalid_library_arguments_raise_value_error_naming_them():
    with pytest.raises(ValueError, match="backend"):
        Engine(backend="tpu", outputs="all")
    with pytest.raises(ValueError, match="capacity"):
        Engine(capacity=0, outputs="all")
    with pytest.raises(ValueError, match="params"):
        Engine([ATCParams(), "fast"], outputs="all")
    with pytest.raises(ValueError, match="closes"):
        compute([1.0, float("nan")])
    with pytest.raises(ValueError, match="closes"):
        compute(np.ones((2, 2)))
    with pytest.raises(ValueError, match="interval must look like 1s, 1m.*got 'banana'"):
        Engine(backend="cpu", interval="banana")
    with pytest.raises(ValueError, match="interval must look like 1s, 1m.*got '1 h'"):
        compute(np.ones(5), interval="1 h")
    assert compute(np.ones(5))["interval"][0] == ""  # no label asked for: the column is blank
    older = Engine(backend="cpu", outputs="all")
    older.interval = "1min"  # a label older versions took: their snapshots still restore
    older.warmup({"X": (np.arange(30, dtype=np.int64) * 60_000, np.linspace(1.0, 2.0, 30))})
    restored = Engine.restore(older.snapshot(), backend="cpu", outputs="all")
    assert restored.interval == "1min" and restored.streams == older.streams
    engine = Engine(backend="cpu", outputs="all")
    with pytest.raises(ValueError, match="symbol"):
        engine.add_symbol("")
    with pytest.raises(ValueError, match="params_id"):
        engine.add_stream("X", 5)


# -- parameters ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"ema_len": 6}, "ema_len"),  # 6 - 6 = 0 with Medium
        ({"kama_len": 28.0}, "kama_len"),
        ({"robustness": "Tight"}, "robustness"),
        ({"La": float("nan")}, "La"),
        ({"De": 100.0}, "De"),
        ({"cut": float("inf")}, "cut"),
        ({"cutout": -1}, "cutout"),
        ({"long_threshold": -0.2}, "short_threshold"),
        ({"hma_w": 0.0}, "hma_w"),
        ({"wma_w": True}, "wma_w"),
    ],
)
def test_params_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ATCParams(**kwargs)


def test_params_lengths_and_round_trip():
    p = ATCParams(robustness="Wide", ema_len=10)
    assert p.family_lengths("EMA") == (10, 11, 13, 15, 17, 9, 7, 5, 3)
    assert p.max_length == 35 and p.lam == 0.02 / 1000.0 and p.decay == 1.0 - 0.03 / 100.0
    assert ATCParams.from_dict(p.to_dict()) == p
    with pytest.raises(ValueError, match="unknown ATC parameter"):
        ATCParams.from_dict({"speed": 1})


def test_state_is_under_4kb_per_stream_with_defaults():
    engine = Engine(backend="cpu", outputs="all")
    assert engine.store.bytes_per_stream <= 4096


def test_steady_slot_set_shortcut_equals_full_planning():
    """A batch with the slots of the last one-round, all-accepted batch skips the round
    planning (``Engine._plan``); results, rejections and state equal full planning,
    also when some of its updates are rejected (bad close, duplicate, stale bar)."""
    rng = np.random.default_rng(8)
    n, bars = 6, 40
    closes = np.round(100 * np.exp(np.cumsum(rng.normal(0, 0.01, (n, bars)), 1)), 2)
    t = 1_700_000_000_000 + 60_000 * np.arange(bars, dtype=np.int64)
    fast, full = (Engine(SHORT_8, backend="cpu", outputs="all") for _ in range(2))
    for eng in (fast, full):
        eng.warmup({f"S{i}": (t[:10], closes[i, :10]) for i in range(n)})
    order = rng.permutation(n)
    slots = np.array([fast.slot_of(fast.streams[i]) for i in order])
    for j in range(10, bars):
        step_times, step_closes = np.full(n, t[j]), closes[order, j].copy()
        if j % 7 == 0:
            step_closes[2] = np.nan
        if j % 11 == 0:
            step_times[4] = t[j - 1]  # not after the stream's last bar
        full._unique_slots = None  # always the full planning
        a = fast.step_arrays(slots, step_times, step_closes)
        b = full.step_arrays(slots, step_times, step_closes)
        assert_bit_identical(a.outputs, b.outputs, f"bar {j}")
        assert [(r.index, r.reason) for r in a.rejected] == [
            (r.index, r.reason) for r in b.rejected
        ]
        if j > 11:
            assert fast._unique_slots is not None  # the shortcut is in use
    assert dict(fast.rejections) == dict(full.rejections)
    np.testing.assert_array_equal(fast.store.counters, full.store.counters)
    np.testing.assert_array_equal(fast.store.values, full.store.values)


@pytest.mark.parametrize("groups", [("signal",), ("signal", "events"), ("layers", "growth")])
def test_cpu_typed_fields_equal_the_schema_conversion(groups):
    """The CPU backend's one-pass conversion of output rows (bar index, long, short)
    gives ``schema.kernel_fields``'s fields, NaN rows (rejected updates) included."""
    from atc_stream.core import output_row, schema
    from atc_stream.kernels import cpu

    rng = np.random.default_rng(3)
    out = rng.normal(size=(40, output_row.N_OUT))
    out[:, output_row.OUT_BAR_INDEX] = rng.integers(0, 10**9, 40)
    out[:, output_row.OUT_LONG] = rng.integers(0, 2, 40)
    out[:, output_row.OUT_SHORT] = rng.choice([0.0, 1.0, np.nan], 40)
    out[::7] = np.nan
    expected = schema.kernel_fields(out, groups)
    fields = cpu.kernel_fields(out, groups)
    assert list(fields) == list(expected)
    for name, values in expected.items():
        assert fields[name].dtype == values.dtype, name
        np.testing.assert_array_equal(fields[name], values, err_msg=name)
    assert (fields["bar_index"][::7] == -1).all()


# -- the backend seam ------------------------------------------------------------------


def _protocol_members() -> tuple[set[str], set[str]]:
    """(attributes, methods) that ``kernels.backend.Backend`` declares."""
    from atc_stream.kernels.backend import Backend

    methods = {n for n, v in vars(Backend).items() if callable(v) and not n.startswith("_")}
    return set(Backend.__annotations__), methods


def test_cpu_backend_satisfies_the_backend_protocol():
    from atc_stream.kernels.backend import Backend
    from atc_stream.kernels.cpu import CpuBackend
    from atc_stream.state.arrays import StateStore

    assert isinstance(CpuBackend(StateStore()), Backend)
    assert isinstance(Engine(SHORT_8, backend="cpu").backend, Backend)
    assert not isinstance(object(), Backend)  # the check can fail


def test_cuda_backend_class_defines_every_backend_member_with_its_signature():
    """Structural, without a GPU: class attributes and method parameters as declared."""
    import inspect

    from atc_stream.kernels.backend import Backend
    from atc_stream.kernels.cpu import CpuBackend
    from atc_stream.kernels.cuda_backend import CudaBackend

    attributes, methods = _protocol_members()
    assert {"name", "warmup_chunk"} <= attributes and {"step_outputs_async", "close"} <= methods
    for cls in (CpuBackend, CudaBackend):
        for name in attributes:
            assert hasattr(cls, name), f"{cls.__name__}.{name}"
        for name in methods:
            declared = list(inspect.signature(getattr(Backend, name)).parameters)
            defined = list(inspect.signature(getattr(cls, name)).parameters)
            assert defined == declared, f"{cls.__name__}.{name}{defined} != {declared}"
    assert isinstance(CudaBackend.name, str) and isinstance(CudaBackend.warmup_chunk, int)


def test_cpu_step_outputs_async_is_ready_and_equals_step_outputs():
    engine = Engine(SHORT_8, backend="cpu", outputs="all")
    closes = walk(5, 40)
    engine.warmup({"A": (np.arange(30), closes[:30])})
    slots = engine.slots_of("A")
    args = (slots, np.array([30]), closes[30:31], np.array([0]), np.array([0, 1]))
    other = Engine(SHORT_8, backend="cpu", outputs="all")
    other.warmup({"A": (np.arange(30), closes[:30])})
    pending = engine.backend.step_outputs_async(*args, engine.outputs)
    fields = other.backend.step_outputs(*args, other.outputs)
    got = pending.wait()
    assert got.keys() == fields.keys()
    for name in fields:
        np.testing.assert_array_equal(got[name], fields[name])


STRATEGY_USE_AFTER_COMPILE = """
import numpy as np
from atc_stream import Engine, Strategy, backtest
from atc_stream.kernels import backtest_cpu, paper_cpu, prepare
Engine.compile()
strategy_kernels = (*paper_cpu.DRIVERS, backtest_cpu.backtest_streams)
loaded = all(d.signatures for d in strategy_kernels)
before = [len(d.signatures) for d in prepare._dispatchers()]
eng = Engine(backend="cpu", strategies=[Strategy(), Strategy(stop=0.01)])
t = np.arange(40, dtype=np.int64) * 60_000
c = 100 + np.sin(np.arange(40) / 3)
eng.warmup({f"S{i}": (t, c, c + 1, c - 1, c) for i in range(3)})
slots = np.concatenate([eng.slots_of(f"S{i}") for i in range(3)])
p = np.full(3, 100.5)
eng.step_arrays(slots, np.full(3, 40 * 60_000), p, opens=p, highs=p + 1, lows=p - 1)
eng.step([("S0", 41 * 60_000, 100.0, 101.0, 99.0, 100.0)])
bars = {"symbol": np.array(["A"] * 40), "time": t, "open": c, "high": c + 1, "low": c - 1,
        "close": c}
backtest(bars, strategies=[Strategy(), Strategy(max_hold=3)])
after = [len(d.signatures) for d in prepare._dispatchers()]
print(loaded, before == after)
"""


def test_after_compile_paper_trading_and_backtest_compile_nothing():
    """``Engine.compile()`` (and so ``atc-stream compile``) also compiles or loads the
    strategy kernels: a strategy engine's warmup and steps and a ``backtest`` after it
    add no kernel signature."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", STRATEGY_USE_AFTER_COMPILE], capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]


def test_histories_are_padded_to_the_longest_with_time_zero_and_close_one():
    from atc_stream.engine.parsing import pad_histories

    jobs = [
        (7, np.array([10, 20, 30], np.int64), np.array([1.5, 2.5, 3.5])),
        (3, np.array([40], np.int64), np.array([4.5])),
        (9, np.zeros(0, np.int64), np.zeros(0)),
    ]
    slots, times, closes, counts = pad_histories(jobs)
    assert slots.tolist() == [7, 3, 9] and counts.tolist() == [3, 1, 0]
    assert times.tolist() == [[10, 20, 30], [40, 0, 0], [0, 0, 0]]
    assert closes.tolist() == [[1.5, 2.5, 3.5], [4.5, 1.0, 1.0], [1.0, 1.0, 1.0]]
    slots, times, closes, counts = pad_histories([(0, np.zeros(0, np.int64), np.zeros(0))])
    assert times.tolist() == [[0]] and closes.tolist() == [[1.0]] and counts.tolist() == [0]
