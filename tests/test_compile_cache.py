"""The on-disk compiled-kernel cache: loaded by later processes, never stale, safe to share.

Each case runs real Python processes on a private copy of the package (so editing a
kernel source never touches the checkout) with a private cache directory. The
package copy is read-only for the first runs, like a root-owned site-packages, so
the cache must land in the user cache directory (``XDG_CACHE_HOME``).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import atc_stream

#: A child process: compute() of a short series, then the CPU drivers' cache statistics
#: and the growth column (what the kernel-source edit below changes).
CHILD = """
import json, sys
import numpy as np
from atc_stream.engine.series import compute
from atc_stream.kernels import cache, cpu
closes = 100.0 + np.sin(np.arange(300) / 7.0)
out = compute(closes)
drivers = (*cpu.DRIVERS, cpu.block_warmup)
print(json.dumps({
    "hits": sum(sum(d.stats.cache_hits.values()) for d in drivers),
    "misses": sum(sum(d.stats.cache_misses.values()) for d in drivers),
    "cache_dir": str(cache.cache_dir()),
    "package": cache._PACKAGE.as_posix(),
    "growth": [None if g != g else g for g in out["growth"].tolist()],
    "signal": [None if g != g else g for g in out["signal"].tolist()],
}))
"""


def _set_read_only(root: Path, read_only: bool) -> None:
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        if read_only:
            path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        else:
            path.chmod(mode | stat.S_IWUSR)


def _start(site: Path, xdg: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR",)}
    env.pop("ATC_STREAM_CACHE_DIR", None)
    env.update(PYTHONPATH=str(site), XDG_CACHE_HOME=str(xdg), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.Popen(
        [sys.executable, "-c", CHILD], env=env, cwd=site, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _finish(process: subprocess.Popen) -> dict:
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    return json.loads(stdout.strip().splitlines()[-1])


def _cache_files(xdg: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime_ns for p in xdg.rglob("*") if p.suffix in (".nbi", ".nbc")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two concurrent first runs on a read-only copy, a later run, then a run after an edit."""
    base = tmp_path_factory.mktemp("cache")
    site, xdg = base / "site", base / "xdg"
    package = Path(atc_stream.__file__).parent
    shutil.copytree(package, site / "atc_stream", ignore=shutil.ignore_patterns("__pycache__"))
    if os.geteuid() == 0:
        # root ignores permission bits; a plain file where the cache directory would go
        # makes the package directory just as unusable for the cache as a read-only one
        (site / "atc_stream" / "kernels" / "__pycache__").write_text("")
    _set_read_only(site / "atc_stream", True)
    try:
        first = [_start(site, xdg) for _ in range(2)]  # two processes starting together
        concurrent = [_finish(p) for p in first]
        files_after_first = _cache_files(xdg)
        later = _finish(_start(site, xdg))
        files_after_later = _cache_files(xdg)
    finally:
        _set_read_only(site / "atc_stream", False)
    core = site / "atc_stream" / "kernels" / "core.py"
    source = core.read_text()
    edited = source.replace(
        "return math.exp(lam * (bar_index - cutout))",
        "return 2.0 * math.exp(lam * (bar_index - cutout))",
    )
    assert edited != source
    core.write_text(edited)
    after_edit = _finish(_start(site, xdg))
    return {
        "site": site, "xdg": xdg, "concurrent": concurrent, "later": later,
        "after_edit": after_edit, "files_after_first": files_after_first,
        "files_after_later": files_after_later,
    }  # fmt: skip


def test_read_only_install_and_concurrent_first_runs_both_succeed(runs):
    a, b = runs["concurrent"]
    assert a["signal"] == b["signal"] and a["growth"] == b["growth"]
    for run in (a, b):
        assert run["misses"] >= 1  # a fresh cache: compiled
        assert Path(run["cache_dir"]).is_relative_to(runs["xdg"])  # package dir was read-only
    assert runs["files_after_first"], "nothing was saved to the cache"


def test_second_process_loads_from_cache_without_compiling(runs):
    later, first = runs["later"], runs["concurrent"][0]
    assert later["misses"] == 0 and later["hits"] >= 1
    assert runs["files_after_later"] == runs["files_after_first"]  # nothing rewritten
    assert later["signal"] == first["signal"] and later["growth"] == first["growth"]


def test_edited_kernel_source_recompiles_and_gives_the_new_result(runs):
    edited, first = runs["after_edit"], runs["concurrent"][0]
    assert edited["misses"] >= 1 and edited["hits"] == 0
    assert edited["cache_dir"] != first["cache_dir"]  # a new key, not the stale entry
    old = np.array(first["growth"], dtype=float)
    new = np.array(edited["growth"], dtype=float)
    finite = np.isfinite(old)
    assert finite.any()
    np.testing.assert_array_equal(new[finite], 2.0 * old[finite])


def test_cache_key_covers_every_kernel_source():
    from atc_stream.kernels import cache

    names = {p.relative_to(cache._PACKAGE).as_posix() for p in cache.kernel_source_files()}
    assert {"kernels/core.py", "kernels/cpu.py", "kernels/batch.py", "state/layout.py"} <= names


def _imported_package_files(path: Path, package: Path) -> set[str]:
    """Files of ``atc_stream`` modules that ``path`` imports (``from atc_stream.x import y``
    names module ``x/y.py`` when it exists, else ``x.py``)."""
    files = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
            "atc_stream."
        ):
            continue
        base = package.joinpath(*node.module.split(".")[1:])
        for alias in node.names:
            module = base / f"{alias.name}.py"
            files.add((module if module.exists() else base.with_suffix(".py")).as_posix())
    return files


def test_cache_key_covers_every_module_the_compiled_kernels_read_constants_from():
    """numba freezes imported module-level numbers into the cached machine code."""
    from atc_stream.kernels import cache

    package = cache._PACKAGE
    covered = {p.as_posix() for p in cache.kernel_source_files()}
    for compiled in (
        "kernels/core.py",
        "kernels/lanes.py",
        "kernels/simd.py",
        "kernels/strategy.py",
        "kernels/batch.py",
        "kernels/cuda_host.py",
    ):
        missing = _imported_package_files(package / compiled, package) - covered
        assert not missing, f"{compiled} imports {missing}, not in cache.KERNEL_SOURCES"


# -- every njit goes through the keyed cache ---------------------------------------------


def _uncached_jits(source: str) -> list[int]:
    """Lines of ``njit``/``numba.jit`` uses that are not ``cached_jit(njit(..., cache=True))``."""
    tree = ast.parse(source)
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def called(node: ast.AST, name: str) -> bool:
        func = node.func if isinstance(node, ast.Call) else None
        return (isinstance(func, ast.Name) and func.id == name) or (
            isinstance(func, ast.Attribute) and func.attr == name
        )

    bad = []
    for node in ast.walk(tree):
        is_jit = (isinstance(node, ast.Name) and node.id == "njit") or (
            isinstance(node, ast.Attribute)
            and (node.attr == "njit" or (node.attr == "jit" and ast.unparse(node) == "numba.jit"))
        )
        if not is_jit:
            continue
        call = parent.get(node)
        ok = (
            isinstance(call, ast.Call)
            and call.func is node
            and any(
                k.arg == "cache" and isinstance(k.value, ast.Constant) and k.value.value is True
                for k in call.keywords
            )
            and called(parent.get(call), "cached_jit")
            and parent[call].args[:1] == [call]
        )
        if not ok:
            bad.append(node.lineno)
    return bad


def test_the_njit_scan_flags_uncached_and_unwrapped_decorators():
    source = (
        "@njit\ndef a(): pass\n"
        "@njit(cache=True)\ndef b(): pass\n"
        "@cached_jit(njit())\ndef c(): pass\n"
        "decorator = njit(cache=True)\n"
        "@numba.jit(nopython=True)\ndef d(): pass\n"
        "@cached_jit(njit(error_model='numpy', cache=True))\ndef ok(): pass\n"
    )
    assert sorted(_uncached_jits(source)) == [1, 3, 5, 7, 8]


def test_every_njit_in_the_package_goes_through_the_keyed_cache():
    """A plain ``njit(cache=True)`` would cache under numba's file-keyed default, stale
    after an edit of the core it inlines (docs/design/compile-cache.md)."""
    package = Path(atc_stream.__file__).parent
    bad = [
        f"{path.relative_to(package)}:{line}"
        for path in sorted(package.rglob("*.py"))
        for line in _uncached_jits(path.read_text())
    ]
    assert not bad, f"njit not wrapped as cached_jit(njit(..., cache=True)): {bad}"


def test_numba_cache_dir_is_respected(tmp_path, monkeypatch):
    from atc_stream.kernels import cache

    monkeypatch.delenv("ATC_STREAM_CACHE_DIR", raising=False)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    roots = list(cache._candidate_roots())
    assert roots[0] == tmp_path / "atc-stream"
