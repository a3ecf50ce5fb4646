"""Optional extras: a command asks for the one it needs before importing it, and a missing
one is one line naming what to install (never an ``ImportError`` traceback)."""

from __future__ import annotations

from importlib.util import find_spec

from atc_stream.app.console import RunError
from atc_stream.kernels import CUDA_INSTALL_HINT

#: For each extra: the top-level modules it brings, and what to install when one is missing.
#: The CUDA backend has one extra per CUDA major (``pyproject.toml``).
EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {
    "live": (("aiohttp",), "pip install 'atc-stream[live]'"),
    "ccxt": (("ccxt", "aiohttp"), "pip install 'atc-stream[ccxt]'"),
    "redis": (("redis",), "pip install 'atc-stream[redis]'"),
    "ray": (("ray",), "pip install 'atc-stream[ray]'"),
    "metrics": (("prometheus_client",), "pip install 'atc-stream[metrics]'"),
    "plot": (("matplotlib", "pandas"), "pip install 'atc-stream[plot]'"),
    "pandas": (("pandas",), "pip install 'atc-stream[pandas]'"),
    "cuda": (("numba_cuda",), CUDA_INSTALL_HINT),
}


class MissingExtra(RunError, ImportError):
    """An optional library that is not installed is needed; the message names the extra.

    A ``RunError`` (one line and exit 2 from the CLI) and an ``ImportError`` (what
    Python code calling a plotting function expects)."""


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (empty: all present)."""
    modules, _ = EXTRAS[extra]
    return [name for name in modules if find_spec(name) is None]


def require(extra: str, feature: str) -> None:
    """``MissingExtra`` naming ``extra`` when a module of it is missing; ``feature`` says
    what needs it (e.g. ``"atc-stream live"``, ``"--redis"``)."""
    missing = missing_modules(extra)
    if missing:
        _, install = EXTRAS[extra]
        raise MissingExtra(f"{feature} needs {' and '.join(missing)}, not installed: {install}")
