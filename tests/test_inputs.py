"""Input forms: pandas, Arrow, datetime64, Timestamps and integer epochs
into ``compute``, ``Engine.warmup`` and ``Engine.step`` give the plain-NumPy result bit for
bit; every wrong form raises a clear ``ValueError`` and leaves the engine untouched."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from parity_helpers import assert_bit_identical
from short_params import SHORT_8

from atc_stream import ATCParams, Engine, StreamKey, UnknownStreamError, compute
from atc_stream.core.inputs import detect_epoch_unit, times_to_ms

T0_MS = 1_700_000_040_000  # a whole minute, epoch ms
N = 60
TIMES_MS = T0_MS + 60_000 * np.arange(N, dtype=np.int64)


def walk(seed: int, n: int = N) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.round(100 + np.cumsum(rng.integers(-3, 4, n)) * 0.05, 2)


CLOSES = {"AAA": walk(1), "BBB": walk(2)}


def plain_warmup() -> tuple[Engine, object]:
    eng = Engine(SHORT_8, backend="cpu", outputs="all")
    res = eng.warmup({s: (TIMES_MS, c) for s, c in CLOSES.items()})
    return eng, res


@pytest.fixture(scope="module")
def expected():
    eng, res = plain_warmup()
    step = eng.step([(s, int(TIMES_MS[-1] + 60_000), 101.5) for s in CLOSES])
    return res, step


def assert_same_result(got, want, what: str) -> None:
    assert not got.rejected, (what, got.rejected)
    assert got.keys == want.keys, what
    np.testing.assert_array_equal(got.times, want.times, what)
    assert_bit_identical(got.outputs, want.outputs, what)


def long_frame(times) -> pd.DataFrame:
    rows = [(s, t, c) for s, closes in CLOSES.items() for t, c in zip(times, closes, strict=True)]
    return pd.DataFrame(rows, columns=["symbol", "time", "close"])


DATETIMES = pd.to_datetime(TIMES_MS, unit="ms", utc=True)
TIME_FORMS = {
    "datetime64[ns]": DATETIMES.tz_localize(None).as_unit("ns"),
    "datetime64[ms]": DATETIMES.tz_localize(None).as_unit("ms"),
    "tz-aware UTC": DATETIMES,
    "tz-aware Tokyo": DATETIMES.tz_convert("Asia/Tokyo"),
    "tz-aware New York us": DATETIMES.tz_convert("America/New_York").as_unit("us"),
    "numpy datetime64[s]": (TIMES_MS // 1000).astype("datetime64[s]"),
}


# -- compute ------------------------------------------------------------------------------


def test_compute_series_with_datetimeindex_returns_dataframe_on_its_index():
    closes = CLOSES["AAA"]
    plain = compute(closes, SHORT_8)
    index = pd.DatetimeIndex(TIME_FORMS["tz-aware Tokyo"], name="open_time")
    frame = compute(pd.Series(closes, index=index), SHORT_8)
    assert isinstance(frame, pd.DataFrame)
    assert frame.index.equals(index)
    assert list(frame.columns) == list(plain)
    for name, values in plain.items():
        if name == "time":
            continue
        np.testing.assert_array_equal(frame[name].to_numpy(), values, name)
    assert str(frame["time"].dtype) == "datetime64[ms, UTC]"
    assert (frame["time"].to_numpy() == np.asarray(DATETIMES)).all()
    np.testing.assert_array_equal(frame["time"].astype("int64").to_numpy(), TIMES_MS)


def test_compute_series_with_any_index_keeps_it():
    closes = CLOSES["BBB"]
    index = pd.Index([f"row{i}" for i in range(N)])
    frame = compute(pd.Series(closes, index=index), SHORT_8)
    assert frame.index.equals(index)
    assert_bit_identical(frame["signal"].to_numpy(), compute(closes, SHORT_8)["signal"], "signal")


@pytest.mark.parametrize(
    "form", [list, pa.array, lambda c: pa.chunked_array([c[:10], c[10:]])], ids=str
)
def test_compute_list_and_arrow_equal_numpy(form):
    closes = CLOSES["AAA"]
    plain = compute(closes, SHORT_8)
    got = compute(form(list(closes)) if form is list else form(closes), SHORT_8)
    for name in ("signal", "ema_equity", "kama_signal", "long", "short", "ready"):
        assert_bit_identical(got[name], plain[name], name)


def test_compute_times_argument_in_any_unit():
    closes = CLOSES["AAA"]
    got = compute(closes, SHORT_8, times=TIMES_MS // 1000, time_unit="s")
    np.testing.assert_array_equal(got["time"], TIMES_MS)
    with pytest.raises(ValueError, match="one entry per close"):
        compute(closes, SHORT_8, times=TIMES_MS[:-1])


def test_compute_rejects_missing_closes_from_pandas_and_arrow():
    with pytest.raises(ValueError, match="finite and > 0"):
        compute(pd.Series([1.0, None, 2.0]))
    with pytest.raises(ValueError, match="finite and > 0"):
        compute(pa.array([1.0, None, 2.0]))


# -- warmup ---------------------------------------------------------------------------------


@pytest.mark.parametrize("form", sorted(TIME_FORMS))
def test_warmup_dict_of_series(form, expected):
    times = TIME_FORMS[form]
    history = {s: pd.Series(c, index=pd.DatetimeIndex(times)) for s, c in CLOSES.items()}
    eng = Engine(SHORT_8, backend="cpu", outputs="all")
    assert_same_result(eng.warmup(history), expected[0], form)


@pytest.mark.parametrize("form", sorted(TIME_FORMS))
def test_warmup_long_dataframe(form, expected):
    eng = Engine(SHORT_8, backend="cpu", outputs="all")
    assert_same_result(eng.warmup(long_frame(list(TIME_FORMS[form]))), expected[0], form)


def test_warmup_dataframe_with_renamed_columns_and_datetimeindex(expected):
    frame = long_frame(list(DATETIMES)).rename(columns={"symbol": "ticker", "close": "px"})
    frame = frame.set_index(pd.DatetimeIndex(frame.pop("time")))
    eng = Engine(SHORT_8, backend="cpu", outputs="all")
    got = eng.warmup(frame, columns={"symbol": "ticker", "close": "px", "time": "open_time"})
    assert_same_result(got, expected[0], "renamed")


@pytest.mark.parametrize("tz", [None, "UTC", "Europe/Berlin"])
def test_warmup_arrow_table(tz, expected):
    frame = long_frame(TIMES_MS)
    table = pa.table(
        {
            "symbol": pa.array(frame["symbol"]),
            "time": pa.array(frame["time"], pa.int64()).cast(pa.timestamp("ms", tz=tz)),
            "close": pa.array(frame["close"]),
        }
    )
    eng = Engine(SHORT_8, backend="cpu", outputs="all")
    assert_same_result(eng.warmup(table), expected[0], f"arrow tz={tz}")
    eng = Engine(SHORT_8, backend="cpu", outputs="all")
    assert_same_result(eng.warmup(table.to_batches()[0]), expected[0], "record batch")


@pytest.mark.parametrize(
    "unit, scale", [("s", 1 / 1000), ("ms", 1), ("us", 1000), ("ns", 1_000_000)]
)
@pytest.mark.parametrize("given", [True, False], ids=["unit-given", "unit-detected"])
def test_warmup_integer_epochs(unit, scale, given, expected):
    ints = (TIMES_MS * scale).astype(np.int64) if scale >= 1 else TIMES_MS // 1000
    history = {s: (ints, c) for s, c in CLOSES.items()}
    eng = Engine(SHORT_8, backend="cpu", outputs="all")
    got = eng.warmup(history, time_unit=unit if given else "auto")
    assert_same_result(got, expected[0], f"{unit} {given}")
    frame = long_frame(ints)
    eng = Engine(SHORT_8, backend="cpu", outputs="all")
    assert_same_result(eng.warmup(frame, time_unit=unit if given else "auto"), expected[0], unit)


def test_warmup_tuples_of_datetime_arrays(expected):
    history = {s: (DATETIMES, pd.Series(c)) for s, c in CLOSES.items()}
    eng = Engine(SHORT_8, backend="cpu", outputs="all")
    assert_same_result(eng.warmup(history), expected[0], "DatetimeIndex times")
    history = {s: (list(DATETIMES), list(c)) for s, c in CLOSES.items()}
    eng = Engine(SHORT_8, backend="cpu", outputs="all")
    assert_same_result(eng.warmup(history), expected[0], "list of Timestamps")


# -- step ---------------------------------------------------------------------------------


NEXT = pd.Timestamp(int(TIMES_MS[-1]) + 60_000, unit="ms", tz="UTC")


@pytest.mark.parametrize(
    "form",
    [
        "timestamps",
        "naive timestamps",
        "datetime64",
        "python datetime",
        "dataframe",
        "arrow",
        "dict of series",
        "seconds",
    ],
)
def test_step_forms(form, expected):
    eng, _ = plain_warmup()
    symbols = list(CLOSES)
    kwargs = {}
    if form == "timestamps":
        bars = [(s, NEXT.tz_convert("Asia/Kolkata"), 101.5) for s in symbols]
    elif form == "naive timestamps":
        bars = [(s, NEXT.tz_localize(None), 101.5) for s in symbols]
    elif form == "datetime64":
        bars = [(s, NEXT.tz_localize(None).to_datetime64(), 101.5) for s in symbols]
    elif form == "python datetime":
        bars = [(s, NEXT.to_pydatetime(), 101.5) for s in symbols]
    elif form == "dataframe":
        bars = pd.DataFrame({"symbol": symbols, "time": [NEXT] * 2, "close": [101.5] * 2})
    elif form == "arrow":
        bars = pa.table(
            {"symbol": symbols, "time": pa.array([NEXT] * 2, pa.timestamp("ns", tz="UTC")),
             "close": [101.5, 101.5]}
        )  # fmt: skip
    elif form == "dict of series":
        bars = {s: pd.Series([101.5], index=pd.DatetimeIndex([NEXT])) for s in symbols}
    else:
        bars = [(s, int(NEXT.value // 10**9), 101.5) for s in symbols]
        kwargs = {"time_unit": "s"}
    assert_same_result(eng.step(bars, **kwargs), expected[1], form)


def test_preview_accepts_the_same_forms(expected):
    eng, _ = plain_warmup()
    frame = pd.DataFrame({"symbol": list(CLOSES), "time": [NEXT] * 2, "close": [101.5] * 2})
    preview = eng.preview(frame)
    assert preview.provisional
    assert_bit_identical(preview.outputs, expected[1].outputs, "preview")


def test_bad_values_in_a_good_form_are_still_counted_rejections(expected):
    eng, _ = plain_warmup()
    frame = pd.DataFrame(
        {"symbol": ["AAA", "ZZZ", "BBB"], "time": [NEXT] * 3, "close": [101.5, 1.0, np.nan]}
    )
    res = eng.step(frame)
    assert sorted(r.reason for r in res.rejected) == ["non_finite_close", "unknown_symbol"]
    assert res.keys == [StreamKey("AAA", "1m", 0)]


# -- wrong forms: a clear ValueError, nothing counted, nothing registered ------------------


WRONG = {
    "sub-millisecond datetime64": (
        lambda: {"AAA": (DATETIMES.tz_localize(None) + pd.Timedelta(1, "us"), CLOSES["AAA"])},
        "sub-millisecond",
    ),
    "microseconds taken as ms": (
        lambda: {"AAA": (TIMES_MS * 1000, CLOSES["AAA"])},
        "microseconds or nanoseconds",
    ),
    "NaT": (
        lambda: {"AAA": pd.Series(CLOSES["AAA"], index=pd.DatetimeIndex([pd.NaT, *DATETIMES[1:]]))},
        "NaT",
    ),
    "string index": (
        lambda: {"AAA": pd.Series(CLOSES["AAA"], index=[str(t) for t in TIMES_MS])},
        "DatetimeIndex",
    ),
    "missing column": (lambda: long_frame(TIMES_MS).drop(columns="close"), "no column"),
    "float times": (lambda: {"AAA": (TIMES_MS + 0.5, CLOSES["AAA"])}, "whole-number epochs"),
    "not a mapping": (lambda: [("AAA", TIMES_MS, CLOSES["AAA"])], "history must be"),
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_wrong_history_forms_raise_clearly(case):
    make, message = WRONG[case]
    eng = Engine(SHORT_8, backend="cpu", outputs="all")
    with pytest.raises(ValueError, match=message):
        eng.warmup(make())
    assert not eng.rejections and not eng.streams


def test_wrong_step_forms_raise_clearly():
    eng, _ = plain_warmup()
    before = eng.stream_state(eng.streams[0])
    with pytest.raises(ValueError, match="sub-millisecond"):
        eng.step([("AAA", NEXT + pd.Timedelta(1, "ns"), 101.5)])
    with pytest.raises(ValueError, match="cannot detect the unit"):
        eng.step([("AAA", 12345, 101.5)], time_unit="auto")
    with pytest.raises(ValueError, match="time_unit must be"):
        eng.step([("AAA", 12345, 101.5)], time_unit="minutes")
    with pytest.raises(ValueError, match="columns keys"):
        eng.step(pd.DataFrame({"symbol": ["AAA"]}), columns={"price": "close"})
    assert not eng.rejections
    assert eng.stream_state(eng.streams[0]) == before


def test_epoch_unit_detection_and_exact_conversion():
    assert detect_epoch_unit(TIMES_MS // 1000) == "s"
    assert detect_epoch_unit(TIMES_MS) == "ms"
    assert detect_epoch_unit(TIMES_MS * 1000) == "us"
    assert detect_epoch_unit(TIMES_MS * 1_000_000) == "ns"
    with pytest.raises(ValueError, match="cannot detect"):  # spans two bands
        detect_epoch_unit(np.array([TIMES_MS[0] // 1000, TIMES_MS[0]]))
    with pytest.raises(ValueError, match="sub-millisecond"):
        times_to_ms(np.array([TIMES_MS[0] * 1000 + 1]), "us")
    big = np.array(["2262-04-11T23:47:16.854"], "datetime64[ms]")  # beyond ns range: exact
    assert times_to_ms(big)[0] == big.astype(np.int64)[0]


# -- parameters and stream keys -----------------------------------------------------------


def test_params_accept_numpy_scalars():
    p = ATCParams(ema_len=np.int64(28), hma_len=np.int32(30), La=np.float64(0.02),
                  De=np.float32(3.0), cutout=np.uint8(5), ema_w=np.int64(2))  # fmt: skip
    assert p == ATCParams(hma_len=30, De=3.0, cutout=5, ema_w=2.0)
    assert type(p.ema_len) is int and type(p.La) is float and type(p.cutout) is int
    assert hash(p) == hash(ATCParams(hma_len=30, De=3.0, cutout=5, ema_w=2.0))
    assert p.to_dict()["ema_len"] == 28


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("ema_len", np.int64(3), "ema_len"),
        ("kama_len", np.float64(28.0), "kama_len must be an int"),
        ("wma_len", np.bool_(True), "wma_len must be an int"),
        ("La", np.float64("nan"), "La must be a finite"),
        ("cutout", np.int64(-1), "cutout"),
        ("dema_w", np.float32(0.0), "dema_w must be > 0"),
    ],
)
def test_params_bad_numpy_values_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        ATCParams(**{field: value})


def test_unknown_stream_keys_give_clear_errors():
    eng, _ = plain_warmup()
    missing = StreamKey("NOPE", "1m", 0)
    for call in (eng.stream_state, eng.remove_stream, eng.slot_of):
        with pytest.raises(UnknownStreamError, match="unknown stream .*NOPE.*registered: AAA"):
            call(missing)
    with pytest.raises(KeyError, match="pass a StreamKey"):
        eng.stream_state("NOPE")
    with pytest.raises(ValueError, match="unknown symbol 'NOPE'"):
        eng.slots_of("NOPE")


def test_a_stream_is_found_by_its_key_its_tuple_its_text_or_a_one_stream_symbol():
    eng, _ = plain_warmup()
    key = eng.streams[0]
    slot = eng.slot_of(key)
    assert eng.slot_of((key.symbol, key.interval, key.params_id)) == slot
    assert eng.slot_of(str(key)) == slot
    assert eng.slot_of(key.symbol) == slot
    assert eng.stream_state(key.symbol) == eng.stream_state(key)
    two = Engine([ATCParams(), ATCParams(ema_len=20)], backend="cpu")
    two.add_symbol("AAA")
    with pytest.raises(UnknownStreamError, match="'AAA' has 2 streams .*pass a key"):
        two.stream_state("AAA")


@pytest.mark.parametrize(
    "closes, message",
    [
        (["101.5", "102.0"], r"closes must be numbers, got text"),
        (np.array([True, False]), r"closes must be numbers, got booleans"),
        (pd.Series(["101.5", "102.0"]), r"closes\[0\] is str '101.5'"),
        (pa.array(["101.5", "102.0"]), r"closes\[0\] is str '101.5'"),
        ([1.0, "1_0"], r"closes must be numbers, got text"),
        (np.array([1.0, "x"], dtype=object), r"closes\[1\] is str 'x'"),
    ],
)
def test_text_and_booleans_are_not_closes_on_any_way_in(closes, message):
    times = np.arange(2, dtype=np.int64) * 60_000
    with pytest.raises(ValueError, match=message):
        compute(closes)
    eng = Engine(SHORT_8, backend="cpu")
    eng.warmup({"AAA": (times, closes)})
    assert eng.rejections == {"bad_history": 1} and not eng.streams
    frame = pd.DataFrame({"symbol": ["AAA", "AAA"], "time": times, "close": list(closes)})
    with pytest.raises(ValueError, match="must be numbers"):
        eng.warmup(frame)
    eng.add_symbol("BBB")
    with pytest.raises(ValueError, match="must be numbers"):
        eng.step_arrays(eng.slots_of("BBB")[:1], times[:1], np.asarray(closes)[-1:])


def test_numbers_of_any_python_or_numpy_type_and_missing_values_are_closes():
    from decimal import Decimal

    got = compute([Decimal("100.5"), np.float32(101.5), 102, np.int64(103)] * 5)
    assert got["close"][:4].tolist() == [100.5, 101.5, 102.0, 103.0]
    with pytest.raises(ValueError, match=r"closes\[1\] = nan"):
        compute([100.0, None, 101.0])
    with pytest.raises(ValueError, match=r"closes\[1\] = nan"):
        compute(pd.Series([100.0, pd.NA, 101.0], dtype="Float64"))


def test_a_dict_or_text_is_not_a_bar_of_step():
    eng, _ = plain_warmup()
    result = eng.step([{"symbol": "AAA", "time": int(NEXT.value // 10**6), "close": 101.5}, "ABC"])
    assert [r.reason for r in result.rejected] == ["malformed_update", "malformed_update"]


def test_compute_takes_strided_columns_and_equals_the_contiguous_copy():
    table = np.column_stack([np.arange(300.0), 100 + np.sin(np.arange(300) / 5)])
    column = table[:, 1]
    assert not column.flags["C_CONTIGUOUS"]
    got, want = compute(column), compute(column.copy())
    assert_bit_identical(got["signal"], want["signal"])
    assert_bit_identical(compute(column[::-1])["signal"], compute(column[::-1].copy())["signal"])


def test_compute_refuses_times_out_of_order_or_repeated():
    closes = 100 + np.arange(100.0)
    times = 1_700_000_000_000 + 60_000 * np.arange(100)
    with pytest.raises(ValueError, match=r"times\[1\] = .* is not after times\[0\]"):
        compute(closes, times=times[::-1].copy())
    with pytest.raises(ValueError, match=r"times\[50\] = 1700002940000 ms is not after"):
        compute(closes, times=np.r_[times[:50], times[49:99]])
    newest_first = pd.Series(closes, index=pd.date_range("2024", periods=100, freq="h", tz="UTC"))
    with pytest.raises(ValueError, match=r"index must be strictly increasing"):
        compute(newest_first.iloc[::-1])


@pytest.mark.parametrize("params", [{"ema_len": 20}, "Medium"])
def test_params_that_are_not_atcparams_are_named_as_what_they_are(params):
    kind = type(params).__name__
    with pytest.raises(ValueError, match=f"params must be an ATCParams, got {kind}"):
        Engine(params)
    with pytest.raises(ValueError, match=f"params must be an ATCParams, got {kind}"):
        compute(np.linspace(100, 110, 100), params)


def test_a_fractional_or_missing_float_time_is_named_where_it_is():
    with pytest.raises(ValueError, match=r"whole-number epochs or datetimes: times\[1\] = 2.5"):
        times_to_ms(np.array([1.0, 2.5]))
    with pytest.raises(ValueError, match=r"times\[1\] = nan"):
        times_to_ms(np.array([1.0, np.nan]))
