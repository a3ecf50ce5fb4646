"""Configured CUDA launches, made once per kernel, grid, block and stream, without
numba-cuda's warning about small grids."""

from __future__ import annotations

import warnings
from typing import Any

from numba.core.errors import NumbaPerformanceWarning

from atc_stream.kernels import cuda_simulated


def configure(kernel: Any, blocks: int, threads: int, stream: Any = 0) -> Any:
    """``kernel[blocks, threads, stream]``. numba-cuda warns at every configuration of
    fewer than 128 blocks; here a small grid is the engine's choice for a small batch
    (one thread per stream), so that warning would only fill a user's log."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaPerformanceWarning)
        return kernel[blocks, threads, stream]


class Launches:
    """The configured launches of one stream, kept: configuring one costs host time at
    every launch (the stream's conversion, the warning's check). Under the simulator a
    configuration is the kernel itself, set to the last shape asked for, so nothing is
    kept there."""

    def __init__(self, stream: Any, keep: bool | None = None) -> None:
        self.stream = stream
        self.keep = not cuda_simulated() if keep is None else keep
        self._configured: dict[tuple[Any, int, int], Any] = {}

    def __call__(self, kernel: Any, blocks: int, threads: int) -> Any:
        if not self.keep:
            return configure(kernel, blocks, threads, self.stream)
        key = (kernel, blocks, threads)
        launch = self._configured.get(key)
        if launch is None:
            launch = self._configured[key] = configure(kernel, blocks, threads, self.stream)
        return launch
