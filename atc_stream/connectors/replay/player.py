"""Feed bars through the engine: warm up, then play bar time by bar time.

Sources, order and pacing: docs/design/replay.md.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from atc_stream.core.progress import progress_bar
from atc_stream.core.results import Rejection, StepResult
from atc_stream.engine.bar_times import step_bar_times
from atc_stream.engine.engine import Engine
from atc_stream.io.readers import REPORT_FIRST, BadRows, BarTable

log = logging.getLogger("atc_stream.replay")

#: Longest single sleep of a paced replay: ``on_wait`` runs between sleeps, so a stop
#: asked for during a long wait (a bar interval at real speed) is seen this soon.
MAX_SLEEP_S = 0.1


@dataclass
class ReplaySummary:
    """What a replay did: counts, time, events and rejected inputs by reason."""

    symbols: int = 0
    warmup_bars: int = 0
    step_bars: int = 0
    rows_out: int = 0
    long_events: int = 0
    short_events: int = 0
    #: events on rows that were not ready (counted in long/short_events only when
    #: ``events_before_ready``; docs/spec.md, "Readiness")
    unready_events: int = 0
    events_before_ready: bool = False
    seconds: float = 0.0
    rejected: Counter = field(default_factory=Counter)
    #: how many of ``rejected`` are rows the file reader left out: those never reached
    #: the engine, so they are not among the warmup and stepped bars
    read_rejected: int = 0
    #: the inputs the engine rejected, the first few with the ``file:line`` they came
    #: from (where the source knows it: a bar file's rows)
    engine_rows: BadRows = field(default_factory=BadRows)
    #: ended early by SIGINT/SIGTERM
    stopped: bool = False

    @property
    def bars_per_second(self) -> float:
        total = self.warmup_bars + self.step_bars
        return total / self.seconds if self.seconds > 0 else float("inf")

    def count_events(self, result: StepResult) -> None:
        """Add ``result``'s long/short events: ready rows only unless ``events_before_ready``
        (none when its engine was not asked for the "events" outputs)."""
        if "events" not in result.groups:
            return
        ready = result.ready
        unready = int((result.long_events & ~ready).sum() + (result.short_events & ~ready).sum())
        self.unready_events += unready
        counted = slice(None) if self.events_before_ready else ready
        self.long_events += int(result.long_events[counted].sum())
        self.short_events += int(result.short_events[counted].sum())

    def _events_note(self) -> str:
        if self.events_before_ready:
            return f" (incl. {self.unready_events} before ready)"
        return f" (ready rows; {self.unready_events} before ready not counted)"

    def _rate_note(self) -> str:
        if self.seconds <= 0 or not (self.warmup_bars + self.step_bars):
            return ""
        return f" ({self.bars_per_second:,.0f} bars/s)"

    @property
    def engine_rejected(self) -> int:
        """The warmup and stepped bars the engine rejected."""
        return sum(self.rejected.values()) - self.read_rejected

    @property
    def applied(self) -> int:
        """The bars that reached a stream: read, handed to the engine and not rejected."""
        return self.warmup_bars + self.step_bars - self.engine_rejected

    def lines(self) -> list[str]:
        rejected = ", ".join(f"{k}={v}" for k, v in sorted(self.rejected.items())) or "none"
        of_them = f", {self.engine_rejected} of them rejected" if self.engine_rejected else ""
        if self.read_rejected:
            rows = "row" if self.read_rejected == 1 else "rows"
            of_them += f"; {self.read_rejected} {rows} left out when read"
        if of_them:
            of_them += " (below)"
        return [
            f"symbols          {self.symbols}",
            f"bars             {self.warmup_bars} warmup + {self.step_bars} stepped{of_them}",
            f"time             {self.seconds:.3f} s" + self._rate_note(),
            f"signal rows      {self.rows_out}",
            f"events           {self.long_events} long, {self.short_events} short"
            + self._events_note(),
            f"rejected inputs  {rejected}",
        ]


class TableBars:
    """A ``BarTable`` (every row in memory) as a bar source for ``BarPlayer``; with
    ``ohlc`` (opens, highs, lows per row) its bars carry OHLC, for an engine with
    strategies."""

    def __init__(
        self, table: BarTable, ohlc: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    ) -> None:
        names, codes = np.unique(table.symbols.astype(str), return_inverse=True)
        self.table = table
        self.ohlc = ohlc
        self.symbol_names: list[str] = names.tolist()
        self.rows = len(table)
        self.skipped = 0
        self._codes = codes.astype(np.int32)
        self._warm = np.zeros(len(table), bool)

    def warmup_history(self, n: int) -> dict[str, tuple[np.ndarray, ...]]:
        """Each symbol's first ``n`` bars (by time, then file order), by name: ``(times,
        closes)``, or with OHLC ``(times, opens, highs, lows, closes)``."""
        table = self.table
        self._warm = _rank_within_symbol(table.symbols, table.times) < n
        rows = np.flatnonzero(self._warm)
        rows = rows[np.lexsort((table.times[rows], self._codes[rows]))]
        codes = self._codes[rows]
        firsts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
        ohlc = self.ohlc

        def series(group: np.ndarray) -> tuple[np.ndarray, ...]:
            if ohlc is None:
                return table.times[group], table.closes[group]
            prices = (ohlc[0][group], ohlc[1][group], ohlc[2][group], table.closes[group])
            return (table.times[group], *prices)

        return {
            self.symbol_names[self._codes[group[0]]]: series(group)
            for group in np.split(rows, firsts[1:])
            if group.size
        }

    def warmup_where(self, symbol: str | None, index: int) -> None:
        """Where a warmup bar came from: a table in memory does not know."""
        return None

    def blocks(self, *, exclude_warm: bool, applied_until: np.ndarray | None = None):
        """One block: the rows in time order (stable), without the warmup bars
        (``exclude_warm``) and the rows at or before ``applied_until[code]``."""
        from atc_stream.connectors.replay.stream import Block

        table = self.table
        keep = ~self._warm if exclude_warm else np.ones(len(table), bool)
        self.skipped = 0
        if applied_until is not None:
            applied = table.times <= applied_until[self._codes]
            self.skipped = int((applied & keep).sum())
            keep &= ~applied
        rows = np.flatnonzero(keep)
        rows = rows[np.argsort(table.times[rows], kind="stable")]
        if rows.size:
            ohlc = None
            if self.ohlc is not None:
                ohlc = (self.ohlc[0][rows], self.ohlc[1][rows], self.ohlc[2][rows])
            yield Block(self._codes[rows], table.times[rows], table.closes[rows], rows, ohlc)


class BarPlayer:
    """Replays a bar source (a ``BarTable`` or a ``replay.stream.BarFileSource``) through
    an engine: bar times in order, up to ``batch_rows`` rows of whole bar times a call
    (``engine.bar_times.step_bar_times``), or one bar time a ``step_arrays`` call when
    paced (``speed``) or trading strategies."""

    #: called between the sleeps of a paced wait; may raise to end the run there
    on_wait: Callable[[], None] | None = None

    def __init__(
        self,
        engine: Engine,
        bars,
        *,
        warmup_bars: int = 0,
        speed: float | None = None,
        on_result: Callable[[StepResult], None] | None = None,
        progress: bool = False,
        events_before_ready: bool = False,
        batch_rows: int = 65_536,
    ) -> None:
        if warmup_bars < 0:
            raise ValueError(f"warmup_bars must be >= 0, got {warmup_bars}")
        if speed is not None and not speed > 0:
            raise ValueError(f"speed must be > 0 (x real time), got {speed}")
        self.engine = engine
        self.source = TableBars(bars) if isinstance(bars, BarTable) else bars
        self.warmup_bars = warmup_bars
        self.speed = speed
        self.on_result = on_result
        self.progress = progress
        self.summary = ReplaySummary(events_before_ready=events_before_ready)
        #: rows of whole bar times applied per engine call (0: one bar time a call)
        self.batch_rows = batch_rows

    def run(self, applied_until: np.ndarray | None = None) -> ReplaySummary:
        """Play the source; with ``applied_until`` (per symbol of ``source.symbol_names``,
        e.g. ``runner.last_times_by_symbol``) rows at or before it are taken as already
        applied and skipped (``source.skipped`` counts them)."""
        started = time.perf_counter()
        rejected_before = Counter(self.engine.rejections)
        symbols = self.source.symbol_names
        self.engine.add_symbols(symbols)  # one stream per parameter set; existing ones stay
        self.summary.symbols = len(symbols)
        warm = bool(self.warmup_bars)
        engine_logs = self.engine.log_rejections
        self.engine.log_rejections = False  # logged here, with where each input came from
        try:
            if warm:
                self._warmup()
            self._play(self.source.blocks(exclude_warm=warm, applied_until=applied_until))
        finally:  # also when a callback ends the run early: the summary says how far it got
            self.engine.log_rejections = engine_logs
            self.summary.seconds = time.perf_counter() - started
            self.summary.rejected = Counter(self.engine.rejections) - rejected_before
        return self.summary

    def _warmup(self) -> None:
        """Warm up on each symbol's first ``warmup_bars`` bars in one batched pass."""
        history = self.source.warmup_history(self.warmup_bars)
        result = self.engine.warmup(history, progress=self.progress)
        self.summary.warmup_bars = sum(len(series[0]) for series in history.values())
        if result.rejected:
            self._report(result.rejected, lambda r: self.source.warmup_where(r.symbol, r.index))
        self._emit(result)

    def _play(self, blocks) -> None:
        """Play ``blocks`` under a bar of the rows after the warmup: stepped, or skipped as
        already applied (``source.skipped``), so a replay that ends normally ends at its
        total, drawn (a bar is drawn at most every so often, and cleared when closed)."""
        total = self.source.rows - self.summary.warmup_bars if self.progress else None
        options = {"total": total, "desc": "replay", "unit": "bar", "leave": False}
        self._skipped_shown = 0  #: of ``source.skipped``, the rows the bar counted
        with progress_bar(self.progress, **options) as bar:
            self._play_blocks(blocks, bar)
            bar.update(self.source.skipped - self._skipped_shown)
            bar.refresh()

    def _play_blocks(self, blocks, bar) -> None:
        self._clock_origin = None
        slots = [self.engine.slots_of(name) for name in self.source.symbol_names]
        # slot_table[code]: the slots a bar of symbol ``code`` fans out to (one per
        # parameter set: rectangular, so each batch is built with array indexing alone)
        slot_table = np.stack(slots) if slots else np.zeros((0, 1), np.int64)
        fan = slot_table.shape[1]
        # many bar times a call (``bar_times.step_bar_times``) unless bars are paced or
        # traded: the same rows, values and state as one step a bar time
        many = self.speed is None and not self.engine.strategies and self.batch_rows > 0
        for block in blocks:  # time-ordered; whole bar times
            # the rows skipped as already applied are read, and counted, as blocks come
            bar.update(self.source.skipped - self._skipped_shown)
            self._skipped_shown = self.source.skipped
            boundaries = np.flatnonzero(np.diff(block.times)) + 1
            starts, ends = np.r_[0, boundaries], np.r_[boundaries, len(block)]
            if many:
                starts, ends = _calls(starts, ends, block.codes, fan, self.batch_rows)
            for start, end in zip(starts, ends, strict=True):
                bar_time = int(block.times[start])
                if self.speed is not None:
                    self._pace(bar_time, self.speed)
                ohlc = {}
                if block.ohlc is not None:
                    ohlc = {
                        name: np.repeat(prices[start:end], fan)
                        for name, prices in zip(("opens", "highs", "lows"), block.ohlc,
                                                strict=True)
                    }  # fmt: skip
                update = (
                    slot_table[block.codes[start:end]].ravel(),
                    np.repeat(block.times[start:end], fan),
                    np.repeat(block.closes[start:end], fan),
                    np.repeat(block.rows[start:end], fan),
                )
                if many and block.times[start] != block.times[end - 1]:
                    result = step_bar_times(self.engine, *update)
                else:
                    result = self.engine.step_arrays(*update[:3], inputs=update[3], **ohlc)
                if result.rejected:
                    self._report(result.rejected, _step_where(self.source, block, start, end))
                if self.speed is not None and self._clock_origin is None:
                    # the clock starts once the first bar is applied, so the one-off kernel
                    # compilation does not make every later bar overdue
                    self._clock_origin = (bar_time, time.perf_counter())
                self.summary.step_bars += end - start
                self._emit(result)
                bar.update(end - start)

    def _report(self, rejected: list[Rejection], where: Callable[[Rejection], str | None]) -> None:
        """Count the engine's ``rejected`` inputs in ``summary.engine_rows`` and log the
        first of each reason, as the engine would, with ``where(rejection)`` (``file:line``;
        None where the source does not know it) asked only of those shown."""
        rows = self.summary.engine_rows
        for r in rejected:
            first = not rows.counts[r.reason]
            place = where(r) if first or len(rows.examples) < REPORT_FIRST else None
            if place is None:
                rows.counts[r.reason] += 1
            else:
                rows.add(place, r.reason, r.detail)
            if first:
                shown = r.detail if place is None else f"{place}: {r.detail}"
                log.warning("rejected input (%s): %s (further ones are only counted)",
                            r.reason, shown)  # fmt: skip

    def _pace(self, bar_time: int, speed: float) -> None:
        """Sleep so bar times advance at ``speed`` x real time (bar times in ms)."""
        if self._clock_origin is None:
            return
        origin_time, origin_wall = self._clock_origin
        due = origin_wall + (bar_time - origin_time) / 1000.0 / speed
        # in slices: a stop (``on_wait``) must not wait out a bar interval, and a very
        # slow speed can make a wait longer than one sleep may be
        while (delay := due - time.perf_counter()) > 0:
            if self.on_wait is not None:
                self.on_wait()
            time.sleep(min(delay, MAX_SLEEP_S))

    def _emit(self, result: StepResult) -> None:
        self.summary.rows_out += len(result)
        self.summary.count_events(result)
        if self.on_result is not None:
            self.on_result(result)


#: Most cells (stream x bar time) of one ``step_bar_times`` call's histories: 136 B of
#: outputs each, so a call of sparse symbols cannot allocate without bound.
MAX_CALL_CELLS = 1 << 20


def _calls(starts, ends, codes, fan: int, batch_rows: int):
    """(starts, ends) of the engine calls of one block: whole bar times (``starts`` /
    ``ends`` of each), together up to ``batch_rows`` rows (at least one bar time) while
    their streams x bar times stay within ``MAX_CALL_CELLS``."""
    rows_before = np.r_[0, np.cumsum(ends - starts)] * fan
    call_starts, call_ends = [], []
    first = 0
    while first < starts.shape[0]:
        # the most bar times whose rows fit, then fewer while the histories' cells do not
        last = int(np.searchsorted(rows_before, rows_before[first] + batch_rows, "right")) - 1
        last = max(last, first + 1)
        while last > first + 1:
            streams = np.unique(codes[starts[first] : ends[last - 1]]).shape[0] * fan
            if streams * (last - first) <= MAX_CALL_CELLS:
                break
            last = first + max(1, (last - first) // 2)
        call_starts.append(int(starts[first]))
        call_ends.append(int(ends[last - 1]))
        first = last
    return call_starts, call_ends


def _step_where(source, block, start: int, end: int) -> Callable[[Rejection], str | None]:
    """``where`` of the inputs of one step, rows ``start:end`` of ``block``: a rejection's
    index is its row (``Block.rows``)."""

    def where(rejection: Rejection) -> str | None:
        if block.lines is None:
            return None
        hit = np.flatnonzero(block.rows[start:end] == rejection.index)
        return source.where(rejection.index, int(block.lines[start + hit[0]])) if hit.size else None

    return where


def _rank_within_symbol(symbols: np.ndarray, times: np.ndarray) -> np.ndarray:
    """0, 1, 2, … for each symbol's rows in time order (stable: file order for equal times)."""
    n = symbols.shape[0]
    by_time = np.argsort(times, kind="stable")
    _, codes = np.unique(symbols.astype(str), return_inverse=True)
    grouped = by_time[np.argsort(codes[by_time], kind="stable")]  # by symbol, then time
    counts = np.bincount(codes)
    starts = np.cumsum(counts) - counts
    rank = np.empty(n, np.int64)
    rank[grouped] = np.arange(n) - np.repeat(starts, counts)
    return rank


def random_walk_table(
    n_symbols: int = 20, n_bars: int = 3000, seed: int = 7, interval_ms: int = 60_000
) -> BarTable:
    """A deterministic multi-symbol random walk on a 0.01 price grid (the demo data set).

    Rounding to a grid makes exact close == average ties happen, as with real prices.
    """
    if n_symbols < 1 or n_bars < 1:
        raise ValueError("n_symbols and n_bars must be >= 1")
    rng = np.random.default_rng(seed)
    start = 1_700_000_000_000 - 1_700_000_000_000 % interval_ms
    starts = rng.uniform(20, 500, n_symbols)
    steps = rng.normal(0, 0.004, (n_symbols, n_bars))
    steps[:, rng.random(n_bars) < 0.05] = 0.0  # flat stretches
    closes = np.maximum(np.round(starts[:, None] * np.exp(np.cumsum(steps, axis=1)), 2), 0.01)
    times = start + interval_ms * np.arange(n_bars, dtype=np.int64)
    names = np.array([f"SYM{i:03d}" for i in range(n_symbols)], dtype=object)
    # time-major order, as a live feed would deliver them
    return BarTable(
        symbols=np.tile(names, n_bars),
        times=np.repeat(times, n_symbols),
        closes=closes.T.ravel(),
    )
