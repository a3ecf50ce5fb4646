"""The one output schema: the columns of a signal row, wherever the row goes.

``compute()``, ``StepResult``, the JSONL / CSV / Parquet files and the Redis messages all
carry :data:`COLUMNS` (or the subset :func:`columns_for` of the requested
:data:`OUTPUT_GROUPS`), in this order, with the types of :data:`COLUMN_TYPES`;
docs/messages.md documents them. Times are epoch milliseconds (UTC); values not available
yet are NaN (``null`` in JSON). No third-party import at module level: the engine imports
this module, and only :func:`arrow_schema` needs pyarrow.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from atc_stream.core import output_row
from atc_stream.core.params import FAMILIES, N_FAMILIES, ATCParams

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

#: Where each continuous/discrete column comes from in a kernel output row (``output_row``).
_OUTPUT_INDEX: dict[str, int] = {
    "signal": output_row.OUT_SIGNAL,
    **{name: output_row.OUT_LAYER1 + j for j, name in enumerate(FAMILY_SIGNAL_COLUMNS)},
    **{name: output_row.OUT_LAYER2 + j for j, name in enumerate(FAMILY_EQUITY_COLUMNS)},
    "growth": output_row.OUT_GROWTH,
}

# -- requested outputs -------------------------------------------------------------------

#: Columns every row carries whatever outputs were requested: which stream and bar it is.
KEY_COLUMNS: tuple[str, ...] = (
    "symbol", "interval", "params_id", "time", "close", "bar_index", "provisional",
)  # fmt: skip
#: Output groups a caller can ask a step/preview for (``Engine(outputs=...)``) and the
#: schema columns each brings. "events" are the discrete columns: readiness and the
#: long/short crossings.
OUTPUT_GROUPS: dict[str, tuple[str, ...]] = {
    "signal": ("signal",),
    "events": ("ready", "long", "short"),
    "layers": FAMILY_SIGNAL_COLUMNS,
    "equities": FAMILY_EQUITY_COLUMNS,
    "growth": ("growth",),
}
#: Every group: the full schema (what the CLI writes).
ALL_OUTPUTS: tuple[str, ...] = tuple(OUTPUT_GROUPS)
#: What ``Engine`` returns unless told otherwise: the final signal and the events.
DEFAULT_OUTPUTS: tuple[str, ...] = ("signal", "events")


class OutputNotRequestedError(AttributeError):
    """A result column of an output group the engine was not asked for."""


def resolve_outputs(outputs: str | Sequence[str] | None) -> tuple[str, ...]:
    """Output groups in canonical order from what a caller passes.

    ``None``: :data:`DEFAULT_OUTPUTS`; ``"all"``: :data:`ALL_OUTPUTS`; a group name or a
    sequence of group names (``"all"`` allowed among them). Raises ``ValueError``
    naming the unknown ones.
    """
    if outputs is None:
        return DEFAULT_OUTPUTS
    names = [outputs] if isinstance(outputs, str) else list(outputs)
    if "all" in names:
        return ALL_OUTPUTS
    unknown = [g for g in names if g not in OUTPUT_GROUPS]
    if unknown:
        raise ValueError(
            f"outputs must be 'all' or among {list(OUTPUT_GROUPS)}, got unknown {unknown!r}"
        )
    return tuple(g for g in OUTPUT_GROUPS if g in names)


def columns_for(groups: Sequence[str]) -> tuple[str, ...]:
    """The schema columns (in :data:`COLUMNS` order) of rows carrying output ``groups``."""
    return _columns_for(tuple(groups))


@functools.lru_cache(maxsize=64)
def _columns_for(groups: tuple[str, ...]) -> tuple[str, ...]:
    # cached: every step result asks, and there are only a few group sets
    wanted = set(KEY_COLUMNS).union(*(OUTPUT_GROUPS[g] for g in groups))
    return tuple(name for name in COLUMNS if name in wanted)


#: dtype of every typed kernel field (``kernel_fields``); 2-D ones have one column per
#: family. Discrete fields are narrow (bool), continuous ones float64.
FIELD_DTYPES: dict[str, np.dtype] = {
    "bar_index": np.dtype(np.int64),
    "signal": np.dtype(np.float64),
    "long": np.dtype(np.bool_),
    "short": np.dtype(np.bool_),
    "layers": np.dtype(np.float64),
    "equities": np.dtype(np.float64),
    "growth": np.dtype(np.float64),
}
#: the typed kernel fields each output group needs (``bar_index`` is always there)
GROUP_FIELDS: dict[str, tuple[str, ...]] = {
    "signal": ("signal",),
    "events": ("long", "short"),
    "layers": ("layers",),
    "equities": ("equities",),
    "growth": ("growth",),
}
#: kernel output columns (``OUT_*``) of each float field, in field order
FLOAT_FIELD_COLUMNS: dict[str, tuple[int, ...]] = {
    "signal": (output_row.OUT_SIGNAL,),
    "layers": tuple(range(output_row.OUT_LAYER1, output_row.OUT_LAYER1 + N_FAMILIES)),
    "equities": tuple(range(output_row.OUT_LAYER2, output_row.OUT_LAYER2 + N_FAMILIES)),
    "growth": (output_row.OUT_GROWTH,),
}


def fields_for(groups: Sequence[str]) -> tuple[str, ...]:
    """The typed kernel fields that output ``groups`` need, ``bar_index`` first."""
    return _fields_for(tuple(groups))


@functools.lru_cache(maxsize=64)
def _fields_for(groups: tuple[str, ...]) -> tuple[str, ...]:
    return ("bar_index", *(f for g in groups for f in GROUP_FIELDS[g]))


def float_columns(groups: Sequence[str]) -> np.ndarray:
    """The kernel output columns of the float fields of ``groups``, in field order."""
    columns = [c for f in fields_for(groups) for c in FLOAT_FIELD_COLUMNS.get(f, ())]
    return np.array(columns, np.int64)


def kernel_fields(
    outputs: np.ndarray,
    groups: Sequence[str] = ALL_OUTPUTS,
    events: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> dict:
    """The typed fields of ``groups`` from kernel output rows ``[row, OUT_*]``.

    Floats are views of ``outputs`` (no copy); ``long``/``short`` bool, ``bar_index``
    int64 (-1 in rows that hold no result). ``events``: ``(bar_index, long, short)``
    already converted (the CPU backend does it in one compiled pass). The CUDA backend
    builds the same fields from packed device buffers.
    """
    long: np.ndarray | None
    short: np.ndarray | None
    if events is None:  # long and short converted below, only when a group needs them
        bar_index = outputs[:, output_row.OUT_BAR_INDEX]
        if np.isnan(bar_index).any():  # rows of rejected updates hold no result
            bar_index = np.where(np.isnan(bar_index), -1.0, bar_index)
        bar_index, long, short = bar_index.astype(np.int64), None, None
    else:
        bar_index, long, short = events
    fields: dict[str, np.ndarray] = {"bar_index": bar_index}
    for name in fields_for(groups)[1:]:
        if name == "long":
            fields[name] = outputs[:, output_row.OUT_LONG] == 1.0 if long is None else long
        elif name == "short":
            fields[name] = outputs[:, output_row.OUT_SHORT] == 1.0 if short is None else short
        else:
            first, last = FLOAT_FIELD_COLUMNS[name][0], FLOAT_FIELD_COLUMNS[name][-1]
            fields[name] = outputs[:, first] if first == last else outputs[:, first : last + 1]
    return fields


def columns_from_fields(
    fields: dict, ready_from: np.ndarray, groups: Sequence[str] = ALL_OUTPUTS
) -> dict[str, np.ndarray]:
    """The kernel-computed schema columns of ``groups`` (and ``bar_index``) from typed fields."""
    columns: dict[str, np.ndarray] = {"bar_index": fields["bar_index"]}
    for group in groups:
        if group == "signal":
            columns["signal"] = fields["signal"]
        elif group == "events":
            columns["ready"] = fields["bar_index"] >= ready_from
            columns["long"] = fields["long"]
            columns["short"] = fields["short"]
        elif group == "growth":
            columns["growth"] = fields["growth"]
        else:
            names = FAMILY_SIGNAL_COLUMNS if group == "layers" else FAMILY_EQUITY_COLUMNS
            for j, name in enumerate(names):
                columns[name] = fields[group][:, j]
    return columns


def output_columns(
    outputs: np.ndarray, ready_from: np.ndarray, groups: Sequence[str] = ALL_OUTPUTS
) -> dict[str, np.ndarray]:
    """The columns computed by the kernels, from output rows ``[row, OUT_*]``.

    ``ready_from`` is, per row, the first ready bar of the row's parameter set
    (:func:`ready_bar`). Returns ``bar_index`` and the columns of ``groups`` (all by
    default: ``signal``, ``ready``, ``long``, ``short``, the family columns and
    ``growth``), floats as views where possible, so no copy.
    """
    return columns_from_fields(kernel_fields(outputs, groups), ready_from, groups)


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


def arrow_schema(
    metadata: dict[str, str] | None = None, columns: Sequence[str] = COLUMNS
) -> pa.Schema:
    """The Arrow schema of ``columns`` (default :data:`COLUMNS`; Parquet files and
    ``StepResult.to_arrow``)."""
    import pyarrow as pa

    types = {
        "str": pa.string(),
        "int": pa.int64(),
        "float": pa.float64(),
        "bool": pa.bool_(),
        "time": pa.timestamp(TIME_UNIT, tz="UTC"),
    }
    fields = [pa.field(name, types[COLUMN_TYPES[name]], nullable=False) for name in columns]
    return pa.schema(fields, metadata=metadata)
