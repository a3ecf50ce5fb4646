"""The ``sweep`` job: every (symbol, parameter set, strategy) of a grid backtested, ranked.

What the periods of ``--train-until`` mean, and how OUTDIR is written: docs/design/sweep.md.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from atc_stream.app.console import OptionError, RunError, err
from atc_stream.app.durability import check_backend, load_cpu_kernels
from atc_stream.app.extras import require
from atc_stream.app.grid import Grid, GridError, load_grid
from atc_stream.app.jobs.replay import bars_interval
from atc_stream.app.jobs.sweep_output import SweepOutput, TradesFile
from atc_stream.app.jobs.sweep_ray import sweep_on_ray
from atc_stream.app.ranking import (
    KEYS,
    RANK_METRICS,
    SET_KEYS,
    aggregate,
    format_table,
    rank,
    side_by_side,
)
from atc_stream.app.sweep_blocks import (
    CHUNK_STREAMS,
    plan_blocks,
    shift_ids,
    streams_per_call,
    sweep_block,
)
from atc_stream.core.params import ATCParams
from atc_stream.core.progress import progress_bar
from atc_stream.core.schema import ready_bar
from atc_stream.core.spacing import interval_of
from atc_stream.core.timetext import text_to_ms
from atc_stream.io.ohlc import OhlcTable, read_ohlc
from atc_stream.io.readers import InputError

#: Columns of the printed table, after the ids and the grid's varied keys.
SHOWN = ("total_return", "max_drawdown", "win_rate", "trades", "exposure")

#: seconds before the bar of the file being read shows: a small file, or one that fails
#: to open, shows none (its error stays one line)
READ_BAR_DELAY_S = 1.0


def run_sweep(
    *,
    data: Path,
    grid: Path,
    outdir: Path | str,
    train_until: str | None,
    top: int,
    rank_by: str,
    backend: str,
    progress: bool,
    time_unit: str = "auto",
    chunk_streams: int = CHUNK_STREAMS,
    ray: bool = False,
    ray_address: str | None = None,
    interval: str | None = None,
) -> int:
    """Backtest the grid over the bars of ``data``, write OUTDIR's tables, print the top
    sets on stdout; the exit status. ``ray``: the blocks run as tasks of a Ray cluster
    (``ray_address``, or a local one), trades written as a Parquet dataset. ``interval``
    labels the rows (None: inferred from the bars' spacing, as ``replay`` does). A
    backtest call takes at most ``chunk_streams`` streams, fewer with long histories
    (``sweep_blocks.streams_per_call``)."""
    if ray_address is not None and not ray:
        raise OptionError("--ray-address needs --ray", "--ray-address")
    if ray:
        require("ray", "atc-stream sweep --ray")
    else:  # with --ray the cluster's GPUs count, not this machine's
        check_backend(backend)
    if rank_by not in RANK_METRICS:
        raise OptionError(f"{rank_by!r} is not one of {', '.join(RANK_METRICS)}", "--rank-by")
    if not str(outdir).strip():
        raise RunError("-o is an empty path: give the directory of the tables")
    outdir = Path(outdir)
    _check_grid_file(grid)
    output = SweepOutput(outdir)
    output.check_apart({"DATA": data, "--grid": grid})  # before anything is read or written
    output.check_ours()
    split = _split_time(train_until, time_unit)
    try:
        sets = load_grid(grid)
    except GridError as exc:
        raise OptionError(str(exc), "--grid") from None
    try:
        with _progress(None, progress, f"reading {data.name}", "bar") as reading:
            bars = read_ohlc(data, time_unit=time_unit, on_rows=reading.update)
    except InputError as exc:
        raise RunError(str(exc)) from None
    for line in bars.bad_rows.lines():
        err(f"atc-stream: {line}")
    if not len(bars):
        raise RunError(f"{data}: no usable bars")
    label = bars_interval(interval, interval_of(bars.codes, bars.times), False, data)
    if split is not None and not (bars.times.min() < split <= bars.times.max()):
        first, last = (int(t) for t in (bars.times.min(), bars.times.max()))
        raise OptionError(
            f"{train_until!r} leaves no bars on one side (bars span {_utc(first)} to "
            f"{_utc(last)}; epoch ms {first}..{last}): give a time after the first bar, "
            "up to the last", "--train-until",
        )  # fmt: skip
    output.begin(staged_trades=ray)
    if not ray and backend != "cuda":
        load_cpu_kernels(strategies=True, progress=progress)  # not in the sweep's time
    started = time.perf_counter()
    chunk = streams_per_call(bars, chunk_streams)
    trades: TradesFile | None = None
    if ray:
        n_trades, metrics = _sweep_on_ray(
            bars, sets, split, backend, label, progress, chunk, ray_address,
            output.staged_trades,
        )  # fmt: skip
    else:
        trades = output.trades_file()
        try:
            metrics = _sweep(bars, sets, split, backend, label, progress, chunk, trades)
        except MemoryError:
            trades.discard()
            raise RunError(
                f"out of memory sweeping {sets.sets} sets over {len(bars)} bars; give fewer "
                "sets, or fewer symbols or bars per run"
            ) from None
        except BaseException:
            trades.discard()
            raise
        n_trades = trades.rows
    elapsed = time.perf_counter() - started
    periods = ("train", "test") if split is not None else ("all",)
    metrics = _ordered(metrics, periods)
    per_period = {
        p: aggregate(metrics.filter(pa.compute.equal(metrics.column("period"), p))) for p in periods
    }
    ranking = side_by_side(per_period) if split is not None else per_period["all"]
    order = rank(ranking, rank_by, periods[0] if split is not None else None)
    ranking = ranking.take(order)
    ranking = ranking.append_column("rank", pa.array(np.arange(1, len(order) + 1), pa.int32()))
    ranking = _with_varied(ranking, sets)
    output.finish(
        {"metrics": metrics, "trades": trades, "params": sets.params_table(),
         "strategies": sets.strategies_table(), "ranking": ranking}
    )  # fmt: skip
    _print_top(ranking, sets, periods, rank_by, top)
    streams = len(bars.symbol_names) * sets.sets
    err(
        f"atc-stream: swept {len(bars.symbol_names)} symbols x {len(sets.params)} parameter "
        f"sets x {len(sets.strategies)} strategies = {streams} streams of {label} bars, "
        f"{len(bars)} bars, {n_trades} trades in {elapsed:.2f} s; wrote {outdir}/"
    )
    _note_unready(sets.params, int(np.diff(bars.starts).max()))
    return 0


def _note_unready(params: list[ATCParams], longest: int) -> None:
    """A note when some parameter sets never became ready on any symbol: orders come only
    from events on ready bars (docs/spec.md, "Backtest"), so they made no trade, and the
    ranking puts them after the sets that traded."""
    needs = [ready_bar(p) + 1 for p in params]
    unready = [n for n in needs if n > longest]
    if unready:
        last = "" if len(unready) == len(params) else "; they rank after every set that traded"
        err(
            f"atc-stream: note: {len(unready)} of {len(params)} parameter sets never became "
            f"ready: they need {min(unready)}+ bars a symbol and the longest history has "
            f"{longest}, so they made no trades{last}"
        )


def _check_grid_file(grid: Path) -> None:
    """``OptionError`` for a ``--grid`` that is not a readable file, said before the paths
    are compared (a directory given by mistake is the problem, not where -o lies)."""
    if grid.is_dir():
        raise OptionError(f"{grid} is a directory, not a TOML grid file", "--grid")
    try:
        with open(grid, "rb"):
            pass
    except OSError as exc:
        raise OptionError(f"cannot read {grid}: {exc.strerror or exc}", "--grid") from None


def _ordered(metrics: pa.Table, periods: tuple[str, ...]) -> pa.Table:
    """Period by period, streams by their keys: the same rows in the same order however
    the streams were chunked, in one chunk (Arrow's sums follow the chunks, and the
    ranking must not depend on them)."""
    parts = [
        metrics.filter(pa.compute.equal(metrics.column("period"), p)).sort_by(
            [(k, "ascending") for k in KEYS]
        )
        for p in periods
    ]
    return pa.concat_tables(parts).combine_chunks()


def _split_time(text: str | None, time_unit: str) -> int | None:
    if text is None:
        return None
    ms = text_to_ms(text, time_unit)
    if ms is None:
        raise OptionError(
            f"{text!r} is not a time (ISO-8601 like 2024-06-01 or 2024-06-01T00:00:00Z, or "
            "an integer epoch)", "--train-until",
        )  # fmt: skip
    return ms


def _sweep(
    bars: OhlcTable, sets: Grid, split: int | None, backend: str, interval: str,
    progress: bool, chunk: int, trades: TradesFile,
) -> pa.Table:  # fmt: skip
    """Metrics (``period`` column) of every stream, the blocks of ``plan_blocks`` run one
    after another; their trades go to ``trades`` as each block ends."""
    groups, blocks = plan_blocks(bars, sets, chunk)
    metrics: list[pa.Table] = []
    table, table_group = None, -1
    with _progress(len(bars.symbol_names) * sets.sets, progress) as bar:
        for block in blocks:
            if block.group != table_group:
                table = bars.of_symbols(groups[block.group]).to_arrow()
                table_group = block.group
            first_ids = (block.params.start, block.strategies.start)
            block_trades, block_metrics = sweep_block(
                table, sets.params[block.params], sets.strategies[block.strategies], split,
                backend, interval,
            )  # fmt: skip
            trades.write(shift_ids(block_trades, first_ids))
            metrics += [shift_ids(m, first_ids) for m in block_metrics]
            bar.update(block.streams)
    return pa.concat_tables(metrics)


def _with_varied(ranking: pa.Table, sets: Grid) -> pa.Table:
    """The values of the grid's varied keys beside each set's ids."""
    params_id = ranking.column("params_id").to_numpy()
    strategy_id = ranking.column("strategy_id").to_numpy()
    for key in sets.varied_params:
        ranking = ranking.append_column(key, [[getattr(sets.params[i], key) for i in params_id]])
    for key in sets.varied_strategies:
        values = [getattr(sets.strategies[i], key) for i in strategy_id]
        ranking = ranking.append_column(key, [values])
    return ranking


def _sweep_on_ray(
    bars: OhlcTable, sets: Grid, split: int | None, backend: str, interval: str,
    progress: bool, chunk: int, address: str | None, trades_dir: Path,
) -> tuple[int, pa.Table]:  # fmt: skip
    """``sweep_on_ray`` under a progress bar, trades into the empty ``trades_dir``."""
    with _progress(len(bars.symbol_names) * sets.sets, progress) as bar:
        return sweep_on_ray(
            bars, sets, split, backend, interval, chunk, address, trades_dir, bar.update
        )


def _print_top(ranking: pa.Table, sets: Grid, periods, rank_by: str, top: int) -> None:
    shown = [rank_by, *(m for m in SHOWN if m != rank_by)]
    columns = ["rank", *SET_KEYS, *sets.varied_params, *sets.varied_strategies]
    if periods == ("all",):
        columns += shown
    else:
        columns += [f"{p}.{m}" for m in shown for p in periods]
    print(format_table(ranking.slice(0, top), columns))


def _progress(total: int | None, enabled: bool, desc: str = "sweep", unit: str = "stream"):
    delay = READ_BAR_DELAY_S if total is None else 0.0
    return progress_bar(
        enabled, total=total, desc=desc, unit=unit, unit_scale=total is None, leave=False,
        delay=delay,
    )  # fmt: skip


def _utc(ms: int) -> str:
    """ISO-8601 UTC text of an epoch-ms bar time, as a date is given to ``--train-until``."""
    return f"{np.datetime64(ms, 'ms')}Z"
