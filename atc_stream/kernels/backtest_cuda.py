"""The batched backtest on the GPU: ``kernels/strategy.py`` as numba-cuda device
functions, one thread per stream, compiled without FMA contraction."""

from __future__ import annotations

import numpy as np
from numba import cuda

from atc_stream.kernels import strategy
from atc_stream.kernels.backtest_cpu import (
    backtest_outputs,
    default_trade_capacity,
    with_room_for_every_trade,
)
from atc_stream.kernels.compile import compile_module
from atc_stream.kernels.cuda_launch import configure
from atc_stream.kernels.ptx_guard import check_no_fma, no_fma
from atc_stream.kernels.ptx_guard import kernel as ptx_kernel

_kernel = ptx_kernel  # compiled from the checked -fma=0 PTX (link-time optimisation off)

#: ``kernels/strategy.py`` as device functions (also the live strategy step's, ``cuda_paper.py``)
device_strategy = compile_module(strategy, cuda.jit(device=True))
backtest_stream = device_strategy.backtest_stream

THREADS_PER_BLOCK = 128


@_kernel
def backtest_kernel(
    opens, highs, lows, closes, lengths, ready, longs, shorts,
    bar_series, signal_series, strategy_rows, spv, spi, sv, sc,
    equity, held, trades, metrics,
):  # fmt: skip
    """Thread ``s`` runs stream ``s`` (``strategy.backtest_stream``), like one iteration
    of ``backtest_cpu.backtest_streams``."""
    s: int = cuda.grid(1)  # type: ignore[call-arg]
    if s < bar_series.shape[0]:
        backtest_stream(
            opens, highs, lows, closes, lengths, ready, longs, shorts,
            bar_series, signal_series, strategy_rows, spv, spi, sv, sc,
            equity, held, trades, metrics, s,
        )  # fmt: skip


def run_backtest_cuda(
    opens: np.ndarray,
    highs: np.ndarray,
    lows: np.ndarray,
    closes: np.ndarray,
    lengths: np.ndarray,
    ready: np.ndarray,
    longs: np.ndarray,
    shorts: np.ndarray,
    bar_series: np.ndarray,
    signal_series: np.ndarray,
    strategy_rows: np.ndarray,
    strategy_values: np.ndarray,
    strategy_ints: np.ndarray,
    trade_capacity: int | None = None,
) -> dict[str, np.ndarray]:
    """``backtest_cpu.run_backtest`` on the device: same arguments, same outputs, same bits."""
    n_bars = opens.shape[1]
    shared = [
        cuda.to_device(np.ascontiguousarray(a))
        for a in (opens, highs, lows, closes, lengths, ready, longs, shorts)
    ]
    table = [cuda.to_device(np.ascontiguousarray(a)) for a in (strategy_values, strategy_ints)]
    names = ("sv", "sc", "equity", "held", "trades", "metrics")

    def run_once(bar_series, signal_series, strategy_rows, capacity):
        n_streams = bar_series.shape[0]
        host = backtest_outputs(n_streams, n_bars, capacity)
        if n_streams == 0:
            return host
        per_stream = [
            cuda.to_device(np.ascontiguousarray(a))
            for a in (bar_series, signal_series, strategy_rows)
        ]
        outputs = [cuda.to_device(host[name]) for name in names]
        blocks = (n_streams + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK
        with no_fma():
            launch = configure(backtest_kernel, blocks, THREADS_PER_BLOCK)
            launch(*shared, *per_stream, *table, *outputs)
        check_no_fma(backtest_kernel, "backtest_kernel")
        for name, array in zip(names, outputs, strict=True):
            host[name] = array.copy_to_host()
        return host

    capacity = default_trade_capacity(n_bars) if trade_capacity is None else trade_capacity
    return with_room_for_every_trade(run_once, (bar_series, signal_series, strategy_rows), capacity)
