"""msgspec structs of the one output schema: a signal row and the Redis record around it,
and the trade and position records of paper trading.

The fields are generated from ``core.schema.COLUMN_TYPES``, so JSONL lines, Redis
messages and the Arrow/Parquet columns cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from atc_stream.core.results import StepResult
from atc_stream.core.schema import COLUMN_TYPES, COLUMNS, SCHEMA_VERSION

# JSON types of the logical column types; not-available floats are null.
_FIELD_TYPES = {"str": str, "int": int, "float": float | None, "bool": bool, "time": int}

if TYPE_CHECKING:  # generated below: the checker sees the key fields and any column

    class SignalRow(msgspec.Struct, gc=False):
        symbol: str
        interval: str
        params_id: int

        def __getattr__(self, column: str) -> Any: ...

else:
    #: One (stream, bar) row with every schema column, in order (a JSONL line).
    SignalRow = msgspec.defstruct(
        "SignalRow",
        [(name, _FIELD_TYPES[kind]) for name, kind in COLUMN_TYPES.items()],
        gc=False,
        module=__name__,
    )


class SignalRecord(SignalRow, gc=False):
    """A :data:`SignalRow` plus the schema version ``v``: the message on Redis channels."""

    v: int = SCHEMA_VERSION

    @property
    def key(self) -> str:
        """The stream key string (the field name in the ``latest`` hash)."""
        return f"{self.symbol}:{self.interval}:{self.params_id}"


_STRUCTS: dict[tuple[type, tuple[str, ...]], type] = {}


def _struct_for(base: type, columns: tuple[str, ...]) -> type:
    """``base`` itself for every column; else a struct of the same name with only
    ``columns`` (a result of fewer requested outputs), made once per column set."""
    if columns == COLUMNS:
        return base
    struct = _STRUCTS.get((base, columns))
    if struct is None:
        fields: list[tuple[Any, ...]] = [
            (name, _FIELD_TYPES[COLUMN_TYPES[name]]) for name in columns
        ]
        namespace: dict[str, Any] = {}
        if base is SignalRecord:
            fields.append(("v", int, SCHEMA_VERSION))
            namespace["key"] = SignalRecord.key
        struct = msgspec.defstruct(
            base.__name__, fields, gc=False, module=__name__, namespace=namespace
        )
        _STRUCTS[(base, columns)] = struct
    return struct


def record_type(columns: tuple[str, ...]) -> type:
    """The Redis record struct of rows with ``columns`` (``SignalRecord`` for all)."""
    return _struct_for(SignalRecord, tuple(columns))


def records_from_result(result: StepResult) -> list[SignalRecord]:
    """The :class:`SignalRecord` of every row of ``result`` (Redis messages); a result of
    fewer requested outputs gives records of only its columns (plus ``v``)."""
    return _structs(result, SignalRecord)


def rows_from_result(result: StepResult) -> list[SignalRow]:
    """The :data:`SignalRow` of every row of ``result`` (JSONL lines), with the result's
    columns (every schema column, or the requested subset)."""
    return _structs(result, SignalRow)


_ROW_ENCODER = msgspec.json.Encoder()
#: What a SignalRecord's JSON adds to its SignalRow's: ``v``, its last field.
_VERSION_FIELD = b',"v":%d}' % SCHEMA_VERSION


def encoded_rows(result: StepResult) -> list[bytes]:
    """The JSON of every row's :data:`SignalRow`, encoded once per result.

    A live step hands one result to the Redis publisher and then the JSONL writer; the
    publisher encodes the records (:func:`encoded_records`) and the rows are cut from
    them, so no row is built or encoded twice.
    """
    cached = result._encoded_rows
    if cached is None:
        records = result._encoded_records
        if records is None and result._encoded_records_array is not None:
            records = encoded_records(result)
        if records is not None:
            cut = -len(_VERSION_FIELD)
            cached = [record[:cut] + b"}" for record in records]
        else:
            encode = _ROW_ENCODER.encode
            cached = [encode(row) for row in _encoding_structs(result, SignalRow)]
        result._encoded_rows = cached
    return cached


def encoded_row_chunks(result: StepResult, rows: int = 4096) -> Iterator[list[bytes]]:
    """``encoded_rows(result)`` in chunks of up to ``rows`` rows: a large result (a replay's
    call of many bar times) is encoded a slice at a time, which keeps its rows' objects
    few and in cache (twice as fast at 65,536 rows); rows already encoded are reused."""
    n = len(result)
    encoded = (result._encoded_rows, result._encoded_records, result._encoded_records_array)
    if n <= rows or any(e is not None for e in encoded):
        yield encoded_rows(result)
        return
    for start in range(0, n, rows):
        yield encoded_rows(result.take(np.arange(start, min(start + rows, n))))


def encoded_records(result: StepResult) -> list[bytes]:
    """The JSON of every row's :class:`SignalRecord`, encoded once per result (cut from
    :func:`encoded_records_array`, or from the rows' JSON, when either came first)."""
    cached = result._encoded_records
    if cached is None:
        rows, array = result._encoded_rows, result._encoded_records_array
        if rows is not None:
            cached = [row[:-1] + _VERSION_FIELD for row in rows]
        elif array is not None:
            cached = _cut_objects(array, len(result))
        if cached is None:
            encode = _ROW_ENCODER.encode
            cached = [encode(record) for record in _encoding_structs(result, SignalRecord)]
        result._encoded_records = cached
    return cached


def encoded_records_array(result: StepResult) -> bytes:
    """Every row's :class:`SignalRecord` as one JSON array (``[{...},{...}]``), encoded
    once per result: what a batch message carries. One encoder call for the whole step
    takes less than one call per record (docs/design/redis-pubsub.md, "Packing"), and
    the batch goes out before the records are cut apart for the other messages."""
    cached = result._encoded_records_array
    if cached is None:
        records = result._encoded_records
        if records is not None:
            cached = b"[" + b",".join(records) + b"]"
        else:
            cached = _ROW_ENCODER.encode(_encoding_structs(result, SignalRecord))
        result._encoded_records_array = cached
    return cached


def _cut_objects(array: bytes, n: int) -> list[bytes] | None:
    """The ``n`` flat JSON objects of ``array`` (``[{...},{...}]``), each cut at the first
    ``}`` after its start. None when a string in them holds a ``}``: the ``n``-th cut then
    falls short of the array's end (each object holds only scalars, so its own ``}`` is
    its end)."""
    if n == 0:
        return []
    objects = []
    find = array.find
    start = 1
    for _ in range(n):
        end = find(b"}", start) + 1
        if end == 0:
            return None
        objects.append(array[start:end])
        start = end + 1
    return objects if start == len(array) else None


def _structs(result: StepResult, base: type) -> list[Any]:
    if len(result) == 0:
        return []
    struct = _struct_for(base, result.column_names)
    return [struct(*row) for row in zip(*result.column_values(), strict=True)]


def _encoding_structs(result: StepResult, base: type) -> list[Any]:
    """The structs of ``result``'s rows for encoding only: float columns keep NaN, which
    msgspec writes as ``null`` exactly as it writes the ``None`` of
    ``StepResult.column_values``, so the JSON is the same without boxing every column."""
    if len(result) == 0:
        return []
    struct = _struct_for(base, result.column_names)
    columns = [values.tolist() for values in result.columns().values()]
    return [struct(*row) for row in zip(*columns, strict=True)]


class TradeRecord(msgspec.Struct, gc=False):
    """One closed trade of a strategy stream (``StepResult.trade_columns``), plus ``v``:
    the message on the Redis trade channels."""

    symbol: str
    interval: str
    params_id: int
    strategy_id: int
    side: int
    entry_time: int
    exit_time: int
    entry_price: float
    exit_price: float
    reason: str
    return_: float = msgspec.field(name="return")
    v: int = SCHEMA_VERSION

    @property
    def key(self) -> str:
        """The strategy stream key ``symbol:interval:params_id:strategy_id``."""
        return f"{self.symbol}:{self.interval}:{self.params_id}:{self.strategy_id}"


class PositionRecord(msgspec.Struct, gc=False):
    """The position of a strategy stream at a bar's close (``StepResult.position_columns``),
    plus ``v``: the message on the Redis position channels."""

    symbol: str
    interval: str
    params_id: int
    strategy_id: int
    time: int
    side: int
    equity: float
    v: int = SCHEMA_VERSION

    @property
    def key(self) -> str:
        """The strategy stream key ``symbol:interval:params_id:strategy_id`` (the field
        name in the ``positions:latest`` hash)."""
        return f"{self.symbol}:{self.interval}:{self.params_id}:{self.strategy_id}"


def trade_records_from_result(result: StepResult) -> list[TradeRecord]:
    """The :class:`TradeRecord` of every trade closed on ``result``'s bars (none for a
    result without strategy outputs)."""
    if result.strategy is None or len(result) == 0:
        return []
    columns = result.trade_columns()
    lists = [values.tolist() for values in columns.values()]
    return [TradeRecord(*row) for row in zip(*lists, strict=True)]


def position_records_from_result(result: StepResult) -> list[PositionRecord]:
    """The :class:`PositionRecord` of every (row, strategy) of ``result``, rows first (none
    for a result without strategy outputs)."""
    if result.strategy is None or len(result) == 0:
        return []
    columns = result.position_columns()
    lists = [values.tolist() for values in columns.values()]
    return [PositionRecord(*row) for row in zip(*lists, strict=True)]
