"""Signal sinks: where step results go (JSONL file or stdout, Parquet).

A sink takes ``StepResult`` objects through ``write(result)`` and is closed with
``close()`` (also a context manager). Records are the dicts of
``StepResult.records()``; JSON is encoded with msgspec.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO, Protocol

import msgspec

from ..results import StepResult, family_columns


class Sink(Protocol):
    def write(self, result: StepResult) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """One JSON object per (stream, bar) and line; ``path=None`` or ``"-"`` writes to stdout."""

    def __init__(self, path: str | Path | None = None) -> None:
        self._encoder = msgspec.json.Encoder()
        self._own = path not in (None, "-")
        self._file: IO[bytes] = open(path, "wb") if self._own else sys.stdout.buffer  # noqa: SIM115
        self.rows_written = 0

    def write(self, result: StepResult) -> None:
        records = result.records()
        if not records:
            return
        self._file.write(self._encoder.encode_lines(records))
        self.rows_written += len(records)

    def close(self) -> None:
        if self._own:
            self._file.close()
        else:
            self._file.flush()

    def __enter__(self) -> JsonlSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ParquetSink:
    """Flat columns (symbol, interval, params_id, time, close, bar_index, signal, per-family
    layer-1 signals and layer-2 equities, long, short, growth), written in row groups."""

    def __init__(self, path: str | Path, rows_per_group: int = 100_000) -> None:
        import pyarrow  # noqa: F401  (fail early with ImportError if the extra is missing)

        self._path = Path(path)
        self._rows_per_group = rows_per_group
        self._pending: list[StepResult] = []
        self._pending_rows = 0
        self._writer = None
        self.rows_written = 0

    def write(self, result: StepResult) -> None:
        if len(result) == 0:
            return
        self._pending.append(result)
        self._pending_rows += len(result)
        if self._pending_rows >= self._rows_per_group:
            self._flush()

    def _flush(self) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._pending:
            return
        keys = [k for r in self._pending for k in r.keys]
        columns = {
            "symbol": [k.symbol for k in keys],
            "interval": [k.interval for k in keys],
            "params_id": [k.params_id for k in keys],
            "time": np.concatenate([r.times for r in self._pending]),
            "close": np.concatenate([r.closes for r in self._pending]),
            "bar_index": np.concatenate([r.bar_index for r in self._pending]),
            "signal": np.concatenate([r.signal for r in self._pending]),
        }
        columns.update(family_columns(np.concatenate([r.outputs for r in self._pending])))
        columns["long"] = np.concatenate([r.long_events for r in self._pending])
        columns["short"] = np.concatenate([r.short_events for r in self._pending])
        columns["growth"] = np.concatenate([r.growth for r in self._pending])
        table = pa.table(columns)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._path, table.schema)
        self._writer.write_table(table)
        self.rows_written += table.num_rows
        self._pending, self._pending_rows = [], 0

    def close(self) -> None:
        self._flush()
        if self._writer is not None:
            self._writer.close()

    def __enter__(self) -> ParquetSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_sink(path: str | Path | None) -> JsonlSink | ParquetSink:
    """A sink for ``path``: ``.parquet`` → Parquet, anything else (or ``-``/None) → JSONL."""
    if path not in (None, "-") and str(path).endswith(".parquet"):
        return ParquetSink(path)
    return JsonlSink(path)
