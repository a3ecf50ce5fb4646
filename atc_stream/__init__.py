"""atc-stream: exact, incremental Adaptive Trend Classification for many streams at once.

``Engine`` keeps per-stream state and applies closed bars in batches (CPU or GPU);
``compute`` runs one whole series; ``atc_stream.reference`` is the slow, readable oracle.
"""

from .engine import Engine
from .params import FAMILIES, ATCParams
from .results import PendingStep, Rejection, StepResult, StreamKey, UnknownStreamError
from .schema import OutputNotRequestedError
from .series import compute

__version__ = "0.1.0"

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
