"""Result and rejection types returned by the engine (no numba, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import schema
from .params import FAMILIES
from .state import layout as L


@dataclass(frozen=True, order=True)
class StreamKey:
    """One stream: a symbol at one bar interval under one parameter set."""

    symbol: str
    interval: str
    params_id: int

    def __str__(self) -> str:
        return f"{self.symbol}:{self.interval}:{self.params_id}"


class UnknownStreamError(KeyError, ValueError):
    """A stream key (or symbol) that is not registered. A ``KeyError`` (lookups) and a
    ``ValueError`` (bad argument), so either ``except`` catches it; the message names
    the key and the registered streams."""

    def __str__(self) -> str:  # KeyError would show the message quoted
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Rejection:
    """One input that was left out, with why and the offending value."""

    index: int  #: position of the input in its batch (or bar position in a warmup history)
    reason: str
    detail: str
    symbol: str | None = None


class StepResult:
    """Outputs of one ``step``/``preview``/``warmup`` call: one row per (stream, bar) applied.

    ``outputs`` holds the kernel columns (``state/layout.py``, ``OUT_*``); the properties
    below name them, and :meth:`columns` / :meth:`records` give the rows in the one output
    schema (``atc_stream.schema``). ``ready_from`` is, per row, the first ready bar of the
    row's parameter set. ``rejected`` lists the inputs that were left out, with reasons.
    """

    def __init__(
        self,
        keys_by_slot: list[StreamKey | None],
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        outputs: np.ndarray,
        rejected: list[Rejection] | None = None,
        provisional: bool = False,
        ready_from: np.ndarray | None = None,
    ) -> None:
        self._keys_by_slot = keys_by_slot
        self.slots = slots
        self.times = times
        self.closes = closes
        self.outputs = outputs
        self.rejected = rejected or []
        self.provisional = provisional
        if ready_from is None:  # unknown parameter sets: no row claims to be ready
            ready_from = np.full(slots.shape[0], np.iinfo(np.int64).max, np.int64)
        self.ready_from = ready_from
        self._column_values: list[list[Any]] | None = None
        self._encoded_rows: list[bytes] | None = None  # JSON rows (messages.encoded_rows)

    def __len__(self) -> int:
        return self.slots.shape[0]

    def __repr__(self) -> str:
        kind = "preview" if self.provisional else "step"
        return f"<StepResult {kind}: {len(self)} rows, {len(self.rejected)} rejected>"

    @property
    def keys(self) -> list[StreamKey]:
        return [self._keys_by_slot[s] for s in self.slots]

    @property
    def symbols(self) -> list[str]:
        return [k.symbol for k in self.keys]

    @property
    def signal(self) -> np.ndarray:
        """Final signal (Average_Signal) per row; NaN while the stream is before cutout."""
        return self.outputs[:, L.OUT_SIGNAL]

    @property
    def layer1_signals(self) -> np.ndarray:
        """Layer-1 signal per family, shape (rows, 6), families in ``FAMILIES`` order."""
        return self.outputs[:, L.OUT_LAYER1 : L.OUT_LAYER1 + len(FAMILIES)]

    @property
    def layer2_equities(self) -> np.ndarray:
        """Layer-2 equity per family, shape (rows, 6)."""
        return self.outputs[:, L.OUT_LAYER2 : L.OUT_LAYER2 + len(FAMILIES)]

    @property
    def long_events(self) -> np.ndarray:
        return self.outputs[:, L.OUT_LONG] == 1.0

    @property
    def short_events(self) -> np.ndarray:
        return self.outputs[:, L.OUT_SHORT] == 1.0

    @property
    def growth(self) -> np.ndarray:
        """exp(λ·(bar_index − cutout)) of each row's bar; NaN before cutout."""
        return self.outputs[:, L.OUT_GROWTH]

    @property
    def bar_index(self) -> np.ndarray:
        return self.outputs[:, L.OUT_BAR_INDEX].astype(np.int64)

    @property
    def ready(self) -> np.ndarray:
        """True where the row comes from full windows (docs/spec.md, "Readiness")."""
        return self.bar_index >= self.ready_from

    def columns(self) -> dict[str, np.ndarray]:
        """Every column of :data:`atc_stream.schema.COLUMNS`, in order, as NumPy arrays.

        ``symbol``/``interval`` are object arrays of str; ``time`` is int64 epoch ms.
        """
        keys = self.keys
        n = len(keys)
        kernel = schema.output_columns(self.outputs, self.ready_from)
        columns: dict[str, np.ndarray] = {
            "symbol": np.array([k.symbol for k in keys], dtype=object).reshape(n),
            "interval": np.array([k.interval for k in keys], dtype=object).reshape(n),
            "params_id": np.array([k.params_id for k in keys], np.int64).reshape(n),
            "time": np.asarray(self.times, np.int64),
            "close": np.asarray(self.closes, np.float64),
            "provisional": np.full(n, self.provisional),
        }
        columns.update(kernel)
        return {name: columns[name] for name in schema.COLUMNS}

    def column_values(self) -> list[list[Any]]:
        """Per column (schema order), the plain Python values of every row; NaN becomes None.

        Column-wise, so that no per-row list is created (that would wake the cyclic
        garbage collector thousands of times per step). Built once per result: a live
        step hands the same result to the file writer and the Redis publisher.
        """
        if self._column_values is not None:
            return self._column_values
        columns = self.columns()
        lists = []
        for name, kind in schema.COLUMN_TYPES.items():
            values = columns[name]
            if kind == "float":
                boxed = values.astype(object)
                boxed[np.isnan(values)] = None
                lists.append(boxed.tolist())
            else:
                lists.append(values.tolist())
        self._column_values = lists
        return lists

    def records(self) -> list[dict[str, Any]]:
        """One JSON-ready dict per row, keys in schema order (NaN becomes None)."""
        rows = zip(*self.column_values(), strict=True)
        return [dict(zip(schema.COLUMNS, row, strict=True)) for row in rows]

    def to_pandas(self):
        """A pandas DataFrame of :meth:`columns`: one row per (stream, bar), ``time`` as
        tz-aware UTC timestamps (``datetime64[ms, UTC]``)."""
        from .frames import to_pandas

        return to_pandas(self.columns())

    def to_arrow(self):
        """A ``pyarrow.Table`` of :meth:`columns` with ``schema.arrow_schema()`` (UTC times)."""
        import pyarrow as pa

        arrow_schema = schema.arrow_schema()
        columns = self.columns()
        arrays = [
            pa.array(columns[f.name], type=pa.int64()).cast(f.type)
            if f.name == "time"
            else pa.array(columns[f.name], type=f.type)
            for f in arrow_schema
        ]
        return pa.Table.from_arrays(arrays, schema=arrow_schema)
