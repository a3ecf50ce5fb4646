"""Result and rejection types returned by the engine (no numba, no I/O)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from atc_stream.core import output_row, schema
from atc_stream.core.strategy_outputs import StrategyRows, records


@dataclass(frozen=True, order=True)
class StreamKey:
    """One stream: a symbol at one bar interval under one parameter set."""

    symbol: str
    interval: str
    params_id: int

    def __str__(self) -> str:
        return f"{self.symbol}:{self.interval}:{self.params_id}"


#: The key of a free slot, in per-slot key columns (no row of a result points at one).
_NO_KEY = StreamKey("", "", -1)


#: per ``keys_by_slot`` list (by ``id``, the list kept so that its id is not reused):
#: ``(the list, its copy when the columns were made, the columns)``, newest last
_slot_columns: dict[int, tuple[list, list, tuple[np.ndarray, ...]]] = {}
_SLOT_COLUMN_LISTS = 8  # engines whose columns are kept at once
_slot_columns_lock = threading.Lock()


def slot_key_columns(
    keys_by_slot: list[StreamKey | None],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per slot of an engine's ``keys_by_slot``: ``symbol`` and ``interval`` (object
    arrays of str), ``params_id`` and whether the slot is free, made again only when the
    slots' streams changed. Read-only arrays.

    A step's rows take their key columns from these by slot: building them from the keys
    took ~0.2 ms of a 200-symbol live burst (docs/design/live-feed.md). The comparison
    with the copy kept is by identity for unchanged slots (a few us). The list is copied
    once and the columns made from the copy: another thread (a publisher's) may read
    them while the engine's thread adds a stream."""
    with _slot_columns_lock:
        cached = _slot_columns.get(id(keys_by_slot))
        if cached is not None and cached[0] is keys_by_slot and cached[1] == keys_by_slot:
            return cached[2]  # type: ignore[return-value]
    copy = list(keys_by_slot)
    keys = [_NO_KEY if k is None else k for k in copy]
    n = len(keys)
    columns = (
        np.array([k.symbol for k in keys], dtype=object).reshape(n),
        np.array([k.interval for k in keys], dtype=object).reshape(n),
        np.array([k.params_id for k in keys], np.int64).reshape(n),
        np.array([k is None for k in copy], bool).reshape(n),
    )
    for column in columns:
        column.setflags(write=False)
    with _slot_columns_lock:
        _slot_columns.pop(id(keys_by_slot), None)
        _slot_columns[id(keys_by_slot)] = (keys_by_slot, copy, columns)
        while len(_slot_columns) > _SLOT_COLUMN_LISTS:
            del _slot_columns[next(iter(_slot_columns))]
    return columns


class UnknownStreamError(KeyError, ValueError):
    """A stream key (or symbol) that is not registered. A ``KeyError`` (lookups) and a
    ``ValueError`` (bad argument), so either ``except`` catches it; the message names
    the key and the registered streams."""

    def __str__(self) -> str:  # KeyError would show the message quoted
        return str(self.args[0]) if self.args else ""


def as_stream_key(key: Any) -> StreamKey | None:
    """``key`` as a StreamKey: one already, a ``(symbol, interval, params_id)`` tuple, or
    its text ``"symbol:interval:params_id"`` (``str(key)``); None for anything else."""
    if isinstance(key, StreamKey):
        return key
    if isinstance(key, tuple) and len(key) == 3:
        symbol, interval, params_id = key
        if isinstance(symbol, str) and isinstance(interval, str) and isinstance(params_id, int):
            return StreamKey(symbol, interval, params_id)
    if isinstance(key, str) and key.count(":") >= 2:
        symbol, interval, params_id = key.rsplit(":", 2)
        if params_id.isdigit():
            return StreamKey(symbol, interval, int(params_id))
    return None


def unknown_stream(key: Any, streams: Sequence[StreamKey], symbol_slots: Any) -> Exception:
    """The error for a ``key`` no stream has, naming the first registered streams;
    ``symbol_slots`` are the slots of ``key`` when it is a symbol of several."""
    known = ", ".join(str(k) for k in streams[:5]) or "none"
    more = f" (+{len(streams) - 5} more)" if len(streams) > 5 else ""
    hint = "; pass a StreamKey (engine.streams)" if as_stream_key(key) is None else ""
    if symbol_slots is not None:
        hint = f"; {key!r} has {len(symbol_slots)} streams (one a parameter set): pass a key"
    return UnknownStreamError(f"unknown stream {key!r}{hint}; registered: {known}{more}")


@dataclass(frozen=True)
class Rejection:
    """One input that was left out, with why and the offending value."""

    index: int  #: position of the input in its batch (or bar position in a warmup history)
    reason: str
    detail: str
    symbol: str | None = None


class PendingStep:
    """A submitted step (``Engine.step_async``): :meth:`result` waits for its outputs.

    The engine's state already includes the step. The result is built once; asking
    again returns the same object. Nothing is lost by never asking.
    """

    def __init__(self, build: Callable[[], StepResult]) -> None:
        self._build: Callable[[], StepResult] | None = build
        self._result: StepResult | None = None

    def result(self) -> StepResult:
        if self._result is None:
            build = self._build
            assert build is not None  # dropped only once the result is kept
            self._result = build()
            self._build = None
        return self._result


class StepResult:
    """Outputs of one ``step``/``preview``/``warmup`` call: one row per (stream, bar) applied.

    ``outputs`` is either the kernel output rows ``[row, OUT_*]`` (``core/output_row.py``)
    or the typed fields of the requested output ``groups`` (``schema.kernel_fields``:
    ``bar_index`` int64, ``signal``/``layers``/``equities``/``growth`` float64,
    ``long``/``short`` bool). ``groups`` are the output groups the rows carry
    (``schema.OUTPUT_GROUPS``; default all): :meth:`columns` / :meth:`records` give the
    key columns plus those groups' columns, in schema order, and reading a property of a
    group that was not requested raises ``OutputNotRequestedError`` naming the fix.
    ``ready_from`` is, per row, the first ready bar of the row's parameter set.
    ``rejected`` lists the inputs that were left out, with reasons. ``strategy``: the
    strategy outputs of each row (an engine with strategies, output group "strategy"),
    read as :meth:`position_columns` / :meth:`trade_columns` (and ``*_records``).
    """

    def __init__(
        self,
        keys_by_slot: list[StreamKey | None],
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        outputs: np.ndarray | dict[str, np.ndarray],
        rejected: list[Rejection] | None = None,
        provisional: bool = False,
        ready_from: np.ndarray | None = None,
        groups: tuple[str, ...] = schema.ALL_OUTPUTS,
        strategy: StrategyRows | None = None,
    ) -> None:
        self._keys_by_slot = keys_by_slot
        self.slots = slots
        self.times = times
        self.closes = closes
        self.groups = tuple(groups)
        if isinstance(outputs, np.ndarray):
            outputs = schema.kernel_fields(outputs, self.groups)
        self.fields: dict[str, np.ndarray] = outputs
        self.rejected = rejected or []
        self.provisional = provisional
        if ready_from is None:  # unknown parameter sets: no row claims to be ready
            ready_from = np.full(slots.shape[0], np.iinfo(np.int64).max, np.int64)
        self.ready_from = ready_from
        self.strategy = strategy
        self._column_values: list[list[Any]] | None = None
        self._encoded_rows: list[bytes] | None = None  # JSON rows (messages.encoded_rows)
        self._encoded_records: list[bytes] | None = None  # (messages.encoded_records)
        self._encoded_records_array: bytes | None = None  # (messages.encoded_records_array)

    def __len__(self) -> int:
        return self.slots.shape[0]

    def __repr__(self) -> str:
        kind = "preview" if self.provisional else "step"
        return f"<StepResult {kind}: {len(self)} rows, {len(self.rejected)} rejected>"

    def take(self, rows: np.ndarray) -> StepResult:
        """The result of only these rows (same outputs, rejections and kind)."""
        return StepResult(
            self._keys_by_slot, self.slots[rows], self.times[rows], self.closes[rows],
            {name: values[rows] for name, values in self.fields.items()},
            self.rejected, self.provisional, self.ready_from[rows], self.groups,
            None if self.strategy is None else self.strategy.take(rows),
        )  # fmt: skip

    @property
    def keys(self) -> list[StreamKey]:
        return [self._keys_by_slot[s] for s in self.slots]

    @property
    def symbols(self) -> list[str]:
        return [k.symbol for k in self.keys]

    @property
    def column_names(self) -> tuple[str, ...]:
        """The schema columns of these rows (all of ``schema.COLUMNS`` or a subset)."""
        return schema.columns_for(self.groups)

    def _field(self, name: str, group: str) -> np.ndarray:
        values = self.fields.get(name)
        if values is None:
            raise schema.OutputNotRequestedError(
                f"the {group!r} outputs were not requested (this result carries "
                f"{list(self.groups)}); ask with Engine(outputs=[..., {group!r}]) or "
                f"Engine(outputs='all') / engine.request_outputs({group!r}, ...)"
            )
        return values

    def _strategy_rows(self) -> StrategyRows:
        if self.strategy is None and self.provisional:
            raise schema.OutputNotRequestedError(
                "a preview carries no strategy outputs: strategies trade on closed bars "
                "only, so take positions and trades from step()'s result"
            )
        if self.strategy is None:
            raise schema.OutputNotRequestedError(
                "this result carries no strategy outputs: give the engine strategies "
                "(Engine(..., strategies=[Strategy(...)])) and keep the 'strategy' output group"
            )
        return self.strategy

    def position_columns(self) -> dict[str, np.ndarray]:
        """Per row and strategy: symbol, interval, params_id, strategy_id, time, side
        (+1/-1/0 held at the close) and equity (marked at the close)."""
        return self._strategy_rows().position_columns(self.keys, self.times)

    def trade_columns(self) -> dict[str, np.ndarray]:
        """The trades closed on these rows' bars, with ``BacktestResult.trades``' columns
        (symbol, interval, params_id, strategy_id, side, entry_time, exit_time,
        entry_price, exit_price, reason, return)."""
        return self._strategy_rows().trade_columns(self.keys, self.times)

    def position_records(self) -> list[dict[str, Any]]:
        """:meth:`position_columns` as one dict per row."""
        return records(self.position_columns())

    def trade_records(self) -> list[dict[str, Any]]:
        """:meth:`trade_columns` as one dict per trade."""
        return records(self.trade_columns())

    @property
    def outputs(self) -> np.ndarray:
        """The kernel output rows ``[row, OUT_*]`` as float64 (built on demand; the
        columns of groups that were not requested are NaN)."""
        n = len(self)
        out = np.full((n, output_row.N_OUT), np.nan)
        out[:, output_row.OUT_BAR_INDEX] = self.fields["bar_index"]
        for name, values in self.fields.items():
            if name == "long":
                out[:, output_row.OUT_LONG] = values
            elif name == "short":
                out[:, output_row.OUT_SHORT] = values
            elif name != "bar_index":
                cols = schema.FLOAT_FIELD_COLUMNS[name]
                out[:, cols[0] : cols[-1] + 1] = values.reshape(n, len(cols))
        return out

    @property
    def signal(self) -> np.ndarray:
        """Final signal (Average_Signal) per row; NaN while the stream is before cutout."""
        return self._field("signal", "signal")

    @property
    def layer1_signals(self) -> np.ndarray:
        """Layer-1 signal per family, shape (rows, 6), families in ``FAMILIES`` order."""
        return self._field("layers", "layers")

    @property
    def layer2_equities(self) -> np.ndarray:
        """Layer-2 equity per family, shape (rows, 6)."""
        return self._field("equities", "equities")

    @property
    def long_events(self) -> np.ndarray:
        return self._field("long", "events")

    @property
    def short_events(self) -> np.ndarray:
        return self._field("short", "events")

    @property
    def growth(self) -> np.ndarray:
        """exp(λ·(bar_index − cutout)) of each row's bar; NaN before cutout."""
        return self._field("growth", "growth")

    @property
    def bar_index(self) -> np.ndarray:
        return self.fields["bar_index"]

    @property
    def ready(self) -> np.ndarray:
        """True where the row comes from full windows (docs/spec.md, "Readiness")."""
        return self.bar_index >= self.ready_from

    def columns(self) -> dict[str, np.ndarray]:
        """The columns of these rows (:attr:`column_names`: every column of
        :data:`atc_stream.core.schema.COLUMNS` or the requested subset), in schema order.

        ``symbol``/``interval`` are object arrays of str; ``time`` is int64 epoch ms;
        discrete columns bool/int64, continuous ones float64.
        """
        n = len(self)
        symbol, interval, params_id = self._key_columns()
        kernel = schema.columns_from_fields(self.fields, self.ready_from, self.groups)
        columns: dict[str, np.ndarray] = {
            "symbol": symbol,
            "interval": interval,
            "params_id": params_id,
            "time": np.asarray(self.times, np.int64),
            "close": np.asarray(self.closes, np.float64),
            "provisional": np.full(n, self.provisional),
        }
        columns.update(kernel)
        return {name: columns[name] for name in self.column_names}

    def _key_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``symbol``, ``interval`` (object arrays of str) and ``params_id`` of the rows:
        taken by slot from the columns of every slot (``slot_key_columns``), or, for a
        few rows of many slots, made from each row's key."""
        keys_by_slot = self._keys_by_slot
        if 4 * len(self) >= len(keys_by_slot):
            symbols, intervals, params_ids, free = slot_key_columns(keys_by_slot)
            if self.slots.shape[0] == 0 or (
                self.slots.max() < free.shape[0] and not free[self.slots].any()
            ):
                return symbols[self.slots], intervals[self.slots], params_ids[self.slots]
        # a row of a freed slot fails here, as it must
        keys = [keys_by_slot[s] for s in self.slots.tolist()]
        return (
            np.array([k.symbol for k in keys], dtype=object).reshape(len(keys)),
            np.array([k.interval for k in keys], dtype=object).reshape(len(keys)),
            np.array([k.params_id for k in keys], np.int64).reshape(len(keys)),
        )

    def column_values(self) -> list[list[Any]]:
        """Per column (:attr:`column_names` order), the plain Python values of every row;
        NaN becomes None.

        Column-wise, so that no per-row list is created (that would wake the cyclic
        garbage collector thousands of times per step). Built once per result: a live
        step hands the same result to the file writer and the Redis publisher.
        """
        if self._column_values is not None:
            return self._column_values
        lists = [
            _float_values(values) if schema.COLUMN_TYPES[name] == "float" else values.tolist()
            for name, values in self.columns().items()
        ]
        self._column_values = lists
        return lists

    def records(self) -> list[dict[str, Any]]:
        """One JSON-ready dict per row, keys in schema order (NaN becomes None)."""
        names = self.column_names
        rows = zip(*self.column_values(), strict=True)
        return [dict(zip(names, row, strict=True)) for row in rows]

    def to_pandas(self):
        """A pandas DataFrame of :meth:`columns`: one row per (stream, bar), ``time`` as
        tz-aware UTC timestamps (``datetime64[ms, UTC]``)."""
        from atc_stream.core.frames import to_pandas

        return to_pandas(self.columns())

    def to_arrow(self):
        """A ``pyarrow.Table`` of :meth:`columns` with ``schema.arrow_schema()`` of
        :attr:`column_names` (UTC times)."""
        return results_to_arrow([self])


def results_to_arrow(results: Sequence[StepResult]):
    """One ``pyarrow.Table`` of the rows of ``results`` in order (``StepResult.to_arrow``
    of them all, concatenated): each column is joined in NumPy and converted once, where
    a table per result costs a conversion per column and result (replay writes Parquet
    parts of hundreds of steps). Every result must have the same columns."""
    import pyarrow as pa

    names = results[0].column_names
    if any(r.column_names != names for r in results):
        raise ValueError("results with different columns cannot make one table")
    arrow_schema = schema.arrow_schema(columns=names)
    parts = [r.columns() for r in results]

    def joined(name: str) -> np.ndarray:
        return parts[0][name] if len(parts) == 1 else np.concatenate([p[name] for p in parts])

    arrays = [
        pa.array(joined(f.name), type=pa.int64()).cast(f.type)
        if f.name == "time"
        else pa.array(joined(f.name), type=f.type)
        for f in arrow_schema
    ]
    return pa.Table.from_arrays(arrays, schema=arrow_schema)


def _float_values(values: np.ndarray) -> list[Any]:
    """``values`` as Python floats, NaN as None."""
    missing = np.isnan(values)
    if missing.any():  # rare once streams are warm: skip the boxing otherwise
        values = values.astype(object)
        values[missing] = None
    return values.tolist()
