"""The interval of bars from their spacing: the most common gap, calendar months included."""

from __future__ import annotations

import numpy as np

from atc_stream.core.intervals import interval_label, interval_ms, is_calendar

DAY_MS = 86_400_000


def common_interval(starts: np.ndarray, gaps: np.ndarray) -> str | None:
    """The interval label of the most common of ``gaps`` (ms, > 0, each from a bar opening
    at ``starts`` to the next bar of its symbol); None without gaps.

    Monthly bars are 28 to 31 days apart, 31 most often: when the most common gap is in
    that range and nine in ten bars open one calendar month after the bar before, at the
    same time into their month (00:00 on the 1st, as exchanges open them), the label is
    ``1M``, not ``31d``.
    """
    if gaps.size == 0:
        return None
    values, counts = np.unique(gaps, return_counts=True)
    common = int(values[np.argmax(counts)])
    if 28 * DAY_MS <= common <= 31 * DAY_MS:
        month, into = _month_and_offset(starts)
        next_month, next_into = _month_and_offset(starts + gaps)
        monthly = (next_month - month == 1) & (next_into == into)
        if 10 * int(monthly.sum()) >= 9 * gaps.size:  # 31-day steps match 7 months in 12
            return "1M"
    return interval_label(common)


def interval_of(codes: np.ndarray, times: np.ndarray) -> str | None:
    """``common_interval`` of bars given as symbol codes and times (any order): the gaps
    between consecutive bars of each symbol; None when no symbol has two bars."""
    if times.shape[0] < 2:
        return None
    order = np.lexsort((times, codes))
    times, codes = times[order], codes[order]
    same = np.diff(codes) == 0
    starts, gaps = times[:-1][same], np.diff(times)[same]
    return common_interval(starts[gaps > 0], gaps[gaps > 0])


def spacing_fits(interval: str, inferred: str) -> bool:
    """Whether bars ``inferred`` apart (their most common spacing, ``common_interval``)
    are ``interval`` bars: the same length, or for N months 28 N to 31 N days."""
    if is_calendar(inferred):  # bars a calendar month apart
        return interval == inferred
    spacing = interval_ms(inferred)
    if not is_calendar(interval):
        return interval_ms(interval) == spacing
    months = int(interval[:-1] or 1)
    return 28 * months * DAY_MS <= spacing <= 31 * months * DAY_MS


def _month_and_offset(times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(months since 1970-01, ms into that month) of epoch-ms ``times``."""
    months = times.astype("datetime64[ms]").astype("datetime64[M]")
    month_start = months.astype("datetime64[ms]").astype(np.int64)
    return months.astype(np.int64), times - month_start
