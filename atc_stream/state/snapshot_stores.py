"""Snapshot blobs in a local directory, and the protocol every snapshot store follows
(docs/design/snapshots.md)."""

from __future__ import annotations

import logging
import os
import re
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

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
    "SnapshotStore",
    "check_blob",
    "check_keep",
    "newest_good",
]


@dataclass(frozen=True)
class LoadedSnapshot:
    """A snapshot read back from a store and fully verified."""

    id: str
    blob: bytes
    header: SnapshotHeader
    #: the verified arrays and header (``Engine.restore`` takes it: no second decode)
    decoded: Snapshot | None = None


class SnapshotStore(Protocol):
    """What the snapshotter and the durability layer need of a store."""

    keep: int

    def save(self, blob: bytes) -> str: ...
    def list(self) -> list[str]: ...
    def load(self, snapshot_id: str) -> bytes | None: ...
    def delete(self, snapshot_id: str) -> None: ...
    def latest(self) -> LoadedSnapshot | None: ...
    def load_latest(self) -> bytes | None: ...


def check_keep(keep: int) -> int:
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an int >= 1, got {keep!r}")
    return keep


def check_blob(blob) -> bytes:
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise ValueError(f"blob must be bytes, got {type(blob).__name__}")
    read_header(blob)  # refuse anything that is not a snapshot (cheap: header only)
    return bytes(blob)


def newest_good(store_name: str, candidates, read) -> LoadedSnapshot | None:
    """The first candidate id (newest first) whose blob verifies; warn about each skipped one."""
    refused: list[str] = []
    candidates = list(candidates)
    for position, snapshot_id in enumerate(candidates, 1):
        try:
            blob = read(snapshot_id)
            if blob is None:
                raise SnapshotError("the blob is missing")
            decoded = decode_snapshot(blob)
            header = decoded.header
        except (SnapshotError, OSError) as exc:
            refused.append(f"{snapshot_id}: {exc}")
            older = position < len(candidates)
            then = "trying the previous one" if older else "none is older"
            message = f"snapshot {snapshot_id} in {store_name} is damaged and was skipped ({exc})"
            if older:  # else the SnapshotError below says it, with every refusal
                log.warning("%s; %s", message, then)
            warnings.warn(f"{message}; {then}", SnapshotWarning, stacklevel=3)
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
        self.keep = check_keep(keep)
        self.prefix = prefix
        self.path.mkdir(parents=True, exist_ok=True)
        self._pattern = re.compile(rf"{re.escape(prefix)}-(\d{{12,}})-[0-9TZ.]+{self.SUFFIX}")
        self._last_seq = 0
        self._remove_stale_temp_files()

    def __repr__(self) -> str:
        return f"DirectorySnapshotStore({str(self.path)!r}, keep={self.keep})"

    def __str__(self) -> str:
        return f"snapshot directory {str(self.path)!r}"

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
        data = check_blob(blob)
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
        return newest_good(str(self.path), reversed(self.list()), self.load)

    def load_latest(self) -> bytes | None:
        """The blob of ``latest()``; None when the directory holds no snapshot."""
        found = self.latest()
        return None if found is None else found.blob


# -- Redis ------------------------------------------------------------------------------

# KEYS: seq counter, index (sorted set id -> seq), latest pointer.
# ARGV: blob, keep, blob key prefix.  Atomic: counter, blob, index, pointer and pruning.
