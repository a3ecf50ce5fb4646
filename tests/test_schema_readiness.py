"""One output schema and readiness.

- The same bars through ``compute``, ``StepResult.to_pandas()``/``to_arrow()``, the
  JSONL and Parquet sinks and Redis messages give the same columns and the same values.
- ``ready`` flips on exactly the bar docs/spec.md ("Warm-up and readiness") says, checked
  against the reference's own NaN pattern, for every robustness and custom lengths, in
  ``compute``, ``Engine.step`` and ``stream_state``.
- Events of rows that are not ready are neither counted (CLI summary) nor published
  (Redis events channel) by default; ``--events-before-ready`` keeps them.
"""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from redis_fixtures import redis_server, redis_url  # noqa: F401
from typer.testing import CliRunner

from atc_stream import ATCParams, Engine, compute
from atc_stream.app.cli import app
from atc_stream.core.params import FAMILIES, LENGTHS_PER_FAMILY
from atc_stream.core.reference import compute_reference
from atc_stream.core.schema import COLUMN_TYPES, COLUMNS, params_metadata, ready_bar
from atc_stream.io.writers import CsvWriter, JsonlWriter, ParquetWriter

SHORT = ATCParams(ema_len=8, hma_len=9, wma_len=10, dema_len=8, lsma_len=7, kama_len=11)
T0 = 1_700_000_040_000
STEP_MS = 60_000


def walk(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.round(100 * np.exp(np.cumsum(rng.normal(0, 0.01, n))), 2)


BARS = {"AAA": walk(3, 70), "BBB": walk(4, 70)}
TIMES = T0 + STEP_MS * np.arange(200, dtype=np.int64)


def stepped_results(params: ATCParams = SHORT, bars=BARS):
    """Every bar of every symbol, one ``step`` per bar time: the StepResults."""
    eng = Engine(params, backend="cpu", outputs="all")
    for symbol in bars:
        eng.add_symbol(symbol)
    results = []
    for i, t in enumerate(TIMES[: len(next(iter(bars.values())))]):
        res = eng.step([(s, int(t), float(c[i])) for s, c in bars.items()])
        assert not res.rejected
        results.append(res)
    return eng, results


# -- one schema --------------------------------------------------------------------------


def _normalise(frame: pd.DataFrame) -> pd.DataFrame:
    """Times as int epoch ms, None as NaN, sorted by (symbol, time): comparable frames."""
    frame = frame.copy()
    if pd.api.types.is_datetime64_any_dtype(frame["time"]):
        assert str(frame["time"].dt.tz) == "UTC"
        frame["time"] = frame["time"].astype("int64")
    for name, kind in COLUMN_TYPES.items():
        if kind == "float":
            frame[name] = frame[name].astype(np.float64)
        elif kind == "bool":
            assert frame[name].isin([True, False]).all(), name
            frame[name] = frame[name].astype(bool)
        elif kind in ("int", "time"):
            frame[name] = frame[name].astype(np.int64)
        else:
            frame[name] = frame[name].astype(str)
    return frame.sort_values(["symbol", "time"]).reset_index(drop=True)


def _assert_same_frame(got: pd.DataFrame, want: pd.DataFrame, what: str) -> None:
    assert list(got.columns) == list(COLUMNS), (what, list(got.columns))
    got, want = _normalise(got), _normalise(want)
    assert len(got) == len(want), what
    for name, kind in COLUMN_TYPES.items():
        a, b = got[name].to_numpy(), want[name].to_numpy()
        if kind == "float":
            same = (a == b) | (np.isnan(a) & np.isnan(b))  # bit for bit, NaN where NaN
            assert same.all(), (what, name, np.flatnonzero(~same)[:5])
        else:
            np.testing.assert_array_equal(a, b, f"{what} {name}")


@pytest.fixture(scope="module")
def stepped():
    return stepped_results()


@pytest.fixture(scope="module")
def expected_frame(stepped):
    """compute() per symbol (times and symbol given): the reference frame of every row."""
    frames = []
    for symbol, closes in BARS.items():
        series = pd.Series(closes, index=pd.to_datetime(TIMES[: len(closes)], unit="ms", utc=True))
        frames.append(compute(series, SHORT, symbol=symbol, interval="1m"))
    return pd.concat(frames, ignore_index=True)


def test_compute_and_step_result_share_columns_and_values(stepped, expected_frame):
    _, results = stepped
    assert list(compute(BARS["AAA"], SHORT)) == list(COLUMNS)  # dict form, same names
    frame = pd.concat([r.to_pandas() for r in results], ignore_index=True)
    assert str(frame["time"].dtype) == "datetime64[ms, UTC]"
    _assert_same_frame(frame, expected_frame, "to_pandas")
    arrow = pd.concat([r.to_arrow().to_pandas() for r in results], ignore_index=True)
    _assert_same_frame(arrow, expected_frame, "to_arrow")
    records = pd.DataFrame([rec for r in results for rec in r.records()])
    _assert_same_frame(records, expected_frame, "records")


def test_jsonl_csv_and_parquet_writers_share_columns_and_values(tmp_path, stepped, expected_frame):
    eng, results = stepped
    jsonl, csv, parquet = tmp_path / "rows.jsonl", tmp_path / "rows.csv", tmp_path / "rows.parquet"
    meta = params_metadata(eng.param_sets, eng.interval)
    with (
        JsonlWriter(jsonl) as js,
        CsvWriter(csv) as cs,
        ParquetWriter(parquet, metadata=meta) as ps,
    ):
        for r in results:
            js.write(r)
            cs.write(r)
            ps.write(r)
    # CSV: header = the schema; floats written shortest-round-trip, read back exactly
    assert csv.read_text().splitlines()[0] == ",".join(COLUMNS)
    csv_frame = pd.read_csv(
        csv,
        keep_default_na=False,
        na_values={n: [""] for n, k in COLUMN_TYPES.items() if k == "float"},
    )
    _assert_same_frame(csv_frame, expected_frame, "csv")
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert all(list(row) == list(COLUMNS) for row in lines)
    _assert_same_frame(pd.DataFrame(lines), expected_frame, "jsonl")
    table = pq.read_table(parquet)
    assert str(table.schema.field("time").type) == "timestamp[ms, tz=UTC]"
    params = json.loads(table.schema.metadata[b"atc_stream.params"])
    assert [ATCParams.from_dict(p) for p in params] == [SHORT]
    _assert_same_frame(table.to_pandas(), expected_frame, "parquet")


@pytest.mark.redis
def test_redis_messages_share_columns_and_values(redis_url, stepped, expected_frame):  # noqa: F811
    from atc_stream.connectors.redis.pubsub import SignalPublisher, SignalSubscriber

    _, results = stepped
    n_rows = sum(len(r) for r in results)
    with SignalSubscriber(redis_url, all_symbols=True, as_dict=True) as sub:
        sub.wait_ready()
        publisher = SignalPublisher(redis_url, batch=False, events=False, latest=False)
        for r in results:
            publisher.publish(r)
        publisher.close()
        messages = list(sub.messages(timeout=5, limit=n_rows))
    rows = [m.data for m in messages]
    assert len(rows) == n_rows
    assert all(list(row) == [*COLUMNS, "v"] for row in rows)
    frame = pd.DataFrame(rows).drop(columns="v")
    _assert_same_frame(frame, expected_frame, "redis")


# -- readiness ---------------------------------------------------------------------------

READINESS_PARAMS = {
    "Narrow defaults": ATCParams(robustness="Narrow"),
    "Medium defaults": ATCParams(),
    "Wide defaults": ATCParams(robustness="Wide"),
    "custom: DEMA decides": ATCParams(
        ema_len=12, hma_len=20, wma_len=15, dema_len=14, lsma_len=9, kama_len=16,
        robustness="Wide",
    ),
    "custom: KAMA decides": ATCParams(
        ema_len=10, hma_len=10, wma_len=10, dema_len=8, lsma_len=10, kama_len=30,
        robustness="Narrow",
    ),
    "custom: WMA decides": ATCParams(
        ema_len=8, hma_len=8, wma_len=40, dema_len=8, lsma_len=8, kama_len=8,
    ),
    "custom: cutout decides": ATCParams(
        ema_len=10, hma_len=10, wma_len=10, dema_len=10, lsma_len=10, kama_len=10, cutout=70,
    ),
}  # fmt: skip


def ready_bar_from_reference(closes: np.ndarray, params: ATCParams) -> int:
    """The first ready bar read off the reference: every MA non-NaN (its full window),
    KAMA from bar L (its efficiency ratio reads ``c[L]``; KAMA itself is never NaN),
    and both equity layers defined (cutout)."""
    ref = compute_reference(closes, params)
    first_value = [int(np.argmax(~np.isnan(ref["ma"][:, k]))) for k in range(ref["ma"].shape[1])]
    kama = FAMILIES.index("KAMA")
    kama_lengths = params.lengths[kama]
    span = slice(kama * LENGTHS_PER_FAMILY, (kama + 1) * LENGTHS_PER_FAMILY)
    assert all(v == 0 for v in first_value[span])  # KAMA: defined from bar 0
    first_value[span] = list(kama_lengths)
    bar = max(params.cutout, *first_value)
    for family in FAMILIES:  # layer 1 and 2 are defined from there on
        assert not np.isnan(ref[f"{family}_S"][bar:]).any()
    assert not np.isnan(ref["Average_Signal"][bar:]).any()
    return bar


@pytest.mark.parametrize("name", sorted(READINESS_PARAMS))
def test_ready_flips_on_the_spec_bar(name):
    params = READINESS_PARAMS[name]
    closes = walk(9, max(ready_bar(params) + 25, 90))
    expected = ready_bar_from_reference(closes, params)
    assert ready_bar(params) == expected
    ready = compute(closes, params)["ready"]
    assert not ready[:expected].any() and ready[expected:].all(), name
    # the engine: warm up to just before, then step across the flip
    eng = Engine(params, backend="cpu", outputs="all")
    times = np.arange(closes.shape[0], dtype=np.int64)
    warm = expected - 2
    eng.warmup({"X": (times[:warm], closes[:warm])})
    key = eng.streams[0]
    assert eng.stream_state(key)["ready"] is False
    flags = []
    for t in range(warm, closes.shape[0]):
        res = eng.step([("X", int(t), float(closes[t]))])
        flags.append(bool(res.ready[0]))
        assert res.columns()["ready"][0] == flags[-1]
        assert eng.stream_state(key)["ready"] is flags[-1]
    assert flags == [t >= expected for t in range(warm, closes.shape[0])]


def test_default_ready_bar_is_66():
    assert ready_bar(ATCParams()) == 66  # DEMA(34): 2*34 - 2


# -- events of ready rows only -------------------------------------------------------------


def _event_counts(params: ATCParams, closes: dict[str, np.ndarray]) -> dict[str, int]:
    counts = {"long": 0, "short": 0, "long_all": 0, "short_all": 0}
    for c in closes.values():
        out = compute(c, params)
        for side in ("long", "short"):
            counts[side] += int((out[side] & out["ready"]).sum())
            counts[f"{side}_all"] += int(out[side].sum())
    return counts


@pytest.fixture(scope="module")
def eventful():
    """Short windows and a choppy series: events both before and after the ready bar."""
    params = ATCParams(ema_len=8, hma_len=8, wma_len=8, dema_len=20, lsma_len=8, kama_len=8)
    rng = np.random.default_rng(5)
    closes = {s: np.round(100 + np.cumsum(rng.normal(0, 1.5, 120)), 2) + 50 for s in "XY"}
    counts = _event_counts(params, closes)
    assert counts["long"] < counts["long_all"] or counts["short"] < counts["short_all"]
    assert counts["long"] > 0 and counts["short"] > 0
    return params, closes, counts


def test_cli_summary_counts_events_of_ready_rows_by_default(tmp_path, eventful):
    params, closes, counts = eventful
    bars = tmp_path / "bars.csv"
    with open(bars, "w") as f:
        f.write("symbol,time,close\n")
        for i in range(120):
            for s, c in closes.items():
                f.write(f"{s},{T0 + i * STEP_MS},{c[i]}\n")
    params_file = tmp_path / "params.json"
    params_file.write_text(json.dumps(params.to_dict()))
    runner = CliRunner(env={"COLUMNS": "240", "NO_COLOR": "1"})
    base = ["replay", str(bars), "--params", str(params_file), "--no-progress", "-o"]
    result = runner.invoke(app, [*base, str(tmp_path / "a.jsonl")])
    assert result.exit_code == 0, result.output
    unready = counts["long_all"] + counts["short_all"] - counts["long"] - counts["short"]
    assert (
        f"events           {counts['long']} long, {counts['short']} short "
        f"(ready rows; {unready} before ready not counted)"
    ) in result.output
    result = runner.invoke(app, [*base, str(tmp_path / "b.jsonl"), "--events-before-ready"])
    assert result.exit_code == 0, result.output
    assert (
        f"events           {counts['long_all']} long, {counts['short_all']} short "
        f"(incl. {unready} before ready)"
    ) in result.output


@pytest.mark.redis
@pytest.mark.parametrize("before_ready", [False, True])
def test_redis_events_channel_publishes_ready_rows_only_by_default(
    redis_url,  # noqa: F811
    eventful,
    before_ready,
):
    from atc_stream.connectors.redis.pubsub import SignalPublisher, SignalSubscriber

    params, closes, counts = eventful
    _, results = stepped_results(params, closes)
    expected = counts["long"] + counts["short"]
    if before_ready:
        expected = counts["long_all"] + counts["short_all"]
    with SignalSubscriber(redis_url, events=True) as sub:
        sub.wait_ready()
        publisher = SignalPublisher(
            redis_url, per_symbol=False, batch=False, latest=False,
            events_before_ready=before_ready,
        )  # fmt: skip
        for r in results:
            publisher.publish(r)
        publisher.close()
        events = [m.data for m in sub.messages(timeout=2)]
    assert len(events) == expected
    assert all(e.long or e.short for e in events)
    assert before_ready or all(e.ready for e in events)
    assert msgspec.json.decode(msgspec.json.encode(events[0]))["v"] == 2


def test_records_reuse_the_rows_json_byte_for_byte(stepped):
    """A result's records (Redis), their array (a batch message) and rows (JSONL) are
    encoded once, whichever is asked first, the others cut from it: each must be exactly
    what encoding it gives. The batch message written directly must be msgspec's
    encoding of it."""
    import msgspec

    from atc_stream.connectors.redis.channels import SignalMessages, _BatchOut
    from atc_stream.core.messages import (
        encoded_records,
        encoded_records_array,
        encoded_rows,
        records_from_result,
        rows_from_result,
    )

    _, results = stepped
    encoder = msgspec.json.Encoder()
    checked = 0
    for k, r in enumerate(results):
        want_records = [encoder.encode(x) for x in records_from_result(r)]
        want_rows = [encoder.encode(x) for x in rows_from_result(r)]
        r._encoded_rows = r._encoded_records = r._encoded_records_array = None
        order = (encoded_rows, encoded_records, encoded_records_array)
        order = order[k % 3 :] + order[: k % 3]
        for encoded in order:
            assert encoded(r) is encoded(r)  # built once per result
        assert encoded_rows(r) == want_rows and encoded_records(r) == want_records
        assert encoded_records_array(r) == encoder.encode([msgspec.Raw(x) for x in want_records])
        body = SignalMessages()._batch_commands([(k + 1, r, None)])[0].split(b"\r\n")[-2]
        raw = [msgspec.Raw(x) for x in want_records]
        stamp = msgspec.json.decode(body)["published_at"]
        assert body == encoder.encode(
            _BatchOut(seq=k + 1, published_at=stamp, count=len(raw), records=raw)
        )
        checked += len(want_rows)
    assert checked > 0
