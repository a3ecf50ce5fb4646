"""The readable full-history reference ATC, the oracle every path is tested against
(``atc_stream.core.reference``, under its public name)."""

from atc_stream.core.reference import *  # noqa: F403
from atc_stream.core.reference import __all__  # noqa: F401
