"""Signal writers: where step results go (JSONL, CSV, a Parquet dataset of parts, stdout).

Formats, columns and resumable positions: docs/design/output-files.md.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Protocol

from atc_stream.core.results import StepResult, results_to_arrow
from atc_stream.core.schema import COLUMNS
from atc_stream.io.files import atomic_file

#: Output formats by file extension (``-`` is JSONL on stdout).
FORMATS_BY_SUFFIX = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}
PART_PATTERN = re.compile(r"^part-(\d{5,})\.parquet$")


class OutputError(ValueError):
    """The output cannot be written or resumed (message is one line for the user)."""


class ReaderGone(OutputError):
    """stdout's reader closed the pipe (``atc-stream replay ... | head``): nothing more can
    be written, and nobody reads a message; the CLI stops quietly with status 141, as a
    command killed by SIGPIPE."""


def cannot_write(path: str | Path, exc: OSError) -> OutputError:
    """The one-line ``OutputError`` of an output the system refuses to create or open."""
    return OutputError(f"cannot write {path}: {exc.strerror or exc}")


def check_apart(
    inputs: dict[str, Path | None],
    outputs: dict[str, str | Path | None],
    snapshot_dir: Path | None = None,
) -> None:
    """``OutputError`` when an output is an input or another output, holds one (a Parquet
    output is a directory) or lies inside one: opening it would destroy what is read or
    written elsewhere. Keys name the options (``-o``, ``BARS``); paths are compared
    resolved; ``-`` and None are left out. ``snapshot_dir`` may hold outputs, but may not
    be one or lie inside one (a Parquet directory: its parts and the snapshots would mix).
    Called before any output or snapshot directory is opened."""
    for name, path in outputs.items():
        if path is not None and not str(path).strip():
            raise OutputError(f"{name} is an empty path: give a file name, or - for stdout")
    # a device (/dev/null) keeps nothing another path could destroy: it may take any
    # number of outputs
    named = [(name, path, _resolved(path)) for name, path in outputs.items()
             if path is not None and str(path) != "-" and not is_device(path)]  # fmt: skip
    read = [("input " + name, path, _resolved(path)) for name, path in inputs.items()
            if path]  # fmt: skip
    for i, (name, given, out) in enumerate(named):
        earlier = [("output " + other, path, resolved) for other, path, resolved in named[:i]]
        for other, other_given, path in read + earlier:
            if out == path or _same_file(out, path):  # a hard link is the same file too
                how = "is"
            elif path.is_relative_to(out):
                how = "contains"
            elif out.is_relative_to(path):
                how = "is inside"
            else:
                continue
            raise OutputError(
                f"{name} {given} {how} the {other} {other_given}; choose another path"
            )
    if snapshot_dir is None:
        return
    store = _resolved(snapshot_dir)
    for name, given, out in named:
        if store == out or _same_file(store, out):
            how = "is"
        elif store.is_relative_to(out):
            how = "is inside"
        else:
            continue
        raise OutputError(
            f"--snapshot-dir {snapshot_dir} {how} the output {name} {given}; choose another path"
        )


def check_outputs(outputs: dict[str, str | Path | None]) -> None:
    """``OutputError`` for an output whose format its name does not tell
    (``output_format``) or whose directory does not exist: said before any input is read
    (a large file takes minutes to scan), not once the outputs are opened. Keys name the
    options; ``-`` and None are left out."""
    for path in outputs.values():
        if path is None or str(path) == "-":
            continue
        fmt = output_format(path)
        parent = Path(path).parent
        if not parent.is_dir():
            why = "not a directory" if parent.exists() else "no such directory"
            raise OutputError(f"cannot write {path}: {why}: {parent}")
        if fmt == "parquet":
            check_parquet_target(Path(path))


def check_parquet_target(path: Path) -> None:
    """``OutputError`` when a Parquet output (a directory of parts) would replace what
    atc-stream did not write: a file other than an older run's single-file output, or a
    directory holding other files. They are not ours to delete, and the user gave the
    path by mistake more often than not."""
    if path.is_file():
        if not _written_by_us(path):
            raise OutputError(
                f"{path} is a file atc-stream did not write (a Parquet output is a directory "
                "of parts); give another output path, or remove the file"
            )
        return
    if not path.is_dir():
        return
    foreign = sorted(
        entry.name for entry in path.iterdir()
        if not PART_PATTERN.match(entry.name)
        and not (entry.name.startswith(".part-") and entry.name.endswith(".tmp"))
    )  # fmt: skip
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise OutputError(
            f"{path} holds files atc-stream did not write ({foreign[0]!r}{more}); "
            "give another output path, or empty the directory"
        )


def _written_by_us(path: Path) -> bool:
    """Whether ``path`` is a Parquet file with atc-stream's metadata (an output of an
    older version, which wrote one file)."""
    import pyarrow.parquet as pq

    try:
        metadata = pq.read_schema(path).metadata or {}
    except Exception:  # not Parquet, unreadable: not ours either way
        return False
    return b"atc_stream.schema_version" in metadata


def _resolved(path: str | Path) -> Path:
    """``path`` resolved; ``OutputError`` for a symbolic link loop (one line)."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError) as exc:  # "Symlink loop from ..."
        raise OutputError(f"{path}: {exc}") from None


def same_path(one: str | Path, other: str | Path) -> bool:
    """Whether two paths name the same place once resolved (a link loop names none)."""
    try:
        return Path(one).resolve() == Path(other).resolve()
    except (RuntimeError, OSError):
        return False


def same_output(recorded: dict[str, Any] | None, fmt: str, path: str | Path) -> bool:
    """Whether ``recorded``, a writer's ``position()`` kept by a snapshot, is of the
    output ``path`` in format ``fmt`` (however either path is spelled)."""
    return (
        recorded is not None
        and recorded.get("format") == fmt
        and same_path(recorded.get("path", ""), path)
    )


def _same_file(one: Path, other: Path) -> bool:
    try:
        return one.exists() and other.exists() and os.path.samefile(one, other)
    except OSError:
        return False


class Writer(Protocol):
    rows_written: int

    def write(self, result: StepResult) -> None: ...

    def position(self) -> dict[str, Any] | None: ...

    def close(self) -> None: ...


def is_device(path: str | Path) -> bool:
    """Whether ``path`` is a character device (``/dev/null``, a terminal): an output that
    keeps nothing, written as a stream like stdout."""
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def output_format(path: str | Path | None) -> str:
    """``jsonl``, ``csv`` or ``parquet`` for ``path`` by its extension; ``-``/None and a
    device without one of those extensions (``/dev/null``): jsonl, as on stdout.

    Raises ``OutputError`` for any other extension (rather than guess).
    """
    if path in (None, "-"):
        return "jsonl"
    suffix = Path(str(path)).suffix.lower()
    if suffix in FORMATS_BY_SUFFIX:
        return FORMATS_BY_SUFFIX[suffix]
    if is_device(path):  # a run that only publishes writes its rows to /dev/null
        return "jsonl"
    known = ", ".join(sorted(FORMATS_BY_SUFFIX))
    raise OutputError(f"cannot tell the output format of {str(path)!r}: use one of {known} or '-'")


class LineFile:
    """An append-only byte file whose position can be made durable and cut back to.

    On a device (``/dev/null``) nothing is kept: its position is always 0 bytes, and a
    resume has nothing to cut back (a device can be neither synced nor truncated)."""

    def __init__(self, path: str | Path | None, resume_bytes: int | None) -> None:
        self.path = None if path in (None, "-") else Path(path)
        self._device = self.path is not None and is_device(self.path)
        if self.path is None:
            self._file: IO[bytes] = sys.stdout.buffer
            return
        if resume_bytes is None or self._device:
            try:
                self._file = open(self.path, "wb")  # noqa: SIM115
            except OSError as exc:
                raise cannot_write(self.path, exc) from None
            return
        try:
            self._file = open(self.path, "r+b")  # noqa: SIM115
        except FileNotFoundError:
            raise OutputError(
                f"{self.path}: the snapshot recorded {resume_bytes} bytes of output here, "
                "but the file is gone; resume with a new -o file or start fresh"
            ) from None
        except OSError as exc:
            raise cannot_write(self.path, exc) from None
        size = os.fstat(self._file.fileno()).st_size
        if size < resume_bytes:
            self._file.close()
            raise OutputError(
                f"{self.path}: holds {size} bytes, fewer than the {resume_bytes} the snapshot "
                "recorded (the output was cut or replaced); cannot resume losslessly: resume "
                "with a new -o file or start fresh"
            )
        self._file.truncate(resume_bytes)
        self._file.seek(resume_bytes)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A full disk, a lost mount: ``cannot_write``, one line for the user."""
        try:
            yield
        except BrokenPipeError:
            if self.path is None:
                raise ReaderGone("stdout was closed by its reader") from None
            raise
        except OSError as exc:
            raise cannot_write(self.path or "stdout", exc) from None

    def write(self, data: bytes) -> None:
        with self._writing():
            self._file.write(data)

    def tell(self) -> int | None:
        if self.path is None:
            return None
        return 0 if self._device else self._file.tell()

    def sync(self) -> None:
        with self._writing():
            self._file.flush()
            if self.path is not None and not self._device:
                os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._writing():
            if self.path is None:
                self._file.flush()
            else:
                self._file.close()


class JsonlWriter:
    """One JSON object per (stream, bar) and line; ``path=None`` or ``"-"`` writes to stdout."""

    format = "jsonl"

    def __init__(self, path: str | Path | None = None, resume_bytes: int | None = None) -> None:
        self._out = LineFile(path, resume_bytes)
        self.rows_written = 0

    def write(self, result: StepResult) -> None:
        from atc_stream.core.messages import encoded_row_chunks

        for rows in encoded_row_chunks(result):
            if rows:
                self._out.write(b"\n".join(rows) + b"\n")
                self.rows_written += len(rows)

    def position(self) -> dict[str, Any] | None:
        self._out.sync()
        if self._out.path is None:
            return None
        return {
            "format": self.format,
            "path": str(self._out.path.absolute()),
            "bytes": self._out.tell(),
        }

    def close(self) -> None:
        self._out.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CsvWriter(JsonlWriter):
    """A header line of the columns, then one row per (stream, bar).

    The columns are ``schema.COLUMNS``, or ``columns`` (``schema.columns_for`` of the
    engine's requested outputs); every result written must carry exactly those.
    Times are integer epoch ms; floats not available yet are empty cells; booleans are
    ``true``/``false``.
    """

    format = "csv"

    def __init__(
        self,
        path: str | Path | None = None,
        resume_bytes: int | None = None,
        columns: tuple[str, ...] = COLUMNS,
    ) -> None:
        import pyarrow  # noqa: F401  (fail early with ImportError if the extra is missing)

        self._out = LineFile(path, resume_bytes)
        self.rows_written = 0
        self.columns = tuple(columns)
        if not resume_bytes:
            self._out.write((",".join(self.columns) + "\n").encode())

    def write(self, result: StepResult) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.csv as pcsv

        if len(result) == 0:
            return
        if result.column_names != self.columns:
            raise OutputError(
                f"a result with columns {list(result.column_names)} cannot go to a CSV file "
                f"with header {list(self.columns)} (same requested outputs needed)"
            )
        columns = result.columns()
        arrays = []
        for name in self.columns:
            values = columns[name]
            if values.dtype.kind == "f":
                arrays.append(pa.array(values, mask=np.isnan(values)))
            else:
                arrays.append(pa.array(values))
        table = pa.Table.from_arrays(arrays, names=list(self.columns))
        buffer = io.BytesIO()
        options = pcsv.WriteOptions(include_header=False, quoting_style="needed")
        pcsv.write_csv(table, buffer, options)
        self._out.write(buffer.getvalue())
        self.rows_written += table.num_rows


class ParquetWriter:
    """A directory of Parquet parts (``part-00000.parquet``, ...), one table together.

    Rows are buffered and written as a part every ``rows_per_part`` rows and at each
    ``position()`` call (a snapshot), each part to a temporary name, fsynced and renamed,
    so a part is either complete or absent. ``metadata`` (``schema.params_metadata``)
    goes into every part.
    """

    format = "parquet"

    def __init__(
        self,
        path: str | Path,
        rows_per_part: int = 100_000,
        metadata: dict | None = None,
        resume_parts: int | None = None,
    ) -> None:
        import pyarrow  # noqa: F401  (fail early with ImportError if the extra is missing)

        self.path = Path(path)
        self._rows_per_part = rows_per_part
        self._pending: list[StepResult] = []
        self._pending_rows = 0
        self._metadata = metadata or {}
        self.rows_written = 0
        if self.path.is_file() and resume_parts:
            raise OutputError(
                f"{self.path}: the snapshot recorded Parquet parts in this directory, "
                "but it is a file now; cannot resume losslessly: resume with a new -o path or "
                "start fresh"
            )
        check_parquet_target(self.path)
        try:
            if self.path.is_file():  # a single-file output of an older run: replaced
                self.path.unlink()
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise cannot_write(self.path, exc) from None
        keep = resume_parts or 0
        existing = self._parts()
        missing = [i for i in range(keep) if i not in existing]
        if missing:
            raise OutputError(
                f"{self.path}: part {missing[0]} recorded by the snapshot is missing; "
                "cannot resume losslessly: resume with a new -o path or start fresh"
            )
        for index, part in existing.items():
            if index >= keep:
                part.unlink()  # written after the snapshot: those rows are written again
        for stale in self.path.glob(".part-*.tmp"):
            stale.unlink()
        self._next_part = keep

    def _parts(self) -> dict[int, Path]:
        parts = {}
        for entry in self.path.iterdir():
            match = PART_PATTERN.match(entry.name)
            if match:
                parts[int(match.group(1))] = entry
        return parts

    def write(self, result: StepResult) -> None:
        if len(result) == 0:
            return
        self._pending.append(result)
        self._pending_rows += len(result)
        if self._pending_rows >= self._rows_per_part:
            self._flush()

    def _flush(self) -> None:
        import pyarrow.parquet as pq

        if not self._pending:
            return
        table = results_to_arrow(self._pending).replace_schema_metadata(self._metadata)
        name = f"part-{self._next_part:05d}.parquet"
        try:
            with atomic_file(self.path / name, f".{name}.") as f:
                pq.write_table(table, f)
        except OSError as exc:  # (pyarrow's own errors on a full disk are OSErrors too)
            raise cannot_write(self.path / name, exc) from None
        self._next_part += 1
        self.rows_written += table.num_rows
        self._pending, self._pending_rows = [], 0

    def position(self) -> dict[str, Any]:
        self._flush()
        return {"format": self.format, "path": str(self.path.absolute()), "parts": self._next_part}

    def close(self) -> None:
        self._flush()

    def __enter__(self) -> ParquetWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_writer(
    path: str | Path | None,
    metadata: dict | None = None,
    resume_from: dict[str, Any] | None = None,
    columns: tuple[str, ...] = COLUMNS,
) -> JsonlWriter | CsvWriter | ParquetWriter:
    """The writer for ``path`` (format by extension, see ``output_format``).

    ``resume_from`` is a ``position()`` recorded by a snapshot: when it names this same
    path and format, the output is cut back to it and appended to; otherwise the output
    starts fresh (a new file for the rows from the snapshot on). ``columns``: the
    columns of the results that will be written (``schema.columns_for(engine.outputs)``);
    the CSV header needs them up front.
    """
    fmt = output_format(path)
    here = None  # the position to resume from: one of this same output
    if path is not None and path != "-" and same_output(resume_from, fmt, path):
        here = resume_from
    if fmt == "parquet":
        assert path is not None  # "-" and None are JSONL
        parts = int(here["parts"]) if here is not None else None
        return ParquetWriter(path, metadata=metadata, resume_parts=parts)
    resume_bytes = int(here["bytes"]) if here is not None else None
    if fmt == "csv":
        return CsvWriter(path, resume_bytes=resume_bytes, columns=columns)
    return JsonlWriter(path, resume_bytes=resume_bytes)
