"""A small run of every CUDA kernel (warmup, step, preview, paper-trading strategy, backtest) for
``compute-sanitizer``; exits 1 when a result differs from the CPU backend's.

Run on a machine with an NVIDIA GPU (scripts/gpu_check.sh does)::

    compute-sanitizer --tool memcheck --error-exitcode 3 python scripts/gpu_sanitize.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atc_stream import ATCParams, Strategy, backtest  # noqa: E402
from atc_stream.engine.engine import Engine  # noqa: E402
from atc_stream.kernels import cuda_available  # noqa: E402

STREAMS = 40  # more than one warp, fewer than one block: the tail of a block is exercised
BARS = 120
T0 = 1_700_000_000_000


def same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.names:
        return a.dtype == b.dtype and all(same(a[name], b[name]) for name in a.dtype.names)
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def main() -> int:
    ok, why = cuda_available(allow_simulator=True)
    if not ok:
        print(f"no CUDA device: {why}")
        return 2
    rng = np.random.default_rng(3)
    closes = np.round(50 * np.exp(np.cumsum(rng.normal(0, 0.01, (STREAMS, BARS)), 1)), 2)
    times = T0 + 60_000 * np.arange(BARS, dtype=np.int64)
    params = [ATCParams(), ATCParams(ema_len=10, hma_len=12, robustness="Narrow", cutout=30)]
    failures = []
    for state in ("global", "local"):
        engines = [
            Engine(params, backend=b, capacity=2 * STREAMS, outputs="all") for b in ("cpu", "cuda")
        ]
        engines[1].backend.warmup_state = state
        history = {f"S{i}": (times[:80], closes[i, :80]) for i in range(STREAMS)}
        outs = [e.warmup(history).outputs for e in engines]
        if not same(*outs):
            failures.append(f"warmup ({state} state)")
        for j in range(80, BARS):
            bars = [(f"S{i}", int(times[j]), float(closes[i, j])) for i in range(STREAMS)]
            if j == 100:
                preview = [e.preview(bars).outputs for e in engines]
                if not same(*preview):
                    failures.append(f"preview at bar {j}")
            outs = [e.step(bars).outputs for e in engines]
            if not same(*outs):
                failures.append(f"step at bar {j} ({state} state)")
                break

    prices = {f"S{i}": (times[:60], *(closes[i, :60],) * 4) for i in range(8)}
    traders = [
        Engine(backend=b, capacity=8, strategies=Strategy(stop=0.01), outputs="all")
        for b in ("cpu", "cuda")
    ]
    outs = [t.warmup(prices).outputs for t in traders]
    if not same(*outs):
        failures.append("paper-trading warmup")
    for j in range(60, 80):
        rows = [(f"S{i}", int(times[j]), *(float(closes[i, j]),) * 4) for i in range(8)]
        outs = [t.step(rows).outputs for t in traders]
        if not same(*outs):
            failures.append(f"paper-trading step at bar {j}")
            break

    n = 6
    table = {
        "symbol": np.repeat([f"S{i}" for i in range(n)], BARS),
        "time": np.tile(times, n),
        **{k: closes[:n].ravel() for k in ("open", "high", "low", "close")},
    }
    strategies = [Strategy(stop=0.01, fee_bps=5), Strategy(max_hold=10)]
    results = [backtest(table, None, strategies, backend=b) for b in ("cpu", "cuda")]
    for name in ("trade_columns", "metric_columns", "equity_columns"):
        a, b = getattr(results[0], name), getattr(results[1], name)
        if any(not same(a[c], b[c]) for c in a):
            failures.append(f"backtest {name}")

    print("CPU = CUDA on every kernel" if not failures else f"DIFFER: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
