#!/usr/bin/env python
"""Backtest benchmark: what the strategy kernels add to ATC, the portfolio simulation
against vectorbt's, and the wall time of an ``atc-stream sweep``.

Run from the repository root::

    .venv/bin/python benchmarks/bench_backtest.py              # full sizes (a few minutes)
    .venv/bin/python benchmarks/bench_backtest.py --quick      # small sizes (< 1 min)

Three tables, every figure the median of ``--repeats`` samples with the min-max spread
(paths of one table alternate between samples; compilation is excluded: every path runs
once untimed first):

(a) ``STREAMS`` random-walk OHLC series x ``BARS`` bars, default ``ATCParams`` and one
    strategy (2 % stop, 10 bp fee, 5 bp slippage): ATC alone (the warmup kernel keeping
    every bar's events, as ``backtest()`` runs it) against ``atc_stream.backtest`` end to
    end (ATC, the strategy kernels and the result tables); the ratio is the backtest's
    share of the whole.
(b) the portfolio simulation alone on the same signals, fills and costs: our strategy
    kernel (``kernels/backtest_cpu.run_backtest``) against vectorbt 1.2's
    ``Portfolio.from_signals`` (price = open, signals shifted one bar, reversal on the
    opposite signal, ``sl_stop`` 2 %, fees and slippage); vectorbt's stop rules differ in
    the three ways docs/spec.md lists, so the trades are not compared here (tests do that
    where the rules coincide).
(c) ``atc-stream sweep`` of ``SWEEP_SYMBOLS`` symbols x 100 parameter sets (25 ATC sets
    x 4 strategies) on a Parquet file, wall time of a fresh process, default options.
(d) paper trading: ``Engine.step`` of one OHLC bar for each of 1,000 symbols (default
    ``ATCParams``, the strategy above) given as a pandas DataFrame, an Arrow table and the
    same rows as ``(symbol, time, open, high, low, close)`` tuples; one engine per form,
    the forms alternate bar by bar, the inputs are built before the clock starts.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atc_stream import ATCParams, Strategy, backtest  # noqa: E402
from atc_stream.engine.backends import make_backend  # noqa: E402
from atc_stream.engine.backtest import _signals  # noqa: E402
from atc_stream.kernels.backtest_cpu import run_backtest  # noqa: E402
from atc_stream.state.arrays import StateStore  # noqa: E402

STRATEGY = Strategy(stop=0.02, fee_bps=10, slippage_bps=5)
T0 = 1_700_000_040_000
MINUTE = 60_000


def random_ohlc(streams: int, bars: int, seed: int = 2026) -> dict[str, np.ndarray]:
    """Random-walk bars on a 0.01 grid: ``(streams, bars)`` open, high, low, close."""
    rng = np.random.default_rng(seed)
    close = np.round(100 + np.cumsum(rng.normal(0, 0.4, (streams, bars)), axis=1), 2)
    close = np.maximum(close, 1.0)
    open_ = np.round(np.maximum(close + rng.normal(0, 0.2, close.shape), 1.0), 2)
    spread = np.abs(rng.normal(0, 0.3, close.shape))
    high = np.round(np.maximum(open_, close) + spread, 2)
    low = np.round(np.maximum(np.minimum(open_, close) - spread, 0.5), 2)
    return {"open": open_, "high": high, "low": low, "close": close}


def long_table(ohlc: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    streams, bars = ohlc["close"].shape
    return {
        "symbol": np.repeat([f"S{i:04d}" for i in range(streams)], bars).astype(object),
        "time": np.tile(T0 + MINUTE * np.arange(bars, dtype=np.int64), streams),
        **{k: v.reshape(-1) for k, v in ohlc.items()},
    }


def signals(ohlc: dict[str, np.ndarray]):
    """ATC ready/long/short of every series, as ``backtest()`` computes them."""
    streams, bars = ohlc["close"].shape
    store = StateStore(capacity=streams)
    backend = make_backend("cpu", store)
    times = np.tile(T0 + MINUTE * np.arange(bars, dtype=np.int64), (streams, 1))
    lengths = np.full(streams, bars, np.int64)
    out = _signals(backend, store, [ATCParams()], times, ohlc["close"], lengths)
    backend.close()
    return out


def simulate(ohlc, ready, longs, shorts):
    streams, bars = ohlc["close"].shape
    s = STRATEGY
    index = np.arange(streams, dtype=np.int64)
    return run_backtest(
        ohlc["open"], ohlc["high"], ohlc["low"], ohlc["close"], np.full(streams, bars, np.int64),
        ready, longs, shorts, index, index, np.zeros(streams, np.int64),
        np.array([[s.stop, s.take_profit, s.fee, s.slippage]]),
        np.array([[s.max_hold, s.long_target, s.short_target]], np.int64),
    )  # fmt: skip


def vectorbt_simulate(vbt, pd, ohlc, ready, longs, shorts):
    def next_open(events):
        shifted = np.zeros_like(events)
        shifted[:, 1:] = events[:, :-1] & ready[:, :-1]
        return pd.DataFrame(shifted.T)

    none = pd.DataFrame(np.zeros_like(ready).T)
    return vbt.Portfolio.from_signals(
        close=pd.DataFrame(ohlc["close"].T), price=pd.DataFrame(ohlc["open"].T),
        entries=next_open(longs), exits=none, short_entries=next_open(shorts), short_exits=none,
        upon_opposite_entry="reverse", size=np.inf, init_cash=1.0, fees=STRATEGY.fee,
        slippage=STRATEGY.slippage, sl_stop=STRATEGY.stop, stop_entry_price="fillprice",
        freq="1min",
    ).value()  # fmt: skip


def timed(paths: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Samples per path; paths alternate (rotated each repeat); one untimed run first."""
    for run in paths.values():
        run()
    samples: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            paths[name]()
            samples[name].append(time.perf_counter() - t0)
    return samples


def duration(seconds: float) -> str:
    return f"{seconds:.3f} s" if seconds >= 1 else f"{seconds * 1e3:.2f} ms"


def table(title: str, samples: dict[str, list[float]], units: float, unit: str) -> None:
    print(f"\n### {title}\n")
    print(f"load average: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("| path | median | min-max | throughput | ratio to first |")
    print("|---|---:|---:|---:|---:|")
    base = statistics.median(next(iter(samples.values())))
    for name, values in samples.items():
        med = statistics.median(values)
        print(
            f"| {name} | {duration(med)} | {duration(min(values))}-{duration(max(values))} | "
            f"{units / med:,.0f} {unit} ({med / units * 1e9:.0f} ns each) | {med / base:.3f} |"
        )
    sys.stdout.flush()


def sweep_wall_time(symbols: int, bars: int, repeats: int) -> list[float]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "bars.parquet"
        columns = long_table(random_ohlc(symbols, bars, seed=7))
        columns["time"] = columns["time"].astype("datetime64[ms]")
        pq.write_table(pa.table({k: list(v) if k == "symbol" else v for k, v in columns.items()}),
                       data)  # fmt: skip
        grid = Path(tmp) / "grid.toml"
        grid.write_text(
            "[atc]\nema_len = [14, 20, 28, 34, 40]\nLa = [0.01, 0.02, 0.03, 0.04, 0.05]\n"
            "[strategy]\nstop = [0.0, 0.02]\nfee_bps = [0.0, 10.0]\n"
        )
        exe = Path(sys.executable).with_name("atc-stream")
        command = [str(exe), "sweep", str(data), "--grid", str(grid), "--no-progress"]
        walls = []
        for r in range(repeats + 1):
            out = Path(tmp) / f"out{r}"
            t0 = time.perf_counter()
            done = subprocess.run([*command, "-o", str(out)], capture_output=True, text=True)
            walls.append(time.perf_counter() - t0)
            if done.returncode != 0:
                raise SystemExit(f"atc-stream sweep failed:\n{done.stderr[-2000:]}")
        return walls[1:]  # the first run may compile the kernels into the cache


def paper_step_samples(symbols: int, steps: int) -> dict[str, list[float]]:
    """Seconds of each ``Engine.step`` of one bar per symbol, per input form (the first
    bar untimed: it compiles)."""
    import pandas as pd
    import pyarrow as pa

    from atc_stream import Engine

    ohlc = random_ohlc(symbols, steps + 1, seed=11)
    names = [f"S{i:04d}" for i in range(symbols)]

    def rows(j: int) -> list[tuple]:
        time_ms = T0 + MINUTE * j
        prices = [ohlc[k][:, j].tolist() for k in ("open", "high", "low", "close")]
        return [(s, time_ms, *p) for s, *p in zip(names, *prices, strict=True)]

    def table_of(j: int) -> dict[str, object]:
        prices = {k: ohlc[k][:, j].copy() for k in ("open", "high", "low", "close")}
        return {"symbol": names, "time": np.full(symbols, T0 + MINUTE * j), **prices}

    forms: dict[str, Callable[[int], object]] = {
        "pandas DataFrame": lambda j: pd.DataFrame(table_of(j)),
        "Arrow table": lambda j: pa.table(table_of(j)),
        "tuples": rows,
    }
    engines = {}
    for name in forms:
        engines[name] = Engine(ATCParams(), backend="cpu", strategies=[STRATEGY])
        for symbol in names:
            engines[name].add_symbol(symbol)
    inputs = {name: [make(j) for j in range(steps + 1)] for name, make in forms.items()}
    samples: dict[str, list[float]] = {name: [] for name in forms}
    order = list(forms)
    for j in range(steps + 1):
        for name in order[j % len(order) :] + order[: j % len(order)]:
            t0 = time.perf_counter()
            result = engines[name].step(inputs[name][j])
            if j:
                samples[name].append(time.perf_counter() - t0)
            assert not result.rejected, result.rejected[:3]
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (< 1 min)")
    parser.add_argument("--repeats", type=int, default=3, help="timed samples per path")
    parser.add_argument("--skip", default="", help="sections to skip: a,b,c,d")
    args = parser.parse_args(argv)
    skip = set(args.skip.split(","))
    streams, bars = (100, 1000) if args.quick else (1000, 5000)
    sweep_symbols, sweep_bars = (10, 500) if args.quick else (100, 2000)
    print("## atc-stream backtest benchmark\n")
    print(f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
          f"Python {platform.python_version()}")  # fmt: skip
    print(f"- workload: {streams} random-walk OHLC series x {bars} bars; strategy {STRATEGY}")
    ohlc = random_ohlc(streams, bars)
    units = streams * bars
    if "a" not in skip:
        table_of_bars = long_table(ohlc)
        samples = timed(
            {
                "ATC alone (warmup kernel, every bar's events)": lambda: signals(ohlc),
                "ATC + backtest (`atc_stream.backtest`)": lambda: backtest(
                    table_of_bars, ATCParams(), STRATEGY
                ),
            },
            args.repeats,
        )
        table("(a) ATC alone vs ATC + backtest", samples, units, "stream-bars/s")
    if "b" not in skip:
        ready, longs, shorts = signals(ohlc)
        paths: dict[str, Callable[[], object]] = {
            "atc-stream strategy kernel (`run_backtest`)": lambda: simulate(
                ohlc, ready, longs, shorts
            )
        }
        try:
            import pandas as pd
            import vectorbt as vbt

            paths["vectorbt 1.2 `Portfolio.from_signals`"] = lambda: vectorbt_simulate(
                vbt, pd, ohlc, ready, longs, shorts
            )
        except ImportError:
            print("\n(vectorbt not installed: its row is left out)")
        table("(b) portfolio simulation alone", timed(paths, args.repeats), units, "stream-bars/s")
    if "c" not in skip:
        walls = sweep_wall_time(sweep_symbols, sweep_bars, args.repeats)
        table(
            f"(c) `atc-stream sweep`: {sweep_symbols} symbols x 100 sets x {sweep_bars} bars, "
            "fresh process",
            {"atc-stream sweep (wall)": walls},
            sweep_symbols * 100 * sweep_bars,
            "stream-bars/s",
        )
    if "d" not in skip:
        steps = 20 if args.quick else 100
        table(
            f"(d) paper trading: `Engine.step` of a 1,000-row OHLC bar table, {steps} steps",
            paper_step_samples(1000, steps),
            1000,
            "rows/s",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
