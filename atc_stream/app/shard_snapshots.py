"""Per-shard snapshots of a warmed-up engine (``replay --shard-snapshots N --snapshot-to
TARGET``): the streams of each shard's symbols, saved under the shard's namespace, where
the live shards of a cluster start from (docs/design/resharding-and-sweeps.md)."""

from __future__ import annotations

from typing import Any

from atc_stream.app.console import OptionError, RunError
from atc_stream.app.durability import open_snapshot_store
from atc_stream.core.shards import shard_namespace, shard_of
from atc_stream.state.snapshot import SnapshotError

#: Name of the backfill's entry in each shard snapshot's source offsets.
BACKFILL_SOURCE = "backfill"


def check_shard_options(shards: int | None, target: str | None) -> None:
    """``OptionError`` unless ``--shard-snapshots`` and ``--snapshot-to`` come together
    (the option itself bounds the count: 1 to ``MAX_SHARDS``)."""
    if (shards is None) != (target is None):
        given, missing = (
            ("--shard-snapshots", "--snapshot-to") if target is None
            else ("--snapshot-to", "--shard-snapshots")
        )  # fmt: skip
        raise OptionError(f"{given} needs {missing}", missing)


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
        except (OSError, SnapshotError, ConnectionError) as exc:
            raise RunError(f"cannot save the snapshot of {namespace} in {target}: {exc}") from None
        lines.append(f"{namespace}: {len(symbols)} symbols, snapshot {snapshot_id}")
    return lines
