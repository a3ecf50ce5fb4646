"""``compute``: fast full-history ATC for one series (the warmup kernel, every bar kept).

Returns the one output schema (``atc_stream.core.schema.COLUMNS``): a dict of NumPy arrays, or
a pandas DataFrame on the input's index when given pandas.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from atc_stream.core import inputs, schema
from atc_stream.core.intervals import validate_interval
from atc_stream.core.params import ATCParams
from atc_stream.engine.backtest import check_param_set
from atc_stream.engine.breakdown import check_series
from atc_stream.state.arrays import StateStore


def compute(
    closes: Sequence[float] | np.ndarray | Any,
    params: ATCParams | None = None,
    *,
    times: Any = None,
    time_unit: str | None = None,
    symbol: str = "",
    interval: str = "",
    params_id: int = 0,
    threads: int | None = None,
) -> dict[str, np.ndarray] | Any:
    """ATC over a whole close series, every bar, in the one output schema.

    ``closes``: a NumPy array, list, pandas Series (any index) or pyarrow array. Bar times
    come from ``times`` (any form ``atc_stream.inputs.times_to_ms`` takes, integer epochs
    in ``time_unit``), else from the Series' DatetimeIndex, else they are the bar index.
    ``symbol``/``interval``/``params_id`` fill those columns (``interval``: "" or a label
    ``core.intervals`` accepts, ``1m``, ``4h``...).

    Returns :data:`atc_stream.core.schema.COLUMNS` as a dict of NumPy arrays (``time`` int64
    epoch ms), or, given a pandas Series, a DataFrame on the Series' index (``time`` as
    UTC timestamps). Column names are the schema's (``signal``, ``ema_signal``,
    ``ema_equity``...); the golden-vector names (``Average_Signal``, ``EMA_S``...) are
    those of ``atc_stream.reference`` only. One series runs on one thread whatever
    ``threads`` says (a stream is sequential); it is accepted so that every entry point
    takes the same setting.
    """
    from atc_stream.kernels.cpu import CpuBackend

    params = ATCParams() if params is None else check_param_set(params)
    if interval:  # "" (the default) leaves the column blank
        validate_interval(interval)
    index = None
    if inputs.is_pandas(closes, "Series"):
        series: Any = closes  # pandas is optional: no static type for its Series here
        index = series.index
    values = inputs.closes_array(closes)
    if values.ndim != 1:
        raise ValueError(f"closes must be 1-D, got shape {values.shape}")
    if not np.all(np.isfinite(values)) or not np.all(values > 0):
        bad = int(np.flatnonzero(~(np.isfinite(values) & (values > 0)))[0])
        raise ValueError(f"closes must be finite and > 0; closes[{bad}] = {float(values[bad])!r}")
    n = values.shape[0]
    bar_times = _bar_times(times, index, n, time_unit)
    store = StateStore(capacity=1)
    slot = store.allocate(store.add_params(params))
    out = CpuBackend(store, threads).warmup(
        np.array([slot], np.int64),
        np.arange(n, dtype=np.int64)[None, :],
        values[None, :],
        np.array([n], np.int64),
        True,
    )[0, :n]
    columns: dict[str, np.ndarray] = {
        "symbol": np.full(n, symbol, dtype=object),
        "interval": np.full(n, interval, dtype=object),
        "params_id": np.full(n, params_id, np.int64),
        "time": bar_times,
        "close": values.copy(),
        "provisional": np.zeros(n, bool),
    }
    columns.update(schema.output_columns(out, np.full(n, schema.ready_bar(params), np.int64)))
    columns = {name: columns[name] for name in schema.COLUMNS}
    check_series(columns, params, symbol)
    if index is not None:
        from atc_stream.core.frames import to_pandas

        return to_pandas(columns, index=index)
    return columns


def _bar_times(times: Any, index: Any, n: int, time_unit: str | None) -> np.ndarray:
    if times is None and index is not None and inputs.is_pandas(index, "DatetimeIndex"):
        times = index
    if times is None:
        return np.arange(n, dtype=np.int64)
    what = "times" if times is not index else "index"
    ms = inputs.times_to_ms(times, time_unit, what=what)
    if ms.shape != (n,):
        raise ValueError(f"{what} must have one entry per close ({n}), got shape {ms.shape}")
    later = ms[1:] > ms[:-1]
    if not later.all():
        # a newest-first file or a repeated bar would be computed as given, silently wrong
        i = int(np.flatnonzero(~later)[0]) + 1
        raise ValueError(
            f"{what} must be strictly increasing (oldest bar first, one row a bar): "
            f"{what}[{i}] = {int(ms[i])} ms is not after {what}[{i - 1}] = {int(ms[i - 1])} ms"
        )
    return ms
