"""Engine inputs as arrays: bars as slot columns (fast path, per-item checks), histories."""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from atc_stream.core import inputs

#: Reasons raised before batch planning (Python-level input shape/type checks).
MALFORMED_UPDATE = "malformed_update"
BAD_TIME_TYPE = "bad_time_type"
BAD_CLOSE_TYPE = "bad_close_type"
UNKNOWN_SYMBOL = "unknown_symbol"
BAD_HISTORY = "bad_history"

#: Exact types ``parse_columns`` accepts without ``numbers`` ABC checks (~0.5 us each).
#: uint64 is left out: its values above int64 must take the checked path.
_FAST_INT_TYPES = frozenset(
    {int, np.int64, np.int32, np.int16, np.int8, np.uint32, np.uint16, np.uint8}
)
_FAST_REAL_TYPES = _FAST_INT_TYPES | {float, np.float64, np.float32}

#: ``(slots, times, closes, origin)``: one row per stream update, ``origin`` the
#: position of the input it came from
Columns = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
#: ``reject(index, reason, detail, symbol)``
Reject = Callable[[int, str, str, "str | None"], None]


def is_symbol(symbol: Any) -> bool:
    """A non-empty str without NUL (NumPy's str arrays would drop trailing NULs, merging
    "AB\\0" into "AB")."""
    return isinstance(symbol, str) and bool(symbol) and "\x00" not in symbol


def parse_columns(
    bars: Sequence[Any],
    slot_lists: Mapping[str, list[int]],
    single_slot: Mapping[str, int] | None,
) -> Columns | None:
    """The column fast path: None when any item needs the full checks of ``parse_items``.

    ``slot_lists``: ``symbol -> [slot, ...]``; ``single_slot``: ``symbol -> slot`` when
    every symbol has one stream, else None.
    """
    if not bars or set(map(type, bars)) != {tuple} or set(map(len, bars)) != {3}:
        return None
    symbols, bar_times, closes = zip(*bars, strict=True)
    if not set(map(type, bar_times)) <= _FAST_INT_TYPES:
        return None
    if not set(map(type, closes)) <= _FAST_REAL_TYPES:
        return None
    # registered symbols are str keys: a lookup finds only str (or str-subclass)
    # symbols, and an unhashable one raises TypeError (the per-item path rejects it)
    if single_slot is not None:  # one stream per symbol: nothing to fan out
        try:
            firsts = list(map(single_slot.get, symbols))
        except TypeError:
            return None
        if None in firsts:
            return None
        n = len(firsts)
        return (
            np.array(firsts, np.int64), np.array(bar_times, np.int64),
            np.array(closes, np.float64), np.arange(n, dtype=np.int64),
        )  # fmt: skip
    try:
        found = list(map(slot_lists.get, symbols))
    except TypeError:
        return None
    if None in found:
        return None
    lists = cast(list[list[int]], found)  # no None: checked just above
    times_array = np.array(bar_times, np.int64)
    closes_array = np.array(closes, np.float64)
    slots, origin = fan_out(lists)
    if origin is None:  # one stream per symbol: nothing to fan out
        return slots, times_array, closes_array, np.arange(len(lists), dtype=np.int64)
    return slots, times_array[origin], closes_array[origin], origin


def fan_out(lists: Sequence[list[int]]) -> tuple[np.ndarray, np.ndarray | None]:
    """Every input's slots in one array, and the position of the input each came from
    (None when every input has exactly one slot: the positions are ``arange``)."""
    counts = np.fromiter(map(len, lists), np.int64, len(lists))
    slots = np.fromiter(itertools.chain.from_iterable(lists), np.int64, int(counts.sum()))
    if (counts == 1).all():
        return slots, None
    return slots, np.repeat(np.arange(len(lists), dtype=np.int64), counts)


def parse_items(
    bars: Sequence[Any], slot_lists: Mapping[str, list[int]], reject: Reject
) -> Columns:
    """Per-item checks: every rejection reason of an input item is decided here."""
    slots: list[int] = []
    times: list[int] = []
    closes: list[float] = []
    origin: list[int] = []
    for index, item in enumerate(bars):
        try:
            if type(item) is not tuple and isinstance(item, (str, bytes, Mapping)):
                raise TypeError  # would unpack into its characters or keys
            symbol, bar_time, close = item
        except (TypeError, ValueError):
            reject(index, MALFORMED_UPDATE, f"not (symbol, time, close): {item!r}", None)
            continue
        if type(bar_time) not in _FAST_INT_TYPES and (
            not isinstance(bar_time, numbers.Integral) or isinstance(bar_time, bool)
        ):
            reject(index, BAD_TIME_TYPE, f"time {bar_time!r}", str(symbol))
            continue
        if type(close) not in _FAST_REAL_TYPES and (
            not isinstance(close, numbers.Real) or isinstance(close, bool)
        ):
            reject(index, BAD_CLOSE_TYPE, f"close {close!r}", str(symbol))
            continue
        symbol_slots = slot_lists.get(symbol) if isinstance(symbol, str) else None
        if symbol_slots is None:
            reject(index, UNKNOWN_SYMBOL, f"symbol {symbol!r}", str(symbol))
            continue
        for slot in symbol_slots:
            slots.append(slot)
            times.append(int(bar_time))
            closes.append(float(close))
            origin.append(index)
    return (
        np.array(slots, np.int64),
        np.array(times, np.int64),
        np.array(closes, np.float64),
        np.array(origin, np.int64),
    )


def as_update_arrays(
    slots: Any, times: Any, closes: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The array fast path's inputs as contiguous int64/int64/float64 arrays of one length."""
    slots = np.ascontiguousarray(slots, dtype=np.int64)
    times = np.ascontiguousarray(times, dtype=np.int64)
    closes = inputs.closes_array(closes)
    if slots.ndim != 1 or times.shape != slots.shape or closes.shape != slots.shape:
        raise ValueError(
            "slots, times and closes must be 1-D arrays of one length, got shapes "
            f"{slots.shape}, {times.shape}, {closes.shape}"
        )
    return slots, times, closes


def parse_history(symbol: Any, series: Any, reject: Reject) -> tuple[np.ndarray, np.ndarray] | None:
    """One symbol's warmup history ``(times, closes)`` as int64/float64 arrays, or None
    (rejected as ``BAD_HISTORY``) when it is not a registrable symbol with 1-D integer
    times and closes of the same shape."""
    try:
        times, closes = series
        times = np.asarray(times)
        closes = inputs.closes_array(closes)
    except (TypeError, ValueError) as exc:
        reject(-1, BAD_HISTORY, f"{symbol!r}: {exc}", str(symbol))
        return None
    if not is_symbol(symbol):
        reject(-1, BAD_HISTORY, f"symbol {symbol!r}", None)
        return None
    if times.ndim != 1 or closes.shape != times.shape or times.dtype.kind not in "iu":
        reject(
            -1, BAD_HISTORY,
            f"{symbol!r}: times must be 1-D integers and closes the same shape "
            f"(got {times.dtype}{times.shape}, {closes.shape})",
            symbol,
        )  # fmt: skip
        return None
    return times.astype(np.int64, copy=False), closes


def pad_histories(
    jobs: Sequence[tuple[int, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(slot, times, closes)`` per stream as ``(slots, times, closes, counts)``: one
    row per stream, padded to the longest history (times 0, closes 1.0)."""
    n = len(jobs)
    longest = max((len(t) for _, t, _ in jobs), default=0)
    slots = np.array([slot for slot, _, _ in jobs], np.int64)
    counts = np.array([len(t) for _, t, _ in jobs], np.int64)
    width = max(longest, 1)
    # written once each: the padding only where a history is shorter (a full-size fill
    # first would write the ~100s of MB of a big warmup twice)
    times = np.empty((n, width), np.int64)
    closes = np.empty((n, width), np.float64)
    for s, (_, t, c) in enumerate(jobs):
        times[s, : len(t)] = t
        closes[s, : len(c)] = c
        if len(t) < width:
            times[s, len(t) :] = 0
        if len(c) < width:
            closes[s, len(c) :] = 1.0
    return slots, times, closes, counts
