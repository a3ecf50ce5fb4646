"""The sweep grid: a TOML file of ATC parameter lists × strategy lists, checked key by key.

``[atc]`` holds ``ATCParams`` fields, ``[strategy]`` ``Strategy`` fields; each value is
a list of values (or one value, a list of one). The sets are the cartesian product of
the lists, in file order with the last key varying fastest; ``params_id`` and
``strategy_id`` number them from 0. A missing or empty table is the defaults (one set);
a file with neither table is refused.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, fields
from typing import Any

import pyarrow as pa

from atc_stream.core.params import ATCParams
from atc_stream.core.strategy import Strategy
from atc_stream.core.toml_files import read_toml

#: The most sets one table, and the grid as a whole (``[atc]`` sets x ``[strategy]`` sets),
#: may produce: a typo like ``range(1000)`` is refused, not run.
MAX_SETS = 100_000
_TABLES: dict[str, type] = {"atc": ATCParams, "strategy": Strategy}


class GridError(ValueError):
    """A grid file that cannot be read or holds a bad key or value; one line naming it."""


@dataclass(frozen=True)
class Grid:
    """The parameter sets and strategies of a sweep, and the keys the file varied."""

    params: list[ATCParams]
    strategies: list[Strategy]
    #: ``[atc]`` and ``[strategy]`` keys with more than one value, in file order
    varied_params: tuple[str, ...] = ()
    varied_strategies: tuple[str, ...] = ()

    @property
    def sets(self) -> int:
        return len(self.params) * len(self.strategies)

    def params_table(self) -> pa.Table:
        """``params_id`` and every ``ATCParams`` field, one row per set."""
        return _table("params_id", self.params)

    def strategies_table(self) -> pa.Table:
        """``strategy_id`` and every ``Strategy`` field, one row per strategy."""
        return _table("strategy_id", self.strategies)


def load_grid(path: str | os.PathLike) -> Grid:
    """The ``Grid`` of a TOML file; ``GridError`` naming the file and the key."""
    try:
        data = read_toml(path, "grid")
    except ValueError as exc:
        raise GridError(str(exc)) from None
    return parse_grid(data, where=str(path))


def parse_grid(data: dict[str, Any], where: str = "grid") -> Grid:
    """The ``Grid`` of a parsed TOML document (see the module docstring)."""
    unknown = sorted(set(data) - set(_TABLES))
    if unknown:
        raise GridError(
            f"{where}: unknown table or key {', '.join(map(repr, unknown))} (a grid has "
            "[atc] and [strategy])"
        )
    if not data:  # likely the wrong file: an empty [atc] or [strategy] table says "defaults"
        raise GridError(f"{where}: the grid is empty (give an [atc] or a [strategy] table)")
    params, varied_params = _product(data.get("atc", {}), ATCParams, "atc", where)
    strategies, varied_strategies = _product(data.get("strategy", {}), Strategy, "strategy", where)
    if len(params) * len(strategies) > MAX_SETS:  # each table alone may be under the limit
        raise GridError(
            f"{where}: {len(params)} [atc] sets x {len(strategies)} [strategy] sets = "
            f"{len(params) * len(strategies)} sets (at most {MAX_SETS})"
        )
    return Grid(params, strategies, varied_params, varied_strategies)


def _product(table: Any, cls: type, name: str, where: str) -> tuple[list[Any], tuple[str, ...]]:
    if not isinstance(table, dict):
        raise GridError(f"{where}: [{name}] must be a table of keys, got {type(table).__name__}")
    known = [f.name for f in fields(cls)]
    values: dict[str, list[Any]] = {}
    for key, value in table.items():
        if key not in known:
            raise GridError(f"{where}: [{name}] unknown key {key!r} (keys: {', '.join(known)})")
        items = value if isinstance(value, list) else [value]
        if not items:
            raise GridError(f"{where}: [{name}] {key} is an empty list")
        for item in items:
            if isinstance(item, (list, dict)):
                raise GridError(f"{where}: [{name}] {key}: a value must be a number or text")
        if len(set(map(_same, items))) != len(items):
            raise GridError(f"{where}: [{name}] {key} repeats a value: {items}")
        values[key] = items
    count = 1
    for items in values.values():
        count *= len(items)
    if count > MAX_SETS:
        raise GridError(f"{where}: [{name}] gives {count} combinations (at most {MAX_SETS})")
    keys = list(values)
    sets = []
    for combo in itertools.product(*values.values()):
        try:
            sets.append(cls(**dict(zip(keys, combo, strict=True))))
        except (TypeError, ValueError) as exc:
            setting = ", ".join(f"{k}={v!r}" for k, v in zip(keys, combo, strict=True))
            raise GridError(f"{where}: [{name}] {exc} (in {setting})") from None
    return sets, tuple(k for k in keys if len(values[k]) > 1)


def _same(item: Any) -> Any:
    """What makes two values of a key the same set: 5 and 5.0, or 0 and -0.0, are one
    number once the dataclass normalises them (Python's ``==`` says so); ``true`` is not 1."""
    return isinstance(item, bool), item


def _table(id_column: str, items: list[Any]) -> pa.Table:
    rows = [item.to_dict() for item in items]
    columns: dict[str, Any] = {id_column: pa.array(range(len(rows)), pa.int32())}
    for f in fields(type(items[0])):
        columns[f.name] = [row[f.name] for row in rows]
    return pa.table(columns)
