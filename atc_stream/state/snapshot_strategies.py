"""The strategy part of a snapshot: its arrays, their dtypes and shapes, the layout
fingerprint and the check that the stored strategy table matches its strategies."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from atc_stream.core.strategy import Strategy
from atc_stream.state import strategy_layout as SL
from atc_stream.state.arrays import StrategyTable

#: The strategy arrays in payload order (after the ATC ones), with their dtypes; a
#: format-1 snapshot has none of them (it loads as an engine without strategies).
STRATEGY_DTYPES: dict[str, str] = {
    "strategy_values": "<f8",
    "strategy_counters": "<i8",
    "strategy_entry_times": "<i8",
    "strategy_param_values": "<f8",
    "strategy_param_ints": "<i8",
}


def strategy_layout_fingerprint() -> dict[str, int]:
    """The constants the strategy arrays depend on (``state/strategy_layout.py``)."""
    return {
        name: getattr(SL, name)
        for name in (
            "N_STRATEGY_VALUES", "N_STRATEGY_COUNTERS", "N_STRATEGY_PARAM_VALUES",
            "N_STRATEGY_PARAM_INTS", "S_CASH", "S_EQUITY", "S_SIDE", "S_BARS", "S_TRADES",
        )
    }  # fmt: skip


def strategy_shapes(rows: int, n_strategies: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the strategy arrays of ``rows`` state rows (slots x strategies)."""
    return {
        "strategy_values": (rows, SL.N_STRATEGY_VALUES),
        "strategy_counters": (rows, SL.N_STRATEGY_COUNTERS),
        "strategy_entry_times": (rows,),
        "strategy_param_values": (n_strategies, SL.N_STRATEGY_PARAM_VALUES),
        "strategy_param_ints": (n_strategies, SL.N_STRATEGY_PARAM_INTS),
    }


def empty_strategy_arrays(rows: int, n_strategies: int) -> dict[str, np.ndarray]:
    """Zeroed strategy arrays (with 0 strategies: what a format-1 snapshot implies)."""
    shapes = strategy_shapes(rows, n_strategies)
    return {name: np.zeros(shape, STRATEGY_DTYPES[name]) for name, shape in shapes.items()}


def check_strategy_table(strategies: list[dict[str, Any]], arrays: Mapping[str, np.ndarray]):
    """``ValueError`` unless the strategy dicts rebuild exactly the stored table."""
    table = StrategyTable([Strategy.from_dict(d) for d in strategies])
    values = arrays["strategy_param_values"]
    if not (
        np.array_equal(table.values.view(np.int64), values.view(np.int64))
        and np.array_equal(table.ints, arrays["strategy_param_ints"])
    ):
        raise ValueError("the stored strategy table does not match the strategies")
