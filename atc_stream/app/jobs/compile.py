"""The ``compile`` job: fill the kernel cache now (e.g. in a Docker build step)."""

from __future__ import annotations

from atc_stream.app.console import err
from atc_stream.engine.engine import Engine


def run_compile() -> int:
    """Compile or load every CPU kernel into the on-disk cache; the exit status."""
    try:
        result = Engine.compile(lambda line: err(f"atc-stream: {line}"))
    except OSError as exc:
        err(f"atc-stream: cannot compile kernels: {exc}")
        return 2
    err(f"atc-stream: {result.summary()}")
    return 0
