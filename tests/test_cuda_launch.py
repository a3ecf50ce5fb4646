"""Configured CUDA launches (``kernels.cuda_launch``): made once per shape, and without
numba-cuda's small-grid warning, which a real dispatcher gives below 128 blocks. The
launches themselves run in the CUDA tests (simulator and device); here a stand-in
kernel gives the warning the way numba-cuda's configuration does."""

from __future__ import annotations

import warnings

import pytest
from numba.core.errors import NumbaPerformanceWarning

from atc_stream.kernels.cuda_launch import Launches, configure


class WarningKernel:
    """Configures like a numba-cuda dispatcher: ``kernel[grid, block, stream]``, with its
    low-occupancy warning for a small grid, and any other warning passed through."""

    def __init__(self, other: Warning | None = None) -> None:
        self.configured: list[tuple] = []
        self.other = other

    def __getitem__(self, shape):
        self.configured.append(shape)
        if shape[0] < 128:
            warning = NumbaPerformanceWarning(f"Grid size {shape[0]} will likely ...")
            warnings.warn(warning, stacklevel=2)
        if self.other is not None:
            warnings.warn(self.other, stacklevel=2)
        return ("launch", shape)


def test_configure_drops_only_the_small_grid_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert configure(WarningKernel(), 3, 128, "s") == ("launch", (3, 128, "s"))
    with pytest.warns(UserWarning, match="kept"):
        configure(WarningKernel(UserWarning("kept")), 3, 128)


def test_each_shape_is_configured_once_on_the_stream():
    kernel, other = WarningKernel(), WarningKernel()
    launches = Launches("stream", keep=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = launches(kernel, 2, 128)
        assert launches(kernel, 2, 128) is first
        launches(kernel, 3, 128)
        launches(kernel, 2, 64)
        launches(other, 2, 128)
    assert kernel.configured == [(2, 128, "stream"), (3, 128, "stream"), (2, 64, "stream")]
    assert other.configured == [(2, 128, "stream")]


def test_under_the_simulator_every_launch_is_configured_again():
    """The simulator's configuration is the kernel itself, set to the last shape."""
    kernel = WarningKernel()
    launches = Launches("stream", keep=False)
    for blocks in (2, 3, 2):
        assert launches(kernel, blocks, 128) == ("launch", (blocks, 128, "stream"))
    assert kernel.configured == [(2, 128, "stream"), (3, 128, "stream"), (2, 128, "stream")]
