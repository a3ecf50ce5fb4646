"""A sweep's OUTDIR: each table appears whole, and ``_SUCCESS`` marks one run's complete set.

Why a marker and how a killed sweep is cleaned up: docs/design/sweep.md, "Output files".
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from atc_stream.app.console import RunError
from atc_stream.io.files import atomic_file, fsync_dir
from atc_stream.io.writers import PART_PATTERN

#: The tables of OUTDIR, in the order they are replaced (``NAME.parquet``).
TABLES = ("metrics", "trades", "params", "strategies", "ranking")
#: Written last, removed before the first table is replaced.
MARKER = "_SUCCESS"
#: What the marker holds.
MARKER_TEXT = "".join(f"{name}.parquet\n" for name in TABLES)
#: Parquet metadata key naming the table in every table (and --ray part) a sweep writes:
#: how a later sweep tells its own files from the user's before replacing them.
TABLE_KEY = "atc_stream.sweep_table"


class SweepOutput:
    """OUTDIR of one sweep: ``begin`` before the work, ``finish`` with the tables."""

    def __init__(self, outdir: Path) -> None:
        self.outdir = outdir
        #: ``--ray``'s trades dataset while blocks finish: renamed into place by ``finish``
        self.staged_trades = outdir / ".trades.parquet.parts.tmp"

    def check_apart(self, inputs: dict[str, Path]) -> None:
        """``RunError`` when writing OUTDIR would replace or remove an input (OUTDIR is
        the input, or an input is one of its tables), or when OUTDIR lies inside a
        directory input (its tables would be read as input by the next run). Other
        files in OUTDIR are left alone, so an input beside the tables is fine."""
        out = self.outdir.resolve()
        written = [out / f"{name}.parquet" for name in TABLES]
        written += [out / MARKER, self.staged_trades.resolve()]
        for option, path in inputs.items():
            given = path.resolve()
            if given == out or any(given == w or given.is_relative_to(w) for w in written):
                how = "is" if given == out else "would replace"
            elif given.is_dir() and out.is_relative_to(given):
                how = "is inside"
            else:
                continue
            raise RunError(f"-o {self.outdir} {how} the input {option} {path}; choose another path")

    def check_ours(self) -> None:
        """``RunError`` when OUTDIR is a file, or when a table or ``_SUCCESS`` the sweep
        would replace is there but was not written by a sweep: it is the user's, not
        ours to delete. A table is ours when it carries ``TABLE_KEY`` (a ``--ray``
        dataset: a directory of such parts), or when an earlier version's ``_SUCCESS``
        lists it."""
        if self.outdir.is_file():
            raise RunError(f"-o {self.outdir} is a file: a sweep writes a directory of tables")
        if not self.outdir.is_dir():
            return
        marker = self.outdir / MARKER
        ours = _marker_is_ours(marker)
        foreign = [marker.name] if marker.exists() and not ours else []
        for name in TABLES:
            path = self.outdir / f"{name}.parquet"
            if (path.exists() or path.is_symlink()) and not (ours or _table_is_ours(path)):
                foreign.append(path.name)
        if foreign:
            more, them = (f" and {len(foreign) - 1} more", "them") if foreign[1:] else ("", "it")
            raise RunError(
                f"-o {self.outdir} holds {foreign[0]}{more}, which a sweep would replace but "
                f"atc-stream did not write; give another directory, or move {them} away"
            )

    def begin(self, *, staged_trades: bool = False) -> None:
        """OUTDIR created, and what a killed sweep left there removed: temporary tables,
        a half-written dataset, an old dataset set aside (the complete tables stay until
        ``finish`` replaces them); with ``staged_trades``, an empty ``staged_trades``."""
        if self.outdir.is_file():
            raise RunError(f"-o {self.outdir} is a file: a sweep writes a directory of tables")
        try:
            self.outdir.mkdir(parents=True, exist_ok=True)
            for prefix in (*(f".{name}.parquet." for name in TABLES), f".{MARKER}."):
                for stale in self.outdir.glob(f"{prefix}*.tmp"):
                    _remove(stale)
            _remove(self.staged_trades)
            _remove(self._set_aside())
            if staged_trades:
                self.staged_trades.mkdir()
        except OSError as exc:
            raise RunError(f"cannot write {self.outdir}: {exc}") from None

    def trades_file(self) -> TradesFile:
        """``trades.parquet``, written block by block under a temporary name; ``finish``
        renames it into place when given it as the ``trades`` table."""
        return TradesFile(self.outdir / "trades.parquet")

    def finish(self, tables: dict[str, pa.Table | TradesFile | None]) -> None:
        """Replace the tables (``trades`` None: the staged dataset; a ``TradesFile``: that
        file) and mark the set complete.

        A kill before the marker is written leaves no marker: the files may then be of
        two runs, and the next sweep into OUTDIR replaces every one of them.
        """
        try:
            marker = self.outdir / MARKER
            marker.unlink(missing_ok=True)
            fsync_dir(self.outdir)
            for name in TABLES:
                final = self.outdir / f"{name}.parquet"
                table = tables.get(name)
                if table is None:
                    self._replace_dir(self.staged_trades, final)
                    continue
                if final.is_dir():  # a --ray dataset: a file cannot be renamed over it
                    self._replace_dir(None, final)
                if isinstance(table, TradesFile):
                    table.close()
                    continue
                with atomic_file(final, f".{name}.parquet.") as f:
                    pq.write_table(_marked(table, name), f)
            with atomic_file(marker, f".{MARKER}.") as f:
                f.write(MARKER_TEXT.encode())
        except OSError as exc:
            raise RunError(f"cannot write {self.outdir}: {exc}") from None

    def _set_aside(self) -> Path:
        return self.outdir / ".trades.parquet.old.tmp"

    def _replace_dir(self, new: Path | None, final: Path) -> None:
        """``final`` (a file or directory) replaced by the directory ``new`` (None: removed):
        a directory cannot be renamed over a non-empty one, so the old one is set aside."""
        old = self._set_aside()
        if final.exists():
            os.replace(final, old)
        if new is not None:
            fsync_dir(new)
            os.replace(new, final)
        fsync_dir(self.outdir)
        _remove(old)


class TradesFile:
    """A Parquet file written a table at a time (one row group each), so that a sweep holds
    one block's trades, not all of them; it appears at ``final`` on ``close``, complete
    (``atomic_file``: a kill before leaves only a temporary file that the next
    ``SweepOutput.begin`` removes). ``discard`` removes the temporary file."""

    def __init__(self, final: Path) -> None:
        self.final = final
        self._stack = contextlib.ExitStack()
        try:
            self._file: BinaryIO = self._stack.enter_context(atomic_file(final, f".{final.name}."))
        except OSError as exc:
            raise RunError(f"cannot write {final}: {exc}") from None
        self._writer: pq.ParquetWriter | None = None
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        """Append ``table`` (the first table's schema is the file's)."""
        try:
            if self._writer is None:
                self._writer = pq.ParquetWriter(self._file, _marked(table, "trades").schema)
            self._writer.write_table(table.cast(self._writer.schema))
        except OSError as exc:  # a full disk, a lost mount
            raise RunError(f"cannot write {self.final}: {exc}") from None
        self.rows += table.num_rows

    def close(self) -> None:
        """Finish the file and rename it into place (synced)."""
        if self._writer is None:
            raise RuntimeError("TradesFile.close() before any table was written")
        self._writer.close()
        self._stack.close()

    def discard(self) -> None:
        """Remove the temporary file; called while handling the error that ends the
        sweep, which ``atomic_file`` is given (it removes its file on any error)."""
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        with contextlib.suppress(OSError):
            self._stack.__exit__(*sys.exc_info())


def write_synced(table: pa.Table, path: Path) -> None:
    """``table`` as the Parquet file ``path`` (a part of ``--ray``'s trades dataset,
    marked as a sweep's trades), on disk before this returns."""
    with open(path, "wb") as f:
        pq.write_table(_marked(table, "trades"), f)
        f.flush()
        os.fsync(f.fileno())


def _marked(table: pa.Table, name: str) -> pa.Table:
    return table.replace_schema_metadata({**(table.schema.metadata or {}), TABLE_KEY: name})


def _marker_is_ours(marker: Path) -> bool:
    try:
        return marker.is_file() and marker.read_bytes() == MARKER_TEXT.encode()
    except OSError:
        return False


def _table_is_ours(path: Path) -> bool:
    """Whether ``path`` is a Parquet file carrying ``TABLE_KEY``, or a directory of parts
    that do (an empty one holds nothing to lose)."""
    if path.is_dir():
        parts = sorted(path.iterdir())
        if not all(PART_PATTERN.match(part.name) for part in parts):
            return False
        return not parts or _table_is_ours(parts[0])
    if not path.is_file():  # a FIFO, a dangling link: not a table of ours
        return False
    try:
        metadata = pq.read_schema(path).metadata or {}
    except Exception:  # not Parquet, unreadable: not ours either way
        return False
    return TABLE_KEY.encode() in metadata


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
