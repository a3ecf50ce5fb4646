"""Where the CUDA kernel tests run: under numba's simulator (CI), or on a real GPU on request.

The ``cudasim`` tests are small and run in their own pytest process with
``NUMBA_ENABLE_CUDASIM=1``. On a machine with a GPU, ``ATC_STREAM_CUDA_TESTS=device``
runs the same tests on the device instead (scripts/gpu_check.sh does).
"""

from __future__ import annotations

import os

import pytest

ON_SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
ON_DEVICE = not ON_SIMULATOR and os.environ.get("ATC_STREAM_CUDA_TESTS") == "device"

#: skips a test unless the CUDA kernels can run here (the simulator, or a requested device)
cuda_kernels_run = pytest.mark.skipif(
    not (ON_SIMULATOR or ON_DEVICE),
    reason="needs NUMBA_ENABLE_CUDASIM=1 set before numba is imported "
    "(or ATC_STREAM_CUDA_TESTS=device on a machine with a GPU)",
)

#: for the few tests of the simulator's own behaviour (what ``auto`` and graphs do there)
simulator_only = pytest.mark.skipif(not ON_SIMULATOR, reason="checks the simulator's behaviour")
