"""Snapshot blobs in Redis: one key per blob, an index and a "latest" pointer, saved by one
Lua script."""

from __future__ import annotations

import re
from typing import Any

import redis
from redis.backoff import AbstractBackoff
from redis.retry import Retry

from atc_stream.connectors.retry import DEFAULT_BACKOFF, Backoff
from atc_stream.state.snapshot_stores import (
    LoadedSnapshot,
    check_blob,
    check_keep,
    newest_good,
)

__all__ = ["RedisSnapshotStore", "policy_retry"]

#: Retries of one command before its error propagates (about 3 s on the default policy).
COMMAND_RETRIES = 5


class _PolicyBackoff(AbstractBackoff):
    """redis-py's backoff hook, answering with the delays of one ``Backoff`` policy."""

    def __init__(self, policy: Backoff) -> None:
        self.policy = policy

    def compute(self, failures: int) -> float:
        return self.policy.delay(max(failures - 1, 0))


def policy_retry(policy: Backoff, retries: int = COMMAND_RETRIES) -> Retry:
    """A redis-py ``Retry`` that waits on ``policy``'s schedule between attempts."""
    return Retry(_PolicyBackoff(policy), retries)


_SAVE_SCRIPT = """
local seq = redis.call('INCR', KEYS[1])
local id = string.format('%012d', seq)
redis.call('SET', ARGV[3] .. id, ARGV[1])
redis.call('ZADD', KEYS[2], seq, id)
redis.call('SET', KEYS[3], id)
local keep = tonumber(ARGV[2])
local n = redis.call('ZCARD', KEYS[2])
if n > keep then
  local old = redis.call('ZRANGE', KEYS[2], 0, n - keep - 1)
  for _, oid in ipairs(old) do
    redis.call('DEL', ARGV[3] .. oid)
  end
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, n - keep - 1)
end
return id
"""


def namespace_prefix(namespace: str) -> str:
    """The key prefix of the snapshots of ``namespace`` (``--namespace``; a cluster's
    shard ``shard-3``): ``atc-stream:shard-3``, wrapped in a hash tag by the store."""
    return f"atc-stream:{namespace}"


class RedisSnapshotStore:
    """Snapshots in Redis: one key per blob, an index, and a "latest" pointer.

    Keys (``T`` = the prefix wrapped in a hash tag, ``{atc-stream:default}``, so that all
    of a store's keys live in one Redis Cluster slot; a prefix that already contains
    ``{...}`` is used as is)::

        T:snapshot:seq          INCR counter: the sequence of the last snapshot
        T:snapshot:index        sorted set: id -> sequence
        T:snapshot:latest       the id of the newest snapshot
        T:snapshot:blob:<id>    the blob (id = 12-digit sequence)

    ``save`` runs one Lua script, so the blob, the index, the pointer and the pruning
    to ``keep`` blobs change together or not at all. Use one prefix per engine shard
    (``atc-stream:<namespace>``). A client made from a URL retries a failed command on
    the one backoff policy (``connectors/retry.py``); errors left then propagate as
    ``redis`` exceptions.
    """

    def __init__(self, url_or_client: Any, prefix: str = "atc-stream:default", keep: int = 5):
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"prefix must be a non-empty str, got {prefix!r}")
        self.keep = check_keep(keep)
        if isinstance(url_or_client, str):
            self.client = redis.Redis.from_url(url_or_client, retry=policy_retry(DEFAULT_BACKOFF))
        else:
            self.client = url_or_client
            pool = getattr(url_or_client, "connection_pool", None)
            if pool is not None and pool.connection_kwargs.get("decode_responses"):
                raise ValueError(
                    "url_or_client: the Redis client has decode_responses=True; snapshots "
                    "are binary, pass a client made with decode_responses=False (or a URL)"
                )
        self.prefix = prefix
        tag = prefix if re.search(r"\{[^}]+\}", prefix) else "{" + prefix + "}"
        self.seq_key = f"{tag}:snapshot:seq"
        self.index_key = f"{tag}:snapshot:index"
        self.latest_key = f"{tag}:snapshot:latest"
        self.blob_key_prefix = f"{tag}:snapshot:blob:"
        self._save = self.client.register_script(_SAVE_SCRIPT)

    def __repr__(self) -> str:
        return f"RedisSnapshotStore(prefix={self.prefix!r}, keep={self.keep})"

    def __str__(self) -> str:
        return f"Redis prefix {self.prefix!r}"

    @staticmethod
    def _str(value) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def blob_key(self, snapshot_id: str) -> str:
        return self.blob_key_prefix + snapshot_id

    def save(self, blob: bytes) -> str:
        """Store ``blob``, point "latest" at it, keep the newest ``keep``; return its id."""
        data = check_blob(blob)
        result = self._save(
            keys=[self.seq_key, self.index_key, self.latest_key],
            args=[data, self.keep, self.blob_key_prefix],
        )
        return self._str(result)

    def save_queued(self, pipe: Any, blob: bytes) -> None:
        """Queue ``save(blob)`` on a transaction ``pipe`` of this store's client, so that
        several stores (the shards of a reshard) change in one ``MULTI``/``EXEC``."""
        self._save(
            keys=[self.seq_key, self.index_key, self.latest_key],
            args=[check_blob(blob), self.keep, self.blob_key_prefix],
            client=pipe,
        )

    def list(self) -> list[str]:
        """Snapshot ids, oldest first."""
        return [self._str(i) for i in self.client.zrange(self.index_key, 0, -1)]

    def load(self, snapshot_id: str) -> bytes | None:
        """The stored bytes of one snapshot (not verified); None if there is no such blob."""
        blob = self.client.get(self.blob_key(snapshot_id))
        if blob is None or isinstance(blob, bytes):
            return blob
        # __init__ refuses a decode_responses client, so text means one was swapped in
        raise TypeError(f"snapshot {snapshot_id!r}: the Redis client answered text, not bytes")

    def delete(self, snapshot_id: str) -> None:
        with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(self.blob_key(snapshot_id))
            pipe.zrem(self.index_key, snapshot_id)
            pipe.execute()

    def latest(self) -> LoadedSnapshot | None:
        """The newest snapshot that verifies (the pointer first, then older ones), or None."""
        pointer = self.client.get(self.latest_key)
        ids = [self._str(i) for i in self.client.zrevrange(self.index_key, 0, -1)]
        if pointer is not None:
            pointer = self._str(pointer)
            ids = [pointer] + [i for i in ids if i != pointer]
        return newest_good(f"redis {self.prefix!r}", ids, self.load)

    def load_latest(self) -> bytes | None:
        """The blob of ``latest()``; None when the store holds no snapshot."""
        found = self.latest()
        return None if found is None else found.blob
