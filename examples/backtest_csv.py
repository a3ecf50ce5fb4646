"""Backtest one CSV of bars with ``atc_stream.backtest``: fills, stops, fees, metrics.

    python examples/backtest_csv.py [bars.csv] [--stop 0.02] [--fee-bps 10] [--plot chart.png]

The CSV needs ``time`` (ISO or epoch) and ``close`` columns, and ``open``, ``high``,
``low`` when it has them; a close-only file is turned into bars that open at the
previous close (so fills happen at a price the series really had). By default the
synthetic hourly series in examples/data/sample_1h.csv (a random walk, not market data)
is used. The rules (fills at the next open, stop then take-profit inside a bar, fees on
the notional) are docs/spec.md's "Backtest" section.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from atc_stream import ATCParams, Strategy, backtest

DEFAULT_CSV = Path(__file__).resolve().parent / "data" / "sample_1h.csv"


def load_bars(path: Path) -> pd.DataFrame:
    """The CSV as a long OHLC table of one symbol (named after the file)."""
    bars = pd.read_csv(path)
    close = bars["close"].to_numpy(float)
    if {"open", "high", "low"} <= set(bars.columns):
        open_, high, low = (bars[c].to_numpy(float) for c in ("open", "high", "low"))
    else:
        open_ = np.r_[close[0], close[:-1]]
        high, low = np.maximum(open_, close), np.minimum(open_, close)
    return pd.DataFrame(
        {
            "symbol": path.stem,
            "time": pd.to_datetime(bars["time"], utc=True),
            "open": open_,
            "high": high,
            "low": low,
            "close": close,
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="?", type=Path, default=DEFAULT_CSV)
    parser.add_argument("--direction", default="long_short")
    parser.add_argument("--stop", type=float, default=0.0, help="stop, a fraction (0: none)")
    parser.add_argument("--take-profit", type=float, default=0.0)
    parser.add_argument("--fee-bps", type=float, default=10.0)
    parser.add_argument("--slippage-bps", type=float, default=5.0)
    parser.add_argument("--plot", type=Path, help="also save a chart (needs matplotlib)")
    args = parser.parse_args()

    bars = load_bars(args.csv)
    strategy = Strategy(
        direction=args.direction, stop=args.stop, take_profit=args.take_profit,
        fee_bps=args.fee_bps, slippage_bps=args.slippage_bps,
    )  # fmt: skip
    result = backtest(bars, ATCParams(), strategy, interval="1h")
    metrics = result.metrics.iloc[0]
    trades = result.trades
    hold = bars["close"].iloc[-1] / bars["close"].iloc[0] - 1
    print(f"bars             {len(bars)} ({bars['time'].iloc[0]} .. {bars['time'].iloc[-1]})")
    print(f"strategy         {strategy}")
    print(f"trades           {int(metrics['trades'])} closed, {int(metrics['wins'])} won")
    print(f"strategy return  {metrics['total_return']:+.2%}")
    print(f"max drawdown     {metrics['max_drawdown']:.2%}")
    print(f"exposure         {metrics['exposure']:.1%} of bars")
    print(f"buy and hold     {hold:+.2%}")
    columns = ["side", "entry_time", "exit_time", "entry_price", "exit_price", "reason", "return"]
    print(trades[columns].tail(3).to_string())
    if args.plot:
        from atc_stream.app.plot_backtest import plot_backtest

        plot_backtest(result, bars, path=args.plot)
        print(f"chart            {args.plot}")


if __name__ == "__main__":
    main()
