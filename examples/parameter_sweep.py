"""Parameter sweep: many ATC parameter sets over one series in one engine, ranked.

    python examples/parameter_sweep.py [bars.csv]

Every (length, robustness) combination is one parameter set; the engine keeps one stream
per set and steps all of them together, one call per bar (a sweep is just more streams).
Each stream's events (ready rows only) drive the same simple long/short strategy as
examples/backtest_csv.py, and the table ranks the sets by strategy return.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np
import pandas as pd

from atc_stream import ATCParams, Engine

DEFAULT_CSV = Path(__file__).resolve().parent / "data" / "sample_1h.csv"
LENGTHS = (14, 20, 28, 40)
ROBUSTNESS = ("Narrow", "Medium", "Wide")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="?", type=Path, default=DEFAULT_CSV)
    args = parser.parse_args()
    bars = pd.read_csv(args.csv)
    bars["time"] = pd.to_datetime(bars["time"], utc=True)
    bars["symbol"] = "SAMPLE"

    grid = [
        ATCParams(
            **{f"{f}_len": length for f in ("ema", "hma", "wma", "dema", "lsma", "kama")},
            robustness=robustness,
        )  # fmt: skip
        for length, robustness in itertools.product(LENGTHS, ROBUSTNESS)
    ]
    engine = Engine(grid, backend="cpu")
    engine.add_symbol("SAMPLE")  # one stream per parameter set
    # each row of `bars` fans out to every parameter set's stream of SAMPLE
    frames = [engine.step(bars.iloc[[i]]).to_pandas() for i in range(len(bars))]
    rows = pd.concat(frames, ignore_index=True)

    table = []
    for params_id, stream in rows.groupby("params_id"):
        events = pd.Series(np.nan, index=stream.index)
        events[stream["long"] & stream["ready"]] = 1.0
        events[stream["short"] & stream["ready"]] = -1.0
        position = events.ffill().fillna(0.0)
        strategy = position.shift(1).fillna(0.0) * stream["close"].pct_change().fillna(0.0)
        p = grid[params_id]
        table.append(
            {
                "params_id": params_id,
                "length": p.ema_len,
                "robustness": p.robustness,
                "ready_from_bar": int(stream["bar_index"][stream["ready"]].iloc[0]),
                "events": int((stream["long"] | stream["short"])[stream["ready"]].sum()),
                "return": (1 + strategy).prod() - 1,
            }
        )
    ranked = pd.DataFrame(table).sort_values("return", ascending=False)
    print(f"{len(grid)} parameter sets x {len(bars)} bars = {len(rows)} signal rows")
    print(ranked.to_string(index=False, formatters={"return": "{:+.2%}".format}))


if __name__ == "__main__":
    main()
