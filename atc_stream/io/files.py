"""Durable files: write a whole file atomically, and make a directory entry durable."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def fsync_dir(path: Path) -> None:
    """Make a rename or new file in ``path`` durable (fsync of the directory entry)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # e.g. Windows: directories cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(final: Path, temp_prefix: str) -> Iterator[BinaryIO]:
    """A binary file that appears at ``final`` complete or not at all.

    What is written goes to a temporary file ``<temp_prefix>*.tmp`` beside ``final``; on a
    clean exit it is fsynced, renamed over ``final`` and the directory fsynced. On an
    error the temporary file is removed; a crash can leave one behind, so callers delete
    stale ``<temp_prefix>*.tmp`` files when they open the directory.
    """
    fd, temp = _new_temp(final.parent, temp_prefix)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    fsync_dir(final.parent)


def _new_temp(directory: Path, prefix: str) -> tuple[int, str]:
    """A new file ``<prefix>*.tmp`` in ``directory`` open for writing, with the mode a plain
    ``open`` gives (0o666 less the umask): ``mkstemp``'s 0o600 would make every file
    written this way readable by its owner only, unlike the other outputs beside it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        temp = os.path.join(directory, f"{prefix}{secrets.token_hex(8)}.tmp")
        try:
            return os.open(temp, flags, 0o666), temp
        except FileExistsError:  # another writer's name: draw again
            continue
