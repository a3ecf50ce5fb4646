"""Klines as engine input: closed ones as one ``Engine.step_arrays`` call (each symbol's
slots looked up once), in-progress ones as preview updates, histories as warmup series."""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

import numpy as np

from atc_stream.connectors.exchanges.klines import Kline
from atc_stream.core.results import StepResult
from atc_stream.engine.engine import Engine
from atc_stream.engine.parsing import fan_out

#: ``Kline`` fields by position (``Kline._fields``), read in C
_SYMBOL, _OPEN_TIME, _OPEN, _HIGH, _LOW, _CLOSE = (itemgetter(i) for i in (0, 1, 3, 4, 5, 6))


class KlineStepper:
    """Steps ``engine`` with closed klines of ``symbols`` as slot, time and price arrays:
    the engine's per-item parsing of ``(symbol, time, close)`` tuples is left out.
    ``ohlc``: the engine trades strategies, so open, high and low go with the close (in
    the steps, the preview updates of ``update`` and the warmup series of ``series``)."""

    def __init__(self, engine: Engine, symbols: Sequence[str], ohlc: bool) -> None:
        self.engine = engine
        self.ohlc = ohlc
        self._slots = {s: engine.slots_of(s).tolist() for s in symbols}
        single = all(len(slots) == 1 for slots in self._slots.values())
        self._single_slot = {s: slots[0] for s, slots in self._slots.items()} if single else None

    def update(self, k: Kline) -> tuple:
        """The engine's update of an in-progress kline: with strategies, its OHLC too."""
        if self.ohlc:
            return (k.symbol, k.open_time, k.open, k.high, k.low, k.close)
        return (k.symbol, k.open_time, k.close)

    def series(self, klines: list[Kline]) -> tuple[np.ndarray, ...]:
        """A warmup history of closed klines: ``(times, closes)``, with strategies
        ``(times, opens, highs, lows, closes)``."""
        times = np.array([k.open_time for k in klines], np.int64)
        fields = ("open", "high", "low", "close") if self.ohlc else ("close",)
        prices = (np.array([getattr(k, f) for k in klines], np.float64) for f in fields)
        return (times, *prices)

    def step(self, klines: list[Kline]) -> tuple[StepResult, int]:
        """One step of ``klines`` (rejections index ``klines``) and their newest open time.

        Each column is read out of the klines by one C loop (``np.fromiter`` over an
        ``itemgetter``): no tuple per field, no Python code per kline."""
        n = len(klines)
        single = self._single_slot
        if single is not None:  # one parameter set: one slot a kline
            slots = np.fromiter(map(single.__getitem__, map(_SYMBOL, klines)), np.int64, n)
            origin = None
        else:
            slots, origin = fan_out([self._slots[k.symbol] for k in klines])
        fields = (_CLOSE, _OPEN, _HIGH, _LOW) if self.ohlc else (_CLOSE,)
        columns = [
            np.fromiter(map(_OPEN_TIME, klines), np.int64, n),
            *(np.fromiter(map(field, klines), np.float64, n) for field in fields),
        ]
        newest = int(columns[0].max())
        if origin is not None:
            columns = [c[origin] for c in columns]
        ohlc = {}
        if self.ohlc:
            ohlc = {"opens": columns[2], "highs": columns[3], "lows": columns[4]}
        result = self.engine.step_arrays(slots, columns[0], columns[1], origin, **ohlc)
        return result, newest
