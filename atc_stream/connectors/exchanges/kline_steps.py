"""Klines as engine input: closed ones as one ``Engine.step_arrays`` call (each symbol's
slots looked up once), in-progress ones as preview updates, histories as warmup series;
and the step's path run once on a preview before a burst (``KlineStepper.warm``)."""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any

import numpy as np

from atc_stream.connectors.exchanges.klines import Kline
from atc_stream.core.messages import encoded_rows
from atc_stream.core.results import StepResult
from atc_stream.engine.engine import Engine
from atc_stream.engine.parsing import fan_out

#: ``Kline`` fields by position (``Kline._fields``), read in C
_SYMBOL, _OPEN_TIME, _OPEN, _HIGH, _LOW, _CLOSE = (itemgetter(i) for i in (0, 1, 3, 4, 5, 6))


class KlineStepper:
    """Steps ``engine`` with closed klines of ``symbols`` as slot, time and price arrays:
    the engine's per-item parsing of ``(symbol, time, close)`` tuples is left out.
    ``ohlc``: the engine trades strategies, so open, high and low go with the close (in
    the steps, the preview updates of ``update`` and the warmup series of ``series``).
    ``interval_ms`` (None: calendar bars) and ``publisher`` (a ``LoopPublisher``, or
    None) are for :meth:`warm`."""

    def __init__(
        self,
        engine: Engine,
        symbols: Sequence[str],
        ohlc: bool,
        interval_ms: int | None = None,
        publisher: Any | None = None,
    ) -> None:
        self.engine = engine
        self.ohlc = ohlc
        self.interval_ms = interval_ms
        self.publisher = publisher
        self._slots = {s: engine.slots_of(s).tolist() for s in symbols}
        single = all(len(slots) == 1 for slots in self._slots.values())
        self._single_slot = {s: slots[0] for s, slots in self._slots.items()} if single else None
        # each slot's latest stepped bar (open time, close): what ``warm`` previews from
        size = max((max(slots) for slots in self._slots.values() if slots), default=-1) + 1
        self._latest_time = np.zeros(size, np.int64)
        self._latest_close = np.zeros(size, np.float64)
        self._stepped = np.zeros(size, np.bool_)

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
        self._latest_time[result.slots] = result.times  # rows the engine applied
        self._latest_close[result.slots] = result.closes
        self._stepped[result.slots] = True
        return result, newest

    def warm(self) -> None:
        """Runs the step's path once without changing anything: a preview of the next bar
        of every slot stepped so far, at its latest close, packed as the publisher would
        send it (when there is one) and cut into JSONL rows, then thrown away.

        Called just before a burst is due (``BurstClock.before_bursts``), it brings the
        state, the kernels' code and the encoders into the CPU's caches; after an idle
        second the burst otherwise meets them evicted (docs/design/live-feed.md)."""
        if self.interval_ms is None:
            return
        slots = np.flatnonzero(self._stepped)
        if slots.shape[0] == 0:
            return
        times = self._latest_time[slots] + self.interval_ms
        closes = self._latest_close[slots]
        result = self.engine.preview_arrays(slots, times, closes, count_rejected=False)
        if len(result) == 0:
            return
        if self.publisher is not None:
            self.publisher.warm(result)
        encoded_rows(result)
