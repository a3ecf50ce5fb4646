"""The live feed: an ``Engine`` kept in step with exchange klines (docs/design/live-feed.md)."""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from atc_stream.connectors.exchanges.bursts import BurstClock
from atc_stream.connectors.exchanges.config import LiveConfig, LiveStats
from atc_stream.connectors.exchanges.engine_lasts import engine_lasts
from atc_stream.connectors.exchanges.exchange import Exchange, KlineConnection, KlineHistory
from atc_stream.connectors.exchanges.feed_items import BackfillDone, RunIO, SymbolState, WarmupDone
from atc_stream.connectors.exchanges.idle_gc import IdleCollector
from atc_stream.connectors.exchanges.kline_steps import KlineStepper
from atc_stream.connectors.exchanges.klines import Kline, same_grid
from atc_stream.connectors.exchanges.limits import WeightLimiter
from atc_stream.connectors.exchanges.rest import RestBanned
from atc_stream.connectors.exchanges.timing import StampedQueue
from atc_stream.connectors.exchanges.venues.binance import BinanceSpot
from atc_stream.core.intervals import (
    approx_interval_ms,
    interval_ms,
    is_calendar,
    next_open,
    validate_interval,
)
from atc_stream.core.results import StepResult
from atc_stream.engine.engine import Engine

log = logging.getLogger("atc_stream.binance")

#: Longest wait for a closed kline after its bar's close before its symbol is not live.
READY_GRACE_MS = 5_000

#: Seconds between the start-up's batched warmups: the histories fetched meanwhile go
#: through one ``Engine.warmup`` (many small calls cost ~3x the CPU of one).
WARMUP_EVERY = 0.2
#: Seconds a start-up warmup is assumed to take per bar of history before one was timed.
WARMUP_SECONDS_PER_BAR = 1e-6


class KlineClient:
    """Feeds an ``Engine`` from an exchange's kline websocket, with REST warmup/backfill.

    >>> client = KlineClient(Engine(interval="1m"), ["BTCUSDT", "ETHUSDT"],
    ...                      LiveConfig(history=1000), on_result=sink.write)
    >>> stats = asyncio.run(client.run(max_seconds=60))

    ``on_result(StepResult)`` gets every closed-bar result (the warmup's last bars
    too); ``on_preview(StepResult)`` every preview (``provisional=True``). The warmup
    takes the bars closed by ``live_from_ms`` (default: the clock when ``run`` starts);
    every bar closing after it is stepped, so its result is emitted.
    ``snapshotter`` (a ``state.snapshotter.Snapshotter``) is told about applied bars;
    ``source_offsets()`` (optional) is called when it takes a snapshot, after the bars'
    results went to ``on_result``, e.g. to record the output's durable position.
    ``publisher`` (a ``redis_loop.LoopPublisher``) gets every closed-bar result first,
    from inside the event loop; ``run`` starts and closes it.
    ``exchange`` (an ``exchange.Exchange``, default Binance spot) says how to talk to
    the venue; the config's URLs default to the exchange's. ``rest_limiter`` spends
    its REST weight budget (default: the exchange's ``limits``, or
    ``config.rest_weight_budget``). ``on_bars(klines)`` gets the closed klines the
    engine applied, warmup included, each symbol's in time order. ``clock_ms`` (ms since
    the epoch) and ``seed`` (jitter) are for tests.
    """

    def __init__(
        self,
        engine: Engine,
        symbols: Sequence[str],
        config: LiveConfig | None = None,
        *,
        on_result: Callable[[StepResult], Any] | None = None,
        on_preview: Callable[[StepResult], Any] | None = None,
        snapshotter: Any | None = None,
        source_offsets: Callable[[], Mapping[str, Any]] | None = None,
        publisher: Any | None = None,
        exchange: Exchange | None = None,
        clock_ms: Callable[[], int] | None = None,
        seed: int | None = None,
        live_from_ms: int | None = None,
        rest_limiter: WeightLimiter | None = None,
        on_bars: Callable[[list[Kline]], Any] | None = None,
    ) -> None:
        self.exchange = exchange = exchange or BinanceSpot()
        if isinstance(symbols, str):
            symbols = [s for s in symbols.split(",") if s.strip()]
        names = list(dict.fromkeys(exchange.normalise_symbol(s) for s in symbols))  # once each
        if not names:
            raise ValueError("symbols must name at least one symbol")
        self.engine = engine
        #: an engine with strategies steps (symbol, time, open, high, low, close) bars
        self._ohlc = bool(engine.strategies)
        self.interval = validate_interval(engine.interval)
        exchange.interval_name(self.interval)  # an interval the exchange has no klines of
        self._interval_ms = None if is_calendar(self.interval) else interval_ms(self.interval)
        self._interval_bound = approx_interval_ms(self.interval)
        self._future_after = 0  # set from the clock before each batch is dispatched
        self.symbols = names
        config = config or LiveConfig()
        self.config = replace(
            config, ws_url=config.ws_url or exchange.ws_url,
            rest_url=config.rest_url or exchange.rest_url,
        )  # fmt: skip
        self.on_result = on_result
        self.on_preview = on_preview
        self.on_bars = on_bars  #: the closed bars applied (warmup included), in order
        self.snapshotter = snapshotter
        self.source_offsets = source_offsets
        self.before_rows: Callable[[], Any] | None = None  #: once, before the first rows
        self.publisher = publisher
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        #: when the next burst of closed klines comes: start-up work runs around it
        self.bursts = BurstClock(self._interval_ms, self.clock_ms)
        self._warmup_seconds_per_bar = WARMUP_SECONDS_PER_BAR
        self.rng = random.Random(seed)
        self.stats = LiveStats(symbols=len(names))
        self.parser = exchange.parser(names, self.interval, self.stats.rejections)
        per = min(self.config.max_streams_per_connection, exchange.max_topics_per_connection)
        self.chunks = [names[i : i + per] for i in range(0, len(names), per)]
        self.stats.connections = len(self.chunks)
        self.engine.add_symbols(names)
        self._stepper = KlineStepper(engine, names, self._ohlc, self._interval_ms, publisher)
        self._state = {s: SymbolState(last=t) for s, t in engine_lasts(self.engine, names).items()}
        self._engine_rejections_at_start = Counter(engine.rejections)
        self._pending: list[Kline] = []  # closed klines for the next step, in order
        self._pending_from_rest: set[int] = set()  # id() of those REST brought
        self._preview_symbols: set[str] = set()
        self._stopper: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        self.rest: KlineHistory | None = None  #: the REST client of the latest ``run``
        self._queue: StampedQueue | None = None  #: the running ``run``'s, for its depth
        self._arrived: list[float] = []  # when the websocket klines in _pending came
        self.live_from_ms = live_from_ms
        self.rest_limiter = rest_limiter
        self._live_from = 0  # the start-up's: bars closing after it are stepped, not warmed
        self._warming = 0  # symbols whose warmup history is not applied yet
        self._warmed: asyncio.Event | None = None
        self._first_backfills: list[asyncio.Future] = []  # the restored symbols'
        self._stream_of: dict[str, KlineConnection] = {}  # the latest run's, by symbol

    # -- helpers ------------------------------------------------------------------------

    def _before_first_rows(self) -> None:  # before the first warmup, step or preview
        hook, self.before_rows = self.before_rows, None
        if hook is not None:
            hook()

    def _emit(self, result: StepResult) -> None:
        self.stats.rows_out += len(result)
        if self.publisher is not None:  # first: the signal's latency; the file can wait
            self.publisher.publish(result)
        if self.on_result is not None:
            self.on_result(result)

    def stop(self) -> None:
        """Ask ``run`` to return (thread-safe)."""
        if self._stopper is None:
            return
        loop, stop = self._stopper
        if loop.is_running():
            loop.call_soon_threadsafe(stop.set)

    # -- run ------------------------------------------------------------------------------

    async def run(
        self,
        *,
        max_seconds: float | None = None,
        max_bars: int | None = None,
        on_status: Callable[[LiveStats], Any] | None = None,
        status_every: float = 1.0,
    ) -> LiveStats:
        """Subscribe, warm up / backfill, and stream until ``stop()``, ``max_seconds`` or
        exactly ``max_bars`` closed bars applied after warmup (backfilled ones too).
        Returns the statistics."""
        import aiohttp

        if max_bars is not None and max_bars < 1:
            raise ValueError(f"max_bars must be >= 1, got {max_bars!r}")
        if max_seconds is not None and not max_seconds > 0:
            raise ValueError(f"max_seconds must be > 0, got {max_seconds!r}")
        stop = asyncio.Event()
        self._stopper = (asyncio.get_running_loop(), stop)
        self.exchange.check_config(self.config)
        if getattr(self.engine.backend, "name", None) == "cpu":
            # load (or compile) every CPU driver before any request is in flight: a first
            # load inside the event loop stalls it, firing REST and idle timeouts; once
            # loaded (``atc-stream live`` does it before connecting) this costs ~ms
            self.engine.compile(strategies=bool(self.engine.strategies))
        self.stats.started = time.monotonic()
        self.stats.ended = None
        self._live_from = self.clock_ms() if self.live_from_ms is None else self.live_from_ms
        deadline = None if max_seconds is None else time.monotonic() + max_seconds

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        tasks: list[asyncio.Future[Any]] = []
        frozen = False
        async with aiohttp.ClientSession(trust_env=True) as session:
            rest = self.exchange.history(
                session, self.config, self.interval, self.stats, self.clock_ms, self.rng,
                limiter=self.rest_limiter, pace=self.bursts.clear_for_page,
            )  # fmt: skip
            self.rest = rest
            io = RunIO(rest, StampedQueue(maxsize=self.config.max_queue))
            try:
                if self.publisher is not None:
                    await self.publisher.start()
                # what the imports and the kernels' loading left behind leaves the
                # collector's view (collected when young): a full collection then scans
                # only objects made since, not ~100-300 ms' worth, and none has to run
                # while bars come in
                gc.collect(1)
                gc.freeze()
                frozen = True
                # the websocket first: every bar closing from then on comes through it, so
                # none falls between a REST answer and the stream
                streams = []
                for index, chunk in enumerate(self.chunks):
                    connection = self.exchange.connection(
                        index, chunk, session, io.queue, self.parser, self.config, self.stats,
                        self.rng, self.interval,
                    )  # fmt: skip
                    streams.append(connection)
                fresh = self._begin_startup(io, streams)
                collector = IdleCollector(self.bursts.room_s)
                consumer = asyncio.ensure_future(self._consume(io, stop, max_bars, collector))
                tasks.append(consumer)
                tasks += [asyncio.ensure_future(stream.run()) for stream in streams]
                startup = asyncio.ensure_future(self._startup(io, fresh))
                stop_wait = asyncio.ensure_future(stop.wait())
                tasks += [startup, stop_wait]
                if on_status is not None:
                    tasks.append(asyncio.ensure_future(self._status_loop(on_status, status_every)))
                if self.config.warm_before_ms:  # the step's path run just before each burst
                    lead, warm = self.config.warm_before_ms / 1000, self._stepper.warm
                    tasks.append(asyncio.ensure_future(self.bursts.before_bursts(lead, warm)))
                await asyncio.wait(
                    [startup, consumer, stop_wait], timeout=left(),
                    return_when=asyncio.FIRST_COMPLETED,
                )  # fmt: skip
                if startup.done():
                    startup.result()  # re-raise a failed start-up (REST unusable, a ban)
                    # the same for the start-up's survivors, once no kline waits: now,
                    # its collection would land in the middle of the first live bars
                    collector.freeze_when_quiet()
                    if not (consumer.done() or stop_wait.done()):
                        await asyncio.wait(
                            [consumer, stop_wait], timeout=left(),
                            return_when=asyncio.FIRST_COMPLETED,
                        )  # fmt: skip
                if consumer.done():
                    consumer.result()  # re-raise a failure of the engine or a callback
            finally:
                tasks += [st.backfill for st in self._state.values() if st.backfill is not None]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                for st in self._state.values():
                    st.backfill = None
                    st.warming = False
                # a kline that came after the last bar wanted waits for nothing now
                self._queue = None
                if self.publisher is not None:
                    await self.publisher.aclose()
                if frozen:
                    gc.unfreeze()
                self._update_engine_rejections()
                self.stats.ended = time.monotonic()
        return self.stats

    def _update_engine_rejections(self) -> None:
        since = Counter(self.engine.rejections)
        self.stats.engine_rejections = since - self._engine_rejections_at_start

    # -- what operations ask (metrics, readiness), from the client's event loop -------------

    def stats_now(self) -> LiveStats:
        """The statistics brought up to date (the run's engine rejections, the lag): what
        the status line and the metrics read."""
        self._update_engine_rejections()
        self.stats.note_lag(self.clock_ms(), [s.last for s in self._state.values()], self.interval)
        return self.stats

    def queue_depth(self) -> int:
        """Klines and finished backfills waiting for the engine (0 when not running)."""
        return 0 if self._queue is None else self._queue.qsize()

    def not_live(self, now_ms: int | None = None, grace_ms: int | None = None) -> dict[str, str]:
        """The symbols that are not live, with why. A symbol is live when its last applied
        bar is the latest closed by the clock (``now_ms``, default ``clock_ms()``) and it
        waits for no backfill. The bar after it counts as closed only ``grace_ms`` after
        its close (default: 5 s, at most half an interval), the time its kline takes to
        come."""
        now = self.clock_ms() if now_ms is None else now_ms
        if grace_ms is None:
            grace_ms = min(READY_GRACE_MS, self._interval_bound // 2)
        out = {}
        for symbol in self.symbols:
            st = self._state[symbol]
            if st.last is None:
                out[symbol] = "no bar yet (warming up)"
            elif st.backfill is not None:
                out[symbol] = "backfilling"
            elif next_open(next_open(st.last, self.interval), self.interval) + grace_ms <= now:
                out[symbol] = f"behind: last bar {st.last}"
        return out

    async def _status_loop(self, on_status: Callable[[LiveStats], Any], every: float) -> None:
        while True:
            await asyncio.sleep(every)
            on_status(self.stats_now())

    # -- startup: warmup fresh symbols, backfill restored ones -------------------------------

    def _begin_startup(self, io: RunIO, streams: Sequence[KlineConnection]) -> list[str]:
        """Before any kline comes: marks the symbols to warm up (their klines are held
        until their history is applied) and starts the backfills of restored ones (each
        once its websocket is open). Returns the symbols to warm up."""
        self._warmed = asyncio.Event()
        self._stream_of = {symbol: stream for stream in streams for symbol in stream.symbols}
        fresh = []
        for symbol in self.symbols:
            st = self._state[symbol]
            if st.last is not None:
                self.stats.backfills += 1
                start = next_open(st.last, self.interval)
                st.backfill = asyncio.ensure_future(self._backfill(io, symbol, start, None, 0.0))
            elif self.config.history > 0:
                st.warming = True
                fresh.append(symbol)
        self._first_backfills = [st.backfill for st in self._state.values() if st.backfill]
        self._warming = len(fresh)
        if not fresh:
            self._warmed.set()
        return fresh

    @property
    def started_up(self) -> bool:
        """The latest run has started up: every fresh symbol's history is applied and every
        restored symbol's first backfill done (one with no bar to bring too)."""
        warmed = self._warmed is not None and self._warmed.is_set()
        return warmed and all(task.done() for task in self._first_backfills)

    async def _startup(self, io: RunIO, fresh: Sequence[str]) -> None:
        """Fetches each fresh symbol's history in one request (when it fits a page) once
        its websocket is open, and returns when every one is applied (``_on_warmups``).
        Histories are passed on together every ``WARMUP_EVERY`` s: one batched warmup."""
        history = self.config.history
        # the last `history` bars closed by `live_from`, and every one closed since
        start = max(0, self._live_from - (history + 2) * approx_interval_ms(self.interval))
        ready: list[tuple[str, list[Kline]]] = []

        async def fetch(symbol: str) -> None:
            await self._subscribed(symbol)
            klines = await io.rest.fetch(symbol, start, self.clock_ms())
            ready.append((symbol, klines))  # looked up after the await: swapped each batch

        fetches = {asyncio.ensure_future(fetch(symbol)) for symbol in fresh}
        try:
            pending = fetches
            while pending:
                done, pending = await asyncio.wait(pending, timeout=WARMUP_EVERY)
                for task in done:
                    task.result()  # a failed fetch ends the start-up
                if ready:
                    batch, ready = ready, []
                    bars = sum(len(klines) for _, klines in batch)
                    # clear of the next burst: symbols already live keep their latency
                    await self.bursts.wait_for_room(bars * self._warmup_seconds_per_bar)
                    await io.queue.put(WarmupDone(batch))
        finally:
            for task in fetches:  # one failed: the others stop too
                task.cancel()
        assert self._warmed is not None
        await self._warmed.wait()

    def _on_warmups(self, io: RunIO, done: Sequence[WarmupDone]) -> None:
        """Applies fetched histories: the bars closed by ``live_from`` in one batched
        warmup, the later ones as steps (their results are emitted), then each symbol's
        held websocket klines (those REST brought too are dropped)."""
        started = time.perf_counter()
        self._before_first_rows()
        history = self.config.history
        histories = [h for item in done for h in item.histories]
        series, later, warm = {}, {}, {}
        for symbol, klines in histories:
            closed = [k for k in klines if k.closed]
            cut = 0
            while cut < len(closed) and self._closes_by(closed[cut], self._live_from):
                cut += 1
            if cut:
                warm[symbol] = closed[max(0, cut - history) : cut]
                series[symbol] = self._stepper.series(warm[symbol])
            later[symbol] = closed[cut:]
        if series:
            result = self.engine.warmup(series)
            self.stats.warmup_bars += sum(len(s[0]) for s in series.values())
            for symbol, last in engine_lasts(self.engine, series).items():
                self._state[symbol].last = last
            self._emit(result)
            if self.on_bars is not None:
                self.on_bars([k for klines in warm.values() for k in klines])
        for symbol, _ in histories:
            st = self._state[symbol]
            st.warming = False
            self._queue_from_rest(st, later[symbol])
            self._release(io, st)
        self._warming -= len(histories)
        if self._warming <= 0 and self._warmed is not None:
            self._warmed.set()
        bars = sum(len(klines) for _, klines in histories)
        if bars:
            self._warmup_seconds_per_bar = (time.perf_counter() - started) / bars

    async def _subscribed(self, symbol: str) -> None:
        """Returns once ``symbol``'s websocket is open (at most ``open_timeout`` later: a
        gap is then backfilled once it is)."""
        connected = self._stream_of[symbol].connected
        if not connected.is_set():
            try:
                await asyncio.wait_for(connected.wait(), self.config.open_timeout)
            except asyncio.TimeoutError:
                pass

    def _closes_by(self, k: Kline, t: int) -> bool:
        """Whether bar ``k`` closed by ``t`` (ms), by the interval's grid."""
        step = self._interval_ms
        return (k.open_time + step if step else next_open(k.open_time, self.interval)) <= t

    # -- the engine side: one consumer applies everything in order -------------------------------

    async def _consume(
        self, io: RunIO, stop: asyncio.Event, max_bars: int | None, collector: IdleCollector
    ) -> None:
        with collector:
            await self._consume_items(io, stop, max_bars, collector)

    async def _consume_items(
        self, io: RunIO, stop: asyncio.Event, max_bars: int | None, collector: IdleCollector
    ) -> None:
        queue = self._queue = io.queue
        max_batch = self.config.max_batch
        while True:
            queue.taken.clear()
            items = [await collector.get(queue)]
            items += queue.take(max_batch - 1)
            # one clock read a batch: a closed kline opening after this is from the future
            self._future_after = self.clock_ms() + self._interval_bound
            # histories that came together are warmed up in one batch, where the first is
            warmups = [item for item in items if isinstance(item, WarmupDone)]
            for item, arrived in zip(items, queue.taken, strict=True):
                if isinstance(item, Kline):
                    if self._dispatch(io, item):  # stepped in this batch
                        self._arrived.append(arrived)
                elif isinstance(item, BackfillDone):
                    self._on_backfill_done(io, item)
                elif warmups:
                    self._on_warmups(io, warmups)
                    warmups = []
            self._flush(None if max_bars is None else max_bars - self.stats.bars)
            del items, item, warmups  # freed here, not by the next burst (a start-up's: ms)
            if max_bars is not None and self.stats.bars >= max_bars:
                stop.set()
                return  # another batch would apply bars past ``max_bars``
            await asyncio.sleep(0)

    def _dispatch(self, io: RunIO, k: Kline, released: bool = False) -> bool:
        """Applies ``k`` to its symbol's state: queued for the next step (True), held for
        a backfill, kept as the preview, or rejected (counted)."""
        symbol, open_time, _, _, _, _, _, _, closed = k
        st = self._state[symbol]
        last, step = st.last, self._interval_ms
        usual = (  # the next bar of a live symbol: what the checks of ``_admits`` accept
            closed
            and step
            and last is not None
            and open_time == last + step
            and open_time <= self._future_after
            and st.backfill is None
            and not st.warming
            and (st.filled_until is None or st.filled_until <= open_time)
        )
        if not usual and not self._admits(io, k, st, released):
            return False
        self._pending.append(k)
        st.last = open_time
        self.stats.closed_klines += 1
        if st.preview is not None and st.preview.open_time <= open_time:
            st.preview = None
        return True

    def _admits(self, io: RunIO, k: Kline, st: SymbolState, released: bool) -> bool:
        """Whether closed ``k`` is to be stepped, every check in turn; any other kline is
        held for a backfill, kept as the preview or rejected (counted), and False."""
        if k.closed and k.open_time > self._future_after:
            # a closed bar cannot open more than one interval after now; applying one
            # would make every later bar of the symbol out of order (a frozen symbol)
            self.parser.reject("future_kline", k)
            return False
        if st.backfill is not None or st.warming:
            self._hold(st, k)
            return False
        last = st.last
        if last is not None:
            if k.open_time <= last:
                if released:  # held while REST was asked, which brought this bar: expected
                    self.stats.backfill_overlap += 1
                    return False
                if not k.closed:
                    reason = "stale_preview"
                elif k.open_time == last:
                    reason = "duplicate_kline"
                else:
                    reason = "out_of_order_kline"
                self.parser.reject(reason, k)
                return False
            step = self._interval_ms  # None for months (calendar bars)
            if not (
                (k.open_time - last) % step == 0
                if step
                else same_grid(last, k.open_time, self.interval)
            ):
                # an open time between two bar times would be applied as an extra bar
                self.parser.reject("off_grid_kline", k)
                return False
            expected = last + step if step else next_open(last, self.interval)
            if st.filled_until is not None and st.filled_until > expected:
                expected = st.filled_until
            if k.open_time > expected:  # bars between were missed: fetch them first
                self._start_backfill(io, k.symbol, st, expected, k.open_time)
                self._hold(st, k)
                return False
        if k.closed:
            return True
        if self.config.previews:
            if st.preview is not None:
                self.stats.previews_superseded += 1
            st.preview = k
            self._preview_symbols.add(k.symbol)
        return False

    def _hold(self, st: SymbolState, k: Kline) -> None:
        if not k.closed:
            if st.held_preview is not None:
                self.stats.previews_superseded += 1
            st.held_preview = k
            return
        st.held.append(k)
        if len(st.held) > self.config.max_held:
            self.parser.reject("held_overflow", st.held.popleft())

    def _start_backfill(
        self, io: RunIO, symbol: str, st: SymbolState, start: int, bound: int | None
    ) -> None:
        self.stats.backfills += 1
        st.backfill = asyncio.ensure_future(self._backfill(io, symbol, start, bound, 0.0))

    async def _backfill(
        self, io: RunIO, symbol: str, start: int, bound: int | None, delay: float
    ) -> None:
        """Fetches the closed bars of ``symbol`` from ``start`` up to ``bound`` (exclusive;
        None: up to the clock, asked once its websocket is open) and queues them for the
        engine."""
        if delay:
            await asyncio.sleep(delay)
        if bound is None:
            await self._subscribed(symbol)
        try:
            for attempt in range(self.config.gap_confirm_retries + 1):
                if bound is None:
                    klines = await io.rest.fetch(symbol, start, self.clock_ms())
                    bars = [k for k in klines if k.closed]
                    break
                klines = await io.rest.fetch(symbol, start, bound - 1)
                bars = [k._replace(closed=True) for k in klines if k.open_time < bound]
                if bars and next_open(bars[-1].open_time, self.interval) >= bound:
                    break
                if attempt < self.config.gap_confirm_retries:
                    await asyncio.sleep(self.config.gap_confirm_delay)
            done = BackfillDone(symbol, start, bound, bars, None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            done = BackfillDone(symbol, start, bound, [], exc)
        await io.queue.put(done)

    def _on_backfill_done(self, io: RunIO, done: BackfillDone) -> None:
        st = self._state[done.symbol]
        st.backfill = None
        if isinstance(done.error, RestBanned):  # retrying would prolong the ban: stop
            raise done.error
        if done.error is not None:
            self.stats.backfill_failures += 1
            delay = self.config.backoff.delay(st.failures, self.rng.random)
            st.failures += 1
            log.warning(
                "backfill of %s from %d failed (%s); retrying in %.2f s",
                done.symbol, done.start, done.error, delay,
            )  # fmt: skip
            st.backfill = asyncio.ensure_future(
                self._backfill(io, done.symbol, done.start, done.bound, delay)
            )
            return
        st.failures = 0
        self._queue_from_rest(st, done.bars)
        if done.bound is not None:
            st.filled_until = max(st.filled_until or done.bound, done.bound)
        self._release(io, st)

    def _queue_from_rest(self, st: SymbolState, klines: list[Kline]) -> None:
        """Queues for the next step the closed klines from REST after ``st``'s last bar."""
        for k in klines:
            if st.last is None or k.open_time > st.last:
                self._pending.append(k)
                self._pending_from_rest.add(id(k))
                st.last = k.open_time
                self.stats.backfilled_bars += 1

    def _release(self, io: RunIO, st: SymbolState) -> None:
        """Dispatches the klines held while REST was asked, in order (those it brought
        are dropped as overlap)."""
        held, st.held = st.held, deque()
        preview, st.held_preview = st.held_preview, None
        for k in held:
            self._dispatch(io, k, released=True)
        if preview is not None:
            self._dispatch(io, preview, released=True)

    def _flush(self, room: int | None = None) -> None:
        """Steps the pending closed klines, at most ``room`` applied (what ``max_bars``
        leaves: the run then stops, the klines past it left to a resume), then previews."""
        if self._pending:
            self._step_pending(room)
        if self._preview_symbols:
            updates = []
            for symbol in sorted(self._preview_symbols):
                st = self._state[symbol]
                k, st.preview = st.preview, None
                if k is None or st.backfill is not None or st.warming:
                    continue
                if st.last is None or k.open_time > st.last:
                    updates.append(self._stepper.update(k))
            self._preview_symbols.clear()
            if updates:
                self._before_first_rows()
                result = self.engine.preview(updates)
                self.stats.previews += len(updates)
                if self.on_preview is not None:
                    self.on_preview(result)

    def _step_pending(self, room: int | None) -> None:
        """``_flush``'s steps: the pending klines, at most ``room`` of them applied."""
        pending, self._pending = self._pending, []
        from_rest, self._pending_from_rest = self._pending_from_rest, set()
        room = len(pending) if room is None else room
        while pending and room > 0:  # more than one step only when the engine rejects some
            klines, pending = pending[:room], pending[room:]
            room -= self._step(klines)
        if pending:  # left to a resume: uncounted, each symbol back at the engine's last bar
            rest = sum(id(k) in from_rest for k in pending)
            self.stats.backfilled_bars -= rest
            self.stats.closed_klines -= len(pending) - rest
            for symbol, last in engine_lasts(self.engine, {k.symbol for k in pending}).items():
                self._state[symbol].last, self._state[symbol].preview = last, None

    def _step(self, klines: list[Kline]) -> int:
        """Steps ``klines`` and emits their results; the number the engine applied."""
        self._before_first_rows()
        started = time.perf_counter()
        result, newest = self._stepper.step(klines)
        self.stats.step_seconds.observe(time.perf_counter() - started)
        rejected = {r.index for r in result.rejected}
        if self.on_bars is not None:
            self.on_bars([k for i, k in enumerate(klines) if i not in rejected])
        applied = len(klines) - len(rejected)
        self.stats.bars += applied
        if rejected:  # resync with what the engine holds: a later kline refetches them
            lasts = engine_lasts(self.engine, {klines[i].symbol for i in rejected})
            for symbol, last in lasts.items():
                self._state[symbol].last = last
        now = self.clock_ms()
        self.stats.last_bar_lag_ms = float(now - next_open(newest, self.interval))
        self.bursts.stepped(newest, now, burst=bool(self._arrived))
        if self._arrived:  # the results are handed to the publisher now
            arrived, self._arrived = np.array(self._arrived), []
            self.stats.kline_to_publish_seconds.observe_many(time.perf_counter() - arrived)
        self._emit(result)
        if self.snapshotter is not None:
            self.snapshotter.maybe_snapshot(applied, self.source_offsets)
        return applied
