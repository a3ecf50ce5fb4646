"""Compiling CUDA kernels without FMA contraction, and the PTX check that enforces it.

Why and how: docs/design/cuda.md, "Numerics".
"""

from __future__ import annotations

import contextlib
import re
import threading
import types
from collections.abc import Iterable, Iterator
from typing import Any

from atc_stream.kernels import cuda_simulated

#: the numba-cuda releases the no-FMA hook below was verified with (pyproject.toml pins
#: the same range; tests/test_cuda_ptx.py checks the installed one and the hook's effect)
NUMBA_CUDA_VERIFIED = ">=0.30.4,<0.31"

_no_fma_state = threading.local()


class _NoFmaCompileIr:
    """``nvvm.compile_ir`` that passes ``fma=False`` inside ``no_fma()``."""

    def __init__(self, original: Any) -> None:
        self.original = original

    def __call__(self, llvmir: Any, **options: Any) -> Any:
        if getattr(_no_fma_state, "depth", 0):
            # numba's CompilationUnit turns this into the libNVVM option "-fma=0".
            options["fma"] = False
        return self.original(llvmir, **options)


def restore_numpy_names_numba_cuda_uses() -> None:
    """numba-cuda 0.30 registers an overload of ``np.row_stack`` when its CUDA target first
    compiles; numpy 2.5 removed that name (an alias of ``np.vstack``), so every compile
    failed there with an AttributeError. Restore the alias for it. Called before any
    compile through this module; a caller compiling with numba-cuda directly (the PTX
    tests) calls it first."""
    import numpy as np

    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack


def _install_no_fma_hook() -> None:
    """Wrap ``nvvm.compile_ir`` (once) so that compiles inside ``no_fma()`` pass ``-fma=0``."""
    restore_numpy_names_numba_cuda_uses()
    from numba.cuda.cudadrv import nvvm

    if not isinstance(nvvm.compile_ir, _NoFmaCompileIr):
        nvvm.compile_ir = _NoFmaCompileIr(nvvm.compile_ir)


@contextlib.contextmanager
def no_fma() -> Iterator[None]:
    """Kernels compiled (lazily, at their first launch) inside this block get ``-fma=0``."""
    if cuda_simulated():  # nothing is compiled by the simulator
        yield
        return
    _install_no_fma_hook()
    _no_fma_state.depth = getattr(_no_fma_state, "depth", 0) + 1
    try:
        yield
    finally:
        _no_fma_state.depth -= 1


class FmaContractionError(RuntimeError):
    """A kernel's PTX holds ``fma.rn.f64``: the no-FMA switch did not take effect."""


def kernel(fn: Any) -> Any:
    """``fn`` as a CUDA kernel whose machine code comes from the PTX this module checks.

    Link-time optimisation must be off: with it, nvJitLink generates the code from NVVM IR
    with its own defaults, FMA contraction included, and the PTX read here is not what
    runs. numba-cuda turns LTO on by default wherever nvJitLink is installed, and its
    decorator form ``cuda.jit(lto=False)`` drops the ``lto`` argument (0.30), so the
    function is passed in the same call. The simulator's ``jit`` takes no ``lto``.
    """
    from numba import cuda

    if cuda_simulated():
        return cuda.jit(fn)
    return cuda.jit(fn, lto=False)  # type: ignore[call-arg]  # typed as the simulator's


def _kernel_ptx_strings(overload: Any) -> list[str]:
    """The PTX a compiled kernel (a ``_Kernel``) was linked from, as numba holds it."""
    library = overload.library
    if getattr(library, "_lto", False):
        raise FmaContractionError(
            f"{getattr(overload, '_name', overload)!r} was compiled with link-time "
            "optimisation: nvJitLink made its machine code, so the PTX checked here is not "
            "what would run. Refusing to run."
        )
    cache = getattr(library, "_ptx_cache", None)
    if isinstance(cache, dict) and cache:
        return [ptx for strings in cache.values() for ptx in strings]
    # numba-cuda internals moved, or the kernel came from a disk cache: compile its IR
    # again the way the backend compiles it
    with no_fma():
        return [overload.inspect_asm(None)]


def ptx_has_fma(ptx: str) -> bool:
    """Whether PTX holds a double-precision fused multiply-add (any rounding mode)."""
    return re.search(r"\bfma\.r[nzmp]\.f64\b", ptx) is not None


_checked_overloads: dict[int, int] = {}


def check_no_fma(kernel: Any, what: str | None = None) -> None:
    """Refuse (``FmaContractionError``) if any compiled specialisation of ``kernel`` has FMA.

    ``kernel`` is a numba-cuda kernel dispatcher. Each specialisation is read once (the
    count of checked ones is remembered), so calling this after every launch costs one
    dict lookup in the steady state. Never raises for the simulator (nothing compiled).
    """
    if cuda_simulated():
        return
    overloads = kernel.overloads
    if _checked_overloads.get(id(kernel)) == len(overloads):
        return
    name = what or getattr(getattr(kernel, "py_func", None), "__name__", repr(kernel))
    for argtypes, overload in list(overloads.items()):
        check_ptx_no_fma(f"{name}{argtypes}", _kernel_ptx_strings(overload))
    _checked_overloads[id(kernel)] = len(overloads)


def check_ptx_no_fma(what: str, ptxes: Iterable[str]) -> None:
    """Raise ``FmaContractionError`` naming ``what`` if any of ``ptxes`` holds an f64 FMA."""
    for ptx in ptxes:
        if ptx_has_fma(ptx):
            raise FmaContractionError(
                f"{what}: the PTX holds fma.rn.f64, i.e. NVVM contracted a*b + c although "
                "atc-stream compiles its kernels with -fma=0; results would differ from the "
                "CPU path. The no-FMA hook on numba-cuda's nvvm.compile_ir no longer takes "
                f"effect (numba-cuda {_numba_cuda_version()}; verified with "
                f"{NUMBA_CUDA_VERIFIED}). Refusing to run."
            )


def _numba_cuda_version() -> str:
    try:
        from importlib.metadata import version

        return version("numba-cuda")
    except Exception:  # not installed as a distribution
        return "unknown"


@contextlib.contextmanager
def compute_capability_stand_in(cc: tuple[int, int]) -> Iterator[None]:
    """Let numba compile device functions for ``cc`` where no device can be asked.

    numba-cuda 0.30 types a kernel's device functions for the *current device's*
    compute capability (``dispatcher.get_current_device()``), even inside
    ``compile_ptx(cc=...)``. Without a GPU that call fails; PTX needs only libNVVM, so
    for the duration of a PTX compile the question is answered with ``cc``.
    """
    from numba.cuda import dispatcher

    try:
        dispatcher.get_current_device().compute_capability  # noqa: B018 - a probe
        yield
        return
    except Exception:  # no driver or no device: stand one in
        pass
    original = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=cc)
    try:
        yield
    finally:
        dispatcher.get_current_device = original
