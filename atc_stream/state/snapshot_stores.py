"""Where snapshot blobs are kept: a local directory (default) or Redis.

Both stores have the same small API::

    id = store.save(blob)        # write durably/atomically, keep the last ``keep``
    blob = store.load_latest()   # newest blob that fully verifies, or None if empty
    info = store.latest()        # the same as LoadedSnapshot(id, blob, header), or None
    store.list()                 # ids, oldest first
    store.load(id), store.delete(id)

``latest()`` verifies each candidate completely (``snapshot.decode_snapshot``); when
the newest is damaged it warns (``SnapshotWarning`` through ``warnings.warn`` and a
log record) and falls back to the next older one. If snapshots exist but none
verifies it raises ``SnapshotError`` listing why each was refused.

``open_snapshot_store(target)`` picks the store from a CLI-style target: a
``redis://``, ``rediss://`` or ``unix://`` URL, or a directory path.

Redis is imported lazily, only by ``RedisSnapshotStore``.
"""

from __future__ import annotations

import logging
import os
import re
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from atc_stream.io.files import atomic_file
from atc_stream.state.snapshot import (
    Snapshot,
    SnapshotError,
    SnapshotHeader,
    SnapshotWarning,
    decode_snapshot,
    read_header,
)

log = logging.getLogger("atc_stream.snapshots")

__all__ = [
    "DirectorySnapshotStore",
    "LoadedSnapshot",
    "RedisSnapshotStore",
    "open_snapshot_store",
]


@dataclass(frozen=True)
class LoadedSnapshot:
    """A snapshot read back from a store and fully verified."""

    id: str
    blob: bytes
    header: SnapshotHeader
    #: the verified arrays and header (``Engine.restore`` takes it: no second decode)
    decoded: Snapshot | None = None


def _check_keep(keep: int) -> int:
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an int >= 1, got {keep!r}")
    return keep


def _check_blob(blob) -> bytes:
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise ValueError(f"blob must be bytes, got {type(blob).__name__}")
    read_header(blob)  # refuse anything that is not a snapshot (cheap: header only)
    return bytes(blob)


def _newest_good(store_name: str, candidates, read) -> LoadedSnapshot | None:
    """The first candidate id (newest first) whose blob verifies; warn about each skipped one."""
    refused: list[str] = []
    for snapshot_id in candidates:
        try:
            blob = read(snapshot_id)
            if blob is None:
                raise SnapshotError("the blob is missing")
            decoded = decode_snapshot(blob)
            header = decoded.header
        except (SnapshotError, OSError) as exc:
            refused.append(f"{snapshot_id}: {exc}")
            message = (
                f"snapshot {snapshot_id} in {store_name} is damaged and was skipped ({exc}); "
                "falling back to the previous one"
            )
            log.warning("%s", message)
            warnings.warn(message, SnapshotWarning, stacklevel=3)
            continue
        if refused:
            log.warning("restoring from older snapshot %s in %s", snapshot_id, store_name)
        return LoadedSnapshot(snapshot_id, bytes(blob), header, decoded)
    if refused:
        raise SnapshotError(
            f"no snapshot in {store_name} verifies: " + "; ".join(reversed(refused))
        )
    return None


# -- directory --------------------------------------------------------------------------


class DirectorySnapshotStore:
    """Snapshots as files in one directory, written atomically, the newest ``keep`` kept.

    File names are ``<prefix>-<sequence, 12 digits>-<UTC time>.atcsnap``: they sort by
    sequence, and the id of a snapshot is its file name without the suffix. Writing goes
    to a temporary file in the same directory, which is fsynced, renamed over the final
    name with ``os.replace`` (atomic), and then the directory is fsynced: a crash leaves
    either the complete new file or none (at worst a ``.<prefix>-*.tmp`` file, removed
    when a store is next opened on the directory if it is over an hour old).

    One writer per directory and prefix (each shard uses its own).
    """

    SUFFIX = ".atcsnap"
    STALE_TEMP_SECONDS = 3600.0

    def __init__(
        self, path: str | os.PathLike[str], keep: int = 5, *, prefix: str = "snapshot"
    ) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", prefix) or prefix.startswith("."):
            raise ValueError(f"prefix must be a plain file-name stem, got {prefix!r}")
        self.path = Path(path)
        self.keep = _check_keep(keep)
        self.prefix = prefix
        self.path.mkdir(parents=True, exist_ok=True)
        self._pattern = re.compile(rf"{re.escape(prefix)}-(\d{{12,}})-[0-9TZ.]+{self.SUFFIX}")
        self._last_seq = 0
        self._remove_stale_temp_files()

    def __repr__(self) -> str:
        return f"DirectorySnapshotStore({str(self.path)!r}, keep={self.keep})"

    def _temp_prefix(self) -> str:
        return f".{self.prefix}-"

    def _remove_stale_temp_files(self) -> None:
        now = time.time()
        for p in self.path.glob(f"{self._temp_prefix()}*.tmp"):
            try:
                if now - p.stat().st_mtime > self.STALE_TEMP_SECONDS:
                    p.unlink()
            except OSError:
                pass

    def _entries(self) -> list[tuple[int, str]]:
        out = []
        for name in os.listdir(self.path):
            m = self._pattern.fullmatch(name)
            if m:
                out.append((int(m.group(1)), name[: -len(self.SUFFIX)]))
        out.sort()
        return out

    def list(self) -> list[str]:
        """Snapshot ids, oldest first."""
        return [snapshot_id for _, snapshot_id in self._entries()]

    def file_of(self, snapshot_id: str) -> Path:
        if not self._pattern.fullmatch(snapshot_id + self.SUFFIX):
            raise ValueError(f"not a snapshot id of this store: {snapshot_id!r}")
        return self.path / (snapshot_id + self.SUFFIX)

    def save(self, blob: bytes) -> str:
        """Write ``blob`` durably and atomically, keep the newest ``keep``; return its id."""
        data = _check_blob(blob)
        entries = self._entries()
        seq = max([self._last_seq, *(s for s, _ in entries)]) + 1
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        snapshot_id = f"{self.prefix}-{seq:012d}-{stamp}"
        final = self.path / (snapshot_id + self.SUFFIX)
        with atomic_file(final, self._temp_prefix()) as f:
            f.write(data)
        self._last_seq = seq
        self._prune()
        return snapshot_id

    def _prune(self) -> None:
        entries = self._entries()
        for _, old in entries[: max(len(entries) - self.keep, 0)]:
            try:
                os.unlink(self.file_of(old))
            except FileNotFoundError:
                pass

    def load(self, snapshot_id: str) -> bytes:
        """The stored bytes of one snapshot (not verified)."""
        return self.file_of(snapshot_id).read_bytes()

    def delete(self, snapshot_id: str) -> None:
        self.file_of(snapshot_id).unlink(missing_ok=True)

    def latest(self) -> LoadedSnapshot | None:
        """The newest snapshot that verifies (older ones when newer are damaged), or None."""
        return _newest_good(str(self.path), reversed(self.list()), self.load)

    def load_latest(self) -> bytes | None:
        """The blob of ``latest()``; None when the directory holds no snapshot."""
        found = self.latest()
        return None if found is None else found.blob


# -- Redis ------------------------------------------------------------------------------

# KEYS: seq counter, index (sorted set id -> seq), latest pointer.
# ARGV: blob, keep, blob key prefix.  Atomic: counter, blob, index, pointer and pruning.
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
    (``atc-stream:<namespace>``). Connection errors propagate as ``redis`` exceptions.
    """

    def __init__(self, url_or_client: Any, prefix: str = "atc-stream:default", keep: int = 5):
        import redis

        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"prefix must be a non-empty str, got {prefix!r}")
        self.keep = _check_keep(keep)
        if isinstance(url_or_client, str):
            self.client = redis.Redis.from_url(url_or_client)
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

    @staticmethod
    def _str(value) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def blob_key(self, snapshot_id: str) -> str:
        return self.blob_key_prefix + snapshot_id

    def save(self, blob: bytes) -> str:
        """Store ``blob``, point "latest" at it, keep the newest ``keep``; return its id."""
        data = _check_blob(blob)
        result = self._save(
            keys=[self.seq_key, self.index_key, self.latest_key],
            args=[data, self.keep, self.blob_key_prefix],
        )
        return self._str(result)

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
        return _newest_good(f"redis {self.prefix!r}", ids, self.load)

    def load_latest(self) -> bytes | None:
        """The blob of ``latest()``; None when the store holds no snapshot."""
        found = self.latest()
        return None if found is None else found.blob


def open_snapshot_store(
    target: str | os.PathLike[str], *, keep: int = 5, namespace: str = "default"
) -> DirectorySnapshotStore | RedisSnapshotStore:
    """A store for a CLI-style ``target``.

    A ``redis://``, ``rediss://`` or ``unix://`` URL gives a ``RedisSnapshotStore`` with
    key prefix ``atc-stream:<namespace>``; anything else is a directory path and gives a
    ``DirectorySnapshotStore`` with file prefix ``snapshot`` (``snapshot-<namespace>``
    for a namespace other than "default", so shards may share a directory).
    """
    text = os.fspath(target)
    if re.match(r"(redis|rediss|unix)://", text):
        return RedisSnapshotStore(text, prefix=f"atc-stream:{namespace}", keep=keep)
    prefix = "snapshot" if namespace == "default" else f"snapshot-{namespace}"
    return DirectorySnapshotStore(text, keep=keep, prefix=prefix)
