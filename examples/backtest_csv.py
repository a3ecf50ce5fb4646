"""Notebook-style backtest of one CSV of bars with pandas.

    python examples/backtest_csv.py [bars.csv] [--plot chart.png]

The CSV needs ``time`` (ISO or epoch) and ``close`` columns; by default the synthetic
hourly series in examples/data/sample_1h.csv (a random walk, not market data) is used.
Strategy: hold +1 after a long event and -1 after a short event, from the first ready
bar on (docs/spec.md, "Warm-up and readiness"); positions act on the next bar's return.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from atc_stream import ATCParams, compute

DEFAULT_CSV = Path(__file__).resolve().parent / "data" / "sample_1h.csv"


def load_closes(path: Path) -> pd.Series:
    """The CSV's closes as a Series on a UTC DatetimeIndex."""
    bars = pd.read_csv(path)
    times = pd.to_datetime(bars["time"], utc=True)
    return pd.Series(bars["close"].to_numpy(float), index=pd.DatetimeIndex(times), name="close")


def backtest(signals: pd.DataFrame) -> pd.DataFrame:
    """Positions from events (ready rows only) and the strategy's bar returns."""
    events = pd.Series(np.nan, index=signals.index)
    events[signals["long"] & signals["ready"]] = 1.0
    events[signals["short"] & signals["ready"]] = -1.0
    position = events.ffill().fillna(0.0)
    bar_return = signals["close"].pct_change().fillna(0.0)
    strategy = position.shift(1).fillna(0.0) * bar_return
    return pd.DataFrame({"position": position, "bar_return": bar_return, "strategy": strategy})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="?", type=Path, default=DEFAULT_CSV)
    parser.add_argument("--plot", type=Path, help="also save a chart (needs matplotlib)")
    args = parser.parse_args()

    closes = load_closes(args.csv)
    signals = compute(closes, ATCParams(), symbol=args.csv.stem)  # a DataFrame on the index
    result = backtest(signals)
    ready_from = signals.index[signals["ready"].to_numpy().argmax()]
    trades = int((result["position"].diff().fillna(0.0) != 0).sum())
    total = (1 + result["strategy"]).prod() - 1
    hold = closes.iloc[-1] / closes.loc[ready_from] - 1
    print(f"bars             {len(signals)} ({signals.index[0]} .. {signals.index[-1]})")
    print(
        f"ready from       {ready_from} (bar {int(signals['bar_index'][signals['ready']].iloc[0])})"
    )
    print(f"events (ready)   {int((signals['long'] & signals['ready']).sum())} long, "
          f"{int((signals['short'] & signals['ready']).sum())} short")  # fmt: skip
    print(f"position changes {trades}")
    print(f"strategy return  {total:+.2%}")
    print(f"buy and hold     {hold:+.2%} (from the ready bar)")
    print(signals[["close", "signal", "ready", "long", "short"]].tail(3).to_string())
    if args.plot:
        from atc_stream.app.plot import plot_signals

        plot_signals(signals).savefig(args.plot, dpi=100)
        print(f"chart            {args.plot}")


if __name__ == "__main__":
    main()
