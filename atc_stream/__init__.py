"""atc-stream: exact, incremental Adaptive Trend Classification for many streams at once.

``Engine`` keeps per-stream state and applies closed bars in batches (CPU or GPU);
``compute`` runs one whole series; ``backtest`` trades the signals of a bar table;
``atc_stream.reference`` is the slow, readable oracle.
"""

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
from atc_stream.core.version import __version__
from atc_stream.engine.backtest import backtest
from atc_stream.engine.engine import Engine
from atc_stream.engine.series import compute

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
