"""pandas output of the one schema: columns (``StepResult.columns()``, ``compute``) to a
DataFrame with tz-aware UTC times. pandas is imported only when called."""

from __future__ import annotations

from typing import Any

import numpy as np

from atc_stream.core import schema


def to_pandas(columns: dict[str, np.ndarray], index: Any = None):
    """A DataFrame of schema ``columns`` (in :data:`schema.COLUMNS` order; all of them or
    a requested subset).

    ``time`` (int epoch ms) becomes ``datetime64[ms, UTC]``; ``symbol``/``interval`` stay
    Python ``str`` objects; NaN stays NaN. ``index`` (e.g. a compute input's index) is
    the frame's index when given (values are placed by position), else a RangeIndex.
    """
    try:
        import pandas as pd
    except ImportError:
        raise ImportError(
            "pandas output needs pandas, not installed: pip install 'atc-stream[pandas]'"
        ) from None

    data: dict[str, Any] = {}
    for name in schema.COLUMNS:
        if name not in columns:  # a result of fewer requested outputs
            continue
        values = columns[name]
        if schema.COLUMN_TYPES[name] == "time":
            stamps = np.asarray(values, np.int64).astype("datetime64[ms]")
            values = pd.DatetimeIndex(stamps).tz_localize("UTC")  # an Index: placed, not aligned
        data[name] = values
    return pd.DataFrame(data, index=index)
