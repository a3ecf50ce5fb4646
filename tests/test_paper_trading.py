"""Paper trading: an engine with strategies, stepped bar by bar (after a warmup, across a
snapshot and restore), trades exactly like ``backtest()`` on the whole series, bit for
bit; bars it cannot trade are rejected and counted; old snapshots still load."""

from __future__ import annotations

from dataclasses import fields as dataclass_fields
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cuda_targets import cuda_kernels_run
from hypothesis import given
from hypothesis import strategies as st
from short_params import SHORT

from atc_stream import ATCParams, Engine, Strategy, backtest
from atc_stream.core.backtest_result import TRADE_COLUMNS
from atc_stream.core.strategy_outputs import POSITION_COLUMNS, StrategyRows
from atc_stream.core.timetext import MAX_TIME_MS
from atc_stream.engine.paper import BAD_OHLC, MISSING_OHLC, parse_ohlc_bars
from atc_stream.state.layout import LANES, RING_HEAD
from atc_stream.state.snapshot import FORMAT_VERSION, decode_snapshot

BASE_TIME = 1_700_000_000_000
BAR_MS = 60_000
PARAMS = [
    SHORT,
    ATCParams(
        ema_len=10, hma_len=9, wma_len=8, dema_len=9, lsma_len=9, kama_len=8,
        robustness="Narrow", cutout=5,
    ),
]  # fmt: skip
STRATEGIES = [
    Strategy(),
    Strategy(direction="long_only", fee_bps=10, slippage_bps=5),
    Strategy(direction="short_only", stop=0.01, take_profit=0.02),
    Strategy(stop=0.004, take_profit=0.006, max_hold=5, fee_bps=7.5, slippage_bps=2),
    Strategy(max_hold=3, slippage_bps=1),
]
SYMBOLS = ("AAA", "BBB")
GOLDEN_V1 = Path(__file__).parent / "golden" / "snapshot_v1.bin"


def ohlc_bars(n=160, seed=3):
    """A long table of OHLC bars of two symbols (the second one shorter), time order."""
    rng = np.random.default_rng(seed)
    rows = []
    for k, symbol in enumerate(SYMBOLS):
        length = n - 15 * k
        c = 100 * np.exp(np.cumsum(rng.normal(0, 0.006, length)))
        o = np.concatenate([[c[0]], c[:-1] * np.exp(rng.normal(0, 0.002, length - 1))])
        h = np.maximum(o, c) * np.exp(np.abs(rng.normal(0, 0.003, length)))
        lo = np.minimum(o, c) * np.exp(-np.abs(rng.normal(0, 0.003, length)))
        t = BASE_TIME + BAR_MS * np.arange(length)
        rows += [(symbol, int(t[j]), o[j], h[j], lo[j], c[j]) for j in range(length)]
    rows.sort(key=lambda r: (r[1], r[0]))
    return rows


def as_table(rows):
    names = ("symbol", "time", "open", "high", "low", "close")
    return {name: np.array([r[k] for r in rows]) for k, name in enumerate(names)}


def history_of(rows):
    """``{symbol: (times, opens, highs, lows, closes)}`` of ``rows``."""
    out = {}
    for symbol in SYMBOLS:
        mine = [r for r in rows if r[0] == symbol]
        out[symbol] = tuple(np.array([r[k] for r in mine]) for k in range(1, 6))
    return out


def history_of_symbol(rows, symbol):
    """``{symbol: (times, opens, highs, lows, closes)}`` of ``symbol``'s rows."""
    mine = [r for r in rows if r[0] == symbol]
    return {symbol: tuple(np.array([r[k] for r in mine]) for k in range(1, 6))}


def engine(**kwargs):
    eng = Engine(PARAMS, backend="cpu", strategies=STRATEGIES, **kwargs)
    for symbol in SYMBOLS:
        eng.add_symbol(symbol)
    return eng


def trade_key(row):
    return (row["symbol"], row["params_id"], row["strategy_id"], row["exit_time"],
            row["entry_time"])  # fmt: skip


def assert_same_trades(streamed, expected):
    """Trade records equal, every float to the last bit (compared as float64 bits)."""
    assert len(streamed) == len(expected)
    for got, want in zip(sorted(streamed, key=trade_key), sorted(expected, key=trade_key),
                         strict=True):  # fmt: skip
        for name in TRADE_COLUMNS:
            if isinstance(want[name], float):
                assert np.float64(got[name]).view(np.int64) == np.float64(want[name]).view(
                    np.int64
                ), (name, got, want)
            else:
                assert got[name] == want[name], (name, got, want)


def expected_records(result, after_time=None):
    cols = result.trade_columns
    rows = [
        {name: cols[name][i].item() if hasattr(cols[name][i], "item") else cols[name][i]
         for name in TRADE_COLUMNS}
        for i in range(len(cols["symbol"]))
    ]  # fmt: skip
    return [r for r in rows if after_time is None or r["exit_time"] > after_time]


def assert_same_metrics(eng, result):
    got = eng.strategy_metrics()
    want = result.metric_columns
    order = np.lexsort((want["strategy_id"], want["params_id"], want["symbol"].astype(str)))
    for name in ("params_id", "strategy_id", "trades", "wins"):
        assert np.array_equal(got[name], want[name][order]), name
    assert list(got["symbol"]) == list(want["symbol"][order])
    for name in ("total_return", "max_drawdown", "exposure", "final_equity"):
        assert np.array_equal(got[name].view(np.int64), want[name][order].view(np.int64)), name


def equity_of(result):
    """``(symbol, params_id, strategy_id, time) -> (equity, side)`` of a backtest."""
    e = result.equity_columns
    return {
        (e["symbol"][i], int(e["params_id"][i]), int(e["strategy_id"][i]), int(e["time"][i])):
        (float(e["equity"][i]), int(e["side"][i]))
        for i in range(e["symbol"].shape[0])
    }  # fmt: skip


def check_positions(res, expected_equity):
    for row in res.position_records():
        want = expected_equity[(row["symbol"], row["params_id"], row["strategy_id"], row["time"])]
        assert np.float64(row["equity"]).view(np.int64) == np.float64(want[0]).view(np.int64)
        assert row["side"] == want[1]


@pytest.fixture(scope="module")
def bars():
    return ohlc_bars()


@pytest.fixture(scope="module")
def reference(bars):
    return backtest(as_table(bars), PARAMS, STRATEGIES)


def test_stepping_bar_by_bar_trades_exactly_like_backtest(bars, reference):
    eng = engine()
    expected_equity = equity_of(reference)
    trades = []
    times = sorted({r[1] for r in bars})
    for t in times:
        res = eng.step([r for r in bars if r[1] == t])
        assert not res.rejected
        check_positions(res, expected_equity)
        trades += res.trade_records()
    assert len(reference.trade_columns["symbol"]) > 20
    assert set(reference.trade_columns["reason"]) >= {"signal", "stop", "take_profit", "time"}
    assert_same_trades(trades, expected_records(reference))
    assert_same_metrics(eng, reference)


def test_warmup_then_steps_with_a_snapshot_between_equal_backtest(bars, reference):
    warm_until = BASE_TIME + BAR_MS * 60
    restore_at = BASE_TIME + BAR_MS * 100
    eng = engine()
    res = eng.warmup(history_of([r for r in bars if r[1] <= warm_until]))
    assert not res.rejected
    check_positions(res, equity_of(reference))
    trades = []
    for t in sorted({r[1] for r in bars if r[1] > warm_until}):
        if t == restore_at:
            blob = eng.snapshot()
            assert decode_snapshot(blob).header.format_version == FORMAT_VERSION
            eng = Engine.restore(blob, backend="cpu")
            assert eng.strategies == STRATEGIES
        # a long table this time (the other test steps tuples)
        res = eng.step(pd.DataFrame(as_table([r for r in bars if r[1] == t])))
        trades += res.trade_records()
    assert_same_trades(trades, expected_records(reference, after_time=warm_until))
    assert_same_metrics(eng, reference)


def test_one_step_of_many_bars_per_symbol_equals_backtest(bars, reference):
    eng = engine()
    half = BASE_TIME + BAR_MS * 80
    first = eng.step([r for r in bars if r[1] <= half])
    rest = [r for r in bars if r[1] > half]
    slots = np.array([eng.slots_of(r[0])[p] for r in rest for p in range(len(PARAMS))])
    cols = [np.repeat(np.array([r[k] for r in rest]), len(PARAMS)) for k in range(1, 6)]
    second = eng.step_arrays(slots, cols[0], cols[4], opens=cols[1], highs=cols[2], lows=cols[3])
    assert not first.rejected and not second.rejected
    assert_same_trades(first.trade_records() + second.trade_records(), expected_records(reference))
    assert_same_metrics(eng, reference)


def test_bars_without_ohlc_or_with_bad_prices_are_rejected_and_counted(bars):
    eng = engine()
    t = BASE_TIME
    res = eng.step([
        ("AAA", t, 100.0),  # no open/high/low
        ("AAA", t, 100.0, 99.0, 101.0, 100.0),  # high < low
        ("AAA", t, 102.0, 101.0, 99.0, 100.0),  # open above high
        ("AAA", t, 100.0, 101.0, 99.0, 98.0),  # close below low
        ("AAA", t, float("nan"), 101.0, 99.0, 100.0),  # not finite
        ("AAA", t, 10**400, 101.0, 99.0, 100.0),  # no float
        ("BBB", t, 100.0, 101.0, 99.0, 100.5),  # good
    ])  # fmt: skip
    assert [r.reason for r in res.rejected] == [MISSING_OHLC] + [BAD_OHLC] * 5
    assert eng.rejections[MISSING_OHLC] == 1 and eng.rejections[BAD_OHLC] == 5
    assert res.symbols == ["BBB", "BBB"]
    assert [s for s in eng.last_bar_times("AAA")] == [None, None]
    arrays = eng.step_arrays(eng.slots_of("AAA"), [t, t], [100.0, 100.0])
    assert len(arrays) == 0 and eng.rejections[MISSING_OHLC] == 3
    warm = eng.warmup({"CCC": (np.array([t]), np.array([1.0]))})
    assert [r.reason for r in warm.rejected] == [MISSING_OHLC]


def test_strategy_outputs_are_a_group_and_absent_without_strategies(bars):
    plain = Engine(SHORT, backend="cpu")
    plain.add_symbol("AAA")
    res = plain.step([("AAA", BASE_TIME, 100.0)])
    assert res.strategy is None
    with pytest.raises(AttributeError, match="strategies"):
        res.trade_columns()
    with pytest.raises(ValueError, match="strategies"):
        Engine(SHORT, outputs=["signal", "strategy"])
    eng = engine()
    res = eng.step(bars[:2])
    assert tuple(res.position_columns()) == POSITION_COLUMNS
    assert tuple(res.trade_columns()) == TRADE_COLUMNS
    assert len(res.position_records()) == len(res) * len(STRATEGIES)
    quiet = engine(outputs=["signal"])
    assert quiet.step(bars[:2]).strategy is None


# -- the CUDA backend (simulator) ----------------------------------------------------------


def assert_same_step(a, b):
    """Two step results: the same rows, signals and strategy outputs, to the last bit."""
    assert a.symbols == b.symbols and np.array_equal(a.times, b.times)
    assert np.array_equal(a.signal, b.signal, equal_nan=True)
    for f in dataclass_fields(StrategyRows):
        x, y = getattr(a.strategy, f.name), getattr(b.strategy, f.name)
        assert np.array_equal(x, y, equal_nan=True), f.name


def assert_same_state(a, b):
    assert_same_metrics_of(a.strategy_metrics(), b.strategy_metrics())
    rows = (max(a.slot_of(k) for k in a.streams) + 1) * len(a.strategies)
    for name in ("strategy_values", "strategy_counters", "strategy_entry_times"):
        assert np.array_equal(getattr(a.store, name)[:rows], getattr(b.store, name)[:rows]), name


def assert_same_metrics_of(got, want):
    for name in got:
        if got[name].dtype == object:
            assert list(got[name]) == list(want[name]), name
        else:
            assert np.array_equal(got[name], want[name]), name


def cuda_pair(capacity=64):
    """The same small strategy engine on the CPU and on the (simulated) CUDA backend."""
    pair = []
    for backend in ("cpu", "cuda"):
        eng = Engine(SHORT, backend=backend, strategies=STRATEGIES[2:], capacity=capacity)
        eng.add_symbol("AAA")
        pair.append(eng)
    assert pair[1].backend.name == "cuda"
    return pair


@pytest.mark.cudasim
@cuda_kernels_run
def test_a_cuda_engine_with_strategies_equals_the_cpu_bar_by_bar():
    bars = [r for r in ohlc_bars(n=45) if r[0] == "AAA"]
    cpu, gpu = cuda_pair(capacity=1)
    history = history_of_symbol(bars[:25], "AAA")
    assert_same_step(cpu.warmup(history), gpu.warmup(history))
    rest = bars[25:]
    k = 0
    while k < len(rest):
        bar = rest[k]
        if k == 8:  # a stream added on the way (the store grows): it starts on the host
            for eng in (cpu, gpu):
                eng.add_symbol("BBB")
        if k == 11:  # removed and added again: its fresh state is uploaded
            for eng in (cpu, gpu):
                eng.remove_symbol("BBB")
                eng.add_symbol("BBB")
        if k == 14:  # moved to the CPU and back: the state goes with it
            gpu.move_to("cpu")
            gpu.move_to("cuda")
        step = [bar] + ([("BBB", *bar[1:])] if k >= 8 else [])
        if k == 17:  # two bars per stream (two rounds) and a stale one (rejected)
            k += 1
            step += [rest[k], ("BBB", *rest[k][1:]), rest[k - 2]]
        want, got = cpu.step(step), gpu.step(step)
        assert [r.reason for r in got.rejected] == [r.reason for r in want.rejected]
        assert len(got.rejected) == (k == 18)
        assert_same_step(want, got)
        k += 1
    assert gpu.backend.name == "cuda"
    # the device holds the strategy state: the host mirror is current after a pull only
    assert not np.array_equal(gpu.store.strategy_counters, cpu.store.strategy_counters)
    assert cpu.strategy_metrics()["trades"].sum() > 0
    assert_same_state(cpu, gpu)


@pytest.mark.cudasim
@cuda_kernels_run
@pytest.mark.parametrize(("taken_on", "restored_on"), [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_snapshot_of_a_strategy_engine_moves_between_cpu_and_cuda(taken_on, restored_on):
    bars = [r for r in ohlc_bars(n=40) if r[0] == "AAA"]
    cpu, gpu = cuda_pair()
    history = history_of_symbol(bars[:25], "AAA")
    cpu.warmup(history)
    gpu.warmup(history)
    source = gpu if taken_on == "cuda" else cpu
    moved = Engine.restore(source.snapshot(), backend=restored_on)
    assert moved.backend.name == restored_on and moved.strategies == STRATEGIES[2:]
    for bar in bars[25:]:
        expected = cpu.step([bar])
        assert_same_step(expected, moved.step([bar]))
    assert_same_state(cpu, moved)


def test_a_format_1_snapshot_loads_and_continues_like_a_fresh_engine():
    old = Engine.restore(GOLDEN_V1.read_bytes(), backend="cpu")
    assert old.strategies == [] and old.source_offsets == {"file": 40}
    rng = np.random.default_rng(7)  # the series the golden snapshot was taken of
    closes = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, 41)))
    # numpy's exp differs by an ulp between its AVX-512 and AVX2 code (2 of these 41
    # closes): the closes the snapshot's ring remembers are the ones it was taken of
    slot = old.slots_of("AAA")[0]
    capacity = old.store.ring.shape[1] // 2
    head = old.store.counters[slot, RING_HEAD]
    ring = old.store.ring[slot]
    closes[40 - capacity : 40] = [ring[(head + 1 + k) % capacity] for k in range(capacity)]
    times = np.arange(41, dtype=np.int64) * 60_000
    fresh = Engine(ATCParams(), backend="cpu")
    fresh.warmup({"AAA": (times[:40], closes[:40])})
    fresh_slot = fresh.slots_of("AAA")[0]
    assert np.array_equal(
        old.store.values[slot // LANES, :, slot % LANES].view(np.int64),
        fresh.store.values[fresh_slot // LANES, :, fresh_slot % LANES].view(np.int64),
    )
    a = old.step([("AAA", int(times[40]), float(closes[40]))])
    b = fresh.step([("AAA", int(times[40]), float(closes[40]))])
    assert np.array_equal(a.signal.view(np.int64), b.signal.view(np.int64))
    assert np.array_equal(a.long_events, b.long_events)


def test_the_readme_paper_trading_example_runs(capsys):
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    block = next(b for b in readme.split("```python\n")[1:] if "strategies=[" in b)
    names: dict = {}
    exec(compile(block.split("```")[0], "README.md (paper trading)", "exec"), names)
    assert len(names["eng"].strategy_metrics()["trades"]) == 2


def test_growing_capacity_and_previews_leave_the_strategy_streams_as_backtest(bars, reference):
    eng = engine(capacity=1)  # every add grows the store, strategy rows with it
    assert eng.store.strategy_values.shape[0] == eng.store.capacity * len(STRATEGIES)
    trades = []
    for t in sorted({r[1] for r in bars}):
        step_bars = [r for r in bars if r[1] == t]
        preview = eng.preview([(s, t + BAR_MS, *p[:3], p[3]) for s, _, *p in step_bars])
        assert preview.strategy is None
        trades += eng.step(step_bars).trade_records()
    assert_same_trades(trades, expected_records(reference))
    assert_same_metrics(eng, reference)


def test_a_removed_then_added_symbol_starts_its_strategies_afresh(bars):
    eng = engine()
    eng.step([r for r in bars if r[1] <= BASE_TIME + BAR_MS * 50])
    eng.remove_symbol("AAA")
    eng.add_symbol("AAA")
    metrics = eng.strategy_metrics()
    fresh = metrics["symbol"] == "AAA"
    assert (metrics["trades"][fresh] == 0).all() and (metrics["final_equity"][fresh] == 1.0).all()
    assert (metrics["trades"][~fresh] > 0).any()


def test_an_arrow_table_with_renamed_price_columns_steps_like_tuples(bars):
    pa = pytest.importorskip("pyarrow")
    rows = [r for r in bars if r[1] <= BASE_TIME + BAR_MS * 40]
    table = as_table(rows)
    renamed = pa.table({
        "sym": table["symbol"].tolist(), "ts": table["time"], "o": table["open"],
        "h": table["high"], "l": table["low"], "close": table["close"],
    })  # fmt: skip
    a, b = engine(), engine()
    names = {"symbol": "sym", "time": "ts", "open": "o", "high": "h", "low": "l"}
    got = a.step(renamed, columns=names)
    want = b.step(rows)
    assert got.trade_records() == want.trade_records()
    assert got.position_records() == want.position_records()
    assert_same_metrics_between(a, b)
    # the latest time a bar may have is applied; one past int64 is not a time
    bad = a.step([("AAA", 2**63, 1.0, 1.0, 1.0, 1.0), ["BBB", MAX_TIME_MS, 1.0, 1.0, 1.0, 1.0]])
    assert [r.reason for r in bad.rejected] == ["bad_time_type"]


def assert_same_metrics_between(a, b):
    for name, values in a.strategy_metrics().items():
        assert np.array_equal(values, b.strategy_metrics()[name]), name


#: rows a strategy engine rejects, each for one reason (the last one for two: the
#: symbol's check comes first)
BAD_ROWS = [
    ("ZZZ", 100.0, 101.0, 99.0, 100.5),  # unknown symbol
    ("AAA", 100.0, 99.0, 101.0, 100.0),  # high < low
    ("BBB", 102.0, 101.0, 99.0, 100.0),  # open above high
    ("AAA", 100.0, 101.0, 99.0, float("nan")),  # not finite
    ("BBB", float("inf"), 101.0, 99.0, 100.0),  # not finite
    ("AAA", 100.0, 101.0, -1.0, 100.0),  # not > 0
    ("", 0.0, 1.0, 2.0, 3.0),  # unknown symbol and bad prices
]


def with_bad_rows(rows):
    """``rows`` with ``BAD_ROWS`` spread among them, at the time of their neighbours."""
    out = list(rows)
    for k, (symbol, *prices) in enumerate(BAD_ROWS):
        at = (3 * k + 1) % (len(out) + 1)
        out.insert(at, (symbol, out[min(at, len(out) - 1)][1], *prices))
    return out


@pytest.mark.parametrize("form", ["pandas", "arrow"])
def test_a_table_steps_like_its_rows_as_tuples_bad_rows_included(bars, form):
    """The column path of a long table: the same rows, signals, strategy outputs, trades,
    positions, rejections and counts as the item path of the same bars as tuples."""
    pa = pytest.importorskip("pyarrow")
    times = sorted({r[1] for r in bars})
    chunks = [[r for r in bars if lo <= r[1] < hi] for lo, hi in
              ((times[0], times[30]), (times[30], times[31]), (times[31], times[90]))]  # fmt: skip
    a, b = engine(), engine()
    for chunk in chunks:
        rows = with_bad_rows(chunk)
        table = as_table(rows)
        table["symbol"] = np.array([r[0] for r in rows], dtype=object)
        frame = pd.DataFrame(table) if form == "pandas" else pa.table(table)
        got, want = a.step(frame), b.step(rows)
        assert got.rejected == want.rejected
        assert {r.reason for r in got.rejected} == {"unknown_symbol", BAD_OHLC}
        assert_same_step(got, want)
        assert got.trade_records() == want.trade_records()
        assert got.position_records() == want.position_records()
    assert a.rejections == b.rejections
    assert_same_metrics_between(a, b)
    assert_same_state(a, b)


SYMBOL_CELLS = st.sampled_from(["AAA", "BBB", "ZZZ", ""])
PRICE_CELLS = st.sampled_from([1.0, 2.0, 2.5, 3.0, 0.0, -1.0, float("nan"), float("inf")])
OHLC_ROWS = st.lists(
    st.tuples(SYMBOL_CELLS, st.integers(0, 2**40), PRICE_CELLS, PRICE_CELLS, PRICE_CELLS,
              PRICE_CELLS),
    max_size=30,
)  # fmt: skip


@given(rows=OHLC_ROWS, fanned=st.booleans(), form=st.sampled_from(["pandas", "arrow"]))
def test_the_column_path_parses_a_table_like_the_item_path(rows, fanned, form):
    """Any table, with any mix of bad rows and one or several slots per symbol: the same
    columns (values and dtypes) and the same rejections, in the same order."""
    import pyarrow as pa

    slot_lists = {"AAA": [0, 2], "BBB": [1]} if fanned else {"AAA": [0], "BBB": [1]}
    table = {"symbol": pa.array([r[0] for r in rows], pa.string())}
    for k, name in enumerate(("time", "open", "high", "low", "close"), start=1):
        table[name] = np.array([r[k] for r in rows], np.int64 if k == 1 else np.float64)
    frame = pa.table(table) if form == "arrow" else pa.table(table).to_pandas()
    got_rejected, want_rejected = [], []

    def parse(bars, rejected):
        return parse_ohlc_bars(bars, None, None, slot_lists, lambda *a: rejected.append(a))

    got, want = parse(frame, got_rejected), parse(rows, want_rejected)
    assert got_rejected == want_rejected
    *got_columns, got_ohlc = got
    *want_columns, want_ohlc = want
    for x, y in zip([*got_columns, *got_ohlc], [*want_columns, *want_ohlc], strict=True):
        assert x.dtype == y.dtype and np.array_equal(x, y)


@pytest.mark.cudasim
@cuda_kernels_run
def test_the_kernels_launch_with_the_types_that_precompile_compiles(monkeypatch):
    """On a GPU, ``CudaBackend.precompile`` compiles ``kernel_signatures()`` and, with
    strategies, ``paper_signatures()``: every launch of a warmup, a step and an upload of
    a re-added stream uses one of them."""
    import numba

    from atc_stream.kernels import cuda_backend, cuda_kernels, cuda_paper

    launched = []
    original = cuda_backend.CudaBackend._launch

    def recording(self, kernel, count, *args):
        launched.append((kernel, args))
        original(self, kernel, count, *args)

    monkeypatch.setattr(cuda_backend.CudaBackend, "_launch", recording)
    bars = [r for r in ohlc_bars(n=20) if r[0] == "AAA"][:12]
    eng = Engine(SHORT, backend="cuda", strategies=STRATEGIES[:2])
    eng.warmup(history_of_symbol(bars[:8], "AAA"))
    eng.add_symbol("BBB")
    eng.remove_symbol("BBB")
    eng.add_symbol("BBB")
    for bar in bars[8:]:
        eng.step([bar, ("BBB", *bar[1:])])

    def typeof(array):
        return numba.typeof(getattr(array, "_ary", array))  # the simulator's device array

    signatures = cuda_kernels.kernel_signatures(None) | cuda_paper.paper_signatures()
    known = {(id(k), tuple(t)) for k, t in signatures.values()}
    kinds = {getattr(k, "__name__", k) for k, _ in launched}
    assert {
        "paper_warmup_kernel", "paper_step_kernel", "reset_cells_kernel", "last_rows_kernel",
        "scatter_rows_kernel", "step_kernel", "warmup_kernel",
    } <= kinds  # fmt: skip
    for kernel, args in launched:
        assert (id(kernel), tuple(typeof(a) for a in args)) in known, kernel
