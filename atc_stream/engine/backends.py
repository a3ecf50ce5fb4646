"""Which backend an engine runs on: ``make_backend`` for "cpu", "cuda" or "auto"."""

from __future__ import annotations

import logging

from atc_stream.kernels import AUTO_MIN_STREAMS, cuda_available, cuda_simulated
from atc_stream.kernels.backend import Backend
from atc_stream.kernels.cpu import CpuBackend
from atc_stream.kernels.cuda_parity import device_parity_problem
from atc_stream.state.arrays import StateStore

log = logging.getLogger("atc_stream")


def make_backend(
    name: str, store: StateStore, threads: int | None = None, cuda_graph: bool = False
) -> Backend:
    """The backend object for ``name`` ("cpu", "cuda" or "auto").

    ``threads`` is the CPU backend's thread count (None: chosen per call);
    ``cuda_graph`` turns on the CUDA backend's graph of the steady step.

    "cuda" also runs under numba's simulator (``NUMBA_ENABLE_CUDASIM=1``) and raises
    ``RuntimeError`` naming the missing piece when CUDA cannot run here. "auto" picks
    CUDA only for at least ``kernels.AUTO_MIN_STREAMS`` streams (the store's capacity or
    stream count, whichever is larger) and only when ``cuda_available()``'s probe
    passes and the device gives the CPU's bits (``kernels.cuda_parity``, once a process;
    "cuda" raises when it does not); otherwise the CPU, with one warning per process
    naming the missing piece when a CUDA driver is there but something else is not (no
    driver at all is the normal CPU machine: logged at INFO). ``Engine.move_to("auto")``
    decides again.
    """
    if name not in ("cpu", "cuda", "auto"):
        raise ValueError(f"backend must be 'cpu', 'cuda' or 'auto', got {name!r}")
    if name == "cuda" or (name == "auto" and _enough_streams_for_cuda(store)):
        available, why = cuda_available(allow_simulator=name == "cuda")
        if available and not cuda_simulated():
            why = device_parity_problem()
            available = not why
        if available:
            # numba.cuda and the CUDA kernels load only once CUDA is known to run here
            from atc_stream.kernels.cuda_backend import CudaBackend

            return CudaBackend(store, cuda_graph=cuda_graph)
        if name == "cuda":
            raise RuntimeError(f"backend='cuda' was asked for but CUDA is unavailable: {why}")
        _note_cpu_fallback(why)
    return CpuBackend(store, threads)


def _enough_streams_for_cuda(store: StateStore) -> bool:
    return max(store.capacity, store.n_streams) >= AUTO_MIN_STREAMS


_fallback_noted = False


def _note_cpu_fallback(why: str) -> None:
    global _fallback_noted
    if _fallback_noted:
        return
    _fallback_noted = True
    no_driver = why.startswith(("no CUDA driver", "NUMBA_ENABLE_CUDASIM"))
    log.log(
        logging.INFO if no_driver else logging.WARNING,
        "backend='auto': using the CPU, CUDA is unavailable: %s",
        why,
    )
