"""The ``replay`` job: a bar file (streamed) or ticks, through the engine, into an output,
with snapshots and resume (``app.durability``).

``run_replay`` takes the command's options and returns the exit status; ``replay`` does
the work for an open ``Durability`` and returns the engine and the ``ReplaySummary``.
User errors are ``RunError`` (one line, exit 2) or ``OptionError`` (a bad option value;
the CLI reports it as a usage error naming the option). Progress notes and the summary
go to ``err``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from atc_stream.app.console import OptionError, RunError, err, log_warnings, param_sets_option
from atc_stream.app.defaults import INTERVAL
from atc_stream.app.durability import Durability, check_backend, play_durably
from atc_stream.app.paper import PaperOptions, check_paper_options, paper_lines
from atc_stream.app.shard_snapshots import check_shard_options, write_shard_snapshots
from atc_stream.connectors.replay.player import TableBars
from atc_stream.connectors.replay.stream import BarFileSource
from atc_stream.connectors.replay.ticks import EMPTY_POLICIES, aggregate_ticks
from atc_stream.core.intervals import interval_ms, validate_interval
from atc_stream.core.spacing import spacing_fits
from atc_stream.io.readers import PRICE_NAMES, InputError
from atc_stream.io.table_writers import PaperOutputs
from atc_stream.io.tick_reader import load_ticks
from atc_stream.io.writers import check_apart, check_outputs, output_format

#: Name of a replayed file's entry in ``Engine.source_offsets``.
FILE_SOURCE = "file"

#: The refusal of a replay given both or neither of a bar file and ``--ticks``.
ONE_INPUT = "give either a bar file BARS or --ticks FILE (exactly one)"


#: the tick file columns ``--price-column``/``--size-column`` name by default
TICK_COLUMNS = {"price": "price", "size": "size"}


def run_replay(
    *,
    bars: Path | None,
    ticks: Path | None,
    columns: dict[str, str],
    tick_columns: dict[str, str],
    empty: str,
    symbol: str | None,
    time_unit: str,
    strict: bool,
    params: Path | None,
    output: str,
    warmup: int,
    speed: float | None,
    progress: bool,
    backend: str,
    interval: str | None,
    redis: str | None,
    redis_prefix: str,
    snapshot_dir: Path | None,
    snapshot_every: int | None,
    resume: bool,
    events_before_ready: bool,
    strategies: Sequence[str] = (),
    trades: Path | None = None,
    positions: Path | None = None,
    shard_snapshots: int | None = None,
    snapshot_to: str | None = None,
    route_shards: int | None = None,
) -> int:
    """Replay ``bars`` or ``ticks`` into ``output`` with the snapshots asked for; the exit
    status. ``shard_snapshots`` (with ``snapshot_to``): then one snapshot per shard;
    ``route_shards``: the bars go to a cluster's shard streams instead of the engine."""
    if (bars is None) == (ticks is None):  # before any snapshot store is opened
        raise OptionError(ONE_INPUT)
    outputs = {"-o": output, "--trades": trades, "--positions": positions}
    check_apart({"BARS": bars, "--ticks": ticks}, outputs, snapshot_dir)
    check_shard_options(shard_snapshots, snapshot_to)
    if route_shards is not None:
        if shard_snapshots is not None:
            raise OptionError("--route-shards runs no engine: it cannot take --shard-snapshots")
        return _route(bars, redis, redis_prefix, route_shards, columns, symbol, time_unit,
                      strict)  # fmt: skip
    check_backend(backend)
    param_sets = param_sets_option(params)
    paper = check_paper_options(strategies, trades=trades, positions=positions)
    check_outputs(outputs)  # before the input is read: a large file takes minutes
    durability = Durability(
        redis=redis, redis_prefix=redis_prefix, snapshot_dir=snapshot_dir,
        snapshot_every=snapshot_every, resume=resume, events_before_ready=events_before_ready,
    )  # fmt: skip
    engine, summary = replay(
        bars=bars, ticks=ticks, columns=columns, tick_columns=tick_columns, empty=empty,
        symbol=symbol, time_unit=time_unit, strict=strict, params=param_sets, output=output,
        warmup=warmup, speed=speed, progress=progress, backend=backend, interval=interval,
        durability=durability, paper=paper,
    )  # fmt: skip
    played = bars if bars is not None else ticks
    if shard_snapshots is not None and snapshot_to is not None and played is not None:
        source = str(played.resolve())
        for line in write_shard_snapshots(engine, shard_snapshots, snapshot_to, source):
            err(f"atc-stream: {line}")
    return 130 if summary.stopped else 0


def replay(
    *,
    bars: Path | None,
    ticks: Path | None,
    columns: dict[str, str],
    symbol: str | None,
    time_unit: str,
    strict: bool,
    tick_columns: dict[str, str] | None = None,
    empty: str = "skip",
    params=None,
    output: str,
    warmup: int,
    speed: float | None,
    progress: bool,
    backend: str,
    interval: str | None,
    durability: Durability,
    paper: PaperOptions | None = None,
):
    """Replay ``bars`` (CSV/Parquet file or directory, streamed) or ``ticks`` (aggregated
    to ``interval`` bars) into ``output``; returns ``(engine, summary)``.

    ``columns``: ``{"symbol": ..., "time": ..., "close": ...}`` column names, and with
    ``paper`` ``"open"``, ``"high"``, ``"low"`` (default: those names): the bars then
    carry OHLC, from the file's columns or the ticks of each interval;
    ``tick_columns``: ``{"price": ..., "size": ...}`` for ticks. ``params``/``interval``
    None: the snapshot's on ``--resume``, else the defaults (interval: inferred).
    """
    log_warnings()  # e.g. sort files of a killed replay removed
    ohlc_columns = None
    if paper is not None:
        ohlc_columns = (columns.get("open", "open"), columns.get("high", "high"),
                        columns.get("low", "low"))  # fmt: skip
    columns = {name: columns[name] for name in ("symbol", "time", "close")}
    if bars is not None and ticks is None:
        if empty != "skip" or (tick_columns or TICK_COLUMNS) != TICK_COLUMNS:
            raise OptionError("applies to --ticks only, not to bar files", "--empty" if
                              empty != "skip" else "--price-column/--size-column")  # fmt: skip
        source, interval = bar_source(
            bars, columns=columns, symbol=symbol, time_unit=time_unit, interval=interval,
            strict=strict, resume=durability.resume, warmup=warmup, ohlc_columns=ohlc_columns,
            progress=progress,
        )  # fmt: skip
        source_input = str(bars.resolve())
        bad_rows = source.bad_rows
        if ohlc_columns is not None:  # recorded in snapshots: a resume must read the same
            columns.update(zip(PRICE_NAMES, ohlc_columns, strict=True))
    elif ticks is not None and bars is None:
        check_tick_options(interval, empty)
        tick_columns = tick_columns or TICK_COLUMNS
        tick_interval = interval or INTERVAL  # the engine's: the snapshot's on --resume
        source, bad_rows = tick_bars(
            ticks, interval=tick_interval, empty=empty, symbol=symbol, time_unit=time_unit,
            strict=strict, time_column=columns["time"],
            symbol_column=columns["symbol"], price_column=tick_columns["price"],
            size_column=tick_columns["size"], ohlc=paper is not None,
        )  # fmt: skip
        source_input = f"{ticks.resolve()} (ticks, {tick_interval}, empty={empty})"
        columns = {**columns, "close": tick_columns["price"], "size": tick_columns["size"]}
    else:
        raise OptionError(ONE_INPUT)
    engine, summary = replay_source(
        source, params=params, output=output, warmup=warmup, speed=speed, progress=progress,
        backend=backend, interval=interval, durability=durability,
        source={"name": FILE_SOURCE, "input": source_input, "columns": columns}, paper=paper,
        reader_rejections=bad_rows.counts,
    )  # fmt: skip
    if strict and summary.rejected:  # the reader's rejections stopped the run before it
        counts = ", ".join(f"{k}={v}" for k, v in sorted(summary.rejected.items()))
        first = summary.engine_rows.examples[:1]
        counts += "".join(f"; the first: {example}" for example in first)
        raise RunError(f"the engine rejected inputs of {bars or ticks} ({counts}); the output "
                       "is complete without them (--strict)")  # fmt: skip
    if summary.engine_rejected and not summary.applied and not summary.stopped:
        # every bar read was refused by the engine (a close <= 0, duplicates): the output
        # holds no row, as a file whose rows were all rejected when read
        counts = ", ".join(f"{k}={v}" for k, v in sorted(summary.engine_rows.counts.items()))
        raise RunError(f"{bars or ticks}: no bar applied: the engine rejected every one "
                       f"({counts}); the output holds no signal row")  # fmt: skip
    return engine, summary


def replay_source(
    bars,
    *,
    params,
    output: str,
    warmup: int,
    speed: float | None,
    progress: bool,
    backend: str,
    interval: str | None,
    durability: Durability | None = None,
    source: dict[str, Any] | None = None,
    paper: PaperOptions | None = None,
    reader_rejections: Mapping[str, int] | None = None,
):
    """Replay ``bars`` (a ``BarTable`` or ``BarFileSource``) into ``output`` (resuming from
    a snapshot with ``--resume``); returns ``(engine, summary)``. With ``paper``, the
    engine trades its strategies and their outputs go to its files. The summary counts
    ``reader_rejections`` (the rows the file reader left out, by reason) beside the
    engine's."""
    output_format(output)  # refuse an unknown extension before any work
    if durability is None:
        durability = Durability(redis=None, snapshot_dir=None, snapshot_every=None, resume=False)
    source = source or {"name": FILE_SOURCE, "input": None}
    try:
        engine = durability.open_engine(
            backend, params, interval, strategies=paper.strategies if paper else None
        )
    except ValueError as exc:  # e.g. strategies on a backend that cannot trade them
        raise RunError(str(exc)) from None
    with durability.open_output(engine, output, source["name"]) as signals:
        writer = signals
        if paper is not None:
            recorded = engine.source_offsets.get(source["name"]) if durability.restored else None
            writer = PaperOutputs(
                signals, trades=paper.trades, positions=paper.positions,
                resume_from=(recorded or {}).get("output"),
            )  # fmt: skip
        try:
            summary = play_durably(
                engine, bars, warmup=warmup, speed=speed, progress=progress, writer=writer,
                durability=durability, source=source,
            )  # fmt: skip
        except InputError as exc:  # the file changed after it was scanned: one line
            raise RunError(str(exc)) from None
        finally:
            if paper is not None:
                writer.close()
    summary.rejected.update(reader_rejections or {})
    summary.read_rejected = sum((reader_rejections or {}).values())
    done = "stopped early by a signal" if summary.stopped else "done"
    err(f"atc-stream: replay {done} ({engine.backend.name} backend)")
    for line in summary.lines() + (paper_lines(engine) if paper is not None else []):
        err("  " + line)
    return engine, summary


def bar_source(
    path: Path,
    *,
    columns: dict[str, str],
    symbol: str | None,
    time_unit: str,
    interval: str | None,
    strict: bool,
    resume: bool,
    warmup: int,
    ohlc_columns: tuple[str, str, str] | None = None,
    **stream_options,
):
    """The scanned ``BarFileSource`` of ``path`` (bad rows reported on stderr; with
    ``ohlc_columns``, bars with OHLC) and the interval to label its bars with.

    The interval is ``interval`` when given (refused when the bars' spacing says
    otherwise), else inferred from the spacing of the first rows (on ``--resume``: the
    snapshot's, None here).
    """
    check_interval_option(interval)
    try:
        source = BarFileSource(
            path, symbol_column=columns["symbol"], time_column=columns["time"],
            close_column=columns["close"], symbol=symbol, time_unit=time_unit,
            warmup_bars=warmup, ohlc_columns=ohlc_columns, **stream_options,
        )  # fmt: skip
    except InputError as exc:
        raise RunError(str(exc)) from None
    _report_bad_rows(source.bad_rows, path, strict)
    _refuse_all_rejected(source.rows, source.bad_rows, path, "rows")
    return source, bars_interval(interval, source.infer_interval(), resume, path)


def check_interval_option(interval: str | None) -> None:
    """``OptionError`` naming ``--interval`` for an interval that is not one."""
    if interval is not None:
        try:
            validate_interval(interval)
        except ValueError as exc:
            raise OptionError(str(exc), param_hint="--interval") from None


def _refuse_all_rejected(good: int, bad_rows, path: Path, what: str) -> None:
    """A file whose every row was rejected is a ``RunError`` (before any output is
    opened): a run that applies nothing and exits 0 would pass for a quiet day in a
    script, when the input is the wrong file, unit or column. A file without rows is
    not refused: there is nothing wrong to say about it."""
    if good == 0 and bad_rows.total:
        counts = ", ".join(f"{k}={v}" for k, v in sorted(bad_rows.counts.items()) if v)
        raise RunError(
            f"{path}: no usable {what}: all {bad_rows.total} were rejected ({counts}); "
            "nothing was written"
        )


def _report_bad_rows(bad_rows, path: Path, strict: bool) -> None:
    """Each rejected row on stderr; with ``strict`` any one stops the run."""
    for line in bad_rows.lines():
        err(f"atc-stream: {line}")
    if strict and bad_rows.total:
        raise RunError(f"{bad_rows.total} rejected rows in {path} (--strict)")


def check_tick_options(interval: str | None, empty: str) -> None:
    """``OptionError`` naming the option for an ``--interval`` or ``--empty`` that ticks
    cannot be aggregated with: said before the tick file is read."""
    if interval is not None:
        try:
            interval_ms(interval)  # a fixed length: not a calendar month
        except ValueError as exc:
            raise OptionError(str(exc), param_hint="--interval") from None
    if empty not in EMPTY_POLICIES:
        choices = " or ".join(repr(policy) for policy in EMPTY_POLICIES)
        raise OptionError(f"must be {choices}, got {empty!r}", param_hint="--empty")


def bars_interval(interval: str | None, inferred: str | None, resume: bool, path: Path):
    """The interval to label bars with: ``interval`` (refused when the bars' spacing
    ``inferred`` says otherwise), else ``inferred`` (on ``--resume``: the snapshot's,
    None here; with nothing inferred, the default, with a note)."""
    if interval is None:
        if resume:
            return None
        if inferred is None:
            err(
                "atc-stream: note: cannot infer the interval (no symbol has two bars that "
                f"were read, rejected rows left out); labelling bars {INTERVAL}: give --interval"
            )
        return inferred or INTERVAL
    if inferred is not None and not spacing_fits(interval, inferred):
        raise RunError(
            f"--interval {interval} does not match the bars, which are {inferred} apart "
            f"(most common spacing in {path.name}); give --interval {inferred}"
        )
    return interval


def tick_bars(
    path: Path,
    *,
    interval: str,
    empty: str,
    symbol: str | None,
    time_unit: str = "auto",
    strict: bool = False,
    ohlc: bool = False,
    **columns,
):
    """Ticks of ``path`` aggregated to a ``BarTable`` of ``interval`` bars (in memory;
    ``ohlc``: a ``TableBars`` whose bars carry each interval's open, high, low and
    close), and the rows left out (``BadRows``, reported here; ``strict``: any one stops
    the run)."""
    try:
        ticks = load_ticks(path, symbol=symbol, time_unit=time_unit, **columns)
    except InputError as exc:  # unreadable damage: one line, exit 2
        raise RunError(str(exc)) from None
    _report_bad_rows(ticks.bad_rows, path, strict)
    _refuse_all_rejected(len(ticks), ticks.bad_rows, path, "ticks")
    try:
        bars = aggregate_ticks(ticks, interval, empty=empty)
    except ValueError as exc:
        raise OptionError(str(exc)) from exc
    bad = ", ".join(f"{k}={v}" for k, v in sorted(ticks.rejected.items()) if v)
    err(
        f"atc-stream: {len(ticks)} ticks -> {len(bars)} {interval} bars of "
        f"{len(ticks.names)} symbols (empty intervals: {empty})"
        + (f"; dropped ticks: {bad}" if bad else "")
    )
    table = bars.to_bar_table()
    return (TableBars(table, ohlc=bars.time_major_ohlc()) if ohlc else table), ticks.bad_rows


def _route(
    bars: Path | None,
    redis: str | None,
    redis_prefix: str,
    shards: int,
    columns: dict[str, str],
    symbol: str | None,
    time_unit: str,
    strict: bool,
) -> int:
    """``replay --route-shards N``: every bar of the file to its shard's stream."""
    from atc_stream.app.jobs.cluster import route_bars

    if bars is None or redis is None:
        raise RunError("--route-shards needs a bar file BARS and --redis URL")
    columns = {name: columns[name] for name in ("symbol", "time", "close")}
    source, _ = bar_source(
        bars, columns=columns, symbol=symbol, time_unit=time_unit, interval=None,
        strict=strict, resume=False, warmup=0,
    )  # fmt: skip
    return route_bars(source, redis=redis, redis_prefix=redis_prefix, shards=shards)
