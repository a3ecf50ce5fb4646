"""Where the CUDA kernels' bits part from the CPU's on a real GPU: the parity gate's verdict,
each kernel's SASS double-precision instruction counts (a DFMA means the machine code fused a
multiply and an add), and elementwise arithmetic of the kernels' own forms against numpy.

Run on a machine with an NVIDIA GPU (scripts/gpu_check.sh does)::

    python scripts/gpu_diagnose.py
"""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atc_stream.kernels import cuda_available, cuda_parity  # noqa: E402


def elementwise_checks() -> None:
    """The EMA recurrence, a weighted sum and a division, each on 1M random doubles."""
    from numba import cuda

    from atc_stream.kernels.ptx_guard import kernel as ptx_kernel
    from atc_stream.kernels.ptx_guard import no_fma

    def ema(alpha, close, prev, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = alpha[i] * close[i] + (1.0 - alpha[i]) * prev[i]

    def weighted(alpha, close, prev, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            acc = 0.0
            for j in range(1, 9):
                acc += j * close[(i + j) % close.shape[0]]
            out[i] = acc / (8 * 9 / 2) + prev[i] / alpha[i]

    rng = np.random.default_rng(1)
    n = 1 << 20
    alpha = rng.uniform(0.01, 0.9, n)
    close = np.round(rng.uniform(1, 200, n), 2)
    prev = rng.uniform(1, 200, n)
    want = {
        "ema": alpha * close + (1.0 - alpha) * prev,
        "weighted": sum(j * np.roll(close, -j) for j in range(1, 9)) / 36.0 + prev / alpha,
    }
    for name, fn in (("ema", ema), ("weighted", weighted)):
        kernel = ptx_kernel(fn)
        out = cuda.device_array(n)
        with no_fma():
            kernel[(n + 255) // 256, 256](
                cuda.to_device(alpha), cuda.to_device(close), cuda.to_device(prev), out
            )
        got = out.copy_to_host()
        print(f"elementwise {name}: {int((got != want[name]).sum())} of {n} differ from numpy")
        for sig, sass in kernel.inspect_sass().items():
            print(f"  SASS {name}{sig}: {sass_counts(sass)}")


def sass_counts(sass: str) -> dict[str, int]:
    ops = Counter(re.findall(r"\b(DFMA|DMUL|DADD|FFMA|MUFU\.[A-Z0-9]+)\b", sass))
    return dict(sorted(ops.items()))


def kernel_sass() -> None:
    """A small engine run on the device compiles every ATC kernel; their SASS op counts."""
    from atc_stream import ATCParams, Engine
    from atc_stream.kernels import cuda_kernels

    closes = cuda_parity.check_series(4, 60)
    times = cuda_parity.BASE_TIME + cuda_parity.BAR_MS * np.arange(60, dtype=np.int64)
    eng = Engine(ATCParams(), backend="cuda", outputs="all")
    eng.warmup({f"S{i}": (times[:50], closes[i, :50]) for i in range(4)})
    for j in range(50, 60):
        eng.step([(f"S{i}", int(times[j]), float(closes[i, j])) for i in range(4)])
    for name, (kernel, _) in cuda_kernels.kernel_signatures().items():
        try:
            for sig, sass in kernel.inspect_sass().items():
                print(f"SASS {name}{sig}: {sass_counts(sass)}")
        except Exception as exc:  # not launched in this run, or nvdisasm missing
            print(f"SASS {name}: {type(exc).__name__}: {exc}")


def main() -> int:
    ok, why = cuda_available()
    if not ok:
        print(f"no CUDA device: {why}")
        return 2
    found = cuda_parity.device_parity_problem()
    print("parity gate:", found or "the CUDA kernels give the CPU's bits")
    os.environ[cuda_parity.SWITCH] = "off"
    for section in (elementwise_checks, kernel_sass):
        try:
            section()
        except Exception as exc:  # one section failing leaves the others' findings
            print(f"{section.__name__} failed: {type(exc).__name__}: {exc}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
