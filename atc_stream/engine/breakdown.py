"""Warn once per stream when its signal turns na on a ready bar: its equities overflowed."""

from __future__ import annotations

import logging

import numpy as np

from atc_stream.core.params import ATCParams
from atc_stream.core.results import StepResult
from atc_stream.state import layout as L
from atc_stream.state.arrays import StateStore

log = logging.getLogger("atc_stream")

#: streams named in full in one warning; the others are counted
NAMED = 5


class BreakdownWatch:
    """Finds the ready rows of a result whose signal is na, and warns once per stream.

    A ready row's signal is ``Σ Cut(F)·S / Σ S`` with every ``S >= 0.25``: it is na only
    when an equity overflowed to infinity. The growth factor ``exp(λ·(i − cutout))``
    multiplies every return (docs/spec.md), so once it is large an equity multiplies by
    a huge ``1 + R·growth`` on a bar and overflows: after a few hundred bars with ``La``
    1000, after millions with the default. The math says na there, as Pine would; the
    user must hear it rather than find nulls. While every signal is a number the check
    costs one ``isnan`` pass per result.
    """

    def __init__(self) -> None:
        self._warned = np.zeros(0, bool)  # per slot

    def forget(self, slot: int) -> None:
        """A slot's stream is gone: a new stream there is warned about afresh."""
        if slot < self._warned.shape[0]:
            self._warned[slot] = False

    def check(self, result: StepResult, store: StateStore) -> None:
        signal = result.fields.get("signal")
        if signal is None or result.provisional:
            return
        na = np.isnan(signal)
        if not na.any():
            return
        bar_index = result.fields["bar_index"]
        rows = np.flatnonzero(na & (bar_index >= result.ready_from))
        if rows.size == 0:
            return
        if self._warned.shape[0] < store.capacity:
            self._warned = np.concatenate(
                [self._warned, np.zeros(store.capacity - self._warned.shape[0], bool)]
            )
        slots = result.slots[rows]
        first = np.unique(slots, return_index=True)[1]  # a stream's first row of the call
        rows, slots = rows[first], slots[first]
        new = ~self._warned[slots]
        if not new.any():
            return
        rows, slots = rows[new], slots[new]
        self._warned[slots] = True
        keys = result.keys
        names = [keys[row].symbol for row in rows[:NAMED]]
        params = store.params.params[int(store.counters[slots[0], L.PARAM_ROW])]
        _warn(names, rows.size, int(bar_index[rows[0]]), params)


def check_series(columns: dict[str, np.ndarray], params: ATCParams, symbol: str) -> None:
    """The same warning for ``compute``'s one series (its schema columns)."""
    rows = np.flatnonzero(np.isnan(columns["signal"]) & columns["ready"])
    if rows.size:
        _warn([symbol or "the series"], 1, int(columns["bar_index"][rows[0]]), params)


def _warn(names: list[str], count: int, bar_index: int, params: ATCParams) -> None:
    """Log the warning for ``count`` streams (``names``: the first of them), the first
    seen at ``bar_index``."""
    from atc_stream.kernels.cpu import growth_factor  # the kernels' own exp (loaded then)

    more = f" and {count - len(names)} more" if count > len(names) else ""
    growth = growth_factor(params.lam, bar_index, params.cutout)
    log.warning(
        "signal is na on a ready bar for %d stream%s (%s%s): an equity overflowed to "
        "infinity (%s at bar_index %d, where the growth factor exp(La/1000·(i − cutout)) "
        "is %.3g with La=%g). The signal is na while that lasts; a smaller La, or a "
        "history that starts later, avoids it (docs/spec.md).",
        count, "" if count == 1 else "s", ", ".join(names), more, names[0], bar_index,
        growth, params.La,
    )  # fmt: skip
