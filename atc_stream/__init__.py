"""atc-stream: exact, incremental Adaptive Trend Classification for many streams at once.

``Engine`` keeps per-stream state and applies closed bars in batches (CPU or GPU);
``compute`` runs one whole series; ``backtest`` trades the signals of a bar table;
``atc_stream.reference`` is the slow, readable oracle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from atc_stream.core.version import __version__

if TYPE_CHECKING:
    from atc_stream.core.backtest_result import BacktestResult
    from atc_stream.core.params import FAMILIES, ATCParams
    from atc_stream.core.results import (
        PendingStep,
        Rejection,
        StepResult,
        StreamKey,
        UnknownStreamError,
    )
    from atc_stream.core.schema import OutputNotRequestedError
    from atc_stream.core.strategy import Strategy
    from atc_stream.engine.backtest import backtest
    from atc_stream.engine.engine import Engine
    from atc_stream.engine.series import compute

# The public names load on first use: importing the package (as every ``atc-stream``
# command does first) costs nothing until the engine is asked for, so the command can
# answer a Ctrl-C during its start-up with one line.
_HOMES = {
    "ATCParams": "atc_stream.core.params",
    "BacktestResult": "atc_stream.core.backtest_result",
    "Engine": "atc_stream.engine.engine",
    "FAMILIES": "atc_stream.core.params",
    "OutputNotRequestedError": "atc_stream.core.schema",
    "PendingStep": "atc_stream.core.results",
    "Rejection": "atc_stream.core.results",
    "StepResult": "atc_stream.core.results",
    "StreamKey": "atc_stream.core.results",
    "Strategy": "atc_stream.core.strategy",
    "UnknownStreamError": "atc_stream.core.results",
    "backtest": "atc_stream.engine.backtest",
    "compute": "atc_stream.engine.series",
}

__all__ = [
    "ATCParams",
    "BacktestResult",
    "Engine",
    "FAMILIES",
    "OutputNotRequestedError",
    "PendingStep",
    "Rejection",
    "StepResult",
    "StreamKey",
    "Strategy",
    "UnknownStreamError",
    "backtest",
    "compute",
    "__version__",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'atc_stream' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
