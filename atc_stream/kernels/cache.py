"""Where compiled kernels persist between processes, keyed so they are never stale.

Design: docs/design/compile-cache.md.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import llvmlite
import llvmlite.binding as llvm
import numba
import numpy
from numba.core import config as numba_config
from numba.core.caching import NullCache

_PACKAGE = Path(__file__).resolve().parents[1]

#: Files whose content the compiled kernels depend on (relative to the package).
#: ``kernels/core.py`` reads constants of ``core/params.py``, ``core/output_row.py`` and
#: ``state/layout.py`` (``kernels/strategy.py`` those of ``state/strategy_layout.py``,
#: ``kernels/batch.py`` the latest bar time of ``core/timetext.py``), which numba freezes
#: into the machine code.
KERNEL_SOURCES = (
    "kernels/*.py",
    "state/layout.py",
    "state/strategy_layout.py",
    "core/params.py",
    "core/output_row.py",
    "core/timetext.py",
)


def kernel_source_files(package: Path = _PACKAGE) -> list[Path]:
    """Every source file the compiled CPU kernels are built from, sorted."""
    files: set[Path] = set()
    for pattern in KERNEL_SOURCES:
        files.update(package.glob(pattern))
    return sorted(files)


def _host_cpu() -> str:
    return f"{llvm.get_host_cpu_name()}:{llvm.get_host_cpu_features().flatten()}"


@functools.lru_cache(maxsize=1)
def cache_key() -> str:
    """Hash of the kernel sources, compiler/numpy versions and the host CPU (16 hex digits)."""
    digest = hashlib.sha256()
    for path in kernel_source_files():
        digest.update(path.relative_to(_PACKAGE).as_posix().encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    for part in (numba.__version__, llvmlite.__version__, numpy.__version__, sys.version):
        digest.update(part.encode())
    digest.update(_host_cpu().encode())
    return digest.hexdigest()[:16]


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def _candidate_roots() -> Iterator[Path]:
    for variable in ("ATC_STREAM_CACHE_DIR", "NUMBA_CACHE_DIR"):
        if os.environ.get(variable):
            yield Path(os.environ[variable]) / "atc-stream"
    yield _PACKAGE / "kernels" / "__pycache__" / "compiled"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    yield Path(xdg) / "atc-stream"
    yield Path(tempfile.gettempdir()) / f"atc-stream-{os.getuid() if hasattr(os, 'getuid') else 0}"


@functools.lru_cache(maxsize=1)
def cache_dir() -> Path:
    """The writable keyed directory compiled kernels are saved to and loaded from."""
    for root in _candidate_roots():
        path = root / cache_key()
        if _writable(path):
            return path
    raise OSError("no writable directory for compiled kernels (set ATC_STREAM_CACHE_DIR)")


def is_populated() -> bool:
    """True when compiled kernels were saved for this key (numba index files exist)."""
    try:
        return any(cache_dir().rglob("*.nbi"))
    except OSError:
        return False


@contextlib.contextmanager
def _numba_cache_dir(path: Path) -> Iterator[None]:
    # numba.core.config sets its attributes at import time, invisible to a type checker
    config: Any = numba_config
    previous = config.CACHE_DIR
    config.CACHE_DIR = str(path)
    try:
        yield
    finally:
        config.CACHE_DIR = previous


def cached_jit(
    decorator: Callable[[Callable[..., Any]], Any],
) -> Callable[[Callable[..., Any]], Any]:
    """Wrap a ``numba.njit(cache=True, ...)`` decorator so it caches in ``cache_dir()``.

    Falls back to an uncached dispatcher (compiled in every process) when no cache
    directory can be written, rather than to numba's stale-prone default locations.
    """

    def apply(function: Callable[..., Any]) -> Any:
        try:
            path = cache_dir()
        except OSError:
            return _uncached(decorator(function))
        with _numba_cache_dir(path):
            return decorator(function)

    return apply


def _uncached(dispatcher: Any) -> Any:
    dispatcher._cache = NullCache()
    return dispatcher
