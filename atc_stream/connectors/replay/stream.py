"""Bar files streamed to the player in memory bounded by streams, not by rows.

The two passes and the bounded external sort: docs/design/replay.md.
"""

from __future__ import annotations

import bisect
import functools
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from atc_stream.core.progress import progress_bar
from atc_stream.core.spacing import interval_of
from atc_stream.io.readers import (
    BadRows,
    InputError,
    Ohlc,
    SymbolCodes,
    iter_bar_batches,
    row_where,
)

log = logging.getLogger("atc_stream.replay")

#: Rows per sorted chunk of the external sort (spilled to one temporary IPC file each).
DEFAULT_CHUNK_ROWS = 1_500_000
#: Rows of each sorted run held in memory at a time while merging.
DEFAULT_MERGE_ROWS = 32_768
#: Rows of the file's start used to infer the interval (12 B each).
DEFAULT_SAMPLE_ROWS = 500_000
_NEVER = np.iinfo(np.int64).max


@dataclass
class Block:
    """Rows in time order: ``codes`` index ``symbol_names``; ``rows`` are the rows'
    positions among the file's good rows (file order); ``ohlc``: their (opens, highs,
    lows), for an engine with strategies; ``lines``: the line (a Parquet file's row)
    each came from, for ``BarFileSource.where``, when the source has them."""

    codes: np.ndarray  # int32
    times: np.ndarray  # int64
    closes: np.ndarray  # float64
    rows: np.ndarray  # int64
    ohlc: Ohlc | None = None
    lines: np.ndarray | None = None  # int64

    def __len__(self) -> int:
        return self.times.shape[0]

    def take(self, index) -> Block:
        ohlc = None if self.ohlc is None else (
            self.ohlc[0][index], self.ohlc[1][index], self.ohlc[2][index]
        )  # fmt: skip
        lines = None if self.lines is None else self.lines[index]
        return Block(
            self.codes[index], self.times[index], self.closes[index], self.rows[index], ohlc,
            lines,
        )  # fmt: skip

    @staticmethod
    def concat(blocks: list[Block]) -> Block:
        if len(blocks) == 1:
            return blocks[0]
        parts = [b.ohlc for b in blocks if b.ohlc is not None]
        ohlc = None
        if len(parts) == len(blocks):
            o, h, lo = (np.concatenate([p[k] for p in parts]) for k in range(3))
            ohlc = (o, h, lo)
        lines = [b.lines for b in blocks if b.lines is not None]
        codes, times, closes, rows = (
            np.concatenate([getattr(b, name) for b in blocks]) for name in _FIELDS
        )
        return Block(
            codes, times, closes, rows, ohlc,
            np.concatenate(lines) if len(lines) == len(blocks) else None,
        )  # fmt: skip


_FIELDS = ("codes", "times", "closes", "rows")


class BarFileSource:
    """A bar file (or directory) as a bar source for ``BarPlayer``; scanned on creation.

    ``ohlc_columns``: the (open, high, low) columns, read beside the close so that the
    bars carry OHLC (for an engine with strategies). ``progress``: a bar on stderr (rows
    read) while the file is scanned. Raises ``io.readers.InputError`` for damage that
    makes a file unreadable.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        symbol_column: str = "symbol",
        time_column: str = "time",
        close_column: str = "close",
        ohlc_columns: tuple[str, str, str] | None = None,
        symbol: str | None = None,
        time_unit: str = "auto",
        warmup_bars: int = 0,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        merge_rows: int = DEFAULT_MERGE_ROWS,
        sample_rows: int = DEFAULT_SAMPLE_ROWS,
        spill_dir: str | Path | None = None,
        progress: bool = False,
    ) -> None:
        if warmup_bars < 0:
            raise ValueError(f"warmup_bars must be >= 0, got {warmup_bars}")
        if chunk_rows < 1 or merge_rows < 1:
            raise ValueError("chunk_rows and merge_rows must be >= 1")
        self.path = Path(path)
        self._read_file = functools.partial(
            iter_bar_batches, self.path, symbol_column=symbol_column, time_column=time_column,
            close_column=close_column, ohlc_columns=ohlc_columns, symbol=symbol,
            time_unit=time_unit,
        )  # fmt: skip
        self.warmup_bars = warmup_bars
        self.chunk_rows = chunk_rows
        self.merge_rows = merge_rows
        self.spill_dir = spill_dir
        self.bad_rows = BadRows()
        #: rows skipped by the last ``blocks`` as already applied (resume)
        self.skipped = 0
        #: sorted runs spilled by the last ``blocks`` (0: the rows were in time order,
        #: or few enough to sort in memory)
        self.spilled_runs = 0
        self._symbols = SymbolCodes()
        #: the files of the good rows from ``_file_starts[i]`` on (one per file: ``where``)
        self._files: list[Path] = []
        self._file_starts: list[int] = []
        self._scan(sample_rows, progress)

    # -- pass 1 -------------------------------------------------------------------

    def _read(self, bad: BadRows):
        return self._read_file(bad=bad, symbols=self._symbols)

    def _scan(self, sample_rows: int, progress: bool) -> None:
        # the whole file is read before the first bar is played: on a large file that is
        # minutes, which a bar of its own shows are spent reading, not hung
        with progress_bar(progress, desc="reading", unit="row", unit_scale=True,
                          leave=False) as bar:  # fmt: skip
            self._scan_rows(sample_rows, bar)

    def _scan_rows(self, sample_rows: int, bar) -> None:
        rows, last_time, in_order = 0, np.iinfo(np.int64).min, True
        sample: list[tuple[np.ndarray, np.ndarray]] = []
        sampled = 0
        first_bars = _FirstBars(self.warmup_bars)
        for batch in self._read(self.bad_rows):
            n = len(batch)
            if batch.path is not None and (not self._files or batch.path != self._files[-1]):
                self._files.append(batch.path)
                self._file_starts.append(rows)
            if in_order:
                in_order = batch.times[0] >= last_time and not (np.diff(batch.times) < 0).any()
                last_time = batch.times[-1]
            if sampled < sample_rows:
                take = min(n, sample_rows - sampled)
                sample.append((batch.codes[:take].copy(), batch.times[:take].copy()))
                sampled += take
            if self.warmup_bars:
                first_bars.add(
                    batch.codes, batch.times, rows + np.arange(n), batch.lines, _prices(batch)
                )
            rows += n
            bar.update(n)
        first_seen = self._symbols.names
        self.symbol_names: list[str] = sorted(first_seen.tolist())
        #: first-seen code -> index in ``symbol_names``
        self._to_sorted = np.empty(len(first_seen), np.int32)
        self._to_sorted[np.argsort(first_seen.astype(str), kind="stable")] = np.arange(
            len(first_seen), dtype=np.int32
        )
        self.rows = rows
        self.in_order = bool(in_order)
        codes = np.concatenate([c for c, _ in sample]) if sample else np.empty(0, np.int32)
        times = np.concatenate([t for _, t in sample]) if sample else np.empty(0, np.int64)
        self._interval = interval_of(codes, times)
        self._history, self._warm_until, self._history_at = first_bars.finish(self._to_sorted)

    def infer_interval(self) -> str | None:
        """``io.readers.infer_interval`` of the first ``sample_rows`` rows."""
        return self._interval

    def warmup_history(self, n: int) -> dict[str, tuple[np.ndarray, ...]]:
        """Each symbol's first ``n`` bars (``n``: the ``warmup_bars`` scanned for), by name:
        ``(times, closes)``, or with OHLC ``(times, opens, highs, lows, closes)``."""
        if n != self.warmup_bars:
            raise ValueError(f"scanned for {self.warmup_bars} warmup bars, asked for {n}")
        return {self.symbol_names[code]: bars for code, bars in self._history.items()}

    def where(self, row: int, line: int) -> str:
        """``file:line`` (``file:row N`` of a Parquet file) of the good row ``row`` (its
        position in file order), which is on ``line`` of its file."""
        file = self._files[max(bisect.bisect_right(self._file_starts, row) - 1, 0)]
        return row_where(file, line)

    def warmup_where(self, symbol: str | None, index: int) -> str | None:
        """``where`` of bar ``index`` of ``symbol``'s ``warmup_history``; None for a bar
        it does not have."""
        if symbol is None:
            return None
        code = bisect.bisect_left(self.symbol_names, symbol)
        named = code < len(self.symbol_names) and self.symbol_names[code] == symbol
        if not named or code not in self._history_at:
            return None
        rows, lines = self._history_at[code]
        if not 0 <= index < rows.shape[0]:
            return None
        return self.where(int(rows[index]), int(lines[index]))

    # -- pass 2 -------------------------------------------------------------------

    def blocks(
        self, *, exclude_warm: bool, applied_until: np.ndarray | None = None
    ) -> Iterator[Block]:
        """The rows in time order, whole bar times per block; without the warmup bars
        (``exclude_warm``) and the rows at or before ``applied_until[code]`` (resume)."""
        self.skipped = 0
        self.spilled_runs = 0
        rows = self._rows(exclude_warm, applied_until)
        if self.in_order:
            yield from whole_bar_times(rows)
        else:
            yield from self._sorted(rows)

    def _rows(self, exclude_warm: bool, applied_until: np.ndarray | None) -> Iterator[Block]:
        """The file's good rows again (file order), filtered, with sorted symbol codes."""
        seen = 0
        for batch in self._read(BadRows()):  # rejected rows were reported by the scan
            n = len(batch)
            if batch.codes.max() >= self._to_sorted.shape[0] or seen + n > self.rows:
                raise self._changed()
            block = Block(
                self._to_sorted[batch.codes], batch.times, batch.closes,
                seen + np.arange(n, dtype=np.int64), batch.ohlc, batch.lines,
            )  # fmt: skip
            seen += n
            keep = np.ones(n, bool)
            if exclude_warm and self.warmup_bars:
                until_time, until_row = self._warm_until
                t, r = until_time[block.codes], until_row[block.codes]
                keep &= ~((block.times < t) | ((block.times == t) & (block.rows <= r)))
            if applied_until is not None:
                applied = block.times <= applied_until[block.codes]
                self.skipped += int((applied & keep).sum())
                keep &= ~applied
            if not keep.all():
                block = block.take(np.flatnonzero(keep))
            if len(block):
                yield block
        if seen != self.rows:
            raise self._changed()

    def _changed(self) -> InputError:
        return InputError(f"{self.path}: changed while being replayed; replay it again")

    def _sorted(self, rows: Iterable[Block]) -> Iterator[Block]:
        """``rows`` in time order (stable): in memory within one chunk, else spilled runs
        merged."""
        chunk: list[Block] = []
        size = 0
        spill_dir = Path(self.spill_dir or tempfile.gettempdir())
        remove_stale_spills(spill_dir)
        with tempfile.TemporaryDirectory(prefix=_spill_prefix(), dir=spill_dir) as tmp:
            runs: list[Path] = []
            for block in rows:
                chunk.append(block)
                size += len(block)
                while size >= self.chunk_rows:
                    rows_so_far = Block.concat(chunk)
                    full = rows_so_far.take(slice(0, self.chunk_rows))
                    runs.append(_spill(_by_time(full), Path(tmp), len(runs), self.merge_rows))
                    chunk = [rows_so_far.take(slice(self.chunk_rows, None))]
                    size -= self.chunk_rows
            if not runs:  # one chunk: no need to spill
                if size:
                    yield _by_time(Block.concat(chunk))
                return
            if size:
                runs.append(_spill(_by_time(Block.concat(chunk)), Path(tmp), len(runs),
                                   self.merge_rows))  # fmt: skip
            chunk = []
            self.spilled_runs = len(runs)
            yield from merge_runs(runs)


#: Sort directories are named ``atc-replay-sort-<host>-<pid>-<random>``: a replay that
#: was killed (SIGKILL, a power cut) cannot delete its own, so the next one on the same
#: host deletes those whose process is gone.
_SPILL_PREFIX = "atc-replay-sort-"


def _host_prefix() -> str:
    host = socket.gethostname().replace("-", "_") or "host"
    return f"{_SPILL_PREFIX}{host}-"


def _spill_prefix() -> str:
    return f"{_host_prefix()}{os.getpid()}-"


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists (another user's): not ours to judge
        return False
    return False


def remove_stale_spills(spill_dir: Path) -> tuple[int, int]:
    """Delete the sort directories in ``spill_dir`` left by killed replays on this host
    (their process no longer exists); (directories, bytes) removed. Directories of
    other hosts (a shared spill directory) and of live processes are left alone."""
    host_prefix = _host_prefix()
    removed = freed = 0
    try:
        candidates = list(spill_dir.glob(f"{host_prefix}*"))
    except OSError:
        return 0, 0
    for path in candidates:
        pid_text = path.name[len(host_prefix) :].split("-", 1)[0]
        if not pid_text.isdigit() or not path.is_dir() or not _process_gone(int(pid_text)):
            continue
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed, freed = removed + 1, freed + size
    if removed:
        log.warning(
            "removed %d sort director%s left in %s by killed replays (%.1f MB)",
            removed, "y" if removed == 1 else "ies", spill_dir, freed / 1e6,
        )  # fmt: skip
    return removed, freed


def _by_time(block: Block) -> Block:
    """A block's rows by time, stable (its rows are in file order)."""
    return block.take(np.argsort(block.times, kind="stable"))


def whole_bar_times(blocks: Iterable[Block]) -> Iterator[Block]:
    """Time-ordered ``blocks`` regrouped so that no bar time is split between two."""
    carry: Block | None = None
    for block in blocks:
        if carry is not None and len(carry):
            block = Block.concat([carry, block])
        if not len(block):
            continue
        cut = int(np.searchsorted(block.times, block.times[-1], side="left"))
        if cut:
            yield block.take(slice(0, cut))
        carry = block.take(slice(cut, None))
    if carry is not None and len(carry):
        yield carry


def _spill(block: Block, directory: Path, number: int, batch_rows: int) -> Path:
    """Write a sorted block as an Arrow IPC file of ``batch_rows``-row batches (with a
    line column when the block has lines, open, high and low columns when it has
    OHLC)."""
    import pyarrow as pa

    path = directory / f"run{number:05d}.arrow"
    fields = [("code", pa.int32()), ("time", pa.int64()), ("close", pa.float64()),
              ("row", pa.int64())]  # fmt: skip
    if block.lines is not None:
        fields.append(("line", pa.int64()))
    if block.ohlc is not None:
        fields += [(name, pa.float64()) for name in ("open", "high", "low")]
    schema = pa.schema(fields)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        for start in range(0, len(block), batch_rows):
            part = block.take(slice(start, start + batch_rows))
            columns = [getattr(part, name) for name in _FIELDS]
            columns += ([] if part.lines is None else [part.lines]) + list(part.ohlc or ())
            writer.write_batch(pa.record_batch([pa.array(c) for c in columns], schema=schema))
    return path


class _Run:
    """A spilled sorted run, read one IPC batch at a time."""

    def __init__(self, path: Path) -> None:
        import pyarrow as pa

        self._file = pa.OSFile(str(path), "rb")
        self._reader = pa.ipc.open_file(self._file)
        self._next = 0
        self.rows = Block(np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0),
                          np.empty(0, np.int64))  # fmt: skip

    @property
    def more(self) -> bool:
        return self._next < self._reader.num_record_batches

    @property
    def done(self) -> bool:
        return not len(self.rows) and not self.more

    def load(self) -> None:
        """Append the run's next batch to ``rows``."""
        batch = self._reader.get_batch(self._next)
        self._next += 1
        columns = {name: batch.column(name).to_numpy() for name in batch.schema.names}
        ohlc = None
        if "open" in columns:
            ohlc = (columns["open"], columns["high"], columns["low"])
        loaded = Block(
            columns["code"], columns["time"], columns["close"], columns["row"], ohlc,
            columns.get("line"),
        )  # fmt: skip
        self.rows = Block.concat([self.rows, loaded]) if len(self.rows) else loaded
        if not self.more:
            self._file.close()


def merge_runs(paths: list[Path]) -> Iterator[Block]:
    """k-way merge of sorted runs into time-ordered blocks of whole bar times (stable:
    by ``rows`` within a bar time).

    Each round takes, from every run, the rows before the earliest last time among the
    loaded batches of runs that have more: no row still on disk can come before them.
    """
    runs = [_Run(path) for path in paths]
    while True:
        runs = [run for run in runs if not run.done]
        if not runs:
            return
        for run in runs:
            if not len(run.rows):
                run.load()
        pending = [int(run.rows.times[-1]) for run in runs if run.more]
        bound = min(pending) if pending else None
        parts = []
        for run in runs:
            k = (
                len(run.rows)
                if bound is None
                else int(np.searchsorted(run.rows.times, bound, side="left"))
            )
            if k:
                parts.append(run.rows.take(slice(0, k)))
                run.rows = run.rows.take(slice(k, None))
        if not parts:  # every loaded row is at ``bound``: read on where it may continue
            for run in runs:
                if run.more and int(run.rows.times[-1]) == bound:
                    run.load()
            continue
        merged = Block.concat(parts)
        yield merged.take(np.lexsort((merged.rows, merged.times)))


def _prices(batch) -> tuple[np.ndarray, ...]:
    """A batch's prices as a warmup history holds them: ``(closes,)`` or ``(opens,
    highs, lows, closes)``."""
    return (batch.closes,) if batch.ohlc is None else (*batch.ohlc, batch.closes)


class _FirstBars:
    """The first ``n`` bars of each symbol (by time, then file order), selected as rows
    stream by: at most about ``2 x n`` per symbol plus one batch in memory."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.size = 0
        self.kept = 0

    def add(self, codes, times, rows, lines, prices: tuple[np.ndarray, ...]) -> None:
        """Rows of one batch: their codes, times, positions, lines and ``_prices``."""
        self.parts.append((codes, times, rows, lines, *prices))
        self.size += codes.shape[0]
        if self.size > 2 * self.kept + 65_536:
            self._select()

    def _select(self) -> None:
        columns = [np.concatenate(c) for c in zip(*self.parts, strict=True)]
        codes, times, rows = columns[:3]
        order = np.lexsort((rows, times, codes))
        sorted_codes = codes[order]
        starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
        counts = np.diff(np.r_[starts, sorted_codes.shape[0]])
        rank = np.arange(order.shape[0]) - np.repeat(starts, counts)
        keep = order[rank < self.n]  # by code, then time, then row
        self.parts = [tuple(c[keep] for c in columns)]
        self.size = self.kept = keep.shape[0]

    def finish(self, to_sorted: np.ndarray):
        """``({sorted code: (times, *prices)}, (until_time, until_row), {sorted code:
        (rows, lines)})``: each symbol's first bars, per sorted code the (time, row) of
        its last one where it has ``n`` (else the end of time: every bar of the symbol
        is a warmup bar), and where the first bars came from."""
        symbols = to_sorted.shape[0]
        until = (np.full(symbols, _NEVER, np.int64), np.full(symbols, _NEVER, np.int64))
        if not self.n or not self.parts:
            return {}, until, {}
        self._select()
        codes, times, rows, lines, *prices = self.parts[0]
        codes = to_sorted[codes]
        order = np.lexsort((rows, times, codes))  # by sorted code (name), time, row
        codes, times, rows, lines = codes[order], times[order], rows[order], lines[order]
        prices = [p[order] for p in prices]
        firsts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
        history, at = {}, {}
        for start, end in zip(firsts, np.r_[firsts[1:], codes.shape[0]], strict=True):
            code = int(codes[start])
            history[code] = (times[start:end], *(p[start:end] for p in prices))
            at[code] = (rows[start:end], lines[start:end])
            if end - start == self.n:
                until[0][code], until[1][code] = times[end - 1], rows[end - 1]
        self.parts = []
        return history, until, at
