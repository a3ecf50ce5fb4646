"""The on-disk compiled-kernel cache: loaded by later processes, never stale, safe to share.

Each case runs real Python processes on a private copy of the package (so editing a
kernel source never touches the checkout) with a private cache directory. The
package copy is read-only for the first runs, like a root-owned site-packages, so
the cache must land in the user cache directory (``XDG_CACHE_HOME``).
"""

from __future__ import annotations

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

#: A child process: compute() of a short series, then the warmup driver's cache
#: statistics and the growth column (what the kernel-source edit below changes).
CHILD = """
import json, sys
import numpy as np
from atc_stream.engine.series import compute
from atc_stream.kernels import cache, cpu
closes = 100.0 + np.sin(np.arange(300) / 7.0)
out = compute(closes)
d = cpu.warmup_serial
print(json.dumps({
    "hits": sum(d.stats.cache_hits.values()),
    "misses": sum(d.stats.cache_misses.values()),
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


def test_numba_cache_dir_is_respected(tmp_path, monkeypatch):
    from atc_stream.kernels import cache

    monkeypatch.delenv("ATC_STREAM_CACHE_DIR", raising=False)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    roots = list(cache._candidate_roots())
    assert roots[0] == tmp_path / "atc-stream"
