"""docs/architecture.md matches the package: every floor and module is described, each
module says its job in a short docstring and stays a size a newcomer can read."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "atc_stream"
ARCHITECTURE = (REPO / "docs" / "architecture.md").read_text()
MAX_MODULE_LINES = 700
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def floor_contract() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (floors,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    return floors


def test_the_floors_table_lists_the_contracts_layers_in_order():
    rows = re.findall(r"^\| (\w+) \| `atc_stream/(\w+)/` \|", ARCHITECTURE, re.M)
    assert [folder for _, folder in rows] == floor_contract()
    on_disk = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert on_disk == set(floor_contract())


@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_module_is_described_in_architecture_md(module: Path):
    if module.name == "__init__.py" and module.parent != PACKAGE:
        return  # a package's __init__ is its folder, described by its floor's row
    assert f"`{module.name}`" in ARCHITECTURE or f"{module.name}`" in ARCHITECTURE, (
        f"docs/architecture.md does not mention {module.relative_to(REPO)}"
    )


@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_module_says_its_job_briefly_and_stays_small(module: Path):
    source = module.read_text()
    docstring = ast.get_docstring(ast.parse(source))
    assert docstring, f"{module.relative_to(REPO)} has no module docstring"
    summary = docstring.split("\n\n")[0]
    assert len(summary.splitlines()) <= 3, f"{module.relative_to(REPO)}: summary too long"
    assert len(docstring.splitlines()) <= 12, (
        f"{module.relative_to(REPO)}: an essay in the docstring belongs in docs/design/"
    )
    assert len(source.splitlines()) <= MAX_MODULE_LINES, (
        f"{module.relative_to(REPO)} has {len(source.splitlines())} lines"
    )
