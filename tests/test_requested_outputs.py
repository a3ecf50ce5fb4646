"""Requested outputs (``Engine(outputs=...)``): only the asked-for columns, in narrow
types, bit-identical to the same columns of a full result; every consumer of a result
(columns, records, pandas, Arrow, JSONL/CSV/Parquet writers, Redis records) handles the
subset. The CUDA side is checked against the CPU under the simulator in
``test_cuda_sim.py`` with the same scenario (``output_subsets.py``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from output_subsets import SUBSETS, assert_subset_matches, drive

from atc_stream.core import schema
from atc_stream.core.params import ATCParams
from atc_stream.core.results import results_to_arrow
from atc_stream.engine.engine import Engine
from atc_stream.io.writers import OutputError, open_writer

T0, BAR = 1_700_000_000_000, 60_000


@pytest.fixture(scope="module")
def full_cpu():
    return drive("cpu", "all")


@pytest.mark.parametrize("outputs", SUBSETS, ids=repr)
def test_each_subset_equals_the_matching_columns_of_all_outputs(outputs, full_cpu):
    assert_subset_matches(drive("cpu", outputs), full_cpu, outputs)


def test_default_is_signal_and_events_in_narrow_types():
    eng = Engine(ATCParams(cutout=2), backend="cpu")
    assert eng.outputs == schema.DEFAULT_OUTPUTS == ("signal", "events")
    t = T0 + BAR * np.arange(5)
    res = eng.warmup({"A": (t, [1.0, 2.0, 3.0, 2.5, 2.7])})
    assert res.column_names == (
        "symbol", "interval", "params_id", "time", "close", "bar_index", "signal", "ready",
        "long", "short", "provisional",
    )  # fmt: skip
    res = eng.step([("A", int(t[-1]) + BAR, 2.9)])
    assert res.long_events.dtype == np.bool_ and res.short_events.dtype == np.bool_
    assert res.bar_index.dtype == np.int64 and res.signal.dtype == np.float64
    assert res.records()[0].keys() == set(res.column_names)
    with pytest.raises(schema.OutputNotRequestedError, match="'layers' outputs were not"):
        res.layer1_signals  # noqa: B018
    with pytest.raises(AttributeError):  # an AttributeError: hasattr/getattr work
        res.growth  # noqa: B018
    assert np.isnan(res.outputs[:, 1:13]).all()  # the row view: unrequested columns NaN
    eng.request_outputs("layers")
    assert eng.outputs == ("layers",)
    eng.request_outputs()
    assert eng.outputs == schema.ALL_OUTPUTS
    eng.outputs = ["growth", "signal"]
    assert eng.outputs == ("signal", "growth")  # canonical order
    with pytest.raises(ValueError, match="unknown \\['signals'\\]"):
        eng.outputs = "signals"
    with pytest.raises(ValueError, match="outputs must be"):
        Engine(backend="cpu", outputs=["layer"])


def test_restore_takes_the_outputs():
    eng = Engine(ATCParams(cutout=2), backend="cpu", outputs="all")
    eng.warmup({"A": (T0 + BAR * np.arange(4), [1.0, 2.0, 3.0, 2.5])})
    blob = eng.snapshot()
    assert Engine.restore(blob, backend="cpu").outputs == schema.DEFAULT_OUTPUTS
    assert Engine.restore(blob, backend="cpu", outputs="growth").outputs == ("growth",)


def _results(outputs):
    eng = Engine(ATCParams(cutout=2), backend="cpu", outputs=outputs)
    t = T0 + BAR * np.arange(12)
    closes = 100 + np.cumsum(np.sin(np.arange(12)))
    first = eng.warmup({"A": (t[:8], closes[:8]), "B": (t[:8], closes[:8] * 1.1)})
    rest = [eng.step([("A", int(t[j]), closes[j]), ("B", int(t[j]), 1.1 * closes[j])])
            for j in range(8, 12)]  # fmt: skip
    return [first, *rest]


@pytest.mark.parametrize("outputs", [None, ("layers", "growth"), "all"], ids=repr)
def test_writers_and_frames_take_the_subset(tmp_path, outputs):
    import pyarrow.parquet as pq

    results = _results(outputs)
    names = list(schema.columns_for(schema.resolve_outputs(outputs)))
    full = _results("all")
    want = {n: np.concatenate([r.columns()[n] for r in full]) for n in names}
    paths = {fmt: tmp_path / f"out.{fmt}" for fmt in ("jsonl", "csv", "parquet")}
    for path in paths.values():
        with open_writer(path, columns=tuple(names)) as writer:
            for r in results:
                writer.write(r)
    lines = [json.loads(x) for x in paths["jsonl"].read_text().splitlines()]
    assert all(list(row) == names for row in lines)
    assert [row["bar_index"] for row in lines] == want["bar_index"].tolist()
    header = paths["csv"].read_text().splitlines()[0]
    assert header.split(",") == names
    table = pq.read_table(paths["parquet"])
    assert table.column_names == names
    for name in names:
        got = table.column(name).to_numpy()
        if name == "time":
            got = got.astype("datetime64[ms]").astype(np.int64)
        if want[name].dtype.kind == "f":
            assert np.array_equal(got, want[name], equal_nan=True), name
            floats = [np.nan if row[name] is None else row[name] for row in lines]
            assert np.array_equal(np.array(floats), want[name], equal_nan=True), name
        else:
            assert got.tolist() == want[name].tolist(), name
    frame = results[1].to_pandas()
    assert list(frame.columns) == names
    assert results[1].to_arrow().schema == schema.arrow_schema(columns=tuple(names))


def test_csv_writer_refuses_results_of_other_columns(tmp_path):
    results = _results(None)
    with open_writer(tmp_path / "x.csv") as writer:  # the header of every column
        with pytest.raises(OutputError, match="same requested outputs"):
            writer.write(results[1])


@pytest.mark.parametrize("outputs", [None, "all"], ids=repr)
def test_one_table_of_many_results_is_their_tables_joined(outputs):
    import pyarrow as pa

    results = _results(outputs)  # the warmup's rows hold NaN before the MAs are ready
    joined = pa.concat_tables([r.to_arrow() for r in results])
    assert results_to_arrow(results).equals(joined)
    with pytest.raises(ValueError, match="different columns"):
        results_to_arrow([results[0], *_results("growth")])


def test_redis_records_of_a_subset_round_trip():
    import msgspec

    from atc_stream.connectors.redis.channels import SignalBatch, message_types
    from atc_stream.core.messages import SignalRecord, records_from_result

    result = _results(("events",))[2]
    records = records_from_result(result)
    data = msgspec.json.encode(records[0])
    fields = list(json.loads(data))
    assert fields == [*result.column_names, "v"]
    record_type, batch_type = message_types(("events",))
    decoded = msgspec.json.Decoder(record_type).decode(data)
    assert decoded.long == bool(result.long_events[0]) and decoded.v == schema.SCHEMA_VERSION
    assert decoded.key == records[0].key == str(result.keys[0])  # the latest-hash field
    with pytest.raises(msgspec.ValidationError):  # the full record needs every column
        msgspec.json.Decoder(SignalRecord).decode(data)
    assert batch_type.__struct_fields__[-1] == "records"
    assert message_types("all") == (SignalRecord, SignalBatch)


def test_step_async_on_the_cpu_equals_step():
    """``step_async``/``step_arrays_async`` on the CPU: the step is applied at once, the
    result (built once) equals ``step``'s, rejections included."""
    a, b = Engine(ATCParams(cutout=2), backend="cpu"), Engine(ATCParams(cutout=2), backend="cpu")
    t = T0 + BAR * np.arange(10)
    closes = 100 + np.cumsum(np.cos(np.arange(10)))
    for eng in (a, b):
        eng.warmup({"A": (t[:6], closes[:6]), "B": (t[:6], closes[:6] + 1)})
    pending = a.step_async([("A", int(t[6]), closes[6]), ("B", int(t[5]), 3.0)])
    assert a.stream_state(a.streams[0])["bar_index"] == 7  # applied before .result()
    want = b.step([("A", int(t[6]), closes[6]), ("B", int(t[5]), 3.0)])
    got = pending.result()
    assert got is pending.result() and [r.reason for r in got.rejected] == ["duplicate_bar"]
    for name, values in want.columns().items():
        assert np.array_equal(got.columns()[name], values, equal_nan=values.dtype.kind == "f")
    slots = np.array([a.slot_of(a.streams[1]), a.slot_of(a.streams[0])])
    got = a.step_arrays_async(slots, t[[6, 7]], closes[[6, 7]]).result()
    want = b.step_arrays(slots, t[[6, 7]], closes[[6, 7]])
    assert np.array_equal(got.signal, want.signal, equal_nan=True)


#: floats whose JSON is easy to get wrong: NaN and infinities (null), signed zero,
#: extremes, and values whose shortest repr needs 17 digits or an exponent
_AWKWARD = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-300, 5e-324, 1.7976931348623157e308,
            0.1 + 0.2, 1e16, 123456789.12345678, -2.5e-7]  # fmt: skip


@pytest.mark.parametrize("outputs", SUBSETS, ids=repr)
@pytest.mark.parametrize("provisional", [False, True])
def test_encoded_rows_and_records_are_the_structs_json(outputs, provisional):
    """The encoded rows and records (each cut from the other when that came first) are
    byte for byte what msgspec writes for their structs, awkward floats included."""
    import msgspec

    from atc_stream.core.messages import (
        encoded_records,
        encoded_rows,
        records_from_result,
        rows_from_result,
    )

    step = _results(outputs)[2]
    n = len(step)
    rows = np.arange(n).repeat(len(_AWKWARD))  # every row with every awkward value
    result = step.take(rows)
    result.provisional = provisional
    awkward = np.resize(_AWKWARD, len(rows))
    for values in result.fields.values():
        if values.dtype.kind == "f":
            values[:] = awkward.reshape((-1,) + (1,) * (values.ndim - 1))
            assert np.isnan(values).any() and np.isinf(values).any()
    result.closes = result.closes * np.resize([1.0, 0.1 + 0.2, 1e-300], len(rows))
    encode = msgspec.json.encode
    want_records = [encode(r) for r in records_from_result(result)]
    want_rows = [encode(r) for r in rows_from_result(result)]
    assert encoded_records(result) == want_records
    assert encoded_rows(result) == want_rows
    fresh = step.take(rows)  # the rows encoded first, the records made from them
    fresh.provisional = provisional
    fresh.fields, fresh.closes = result.fields, result.closes
    assert encoded_rows(fresh) == want_rows
    assert encoded_records(fresh) == want_records


@pytest.mark.parametrize("outputs", ["all", "signal"])
def test_records_cut_from_their_array_even_when_a_symbol_holds_a_brace(outputs):
    """A batch's array of records is encoded in one call and the single records cut from
    it at each object's ``}``. A symbol holding ``}`` (or ``},{``) would cut them in the
    wrong place: they are then encoded one by one, byte for byte msgspec's."""
    import msgspec

    from atc_stream.core.messages import (
        encoded_records,
        encoded_records_array,
        encoded_rows,
        records_from_result,
        rows_from_result,
    )

    times = np.arange(40, dtype=np.int64) * 60_000
    for symbols in (["AAA", "BBB", "C"], ["A}", 'B},{"x":1', "C"], ["A", "B", "C}"]):
        engine = Engine(outputs=outputs)
        result = engine.warmup({s: (times, np.linspace(1.0, 2.0 + k, 40)) for k, s in
                                enumerate(symbols)})  # fmt: skip
        want = [msgspec.json.encode(r) for r in records_from_result(result)]
        array = encoded_records_array(result)
        assert array == msgspec.json.encode([msgspec.Raw(r) for r in want])
        assert encoded_records(result) == want
        assert encoded_rows(result) == [msgspec.json.encode(r) for r in rows_from_result(result)]
    empty = Engine(outputs=outputs).step([])
    assert encoded_records_array(empty) == b"[]" and encoded_records(empty) == []
