"""The ``atc-stream`` command: replay bar files, run the demo (and, with extras, more).

Results go to JSONL (stdout by default) or Parquet; progress and the closing summary
go to stderr so stdout stays machine-readable.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from atc_stream.app import console, jobs
from atc_stream.app.cluster_cli import cluster_app
from atc_stream.app.config_file import LOG_FORMAT, ConfigCommand, load_config_file
from atc_stream.app.console import PROGRAM, error, plain_usage_error
from atc_stream.app.defaults import INTERVAL, REDIS_PREFIX
from atc_stream.app.help_text import reflow_commands
from atc_stream.app.logs import LogFormat, use_log_format
from atc_stream.app.options import (
    BackendOption,
    EventsBeforeReadyOption,
    IntervalOption,
    OutputOption,
    ParamsOption,
    PositionsOption,
    ProgressOption,
    RedisOption,
    RedisPrefixOption,
    ResumableIntervalOption,
    ResumeOption,
    ShardSnapshotsOption,
    SnapshotDirOption,
    SnapshotEveryOption,
    SnapshotToOption,
    StopWhenIdleOption,
    StrategyOption,
    StreamIntervalOption,
    TradesOption,
    WarmupOption,
    check_feed_setting,
    check_optional_interval,
    check_positive,
    check_seconds,
    check_speed,
    redis_option,
)
from atc_stream.app.run_job import run_job
from atc_stream.core.shards import MAX_SHARDS

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Exact, incremental Adaptive Trend Classification (ATC) signals for many symbols.",
)


class TimeUnit(str, Enum):
    """Units of integer times in bar files."""

    auto = "auto"
    s = "s"
    ms = "ms"
    us = "us"
    ns = "ns"


def _print_version(value: bool) -> None:
    if value:
        from atc_stream.core.version import __version__

        typer.echo(f"{PROGRAM} {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads", min=0, envvar="ATC_STREAM_THREADS",
            help="CPU threads per engine call (1: serial; default/0: chosen per call "
            "from the batch size and the CPUs available). Goes before the command.",
        ),
    ] = None,
) -> None:  # fmt: skip
    """Exact, incremental Adaptive Trend Classification (ATC) signals for many symbols."""
    from atc_stream.kernels.threads import set_default_threads

    set_default_threads(threads)


@app.command("compile")
def compile_kernels() -> None:
    """Compile the CPU kernels into the on-disk cache now (e.g. in a Docker build step)."""
    run_job("compile:run_compile")


@app.command()
def replay(
    bars: Annotated[
        Path | None,
        typer.Argument(
            help="CSV or Parquet file of bars, or a directory of them (one per symbol: "
            "symbol = file stem). Leave out with --ticks."
        ),
    ] = None,
    ticks: Annotated[
        Path | None,
        typer.Option(
            "--ticks",
            help="Trade file (CSV/Parquet: time, symbol, price, size) or directory of them, "
            "aggregated into --interval bars (bar time = interval start) instead of BARS.",
        ),
    ] = None,
    price_column: Annotated[str, typer.Option(help="Ticks: column with the price.")] = "price",
    size_column: Annotated[str, typer.Option(help="Ticks: column with the size.")] = "size",
    empty: Annotated[
        str,
        typer.Option(
            help="Ticks: an interval without trades gives no bar ('skip') or a bar at the "
            "previous close with zero volume ('carry')."
        ),
    ] = "skip",
    symbol_column: Annotated[str, typer.Option(help="Column with the symbol.")] = "symbol",
    time_column: Annotated[str, typer.Option(help="Column with the bar time (int/ISO).")] = "time",
    close_column: Annotated[str, typer.Option(help="Column with the close.")] = "close",
    open_column: Annotated[str, typer.Option(help="Column with the open (--strategy).")] = "open",
    high_column: Annotated[str, typer.Option(help="Column with the high (--strategy).")] = "high",
    low_column: Annotated[str, typer.Option(help="Column with the low (--strategy).")] = "low",
    symbol: Annotated[
        str | None,
        typer.Option(help="Symbol for a file without a symbol column (default: file stem)."),
    ] = None,
    params: ParamsOption = None,
    output: OutputOption = "-",
    warmup: WarmupOption = 0,
    speed: Annotated[
        float | None,
        typer.Option(
            callback=check_speed,
            help="Play at SPEED x real time (bar times in ms); default: max.",
        ),
    ] = None,
    progress: ProgressOption = True,
    backend: BackendOption = "auto",
    interval: ResumableIntervalOption = None,
    redis: RedisOption = None,
    redis_prefix: RedisPrefixOption = REDIS_PREFIX,
    snapshot_dir: SnapshotDirOption = None,
    snapshot_every: SnapshotEveryOption = None,
    resume: ResumeOption = False,
    time_unit: Annotated[
        TimeUnit,
        typer.Option(
            "--time-unit",
            help="Unit of integer times; auto: decided once per time column from all its "
            "values (a column whose values span units is refused: name the unit).",
        ),
    ] = TimeUnit.auto,
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit 2 when any input row was rejected (above).")
    ] = False,
    events_before_ready: EventsBeforeReadyOption = False,
    strategy: StrategyOption = None,
    trades: TradesOption = None,
    positions: PositionsOption = None,
    shard_snapshots: ShardSnapshotsOption = None,
    snapshot_to: SnapshotToOption = None,
    route_shards: Annotated[
        int | None,
        typer.Option(
            "--route-shards",
            min=1,
            max=MAX_SHARDS,
            help="Write the bars to the N shard streams of "
            "a cluster at --redis (atc-stream cluster) instead of running the engine.",
        ),
    ] = None,  # fmt: skip
) -> None:
    """Feed bars (or ticks aggregated to bars) through the engine: a row per (stream, bar).

    With --strategy, paper trading on bars with open/high/low/close (the
    file's columns, or each interval's ticks). With --shard-snapshots N --snapshot-to
    TARGET, a backfill: one snapshot per shard at the end, where live shards start.
    With --strict, a row the reader rejects stops the run before any output; a bar the
    engine rejects (duplicate, out of order, close <= 0) exits 2 after a complete output.
    Without it, bad rows are left out and counted; a file whose every row is rejected
    exits 2 (nothing applied)."""
    run_job(
        "replay:run_replay", bars=bars, ticks=ticks,
        columns={"symbol": symbol_column, "time": time_column, "close": close_column,
                 "open": open_column, "high": high_column, "low": low_column},
        tick_columns={"price": price_column, "size": size_column}, empty=empty,
        symbol=symbol, time_unit=time_unit.value, strict=strict, params=params,
        output=output, warmup=warmup, speed=speed, progress=progress, backend=backend,
        interval=interval, redis=redis, redis_prefix=redis_prefix, snapshot_dir=snapshot_dir,
        snapshot_every=snapshot_every, resume=resume, events_before_ready=events_before_ready,
        strategies=strategy or [], trades=trades, positions=positions,
        shard_snapshots=shard_snapshots, snapshot_to=snapshot_to,
        route_shards=route_shards,
    )  # fmt: skip


@app.command(cls=ConfigCommand)
def live(
    symbols: Annotated[
        str,
        typer.Option(
            "--symbols",
            help="Comma-separated symbols as the exchange writes them: BTCUSDT,ETHUSDT "
            "(OKX: BTC-USDT; ccxt: BTC/USDT).",
        ),
    ],
    interval: IntervalOption = INTERVAL,
    exchange: Annotated[
        str,
        typer.Option(
            "--exchange",
            help="Where the klines come from: binance, binance-usdm (USD-M futures), bybit, "
            "bybit-linear (USDT perpetuals), okx, or ccxt:<id> (any ccxt.pro exchange; "
            "needs the ccxt extra).",
        ),
    ] = "binance",
    history: Annotated[
        int,
        typer.Option(
            "--history", min=0, help="Closed bars per symbol fetched over REST for the warmup."
        ),
    ] = 1000,
    ws_url: Annotated[
        str | None,
        typer.Option(
            "--ws-url", callback=check_feed_setting,
            help="Websocket base URL (default: the exchange's, e.g. "
            "wss://stream.binance.com:9443); the exchange's path is added.",
        ),
    ] = None,
    rest_url: Annotated[
        str | None,
        typer.Option(
            "--rest-url", callback=check_feed_setting,
            help="REST base URL (default: the exchange's, e.g. https://api.binance.com); "
            "the exchange's paths are added.",
        ),
    ] = None,
    output: OutputOption = "-",
    previews: Annotated[
        bool,
        typer.Option(
            "--previews/--no-previews",
            help="Also write provisional rows for in-progress klines (JSONL and CSV output; "
            "not Parquet, not published to Redis).",
        ),
    ] = True,
    max_seconds: Annotated[float | None, typer.Option(help="Stop after SECONDS.",
        callback=check_positive)] = None,
    max_bars: Annotated[int | None, typer.Option(min=1,
        help="Stop after N closed bars applied after warmup.")] = None,
    max_streams_per_connection: Annotated[
        int, typer.Option(min=1, help="Streams per websocket connection.")
    ] = 1024,
    idle_timeout: Annotated[float, typer.Option(callback=check_feed_setting,
        help="Reconnect after SECONDS without a message.")] = 60.0,
    rest_weight_budget: Annotated[
        int | None,
        typer.Option(
            "--rest-weight-budget",
            min=1,
            help="REST request weight the exchange allows this IP per its window "
            "(default: the exchange's, e.g. Binance spot's 6000 a minute); 90% of it is "
            "spent at most.",
        ),
    ] = None,
    ws_compression: Annotated[bool, typer.Option("--ws-compression/--no-ws-compression",
        help="Offer permessage-deflate on the websocket: less traffic, ~7 us more CPU "
        "per kline.")] = False,
    warm_before_ms: Annotated[float, typer.Option(min=0, help="MS before each bar's klines "
        "are due, run the step once on a preview (nothing is sent), so that the bar finds "
        "the CPU's caches warm: ~0.4 ms less latency at 200 symbols for ~1 ms of CPU a "
        "bar (0: off).")] = 3.0,
    status_every: Annotated[
        float, typer.Option(min=0, help="Status line on stderr every SECONDS (0: none).")
    ] = 1.0,
    params: ParamsOption = None,
    backend: BackendOption = "auto",
    redis: RedisOption = None,
    redis_prefix: RedisPrefixOption = REDIS_PREFIX,
    snapshot_dir: SnapshotDirOption = None,
    snapshot_every: SnapshotEveryOption = None,
    resume: ResumeOption = False,
    events_before_ready: EventsBeforeReadyOption = False,
    strategy: StrategyOption = None,
    trades: TradesOption = None,
    positions: PositionsOption = None,
    route_shards: Annotated[int | None, typer.Option("--route-shards", min=1, max=MAX_SHARDS,
        help="Also "
        "write every closed bar the engine applies (the history too) to the N shard "
        "streams of a cluster at --redis (atc-stream cluster).")] = None,
    metrics_port: Annotated[int, typer.Option(min=0, max=65535, help="Serve /metrics, "
        "/healthz and /readyz on this port (0: off; needs the metrics extra).")] = 0,
    metrics_host: Annotated[str, typer.Option(help="Address of --metrics-port.")] = "127.0.0.1",
    log_format: Annotated[LogFormat, typer.Option("--log-format", help="stderr lines and "
        "logs as text or JSON objects, one a line.")] = LogFormat.text,
    config: Annotated[list[Path] | None, typer.Option(is_eager=True, callback=load_config_file,
        metavar="FILE", help="TOML file of options (key: option name; ~ expanded, relative "
        "paths from the working directory); options given here win.")] = None,
) -> None:  # fmt: skip
    """Stream exchange klines (Binance, Bybit, OKX or any ccxt exchange) through the engine.

    Warms up over REST, then applies closed klines as bars and previews in-progress ones;
    reconnects with backoff and backfills every missed closed bar over REST. With
    --resume the latest snapshot is restored and each stream is backfilled from its
    last bar. A status line goes to stderr; signals to --output (and Redis with --redis).
    With --strategy, paper trading on the klines' open/high/low/close (from the bar after
    the REST warmup: trades closed within the warmup are in the state, not written).
    To undo a --config setting: --no-FLAG turns an on/off flag off (--no-resume), and an
    empty value turns off an option whose default is none (--redis '', --max-seconds=).
    """
    run_job(
        "live:run_live", symbols=symbols, interval=interval, exchange=exchange,
        history=history, ws_url=ws_url, rest_url=rest_url, output=output, previews=previews,
        max_seconds=max_seconds, max_bars=max_bars,
        max_streams_per_connection=max_streams_per_connection,
        idle_timeout=idle_timeout, rest_weight_budget=rest_weight_budget,
        ws_compression=ws_compression, warm_before_ms=warm_before_ms, started_ms=_started_ms,
        status_every=status_every, params=params, backend=backend, redis=redis,
        redis_prefix=redis_prefix, snapshot_dir=snapshot_dir, snapshot_every=snapshot_every,
        resume=resume, events_before_ready=events_before_ready, strategies=strategy or [],
        trades=trades, positions=positions, route_shards=route_shards,
        metrics_port=metrics_port, metrics_host=metrics_host, logs=use_log_format(log_format),
    )  # fmt: skip


@app.command()
def demo(
    symbols: Annotated[int, typer.Option(min=1, help="Number of random-walk symbols.")] = 20,
    bars: Annotated[int, typer.Option(min=1, help="Bars per symbol.")] = 3000,
    seed: Annotated[
        int, typer.Option(min=0, help="Random seed (the data set is deterministic).")
    ] = 7,
    warmup: WarmupOption = 1000,
    output: OutputOption = "atc_demo_signals.jsonl",
    params: ParamsOption = None,
    progress: ProgressOption = True,
    backend: BackendOption = "cpu",
    check: Annotated[
        bool, typer.Option("--check/--no-check", help="Compare with a full recomputation.")
    ] = True,
    redis: RedisOption = None,
    redis_prefix: RedisPrefixOption = REDIS_PREFIX,
    snapshot_dir: SnapshotDirOption = None,
    snapshot_every: SnapshotEveryOption = None,
    resume: ResumeOption = False,
) -> None:
    """Generate a deterministic multi-symbol random walk and replay it (needs nothing else)."""
    run_job(
        "demo:run_demo", symbols=symbols, bars=bars, seed=seed, warmup=warmup, output=output,
        params=params, progress=progress, backend=backend, check=check, redis=redis,
        redis_prefix=redis_prefix, snapshot_dir=snapshot_dir, snapshot_every=snapshot_every,
        resume=resume,
    )  # fmt: skip


@app.command()
def subscribe(
    redis: Annotated[str, redis_option("Redis URL of the publisher.")],
    symbols: Annotated[
        list[str] | None,
        typer.Option(
            "--symbols",
            help="Symbols to follow (repeat or comma-separate); --events, --trades, "
            "--positions and --latest then print only their records too (--batch: whole).",
        ),
    ] = None,
    events: Annotated[bool, typer.Option("--events", help="Follow the events channel.")] = False,
    batch: Annotated[
        bool, typer.Option("--batch", help="Follow the per-step batch channel.")
    ] = False,
    trades: Annotated[
        bool, typer.Option("--trades", help="Follow the trades channel (paper trading).")
    ] = False,
    positions: Annotated[
        bool,
        typer.Option("--positions", help="Follow the positions channel (paper trading)."),
    ] = False,
    latest: Annotated[
        bool,
        typer.Option(
            "--latest",
            help="First print the latest record of every stream (with --positions, also "
            "the latest position of every strategy stream).",
        ),
    ] = False,
    redis_prefix: RedisPrefixOption = REDIS_PREFIX,
    encoding: Annotated[str, typer.Option(help="json or msgpack (as published).")] = "json",
    count: Annotated[int | None, typer.Option(help="Exit after COUNT messages.", min=1)] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            help="Exit when nothing to print arrived for TIMEOUT seconds.", callback=check_seconds
        ),
    ] = None,
) -> None:
    """Print signals as they arrive (one JSON object per line: channel, kind, data).

    With no --symbols/--events/--batch/--trades/--positions, every per-symbol signal
    channel is followed."""
    run_job(
        "subscribe:run_subscribe", redis=redis, symbols=symbols, events=events, batch=batch,
        trades=trades, positions=positions, latest=latest, redis_prefix=redis_prefix,
        encoding=encoding, count=count, timeout=timeout,
    )  # fmt: skip


@app.command("run-stream")
def run_stream(
    redis: Annotated[str, redis_option("Redis URL holding the streams.")],
    input_stream: Annotated[
        str, typer.Option("--input-stream", help="Stream of bars (fields symbol, time, close).")
    ],
    output_stream: Annotated[
        str | None,
        typer.Option("--output-stream", help="Stream that receives one entry per (stream, bar)."),
    ] = None,
    group: Annotated[str, typer.Option("--group", help="Consumer group name.")] = "atc",
    consumer: Annotated[str, typer.Option("--consumer", help="Consumer name.")] = "engine-1",
    snapshot_dir: SnapshotDirOption = None,
    snapshot_every: SnapshotEveryOption = None,
    resume: ResumeOption = False,
    stop_when_idle: StopWhenIdleOption = None,
    publish: Annotated[
        bool, typer.Option("--publish/--no-publish", help="Also publish signals over pub/sub.")
    ] = False,
    redis_prefix: RedisPrefixOption = REDIS_PREFIX,
    batch_size: Annotated[int, typer.Option(help="Entries read per batch.", min=1)] = 1000,
    output_maxlen: Annotated[
        int, typer.Option(help="Approximate MAXLEN of the output stream.", min=1)
    ] = 1_000_000,
    namespace: Annotated[
        str, typer.Option(help="Snapshot namespace (one per engine shard).")
    ] = "default",
    params: ParamsOption = None,
    backend: BackendOption = "auto",
    interval: StreamIntervalOption = None,
    time_unit: Annotated[
        TimeUnit | None,
        typer.Option(
            "--time-unit",
            help="Unit of integer entry times (default: taken as they are, epoch ms by "
            "convention; auto: by magnitude). ISO-8601 times need none.",
        ),
    ] = None,
    strategy: StrategyOption = None,
) -> None:
    """Apply bars from a Redis Stream (consumer group), exactly once across restarts.

    Outputs go to --output-stream (and pub/sub with --publish). Snapshots record the last
    applied entry; --resume continues from there (see connectors/redis/streams.py).
    With --strategy, entries carry open, high, low and close (paper trading); the trades
    and positions go to KEY:trades and KEY:positions of --output-stream KEY (exactly
    once too) and to {prefix}:trades and {prefix}:positions with --publish."""
    run_job(
        "run_stream:run_stream", redis=redis, input_stream=input_stream,
        output_stream=output_stream, group=group, consumer=consumer,
        snapshot_dir=snapshot_dir, snapshot_every=snapshot_every, resume=resume,
        stop_when_idle=stop_when_idle, publish=publish,
        redis_prefix=redis_prefix, batch_size=batch_size, output_maxlen=output_maxlen,
        namespace=namespace, params=params, backend=backend, interval=interval,
        time_unit=time_unit.value if time_unit is not None else None,
        strategies=strategy or [],
    )  # fmt: skip


SWEEP_HELP = """Backtest a grid of ATC parameter sets x strategies over every symbol of DATA.

DATA is a CSV or Parquet file (or a directory of them) of OHLC bars with the columns
symbol, time, open, high, low, close. Every (symbol, parameter set, strategy) stream is
backtested (docs/spec.md, "Backtest"), batched by symbols. The grid is a TOML file:

\b
    \\[atc]                      # ATCParams fields; a list of values each
    ema_len = [20, 28]
    robustness = ["Medium", "Wide"]
    \\[strategy]                 # Strategy fields
    direction = ["long_short", "long_only"]
    stop = [0.0, 0.02]
    fee_bps = 5                # one value: the same for every set

The sets are the cartesian product of the lists (the last key varies fastest), numbered
params_id / strategy_id from 0. The -o directory gets metrics.parquet (one row per
stream and period), trades.parquet, params.parquet, strategies.parquet and
ranking.parquet (each set aggregated over symbols: returns, drawdowns and exposure
averaged, trades and wins summed); a sweep's own earlier tables there are replaced, a
file of those names it did not write is refused. The top sets by --rank-by are printed
on stdout; sets that made no trade and held no position (never ready) rank last.

With --train-until DATE the whole history is still run once (the ATC and strategy state
carry across DATE, as they would live); the bars before DATE are the train period, the
rest the test period. Each period's metrics come from the marked equity of its bars
(the test period's returns and drawdown measured from the equity at the last train
bar) and the trades that exit in it. Sets are ranked on train and their test metrics
shown beside them.
"""


@app.command(help=SWEEP_HELP)
def sweep(
    data: Annotated[Path, typer.Argument(help="OHLC bars: a CSV/Parquet file or a directory.")],
    grid: Annotated[Path, typer.Option("--grid", help="TOML grid: \\[atc] x \\[strategy] lists.")],
    outdir: Annotated[  # text: an empty -o must be refused, and Path("") is "."
        str, typer.Option("--output", "-o", help="Directory of the Parquet tables.")
    ] = "sweep",
    train_until: Annotated[
        str | None,
        typer.Option(
            "--train-until",
            help="Rank on the bars before this time (ISO-8601 or an integer epoch) and "
            "show the same sets' metrics after it.",
        ),
    ] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="Sets printed.")] = 10,
    rank_by: Annotated[
        str,
        typer.Option(
            "--rank-by",
            help="total_return, final_equity, max_drawdown (lower ranks first), win_rate, "
            "exposure, trades or wins; sets that made no trade and held no position "
            "rank last.",
        ),
    ] = "total_return",
    backend: BackendOption = "auto",
    progress: ProgressOption = True,
    time_unit: Annotated[
        TimeUnit, typer.Option("--time-unit", help="Unit of integer times (auto: by column).")
    ] = TimeUnit.auto,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="Run the blocks as Ray tasks (the ray extra): a local Ray instance, or "
            "the cluster of --ray-address; trades.parquet becomes a Parquet dataset.",
        ),
    ] = False,
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", help="With --ray: HOST:PORT, ray://HOST:PORT or auto."),
    ] = None,
    interval: Annotated[
        str | None,
        typer.Option(
            "--interval",
            help="Bar interval (default: inferred from bars).",
            callback=check_optional_interval,
        ),
    ] = None,
) -> None:
    run_job(
        "sweep:run_sweep", data=data, grid=grid, outdir=outdir, train_until=train_until,
        top=top, rank_by=rank_by, backend=backend, progress=progress, time_unit=time_unit.value,
        ray=ray, ray_address=ray_address, interval=interval,
    )  # fmt: skip


@app.command()
def plot(
    signals: Annotated[
        Path | None,
        typer.Argument(
            help="Signal rows: a Parquet directory or file, JSONL or CSV. Leave out with --trades."
        ),
    ] = None,
    symbol: Annotated[
        str | None, typer.Option(help="Symbol to draw (needed when the file holds several).")
    ] = None,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Image to write: .png, .svg, .pdf, ...")
    ] = Path("chart.png"),
    params_id: Annotated[int, typer.Option(help="Parameter set to draw.")] = 0,
    title: Annotated[str | None, typer.Option(help="Chart title.")] = None,
    trades: Annotated[
        Path | None,
        typer.Option(
            "--trades",
            help="A sweep's trades.parquet: chart one backtested stream instead (price with "
            "entries and exits, equity below); needs --bars.",
        ),
    ] = None,
    bars: Annotated[
        Path | None,
        typer.Option("--bars", help="With --trades: the OHLC data the sweep ran on."),
    ] = None,
    strategy_id: Annotated[
        int, typer.Option("--strategy-id", help="With --trades: the strategy to draw.")
    ] = 0,
) -> None:
    """Chart one symbol: close with long/short events, the signal below, not-ready bars shaded.

    With --trades SWEEP/trades.parquet --bars DATA, SWEEP a sweep's -o directory: one
    stream of the sweep (--symbol, --params-id, --strategy-id). The stream is run again on
    DATA with the parameter set and strategy of SWEEP's params.parquet and
    strategies.parquet (for its equity curve), and its trades must equal those of
    trades.parquet.
    """
    if trades is not None:
        if signals is not None:
            raise typer.BadParameter("give SIGNALS or --trades, not both", param_hint="--trades")
        run_job(
            "plot:run_plot_backtest", trades=trades, bars=bars, symbol=symbol, output=output,
            params_id=params_id, strategy_id=strategy_id, title=title,
        )  # fmt: skip
        return
    if signals is None:
        raise typer.BadParameter("a SIGNALS file (or --trades) is needed", param_hint="SIGNALS")
    run_job(
        "plot:run_plot", signals=signals, symbol=symbol, output=output, params_id=params_id,
        title=title,
    )  # fmt: skip


app.add_typer(cluster_app, name="cluster")
reflow_commands(app)

#: When the command ``main`` runs started (ms since the epoch): ``live`` publishes every
#: bar closing after it. None outside ``main`` (the commands run inside another program).
_started_ms: int | None = None
_main_ran = False  #: a command of this process ran before


def _process_started_ms() -> int:
    """This process's start time (Linux: from /proc; elsewhere: now)."""
    import os
    import time

    now = time.time()
    try:
        with open("/proc/self/stat") as f:  # field 22, after the parenthesised name
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        age = 0.0
    return int((now - min(max(age, 0.0), 60.0)) * 1000)


def main(argv: list[str] | None = None) -> None:
    """The console entry point: a usage error (bad option value, missing file, unknown
    option) is one line on stderr and exit status 2, not a usage box."""
    import time

    global _started_ms, _main_ran
    # a process's first command starts with the process (its imports count); a later one
    # in the same process (tests) with its call
    _started_ms = int(time.time() * 1000) if _main_ran else _process_started_ms()
    _main_ran = True
    jobs.started = False
    try:
        result = app(args=argv, standalone_mode=False)
        if result == 130 and not jobs.started:  # typer's answer to a Ctrl-C, without a word
            console.err(console.INTERRUPTED_LINE)
    except typer.TyperException as exc:  # a usage error, or another error typer reports
        ctx = getattr(exc, "ctx", None)  # set on usage errors only
        hint = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
        form = ctx.meta.get(LOG_FORMAT, "text") if ctx is not None else "text"
        if exc.format_message().strip():  # empty: no command given, the help was shown
            with use_log_format(form):  # the command's --log-format, when it has one
                error(f"{plain_usage_error(exc.format_message())}{hint}")
        sys.exit(exc.exit_code)
    finally:
        _started_ms = None
    sys.exit(result if isinstance(result, int) else 0)


if __name__ == "__main__":
    main()
