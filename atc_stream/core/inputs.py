"""Input forms: pandas, Arrow and NumPy datetimes into the engine's plain arrays, exactly.

What is converted and what is refused: docs/design/input-files.md.
"""

from __future__ import annotations

import datetime as _dt
import numbers
import sys
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import numpy as np

from atc_stream.core.timetext import (
    BELOW_BANDS,
    EPOCH_BANDS,
    TIME_UNITS,
    UNIT_TO_MS,
    epoch_bands,
)

#: With ``time_unit=None`` integers are taken as epoch ms; at or above this they would be
#: after the year 5138, which means the unit is not ms (us/ns epochs): refuse, do not guess.
_MS_LIMIT = 1e14


def _module_type(obj: Any, module: str, name: str) -> bool:
    """``isinstance(obj, module.name)`` without importing ``module``."""
    mod = sys.modules.get(module)
    cls = getattr(mod, name, None) if mod is not None else None
    return cls is not None and isinstance(obj, cls)


def is_pandas(obj: Any, *names: str) -> bool:
    return any(_module_type(obj, "pandas", n) for n in names)


def is_arrow(obj: Any, *names: str) -> bool:
    return any(_module_type(obj, "pyarrow", n) for n in names)


def is_frame(obj: Any) -> bool:
    """A long table of bars: pandas DataFrame or Arrow Table/RecordBatch."""
    return is_pandas(obj, "DataFrame") or is_arrow(obj, "Table", "RecordBatch")


def is_datetime_like(value: Any) -> bool:
    """A single time that is not a plain integer (pandas Timestamp, datetime, datetime64)."""
    return isinstance(value, (_dt.datetime, np.datetime64)) or is_pandas(value, "Timestamp")


def _check_unit(time_unit: str | None) -> None:
    if time_unit is not None and time_unit not in TIME_UNITS:
        raise ValueError(
            f"time_unit must be one of {', '.join(TIME_UNITS)} or None, got {time_unit!r}"
        )


# -- closes ------------------------------------------------------------------------------


def closes_array(closes: Any, what: str = "closes") -> np.ndarray:
    """Closes as contiguous float64 NumPy (from a list, NumPy, pandas Series or Arrow array).

    Missing values (None, pandas NA, Arrow nulls) become NaN, which the caller rejects.
    Only numbers are prices: text such as ``"101.5"`` is refused here as ``step`` refuses
    it (``bad_close_type``), not parsed by ``float()``, which would also take ``"1_0"``
    or ``"nan"``; and so are booleans.
    """
    if type(closes) is np.ndarray and closes.dtype.kind in "iuf":  # every step's form
        return np.ascontiguousarray(closes, dtype=np.float64)
    if is_arrow(closes, "Array", "ChunkedArray"):
        closes = closes.to_numpy(zero_copy_only=False)
    elif is_pandas(closes, "Series", "Index"):
        if closes.dtype.kind in "iuf" or _pandas_numeric(closes):
            closes = closes.to_numpy(dtype=np.float64, na_value=np.nan)
        else:
            closes = closes.to_numpy(dtype=object)
    array = np.asarray(closes)
    if array.dtype.kind == "O":
        array = _number_objects(array, what)
    elif array.dtype.kind not in "iuf":
        kind = _KIND_NAMES.get(array.dtype.kind, str(array.dtype))
        raise ValueError(f"{what} must be numbers, got {kind} (dtype {array.dtype})")
    return np.ascontiguousarray(array, dtype=np.float64)


_KIND_NAMES = {"U": "text", "S": "bytes", "b": "booleans", "M": "datetimes", "m": "durations"}


def _pandas_numeric(series: Any) -> bool:
    """A pandas nullable numeric dtype (``Float64``, ``Int64``): numbers or NA."""
    import pandas as pd

    dtype = series.dtype
    return bool(pd.api.types.is_numeric_dtype(dtype)) and not pd.api.types.is_bool_dtype(dtype)


def _number_objects(array: np.ndarray, what: str) -> np.ndarray:
    """An object array of numbers and missing values as float64; anything else refused."""
    out = np.empty(array.shape, np.float64)
    for position, item in enumerate(array.flat):
        if item is None or _is_missing(item):
            out.flat[position] = np.nan
        elif isinstance(item, (numbers.Real, Decimal)) and not isinstance(item, (bool, np.bool_)):
            out.flat[position] = float(item)
        else:
            at = f"{what}[{position}]" if array.ndim == 1 else f"{what} (item {position})"
            raise ValueError(f"{what} must be numbers; {at} is {type(item).__name__} {item!r}")
    return out


def _is_missing(item: Any) -> bool:
    """pandas' NA, which becomes NaN like None."""
    return type(item).__name__ == "NAType"


# -- times -------------------------------------------------------------------------------


def times_to_ms(times: Any, time_unit: str | None = None, *, what: str = "times") -> np.ndarray:
    """Times of any supported form as int64 epoch milliseconds (UTC), converted exactly.

    ``time_unit`` applies to integer epochs only: "s"/"ms"/"us"/"ns", "auto" (detected
    from magnitude; refused when values fit no unit or several), or None (already ms).
    Datetimes carry their own unit; naive ones are UTC.
    """
    _check_unit(time_unit)
    if is_arrow(times, "Array", "ChunkedArray"):
        times = _arrow_times(times, what)
    if is_pandas(times, "Series", "Index", "DatetimeIndex"):
        times = _pandas_times(times)
    arr = np.asarray(times) if not isinstance(times, np.ndarray) else times
    if arr.dtype == object:
        arr = _object_times(arr, what)
    if arr.dtype.kind == "M":
        return _datetime64_to_ms(arr, what)
    if arr.dtype.kind in "iu":
        return _integers_to_ms(arr.astype(np.int64), time_unit, what)
    if arr.dtype.kind == "f" and arr.size:
        whole = np.isfinite(arr) & (arr == np.trunc(arr))
        if whole.all():
            return _integers_to_ms(arr.astype(np.int64), time_unit, what)
        bad = int(np.flatnonzero(~whole)[0])
        raise ValueError(
            f"{what} must be whole-number epochs or datetimes: "
            f"{what}[{bad}] = {float(arr.flat[bad])!r}"
        )
    raise ValueError(
        f"{what} must be integer epochs or datetimes (datetime64, pandas Timestamp/"
        f"DatetimeIndex, Arrow timestamp), got dtype {arr.dtype}"
    )


def time_to_ms(value: Any, time_unit: str | None = None) -> int:
    """One time (Timestamp, datetime, datetime64 or integer epoch) as epoch ms."""
    return int(times_to_ms(np.array([value], dtype=object), time_unit, what="time")[0])


def _arrow_times(arr: Any, what: str) -> np.ndarray:
    import pyarrow as pa

    if arr.null_count:
        raise ValueError(f"{what}: {arr.null_count} missing (null) time(s)")
    if pa.types.is_timestamp(arr.type):
        if arr.type.tz is not None:  # Arrow timestamps are stored as UTC instants
            arr = arr.cast(pa.timestamp(arr.type.unit))
        return arr.to_numpy()
    if pa.types.is_date(arr.type):
        return arr.cast(pa.timestamp("ms")).to_numpy()
    return arr.to_numpy(zero_copy_only=False)


def _pandas_times(times: Any) -> np.ndarray:
    if getattr(times.dtype, "tz", None) is not None:  # tz-aware: the instant, in UTC
        if is_pandas(times, "Series"):
            times = times.dt.tz_convert("UTC").dt.tz_localize(None)
        else:
            times = times.tz_convert("UTC").tz_localize(None)
    return times.to_numpy()


def _object_times(arr: np.ndarray, what: str) -> np.ndarray:
    """An object array of Timestamps/datetimes/datetime64/ints as datetime64[ns] or int64."""
    if arr.size == 0:
        return np.zeros(0, np.int64)
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in arr):
        return arr.astype(np.int64)
    out = np.empty(arr.shape, "datetime64[ns]")
    for i, value in enumerate(arr):
        out[i] = _scalar_datetime64(value, f"{what}[{i}]")
    return out


def _scalar_datetime64(value: Any, what: str) -> np.datetime64:
    if is_pandas(value, "Timestamp"):
        if value is sys.modules["pandas"].NaT:
            raise ValueError(f"{what} is NaT (missing time)")
        if value.tzinfo is not None:
            value = value.tz_convert("UTC").tz_localize(None)
        return value.to_datetime64()
    if isinstance(value, _dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(_dt.timezone.utc).replace(tzinfo=None)
        return np.datetime64(value, "us")
    if isinstance(value, np.datetime64):
        if np.isnat(value):
            raise ValueError(f"{what} is NaT (missing time)")
        return value
    raise ValueError(
        f"{what} must be an integer epoch or a datetime (Timestamp, datetime, datetime64), "
        f"got {type(value).__name__} {value!r}"
    )


def _datetime64_to_ms(arr: np.ndarray, what: str) -> np.ndarray:
    if np.isnat(arr).any():
        raise ValueError(
            f"{what} contain NaT (missing time) at position {int(np.isnat(arr).argmax())}"
        )
    unit = np.datetime_data(arr.dtype)[0]
    if unit in ("Y", "M"):  # calendar units: no fixed length, convert through days
        arr = arr.astype("datetime64[D]")
    ms = arr.astype("datetime64[ms]")
    lost = ms.astype(arr.dtype) != arr
    if lost.any():
        i = int(lost.argmax())
        raise ValueError(
            f"{what} have sub-millisecond precision ({arr[i]} at position {i}); engine times "
            "are whole milliseconds: floor or round them first (e.g. .dt.floor('ms'))"
        )
    return ms.astype(np.int64)


def _integers_to_ms(values: np.ndarray, time_unit: str | None, what: str) -> np.ndarray:
    if time_unit is None:
        if values.size and np.abs(values).max() >= _MS_LIMIT:
            raise ValueError(
                f"{what} look like epoch microseconds or nanoseconds (max {values.max()}), not "
                "milliseconds; pass time_unit='us'/'ns' (or 'auto' to detect it)"
            )
        return values
    if time_unit == "auto":
        time_unit = detect_epoch_unit(values, what)
    num, den = UNIT_TO_MS[time_unit]
    if den > 1:
        if (values % den).any():
            i = int(np.flatnonzero(values % den)[0])
            raise ValueError(
                f"{what} in {time_unit} have sub-millisecond precision ({values[i]} at "
                f"position {i}); engine times are whole milliseconds"
            )
        return values // den
    if num > 1 and values.size and np.abs(values).max() > np.iinfo(np.int64).max // num:
        raise ValueError(f"{what} in {time_unit} overflow int64 milliseconds")
    return values * num


def detect_epoch_unit(values: np.ndarray, what: str = "times") -> str:
    """The unit (s/ms/us/ns) of present-day integer epochs, from their magnitude.

    Every non-zero value must fall in the same band of ``EPOCH_BANDS`` (1973..5138 AD in
    that unit; 0 is the epoch in any unit); otherwise ``ValueError`` asks for an explicit
    ``time_unit``.
    """
    magnitudes = np.abs(values.astype(np.float64))
    bands = np.unique(epoch_bands(magnitudes[magnitudes > 0]))
    if bands.size == 0:
        return "ms"
    if bands.size == 1 and bands[0] != BELOW_BANDS:
        return EPOCH_BANDS[int(bands[0])][0]
    lo, hi = int(values.min()), int(values.max())
    raise ValueError(
        f"cannot detect the unit of integer {what} (range {lo}..{hi}): they are not all "
        "present-day epochs in one of s/ms/us/ns; pass time_unit='s'/'ms'/'us'/'ns'"
    )


# -- frames and series -------------------------------------------------------------------


def series_history(series: Any, time_unit: str | None, what: str) -> tuple[np.ndarray, np.ndarray]:
    """A pandas Series of closes with a time index as ``(times_ms, closes)``."""
    index = series.index
    if not (is_pandas(index, "DatetimeIndex") or index.dtype.kind in "iu"):
        raise ValueError(
            f"{what}: a Series needs a DatetimeIndex (or an integer epoch index) for its "
            f"bar times, got a {type(index).__name__} of {index.dtype}"
        )
    return times_to_ms(index, time_unit, what=f"{what} index"), closes_array(series)


#: Default column names of a long bar table.
DEFAULT_COLUMNS = {"symbol": "symbol", "time": "time", "close": "close"}


def column_names(columns: Mapping[str, str] | None) -> tuple[str, str, str]:
    """(symbol, time, close) column names from a ``{"time": "open_time", ...}`` mapping."""
    names = dict(DEFAULT_COLUMNS)
    for key, value in (columns or {}).items():
        if key not in DEFAULT_COLUMNS:
            raise ValueError(f"columns keys must be symbol/time/close, got {key!r}")
        if not isinstance(value, str):
            raise ValueError(f"columns[{key!r}] must be a column name (str), got {value!r}")
        names[key] = value
    return names["symbol"], names["time"], names["close"]


def _table(frame: Any) -> Any:
    """A pandas DataFrame or Arrow Table as it is; an Arrow RecordBatch as a Table."""
    if is_arrow(frame, "RecordBatch"):
        import pyarrow as pa

        return pa.Table.from_batches([frame])
    return frame


def _names(table: Any) -> list[Any]:
    return list(table.column_names) if is_arrow(table, "Table") else list(table.columns)


def missing_columns(frame: Any, names: Sequence[str]) -> list[str]:
    """Those of ``names`` that are not columns of a long table, in order."""
    present = _names(_table(frame))
    return [name for name in names if name not in present]


def float_columns(frame: Any, names: Sequence[str]) -> list[np.ndarray]:
    """Columns of a long table (all present: :func:`missing_columns`) as float64 arrays;
    missing values become NaN, which the caller rejects."""
    frame = _table(frame)
    if is_arrow(frame, "Table"):
        return [closes_array(frame.column(name), name) for name in names]
    return [closes_array(frame[name], name) for name in names]


def frame_columns(
    frame: Any, *, columns: Mapping[str, str] | None = None, time_unit: str | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A long table of bars as ``(symbols (object), times_ms (int64), closes (float64))``.

    ``frame`` is a pandas DataFrame or an Arrow Table/RecordBatch; ``columns`` renames
    the symbol/time/close columns. A DataFrame without the time column takes its times
    from a DatetimeIndex.
    """
    symbol_col, time_col, close_col = column_names(columns)
    frame = _table(frame)
    missing = missing_columns(frame, (symbol_col, close_col))
    use_index = bool(missing_columns(frame, (time_col,)))
    if use_index and not is_pandas(getattr(frame, "index", None), "DatetimeIndex"):
        missing.append(time_col)
    if missing:
        raise ValueError(
            f"bar table has no column(s) {', '.join(map(repr, missing))} "
            f"(columns: {_names(frame)}); "
            "name them with columns={'symbol': ..., 'time': ..., 'close': ...}"
        )
    if is_arrow(frame, "Table"):
        symbols = frame.column(symbol_col).to_numpy(zero_copy_only=False).astype(object)
        times = times_to_ms(frame.column(time_col), time_unit, what=f"column {time_col!r}")
    else:
        symbols = frame[symbol_col].to_numpy(dtype=object)
        source = frame.index if use_index else frame[time_col]
        times = times_to_ms(source, time_unit, what=f"column {time_col!r}")
    (closes,) = float_columns(frame, (close_col,))
    return symbols, times, closes


def history_from(
    history: Any,
    *,
    columns: Mapping[str, str] | None = None,
    time_unit: str | None = None,
) -> Mapping[str, Any]:
    """``Engine.warmup``'s history as ``{symbol: (times_ms, closes)}`` where it needs converting.

    A long table is split per symbol (row order kept); a mapping's values may be
    ``(times, closes)`` pairs with any supported times, or pandas Series with a time
    index. Values that are neither are passed through for the engine to reject.
    """
    if is_frame(history):
        symbols, times, closes = frame_columns(history, columns=columns, time_unit=time_unit)
        return _split_by_symbol(symbols, times, closes)
    if not isinstance(history, Mapping):
        raise ValueError(
            "history must be a mapping {symbol: (times, closes) or Series}, a pandas "
            f"DataFrame or an Arrow Table, got {type(history).__name__}"
        )
    out: dict[Any, Any] = {}
    for symbol, value in history.items():
        if isinstance(value, tuple):  # the usual form: checked first (thousands of symbols)
            if len(value) == 2 and _needs_conversion(value[0], time_unit):
                what = f"history of {symbol!r} times"
                out[symbol] = (times_to_ms(value[0], time_unit, what=what), closes_array(value[1]))
            else:
                out[symbol] = value
        elif is_pandas(value, "Series"):
            out[symbol] = series_history(value, time_unit, f"history of {symbol!r}")
        else:
            out[symbol] = value
    return out


def _needs_conversion(times: Any, time_unit: str | None) -> bool:
    """True unless ``times`` is already a plain integer sequence in engine ms."""
    if time_unit is not None:
        return True
    if isinstance(times, np.ndarray):  # anything but small integers is checked/converted
        kind = times.dtype.kind
        if kind in "Mf":
            return True
        if kind not in "iu" or times.size == 0:
            return False
        if times.max() >= _MS_LIMIT:
            return True
        # min and max need no temporary; |x| itself only where a time is that negative
        return bool(times.min() <= -_MS_LIMIT and np.abs(times).max() >= _MS_LIMIT)
    if is_pandas(times, "Series", "Index") or is_arrow(times, "Array", "ChunkedArray"):
        return True
    if isinstance(times, (list, tuple)) and times:
        return is_datetime_like(times[0])
    return False


def _split_by_symbol(symbols: np.ndarray, times: np.ndarray, closes: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if symbols.size == 0:
        return out
    keys = symbols.astype(str) if all(isinstance(s, str) for s in symbols) else None
    if keys is None:
        bad = next(s for s in symbols if not isinstance(s, str))
        raise ValueError(f"symbol column must hold strings, found {bad!r}")
    bad = next((s for s in symbols if "\x00" in s), None)  # a str array drops trailing NULs
    if bad is not None:
        raise ValueError(f"symbols must not hold NUL characters, found {bad!r}")
    order = np.argsort(keys, kind="stable")
    uniq, starts = np.unique(keys[order], return_index=True)
    bounds = [*starts[1:], order.size]
    first_seen = np.argsort([order[s] for s in starts])  # symbols in order of appearance
    for k in first_seen:
        rows = order[starts[k] : bounds[k]]
        out[str(uniq[k])] = (times[rows], closes[rows])
    return out


def bars_from(
    bars: Any,
    *,
    columns: Mapping[str, str] | None = None,
    time_unit: str | None = None,
) -> list[tuple[Any, int, float]] | None:
    """``Engine.step``'s bars as ``(symbol, time_ms, close)`` tuples, or None when ``bars``
    is already a plain iterable for the engine's own parser.

    Converted: a long DataFrame/Arrow table, a mapping ``{symbol: Series}``, and a list of
    tuples whose first time is a datetime (or any list when ``time_unit`` is given).
    """
    if is_frame(bars):
        symbols, times, closes = frame_columns(bars, columns=columns, time_unit=time_unit)
        return list(zip(symbols.tolist(), times.tolist(), closes.tolist(), strict=True))
    if isinstance(bars, Mapping):
        out: list[tuple[Any, int, float]] = []
        for symbol, series in bars.items():
            if not is_pandas(series, "Series"):
                raise ValueError(
                    f"step() given a mapping: values must be pandas Series with a time index, "
                    f"got {type(series).__name__} for {symbol!r}"
                )
            times, closes = series_history(series, time_unit, f"bars of {symbol!r}")
            out.extend((symbol, t, c) for t, c in zip(times.tolist(), closes.tolist(), strict=True))
        return out
    if isinstance(bars, (list, tuple)) and bars:
        first = bars[0]
        dated = isinstance(first, tuple) and len(first) == 3 and is_datetime_like(first[1])
        if dated or time_unit is not None:
            return [_convert_bar(item, time_unit) for item in bars]
    return None


def _convert_bar(item: Any, time_unit: str | None) -> Any:
    """One ``(symbol, time, close)`` with its time in ms; malformed items pass through for
    the engine to reject and count."""
    try:
        symbol, bar_time, close = item
    except (TypeError, ValueError):
        return item
    if isinstance(bar_time, (int, np.integer)) and not isinstance(bar_time, bool) and time_unit:
        return (symbol, time_to_ms(bar_time, time_unit), close)
    if is_datetime_like(bar_time):
        return (symbol, time_to_ms(bar_time), close)
    return item


def bad_ohlc(o: np.ndarray, h: np.ndarray, lo: np.ndarray, c: np.ndarray) -> np.ndarray:
    """True where a bar cannot be traded: a price not finite or not > 0, ``high < low``,
    an open or close outside ``[low, high]``."""
    finite = np.isfinite(o) & np.isfinite(h) & np.isfinite(lo) & np.isfinite(c)
    with np.errstate(invalid="ignore"):
        positive = (o > 0) & (h > 0) & (lo > 0) & (c > 0)
        inside = (lo <= h) & (lo <= o) & (o <= h) & (lo <= c) & (c <= h)
    return ~(finite & positive & inside)


def ohlc_problem(o: float, h: float, lo: float, c: float) -> str:
    """The first check of :func:`bad_ohlc` that a bar it refuses fails, in words."""
    o, h, lo, c = float(o), float(h), float(lo), float(c)
    for name, value in (("open", o), ("high", h), ("low", lo), ("close", c)):
        if not (np.isfinite(value) and value > 0):
            return f"{name} {value!r} is not a finite price > 0"
    if h < lo:
        return f"high {h!r} < low {lo!r}"
    where = f"[low {lo!r}, high {h!r}]"
    if not lo <= o <= h:
        return f"open {o!r} is outside {where}"
    return f"close {c!r} is outside {where}"
