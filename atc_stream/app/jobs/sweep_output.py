"""A sweep's OUTDIR: each table appears whole, and ``_SUCCESS`` marks one run's complete set.

Why a marker and how a killed sweep is cleaned up: docs/design/sweep.md, "Output files".
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from atc_stream.app.console import RunError
from atc_stream.io.files import atomic_file, fsync_dir

#: The tables of OUTDIR, in the order they are replaced (``NAME.parquet``).
TABLES = ("metrics", "trades", "params", "strategies", "ranking")
#: Written last, removed before the first table is replaced.
MARKER = "_SUCCESS"


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

    def begin(self, *, staged_trades: bool = False) -> None:
        """OUTDIR created, and what a killed sweep left there removed: temporary tables,
        a half-written dataset, an old dataset set aside (the complete tables stay until
        ``finish`` replaces them); with ``staged_trades``, an empty ``staged_trades``."""
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

    def finish(self, tables: dict[str, pa.Table | None]) -> None:
        """Replace the tables (``trades`` None: the staged dataset) and mark the set complete.

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
                with atomic_file(final, f".{name}.parquet.") as f:
                    pq.write_table(table, f)
            with atomic_file(marker, f".{MARKER}.") as f:
                f.write(("\n".join(f"{name}.parquet" for name in TABLES) + "\n").encode())
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


def write_synced(table: pa.Table, path: Path) -> None:
    """``table`` as the Parquet file ``path``, on disk before this returns."""
    with open(path, "wb") as f:
        pq.write_table(table, f)
        f.flush()
        os.fsync(f.fileno())


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
