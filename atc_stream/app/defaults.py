"""The defaults that several commands share, each stated once (options, help and jobs)."""

from __future__ import annotations

#: Bar interval of a run that neither asks for one nor can infer it.
INTERVAL = "1m"

#: Bars between periodic snapshots when ``--snapshot-every`` is not given.
SNAPSHOT_EVERY = 10_000

#: Prefix of the Redis channels and keys signals are published under.
REDIS_PREFIX = "atc"
