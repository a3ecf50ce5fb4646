"""atc-stream: exact, incremental Adaptive Trend Classification for many streams at once.

``Engine`` keeps per-stream state and applies closed bars in batches (CPU or GPU);
``compute`` runs one whole series; ``atc_stream.reference`` is the slow, readable oracle.
"""

from atc_stream.core.params import FAMILIES, ATCParams
from atc_stream.core.results import (
    PendingStep,
    Rejection,
    StepResult,
    StreamKey,
    UnknownStreamError,
)
from atc_stream.core.schema import OutputNotRequestedError
from atc_stream.core.version import __version__
from atc_stream.engine.engine import Engine
from atc_stream.engine.series import compute

__all__ = [
    "ATCParams",
    "Engine",
    "FAMILIES",
    "OutputNotRequestedError",
    "PendingStep",
    "Rejection",
    "StepResult",
    "StreamKey",
    "UnknownStreamError",
    "compute",
    "__version__",
]
