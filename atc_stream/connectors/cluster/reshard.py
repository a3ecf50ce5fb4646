"""Resharding a stopped cluster from N to M shards: the shard snapshots split by symbol and
merged into M new ones that resume at the end of the new shard streams."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from atc_stream.connectors.cluster.registry import (
    cluster_key,
    heartbeat_key,
    last_entry_id,
    recorded_shards,
    running_shard,
    undelivered,
)
from atc_stream.connectors.cluster.shard import shard_store
from atc_stream.connectors.redis.streams import source_key
from atc_stream.core.shards import bars_stream, check_shards, shard_of
from atc_stream.state.snapshot import read_header
from atc_stream.state.snapshot_parts import merge_snapshots, split_snapshot


class ReshardRefused(ValueError):
    """The cluster cannot be resharded now; the message says what to do."""


@dataclass
class ReshardReport:
    """What a reshard did."""

    before: int
    after: int
    streams: list[int]  #: streams per new shard
    snapshots: int  #: old shard snapshots read


def reshard(client: redis.Redis, redis_url: str, prefix: str, to: int) -> ReshardReport:
    """Reshard the stopped cluster under ``prefix`` to ``to`` shards.

    Refused (``ReshardRefused``) when no cluster is recorded, a shard still runs, or a
    shard stream holds entries after its shard's newest snapshot (drain first: start
    the cluster with ``--stop-when-idle``). The new shard snapshots and the new count
    are written in one ``MULTI``/``EXEC`` (a standalone Redis): all or nothing.
    """
    check_shards(to)
    before = recorded_shards(client, prefix)
    if before is None:
        raise ReshardRefused(f"no cluster under prefix {prefix!r} in Redis")
    running = running_shard(client, prefix, before)
    if running is not None:
        raise ReshardRefused(
            f"shard {running[0]} is running (heartbeat {running[1]:.1f} s ago): stop the "
            "cluster before resharding"
        )
    parts: list[list[bytes]] = []
    for shard in range(before):
        stream = bars_stream(prefix, shard)
        found = shard_store(redis_url, shard).latest()
        offset = "0-0"
        if found is not None:
            offset = str(read_header(found.blob).source_offsets.get(source_key(stream), "0-0"))
        left = undelivered(client, stream, offset)
        if left:
            raise ReshardRefused(
                f"shard {shard} has {left} entries of {stream} after its newest snapshot "
                f"(entry {offset}): drain them first with `atc-stream cluster --shards "
                f"{before} --redis URL --stop-when-idle 5`, then reshard"
            )
        if found is not None:
            parts.append(split_snapshot(found.blob, lambda s: shard_of(s, to), to))
    streams: list[int] = [0] * to
    with client.pipeline(transaction=True) as pipe:
        if parts:
            for shard in range(to):
                stream = bars_stream(prefix, shard)
                offsets = {source_key(stream): last_entry_id(client, stream)}
                blob = merge_snapshots([p[shard] for p in parts], source_offsets=offsets)
                streams[shard] = len(read_header(blob).streams)
                shard_store(redis_url, shard).save_queued(pipe, blob)
        pipe.hset(cluster_key(prefix), mapping={"shards": to, "resharded_ms": _now_ms()})
        for shard in range(to, before):  # gone shards: no heartbeat left to mislead status
            pipe.delete(heartbeat_key(prefix, shard))
        pipe.execute()
    return ReshardReport(before=before, after=to, streams=streams, snapshots=len(parts))


def _now_ms() -> int:
    return int(time.time() * 1000)
