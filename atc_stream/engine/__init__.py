"""The engine: the streams registry, warmup/step/preview, backend choice, ``compute``."""

from atc_stream.engine.engine import Engine

__all__ = ["Engine"]
