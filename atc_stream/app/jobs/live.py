"""The ``live`` job: exchange klines (``connectors.exchanges``) through the engine
into an output, with snapshots and lossless resume.

Lossless resume (as for ``replay``, see ``app.durability``): every snapshot records, under the
source ``"live"``, the output's durable position taken when the state is copied (after
the results of the bars in that state were written). ``--resume`` restores the newest
good snapshot, cuts the same output file back to that position and appends; the client
then backfills every stream from its last applied bar, so the file ends with every
closed (symbol, params_id, time) row exactly once. Provisional rows (previews) written
after the snapshot are cut with the rest. A different ``-o`` on resume starts that file
fresh with the rows from the snapshot on.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atc_stream.app.console import (
    OptionError,
    RunError,
    err,
    log_warnings,
    status,
    stderr_is_terminal,
)
from atc_stream.app.durability import Durability, check_backend
from atc_stream.app.extras import require
from atc_stream.app.paper import DEFAULT_COLUMNS, check_paper_options, paper_lines
from atc_stream.core.intervals import validate_interval
from atc_stream.core.params import load_param_sets
from atc_stream.io.table_writers import PaperOutputs
from atc_stream.io.writers import output_format

if TYPE_CHECKING:
    from atc_stream.connectors.redis.loop import LoopPublisher

#: Name of the live feed's entry in ``Engine.source_offsets``.
LIVE_SOURCE = "live"


def run_live(
    *,
    symbols: str,
    interval: str,
    history: int,
    ws_url: str | None,
    rest_url: str | None,
    output: str,
    previews: bool,
    max_seconds: float | None,
    max_bars: int | None,
    max_streams_per_connection: int,
    idle_timeout: float,
    rest_weight_budget: int | None,
    ws_compression: bool,
    status_every: float,
    params: Path | None,
    backend: str,
    redis: str | None,
    redis_prefix: str,
    snapshot_dir: Path | None,
    snapshot_every: int | None,
    resume: bool,
    events_before_ready: bool,
    strategies: Sequence[str] = (),
    trades: Path | None = None,
    positions: Path | None = None,
    started_ms: int | None = None,
) -> int:
    """Run the live feed until ``max_seconds``/``max_bars``/SIGINT; the exit status
    (1 when the feed failed: REST unusable or banned, no symbol known). Every bar closing
    after ``started_ms`` (default: when the feed starts) is stepped and written."""
    require("live", "atc-stream live")
    # after the check: the feed imports aiohttp, an optional extra
    from atc_stream.connectors.exchanges.config import LiveConfig
    from atc_stream.connectors.exchanges.feed import KlineClient

    log_warnings()
    check_backend(backend)
    previews = previews and not str(output).endswith(".parquet")  # Parquet: no provisional flag
    try:
        config = LiveConfig(
            history=history, max_streams_per_connection=max_streams_per_connection,
            previews=previews, idle_timeout=idle_timeout,
            rest_weight_budget=rest_weight_budget, ws_compression=ws_compression,
            ws_url=ws_url if ws_url is not None else LiveConfig.ws_url,
            rest_url=rest_url if rest_url is not None else LiveConfig.rest_url,
        )  # fmt: skip
        if max_seconds is not None and not max_seconds > 0:
            raise ValueError(f"--max-seconds must be > 0, got {max_seconds}")
        validate_interval(interval)
        param_sets = load_param_sets(params) if params is not None else None
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    output_format(output)
    paper = check_paper_options(
        strategies, trades=trades, positions=positions, ticks=None, warmup=0,
        columns=DEFAULT_COLUMNS,
    )  # fmt: skip
    durability = Durability(
        redis=redis, redis_prefix=redis_prefix, snapshot_dir=snapshot_dir,
        snapshot_every=snapshot_every, resume=resume, events_before_ready=events_before_ready,
        publish=False,  # the client publishes from its event loop (LoopPublisher)
    )  # fmt: skip
    try:  # before connecting
        engine = durability.open_engine(
            backend, param_sets, interval, strategies=paper.strategies if paper else None
        )
    except ValueError as exc:  # e.g. strategies on a backend that cannot trade them
        raise RunError(str(exc)) from None
    publisher: LoopPublisher | None = None
    if redis is not None:
        from atc_stream.connectors.redis.loop import LoopPublisher

        publisher = LoopPublisher(
            redis, prefix=redis_prefix, events_before_ready=events_before_ready
        )
        durability.publisher = publisher  # its counters go in the closing summary
    if durability.restored and engine.source_offsets.get(LIVE_SOURCE) is None:
        # e.g. warmed up by `replay`, now going live: allowed
        err(f"atc-stream: note: the snapshot holds no live output position (taken by "
            f"another command); {output} gets the rows from the snapshot on")  # fmt: skip
    with durability.open_output(engine, output, LIVE_SOURCE) as signals:
        sink = signals
        if paper is not None:
            recorded = engine.source_offsets.get(LIVE_SOURCE) if durability.restored else None
            sink = PaperOutputs(
                signals, trades=paper.trades, positions=paper.positions,
                resume_from=(recorded or {}).get("output"),
            )  # fmt: skip
        durability.start(engine)

        def offsets() -> dict[str, Any]:
            # taken when a snapshot copies the state: every row of the bars in that state
            # has been written, so the output cut back to here matches the state
            return {LIVE_SOURCE: {"input": f"{config.ws_url} {engine.interval}",
                                  "output": sink.position()}}  # fmt: skip

        try:
            client = KlineClient(
                engine, symbols, config, on_result=sink.write,
                on_preview=sink.write if previews else None,
                snapshotter=durability.snapshotter, source_offsets=offsets,
                publisher=publisher, live_from_ms=started_ms,
            )  # fmt: skip
        except ValueError as exc:
            raise OptionError(str(exc), param_hint="--symbols") from None
        durability.on_stop(client.stop)
        durability.final_offsets = offsets
        err(
            f"atc-stream: live {len(client.symbols)} symbols x {engine.interval} from "
            f"{config.ws_url} ({engine.backend.name} backend)"
        )
        try:
            failed, stats = _run_client(client, durability, max_seconds, max_bars, status_every)
        finally:
            if paper is not None:
                sink.close()
    if stderr_is_terminal() and status_every > 0:
        err("")
    err("atc-stream: live done" + (f" (failed: {failed})" if failed else ""))
    for line in stats.lines() + (paper_lines(engine) if paper is not None else []):
        err("  " + line)
    return 1 if failed is not None else 0


def _run_client(client, durability, max_seconds, max_bars, status_every):
    """(the error that ended the feed or None, the client's ``LiveStats``)."""
    import asyncio

    from atc_stream.connectors.exchanges.rest import RestError

    def show_status(stats) -> None:
        status(stats.status_line())

    with durability:
        try:
            stats = asyncio.run(
                client.run(
                    max_seconds=max_seconds, max_bars=max_bars,
                    on_status=show_status if status_every > 0 else None,
                    status_every=status_every or 1.0,
                )
            )  # fmt: skip
        except (RestError, ValueError) as exc:
            return exc, client.stats
    return None, stats
