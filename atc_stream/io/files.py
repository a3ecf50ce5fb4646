"""Durable files: write a whole file atomically, and make a directory entry durable."""

from __future__ import annotations

import contextlib
import os
import tempfile
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
    fd, temp = tempfile.mkstemp(prefix=temp_prefix, suffix=".tmp", dir=final.parent)
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
