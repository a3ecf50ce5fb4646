"""The ``live`` job: exchange klines (``connectors.exchanges``) through the engine
into an output, with snapshots and lossless resume.

Lossless resume (as for ``replay``, see ``app.durability``): every snapshot records, under the
source ``"live"``, the output's durable position taken when the state is copied (after
the results of the bars in that state were written). ``--resume`` restores the newest
good snapshot, cuts the same output file back to that position and appends; the client
then backfills every stream from its last applied bar, so the file ends with every
closed (symbol, params_id, time) row exactly once. Provisional rows (previews) written
after the snapshot are cut with the rest. A different ``-o`` on resume starts that file
fresh with the rows from the snapshot on. ``--metrics-port``: ``app.ops_server``.
"""

from __future__ import annotations

import signal
import time
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
from atc_stream.app.durability import (
    Durability,
    check_backend,
    refuse_earlier_output,
    sigterm_stops_start_up,
)
from atc_stream.app.extras import require
from atc_stream.app.paper import check_paper_options, paper_lines
from atc_stream.core.intervals import approx_interval_ms
from atc_stream.core.params import load_param_sets
from atc_stream.io.table_writers import PaperOutputs
from atc_stream.io.writers import ReaderGone, check_apart, check_outputs

if TYPE_CHECKING:
    from atc_stream.connectors.exchanges.config import LiveStats
    from atc_stream.connectors.redis.loop import LoopPublisher

#: Name of the live feed's entry in ``Engine.source_offsets``.
LIVE_SOURCE = "live"


@sigterm_stops_start_up
def run_live(
    *,
    symbols: str,
    interval: str,
    exchange: str = "binance",
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
    warm_before_ms: float = 3.0,
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
    metrics_port: int = 0,
    metrics_host: str = "127.0.0.1",
    started_ms: int | None = None,
    route_shards: int | None = None,
) -> int:
    """Run the live feed until ``max_seconds``/``max_bars``/SIGINT/SIGTERM; the exit status
    (1 when the feed failed: REST unusable or banned, no symbol known; 130 after a
    Ctrl-C, 0 after a SIGTERM, both clean stops). Every bar closing
    after ``started_ms`` (default: now; on ``--resume``, see ``_live_from``) is stepped
    and written.
    ``metrics_port`` (0: off) serves the operations endpoints on ``metrics_host``.
    ``route_shards``: every applied closed bar also goes to a cluster's shard streams."""
    if exchange.startswith("ccxt:"):  # its extra brings the live one: name the whole of it
        require("ccxt", f"--exchange {exchange}")
    require("live", "atc-stream live")
    if metrics_port:
        require("metrics", "--metrics-port")
    # after the checks: the feed imports aiohttp (and ccxt), optional extras
    from atc_stream.connectors.exchanges import registry
    from atc_stream.connectors.exchanges.config import LiveConfig
    from atc_stream.connectors.exchanges.feed import KlineClient

    log_warnings()
    check_backend(backend)
    # Parquet has no provisional flag; "out.parquet/" is that directory too
    previews = previews and Path(str(output)).suffix.lower() != ".parquet"
    try:
        config = LiveConfig(
            history=history, max_streams_per_connection=max_streams_per_connection,
            previews=previews, idle_timeout=idle_timeout,
            rest_weight_budget=rest_weight_budget, ws_compression=ws_compression,
            warm_before_ms=warm_before_ms, ws_url=ws_url, rest_url=rest_url,
        )  # fmt: skip
        param_sets = load_param_sets(params) if params is not None else None
    except ValueError as exc:
        raise OptionError(_as_flags(str(exc))) from None
    try:  # an unknown exchange, or an interval or URL it cannot serve: one line
        venue = registry.make_exchange(exchange)
        venue.interval_name(interval)
        venue.check_config(config)
    except ValueError as exc:
        raise RunError(f"--exchange {exchange}: {exc}") from None
    try:
        names = list(
            dict.fromkeys(venue.normalise_symbol(s) for s in symbols.split(",") if s.strip())
        )
    except ValueError as exc:
        raise OptionError(str(exc), param_hint="--symbols") from None
    outputs = {"-o": output, "--trades": trades, "--positions": positions}
    check_apart({}, outputs, snapshot_dir)
    if route_shards is not None and redis is None:
        raise OptionError("--route-shards needs --redis URL (the cluster's Redis)")
    paper = check_paper_options(strategies, trades=trades, positions=positions)
    check_outputs(outputs)
    if metrics_port:  # before an output is opened (and a fresh one emptied)
        _check_listen(metrics_host, metrics_port)
    # the local checks (snapshot options, Redis at the start) before the exchange's
    durability = Durability(
        redis=redis, redis_prefix=redis_prefix, snapshot_dir=snapshot_dir,
        snapshot_every=snapshot_every, resume=resume, events_before_ready=events_before_ready,
        publish=False,  # the client publishes from its event loop (LoopPublisher)
    )  # fmt: skip
    _check_symbols(venue, config, interval, names, max_seconds)
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
    recorded = engine.source_offsets.get(LIVE_SOURCE) if durability.restored else None
    _check_same_venue(recorded, venue.name, durability)
    live_from = _live_from(recorded, started_ms, history * approx_interval_ms(engine.interval))
    if durability.restored and recorded is None:
        # e.g. warmed up by `replay`, now going live: allowed
        err(f"atc-stream: note: the snapshot holds no live output position (taken by "
            f"another command); {output} gets the rows from the snapshot on")  # fmt: skip
    routing, on_bars = None, None
    if route_shards is not None and redis is not None:
        from atc_stream.app.jobs.cluster import kline_router

        routing, on_bars = kline_router(redis, redis_prefix, route_shards)
    if durability.resume and not durability.restored:
        # the strategy outputs as -o (``open_output``): bars that closed while the
        # process was down cannot be had again, so an earlier run's rows are not overwritten
        for path in (trades, positions):
            refuse_earlier_output(path, durability.store)
    with durability.open_output(engine, output, LIVE_SOURCE, replayable=False) as signals:
        sink = signals
        if paper is not None:
            sink = PaperOutputs(
                signals, trades=paper.trades, positions=paper.positions,
                resume_from=(recorded or {}).get("output"),
            )  # fmt: skip
        durability.start(engine)

        where = venue.name if config.ws_url is None and venue.ws_url is None else (
            f"{venue.name} {config.ws_url or venue.ws_url}"
        )  # fmt: skip

        def offsets() -> dict[str, Any]:
            # taken when a snapshot copies the state: every row of the bars in that state
            # has been written, so the output cut back to here matches the state
            entry: dict[str, Any] = {"input": f"{where} {engine.interval}",
                                     "exchange": venue.name, "output": sink.position()}  # fmt: skip
            if _warming_up(client, engine):  # see ``_live_from``
                entry["live_from"] = live_from
            return {LIVE_SOURCE: entry}

        try:
            client = KlineClient(
                engine, symbols, config, on_result=sink.write,
                on_preview=sink.write if previews else None,
                snapshotter=durability.snapshotter, source_offsets=offsets,
                publisher=publisher, exchange=venue, live_from_ms=live_from,
                on_bars=on_bars,
            )  # fmt: skip
        except ValueError as exc:
            raise OptionError(str(exc), param_hint="--symbols") from None
        durability.on_stop(client.stop)
        durability.final_offsets = offsets
        if durability.snapshotter is not None and not durability.restored:
            client.before_rows = lambda: _first_snapshot(durability.snapshotter, offsets)
        # the warmup and first backfills wait for the exchange's history: a stop before
        # they are done is a stop during start-up (no snapshot, a short summary), unless
        # rows (a warmed symbol's, a preview) were written: only a snapshot accounts for
        # them on --resume, so that stop is an ordinary one
        durability.started_up = lambda: client.started_up
        durability.wrote = lambda: client.stats.rows_out > 0 or client.stats.previews > 0
        err(
            f"atc-stream: live {len(client.symbols)} symbols x {engine.interval} from "
            f"{where} ({engine.backend.name} backend)"
        )
        ops = (metrics_host, metrics_port) if metrics_port else None
        try:
            failed, stats = _run_client(
                client, durability, max_seconds, max_bars, status_every, ops
            )
        finally:
            if paper is not None:
                sink.close()
            if routing is not None:
                _close_routing(routing, routing.router.shards)
    if stderr_is_terminal() and status_every > 0:
        err("")
    # Ctrl-C exits 130 as every command's does; SIGTERM, a service manager's stop, 0
    stopped = 130 if durability.stop_signal == signal.SIGINT else 0
    if durability.stopped_in_start_up:  # no bar applied: what start-up had done
        err("atc-stream: live stopped during start-up (nothing written, no snapshot taken)",
            fields=status_fields(stats))  # fmt: skip
        for line in _start_up_lines(stats):
            err("  " + line)
        return stopped
    err("atc-stream: live done" + (f" (failed: {failed})" if failed else ""),
        level="error" if failed else "info", fields=status_fields(stats))  # fmt: skip
    for line in stats.lines() + (paper_lines(engine) if paper is not None else []):
        err("  " + line)
    return 1 if failed is not None else stopped


#: The first words of the closing summary's lines (``LiveStats.lines``) that say something
#: of a run stopped during start-up: no bar was applied, the others would count nothing
_START_UP_LINES = ("symbols", "messages", "disconnects", "REST")


def _start_up_lines(stats: LiveStats) -> list[str]:
    """The lines of a run's closing summary (``stats``: its ``LiveStats``) that tell how
    far a start-up stopped by a signal came: connections and REST requests."""
    return [line for line in stats.lines() if line.split(" ", 1)[0] in _START_UP_LINES]


def _live_from(recorded: dict[str, Any] | None, started_ms: int | None, within_ms: int) -> int:
    """Bars closing after this time (ms) are stepped, those before it warm a fresh symbol
    up. A snapshot (``recorded``: its live offsets) taken before its run's start-up was
    done records that run's: symbols without a bar in it warm up as of then on
    ``--resume``, so their rows are those an uninterrupted run writes, from the same first
    bar, as long as it is no older than ``within_ms`` (the history asked for: older, the
    resume would fetch and step everything since, so it warms up as of now, and says so).
    Else ``started_ms`` (the process's start), or now."""
    now = started_ms if started_ms is not None else int(time.time() * 1000)
    if recorded is None or recorded.get("live_from") is None:
        return now
    then = int(recorded["live_from"])
    if now - then > within_ms:
        err(
            "atc-stream: note: the snapshot's run stopped during its start-up, longer "
            "ago than --history covers: the symbols it had not warmed up do as of now"
        )
        return now
    return then


def _first_snapshot(snapshotter, offsets) -> None:
    """A fresh run's snapshot before its first row (the state empty, the output position
    at its start, ``live_from``): a SIGKILL later in the start-up leaves rows but no
    periodic snapshot, and ``--resume`` cuts the output back to this one and warms up as
    of the same start."""
    snapshotter.snapshot_now(offsets())
    snapshotter.wait()


def _warming_up(client, engine) -> bool:
    """Whether ``client``'s start-up goes on with a symbol that has no bar yet (on
    ``--resume`` it warms up afresh). Once started up, a symbol without a bar (no history
    on the exchange) is left to the resumed run's own start."""
    if client.started_up:
        return False
    return any(all(t is None for t in engine.last_bar_times(s)) for s in client.symbols)


def _close_routing(routing, shards: int) -> None:
    """Write the bars still queued for the shard streams (within 30 s) and say how many
    went; one error line when some could not be written."""
    left = routing.close(timeout=30.0)
    router = routing.router
    err(f"atc-stream: routed {router.routed} bars to {shards} shard streams "
        f"({router.connection_errors} Redis errors waited out)")  # fmt: skip
    if left:
        err(f"atc-stream: {left} bars were not written to the shard streams (Redis "
            f"unreachable at the end)", level="error")  # fmt: skip


#: ``LiveConfig`` fields set from a flag of the same name
_FLAG_FIELDS = (
    "history", "max_streams_per_connection", "idle_timeout", "rest_weight_budget", "ws_url",
    "rest_url",
)  # fmt: skip


def _as_flags(message: str) -> str:
    """A ``LiveConfig`` refusal as the user sees the value: the flag's name, and no ``None``
    (which only the Python API can pass)."""
    field = message.split(" ", 1)[0]
    if field in _FLAG_FIELDS:
        message = "--" + field.replace("_", "-") + message[len(field) :]
        message = message.replace(" or None", "")
    return message


def _check_symbols(
    exchange, config, interval: str, symbols: list[str], max_seconds: float | None = None
) -> None:
    """``RunError`` (one line) when the exchange does not list every symbol, or cannot be
    asked for its list (within ``max_seconds``, when given). A retried request is a
    warning line each, so a slow exchange is not a silent wait."""
    import asyncio

    from atc_stream.connectors.exchanges.rest import RestError

    def on_retry(problem: str, retry: int, delay: float) -> None:
        err(
            f"atc-stream: warning: listing the symbols of {exchange.name}: {problem}; "
            f"retry {retry} of {config.rest_retries} in {delay:.1f} s",
            level="warning",
        )

    async def check() -> list[str]:
        return await asyncio.wait_for(
            exchange.unknown_symbols(config, interval, symbols, on_retry=on_retry), max_seconds
        )

    if not symbols:
        return  # the client refuses an empty list with its own line
    try:
        unknown = asyncio.run(check())
    except RestError as exc:
        raise RunError(f"cannot list the symbols of {exchange.name}: {exc}") from None
    except asyncio.TimeoutError:
        raise RunError(
            f"cannot list the symbols of {exchange.name}: no answer within --max-seconds "
            f"{max_seconds:g}"
        ) from None
    if unknown:
        raise RunError(f"{exchange.name} has no symbol {', '.join(unknown)} (--symbols)")


def status_fields(stats) -> dict[str, Any]:
    """The values of a status line, as fields of a structured log line."""
    lag = stats.last_bar_lag_ms
    return {
        "symbols": stats.symbols, "open_connections": stats.open_connections,
        "connections": stats.connections, "warmup_bars": stats.warmup_bars,
        "bars": stats.bars, "bars_per_second": round(stats.bars_per_second, 3),
        "rows_out": stats.rows_out, "previews": stats.previews,
        "lag_seconds": None if lag is None else lag / 1000, "reconnects": stats.reconnects,
        "connect_failures": stats.connect_failures,
        "rejected": sum(stats.rejections.values()) + sum(stats.engine_rejections.values()),
    }  # fmt: skip


def _check_same_venue(recorded: dict[str, Any] | None, name: str, durability) -> None:
    """``RunError`` when a restored live snapshot was taken on another exchange: its
    streams would go on with another venue's prices as if they were one series."""
    if not durability.restored or recorded is None:
        return
    taken_on = recorded.get("exchange") or str(recorded.get("input", "")).split(" ")[0]
    if taken_on and taken_on != name:
        raise RunError(
            f"the snapshot was taken on {taken_on}, not {name}: resume with --exchange "
            f"{taken_on}, or start fresh with {durability.fresh_store}"
        )


def _check_listen(host: str, port: int) -> None:
    """``RunError`` when ``host:port`` cannot be listened on (taken, or no such address);
    the operations server binds it later, after the warmup has started."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds
            probe.bind(address)
    except OSError as exc:
        raise RunError(
            f"--metrics-port: cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None


def _run_client(client, durability, max_seconds, max_bars, status_every, ops=None):
    """(the error that ended the feed or None, the client's ``LiveStats``). ``ops``: the
    (host, port) of the operations endpoints, served while the client runs."""
    import asyncio

    from atc_stream.connectors.exchanges.rest import RestError

    def show_status(stats) -> None:
        status(stats.status_line(), status_fields(stats))

    async def serve_and_run():
        server = None
        if ops is not None:  # listening before the warmup: /readyz says it is not done
            from atc_stream.app.ops_server import OpsServer

            server = OpsServer(client, *ops, snapshotter=durability.snapshotter)
            try:
                await server.start()
            except OSError as exc:
                raise RunError(
                    f"--metrics-port: cannot listen on {ops[0]}:{ops[1]}: {exc.strerror or exc}"
                ) from None
        try:
            return await client.run(
                max_seconds=max_seconds, max_bars=max_bars,
                on_status=show_status if status_every > 0 else None,
                status_every=status_every or 1.0,
            )  # fmt: skip
        finally:
            # in the loop that ran the feed: a library client's sockets
            await client.exchange.aclose()
            if server is not None:
                await server.close()

    with durability:
        try:
            stats = asyncio.run(serve_and_run())
        except ReaderGone:  # `| head` has what it wants: the command's quiet 141, no failure
            raise
        except (RestError, ValueError) as exc:
            return exc, client.stats
    return None, stats
