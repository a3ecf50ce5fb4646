"""The ATC math, written once (``core``) and driven on the CPU (``cpu``) or GPU (``cuda``)."""

from __future__ import annotations

import os


def cuda_simulated() -> bool:
    """True when numba's CUDA simulator is on (``NUMBA_ENABLE_CUDASIM=1``)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def cuda_available(allow_simulator: bool = False) -> tuple[bool, str]:
    """Whether the CUDA backend can run here, and why not when it cannot."""
    if cuda_simulated() and not allow_simulator:
        return False, "NUMBA_ENABLE_CUDASIM=1 (simulator only; ask for backend='cuda' explicitly)"
    try:
        from numba import cuda
    except ImportError as exc:  # pragma: no cover - numba always ships numba.cuda
        return False, f"numba.cuda cannot be imported ({exc}); pip install 'atc-stream[cuda]'"
    try:
        if not cuda.is_available():
            return False, "no CUDA device or driver found"
    except Exception as exc:  # the driver probe raises on broken installs
        return False, f"CUDA driver probe failed: {exc}"
    return True, ""
