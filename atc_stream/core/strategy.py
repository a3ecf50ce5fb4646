"""Strategy: the validated trading rules of one strategy stream (docs/spec.md, "Backtest")."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields
from typing import Any

from atc_stream.core.params import MAX_COUNT, _is_int, _is_real
from atc_stream.core.toml_files import read_toml

#: The values of ``Strategy.direction``, and the side code each one allows.
DIRECTIONS: tuple[str, ...] = ("long_short", "long_only", "short_only")
#: Why a trade ended (``reason`` column of a trade), in code order (0, 1, 2, 3).
EXIT_REASONS: tuple[str, ...] = ("signal", "stop", "take_profit", "time")

_FLOAT_FIELDS = ("stop", "take_profit", "fee_bps", "slippage_bps")


@dataclass(frozen=True)
class Strategy:
    """How a stream trades its ATC events: direction, stop, take-profit, time exit, costs.

    ``stop`` and ``take_profit`` are fractions of the entry price (0 = none), ``max_hold``
    a number of bars (0 = none), ``fee_bps`` and ``slippage_bps`` basis points. Invalid
    values raise ``ValueError`` naming the field.
    """

    direction: str = "long_short"
    stop: float = 0.0
    take_profit: float = 0.0
    max_hold: int = 0
    fee_bps: float = 0.0
    slippage_bps: float = 0.0

    def __post_init__(self) -> None:
        if type(self.direction).__name__ == "str_":
            object.__setattr__(self, "direction", str(self.direction))
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {list(DIRECTIONS)}, got {self.direction!r}")
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if not _is_real(value) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value))
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        if not self.stop < 1:
            raise ValueError(f"stop must be < 1 (a fraction of the entry price), got {self.stop!r}")
        if self.direction != "long_only" and not self.take_profit < 1:
            raise ValueError(
                f"take_profit must be < 1 for a strategy that can go short (the price "
                f"cannot fall by 100 %), got {self.take_profit!r}"
            )
        for name in ("fee_bps", "slippage_bps"):  # 10000 bps takes the whole price
            if not getattr(self, name) < 10_000:
                raise ValueError(f"{name} must be < 10000, got {getattr(self, name)!r}")
        if not _is_int(self.max_hold) or not 0 <= self.max_hold <= MAX_COUNT:
            raise ValueError(
                f"max_hold must be an int in [0, {MAX_COUNT}] (bars), got {self.max_hold!r}"
            )
        object.__setattr__(self, "max_hold", int(self.max_hold))

    @property
    def fee(self) -> float:
        """``f`` of the spec: ``fee_bps / 10000.0``."""
        return self.fee_bps / 10000.0

    @property
    def slippage(self) -> float:
        """``s`` of the spec: ``slippage_bps / 10000.0``."""
        return self.slippage_bps / 10000.0

    @property
    def long_target(self) -> int:
        """The side a long event asks for: +1, or 0 for ``short_only``."""
        return 0 if self.direction == "short_only" else 1

    @property
    def short_target(self) -> int:
        """The side a short event asks for: -1, or 0 for ``long_only``."""
        return 0 if self.direction == "long_only" else -1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Strategy:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown strategy parameter(s): {', '.join(unknown)}")
        return cls(**data)


def load_strategies(path: str | os.PathLike) -> list[Strategy]:
    """Strategies from a TOML file: ``[[strategy]]`` tables (or one table of fields); an
    empty ``[[strategy]]`` table is the default strategy.

    ``ValueError`` (one line) for a file that cannot be read, holds no strategy, a key
    beside the ``[[strategy]]`` tables or an invalid value.
    """
    data = read_toml(path, "strategies from")
    if not data:
        raise ValueError(f"{path}: no strategy (give [[strategy]] tables of key = value)")
    if "strategy" in data:
        others = sorted(set(data) - {"strategy"})
        if others:
            raise ValueError(f"{path}: unknown key(s) beside [[strategy]]: {', '.join(others)}")
        items = data["strategy"]
    else:
        items = data
    items = items if isinstance(items, list) else [items]
    if not items:
        raise ValueError(f"{path}: no strategy (give [[strategy]] tables of key = value)")
    try:
        return [Strategy.from_dict(_table(item)) for item in items]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None


def _table(item: Any) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise ValueError(f"a strategy must be a table of key = value, got {item!r}")
    return item


def parse_strategy(text: str) -> Strategy:
    """A strategy from inline ``key=value,key=value`` (e.g. ``stop=0.02,direction=long_only``);
    ``ValueError`` (one line) for a malformed pair, an unknown key or an invalid value."""
    known = {f.name: f.type for f in fields(Strategy)}
    data: dict[str, Any] = {}
    for pair in (p.strip() for p in text.split(",")):
        if not pair:
            continue
        key, sep, value = (s.strip() for s in pair.partition("="))
        if not sep or not key:
            raise ValueError(f"{pair!r} is not key=value")
        if key not in known:
            raise ValueError(f"unknown strategy parameter {key!r} (known: {', '.join(known)})")
        if key in data:
            raise ValueError(f"{key!r} given twice")
        data[key] = value if key == "direction" else _number(key, value)
    if not data:  # an empty value is more likely a lost variable than a wish for defaults
        raise ValueError(
            "an empty strategy: give key=value,... (direction=long_short for the defaults)"
        )
    return Strategy.from_dict(data)


def _number(key: str, value: str) -> int | float:
    try:
        return int(value) if key == "max_hold" else float(value)
    except ValueError:
        kind = "an int" if key == "max_hold" else "a number"
        raise ValueError(f"{key} must be {kind}, got {value!r}") from None


def strategies_from_specs(specs: list[str]) -> list[Strategy]:
    """The strategies of ``--strategy`` values, in order: each a TOML file of strategies
    (a path ending ``.toml`` or an existing file) or an inline ``key=value,...`` spec."""
    out: list[Strategy] = []
    for spec in specs:
        if spec.endswith(".toml") or ("=" not in spec and os.path.isfile(spec)):
            out.extend(load_strategies(spec))
        else:
            try:
                out.append(parse_strategy(spec))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{spec!r}: {exc}") from None
    return out
