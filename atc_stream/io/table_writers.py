"""Strategy output files: trades and positions as JSONL lines or Parquet parts, resumable.

Formats and columns: docs/messages.md, "Paper trading".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from atc_stream.core.results import StepResult
from atc_stream.core.strategy_outputs import records
from atc_stream.io.files import atomic_file
from atc_stream.io.writers import (
    LineFile,
    OutputError,
    ParquetWriter,
    Writer,
    output_format,
    same_output,
)

_ENCODER = msgspec.json.Encoder()


class ColumnsWriter:
    """Rows given as columns (``{name: array}``) to a JSONL file (one object per line) or a
    directory of Parquet parts; ``position``/``resume_from`` as the signal writers'."""

    def __init__(self, path: str | Path, resume_from: dict[str, Any] | None = None) -> None:
        self.format = output_format(path)
        if self.format == "csv":
            raise OutputError(f"{str(path)!r}: trades and positions go to .jsonl or .parquet")
        self.path = Path(path)
        here = resume_from if same_output(resume_from, self.format, self.path) else None
        self.rows_written = 0
        if self.format == "jsonl":
            self._lines: LineFile | None = LineFile(
                self.path, None if here is None else int(here["bytes"])
            )
            self._parts: _Parts | None = None
        else:
            self._lines = None
            self._parts = _Parts(self.path, None if here is None else int(here["parts"]))

    def write_columns(self, columns: dict[str, np.ndarray]) -> None:
        rows = len(next(iter(columns.values()))) if columns else 0
        if not rows:
            return
        if self._lines is not None:
            lines = [_ENCODER.encode(record) for record in records(columns)]
            self._lines.write(b"\n".join(lines) + b"\n")
        else:
            assert self._parts is not None
            self._parts.add(columns)
        self.rows_written += rows

    def position(self) -> dict[str, Any]:
        if self._lines is not None:
            self._lines.sync()
            return {
                "format": "jsonl",
                "path": str(self.path.absolute()),
                "bytes": self._lines.tell(),
            }
        assert self._parts is not None
        return {
            "format": "parquet",
            "path": str(self.path.absolute()),
            "parts": self._parts.flush(),
        }

    def close(self) -> None:
        if self._lines is not None:
            self._lines.close()
        elif self._parts is not None:
            self._parts.flush()


class _Parts(ParquetWriter):
    """``ParquetWriter``'s parts (atomic, cut back on resume) for column dicts."""

    def __init__(self, path: Path, resume_parts: int | None) -> None:
        super().__init__(path, resume_parts=resume_parts)
        self._columns: list[dict[str, np.ndarray]] = []

    def add(self, columns: dict[str, np.ndarray]) -> None:
        self._columns.append(columns)
        self._pending_rows += len(next(iter(columns.values())))
        if self._pending_rows >= self._rows_per_part:
            self.flush()

    def flush(self) -> int:
        """Write the rows added since the last flush as one part; the parts written."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._columns:
            names = list(self._columns[0])
            table = pa.table(
                {name: np.concatenate([c[name] for c in self._columns]) for name in names}
            )
            name = f"part-{self._next_part:05d}.parquet"
            with atomic_file(self.path / name, f".{name}.") as f:
                pq.write_table(table, f)
            self._next_part += 1
            self._columns, self._pending_rows = [], 0
        return self._next_part


class PaperOutputs:
    """The signal writer plus the strategy outputs of each result: ``trades`` (one record
    per fill that closed a trade) and ``positions`` (side and equity per bar and strategy
    stream); one ``position()`` for snapshots holding all three."""

    def __init__(
        self,
        signals: Writer,
        *,
        trades: str | Path | None,
        positions: str | Path | None,
        resume_from: dict[str, Any] | None = None,
    ) -> None:
        recorded = resume_from or {}
        self.signals = signals
        self.trades = None if trades is None else ColumnsWriter(trades, recorded.get("trades"))
        self.positions = (
            None if positions is None else ColumnsWriter(positions, recorded.get("positions"))
        )

    @property
    def rows_written(self) -> int:
        return self.signals.rows_written

    def write(self, result: StepResult) -> None:
        self.signals.write(result)
        if result.strategy is None or not len(result):
            return
        if self.trades is not None:
            self.trades.write_columns(result.trade_columns())
        if self.positions is not None:
            self.positions.write_columns(result.position_columns())

    def position(self) -> dict[str, Any]:
        out = dict(self.signals.position() or {})
        for name, writer in (("trades", self.trades), ("positions", self.positions)):
            if writer is not None:
                out[name] = writer.position()
        return out

    def close(self) -> None:
        self.signals.close()
        for writer in (self.trades, self.positions):
            if writer is not None:
                writer.close()

    def __enter__(self) -> PaperOutputs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
