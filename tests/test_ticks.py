"""Tick replay: trades → OHLCV time bars (hand-checked, against pandas), files, the engine."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from atc_stream import Engine, compute
from atc_stream.connectors.replay.player import BarPlayer
from atc_stream.connectors.replay.ticks import aggregate_ticks
from atc_stream.io.readers import read_bars
from atc_stream.io.tick_reader import load_ticks, ticks_from_arrays

M = 60_000
T0 = 1_700_000_040_000  # a whole minute


def hand_ticks():
    """Two symbols, unsorted, with equal-time trades and an empty minute for A."""
    rows = [  # (time, symbol, price, size)
        (T0 + 5_000, "A", 10.0, 1.0),
        (T0 + 1_000, "A", 11.0, 2.0),  # earlier: the minute's open
        (T0 + 59_999, "A", 9.5, 0.5),  # the minute's close
        (T0 + 30_000, "B", 100.0, 3.0),
        (T0 + 30_000, "A", 12.0, 1.0),  # the minute's high
        (T0 + 2 * M, "A", 13.0, 4.0),  # minute 1 is empty for A
        (T0 + 2 * M + 10, "A", 12.5, 1.0),
        (T0 + 2 * M + 10, "A", 12.0, 1.0),  # same ms: file order decides the close
        (T0 + M, "B", 101.0, 1.0),
        (T0 + M + 1, "B", 99.0, 2.0),
    ]
    t, s, p, z = zip(*rows, strict=True)
    return ticks_from_arrays(list(t), list(s), list(p), list(z))


def bars_by_key(bars):
    return {
        (sym, int(t)): (o, h, lo, c, v, int(n))
        for sym, t, o, h, lo, c, v, n in zip(
            bars.symbols,
            bars.times,
            bars.open,
            bars.high,
            bars.low,
            bars.close,
            bars.volume,
            bars.trades,
            strict=True,
        )  # fmt: skip
    }


def test_hand_checked_skip_and_carry():
    ticks = hand_ticks()
    skip = bars_by_key(aggregate_ticks(ticks, "1m"))
    assert skip == {
        ("A", T0): (11.0, 12.0, 9.5, 9.5, 4.5, 4),
        ("A", T0 + 2 * M): (13.0, 13.0, 12.0, 12.0, 6.0, 3),
        ("B", T0): (100.0, 100.0, 100.0, 100.0, 3.0, 1),
        ("B", T0 + M): (101.0, 101.0, 99.0, 99.0, 3.0, 2),
    }
    carry = bars_by_key(aggregate_ticks(ticks, "1m", empty="carry"))
    # A's empty minute: previous close, zero volume, no trades; B has no bar after its last
    assert carry == {**skip, ("A", T0 + M): (9.5, 9.5, 9.5, 9.5, 0.0, 0)}
    # 2-minute bars: bar time = interval start (epoch-aligned)
    two = bars_by_key(aggregate_ticks(ticks, 2 * M))
    start = T0 - T0 % (2 * M)
    assert start == T0  # T0 is on an even minute
    assert two[("A", T0)] == (11.0, 12.0, 9.5, 9.5, 4.5, 4)
    assert two[("B", T0)] == (100.0, 101.0, 99.0, 99.0, 6.0, 3)
    table = aggregate_ticks(ticks, "1m").to_bar_table()  # time-major, as a feed delivers
    assert table.times.tolist() == [T0, T0, T0 + M, T0 + 2 * M]
    assert table.symbols.tolist() == ["A", "B", "B", "A"]


def random_ticks(n=60_000, n_symbols=7, seed=0, span_ms=6 * 3_600_000):
    rng = np.random.default_rng(seed)
    times = T0 + np.sort(rng.integers(0, span_ms, n))
    times[rng.random(n) < 0.1] -= 7  # some out-of-order ticks
    # sparse symbols: empty minutes happen
    weights = np.array([40, 20, 10, 5, 2, 1, 0.2][:n_symbols], float)
    codes = rng.choice(n_symbols, n, p=weights / weights.sum())
    names = np.array([f"S{i}" for i in range(n_symbols)])
    prices = np.round(50 + rng.normal(0, 1, n).cumsum() * 0.05, 2)
    prices = np.abs(prices) + 1
    sizes = np.round(rng.exponential(1.0, n), 3)
    return times, names[codes], prices, sizes


@pytest.mark.parametrize("interval,rule", [("1m", "1min"), ("5m", "5min"), ("1h", "1h")])
@pytest.mark.parametrize("empty", ["skip", "carry"])
def test_matches_pandas_resample(interval, rule, empty):
    pd = pytest.importorskip("pandas")
    times, symbols, prices, sizes = random_ticks()
    bars = aggregate_ticks(ticks_from_arrays(times, symbols, prices, sizes), interval, empty=empty)
    df = pd.DataFrame(
        {"symbol": symbols, "price": prices, "size": sizes},
        index=pd.to_datetime(times, unit="ms"),
    )
    n_total = 0
    for sym, g in df.groupby("symbol"):
        g = g.sort_index(kind="stable")
        ohlc = g["price"].resample(rule).ohlc()
        vol = g["size"].resample(rule).sum()
        count = g["price"].resample(rule).count()
        if empty == "skip":
            keep = count > 0
            ohlc, vol, count = ohlc[keep], vol[keep], count[keep]
        else:  # carry: previous close, zero volume
            close = ohlc["close"].ffill()
            ohlc = ohlc.apply(lambda col, close=close: col.fillna(close))
        mine = bars.symbols == sym
        expect_times = ohlc.index.values.astype("datetime64[ms]").astype(np.int64)
        assert np.array_equal(bars.times[mine], expect_times), sym
        for col in ("open", "high", "low", "close"):
            assert np.array_equal(getattr(bars, col)[mine], ohlc[col].to_numpy()), (sym, col)
        assert np.allclose(bars.volume[mine], vol.to_numpy(), rtol=1e-12, atol=1e-9)
        assert np.array_equal(bars.trades[mine], count.to_numpy())
        n_total += int(mine.sum())
    assert n_total == len(bars)
    if empty == "carry" and interval != "1h":
        assert (bars.trades == 0).any()  # the sparse symbols have empty intervals


def test_bad_ticks_are_counted_and_dropped(tmp_path):
    csv = tmp_path / "trades.csv"
    csv.write_text(
        "time,symbol,price,size\n"
        f"{T0},BTC,100.5,1\n"
        f"{T0 + 1},BTC,abc,1\n"  # bad price
        f"{T0 + 2},BTC,-3,1\n"  # bad price
        f"{T0 + 3},BTC,101,-1\n"  # bad size
        f"{T0 + 4},BTC,inf,1\n"  # bad price
        f"soon,BTC,101,1\n"  # bad time
        f"{T0 + 5},,101,1\n"  # no symbol
        f"{T0 + 6},ETH,20,0\n"  # zero size is fine
        f"{T0 + M},BTC,99,2\n"
    )
    ticks = load_ticks(csv)
    assert dict(ticks.rejected) == {
        "bad_price": 3,
        "bad_size": 1,
        "bad_time": 1,
        "bad_symbol": 1,
    }
    assert ticks.names == ["BTC", "ETH"] and len(ticks) == 3
    bars = aggregate_ticks(ticks, "1m")
    assert bars_by_key(bars) == {
        ("BTC", T0): (100.5, 100.5, 100.5, 100.5, 1.0, 1),
        ("BTC", T0 + M): (99.0, 99.0, 99.0, 99.0, 2.0, 1),
        ("ETH", T0): (20.0, 20.0, 20.0, 20.0, 0.0, 1),
    }
    assert bars.rejected == ticks.rejected
    with pytest.raises(ValueError, match="interval"):
        aggregate_ticks(ticks, "1M")
    with pytest.raises(ValueError, match="empty"):
        aggregate_ticks(ticks, "1m", empty="zero")
    with pytest.raises(ValueError, match="price"):
        load_ticks(csv, price_column="px")


def test_csv_parquet_and_directory_agree(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    times, symbols, prices, sizes = random_ticks(n=5_000, n_symbols=3, seed=4)
    reference = aggregate_ticks(ticks_from_arrays(times, symbols, prices, sizes), "1m")
    table = pa.table({"time": times, "symbol": symbols, "price": prices, "size": sizes})
    pq.write_table(table, tmp_path / "all.parquet")
    with open(tmp_path / "all.csv", "w") as f:
        f.write("time,symbol,price,size\n")
        for row in zip(times.tolist(), symbols.tolist(), prices.tolist(), sizes, strict=True):
            f.write(",".join(map(str, row)) + "\n")
    per_symbol = tmp_path / "per_symbol"
    per_symbol.mkdir()
    for sym in np.unique(symbols):  # no symbol column: symbol = file stem
        m = symbols == sym
        sub = pa.table({"time": times[m], "price": prices[m], "size": sizes[m]})
        pq.write_table(sub, per_symbol / f"{sym}.parquet")
    iso = tmp_path / "iso.csv"  # ISO-8601 times
    with open(iso, "w") as f:
        f.write("time,symbol,price,size\n")
        for t, s, p, z in zip(times[:50].tolist(), symbols, prices, sizes, strict=False):
            f.write(f"{np.datetime64(t, 'ms')}Z,{s},{p},{z}\n")
    for path in (tmp_path / "all.parquet", tmp_path / "all.csv", per_symbol):
        got = aggregate_ticks(load_ticks(path), "1m")
        assert bars_by_key(got) == bars_by_key(reference), path
    got = aggregate_ticks(load_ticks(iso), "1m")
    want = aggregate_ticks(
        ticks_from_arrays(times[:50], symbols[:50], prices[:50], sizes[:50]), "1m"
    )
    assert bars_by_key(got) == bars_by_key(want)


def test_ticks_through_engine_equal_compute():
    times, symbols, prices, sizes = random_ticks(n=30_000, n_symbols=4, seed=2)
    bars = aggregate_ticks(ticks_from_arrays(times, symbols, prices, sizes), "1m", empty="carry")
    table = bars.to_bar_table()
    engine = Engine(backend="cpu", interval="1m", outputs="all")
    results = []
    summary = BarPlayer(engine, table, warmup_bars=100, on_result=results.append).run()
    assert summary.warmup_bars + summary.step_bars == len(bars)
    assert not summary.rejected
    last = {}
    for res in results:
        for sym, t, sig in zip(res.symbols, res.times.tolist(), res.signal, strict=True):
            last.setdefault(sym, []).append((t, sig))
    for sym in bars.names:
        mine = bars.symbols == sym
        full = compute(bars.close[mine])["signal"]
        got = dict(last[sym])
        for j, t in enumerate(bars.times[mine].tolist()):
            if t in got:
                assert np.array_equal(got[t], full[j], equal_nan=True), (sym, t)
        assert np.array_equal(got[int(bars.times[mine][-1])], full[-1], equal_nan=True)


def test_bar_directory_and_paced_replay(tmp_path):
    rng = np.random.default_rng(5)
    for sym in ("AAA", "BBB"):
        closes = np.round(100 * np.exp(np.cumsum(rng.normal(0, 0.01, 40))), 2)
        lines = ["time,close"] + [f"{T0 + i * 1000},{c}" for i, c in enumerate(closes)]
        (tmp_path / f"{sym}.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "notes.txt").write_text("ignored")
    table = read_bars(tmp_path)
    assert table.symbol_names == ["AAA", "BBB"] and len(table) == 80
    assert np.all(np.diff(table.times) >= 0)  # time order across files
    engine = Engine(backend="cpu", interval="1s", outputs="all")
    t = time.perf_counter()
    summary = BarPlayer(engine, table, warmup_bars=10, speed=100.0).run()
    elapsed = time.perf_counter() - t
    # 30 stepped bar times 1 s apart at 100x: ~0.29 s of pacing
    assert summary.step_bars == 60 and elapsed >= 0.25
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no .csv or .parquet"):
        read_bars(tmp_path / "empty")


def test_cli_replay_ticks_and_directory(tmp_path):
    from typer.testing import CliRunner

    from atc_stream.app.cli import app

    times, symbols, prices, sizes = random_ticks(n=8_000, n_symbols=3, seed=6)
    ticks_csv = tmp_path / "ticks.csv"
    with open(ticks_csv, "w") as f:
        f.write("ts,sym,px,qty\n")
        for row in zip(times.tolist(), symbols.tolist(), prices.tolist(), sizes, strict=True):
            f.write(",".join(map(str, row)) + "\n")
    out = tmp_path / "signals.jsonl"
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "replay", "--ticks", str(ticks_csv), "--interval", "5m", "--empty", "carry",
            "--time-column", "ts", "--symbol-column", "sym", "--price-column", "px",
            "--size-column", "qty", "--backend", "cpu", "--no-progress", "-o", str(out),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    bars = aggregate_ticks(ticks_from_arrays(times, symbols, prices, sizes), "5m", empty="carry")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(bars)
    assert f"8000 ticks -> {len(bars)} 5m bars of 3 symbols" in result.stderr
    for sym in bars.names:
        full = compute(bars.close[bars.symbols == sym])["signal"]
        mine = [r["signal"] for r in rows if r["symbol"] == sym]
        assert np.array_equal(np.array(mine, float), full, equal_nan=True)
    # neither or both inputs: a usage error
    assert runner.invoke(app, ["replay", "--backend", "cpu"]).exit_code == 2
    both = runner.invoke(app, ["replay", str(ticks_csv), "--ticks", str(ticks_csv)])
    assert both.exit_code == 2
    # a directory of per-symbol bar files
    bar_dir = tmp_path / "bars"
    bar_dir.mkdir()
    for sym in bars.names:
        m = bars.symbols == sym
        lines = ["time,close"] + [
            f"{t},{c!r}" for t, c in zip(bars.times[m], bars.close[m].tolist(), strict=True)
        ]
        (bar_dir / f"{sym}.csv").write_text("\n".join(lines) + "\n")
    out2 = tmp_path / "signals2.jsonl"
    result = runner.invoke(
        app,
        ["replay", str(bar_dir), "--interval", "5m", "--backend", "cpu", "--no-progress",
         "-o", str(out2)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows2 = [json.loads(line) for line in out2.read_text().splitlines()]
    key = lambda r: (r["symbol"], r["time"])  # noqa: E731
    assert sorted(rows2, key=key) == sorted(rows, key=key)
