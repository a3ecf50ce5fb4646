"""A steady 10,000-stream step on the GPU for Nsight Compute: a warmed engine, then a few
one-bar-per-stream steps (the launches ``ncu --kernel-name regex:step_kernel`` reads).

Run on a machine with an NVIDIA GPU (scripts/gpu_check.sh does)::

    ncu --clock-control none --kernel-name regex:step_kernel --launch-skip 1 \\
        --launch-count 1 python scripts/gpu_profile.py 10000
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atc_stream import ATCParams  # noqa: E402
from atc_stream.engine.engine import Engine  # noqa: E402
from atc_stream.kernels import cuda_available, cuda_parity  # noqa: E402

HISTORY = 200
STEPS = 3
T0 = 1_700_000_000_000
BAR_MS = 60_000


def main() -> int:
    ok, why = cuda_available()
    if not ok:
        print(f"no CUDA device: {why}")
        return 2
    os.environ[cuda_parity.SWITCH] = "off"  # the gate's own launches would be profiled too
    streams = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    rng = np.random.default_rng(5)
    closes = np.round(
        rng.uniform(20, 200, streams)[:, None]
        * np.exp(np.cumsum(rng.normal(0, 0.002, (streams, HISTORY + STEPS)), 1)),
        2,
    )
    times = T0 + BAR_MS * np.arange(HISTORY + STEPS, dtype=np.int64)
    eng = Engine(ATCParams(), backend="cuda", capacity=streams)
    eng.warmup({f"S{i}": (times[:HISTORY], closes[i, :HISTORY]) for i in range(streams)})
    slots = np.concatenate([eng.slots_of(f"S{i}") for i in range(streams)])
    for j in range(HISTORY, HISTORY + STEPS):
        eng.step_arrays(slots, np.full(streams, times[j]), closes[:, j])
    print(f"stepped {streams} streams {STEPS} times on {eng.backend.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
