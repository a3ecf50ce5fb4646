"""The repository is self-contained: a clone in an empty directory passes its golden and
parity tests with nothing beside it.

The clone is made from the committed HEAD (so a file that is only on this disk, or only
in a folder beside the checkout, would be missing there) and its tests run with the
current interpreter and ``PYTHONPATH`` pointing at the clone: nothing new is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    try:
        head = _git("rev-parse", "HEAD", cwd=REPO_ROOT)
    except subprocess.CalledProcessError:
        pytest.skip("not running from a git checkout")
    empty = tmp_path_factory.mktemp("fresh")
    assert not any(empty.iterdir())
    target = empty / "atc-stream"
    _git("clone", "--quiet", "--no-checkout", str(REPO_ROOT), str(target), cwd=empty)
    _git("checkout", "--quiet", head, cwd=target)
    return target


def _run_in(clone: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ATC_GOLDEN_DIR", "PYTHONPATH")}
    env["PYTHONPATH"] = str(clone)
    return subprocess.run(
        [sys.executable, *args], cwd=clone, env=env, capture_output=True, text=True, timeout=600
    )


def test_clone_has_spec_and_golden_vectors(clone: Path) -> None:
    assert (clone / "docs" / "spec.md").is_file()
    assert sorted(p.name for p in (clone / "tests" / "golden").glob("*.csv"))
    outside = ".." + "/shared"  # spelled in two parts so this file does not match itself
    for path in clone.rglob("*.py"):
        assert outside not in path.read_text(encoding="utf-8"), path


def test_clone_imports_its_own_package(clone: Path) -> None:
    done = _run_in(clone, "-c", "import atc_stream; print(atc_stream.__file__)")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).resolve().is_relative_to(clone.resolve())


def test_clone_passes_golden_and_parity_tests(clone: Path) -> None:
    done = _run_in(
        clone, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        "tests/test_reference.py",
        "tests/test_parity.py::test_compute_matches_golden_and_reference",
        "tests/test_parity.py::test_step_matches_reference_on_golden",
    )  # fmt: skip
    tail = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, tail
    assert " passed" in done.stdout and "failed" not in done.stdout, tail
    assert "skipped" not in done.stdout, tail
