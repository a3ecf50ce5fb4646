"""Strict time text: the one definition of accepted times, for one cell and for a column.

The accepted forms, the epoch units and how a column's unit is decided are described in
docs/design/input-files.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "UNIT_TO_MS",
    "TIME_UNITS",
    "EPOCH_BANDS",
    "ISO_REGEX",
    "ISO_PATTERN",
    "INT_PATTERN",
    "WHOLE_DECIMAL_REGEX",
    "WHOLE_DECIMAL_PATTERN",
    "MAX_TIME_CHARS",
    "MAX_TIME_MS",
    "EpochUnit",
    "EpochUnitError",
    "epoch_bands",
    "iso_parts",
    "int_epoch_parts",
    "epoch_to_ms",
    "text_to_ms",
    "parse_time_column",
    "whole_decimals_as_integers",
]

#: Units an integer epoch may be given in, as the factor to milliseconds (num, den).
UNIT_TO_MS: dict[str, tuple[int, int]] = {
    "s": (1000, 1),
    "ms": (1, 1),
    "us": (1, 1000),
    "ns": (1, 1_000_000),
}
#: Accepted unit names: a unit, or "auto" (decided from magnitudes).
TIME_UNITS = (*UNIT_TO_MS, "auto")
#: Magnitude bands of present-day epochs (1973..5138 AD) per unit.
EPOCH_BANDS = (("s", 1e8, 1e11), ("ms", 1e11, 1e14), ("us", 1e14, 1e17), ("ns", 1e17, 1e20))
_BAND_EDGES = np.array([lo for _, lo, _ in EPOCH_BANDS])
#: ``epoch_bands`` of a magnitude below every band (not a present-day epoch in any unit).
BELOW_BANDS = -1

#: The accepted ISO-8601 / RFC 3339 forms, with a named group per field. RE2-compatible:
#: Arrow's ``extract_regex`` reads a whole column with it, Python's ``re`` one cell.
ISO_REGEX = (
    r"(?P<year>\d{4})-(?P<month>\d{2})-(?P<day>\d{2})"
    r"(?:[T ](?P<hour>\d{2}):(?P<minute>\d{2})"
    r"(?::(?P<second>\d{2})(?:[.,](?P<fraction>\d+))?)?)?"
    r"(?:(?P<utc>[Zz])|(?P<sign>[+-])(?P<zone_hour>\d{2})(?::?(?P<zone_minute>\d{2}))?)?"
)
ISO_PATTERN = re.compile(ISO_REGEX, re.ASCII)
INT_PATTERN = re.compile(r"[+-]?\d+", re.ASCII)
#: A whole number written as a decimal (``1700000000.0``, as pandas writes a float
#: column): that integer, group 1. RE2-compatible: Arrow rewrites whole columns with it.
WHOLE_DECIMAL_REGEX = r"([+-]?[0-9]+)\.0+"
WHOLE_DECIMAL_PATTERN = re.compile(WHOLE_DECIMAL_REGEX, re.ASCII)
#: Longer cells are refused without a look (no valid time comes close).
MAX_TIME_CHARS = 64
#: The latest time a bar may have (epoch ms): 9999-12-31T23:59:59.999Z, the end of the
#: years ISO text can name. A later one is a broken value, and once applied it would make
#: every real bar of its stream "not after" it; earlier ones, before 1970 too, are fine.
MAX_TIME_MS = 253_402_300_799_999
_NS_PER_MS = 1_000_000
_FIELDS = ("year", "month", "day", "hour", "minute", "second", "zone_hour", "zone_minute")


class EpochUnitError(ValueError):
    """The integers of one column are epochs of different units by magnitude."""


# -- the calendar, for Python ints and NumPy int64 arrays alike --------------------------


def _civil_ms(year, month, day, hour, minute, second, offset_minutes):
    """(epoch ms of the whole second, valid) of calendar fields; works element-wise on
    NumPy arrays and on Python ints, so one cell and a column share one arithmetic."""
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    month_days = 30 + (month + month // 8) % 2 - (month == 2) * (2 - leap)
    valid = (
        (year >= 1) & (month >= 1) & (month <= 12) & (day >= 1) & (day <= month_days)
        & (hour < 24) & (minute < 60) & (second < 60)
    )  # fmt: skip
    y = year - (month <= 2)  # days from civil (H. Hinnant), March-based years
    era = y // 400
    yoe = y - era * 400
    doy = (153 * ((month + 9) % 12) + 2) // 5 + day - 1
    days = era * 146_097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719_468
    seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60
    return seconds * 1000, valid


def _zone_minutes(sign, hour, minute):
    """(offset in minutes east of UTC, valid); offsets under 24 h, like RFC 3339's."""
    return sign * (hour * 60 + minute), (hour < 24) & (minute < 60)


# -- one cell ----------------------------------------------------------------------------


def iso_parts(text: str) -> tuple[int, int] | None:
    """(epoch ms, ns within the ms) of an ISO-8601 / RFC 3339 time; None if it is not one.

    The fraction must follow whole seconds (``12:30:05.5``, not ``12:30.5``); beyond nine
    digits it is floored. Without a zone the time is UTC.
    """
    if not text or len(text) > MAX_TIME_CHARS:
        return None
    match = ISO_PATTERN.fullmatch(text)
    if match is None:
        return None
    groups = match.groupdict()
    y, mo, d, h, mi, s, zh, zm = (int(groups[name] or 0) for name in _FIELDS)
    offset, zone_ok = _zone_minutes(-1 if groups["sign"] == "-" else 1, zh, zm)
    ms, valid = _civil_ms(y, mo, d, h, mi, s, offset)
    if not (valid and zone_ok):  # 2024-02-30, 25:00, zone +24:00 ...
        return None
    fraction = groups["fraction"]
    ns = int(fraction[:9].ljust(9, "0")) if fraction else 0
    return ms + ns // _NS_PER_MS, ns % _NS_PER_MS


def int_epoch_parts(value: int, unit: str) -> tuple[int, int]:
    """(epoch ms floored, ns within the ms) of an integer epoch in ``unit`` (s/ms/us/ns)."""
    if unit not in UNIT_TO_MS:
        raise ValueError(f"time unit must be s, ms, us or ns, got {unit!r}")
    num, den = UNIT_TO_MS[unit]
    ms, rest = divmod(value * num, den)
    return ms, rest * (_NS_PER_MS // den)


def epoch_to_ms(value: int, unit: str | None) -> int | None:
    """Engine time (int ms, sub-ms floored) of one integer epoch in ``unit``: ``None`` takes
    it as it is (epoch ms by convention, or any increasing integer); ``auto`` picks the
    unit from its own magnitude (a single value has no column to decide by). None when it
    fits no unit or int64."""
    if not -(2**63) <= value < 2**63:
        return None
    if unit == "auto":
        magnitude = abs(value)
        unit = next((name for name, lo, hi in EPOCH_BANDS if lo <= magnitude < hi), None)
        if unit is None:
            return None
    if unit is not None:
        value = int_epoch_parts(value, unit)[0]
    return value if -(2**63) <= value < 2**63 else None


def text_to_ms(text: str, unit: str | None = None) -> int | None:
    """Engine time (int ms) of one time cell: an integer epoch (``epoch_to_ms`` with
    ``unit``; ``123.0`` too), or ISO-8601 / RFC 3339 (sub-ms floored). None when it is
    neither."""
    text = text.strip()
    if whole := WHOLE_DECIMAL_PATTERN.fullmatch(text):
        text = whole.group(1)
    if INT_PATTERN.fullmatch(text):
        if len(text) > 21:
            return None
        return epoch_to_ms(int(text), unit)
    parts = iso_parts(text)
    return None if parts is None else parts[0]


# -- epoch units of a column -------------------------------------------------------------


def epoch_bands(magnitudes: np.ndarray) -> np.ndarray:
    """Index into ``EPOCH_BANDS`` of each magnitude (``BELOW_BANDS`` under 1e8)."""
    return np.searchsorted(_BAND_EDGES, magnitudes, side="right") - 1


class EpochUnit:
    """The unit of one column's integer epochs: the one given, or (``auto``) the one band
    of magnitudes that all its non-zero integers fall in, fed in parts (record batches).

    A column whose integers fall in different bands is refused (``EpochUnitError``); one
    whose integers are all below every band is taken as it is, in epoch ms.
    """

    def __init__(self, unit: str = "auto") -> None:
        if unit not in TIME_UNITS:
            raise ValueError(f"time unit must be auto, s, ms, us or ns, got {unit!r}")
        self.given = unit
        #: first integer seen of each band: (value, where)
        self._seen: dict[int, tuple[int, str]] = {}

    def of(self, values: np.ndarray, where: Callable[[int], str] | None = None) -> str:
        """The unit to read ``values`` (the next integers of the column) in."""
        if self.given != "auto":
            return self.given
        magnitudes = np.abs(values.astype(np.float64))
        bands = epoch_bands(magnitudes)
        nonzero = magnitudes > 0
        # the bands present, in order: a count per band, not a sort of every value
        present = np.flatnonzero(np.bincount(bands[nonzero] - BELOW_BANDS)) + BELOW_BANDS
        for band in present.tolist():
            if band not in self._seen:
                i = int(np.flatnonzero(nonzero & (bands == band))[0])
                self._seen[band] = (int(values[i]), where(i) if where is not None else "")
        if len(self._seen) > 1:
            raise EpochUnitError(self._conflict())
        band = next(iter(self._seen), BELOW_BANDS)
        return "ms" if band == BELOW_BANDS else EPOCH_BANDS[band][0]

    def _conflict(self) -> str:
        def named(band: int) -> str:
            value, where = self._seen[band]
            unit = "no unit" if band == BELOW_BANDS else EPOCH_BANDS[band][0]
            return f"{value} ({where + ': ' if where else ''}{unit})"

        first, second = sorted(self._seen)[:2]
        return (
            f"integer times of different epoch units by magnitude: {named(first)} and "
            f"{named(second)} (s from 1e8, ms from 1e11, us from 1e14, ns from 1e17; a column "
            "all below 1e8 is taken as ms)"
        )


def _epoch_parts(values: np.ndarray, unit: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ms floored, ns within the ms, fits int64) of integer epochs in ``unit``."""
    num, den = UNIT_TO_MS[unit]
    if den == 1:
        fits = (values >= -(2**63 // num)) & (values <= (2**63 - 1) // num)
        return np.where(fits, values, 0) * num, np.zeros(values.shape, np.int64), fits
    ms, rest = np.divmod(values, den)
    return ms, rest * (_NS_PER_MS // den), np.ones(values.shape, bool)


# -- a column ----------------------------------------------------------------------------


def parse_time_column(
    column: Any,
    unit: EpochUnit | str = "auto",
    where: Callable[[int], str] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(epoch ms floored, ns within the ms, parsed mask) of an Arrow time column.

    Text cells are integers (in ``unit``; ``123.0`` too) or ISO-8601 / RFC 3339, the
    forms ``iso_parts`` accepts, with the same arithmetic; typed columns may hold
    timestamps, integers or whole floats. ``where(i)`` names row ``i`` in an ``EpochUnitError``.
    """
    # pyarrow is imported here, not at the top: core is imported by every command, the
    # engine and the Redis consumer, which read one time at a time; only file readers parse
    # columns, and importing pyarrow.compute costs about 0.12 s.
    import pyarrow as pa
    import pyarrow.compute as pc

    epoch_unit = unit if isinstance(unit, EpochUnit) else EpochUnit(unit)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    kind = column.type
    n = len(column)
    if pa.types.is_timestamp(kind):
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        values = pc.cast(column, pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        ms, sub, fits = _epoch_parts(values, kind.unit)
        return ms, sub, valid & fits
    if pa.types.is_integer(kind):
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        if kind == pa.uint64():  # above int64: not a time
            big = pc.fill_null(pc.greater(column, pa.scalar(2**63 - 1, kind)), False)
            valid &= ~big.to_numpy(zero_copy_only=False)
            column = pc.if_else(big, pa.scalar(0, kind), column)
        values = pc.cast(column, pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        return _int_times(values, valid, epoch_unit, where)
    if pa.types.is_floating(kind):  # whole numbers only
        raw = pc.cast(column, pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
        valid = np.isfinite(raw) & (raw == np.round(raw)) & (np.abs(raw) < 2.0**63)
        return _int_times(np.where(valid, raw, 0).astype(np.int64), valid, epoch_unit, where)
    text = pc.utf8_trim_whitespace(pc.cast(column, pa.string()))
    text = whole_decimals_as_integers(text)  # as a typed column's whole floats are above
    short = pc.fill_null(pc.less_equal(pc.utf8_length(text), MAX_TIME_CHARS), False)
    ms, sub, ok = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, bool)
    # [+-]digits: one sign, then ASCII digits only (no "1_0", "0x10", " 1", "١")
    signed = pc.or_(pc.starts_with(text, "+"), pc.starts_with(text, "-"))
    digits = pc.if_else(signed, pc.utf8_slice_codeunits(text, 1), text)
    is_int = pc.and_(short, pc.fill_null(pc.ascii_is_decimal(digits), False))
    is_int = is_int.to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(is_int)
    if rows.size:
        values, valid = _text_ints(pc.take(text, pa.array(rows)), pc.take(digits, pa.array(rows)))
        ms[rows], sub[rows], ok[rows] = _int_times(
            values, valid, epoch_unit, None if where is None else lambda i: where(int(rows[i]))
        )
    rows = np.flatnonzero(~is_int & short.to_numpy(zero_copy_only=False))
    if rows.size:
        ms[rows], sub[rows], ok[rows] = _iso_times(pc.take(text, pa.array(rows)))
    return ms, sub, ok


def whole_decimals_as_integers(text):
    """The Arrow string cells ``text`` with each whole number written as a decimal
    (``WHOLE_DECIMAL_REGEX``) rewritten as that integer, the other cells as they are."""
    import pyarrow.compute as pc

    return pc.replace_substring_regex(text, pattern=f"^{WHOLE_DECIMAL_REGEX}$", replacement=r"\1")


def _int_times(values: np.ndarray, valid: np.ndarray, unit: EpochUnit, where):
    """(ms, ns within the ms, ok) of integer epochs, in the column's unit; a negative one
    is not ok (a stray value, not a bar before 1970) and does not count for the unit."""
    valid = valid & (values >= 0)
    ms, sub, fits = _epoch_parts(values, unit.of(values[valid], _kept(valid, where)))
    return ms, sub, valid & fits


def _kept(valid: np.ndarray, where):
    """``where`` for positions in ``values[valid]``."""
    if where is None:
        return None
    positions = np.flatnonzero(valid)
    return lambda i: where(int(positions[i]))


def _text_ints(text, digits) -> tuple[np.ndarray, np.ndarray]:
    """int64 values of ``[+-]digits`` cells (``digits``: without the sign), and the mask of
    those that fit int64."""
    import pyarrow as pa
    import pyarrow.compute as pc

    long = pc.utf8_length(digits).to_numpy(zero_copy_only=False) > 18
    values = np.zeros(len(text), np.int64)
    valid = np.ones(len(text), bool)
    rows = np.flatnonzero(~long)
    if rows.size:  # Arrow's integer cast refuses a plus sign: cast the digits, then sign
        magnitude = pc.cast(pc.take(digits, pa.array(rows)), pa.int64()).to_numpy()
        minus = pc.starts_with(pc.take(text, pa.array(rows)), "-").to_numpy(zero_copy_only=False)
        values[rows] = np.where(minus, -magnitude, magnitude)
    for i in np.flatnonzero(long).tolist():  # 19 digits may still fit: Python decides (rare)
        value = int(text[i].as_py())
        valid[i] = -(2**63) <= value < 2**63
        values[i] = value if valid[i] else 0
    return values, valid


def _iso_times(text) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ms, ns within the ms, ok) of text cells that may be in the forms of ``ISO_REGEX``.

    Arrow checks the form (a match without captures runs as a fast automaton); the fields
    are then read from the cells' bytes at the places that form gives them, with NumPy.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(text)
    ms, sub, ok = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, bool)
    matched = pc.fill_null(pc.match_substring_regex(text, f"^(?:{ISO_REGEX})$"), False)
    rows = np.flatnonzero(matched.to_numpy(zero_copy_only=False))
    if rows.size == 0:
        return ms, sub, ok
    cells = pc.take(text, pa.array(rows))  # a fresh array: offsets from 0, ASCII only
    offsets = np.frombuffer(cells.buffers()[1], np.int32)[: rows.size + 1].astype(np.int64)
    length = np.diff(offsets).astype(np.int32)
    width = int(length.max())
    data = np.frombuffer(cells.buffers()[2], np.uint8)[: offsets[-1]]
    if (length == width).all():  # one length (the usual file): the bytes as a table
        chars = data.reshape(rows.size, width)
    else:  # one row of bytes per cell, padded past the short ones
        data = np.concatenate([data, np.zeros(width, np.uint8)])
        chars = data[offsets[:-1, None].astype(np.int32) + np.arange(width, dtype=np.int32)]

    def two(at: int) -> np.ndarray:
        if at + 1 >= width:
            return np.zeros(rows.size, np.int32)
        return chars[:, at].astype(np.int32) * 10 + chars[:, at + 1] - 11 * ord("0")

    # the zone: Z, or a sign after the date and what follows it (+HH, +HHMM, +HH:MM)
    every = np.arange(rows.size)
    last = chars[every, length - 1]
    utc = (last == ord("Z")) | (last == ord("z"))
    zone_len = np.where(utc, 1, 0).astype(np.int32)
    for size in (3, 5, 6):
        at = chars[every, length - size]
        signed = ((at == ord("+")) | (at == ord("-"))) & (length - size >= 10)
        zone_len[signed] = size
    body = length - zone_len  # date [time [fraction]]
    offset = np.zeros(rows.size, np.int32)
    zone_ok = np.ones(rows.size, bool)
    signed = ~utc & (zone_len > 0)
    if signed.any():
        pick, at, end = every[signed], body[signed], length[signed]
        zone_hour = chars[pick, at + 1].astype(np.int32) * 10 + chars[pick, at + 2] - 528
        zone_minute = np.where(
            zone_len[signed] >= 5, chars[pick, end - 2].astype(np.int32) * 10
            + chars[pick, end - 1] - 528, 0,
        )  # fmt: skip
        east = np.where(chars[pick, at] == ord("-"), -1, 1)
        offset[signed], zone_ok[signed] = _zone_minutes(east, zone_hour, zone_minute)
    ns = np.zeros(rows.size, np.int64)
    for k in range(min(9, width - 20)):  # fraction digits from 20; beyond nine floored
        digit = chars[:, 20 + k].astype(np.int64) - ord("0")
        ns += np.where(20 + k < body, digit, 0) * 10 ** (8 - k)
    has_time, has_second = body >= 16, body >= 19
    whole, valid = _civil_ms(
        two(0) * 100 + two(2),
        two(5),
        two(8).astype(np.int64),  # int64 from here: seconds since 1970 pass int32
        np.where(has_time, two(11), 0),
        np.where(has_time, two(14), 0),
        np.where(has_second, two(17), 0),
        offset,
    )
    good = valid & zone_ok
    ms[rows] = np.where(good, whole + ns // _NS_PER_MS, 0)
    sub[rows] = np.where(good, ns % _NS_PER_MS, 0)
    ok[rows] = good
    return ms, sub, ok
