"""A CSV file's header line, checked before pyarrow reads the file: UTF-8 text, and no
column the reader needs named twice."""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from atc_stream.core.errors import InputError

#: Bytes of a file read for its header line (a longer header is checked for its encoding
#: only, as far as this goes)
HEADER_BYTES = 1 << 20

#: Byte order marks of the encodings a CSV file is refused in, by name.
_FOREIGN_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16"),
)  # fmt: skip


def check_header(path: Path, columns: Iterable[str] = ()) -> None:
    """``InputError`` for a CSV file whose header line is not UTF-8 text (a UTF-16 or
    UTF-32 file is named as such: pyarrow would fail on it with a raw decode error), or
    names one of ``columns`` more than once (pyarrow would read the first of them without
    a word, and a joined file's second ``close`` may be the one meant)."""
    try:
        with open(path, "rb") as f:
            start = f.read(HEADER_BYTES)
    except OSError as exc:
        raise InputError(f"{path}: cannot read CSV: {exc.strerror or exc}") from None
    for bom, name in _FOREIGN_BOMS:
        if start.startswith(bom):
            raise InputError(f"{path}: the file is {name} text; save it as UTF-8")
    header, newline, _ = start.partition(b"\n")
    if b"\x00" in header:  # UTF-16 without a byte order mark: every other byte is NUL
        raise InputError(f"{path}: the header holds NUL bytes (UTF-16?); save it as UTF-8")
    try:
        text = header.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        if exc.start < len(header) - 3:  # not a character cut by the read size
            raise InputError(
                f"{path}: the header line is not UTF-8 (byte 0x{header[exc.start]:02x} at "
                f"offset {exc.start}); save the file as UTF-8"
            ) from None
        return
    if not newline:  # a header longer than the read: its names are not all here
        return
    try:
        names = Counter(next(csv.reader([text.rstrip("\r")]), []))
    except csv.Error:  # pyarrow reports a header it cannot parse itself
        return
    for name in dict.fromkeys(columns):
        if names[name] > 1:
            raise InputError(
                f"{path.name}: the header names column {name!r} {names[name]} times; "
                "rename or drop all but the one to read"
            )
