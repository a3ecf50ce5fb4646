"""What the live feed keeps per symbol, and the items its queue carries besides klines."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from atc_stream.connectors.exchanges.exchange import KlineHistory
from atc_stream.connectors.exchanges.klines import Kline
from atc_stream.connectors.exchanges.timing import StampedQueue


@dataclass
class SymbolState:
    """What the feed knows of one symbol between steps."""

    last: int | None = None  #: open time of the last applied closed bar
    filled_until: int | None = None  #: REST was asked about every bar opening before this
    held: deque = field(default_factory=deque)  #: closed klines waiting for REST
    held_preview: Kline | None = None
    preview: Kline | None = None  #: newest in-progress kline of this batch
    backfill: asyncio.Task[None] | None = None
    failures: int = 0  #: backfills of this symbol that failed in a row
    warming: bool = False  #: its history is being fetched for the warmup


class BackfillDone(NamedTuple):
    """A backfill's bars (or its failure), queued for the engine."""

    symbol: str
    start: int
    bound: int | None  #: exclusive end (a later bar's open time); None: up to the clock
    bars: list[Kline]  #: empty when ``error`` is set
    error: BaseException | None


class WarmupDone(NamedTuple):
    """Fetched histories, queued for one batched warmup."""

    #: (symbol, REST's klines from before ``live_from`` up to the fetch) of each symbol
    histories: list[tuple[str, list[Kline]]]


class RunIO(NamedTuple):
    """Where one ``run`` gets bars from: made inside its event loop, passed down."""

    rest: KlineHistory
    #: websocket klines, fetched histories and finished backfills, in the order the
    #: engine takes them
    queue: StampedQueue
