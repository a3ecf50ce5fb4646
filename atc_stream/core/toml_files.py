"""TOML files (strategies, sweep grids) read one way: tomllib, or tomli before Python 3.11."""

from __future__ import annotations

import os
import sys
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # tomli is installed only where it is needed, so the checker may not find it
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]


def read_toml(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """The parsed document; ``ValueError`` (one line) naming ``what`` and ``path`` when the
    file cannot be read or is not TOML."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"cannot read {what} {path}: {exc}") from None
