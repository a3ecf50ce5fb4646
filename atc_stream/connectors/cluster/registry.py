"""The Redis record of a cluster: its shard count, each shard's heartbeat, status lines."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from atc_stream.connectors.redis.stream_output import parse_id
from atc_stream.core.shards import bars_stream, check_shards, shard_tag


def cluster_key(prefix: str) -> str:
    """The hash of the cluster's layout: ``atc:cluster`` (field ``shards``)."""
    return f"{prefix}:cluster"


def heartbeat_key(prefix: str, shard: int) -> str:
    """A shard's heartbeat hash: ``atc:cluster:shard:{shard-3}``."""
    return f"{prefix}:cluster:shard:{shard_tag(shard)}"


def driver_lease_key(prefix: str) -> str:
    """The lease of the cluster's driver (``atc-stream cluster``): ``atc:cluster:lease``."""
    return f"{prefix}:cluster:lease"


def mark_key(prefix: str, shard: int) -> str:
    """A shard's output mark (the ``src`` of its last written batch), in its slot."""
    return f"{prefix}:cluster:mark:{shard_tag(shard)}"


class ShardCountMismatch(ValueError):
    """The cluster in Redis has another shard count than the one asked for."""


def recorded_shards(client: redis.Redis, prefix: str) -> int | None:
    """The shard count recorded in Redis; None for a cluster never started."""
    value = client.hget(cluster_key(prefix), "shards")
    return None if value is None else int(value)


def claim_shards(client: redis.Redis, prefix: str, shards: int, record: bool = True) -> int:
    """Record ``shards`` for a new cluster (``record``; else only check, so that a cluster
    that never started records nothing), or check it against the recorded count
    (``ShardCountMismatch`` naming how to reshard); the count."""
    check_shards(shards)
    if record:
        client.hsetnx(cluster_key(prefix), "shards", shards)
    have = recorded_shards(client, prefix)
    if have is not None and have != shards:
        raise ShardCountMismatch(
            f"the cluster under prefix {prefix!r} has {have} shards, not {shards}: start it "
            f"with --shards {have}, or stop it and run `atc-stream cluster reshard --to "
            f"{shards}` first"
        )
    return shards


#: A shard whose heartbeat says "starting" or "running" and is younger than this runs (an
#: actor beats every second; one killed with its driver stops beating at once).
RUNNING_BEAT_S = 10.0


def running_shard(
    client: redis.Redis, prefix: str, shards: int, now_ms: int | None = None
) -> tuple[int, float] | None:
    """The first shard of ``0 .. shards-1`` whose actor runs (a fresh heartbeat saying
    ``starting`` or ``running``) and its heartbeat's age in seconds; None when none runs."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    for shard in range(shards):
        state, beat_ms = (
            None if v is None else _text(v)
            for v in client.hmget(heartbeat_key(prefix, shard), ["state", "heartbeat_ms"])
        )
        if state in ("starting", "running") and beat_ms and beat_ms.isdigit():
            age_ms = now_ms - int(beat_ms)
            if age_ms < RUNNING_BEAT_S * 1000:
                return shard, max(age_ms, 0) / 1000
    return None


def reset_starts(client: redis.Redis, prefix: str, shards: int) -> None:
    """A new run of the cluster: its shards' ``starts`` from zero, so that ``restarts``
    counts the actors Ray restarted in this run, not the runs before it."""
    with client.pipeline(transaction=True) as pipe:
        for shard in range(shards):
            pipe.hset(heartbeat_key(prefix, shard), "starts", 0)
        pipe.execute()


def record_start(client: redis.Redis, prefix: str, shard: int, fields: dict[str, Any]) -> int:
    """A shard actor starts: count it (``starts``) and record ``fields`` in one
    transaction, so that no reader sees the new count beside the previous actor's state
    and pid; the count."""
    key = heartbeat_key(prefix, shard)
    pipe = client.pipeline(transaction=True)
    pipe.hincrby(key, "starts", 1)
    pipe.hset(key, mapping=_beat_values(fields))
    starts, _ = pipe.execute()
    return int(starts)


def beat(client: redis.Redis, prefix: str, shard: int, fields: dict[str, Any]) -> None:
    """Write a shard's heartbeat (``heartbeat_ms`` = now) with ``fields``."""
    client.hset(heartbeat_key(prefix, shard), mapping=_beat_values(fields))


def _beat_values(fields: dict[str, Any]) -> dict[Any, Any]:
    values: dict[Any, Any] = {k: ("" if v is None else v) for k, v in fields.items()}
    values["heartbeat_ms"] = int(time.time() * 1000)
    return values


@dataclass
class ShardStatus:
    """What ``cluster status`` shows of one shard."""

    shard: int
    streams: int | None
    last_bar_time: int | None
    lag: int | None
    restarts: int
    backend: str
    node: str
    heartbeat_age_s: float | None
    state: str = ""  #: starting, running or stopped (as its actor last said)

    def line(self) -> str:
        def text(value: Any) -> str:
            return "-" if value is None else str(value)

        age = "-" if self.heartbeat_age_s is None else f"{self.heartbeat_age_s:.1f}s"
        return (
            f"shard {self.shard:<3} streams {text(self.streams):<6} last bar "
            f"{text(self.last_bar_time):<14} lag {text(self.lag):<6} restarts "
            f"{self.restarts:<3} backend {self.backend or '-':<5} {self.state or '-':<8} "
            f"heartbeat {age} node {self.node[:12] or '-'}"
        )


def stream_lag(client: redis.Redis, stream: str, group: str) -> int | None:
    """Entries of ``stream`` not yet delivered to ``group``: the group's ``lag`` (Redis 7),
    else the entries after its last delivered ID; None without the group."""
    try:
        groups = client.xinfo_groups(stream)
    except redis.ResponseError:  # no such stream
        return None
    for info in groups:
        name = info.get("name")
        if (name.decode() if isinstance(name, bytes) else name) != group:
            continue
        lag = info.get("lag")
        if lag is not None:
            return int(lag)
        last = info.get("last-delivered-id")
        return len(client.xrange(stream, f"({_text(last)}", "+") or [])
    return None


def shard_status(
    client: redis.Redis, prefix: str, shard: int, group: str = "atc", now_ms: int | None = None
) -> ShardStatus:
    """One shard's status from its heartbeat hash and its stream's consumer group."""
    raw = {_text(k): _text(v) for k, v in client.hgetall(heartbeat_key(prefix, shard)).items()}
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms

    def number(name: str) -> int | None:
        value = raw.get(name, "")
        return int(value) if value.lstrip("-").isdigit() else None

    beat_ms = number("heartbeat_ms")
    return ShardStatus(
        shard=shard,
        streams=number("streams"),
        last_bar_time=number("last_bar_time"),
        lag=stream_lag(client, bars_stream(prefix, shard), group),
        restarts=max((number("starts") or 0) - 1, 0),
        backend=raw.get("backend", ""),
        node=raw.get("node", ""),
        heartbeat_age_s=None if beat_ms is None else max(now_ms - beat_ms, 0) / 1000,
        state=raw.get("state", ""),
    )


def last_entry_id(client: redis.Redis, stream: str) -> str:
    """The ID of the last entry ever added to ``stream`` (``0-0`` for none)."""
    try:
        info = client.xinfo_stream(stream)
    except redis.ResponseError:
        return "0-0"
    last = info.get("last-generated-id")
    return "0-0" if last is None else _text(last)


def undelivered(client: redis.Redis, stream: str, after: str) -> int:
    """How many entries of ``stream`` come after entry ``after``."""
    if parse_id(last_entry_id(client, stream)) <= parse_id(after):
        return 0
    return len(client.xrange(stream, f"({after}", "+") or [])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
