"""Per-shard snapshots of a warmed-up engine (``replay --shard-snapshots N --snapshot-to
TARGET``): the streams of each shard's symbols, saved under the shard's namespace, where
the live shards of a cluster start from (docs/design/resharding-and-sweeps.md)."""

from __future__ import annotations

import os
from typing import Any

from atc_stream.app.console import OptionError, RunError, redis_failure, shown_url
from atc_stream.app.durability import is_redis_target, open_snapshot_store
from atc_stream.app.extras import require
from atc_stream.connectors.cluster.layout import BACKFILL_SOURCE
from atc_stream.core.shards import shard_namespace, shard_of
from atc_stream.state.snapshot import SnapshotError


def check_shard_options(shards: int | None, target: str | None) -> None:
    """``OptionError`` unless ``--shard-snapshots`` and ``--snapshot-to`` come together
    (the option itself bounds the count: 1 to ``MAX_SHARDS``)."""
    if (shards is None) != (target is None):
        given, missing = (
            ("--shard-snapshots", "--snapshot-to") if target is None
            else ("--snapshot-to", "--shard-snapshots")
        )  # fmt: skip
        raise OptionError(f"{given} needs {missing}", missing)
    if target is not None:
        _probe(target)


def _probe(target: str) -> None:
    """``RunError`` now, before a backfill that may take hours, unless ``target`` can take
    snapshots: a Redis that answers, a directory that can be made and written."""
    try:
        store = open_snapshot_store(target, namespace=shard_namespace(0))
        store.list()  # a round trip to a Redis target
    except _store_errors(target) as exc:
        raise _unusable(target, shard_namespace(0), exc) from None
    path = getattr(store, "path", None)
    if path is not None and not os.access(path, os.W_OK | os.X_OK):
        raise RunError(f"cannot write snapshots in {target}: permission denied")


def write_shard_snapshots(engine: Any, shards: int, target: str, source: str) -> list[str]:
    """One snapshot per shard ``0 .. shards - 1`` (``core.shards.shard_of``) of the streams
    of its symbols, saved in ``target`` (a directory or a Redis URL) under the shard's
    namespace (``shard_namespace``); a shard without symbols gets an empty snapshot, so
    every shard finds one. Their offsets add ``{"backfill": {"input", "shards", "shard"}}``
    to the engine's. The lines to report, one per shard."""
    by_shard: list[list[str]] = [[] for _ in range(shards)]
    for symbol in engine.symbols:
        by_shard[shard_of(symbol, shards)].append(symbol)
    lines = []
    for shard, symbols in enumerate(by_shard):
        offsets = {BACKFILL_SOURCE: {"input": source, "shards": shards, "shard": shard}}
        blob = engine.export_streams(symbols, source_offsets=offsets)
        namespace = shard_namespace(shard)
        try:
            store = open_snapshot_store(target, namespace=namespace)
            snapshot_id = store.save(blob)
        except _store_errors(target) as exc:
            raise _unusable(target, namespace, exc) from None
        lines.append(f"{namespace}: {len(symbols)} symbols, snapshot {snapshot_id}")
    return lines


def _store_errors(target: str) -> tuple[type[BaseException], ...]:
    """What saving in ``target`` can raise: a Redis target's ``redis`` errors too (which
    are not ``OSError``s)."""
    if not is_redis_target(target):
        return (OSError, SnapshotError)
    require("redis", "a Redis snapshot store")
    import redis

    return (OSError, SnapshotError, redis.RedisError)


def _unusable(target: str, namespace: str, exc: BaseException) -> RunError:
    """The one line of a store that cannot take the snapshot of ``namespace``."""
    doing = f"saving the snapshot of {namespace}"
    if isinstance(exc, (OSError, SnapshotError)):  # (redis errors are neither)
        return RunError(f"cannot save the snapshot of {namespace} in {shown_url(target)}: {exc}")
    return redis_failure(target, exc, doing)
