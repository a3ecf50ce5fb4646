"""The one output schema: the columns of a signal row, wherever the row goes.

``compute()``, ``StepResult`` (``columns``, ``records``, ``to_pandas``, ``to_arrow``), the
JSONL / CSV / Parquet files and the Redis messages all carry exactly :data:`COLUMNS`, in
this order, with the types of :data:`COLUMN_TYPES`; docs/messages.md documents them once.

Times are integers, milliseconds since the Unix epoch (UTC), in JSON, CSV and Redis, and
``timestamp[ms, tz=UTC]`` in Arrow, Parquet and pandas. Continuous values that are not
available yet (before the cutout, or an MA without enough bars) are NaN in arrays and
``null`` in JSON.

No third-party import at module level: the engine imports this module, and pyarrow is
only needed by :func:`arrow_schema` (msgspec structs live in ``atc_stream.messages``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .params import FAMILIES, ATCParams
from .state import layout as L

if TYPE_CHECKING:
    import pyarrow as pa

#: Version of the row schema (field ``v`` of Redis messages; Parquet metadata).
SCHEMA_VERSION = 2
#: Unit of the integer ``time`` column (and of every engine time).
TIME_UNIT = "ms"

#: ``<family>_signal``: layer-1 signal of each MA family, families in canonical order.
FAMILY_SIGNAL_COLUMNS: tuple[str, ...] = tuple(f"{f.lower()}_signal" for f in FAMILIES)
#: ``<family>_equity``: layer-2 equity ``S_f`` of each MA family.
FAMILY_EQUITY_COLUMNS: tuple[str, ...] = tuple(f"{f.lower()}_equity" for f in FAMILIES)

#: Logical type of every column, in schema order. "time" is epoch ms (int) / UTC timestamp.
COLUMN_TYPES: dict[str, str] = {
    "symbol": "str",
    "interval": "str",
    "params_id": "int",
    "time": "time",
    "close": "float",
    "bar_index": "int",
    "signal": "float",
    "ready": "bool",
    "long": "bool",
    "short": "bool",
    **{name: "float" for name in FAMILY_SIGNAL_COLUMNS},
    **{name: "float" for name in FAMILY_EQUITY_COLUMNS},
    "growth": "float",
    "provisional": "bool",
}
#: Every column of a signal row, in order.
COLUMNS: tuple[str, ...] = tuple(COLUMN_TYPES)

#: Where each continuous/discrete column comes from in a kernel output row (state/layout.py).
_OUTPUT_INDEX: dict[str, int] = {
    "signal": L.OUT_SIGNAL,
    **{name: L.OUT_LAYER1 + j for j, name in enumerate(FAMILY_SIGNAL_COLUMNS)},
    **{name: L.OUT_LAYER2 + j for j, name in enumerate(FAMILY_EQUITY_COLUMNS)},
    "growth": L.OUT_GROWTH,
}


def output_columns(outputs: np.ndarray, ready_from: np.ndarray) -> dict[str, np.ndarray]:
    """The columns computed by the kernels, from output rows ``[row, OUT_*]``.

    ``ready_from`` is, per row, the first ready bar of the row's parameter set
    (:func:`ready_bar`). Returns ``bar_index``, ``signal``, ``ready``, ``long``, ``short``,
    the family columns and ``growth`` (views where possible, so no copy of the floats).
    """
    bar_index = outputs[:, L.OUT_BAR_INDEX].astype(np.int64)
    columns = {
        "bar_index": bar_index,
        "signal": outputs[:, L.OUT_SIGNAL],
        "ready": bar_index >= ready_from,
        "long": outputs[:, L.OUT_LONG] == 1.0,
        "short": outputs[:, L.OUT_SHORT] == 1.0,
    }
    for name in (*FAMILY_SIGNAL_COLUMNS, *FAMILY_EQUITY_COLUMNS, "growth"):
        columns[name] = outputs[:, _OUTPUT_INDEX[name]]
    return columns


def ready_bar(params: ATCParams) -> int:
    """First ``bar_index`` whose outputs come from full windows (docs/spec.md, "Readiness").

    The later of the cutout (both equity layers defined from there) and the first bar on
    which every moving average has its full window: EMA, SMA ("HMA"), WMA and LSMA of
    length L at bar L−1, DEMA at 2L−2 (its second EMA is seeded then), KAMA at L (its
    efficiency ratio reads ``c[L]``). With the defaults: DEMA(34) → bar 66.
    """
    first_full = {
        "EMA": lambda n: n - 1,
        "HMA": lambda n: n - 1,
        "WMA": lambda n: n - 1,
        "DEMA": lambda n: 2 * n - 2,
        "LSMA": lambda n: n - 1,
        "KAMA": lambda n: n,
    }
    full = max(
        first_full[family](n)
        for family, lengths in zip(FAMILIES, params.lengths, strict=True)
        for n in lengths
    )
    return max(params.cutout, full)


def params_metadata(param_sets: Sequence[ATCParams], interval: str | None = None) -> dict:
    """File metadata (Parquet key-value, CSV/JSONL side files) describing how rows were made."""
    meta: dict[str, Any] = {
        "atc_stream.schema_version": SCHEMA_VERSION,
        "atc_stream.time_unit": TIME_UNIT,
        "atc_stream.params": [p.to_dict() for p in param_sets],
    }
    if interval is not None:
        meta["atc_stream.interval"] = interval
    return {k: json.dumps(v) for k, v in meta.items()}


def arrow_schema(metadata: dict[str, str] | None = None) -> pa.Schema:
    """The Arrow schema of :data:`COLUMNS` (Parquet files and ``StepResult.to_arrow``)."""
    import pyarrow as pa

    types = {
        "str": pa.string(),
        "int": pa.int64(),
        "float": pa.float64(),
        "bool": pa.bool_(),
        "time": pa.timestamp(TIME_UNIT, tz="UTC"),
    }
    fields = [pa.field(name, types[kind], nullable=False) for name, kind in COLUMN_TYPES.items()]
    return pa.schema(fields, metadata=metadata)
