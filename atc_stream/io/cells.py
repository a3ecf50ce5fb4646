"""The cells of a bar file's record batch: strict numbers, report text and symbol codes.

Two readings of a column give the same results: as text (every cell cast to text by
Arrow and parsed strictly, the rules of docs/design/input-files.md) and typed (Arrow
numbers read as numbers, text judged by its bytes where they settle it, each symbol name
handled once). The typed reading makes a cell's text only for the cells reported.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from atc_stream.core.timetext import whole_decimals_as_integers

_FLOAT_PATTERN = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"


def parse_closes(text):
    """float64 closes of a pyarrow string array and the mask of cells that are finite
    numbers (``1e999`` is written as a number but is no price)."""
    text = pc.utf8_trim_whitespace(text)
    ok = pc.fill_null(pc.match_substring_regex(text, _FLOAT_PATTERN), False)
    ok_np = ok.to_numpy(zero_copy_only=False)
    cleaned = pc.if_else(ok, text, "nan")
    return _finite(pc.cast(cleaned, "float64").to_numpy(zero_copy_only=False), ok_np)


def _finite(values: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(``values`` with NaN where not finite, ``ok`` and finite) of parsed cells."""
    finite = np.isfinite(values)
    if finite.all():
        return values, ok
    return np.where(finite, values, np.nan), ok & finite


def empty_cells(text) -> np.ndarray:
    """Mask of the cells of a string array that are empty or null."""
    return pc.fill_null(pc.equal(pc.utf8_length(text), 0), True).to_numpy(zero_copy_only=False)


def _no_chars(text) -> np.ndarray:
    """``empty_cells`` compared in NumPy: Arrow's comparison with a scalar can wait for
    its thread pool, which a CSV read keeps busy reading ahead."""
    return _filled(pc.utf8_length(text), 0).to_numpy(zero_copy_only=False) == 0


def as_text(column):
    """A column as a pyarrow string array (Parquet columns may be numbers or timestamps)."""
    column = _plain(column)
    if not pa.types.is_string(column.type) and not pa.types.is_large_string(column.type):
        column = pc.cast(column, pa.string())
    return column


def _plain(column):
    """One Arrow array of ``column``'s values (chunks joined, a dictionary decoded)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    return column


def _filled(column, value):
    """``column`` with its nulls set to ``value`` (itself when it has none)."""
    return column.fill_null(value) if column.null_count else column


def _long(lengths, limit: int) -> np.ndarray:
    return pc.fill_null(pc.greater(lengths, limit), False).to_numpy(zero_copy_only=False)


class Cells(Protocol):
    """What the reader asks of a column's cells."""

    def empty(self) -> np.ndarray:
        """Mask of the cells empty or null."""
        ...

    def long(self, limit: int) -> np.ndarray:
        """Mask of the cells longer than ``limit`` characters."""
        ...

    def size(self, i) -> int:
        """Characters in cell ``i``."""
        ...

    def shown(self, i) -> str:
        """Cell ``i`` as a report shows it."""
        ...


class SymbolCodes:
    """Symbol names and their int32 codes, in first-seen order (shared by a file's batches)."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}

    def encode(self, symbols) -> np.ndarray:
        """int32 codes of ``symbols`` (new names get the next codes)."""
        uniq, inverse = np.unique(
            np.asarray(symbols, dtype=object).astype(str), return_inverse=True
        )
        return self.encode_names(uniq.tolist())[inverse.reshape(-1)]

    def encode_names(self, names: list[str]) -> np.ndarray:
        """int32 codes of ``names``, each name once or more: the new ones get the next
        codes in sorted order, as ``encode`` gives them."""
        for name in sorted(set(names)):
            self.codes.setdefault(name, len(self.codes))
        return np.array([self.codes[name] for name in names], np.int32)

    @property
    def names(self) -> np.ndarray:
        """Object array: ``names[code]``."""
        names = np.empty(len(self.codes), dtype=object)
        for name, code in self.codes.items():
            names[code] = name
        return names


class TextCells:
    """A column's cells as text: Arrow's cast of numbers and times, parsed strictly."""

    def __init__(self, column) -> None:
        self.text = as_text(column)

    def empty(self) -> np.ndarray:
        return empty_cells(self.text)

    def long(self, limit: int) -> np.ndarray:
        """Mask of the cells longer than ``limit`` characters."""
        return _long(pc.utf8_length(self.text), limit)

    def size(self, i) -> int:
        return len(self.text[int(i)].as_py())

    def shown(self, i) -> str:
        """Cell ``i`` as a report shows it."""
        return repr(self.text[int(i)].as_py())

    def numbers(self) -> tuple[np.ndarray, np.ndarray]:
        """``parse_closes`` of the cells."""
        return parse_closes(self.text)


class NumberCells:
    """A column of Arrow integers or floats, read as numbers: the values and masks its
    text would give (Arrow's float text round-trips), the text made for reports only."""

    def __init__(self, column) -> None:
        self.column = column
        if column.null_count:
            self.valid = column.is_valid().to_numpy(zero_copy_only=False)
        else:
            self.valid = np.ones(len(column), bool)

    def empty(self) -> np.ndarray:
        return ~self.valid  # a number's text is never empty

    def long(self, limit: int) -> np.ndarray:
        return np.zeros(len(self.column), bool)  # nor longer than 24 characters

    def size(self, i) -> int:
        return len(self._text(i))

    def shown(self, i) -> str:
        return repr(self._text(i))

    def _text(self, i):
        return pc.cast(self.column.slice(int(i), 1), pa.string())[0].as_py()

    def numbers(self) -> tuple[np.ndarray, np.ndarray]:
        kind = self.column.type
        ok = self.valid.copy()
        if pa.types.is_integer(kind):
            # NumPy's int to float64 rounds to nearest, as Arrow's parse of the digits does
            values = _filled(self.column, 0).to_numpy(zero_copy_only=False).astype(np.float64)
        else:
            raw = _filled(self.column, np.nan).to_numpy(zero_copy_only=False)
            ok &= np.isfinite(raw)
            values = raw
            if kind == pa.float32():  # its text is the shortest float32 text, read as float64
                text = pc.cast(self.column, pa.string())
                cleaned = pc.if_else(pa.array(ok), text, "nan")
                values = pc.cast(cleaned, pa.float64()).to_numpy(zero_copy_only=False)
        return np.where(ok, values, np.nan), ok


#: The bytes of the cells that Arrow's float parse and ``_FLOAT_PATTERN`` both take or
#: both refuse (every string of them up to 7 long was tried): no space, letter but e/E.
_NUMBER_BYTES = b"0123456789.eE+-"


def text_bytes(text) -> tuple[np.ndarray, bytes]:
    """(byte length of each cell, the bytes of all cells, null cells' too) of a string
    array."""
    _, offsets, data = text.buffers()
    kind = np.int64 if pa.types.is_large_string(text.type) else np.int32
    offsets = np.frombuffer(offsets, kind)[text.offset : text.offset + len(text) + 1]
    if data is None or len(text) == 0:
        return np.zeros(len(text), kind), b""
    start, end = int(offsets[0]), int(offsets[-1])
    # one copy, then C loops (memchr, translate): several times NumPy's byte lookups
    return np.diff(offsets), np.frombuffer(data, np.uint8, end - start, start).tobytes()


def any_byte_of(text, values: bytes) -> bool:
    """Whether a byte of ``values`` is among the bytes of the cells of ``text`` (a string
    array or chunked array; null cells' bytes count)."""
    chunks = text.chunks if isinstance(text, pa.ChunkedArray) else [text]
    found = (text_bytes(chunk)[1] for chunk in chunks)
    return any(bytes([value]) in data for data in found for value in values)


class StringCells(TextCells):
    """``TextCells`` of a string column, its masks from the cells' byte lengths (a cell
    is empty when it has no bytes, and no longer in characters than in bytes), and its
    numbers cast at once when every byte may be part of a number."""

    def __init__(self, column) -> None:
        super().__init__(column)
        self.bytes, self.data = text_bytes(self.text)

    def empty(self) -> np.ndarray:
        empty = self.bytes == 0
        if self.text.null_count:
            empty |= ~self.text.is_valid().to_numpy(zero_copy_only=False)
        return empty

    def long(self, limit: int) -> np.ndarray:
        if (self.bytes <= limit).all():
            return np.zeros(len(self.text), bool)
        return super().long(limit)

    def epochs(self):
        """The cells as an Arrow int64 array when every one is 1 to 18 ASCII digits (then
        ``timetext.parse_time_column`` reads them as it reads their text), or such digits
        then a point and zeros (``1700000000.0``: a whole number as pandas writes a float
        column, read as Parquet's whole floats are); else None."""
        text, sizes, data = self.text, self.bytes, self.data
        if text.null_count:
            return None
        if b"." in data and not data.translate(None, b"0123456789."):
            text = whole_decimals_as_integers(text)
            sizes, data = text_bytes(text)
        if ((sizes > 0) & (sizes <= 18)).all() and not data.translate(None, b"0123456789"):
            return pc.cast(text, pa.int64())
        return None

    def numbers(self) -> tuple[np.ndarray, np.ndarray]:
        plain = not self.text.null_count and (self.bytes > 0).all()
        if plain and not self.data.translate(None, _NUMBER_BYTES):
            try:  # cells of number bytes that Arrow parses are the pattern's numbers
                values = pc.cast(self.text, pa.float64()).to_numpy(zero_copy_only=False)
                return _finite(values, np.ones(len(self.text), bool))
            except pa.ArrowInvalid:
                pass  # "1.2.3", "e5" ...: the cells one by one
        return parse_closes(self.text)


def column_cells(column, typed: bool = True) -> TextCells | NumberCells:
    """The cells of a price or time column: ``NumberCells`` for Arrow integers and
    float32/float64 and ``StringCells`` for the rest when ``typed``, else ``TextCells``."""
    if not typed:
        return TextCells(column)
    plain = _plain(column)
    kind = plain.type
    if pa.types.is_integer(kind) or kind in (pa.float32(), pa.float64()):
        return NumberCells(plain)
    return StringCells(plain)


class SymbolCells:
    """A symbol column's cells as text, trimmed; ``typed``: each distinct text is checked
    and looked up once (a column holds few names) instead of once per row."""

    def __init__(self, column, typed: bool = True) -> None:
        self.typed = typed
        if not typed:
            self.text = as_text(column)
            self.trimmed = pc.utf8_trim_whitespace(self.text)
            return
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if not (
            pa.types.is_dictionary(column.type)
            and (pa.types.is_string(column.type.value_type)
                 or pa.types.is_large_string(column.type.value_type))
        ):  # fmt: skip
            column = pc.dictionary_encode(as_text(column))
        words = column.dictionary
        self.words = words
        self.trimmed = pc.utf8_trim_whitespace(words)
        indices = column.indices
        self.rows = _filled(indices, 0).to_numpy(zero_copy_only=False).astype(np.intp)
        if indices.null_count:  # a null cell: the entry after the last word
            self.rows[~indices.is_valid().to_numpy(zero_copy_only=False)] = len(words)
        self._empty = np.append(_no_chars(words), True)[self.rows]
        self._blank = np.append(_no_chars(self.trimmed), True)[self.rows]
        nul = pc.fill_null(pc.match_substring(self.trimmed, "\x00"), False)
        self._nul = np.append(nul.to_numpy(zero_copy_only=False), False)[self.rows]

    def empty(self) -> np.ndarray:
        """Mask of the cells empty or null before trimming."""
        return self._empty if self.typed else empty_cells(self.text)

    def long(self, limit: int) -> np.ndarray:
        if not self.typed:
            return _long(pc.utf8_length(self.text), limit)
        lengths = _filled(pc.utf8_length(self.words), 0).to_numpy(zero_copy_only=False)
        return np.append(lengths > limit, False)[self.rows]

    def size(self, i) -> int:
        if self.typed:
            return len(self.words[int(self.rows[i])].as_py())
        return len(self.text[int(i)].as_py())

    def blank(self) -> np.ndarray:
        """Mask of the cells empty or null once trimmed."""
        return self._blank if self.typed else empty_cells(self.trimmed)

    def nul(self) -> np.ndarray:
        """Mask of the trimmed cells holding a NUL character."""
        if self.typed:
            return self._nul
        nul = pc.fill_null(pc.match_substring(self.trimmed, "\x00"), False)
        return nul.to_numpy(zero_copy_only=False)

    def shown(self, i) -> str:
        """Trimmed cell ``i`` as a report shows it."""
        if not self.typed:
            return repr(self.trimmed[int(i)].as_py())
        entry = int(self.rows[i])
        return repr(None if entry == len(self.words) else self.trimmed[entry].as_py())

    def codes(self, rows: np.ndarray, symbols: SymbolCodes) -> np.ndarray:
        """int32 codes (``symbols``) of the trimmed names of ``rows``, none empty or null."""
        if not self.typed:
            names = self.trimmed.to_numpy(zero_copy_only=False)
            return symbols.encode(names[rows] if rows.size < len(names) else names)
        entries = self.rows[rows]
        used = np.flatnonzero(np.bincount(entries, minlength=len(self.words) + 1))
        by_entry = np.zeros(len(self.words) + 1, np.int32)
        by_entry[used] = symbols.encode_names(self.trimmed.take(pa.array(used)).to_pylist())
        return by_entry[entries]
