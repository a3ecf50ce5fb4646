"""The ``atc-stream`` command: replay bar files, run the demo (and, with extras, more).

Results go to JSONL (stdout by default) or Parquet; progress and the closing summary
go to stderr so stdout stays machine-readable.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from .params import ATCParams
from .runner import RunError

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
        from . import __version__

        typer.echo(f"atc-stream {__version__}")
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
    from .kernels.threads import set_default_threads

    set_default_threads(threads)


@app.command("compile")
def compile_kernels() -> None:
    """Compile the CPU kernels into the on-disk cache now (e.g. in a Docker build step)."""
    from .kernels.prepare import compile_command

    raise typer.Exit(compile_command(_err))


def _err(line: str) -> None:
    print(line, file=sys.stderr)


def load_param_sets(path: Path | None) -> list[ATCParams]:
    """Parameter sets from a JSON file: one object, or a list of objects (a sweep)."""
    if path is None:
        return [ATCParams()]
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise typer.BadParameter(f"cannot read parameters from {path}: {exc}") from exc
    items = data if isinstance(data, list) else [data]
    try:
        return [ATCParams.from_dict(item) for item in items]
    except (TypeError, ValueError) as exc:
        raise typer.BadParameter(f"{path}: {exc}") from exc


ParamsOption = Annotated[
    Path | None,
    typer.Option("--params", help="JSON file with ATC parameters (an object or a list of them)."),
]
OutputOption = Annotated[
    str,
    typer.Option(
        "--output", "-o", help="Where signals go: '-' (stdout), FILE.jsonl or FILE.parquet."
    ),
]
WarmupOption = Annotated[
    int,
    typer.Option("--warmup", min=0, help="Bars per symbol applied in one batched warmup first."),
]
ProgressOption = Annotated[bool, typer.Option("--progress/--no-progress", help="Progress bar.")]


def _check_speed(value: float | None) -> float | None:
    if value is not None and not value > 0:
        raise typer.BadParameter(f"must be > 0 (x real time), got {value}")
    return value


def _check_backend(value: str) -> str:
    if value not in ("cpu", "cuda", "auto"):
        raise typer.BadParameter(f"{value!r} is not one of 'cpu', 'cuda', 'auto'")
    return value


BackendOption = Annotated[
    str, typer.Option("--backend", help="cpu, cuda or auto.", callback=_check_backend)
]
IntervalOption = Annotated[
    str, typer.Option("--interval", help="Bar interval label of the streams.")
]
ResumableIntervalOption = Annotated[
    str | None,
    typer.Option(
        "--interval",
        help="Bar interval label of the streams (default 1m; on --resume the snapshot's).",
    ),
]

RedisOption = Annotated[
    str | None,
    typer.Option("--redis", help="Publish signals to this Redis URL (pub/sub + latest hash)."),
]
RedisPrefixOption = Annotated[
    str, typer.Option("--redis-prefix", help="Channel and key prefix used with --redis.")
]
SnapshotDirOption = Annotated[
    Path | None,
    typer.Option(
        "--snapshot-dir",
        help="Keep snapshots in this directory (else in Redis when --redis is given).",
    ),
]
SnapshotEveryOption = Annotated[
    int | None,
    typer.Option("--snapshot-every", min=1, help="Snapshot every N bars (default 10000)."),
]
ResumeOption = Annotated[
    bool,
    typer.Option(
        "--resume", help="Restore the latest snapshot and continue from its recorded input offset."
    ),
]
EventsBeforeReadyOption = Annotated[
    bool,
    typer.Option(
        "--events-before-ready",
        help="Also count (summary) and publish (Redis events channel) long/short events of "
        "rows that are not ready yet (docs/spec.md, 'Warm-up and readiness').",
    ),
]


@contextmanager
def _user_errors():
    """Errors meant for the user (bad option, unusable output, refused resume) become one
    line on stderr and exit status 2, never a traceback."""
    from .io.writers import OutputError

    try:
        yield
    except (RunError, OutputError) as exc:
        _err(f"atc-stream: error: {exc}")
        raise typer.Exit(2) from None


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
    time_column: Annotated[
        str, typer.Option(help="Column with the bar time (int or ISO).")
    ] = "time",
    close_column: Annotated[str, typer.Option(help="Column with the close.")] = "close",
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
            callback=_check_speed,
            help="Play at SPEED x real time (bar times in ms); default: max.",
        ),
    ] = None,
    progress: ProgressOption = True,
    backend: BackendOption = "auto",
    interval: ResumableIntervalOption = None,
    redis: RedisOption = None,
    redis_prefix: RedisPrefixOption = "atc",
    snapshot_dir: SnapshotDirOption = None,
    snapshot_every: SnapshotEveryOption = None,
    resume: ResumeOption = False,
    time_unit: Annotated[
        TimeUnit,
        typer.Option(
            "--time-unit",
            help="Unit of integer times; auto: by magnitude (refusing values that fit none).",
        ),
    ] = TimeUnit.auto,
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit 2 when any input row was rejected.")
    ] = False,
    events_before_ready: EventsBeforeReadyOption = False,
) -> None:
    """Feed bars (or ticks aggregated to bars) through the engine; one signal row per
    (stream, bar)."""
    from .replay.run import ReplayOptionError
    from .replay.run import replay as run_replay
    from .runner import Durability

    if (bars is None) == (ticks is None):  # before any snapshot store is opened
        raise typer.BadParameter("give either a bar file BARS or --ticks FILE (exactly one)")
    try:
        with _user_errors():
            durability = Durability(
                redis=redis, redis_prefix=redis_prefix, snapshot_dir=snapshot_dir,
                snapshot_every=snapshot_every, resume=resume,
                events_before_ready=events_before_ready,
            )  # fmt: skip
            run_replay(
                bars=bars, ticks=ticks,
                columns={"symbol": symbol_column, "time": time_column, "close": close_column},
                tick_columns={"price": price_column, "size": size_column}, empty=empty,
                symbol=symbol, time_unit=time_unit.value, strict=strict,
                params=load_param_sets(params) if params is not None else None,
                output=output, warmup=warmup, speed=speed, progress=progress, backend=backend,
                interval=interval, durability=durability, err=_err,
            )  # fmt: skip
    except ReplayOptionError as exc:
        raise typer.BadParameter(str(exc), param_hint=exc.param_hint) from None


@app.command()
def live(
    symbols: Annotated[
        str, typer.Option("--symbols", help="Comma-separated symbols, e.g. BTCUSDT,ETHUSDT.")
    ],
    interval: IntervalOption = "1m",
    history: Annotated[
        int,
        typer.Option(
            "--history", min=0, help="Closed bars per symbol fetched over REST for the warmup."
        ),
    ] = 1000,
    ws_url: Annotated[
        str | None,
        typer.Option(
            "--ws-url",
            help="Websocket base URL; /stream?streams=... is added "
            "(default wss://stream.binance.com:9443).",
        ),
    ] = None,
    rest_url: Annotated[
        str | None,
        typer.Option(
            "--rest-url",
            help="REST base URL; /api/v3/klines is added (default https://api.binance.com).",
        ),
    ] = None,
    output: OutputOption = "-",
    previews: Annotated[
        bool,
        typer.Option(
            "--previews/--no-previews",
            help="Also write provisional rows for in-progress klines (JSONL output only; "
            "not published to Redis).",
        ),
    ] = True,
    max_seconds: Annotated[
        float | None, typer.Option("--max-seconds", help="Stop after SECONDS.")
    ] = None,
    max_bars: Annotated[
        int | None,
        typer.Option("--max-bars", min=1, help="Stop after N closed bars applied after warmup."),
    ] = None,
    max_streams_per_connection: Annotated[
        int, typer.Option(min=1, help="Streams per websocket connection.")
    ] = 1024,
    idle_timeout: Annotated[
        float, typer.Option(help="Reconnect after SECONDS without a message.")
    ] = 60.0,
    rest_rate: Annotated[float, typer.Option(help="REST requests per second at most.")] = 10.0,
    status_every: Annotated[
        float, typer.Option(help="Status line on stderr every SECONDS (0: none).")
    ] = 1.0,
    params: ParamsOption = None,
    backend: BackendOption = "auto",
    redis: RedisOption = None,
    redis_prefix: RedisPrefixOption = "atc",
    snapshot_dir: SnapshotDirOption = None,
    snapshot_every: SnapshotEveryOption = None,
    resume: ResumeOption = False,
    events_before_ready: EventsBeforeReadyOption = False,
) -> None:
    """Stream exchange klines (Binance combined-stream format) through the engine.

    Warms up over REST, then applies closed klines as bars and previews in-progress ones;
    reconnects with backoff and backfills every missed closed bar over REST. With
    --resume the latest snapshot is restored and each stream is backfilled from its
    last bar. A status line goes to stderr; signals to --output (and Redis with --redis).
    """
    import asyncio
    import logging

    from .adapters.binance import KlineClient, LiveConfig, RestError
    from .intervals import validate_interval
    from .io.writers import open_writer, output_format
    from .runner import Durability

    logging.basicConfig(level=logging.WARNING, format="atc-stream: %(levelname)s %(message)s")
    previews = previews and not str(output).endswith(".parquet")  # Parquet: no provisional flag
    try:
        config_args = {"ws_url": ws_url, "rest_url": rest_url}
        config = LiveConfig(
            history=history, max_streams_per_connection=max_streams_per_connection,
            previews=previews, idle_timeout=idle_timeout, rest_rate=rest_rate,
            **{k: v for k, v in config_args.items() if v is not None},
        )  # fmt: skip
        if max_seconds is not None and not max_seconds > 0:
            raise ValueError(f"--max-seconds must be > 0, got {max_seconds}")
        validate_interval(interval)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    param_sets = load_param_sets(params) if params is not None else None
    with _user_errors():
        output_format(output)
        durability = Durability(
            redis=redis, redis_prefix=redis_prefix, snapshot_dir=snapshot_dir,
            snapshot_every=snapshot_every, resume=resume, events_before_ready=events_before_ready,
        )  # fmt: skip
        engine = durability.open_engine(backend, param_sets, interval)  # before connecting
    tty = sys.stderr.isatty()

    def show_status(stats) -> None:
        line = stats.status_line()
        print(f"\r{line:<110}" if tty else line, end="" if tty else "\n", file=sys.stderr)

    with open_writer(output) as sink:
        durability.start(engine)

        def on_result(result) -> None:
            sink.write(result)
            if durability.publisher is not None:
                durability.publisher.publish(result)

        try:
            client = KlineClient(
                engine, symbols, config, on_result=on_result,
                on_preview=sink.write if previews else None,
                snapshotter=durability.snapshotter,
            )  # fmt: skip
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--symbols") from exc
        durability.on_stop(client.stop)
        _err(
            f"atc-stream: live {len(client.symbols)} symbols x {interval} from "
            f"{config.ws_url} ({engine.backend.name} backend)"
        )
        failed = None
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
                failed, stats = exc, client.stats
    if tty and status_every > 0:
        _err("")
    _err("atc-stream: live done" + (f" (failed: {failed})" if failed else ""))
    for line in stats.lines():
        _err("  " + line)
    if failed is not None:
        raise typer.Exit(1)


@app.command()
def demo(
    symbols: Annotated[int, typer.Option(help="Number of random-walk symbols.")] = 20,
    bars: Annotated[int, typer.Option(help="Bars per symbol.")] = 3000,
    seed: Annotated[int, typer.Option(help="Random seed (the data set is deterministic).")] = 7,
    warmup: WarmupOption = 1000,
    output: OutputOption = "atc_demo_signals.jsonl",
    params: ParamsOption = None,
    progress: ProgressOption = True,
    backend: BackendOption = "cpu",
    check: Annotated[
        bool, typer.Option("--check/--no-check", help="Compare with a full recomputation.")
    ] = True,
    redis: RedisOption = None,
    redis_prefix: RedisPrefixOption = "atc",
    snapshot_dir: SnapshotDirOption = None,
    snapshot_every: SnapshotEveryOption = None,
    resume: ResumeOption = False,
) -> None:
    """Generate a deterministic multi-symbol random walk and replay it (needs nothing else)."""
    import numpy as np

    from .replay.player import random_walk_table
    from .series import compute

    table = random_walk_table(symbols, bars, seed)
    param_sets = load_param_sets(params)
    _err(f"atc-stream demo: {symbols} symbols x {bars} bars, warmup {warmup}, output {output}")
    last_signal: dict[str, float] = {}

    def remember(result) -> None:
        for key, value in zip(result.keys, result.signal, strict=True):
            if key.params_id == 0:
                last_signal[key.symbol] = value

    from .io.writers import open_writer
    from .runner import Durability, play_durably

    with _user_errors():
        durability = Durability(
            redis=redis, redis_prefix=redis_prefix, snapshot_dir=snapshot_dir,
            snapshot_every=snapshot_every, resume=resume,
        )  # fmt: skip
        engine = durability.open_engine(backend, param_sets if params else None)
        source = {"name": "demo", "input": f"random-walk {symbols}x{bars} seed {seed}"}
        resume_from = (engine.source_offsets.get("demo") or {}).get("output")
        with open_writer(output, resume_from=resume_from) as writer:
            summary = play_durably(
                engine, table, warmup=warmup, speed=None, progress=progress, writer=writer,
                durability=durability, source=source, on_result=remember,
            )  # fmt: skip
    _err(f"atc-stream: demo done ({engine.backend.name} backend)")
    for line in summary.lines():
        _err("  " + line)
    if durability.stop_requested:
        raise typer.Exit(130)
    if check:
        mismatches = 0
        checked = [sym for sym in table.symbol_names if sym in last_signal]  # all unless resumed
        for symbol in checked:
            closes = table.closes[table.symbols == symbol]
            full = compute(closes, engine.param_sets[0])["signal"][-1]
            same = np.array_equal(full, last_signal[symbol], equal_nan=True)
            mismatches += not same
        verdict = "identical" if mismatches == 0 else f"{mismatches} MISMATCHES"
        _err(f"  full recomputation check: last signal of {len(checked)} symbols {verdict}")
        if mismatches:
            raise typer.Exit(1)


@app.command()
def subscribe(
    redis: Annotated[str, typer.Option("--redis", help="Redis URL of the publisher.")],
    symbols: Annotated[
        list[str] | None,
        typer.Option("--symbols", help="Symbols to follow (repeat or comma-separate)."),
    ] = None,
    events: Annotated[bool, typer.Option("--events", help="Follow the events channel.")] = False,
    batch: Annotated[
        bool, typer.Option("--batch", help="Follow the per-step batch channel.")
    ] = False,
    latest: Annotated[
        bool, typer.Option("--latest", help="First print the latest record of every stream.")
    ] = False,
    redis_prefix: RedisPrefixOption = "atc",
    encoding: Annotated[str, typer.Option(help="json or msgpack (as published).")] = "json",
    count: Annotated[int | None, typer.Option(help="Exit after COUNT messages.", min=1)] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Exit when nothing arrived for TIMEOUT seconds.")
    ] = None,
) -> None:
    """Print signals as they arrive (one JSON object per line: channel, kind, data).

    With no --symbols/--events/--batch, every per-symbol channel is followed."""
    import msgspec

    from .adapters.redis_pubsub import SignalSubscriber

    names = [part for item in symbols or () for part in item.split(",") if part]
    encoder = msgspec.json.Encoder()
    out = sys.stdout.buffer
    try:
        sub = SignalSubscriber(
            redis, prefix=redis_prefix, encoding=encoding, symbols=names, events=events,
            batch=batch, as_dict=True,
        )  # fmt: skip
        sub.wait_ready()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    except Exception as exc:  # redis.ConnectionError, TimeoutError: no server there
        _err(f"atc-stream: cannot subscribe at {redis}: {exc}")
        raise typer.Exit(1) from exc
    try:
        if latest:
            for key, record in sorted(sub.latest().items()):
                out.write(encoder.encode({"channel": sub.latest_key, "kind": "latest",
                                          "key": key, "data": record}) + b"\n")  # fmt: skip
            out.flush()
        for msg in sub.messages(timeout=timeout, limit=count):
            out.write(encoder.encode({"channel": msg.channel, "kind": msg.kind, "data": msg.data}))
            out.write(b"\n")
            out.flush()
    except KeyboardInterrupt:
        pass
    finally:
        sub.close()
        if sub.malformed or sub.reconnects:
            _err(f"atc-stream: subscribe: {sub.malformed} malformed messages skipped, "
                 f"{sub.reconnects} reconnects")  # fmt: skip


@app.command("run-stream")
def run_stream(
    redis: Annotated[str, typer.Option("--redis", help="Redis URL holding the streams.")],
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
    stop_when_idle: Annotated[
        float | None,
        typer.Option("--stop-when-idle", help="Exit after SECONDS without new entries."),
    ] = None,
    publish: Annotated[
        bool, typer.Option("--publish/--no-publish", help="Also publish signals over pub/sub.")
    ] = False,
    redis_prefix: RedisPrefixOption = "atc",
    batch_size: Annotated[int, typer.Option(help="Entries read per batch.", min=1)] = 1000,
    output_maxlen: Annotated[
        int, typer.Option(help="Approximate MAXLEN of the output stream.", min=1)
    ] = 1_000_000,
    namespace: Annotated[
        str, typer.Option(help="Snapshot namespace (one per engine shard).")
    ] = "default",
    params: ParamsOption = None,
    backend: BackendOption = "auto",
    interval: ResumableIntervalOption = None,
) -> None:
    """Apply bars from a Redis Stream (consumer group), exactly once across restarts.

    Outputs go to --output-stream (and pub/sub with --publish). Snapshots record the last
    applied entry; --resume continues from there (see adapters/redis_streams.py)."""
    import logging

    from redis import exceptions as redis_errors

    from .adapters.redis_streams import RedisStreamRunner
    from .runner import Durability

    logging.basicConfig(level=logging.WARNING, format="atc-stream: %(levelname)s %(message)s")
    param_sets = load_param_sets(params) if params is not None else None
    with _user_errors():
        durability = Durability(
            redis=redis, redis_prefix=redis_prefix, snapshot_dir=snapshot_dir,
            snapshot_every=snapshot_every, resume=resume, publish=publish,
            namespace=namespace, refuse_existing=True,
        )  # fmt: skip
        engine = durability.open_engine(backend, param_sets, interval)  # before reading
    durability.start(engine)
    try:
        runner = RedisStreamRunner(
            engine, redis, input_stream, group=group, consumer=consumer,
            output_stream=output_stream, output_maxlen=output_maxlen, batch_size=batch_size,
            snapshotter=durability.snapshotter, publisher=durability.publisher,
        )  # fmt: skip
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    durability.on_stop(runner.stop)
    with durability:
        try:
            runner.prepare(resume=resume)
        except redis_errors.ConnectionError as exc:
            _err(f"atc-stream: cannot reach Redis at {redis}: {exc}")
            raise typer.Exit(1) from exc
        _err(f"atc-stream: reading {input_stream} after entry {runner.offset} "
             f"({engine.backend.name} backend)")  # fmt: skip
        stats = runner.run(stop_when_idle=stop_when_idle)
    _err("atc-stream: run-stream done")
    for line in stats.lines(engine):
        _err("  " + line)


@app.command()
def plot(
    signals: Annotated[
        Path,
        typer.Argument(help="Signal rows: a Parquet directory or file, JSONL or CSV."),
    ],
    symbol: Annotated[
        str | None, typer.Option(help="Symbol to draw (needed when the file holds several).")
    ] = None,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="PNG (or SVG/PDF) to write.")
    ] = Path("chart.png"),
    params_id: Annotated[int, typer.Option(help="Parameter set to draw.")] = 0,
    title: Annotated[str | None, typer.Option(help="Chart title.")] = None,
) -> None:
    """Chart one symbol: close with long/short events, the signal below, not-ready bars shaded."""
    from .plot import PlotError, load_signals, plot_signals

    try:
        frame = load_signals(signals)
        figure = plot_signals(frame, symbol=symbol, params_id=params_id, title=title)
    except PlotError as exc:
        _err(f"atc-stream plot: {exc}")
        raise typer.Exit(2) from None
    except ImportError as exc:  # pandas/pyarrow/matplotlib not installed
        _err(f"atc-stream plot: needs the plot extra (pip install 'atc-stream[plot]'): {exc}")
        raise typer.Exit(2) from None
    figure.savefig(output, dpi=110)
    _err(f"atc-stream: wrote {output}")


def main(argv: list[str] | None = None) -> None:
    """The console entry point: a usage error (bad option value, missing file, unknown
    option) is one line on stderr and exit status 2, not a usage box."""
    from typer.core import _click

    try:
        result = app(args=argv, standalone_mode=False)
    except _click.exceptions.UsageError as exc:
        hint = ""
        if exc.ctx is not None:
            hint = f" (see: {exc.ctx.command_path} --help)"
        _err(f"atc-stream: error: {exc.format_message()}{hint}")
        sys.exit(2)
    except _click.exceptions.ClickException as exc:
        _err(f"atc-stream: error: {exc.format_message()}")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _err("atc-stream: interrupted")
        sys.exit(130)
    sys.exit(result if isinstance(result, int) else 0)


if __name__ == "__main__":
    main()
