"""Where compiled kernels persist between processes, keyed so they are never stale.

Numba's ``cache=True`` keys a cached function on its own source file (path, mtime,
size) only. Our drivers inline every function of ``kernels/core.py`` and read
constants from ``state/layout.py``, so an edited core would silently reuse the old
machine code. We therefore point numba's cache locator at a directory *named by a
key* that hashes every file the kernels are built from plus the numba, llvmlite,
numpy and Python versions and the host CPU: any change selects a fresh directory.

Why this and not ahead-of-time compilation (``numba.pycc``): AOT is deprecated in
numba, cannot compile ``parallel=True`` drivers, and would need a build step per
platform; the keyed on-disk cache loads the same drivers in well under a second
(see benchmarks/RESULTS.md, "compile cache").

How: ``UserProvidedCacheLocator`` reads ``numba.config.CACHE_DIR`` when a dispatcher
with ``cache=True`` is *created*, so ``cached_jit`` sets it to the keyed directory
for the duration of the decoration only and restores it after; user code that uses
numba's cache is not affected.

Directory choice, first writable of: ``$ATC_STREAM_CACHE_DIR``, ``$NUMBA_CACHE_DIR``
(both under an ``atc-stream/<key>`` sub-directory), the package's own
``kernels/__pycache__`` (so a Docker build step's ``atc-stream compile`` ships with
the image), the user cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``), and last
the temporary directory. Numba only uses a cache directory it can write to (it
would otherwise fall back to its own file-keyed locations), so a read-only install
simply lands on the user cache directory. Concurrent starts are safe: numba writes
every cache file to a unique temporary name and renames it into place.
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

_PACKAGE = Path(__file__).resolve().parents[1]

#: Files whose content the compiled kernels depend on (relative to the package).
KERNEL_SOURCES = ("kernels/*.py", "state/layout.py")


def kernel_source_files(package: Path = _PACKAGE) -> list[Path]:
    """Every source file the compiled CPU kernels are built from, sorted."""
    files: set[Path] = set()
    for pattern in KERNEL_SOURCES:
        files.update(package.glob(pattern))
    return sorted(files)


def _host_cpu() -> str:
    import llvmlite.binding as llvm

    return f"{llvm.get_host_cpu_name()}:{llvm.get_host_cpu_features().flatten()}"


@functools.lru_cache(maxsize=1)
def cache_key() -> str:
    """Hash of the kernel sources, compiler/numpy versions and the host CPU (16 hex digits)."""
    import llvmlite
    import numba
    import numpy

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
    from numba.core import config

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
    from numba.core.caching import NullCache

    dispatcher._cache = NullCache()
    return dispatcher
