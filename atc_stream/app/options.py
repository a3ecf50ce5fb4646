"""The options several ``atc-stream`` commands share (typer annotations), and their checks."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer

from atc_stream.app.defaults import INTERVAL, SNAPSHOT_EVERY
from atc_stream.core.shards import MAX_SHARDS

ParamsOption = Annotated[
    Path | None,
    typer.Option("--params", help="JSON file with ATC parameters (an object or a list of them)."),
]
OutputOption = Annotated[
    str,
    typer.Option(
        "--output",
        "-o",
        help="Where signals go: '-' (stdout), FILE.jsonl, FILE.csv or DIR.parquet.",
    ),
]
WarmupOption = Annotated[
    int,
    typer.Option("--warmup", min=0, help="Bars per symbol applied in one batched warmup first."),
]
ProgressOption = Annotated[bool, typer.Option("--progress/--no-progress", help="Progress bar.")]


def check_speed(value: float | None) -> float | None:
    if value is not None and not value > 0:
        raise typer.BadParameter(f"must be > 0 (x real time), got {value}")
    return value


def check_seconds(value: float | None) -> float | None:
    """A number of seconds to wait (``--stop-when-idle``, ``--timeout``): finite and >= 0;
    NaN would never compare as elapsed and wait forever."""
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise typer.BadParameter(f"must be a finite number of seconds >= 0, got {value}")
    return value


def check_positive(value: float | None) -> float | None:
    """A number that must be > 0 when given (``live --max-seconds``); NaN is refused."""
    if value is not None and not value > 0:
        raise typer.BadParameter(f"must be > 0, got {value}")
    return value


def check_interval(value: str) -> str:
    """A bar interval label (``1m``, ``4h``), checked as the option is read (where a value
    from a ``--config`` file is reported with its key)."""
    from atc_stream.core.intervals import validate_interval

    try:
        return validate_interval(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def check_optional_interval(value: str | None) -> str | None:
    """``check_interval`` of an ``--interval`` that may be left out (None)."""
    return None if value is None else check_interval(value)


def check_feed_setting(param: typer.CallbackParam, value: Any) -> Any:
    """A value of ``live`` that the feed's ``LiveConfig`` checks (a URL, a timeout), checked
    as the option is read, with ``LiveConfig``'s own rule."""
    from atc_stream.connectors.exchanges.config import LiveConfig

    if value is not None and param.name is not None:
        try:
            LiveConfig(**{param.name: value})
        except ValueError as exc:  # "idle_timeout must be > 0 or None, got -1.0"
            said = str(exc).removeprefix(f"{param.name} ").replace(" or None", "")
            raise typer.BadParameter(said) from None
    return value


StopWhenIdleOption = Annotated[
    float | None,
    typer.Option(
        "--stop-when-idle",
        help="Exit after SECONDS without new entries.",
        callback=check_seconds,
    ),
]


def check_backend(value: str) -> str:
    if value not in ("cpu", "cuda", "auto"):
        raise typer.BadParameter(f"{value!r} is not one of 'cpu', 'cuda', 'auto'")
    return value


#: the URL schemes redis-py connects with
REDIS_SCHEMES = ("redis", "rediss", "unix")


def check_redis_url(value: str | None) -> str | None:
    """A ``--redis`` value redis-py can connect to, checked before anything runs: its
    scheme, and for redis:// and rediss:// the database, which redis-py would otherwise
    leave at 0 unsaid when it is not a number (``redis://host:6379/prod``)."""
    if value is None:
        return value
    scheme, _, rest = value.partition("://")
    if scheme.lower() not in REDIS_SCHEMES:
        raise typer.BadParameter(
            f"{value!r} is not a Redis URL; give redis://HOST:PORT[/DB], rediss://... (TLS) "
            f"or unix:///path/to/redis.sock"
        )
    database = rest.partition("?")[0].partition("#")[0].partition("/")[2].strip("/")
    if scheme.lower() != "unix" and database and not (database.isascii() and database.isdigit()):
        raise typer.BadParameter(
            f"{value!r}: the database {database!r} is not a number; give "
            "redis://HOST:PORT/DB with DB a number (0 when left out)"
        )
    return value


def redis_option(help: str) -> Any:
    """A ``--redis URL`` option, checked as a Redis URL."""
    return typer.Option("--redis", help=help, callback=check_redis_url)


BackendOption = Annotated[
    str, typer.Option("--backend", help="cpu, cuda or auto.", callback=check_backend)
]
IntervalOption = Annotated[
    str,
    typer.Option("--interval", help="Bar interval label of the streams.", callback=check_interval),
]
ResumableIntervalOption = Annotated[
    str | None,
    typer.Option(
        "--interval",
        help="Bar interval label of the streams (default: on --resume the snapshot's; "
        f"replay of bars: inferred from their spacing; else {INTERVAL}).",
        callback=check_optional_interval,
    ),
]
StreamIntervalOption = Annotated[
    str | None,
    typer.Option(
        "--interval",
        help="Bar interval label of the streams. Entries carry none: by default it is the "
        "snapshot's on --resume, else inferred from the spacing of the bars the input "
        f"stream holds at the start, else {INTERVAL} (said on stderr). Refused when the "
        "bars' spacing says otherwise.",
        callback=check_optional_interval,
    ),
]

RedisOption = Annotated[
    str | None, redis_option("Publish signals to this Redis URL (pub/sub + latest hash).")
]
RedisPrefixOption = Annotated[
    str, typer.Option("--redis-prefix", help="Channel and key prefix used with --redis.")
]
SnapshotDirOption = Annotated[
    Path | None,
    typer.Option(
        "--snapshot-dir",
        help="Keep snapshots in this directory (else, with --snapshot-every or --resume, in "
        "Redis when --redis is given; with neither, none are taken).",
    ),
]
ShardSnapshotsOption = Annotated[
    int | None,
    typer.Option(
        "--shard-snapshots",
        min=1,
        max=MAX_SHARDS,
        help="After the run, save one snapshot per shard (of N, by symbol) in --snapshot-to.",
    ),
]
SnapshotToOption = Annotated[
    str | None,
    typer.Option(
        "--snapshot-to",
        help="With --shard-snapshots: a directory or redis:// URL; namespace shard-K each.",
    ),
]
SnapshotEveryOption = Annotated[
    int | None,
    typer.Option(
        "--snapshot-every",
        min=1,
        help=f"Snapshot once at least N bars were applied since the last one (default "
        f"{SNAPSHOT_EVERY}; a replay checks between its calls of up to 65,536 rows).",
    ),
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

StrategyOption = Annotated[
    list[str] | None,
    typer.Option(
        "--strategy",
        help="Paper trading (repeatable): a TOML file of \\[\\[strategy]] tables, or inline "
        "key=value,... (direction, stop, take_profit, max_hold, fee_bps, slippage_bps).",
    ),
]
TradesOption = Annotated[
    Path | None,
    typer.Option(
        "--trades",
        help="With --strategy: a trade record per closed trade (FILE.jsonl or DIR.parquet).",
    ),
]
PositionsOption = Annotated[
    Path | None,
    typer.Option(
        "--positions",
        help="With --strategy: side and equity per bar and strategy stream (FILE.jsonl or "
        "DIR.parquet).",
    ),
]
