"""The ``atc-stream cluster`` command group: run the shard actors, ``status``, ``route``
and ``reshard`` (jobs in ``app.jobs.cluster``; docs/design/cluster.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from atc_stream.app.defaults import INTERVAL, REDIS_PREFIX
from atc_stream.app.options import (
    BackendOption,
    ParamsOption,
    RedisPrefixOption,
    SnapshotEveryOption,
    StopWhenIdleOption,
    check_optional_interval,
    redis_option,
)
from atc_stream.app.run_job import run_job
from atc_stream.core.shards import MAX_SHARDS

cluster_app = typer.Typer(
    add_completion=False,
    help="Shards on a Ray cluster: one exactly-once engine per shard stream.",
)

ClusterRedisOption = Annotated[str | None, redis_option("Redis URL holding the shard streams.")]
GroupOption = Annotated[str, typer.Option("--group", help="Consumer group of the shard streams.")]
ShardIntervalOption = Annotated[
    str | None,
    typer.Option(
        "--interval",
        help="Bar interval label of the shards' streams. Entries carry none: by default it "
        "is inferred from the spacing of the bars the shard streams hold at the start, "
        f"else {INTERVAL} (said on stderr); a shard restored from its snapshot keeps the "
        "snapshot's. Refused when the bars' spacing says otherwise.",
        callback=check_optional_interval,
    ),
]


def _need_redis(redis: str | None) -> str:
    if redis is None:
        raise typer.BadParameter("--redis URL is required", param_hint="--redis")
    return redis


@cluster_app.callback(invoke_without_command=True)
def cluster(
    ctx: typer.Context,
    shards: Annotated[
        int | None,
        typer.Option("--shards", min=1, max=MAX_SHARDS, help="Number of shards (one actor each)."),
    ] = None,
    redis: ClusterRedisOption = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            help="Ray head (HOST:PORT, ray://..., auto); default: a local Ray for the run.",
        ),
    ] = None,
    output_stream: Annotated[
        str | None,
        typer.Option("--output-stream", help="Stream that receives one entry per (stream, bar)."),
    ] = None,
    output_maxlen: Annotated[
        int, typer.Option(help="Approximate MAXLEN of the output stream.", min=1)
    ] = 1_000_000,
    group: GroupOption = "atc",
    batch_size: Annotated[int, typer.Option(help="Entries read per batch.", min=1)] = 1000,
    snapshot_every: SnapshotEveryOption = None,
    publish: Annotated[
        bool, typer.Option("--publish/--no-publish", help="Also publish signals over pub/sub.")
    ] = False,
    redis_prefix: RedisPrefixOption = REDIS_PREFIX,
    params: ParamsOption = None,
    backend: BackendOption = "auto",
    interval: ShardIntervalOption = None,
    stop_when_idle: StopWhenIdleOption = None,
) -> None:
    """Run one shard actor per shard (restarted by Ray after any crash), each applying its
    shard stream exactly once (`atc-stream cluster --shards N --redis URL`)."""
    if ctx.invoked_subcommand is not None:
        return
    if shards is None:
        raise typer.BadParameter(
            "--shards N is required to start the cluster", param_hint="--shards"
        )
    run_job(
        "cluster:run_cluster", shards=shards, redis=_need_redis(redis), ray_address=ray_address,
        redis_prefix=redis_prefix, output_stream=output_stream, output_maxlen=output_maxlen,
        group=group, batch_size=batch_size, snapshot_every=snapshot_every, publish=publish,
        backend=backend, interval=interval, params=params, stop_when_idle=stop_when_idle,
    )  # fmt: skip


@cluster_app.command("status")
def status(
    redis: ClusterRedisOption = None,
    redis_prefix: RedisPrefixOption = REDIS_PREFIX,
    group: GroupOption = "atc",
) -> None:
    """Per shard: streams, last bar time, consumer lag, restarts, backend, heartbeat age."""
    run_job(
        "cluster:cluster_status", redis=_need_redis(redis), redis_prefix=redis_prefix, group=group
    )


@cluster_app.command("route")
def route(
    input_stream: Annotated[
        str, typer.Option("--input-stream", help="Stream of bars to route (consumer group).")
    ],
    redis: ClusterRedisOption = None,
    shards: Annotated[
        int | None,
        typer.Option(
            "--shards", min=1, max=MAX_SHARDS, help="Shard count (default: the recorded one)."
        ),
    ] = None,
    redis_prefix: RedisPrefixOption = REDIS_PREFIX,
    group: Annotated[str, typer.Option("--group", help="Consumer group on the input.")] = (
        "atc-router"
    ),
    consumer: Annotated[str, typer.Option("--consumer", help="Consumer name.")] = "router-1",
    batch_size: Annotated[int, typer.Option(help="Entries moved per script.", min=1)] = 500,
    stop_when_idle: StopWhenIdleOption = None,
) -> None:
    """Move each entry of --input-stream to its shard's stream, exactly once."""
    run_job(
        "cluster:route", redis=_need_redis(redis), input_stream=input_stream, shards=shards,
        redis_prefix=redis_prefix, group=group, consumer=consumer, batch_size=batch_size,
        stop_when_idle=stop_when_idle,
    )  # fmt: skip


@cluster_app.command("reshard")
def reshard(
    to: Annotated[int, typer.Option("--to", min=1, max=MAX_SHARDS, help="The new shard count.")],
    redis: ClusterRedisOption = None,
    redis_prefix: RedisPrefixOption = REDIS_PREFIX,
) -> None:
    """With the cluster stopped and its shard streams drained: split and merge the shard
    snapshots by symbol into --to shards and record the new count (route new bars with
    the new count afterwards)."""
    run_job("cluster:reshard", redis=_need_redis(redis), to=to, redis_prefix=redis_prefix)
