"""Hostile and sub-millisecond tick files: ``load_ticks`` parses every time form
exactly (integer epochs in s/ms/us/ns, one unit per column, or ``time_unit``, ISO-8601 with any
fraction digits, Parquet timestamps), orders trades of one millisecond by their sub-ms
part, and rejects bad rows with counted reasons and file:line -- never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from atc_stream.connectors.replay.ticks import aggregate_ticks
from atc_stream.io.readers import InputError
from atc_stream.io.tick_reader import load_ticks

T0 = 1_700_000_040_000  # a whole minute, epoch ms
M = 60_000


def write(tmp_path: Path, text: str | bytes, name: str = "ticks.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def bars(ticks, interval="1m"):
    got = aggregate_ticks(ticks, interval)
    return [
        (s, int(t), o, h, lo, c, v, int(n))
        for s, t, o, h, lo, c, v, n in zip(
            got.symbols,
            got.times,
            got.open,
            got.high,
            got.low,
            got.close,
            got.volume,
            got.trades,
            strict=True,
        )  # fmt: skip
    ]


def iso(ms: int, extra_digits: str = "") -> str:
    """RFC 3339 text of epoch ``ms`` (UTC, 'Z'), with more fraction digits appended."""
    return str(np.datetime64(ms, "ms")) + extra_digits + "Z"


# Trades of one millisecond written out of order: the sub-ms part decides open and close.
# (ns offset from T0 + 5 ms, price)
SUB_MS_TRADES = [(700_000, 12.0), (100_000, 10.0), (900_000, 13.0), (400_000, 11.0)]
WANT = [("A", T0, 10.0, 13.0, 10.0, 13.0, 4.0, 4)]


def sub_ms_ns(offset_ns: int) -> int:
    return (T0 + 5) * 1_000_000 + offset_ns


@pytest.mark.parametrize("form", ["ns", "us", "iso_ns", "iso_us", "iso_offset"])
def test_sub_millisecond_times_keep_their_order(tmp_path, form):
    lines = ["time,symbol,price,size"]
    for offset, price in SUB_MS_TRADES:
        ns = sub_ms_ns(offset)
        text = {
            "ns": str(ns),
            "us": str(ns // 1000),
            "iso_ns": iso(ns // 1_000_000, f"{ns % 1_000_000:06d}"),
            "iso_us": iso(ns // 1_000_000, f"{ns % 1_000_000 // 1000:03d}"),
            "iso_offset": str(np.datetime64(ns + 2 * 3_600_000_000_000, "ns")) + "+02:00",
        }[form]
        lines.append(f"{text},A,{price},1")
    ticks = load_ticks(write(tmp_path, "\n".join(lines) + "\n"))
    assert ticks.bad_rows.total == 0
    assert ticks.times.tolist() == [T0 + 5] * 4
    assert bars(ticks) == WANT


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_integer_units_auto_and_explicit(tmp_path, unit):
    scale = {"s": 1, "ms": 1000, "us": 1_000_000, "ns": 1_000_000_000}[unit]
    t0 = T0 // 1000  # whole seconds
    body = "".join(f"{(t0 + 30 * i) * scale},A,{10 + i},2\n" for i in range(4))
    path = write(tmp_path, "time,symbol,price,size\n" + body)
    for time_unit in ("auto", unit):
        ticks = load_ticks(path, time_unit=time_unit)
        assert ticks.times.tolist() == [T0 + 30_000 * i for i in range(4)], time_unit
    # the wrong explicit unit gives other times, never silently the same ones
    other = "ms" if unit != "ms" else "s"
    assert load_ticks(path, time_unit=other).times.tolist() != [T0 + 30_000 * i for i in range(4)]
    with pytest.raises(InputError, match="time unit"):
        load_ticks(path, time_unit="minutes")


def test_parquet_timestamps_and_integer_ns(tmp_path):
    ns = np.array([sub_ms_ns(o) for o, _ in SUB_MS_TRADES], np.int64)
    prices = [p for _, p in SUB_MS_TRADES]
    for unit in ("ns", "us"):
        stamps = pa.array(ns // (1 if unit == "ns" else 1000), pa.int64()).cast(
            pa.timestamp(unit, tz="UTC")
        )
        pq.write_table(
            pa.table({"time": stamps, "symbol": ["A"] * 4, "price": prices, "size": [1] * 4}),
            tmp_path / f"ts_{unit}.parquet",
        )
        assert bars(load_ticks(tmp_path / f"ts_{unit}.parquet")) == WANT
    pq.write_table(
        pa.table({"time": ns, "price": prices, "size": [1.0] * 4}), tmp_path / "A.parquet"
    )
    assert bars(load_ticks(tmp_path / "A.parquet")) == WANT  # symbol = file stem


def test_bad_rows_are_counted_with_file_and_line(tmp_path):
    text = (
        "time,symbol,price,size\n"
        f"{T0},A,10,1\n"
        f",A,10,1\n"  # line 3: empty time
        f"1.7e12,A,10,1\n"  # line 4: a number, but no integer
        f"{T0 + 1},A,1_0,1\n"  # line 5: Python's float() would take it
        f"{T0 + 2},A,10\n"  # line 6: a cell short
        f"2023-11-14T25:00:00Z,A,10,1\n"  # line 7: no such hour
        f"{T0 + 3},,10,1\n"  # line 8: empty symbol
        f"{T0 + 4},A,10,{'9' * 5000}\n"  # line 9: oversized field
        f"{T0 + 5},A,10,-1\n"  # line 10: negative size
        f"{iso(T0 + M, '123')},A,11,2\n"  # fine: microseconds
    )
    ticks = load_ticks(write(tmp_path, text))
    assert dict(ticks.rejected) == {
        "bad_time": 3, "bad_price": 1, "wrong_columns": 1, "bad_symbol": 1,
        "oversized_field": 1, "bad_size": 1,
    }  # fmt: skip
    assert ticks.rejected == ticks.bad_rows.counts
    assert ticks.bad_rows.examples == [  # the first five of the file, whatever the reason
        "ticks.csv:3: bad_time: ''",
        "ticks.csv:4: bad_time: '1.7e12'",
        "ticks.csv:5: bad_price: '1_0'",
        "ticks.csv:6: wrong_columns: 3 cells, expected 4",
        "ticks.csv:7: bad_time: '2023-11-14T25:00:00Z'",
    ]
    assert "... and 3 more" in ticks.bad_rows.lines()[-1]
    assert bars(ticks) == [
        ("A", T0, 10.0, 10.0, 10.0, 10.0, 1.0, 1),
        ("A", T0 + M, 11.0, 11.0, 11.0, 11.0, 2.0, 1),
    ]


def test_bom_blank_lines_and_unused_symbols(tmp_path):
    text = f"\ufefftime,symbol,price,size\n{T0},A,10,1\n\n{T0 + 1},B,oops,1\n\n\n"
    ticks = load_ticks(write(tmp_path, text))
    assert ticks.names == ["A"] and len(ticks) == 1  # B had only a bad row
    assert dict(ticks.rejected) == {"bad_price": 1}
    assert ticks.bad_rows.examples == ["ticks.csv:4: bad_price: 'oops'"]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (f'time,symbol,price,size\n{T0},A,1,1\n{T0},"B,1,1\n', "unterminated quote"),
        (b"time,symbol,price,size\n1,\xff\xfe,1,1,1\n", "is not UTF-8 text"),
        ("", "empty file"),
        (f"when,symbol,price,size\n{T0},A,1,1\n", "no column 'time'"),
        (b"PAR1 this is no parquet file", "cannot read Parquet"),
    ],
)
def test_unreadable_damage_raises_one_line(tmp_path, content, needle):
    name = "ticks.parquet" if isinstance(content, bytes) and content.startswith(b"PAR1") else None
    path = write(tmp_path, content, *([name] if name else []))
    with pytest.raises(InputError, match=needle) as info:
        load_ticks(path)
    assert "\n" not in str(info.value)


def test_a_row_that_is_not_utf8_is_rejected_with_its_line(tmp_path, run_main):
    """One bad byte in a data row (the symbol, a price) rejects that row only: the rows
    before and after it still make their bars, and the summary counts it."""
    text = (
        b"time,symbol,price,size\n"
        + f"{T0},A,10,1\n".encode()
        + f"{T0 + 1},A\xffB,99,1\n".encode("latin-1")  # line 3: the symbol
        + f"{T0 + M},A,11,1\n".encode()
        + f"{T0 + M + 1},A,1\xe9,1\n".encode("latin-1")  # line 5: a price (Latin-1)
        + f"{T0 + 2 * M},A,12,1\n".encode()
    )
    path = write(tmp_path, text)
    ticks = load_ticks(path)
    assert dict(ticks.rejected) == {"bad_utf8": 2}
    assert ticks.bad_rows.examples == [
        "ticks.csv:3: bad_utf8: symbol: b'A\\xffB' (byte 0xff at offset 1)",
        "ticks.csv:5: bad_utf8: price: b'1\\xe9' (byte 0xe9 at offset 1)",
    ]
    assert [bar[:6] for bar in bars(ticks)] == [
        ("A", T0 + M * i, price, price, price, price) for i, price in enumerate([10.0, 11, 12])
    ]
    out = tmp_path / "signals.jsonl"
    code, err = run_main(["replay", "--ticks", str(path), "--backend", "cpu", "--no-progress",
                          "-o", str(out)])  # fmt: skip
    assert code == 0, err
    assert [json.loads(line)["close"] for line in out.read_text().splitlines()] == [10, 11, 12]
    assert "ticks.csv:3: bad_utf8: symbol: b'A\\xffB'" in err
    assert "rejected inputs  bad_utf8=2" in err


def test_cli_replay_ticks_with_nanosecond_times(tmp_path, run_main):
    lines = ["time,symbol,price,size"]
    for minute in range(30):
        for offset, price in SUB_MS_TRADES:
            ns = sub_ms_ns(offset) + minute * M * 1_000_000
            lines.append(f"{ns},A,{price + minute % 7},1")
    lines.append("soon,A,1,1")
    out = tmp_path / "signals.jsonl"
    args = ["replay", "--ticks", str(write(tmp_path, "\n".join(lines) + "\n")),
            "--backend", "cpu", "--no-progress", "-o", str(out)]  # fmt: skip
    code, err = run_main(args)
    assert code == 0, err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["time"] for r in rows] == [T0 + M * i for i in range(30)]
    assert [r["close"] for r in rows] == [13.0 + i % 7 for i in range(30)]
    assert "dropped ticks: bad_time=1" in err
    assert f"ticks.csv:{len(lines)}: bad_time: 'soon'" in err  # file:line of the row
    code, err = run_main([*args, "--strict"])  # any rejected row: exit 2
    assert code == 2 and "1 rejected rows" in err and "(--strict)" in err, err
    seconds = write(tmp_path, f"time,symbol,price,size\n{T0 // 1000},A,5,1\n", "s.csv")
    code, err = run_main(["replay", "--ticks", str(seconds), "--no-progress", "--time-unit",
                          "s", "--backend", "cpu", "-o", str(out)])  # fmt: skip
    assert code == 0, err
    assert [json.loads(x)["time"] for x in out.read_text().splitlines()] == [T0]
    bad = write(tmp_path, f'time,symbol,price,size\n{T0},A,1,1\n{T0},"B,1,1\n', "bad.csv")
    code, err = run_main(["replay", "--ticks", str(bad), "--no-progress"])
    assert code == 2 and err.strip().count("\n") == 0 and "unterminated quote" in err, err


@pytest.mark.parametrize("damage", [None, "2023-02-30T00:00:00Z", "2023-11-14"])
def test_mixed_iso_forms_and_integers_in_one_column(tmp_path, damage):
    """Every ISO form (zones, a comma, a lower-case z, CSV quotes) and integer epochs in
    one column give their exact times; an impossible date is only its own bad row."""
    times = [T0 + 1_000 * i + 7 for i in range(12)]
    forms = [
        lambda ms: iso(ms, "250"),  # with 'Z' and microseconds
        lambda ms: str(np.datetime64(ms, "ms")),  # no zone: UTC
        lambda ms: str(np.datetime64(ms + 3_600_000, "ms")).replace("T", " ") + "+01:00",
        lambda ms: '"' + str(np.datetime64(ms, "ms")).replace(".", ",") + 'z"',  # CSV-quoted
        lambda ms: str(ms * 1000 + 250),  # integer microseconds
    ]
    lines = ["time,symbol,price,size"]
    for i, ms in enumerate(times):
        lines.append(f"{forms[i % len(forms)](ms)},A,{10 + i},1")
    if damage is not None:
        lines.insert(5, f"{damage},A,99,1")
    ticks = load_ticks(write(tmp_path, "\n".join(lines) + "\n"))
    want_sub = [250_000 if i % len(forms) in (0, 4) else 0 for i in range(len(times))]
    if damage == "2023-11-14":  # a date alone is midnight UTC: a valid (early) tick
        midnight = 1_699_920_000_000
        times, want_sub = [*times[:4], midnight, *times[4:]], [*want_sub[:4], 0, *want_sub[4:]]
    assert ticks.times.tolist() == times
    assert ticks.sub_ms.tolist() == want_sub
    bad = {"bad_time": 1} if damage == "2023-02-30T00:00:00Z" else {}
    assert ticks.bad_rows.counts == bad


@pytest.mark.parametrize("row", [b"1700000000000,A,1,1", b"1700000000000,A\xff,1,1,1"])
def test_a_tick_read_returns_only_once_pyarrow_has_let_go_of_its_row_handler(
    tmp_path, reads_let_go_of_their_handler, row
):
    """An Arrow thread holding a Python object at interpreter exit aborts the process."""
    import atc_stream.io.tick_reader as tick_reader

    path = tmp_path / "ticks.csv"
    path.write_bytes(b"time,symbol,price,size\n" + row + b"\n")
    reads_let_go_of_their_handler(tick_reader, lambda: load_ticks(path))
