"""Signal sinks: where step results go (JSONL file or stdout, Parquet).

A sink takes ``StepResult`` objects through ``write(result)`` and is closed with
``close()`` (also a context manager). Both write the columns of the one output schema
(``atc_stream.schema``): JSONL lines are ``messages.SignalRow`` encoded with msgspec,
Parquet columns follow ``schema.arrow_schema()`` and the file's metadata records the
parameter sets.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO, Protocol

import msgspec

from ..messages import rows_from_result
from ..results import StepResult


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
        records = rows_from_result(result)
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
    """The schema's columns (times as UTC timestamps), written in row groups.

    ``metadata`` (``schema.params_metadata``) goes into the file's key-value metadata.
    """

    def __init__(
        self, path: str | Path, rows_per_group: int = 100_000, metadata: dict | None = None
    ) -> None:
        import pyarrow  # noqa: F401  (fail early with ImportError if the extra is missing)

        self._path = Path(path)
        self._rows_per_group = rows_per_group
        self._pending: list[StepResult] = []
        self._pending_rows = 0
        self._writer = None
        self._metadata = metadata
        self.rows_written = 0

    def write(self, result: StepResult) -> None:
        if len(result) == 0:
            return
        self._pending.append(result)
        self._pending_rows += len(result)
        if self._pending_rows >= self._rows_per_group:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._pending:
            return
        table = pa.concat_tables([r.to_arrow() for r in self._pending])
        if self._writer is None:
            schema = table.schema.with_metadata(self._metadata or {})
            self._writer = pq.ParquetWriter(self._path, schema)
        self._writer.write_table(table.replace_schema_metadata(self._writer.schema.metadata))
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


def open_sink(path: str | Path | None, metadata: dict | None = None) -> JsonlSink | ParquetSink:
    """A sink for ``path``: ``.parquet`` → Parquet, anything else (or ``-``/None) → JSONL."""
    if path not in (None, "-") and str(path).endswith(".parquet"):
        return ParquetSink(path, metadata=metadata)
    return JsonlSink(path)
