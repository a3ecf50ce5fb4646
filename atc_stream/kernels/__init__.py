"""The ATC math, written once (``core``), driven on the CPU (``cpu``) or GPU (``cuda_*``);
``cuda_available`` decides, once per process, whether the CUDA backend can run here."""

from __future__ import annotations

import os
import threading

from atc_stream.core.errors import first_line

#: ``backend="auto"`` picks CUDA only from this many streams on: where the CUDA step's
#: end-to-end latency falls below the CPU's (an H200 against 16 CPU threads: 1,000 streams
#: 1.10 ms against 0.48, 10,000 streams 1.92 against 2.57; ``benchmarks/bench_cuda.py``).
AUTO_MIN_STREAMS = 10_000

_probe_lock = threading.Lock()
_probe_result: tuple[bool, str] | None = None


def cuda_simulated() -> bool:
    """True when numba's CUDA simulator is on (``NUMBA_ENABLE_CUDASIM=1``)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {first_line(exc)[:200]}"


CUDA_INSTALL_HINT = (
    "pip install 'atc-stream[cuda12]' or 'atc-stream[cuda13]' (the major of the "
    "'CUDA Version' that nvidia-smi prints)"
)


def _probe_cuda() -> tuple[bool, str]:
    """Driver and device, libNVVM, then a tiny kernel compiled (no FMA) and launched."""
    try:
        from numba import cuda
    except ImportError as exc:  # pragma: no cover - numba always ships numba.cuda
        return False, f"numba.cuda cannot be imported ({exc}); {CUDA_INSTALL_HINT}"
    try:
        if not cuda.is_available():
            return False, "no CUDA driver or device found (numba.cuda.is_available() is False)"
    except Exception as exc:  # the driver probe raises on broken installs
        return False, f"CUDA driver probe failed ({_first_line(exc)})"
    try:
        from numba.cuda.cudadrv import nvvm

        nvvm.NVVM()
    except Exception as exc:  # DynamicLibNotFoundError, NvvmSupportError, ...
        return (
            False,
            f"libNVVM (the CUDA compiler) is missing ({_first_line(exc)}); {CUDA_INSTALL_HINT}",
        )
    try:
        import numpy as np

        from atc_stream.kernels.ptx_guard import check_no_fma, no_fma
        from atc_stream.kernels.ptx_guard import kernel as ptx_kernel

        def probe(out):
            out[0] = out[0] * out[1] + out[2]  # NVVM would contract this without -fma=0

        # (1 + 2**-30)**2 - 1: rounding the product first gives 2**-29; a fused
        # multiply-add keeps the 2**-60 term. So this result shows whether the machine
        # code really does the two roundings the spec asks for.
        a = 1.0 + 2.0**-30
        values = cuda.to_device(np.array([a, a, -1.0]))
        kernel = ptx_kernel(probe)
        with no_fma():
            kernel[1, 1](values)
        check_no_fma(kernel, "the probe kernel")
        got = values.copy_to_host()[0]
        if got != 2.0**-29:
            return False, (
                f"the probe kernel computed a*b + c = {got!r} instead of {2.0**-29!r}: the "
                "device fused the multiply and the add although the PTX says not to"
            )
    except Exception as exc:  # NVRTC missing, PTX too new for the driver, launch failure...
        return False, f"compiling or launching a probe kernel failed ({_first_line(exc)})"
    return True, ""


def cuda_available(allow_simulator: bool = False) -> tuple[bool, str]:
    """Whether the CUDA backend can run here, and (when it cannot) which piece is missing.

    On a real device the probe runs once per process: driver and device, libNVVM, and a
    tiny kernel compiled through the backend's no-FMA path and launched. Under
    ``NUMBA_ENABLE_CUDASIM=1`` it answers True only with ``allow_simulator``.
    """
    global _probe_result
    if cuda_simulated():
        if allow_simulator:
            return True, ""
        return False, "NUMBA_ENABLE_CUDASIM=1 (simulator only; ask for backend='cuda' explicitly)"
    with _probe_lock:
        if _probe_result is None:
            _probe_result = _probe_cuda()
        return _probe_result
