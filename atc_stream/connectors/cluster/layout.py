"""Whether the shard snapshots fit a layout of N shards (docs/design/cluster.md).

A shard restores only its own namespace: a backfill written for another count, or
streams of symbols that another shard owns, would leave some symbols' history out
(their next bars applied to fresh state) without a word, so a start is refused."""

from __future__ import annotations

import warnings
from typing import Any

from atc_stream.core.shards import shard_namespace, shard_of

#: Name of a backfill's entry in each shard snapshot's source offsets
#: (``replay --shard-snapshots``): ``{"input", "shards", "shard"}``.
BACKFILL_SOURCE = "backfill"


class LayoutMismatch(ValueError):
    """A shard snapshot was written for another shard layout; the message says what to do."""


def layout_problem(header: Any, shard: int, shards: int) -> str | None:
    """Why the snapshot with ``header`` (a ``SnapshotHeader``) cannot be shard ``shard``
    of ``shards``; None when it can."""
    namespace = shard_namespace(shard)
    backfill = header.source_offsets.get(BACKFILL_SOURCE)
    if isinstance(backfill, dict) and (backfill.get("shards"), backfill.get("shard")) != (
        shards,
        shard,
    ):
        return (
            f"the newest snapshot of {namespace} is the backfill of shard "
            f"{backfill.get('shard')} of {backfill.get('shards')} (replay --shard-snapshots "
            f"{backfill.get('shards')}), not of shard {shard} of {shards}: write the backfill "
            f"again with --shard-snapshots {shards}"
        )
    for entry in header.streams:
        owner = shard_of(entry.symbol, shards)
        if owner != shard:
            return (
                f"the newest snapshot of {namespace} holds {entry.symbol!r}, which shard "
                f"{owner} of {shards} owns: its snapshots were written for another shard "
                "count (restore the matching count, or write them again for this one)"
            )
    return None


def check_layout(redis_url: str, shards: int) -> set[str]:
    """``LayoutMismatch`` unless the newest good snapshot of every shard ``0 .. shards-1``
    (where its actor will resume) belongs to that shard of ``shards``; the intervals of
    those snapshots (a restored shard keeps its snapshot's)."""
    # here, not at the top: replay --shard-snapshots imports BACKFILL_SOURCE without redis
    from atc_stream.connectors.cluster.shard import shard_store

    intervals = set()
    for shard in range(shards):
        with warnings.catch_warnings():  # a damaged newest one: the shard itself says so
            warnings.simplefilter("ignore")
            found = shard_store(redis_url, shard).latest()
        if found is None:
            continue
        why = layout_problem(found.header, shard, shards)
        if why is not None:
            raise LayoutMismatch(why)
        intervals.add(found.header.interval)
    return intervals
