"""The last bar time the engine holds for each symbol, as the live feed tracks it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def engine_lasts(engine: Any, symbols: Iterable[str]) -> dict[str, int | None]:
    """Last bar time of each symbol's streams in ``engine`` (the earliest where they
    differ; None when none of them holds a bar)."""
    out = {}
    for symbol in symbols:
        lasts = [t for t in engine.last_bar_times(symbol) if t is not None]
        out[symbol] = min(lasts, default=None)
    return out
