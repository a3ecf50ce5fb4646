"""``sweep --ray``: the blocks of a sweep run as Ray tasks, trades written as a Parquet
dataset as blocks finish, metrics gathered in block order so that the result is the
one-process sweep's, row for row (docs/design/resharding-and-sweeps.md)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from atc_stream.app.console import RunError
from atc_stream.app.grid import Grid
from atc_stream.app.jobs.sweep_output import write_synced
from atc_stream.app.ranking import KEYS
from atc_stream.app.ray_connect import connect
from atc_stream.app.sweep_blocks import Block, plan_blocks, shift_ids, sweep_block
from atc_stream.core.errors import first_line
from atc_stream.io.ohlc import OhlcTable
from atc_stream.kernels.threads import numba_config, set_default_threads


def run_block(
    table: pa.Table, params: list, strategies: list, split: int | None, backend: str,
    interval: str, first_ids: tuple[int, int],
) -> tuple[pa.Table, list[pa.Table]]:  # fmt: skip
    """The Ray task: ``sweep_block`` on the CPUs Ray gave it, ids made the grid's."""
    import numba
    import ray

    cpus = int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1) or 1)
    cpus = max(1, min(cpus, numba_config().NUMBA_NUM_THREADS))
    set_default_threads(cpus)  # the ATC kernels
    numba.set_num_threads(cpus)  # the backtest kernel's prange
    trades, metrics = sweep_block(table, params, strategies, split, backend, interval)
    return shift_ids(trades, first_ids), [shift_ids(m, first_ids) for m in metrics]


def sweep_on_ray(
    bars: OhlcTable, sets: Grid, split: int | None, backend: str, interval: str, chunk: int,
    address: str | None, trades_dir: Path, progress: Callable[[int], Any],
) -> tuple[int, pa.Table]:  # fmt: skip
    """Run every block on Ray; each block's trades go to ``trades_dir`` (a directory the
    caller renames into place once every output is written) as ``part-NNNNN.parquet``
    (block order, so the dataset reads in the one-process order), each synced to disk.
    The number of trades and the metrics (the one-process sweep's table)."""
    started = connect(
        address, "atc-stream sweep --ray", logging_level=logging.ERROR, log_to_driver=False
    )
    import ray

    try:
        gpus = float(ray.cluster_resources().get("GPU", 0))
        if backend == "cuda" and not gpus:
            raise RunError("--backend cuda: the Ray cluster has no GPUs")
        task_backend, num_gpus = ("cuda", 1) if gpus and backend in ("auto", "cuda") else ("cpu", 0)
        groups, blocks = plan_blocks(bars, sets, chunk)
        remote = ray.remote(run_block).options(num_cpus=1, num_gpus=num_gpus)
        tables = [ray.put(bars.of_symbols(g).to_arrow()) for g in groups]
        pending = {
            remote.remote(
                tables[b.group], sets.params[b.params], sets.strategies[b.strategies], split,
                task_backend, interval, (b.params.start, b.strategies.start),
            ): b
            for b in blocks
        }  # fmt: skip
        metrics: dict[int, list[pa.Table]] = {}
        n_trades = 0
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            block = pending.pop(done[0])
            trades, metrics[block.index] = ray.get(done[0])
            write_synced(trades, trades_dir / f"part-{block.index:05d}.parquet")
            n_trades += trades.num_rows
            progress(block.streams)
    except ray.exceptions.RayError as exc:
        raise RunError(f"a sweep task failed on Ray: {first_line(exc)}") from None
    finally:
        if started:
            ray.shutdown()
    return n_trades, _gathered(blocks, metrics)


def _gathered(blocks: list[Block], metrics: dict[int, list[pa.Table]]) -> pa.Table:
    """The metrics in the one-process order: chunk by chunk, period by period; the
    blocks of one chunk in stream order (symbol, parameter set, strategy)."""
    out: list[pa.Table] = []
    by_group: dict[int, list[Block]] = {}
    for b in blocks:
        by_group.setdefault(b.group, []).append(b)
    for group in sorted(by_group):
        parts = [metrics[b.index] for b in by_group[group]]
        for period in range(len(parts[0])):
            tables = pa.concat_tables([p[period] for p in parts])
            if len(parts) > 1:  # Arrow's sort is stable
                tables = tables.sort_by([(k, "ascending") for k in KEYS])
            out.append(tables)
    return pa.concat_tables(out)
