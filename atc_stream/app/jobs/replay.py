"""The ``replay`` command's work: a bar file (streamed) or ticks, through the engine, into
an output, with snapshots and resume (``runner``).

``replay`` takes the parsed options and returns the engine and the ``ReplaySummary``;
``cli.replay`` only parses options and calls it. User errors are ``runner.RunError``
(one line, exit 2) or ``OptionError`` (a bad option value; the CLI reports it as
a usage error naming the option). Progress notes and the summary go to ``err``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from atc_stream.app.console import OptionError, RunError
from atc_stream.app.console import err as to_stderr
from atc_stream.app.durability import Durability


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
    err: Callable[[str], None] = to_stderr,
):
    """Replay ``bars`` (CSV/Parquet file or directory, streamed) or ``ticks`` (aggregated
    to ``interval`` bars) into ``output``; returns ``(engine, summary)``.

    ``columns``: ``{"symbol": ..., "time": ..., "close": ...}`` column names;
    ``tick_columns``: ``{"price": ..., "size": ...}`` for ticks. ``params``/``interval``
    None: the snapshot's on ``--resume``, else the defaults (interval: inferred).
    """
    # the modules' warnings (e.g. sort files of a killed replay removed) on stderr, as live
    logging.basicConfig(level=logging.WARNING, format="atc-stream: %(levelname)s %(message)s")
    if (bars is None) == (ticks is None):
        raise OptionError("give either a bar file BARS or --ticks FILE (exactly one)")
    if ticks is not None:
        tick_columns = tick_columns or {"price": "price", "size": "size"}
        tick_interval = interval or "1m"  # the engine's: the snapshot's on --resume
        source = tick_bars(
            ticks, interval=tick_interval, empty=empty, symbol=symbol, time_unit=time_unit,
            strict=strict, time_column=columns["time"],
            symbol_column=columns["symbol"], price_column=tick_columns["price"],
            size_column=tick_columns["size"], err=err,
        )  # fmt: skip
        source_input = f"{ticks.resolve()} (ticks, {tick_interval}, empty={empty})"
        columns = {**columns, "close": tick_columns["price"], "size": tick_columns["size"]}
    else:
        source, interval = bar_source(
            bars, columns=columns, symbol=symbol, time_unit=time_unit, interval=interval,
            strict=strict, resume=durability.resume, warmup=warmup, err=err,
        )  # fmt: skip
        source_input = str(bars.resolve())
    return replay_source(
        source, params=params, output=output, warmup=warmup, speed=speed, progress=progress,
        backend=backend, interval=interval, durability=durability,
        source={"name": "file", "input": source_input, "columns": columns}, err=err,
    )  # fmt: skip


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
    err: Callable[[str], None] = to_stderr,
):
    """Replay ``bars`` (a ``BarTable`` or ``BarFileSource``) into ``output`` (resuming from
    a snapshot with ``--resume``); returns ``(engine, summary)``."""
    from atc_stream.app.durability import play_durably
    from atc_stream.io.writers import output_format

    output_format(output)  # refuse an unknown extension before any work
    if durability is None:
        durability = Durability(redis=None, snapshot_dir=None, snapshot_every=None, resume=False)
    source = source or {"name": "file", "input": None}
    engine = durability.open_engine(backend, params, interval)
    with durability.open_output(engine, output, source["name"]) as writer:
        summary = play_durably(
            engine, bars, warmup=warmup, speed=speed, progress=progress, writer=writer,
            durability=durability, source=source,
        )  # fmt: skip
    err(f"atc-stream: replay done ({engine.backend.name} backend)")
    for line in summary.lines():
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
    err: Callable[[str], None] = to_stderr,
    **stream_options,
):
    """The scanned ``BarFileSource`` of ``path`` (bad rows reported through ``err``) and
    the interval to label its bars with.

    The interval is ``interval`` when given (refused when the bars' spacing says
    otherwise), else inferred from the spacing of the first rows (on ``--resume``: the
    snapshot's, None here).
    """
    from atc_stream.connectors.replay.stream import BarFileSource
    from atc_stream.core.intervals import interval_ms, is_calendar, validate_interval
    from atc_stream.io.readers import InputError

    if interval is not None:
        try:
            validate_interval(interval)
        except ValueError as exc:
            raise OptionError(str(exc), param_hint="--interval") from None
    try:
        source = BarFileSource(
            path, symbol_column=columns["symbol"], time_column=columns["time"],
            close_column=columns["close"], symbol=symbol, time_unit=time_unit,
            warmup_bars=warmup, **stream_options,
        )  # fmt: skip
    except InputError as exc:
        raise RunError(str(exc)) from None
    for line in source.bad_rows.lines():
        err(f"atc-stream: {line}")
    if strict and source.bad_rows.total:
        raise RunError(f"{source.bad_rows.total} rejected rows in {path} (--strict)")
    inferred = source.infer_interval()
    if interval is None:
        if resume:
            return source, None
        if inferred is None:
            err("atc-stream: note: cannot infer the interval (no symbol has two bars); 1m")
        return source, inferred or "1m"
    if inferred is not None and not is_calendar(interval):
        if interval_ms(interval) != interval_ms(inferred):
            raise RunError(
                f"--interval {interval} does not match the bars, which are {inferred} apart "
                f"(most common spacing in {path.name}); give --interval {inferred}"
            )
    return source, interval


def tick_bars(
    path: Path,
    *,
    interval: str,
    empty: str,
    symbol: str | None,
    time_unit: str = "auto",
    strict: bool = False,
    err: Callable[[str], None] = to_stderr,
    **columns,
):
    """Ticks of ``path`` aggregated to a ``BarTable`` of ``interval`` bars (in memory);
    rejected rows are reported (``strict``: any one stops the run)."""
    from atc_stream.connectors.replay.ticks import aggregate_ticks
    from atc_stream.io.readers import InputError
    from atc_stream.io.tick_reader import load_ticks

    try:
        ticks = load_ticks(path, symbol=symbol, time_unit=time_unit, **columns)
    except InputError as exc:  # unreadable damage: one line, exit 2
        raise RunError(str(exc)) from None
    for line in ticks.bad_rows.lines():
        err(f"atc-stream: {line}")
    if strict and ticks.bad_rows.total:
        raise RunError(f"{ticks.bad_rows.total} rejected rows in {path} (--strict)")
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
    return bars.to_bar_table()
