"""The ``cluster`` jobs: start one shard actor per shard on Ray, show the shards' status,
route an input stream to the shard streams, reshard (docs/design/cluster.md)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from atc_stream.app.console import RunError, err, log_warnings, param_sets_option, redis_failure
from atc_stream.app.durability import TerminatedBeforeStart, check_backend, sigterm_stops_start_up
from atc_stream.app.extras import require
from atc_stream.app.ray_connect import connect
from atc_stream.app.stream_interval import StreamInterval, choose_stream_interval


def _client(redis_url: str):
    require("redis", "atc-stream cluster")
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=10, socket_connect_timeout=5)
    try:
        client.ping()
    except redis.RedisError as exc:  # no server there, or one that refuses (a bad database)
        raise redis_failure(redis_url, exc) from None
    return client


def _shard_count(client, prefix: str, shards: int | None, record: bool = True) -> int:
    """``shards`` checked against (or, with ``record``, recorded as) the cluster's count
    in Redis."""
    from atc_stream.connectors.cluster.registry import (
        ShardCountMismatch,
        claim_shards,
        recorded_shards,
    )

    if shards is None:
        have = recorded_shards(client, prefix)
        if have is None:
            raise RunError(f"no cluster under prefix {prefix!r} in Redis: give --shards N")
        return have
    try:
        return claim_shards(client, prefix, shards, record)
    except ShardCountMismatch as exc:
        raise RunError(str(exc)) from None


def connect_ray(address: str | None, shards: int) -> None:
    """Join the Ray cluster at ``address`` (None: start a local one with one logical CPU
    per shard at least, so that every actor is placed); one ``RunError`` line when it
    cannot be reached."""
    options: dict[str, Any] = {"logging_level": "WARNING"}
    if address in (None, "local"):
        options["num_cpus"] = max(os.cpu_count() or 1, shards)
    connect(address, "atc-stream cluster", **options)


def _check_startable(client, redis_url: str, prefix: str, shards: int) -> set[str]:
    """``RunError`` when the cluster already runs (a second set of actors would read the
    same shard streams beside the first, each engine missing the other's bars), or when
    a shard snapshot belongs to another layout (``layout.check_layout``); the intervals
    of the shard snapshots the actors will restore."""
    from atc_stream.connectors.cluster.layout import LayoutMismatch, check_layout
    from atc_stream.connectors.cluster.registry import RUNNING_BEAT_S, running_shard

    running = running_shard(client, prefix, shards)
    if running is not None:
        raise RunError(
            f"shard {running[0]} of the cluster under prefix {prefix!r} is running "
            f"(heartbeat {running[1]:.1f} s ago): the cluster already runs; stop it first "
            f"(a cluster just stopped or killed lets go within {RUNNING_BEAT_S:.0f} s)"
        )
    try:
        return check_layout(redis_url, shards)
    except LayoutMismatch as exc:
        raise RunError(f"cannot start {shards} shards: {exc}") from None


def _agree_with_snapshots(chosen: StreamInterval, restored: set[str]) -> StreamInterval:
    """The interval every shard labels its rows with: a restored shard keeps its
    snapshot's, so the snapshots' decides where nothing else does (no bars to infer it
    from, no ``--interval``), and one that differs from ``chosen`` is a ``RunError``
    (restored shards and fresh ones would label their rows apart)."""
    if not restored or restored == {chosen.interval}:
        return chosen
    theirs = ", ".join(sorted(restored))
    if len(restored) == 1 and chosen.origin == "default":
        return StreamInterval(theirs, "from the shard snapshots", "snapshots")
    raise RunError(
        f"the shard snapshots label their rows {theirs}, but the interval is "
        f"{chosen.interval} ({chosen.source.split(':')[0]}): restored shards would go on "
        f"with {theirs}; give --interval {theirs} to go on from the snapshots, or remove "
        f"them to start afresh at {chosen.interval}"
    )


def _shard_interval(
    client, redis_url: str, prefix: str, shards: int, interval: str | None
) -> StreamInterval:
    """``choose_stream_interval`` of the shard streams, once for every shard: entries
    carry no interval, and an actor left to its default would label the rows of hourly
    bars ``1m``. A shard restored from its snapshot keeps the snapshot's."""
    import redis as redis_lib

    from atc_stream.core.shards import bars_stream

    streams = [bars_stream(prefix, shard) for shard in range(shards)]
    named = (
        f"the shard stream {streams[0]}"
        if shards == 1
        else f"the shard streams {streams[0]} .. {streams[-1]}"
    )
    try:
        return choose_stream_interval(client, streams, interval, named=named)
    except redis_lib.RedisError as exc:  # e.g. a shard stream's key holds another type
        raise redis_failure(redis_url, exc) from None


def _connect_for_run(address: str | None, shards: int) -> None:
    """``connect_ray``, with a SIGTERM during it handled as the rest of the start-up's:
    ``ray.init`` puts in handlers of its own (one that exits with status 15, then one
    that exits with status 1), neither of which says a word."""
    ours = signal.getsignal(signal.SIGTERM)
    try:
        connect_ray(address, shards)
    except SystemExit as exc:
        if exc.code != signal.SIGTERM:
            raise
        raise TerminatedBeforeStart from None
    finally:
        signal.signal(signal.SIGTERM, ours)


@sigterm_stops_start_up
def run_cluster(
    *,
    shards: int,
    redis: str,
    ray_address: str | None,
    redis_prefix: str,
    output_stream: str | None,
    output_maxlen: int,
    group: str,
    batch_size: int,
    snapshot_every: int | None,
    publish: bool,
    backend: str,
    interval: str | None,
    params: Path | None,
    stop_when_idle: float | None,
) -> int:
    """Run one shard actor per shard until SIGINT/SIGTERM or every shard is idle for
    ``stop_when_idle`` seconds; the exit status (130 after a SIGINT, as ``run-stream``).
    The rows' interval is chosen before Ray starts (``_shard_interval``)."""
    require("ray", "atc-stream cluster")
    require("redis", "atc-stream cluster")
    from atc_stream.app.defaults import SNAPSHOT_EVERY

    log_warnings()
    check_backend(backend)
    param_sets = param_sets_option(params)
    client = _client(redis)
    lease = _take_driver_lease(redis, redis_prefix)
    try:
        return _run_cluster(
            client, lease, shards=shards, redis=redis, ray_address=ray_address,
            redis_prefix=redis_prefix, output_stream=output_stream,
            output_maxlen=output_maxlen, group=group, batch_size=batch_size,
            snapshot_every=snapshot_every or SNAPSHOT_EVERY, publish=publish,
            backend=backend, interval=interval, param_sets=param_sets,
            stop_when_idle=stop_when_idle,
        )  # fmt: skip
    finally:
        lease.release()


def _take_driver_lease(redis_url: str, prefix: str):
    """The driver's lease (``registry.driver_lease_key``), taken before any check: two
    drivers started together would both find no shard running and start two sets of
    actors on the same consumer groups. ``cluster reshard`` holds it too. Another
    holder is a ``RunError``."""
    import redis as redis_lib

    from atc_stream.connectors.cluster.registry import driver_lease_key
    from atc_stream.connectors.redis.lease import Lease, LeaseHeld

    what = f"atc-stream cluster {prefix!r} (or its reshard)"
    lease = Lease(redis_url, driver_lease_key(prefix), what=what)
    try:
        lease.acquire()
    except (LeaseHeld, redis_lib.RedisError) as exc:
        lease.release()  # not taken: only its client to close
        if isinstance(exc, LeaseHeld):
            raise RunError(str(exc)) from None
        raise redis_failure(redis_url, exc) from None
    return lease


def _run_cluster(
    client,
    lease,
    *,
    shards: int,
    redis: str,
    ray_address: str | None,
    redis_prefix: str,
    output_stream: str | None,
    output_maxlen: int,
    group: str,
    batch_size: int,
    snapshot_every: int,
    publish: bool,
    backend: str,
    interval: str | None,
    param_sets,
    stop_when_idle: float | None,
) -> int:
    """``run_cluster`` once the driver holds its lease; one that is lost stops the shards
    (each holds the lease of its own stream, so they never overlap another driver's)."""
    from atc_stream.connectors.cluster.registry import reset_starts
    from atc_stream.connectors.cluster.shard import ShardConfig

    _shard_count(client, redis_prefix, shards, record=False)  # a mismatch before Ray starts
    restored = _check_startable(client, redis, redis_prefix, shards)
    chosen = _shard_interval(client, redis, redis_prefix, shards, interval)
    chosen = _agree_with_snapshots(chosen, restored)
    _connect_for_run(ray_address, shards)
    _shard_count(client, redis_prefix, shards)  # recorded once the cluster can run
    reset_starts(client, redis_prefix, shards)
    import ray
    import redis as redis_lib

    from atc_stream.connectors.cluster.actors import gpus_available, start_shard_actors

    num_gpus = 1.0 if backend in ("auto", "cuda") and gpus_available() else 0.0
    configs = [
        ShardConfig(
            redis=redis,
            shard=shard,
            prefix=redis_prefix,
            output_stream=output_stream,
            output_maxlen=output_maxlen,
            group=group,
            batch_size=batch_size,
            snapshot_every=snapshot_every,
            publish=publish,
            backend=backend if num_gpus or backend != "auto" else "cpu",
            interval=chosen.interval,
            params=[p.to_dict() for p in param_sets or []],
        )  # fmt: skip
        for shard in range(shards)
    ]
    # Ray's start takes seconds: a driver paused past its lease meanwhile starts nothing
    lease.ensure(stopping=lambda: True)
    actors = start_shard_actors(configs, num_gpus=num_gpus)
    runs = [actor.run.remote(stop_when_idle) for actor in actors]
    where = "GPU" if num_gpus else "CPU"
    err(f"atc-stream: cluster of {shards} shards on Ray ({where} actors), prefix "
        f"{redis_prefix!r}; interval {chosen.said()}")  # fmt: skip

    stopped_by: list[int] = []

    def stop(signum, frame) -> None:
        stopped_by.append(signum)
        err(f"atc-stream: {signal.Signals(signum).name}: stopping the shards")
        for actor in actors:
            actor.stop.remote()

    def lease_lost(why: str) -> None:
        err(f"atc-stream: {why}: stopping the shards")
        for actor in actors:
            actor.stop.remote()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    lease.on_lost = lease_lost
    try:
        pending = list(runs)
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
        summaries = ray.get(runs)
    except ray.exceptions.RayError as exc:
        cause = getattr(exc, "cause", None)
        if stopped_by and isinstance(cause, (redis_lib.ConnectionError, redis_lib.TimeoutError)):
            # stopped while a batch's outputs waited for Redis, as run-stream can be: that
            # batch is in no snapshot and still in its stream, so the next start applies it
            raise redis_failure(
                redis, cause, "a shard stopped with the outputs of its last batch not "
                "written; the next start applies it again",
            ) from None  # fmt: skip
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        err(f"atc-stream: a shard failed: {first}")
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if lease.lost is not None:
        # each shard held its own lease to its last batch, so their outputs and snapshots
        # stand; what lost its lease is this driver, which another may have replaced
        raise RunError(
            f"{lease.lost}: another driver may have started; this one stopped its shards"
        )
    err("atc-stream: cluster done")
    for s in summaries:
        err(f"  shard {s['shard']}: {s['bars']} bars, {s['rows_out']} rows out "
            f"(+{s['suppressed']} suppressed replays), {s['starts'] - 1} restarts, "
            f"offset {s['offset']}, {s['backend']} backend")  # fmt: skip
        err(f"    malformed {_counts(s.get('malformed'))}; rejected bars "
            f"{_counts(s.get('rejected'))}")  # fmt: skip
        for warning in s.get("warnings") or []:
            err(f"    warning: {warning}")
    # a script tells an interrupted run from one that ended; a service manager's SIGTERM
    # is the normal way to stop a service
    return 130 if signal.SIGINT in stopped_by else 0


def _counts(by_reason: dict[str, int] | None) -> str:
    """``reason=n, ...`` in reason order, or "none"."""
    return ", ".join(f"{k}={v}" for k, v in sorted((by_reason or {}).items())) or "none"


def cluster_status(*, redis: str, redis_prefix: str, group: str) -> int:
    """Print the shard count and one line per shard."""
    require("redis", "atc-stream cluster status")
    from atc_stream.connectors.cluster.registry import recorded_shards, shard_status

    client = _client(redis)
    shards = recorded_shards(client, redis_prefix)
    if shards is None:  # (status has no --shards: the count comes from a start)
        raise RunError(
            f"no cluster under prefix {redis_prefix!r} in Redis: none was started there "
            "(`atc-stream cluster --shards N --redis URL`); another --redis-prefix?"
        )
    print(f"cluster {redis_prefix!r}: {shards} shards")
    for shard in range(shards):
        print(shard_status(client, redis_prefix, shard, group).line())
    return 0


def route(
    *,
    redis: str,
    input_stream: str,
    shards: int | None,
    redis_prefix: str,
    group: str,
    consumer: str,
    batch_size: int,
    stop_when_idle: float | None,
) -> int:
    """Move every entry of ``input_stream`` to its shard's stream, exactly once."""
    require("redis", "atc-stream cluster route")
    import redis as redis_lib

    from atc_stream.connectors.cluster.router import StreamRouter

    log_warnings()
    client = _client(redis)
    count = _shard_count(client, redis_prefix, shards)
    try:
        router = StreamRouter(
            redis, input_stream, count, prefix=redis_prefix, group=group, consumer=consumer,
            batch_size=batch_size,
        )  # fmt: skip
    except ValueError as exc:
        raise RunError(str(exc)) from None
    previous = {
        sig: signal.signal(sig, lambda signum, frame: router.stop())
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        router.prepare()
        err(f"atc-stream: routing {input_stream} to {count} shard streams")
        stats = router.run(stop_when_idle=stop_when_idle)
    except redis_lib.ResponseError as exc:
        if "CROSSSLOT" in str(exc):
            raise RunError(
                "cluster route needs the input and shard streams in one script: a "
                "standalone Redis, not a Redis Cluster (docs/design/cluster.md)"
            ) from None
        raise redis_failure(redis, exc) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    err("atc-stream: route done")
    for line in stats.lines():
        err("  " + line)
    return 0


def reshard(*, redis: str, to: int, redis_prefix: str) -> int:
    """Reshard the stopped cluster to ``to`` shards."""
    require("redis", "atc-stream cluster reshard")
    from atc_stream.connectors.cluster.reshard import ReshardRefused
    from atc_stream.connectors.cluster.reshard import reshard as run

    client = _client(redis)
    # the driver's lease: no driver starts (or runs, even before its shards beat) while
    # the snapshots and the count are rewritten
    lease = _take_driver_lease(redis, redis_prefix)
    try:
        report = run(client, redis, redis_prefix, to)
    except ReshardRefused as exc:
        raise RunError(str(exc)) from None
    finally:
        lease.release()
    err(
        f"atc-stream: resharded {report.before} -> {report.after} shards ({report.snapshots} "
        f"shard snapshots split; streams per shard {report.streams})"
    )
    return 0


def route_bars(source, *, redis: str, redis_prefix: str, shards: int) -> int:
    """Every bar of ``source`` (a ``BarFileSource``, in time order) to its shard's stream
    (``replay --route-shards``); the cluster's recorded shard count must match."""
    require("redis", "replay --route-shards")
    from atc_stream.connectors.cluster.router import Router

    client = _client(redis)
    _shard_count(client, redis_prefix, shards)
    router = Router(client, shards, prefix=redis_prefix, batch=1000)
    names = source.symbol_names
    for block in source.blocks(exclude_warm=False):
        for code, time, close in zip(
            block.codes.tolist(), block.times.tolist(), block.closes.tolist(), strict=True
        ):
            router.send({"symbol": names[code], "time": time, "close": repr(close)})
    router.flush()
    err(f"atc-stream: routed {router.routed} bars to {shards} shard streams "
        f"({router.connection_errors} Redis errors waited out)")  # fmt: skip
    return 0


def kline_router(redis: str, redis_prefix: str, shards: int):
    """A ``RouterThread`` to the cluster's shard streams (``live --route-shards``), and the
    ``on_bars`` of the live feed that hands it each applied closed kline; the cluster's
    recorded shard count must match."""
    require("redis", "live --route-shards")
    from atc_stream.connectors.cluster.router import Router, RouterThread

    client = _client(redis)
    _shard_count(client, redis_prefix, shards)
    routing = RouterThread(Router(client, shards, prefix=redis_prefix))

    def on_bars(klines) -> None:
        routing.put([
            {"symbol": k.symbol, "time": k.open_time, "open": repr(k.open),
             "high": repr(k.high), "low": repr(k.low), "close": repr(k.close)}
            for k in klines
        ])  # fmt: skip

    return routing, on_bars
