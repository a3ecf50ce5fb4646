"""The live feed's knobs (``LiveConfig``) and what it did so far (``LiveStats``)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, fields

from atc_stream.connectors.exchanges.timing import (
    LATENCY_BUCKETS,
    STEP_BUCKETS,
    BucketHistogram,
)
from atc_stream.connectors.retry import Backoff
from atc_stream.core.intervals import next_open


@dataclass
class LiveConfig:
    """Knobs of ``KlineClient`` (seconds unless stated). Invalid values raise ``ValueError``."""

    ws_url: str | None = None  #: websocket base URL; None: the exchange's
    rest_url: str | None = None  #: REST base URL; None: the exchange's
    history: int = 1000  #: closed bars per fresh symbol fetched for warmup (0: none)
    #: streams (topics) per websocket connection, at most the exchange's own limit
    max_streams_per_connection: int = 1024
    previews: bool = True  #: compute previews for in-progress klines
    ping_interval: float | None = 20.0
    ping_timeout: float | None = 20.0
    idle_timeout: float | None = 60.0  #: no message for this long → reconnect
    open_timeout: float = 10.0
    close_timeout: float = 2.0
    #: reconnects and retries wait ``backoff`` (``retry.Backoff``) made of these four
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    backoff_factor: float = 2.0
    backoff_jitter: float = 0.5  #: each delay is shortened by a random 0..jitter of itself
    #: REST weight the exchange allows per window (``limits.WeightRules``; Binance spot:
    #: 6,000 a minute); None: the exchange's. 90% of it is spent at most
    rest_weight_budget: int | None = None
    rest_timeout: float = 10.0  #: per request
    rest_retries: int = 5  #: extra tries per request on 429/5xx/timeouts/garbage
    rest_concurrency: int = 64  #: REST requests in flight at most
    gap_confirm_retries: int = 2  #: re-asks when REST lacks the last bar of a gap
    gap_confirm_delay: float = 1.0
    max_held: int = 10_000  #: klines held per symbol while it is backfilled
    max_batch: int = 100_000  #: queue items per engine step
    max_queue: int = 100_000  #: parsed klines waiting for the engine (backpressure)
    max_message_bytes: int = 1 << 20
    #: offer permessage-deflate. Off by default: klines are a few hundred bytes, and
    #: inflating each costs ~7 us of CPU on the latency path (about half of reading it)
    ws_compression: bool = False
    #: ms before each burst of closed klines is expected at which the step's path runs
    #: once on a preview, nothing sent, so the burst finds it in the CPU's caches (0: off)
    warm_before_ms: float = 3.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("ws_url", "rest_url"):
                if value is not None and (not isinstance(value, str) or "://" not in value):
                    raise ValueError(f"{f.name} must be a URL like scheme://host, got {value!r}")
            elif f.name in ("previews", "ws_compression"):
                if not isinstance(value, bool):
                    raise ValueError(f"{f.name} must be a bool, got {value!r}")
            elif f.name == "rest_weight_budget":
                if value is not None and (
                    isinstance(value, bool) or not isinstance(value, int) or value < 1
                ):
                    raise ValueError(f"rest_weight_budget must be an int >= 1, got {value!r}")
            elif f.name in ("history", "rest_retries", "gap_confirm_retries"):
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"{f.name} must be an int >= 0, got {value!r}")
            elif f.name in (
                "max_streams_per_connection", "rest_concurrency", "max_held",
                "max_batch", "max_queue", "max_message_bytes",
            ):  # fmt: skip
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"{f.name} must be an int >= 1, got {value!r}")
            elif f.name in ("ping_interval", "ping_timeout", "idle_timeout"):
                if value is not None and not (isinstance(value, (int, float)) and value > 0):
                    raise ValueError(f"{f.name} must be > 0 or None, got {value!r}")
            elif f.name.startswith("backoff_"):
                continue  # checked by the Backoff they make, below
            elif f.name in ("gap_confirm_delay", "warm_before_ms"):
                if isinstance(value, bool) or not (isinstance(value, (int, float)) and value >= 0):
                    raise ValueError(f"{f.name} must be >= 0, got {value!r}")
            elif not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"{f.name} must be > 0, got {value!r}")
        self.backoff  # noqa: B018  (building it checks the backoff_* fields)

    @property
    def backoff(self) -> Backoff:
        """The reconnect and retry delays of the ``backoff_*`` fields."""
        return Backoff(
            self.backoff_initial, self.backoff_max, self.backoff_factor, self.backoff_jitter
        )


@dataclass
class LiveStats:
    """What a ``KlineClient`` did so far (read at any time)."""

    symbols: int = 0
    connections: int = 0  #: websocket connections the symbols are spread over
    open_connections: int = 0
    connects: int = 0  #: successful websocket handshakes
    reconnects: int = 0  #: handshakes after the first one of a connection
    #: connect attempts that failed (refused, timed out, handshake refused): a feed that
    #: cannot reach the exchange retries with no handshake, so ``reconnects`` stays 0
    connect_failures: int = 0
    messages: int = 0  #: websocket messages received
    warmup_bars: int = 0
    bars: int = 0  #: closed (symbol, bar)s applied after warmup (websocket + backfill)
    closed_klines: int = 0  #: of which came from the websocket
    #: of which came from REST (backfills; at start-up, bars closed after ``live_from``)
    backfilled_bars: int = 0
    backfills: int = 0  #: REST backfills started
    backfill_failures: int = 0
    #: websocket klines held during a warmup or backfill whose REST answer brought them
    backfill_overlap: int = 0
    previews: int = 0  #: (symbol, bar) previews computed
    previews_superseded: int = 0  #: in-progress klines replaced by a newer one before use
    rows_out: int = 0  #: result rows passed to ``on_result``
    rest_requests: int = 0
    rest_weight_used: int = 0  #: REST weight used in the exchange's current window, as last known
    #: REST requests of the latest run that waited for the weight budget or a 429 pause
    rest_limit_waits: int = 0
    rest_limit_wait_s: float = 0.0  #: seconds they waited, summed over them
    #: how far behind the feed is (ms): clock minus the close of the newest bar applied,
    #: when it was applied; while a closed bar is overdue, clock minus that bar's close
    #: (``note_lag``), so a stalled feed's lag grows
    last_bar_lag_ms: float | None = None
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None  #: set when ``run`` returns
    rejections: Counter = field(default_factory=Counter)  #: bad input by reason
    disconnects: Counter = field(default_factory=Counter)  #: connection ends by reason
    http_retries: Counter = field(default_factory=Counter)  #: REST retries by reason
    engine_rejections: Counter = field(default_factory=Counter)  #: engine's, during the run
    #: seconds of each ``Engine.step`` of closed bars
    step_seconds: BucketHistogram = field(default_factory=lambda: BucketHistogram(STEP_BUCKETS))
    #: seconds from a closed websocket kline's receipt to its result's hand-off (publisher)
    kline_to_publish_seconds: BucketHistogram = field(
        default_factory=lambda: BucketHistogram(LATENCY_BUCKETS)
    )

    @property
    def seconds(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    @property
    def bars_per_second(self) -> float:
        s = self.seconds
        return self.bars / s if s > 0 else 0.0

    def note_lag(self, now_ms: int, lasts: Iterable[int | None], interval: str) -> None:
        """The lag at ``now_ms`` of symbols whose last applied bars open at ``lasts`` (None:
        no bar yet). While the bar after the newest of them has closed and is not applied
        (no symbol brings its next bar: the feed stalls), the lag is the time since that
        close: it grows with the clock, not frozen at the last bar's, until a bar comes
        (its step then measures the lag afresh). One quiet symbol (a pair not trading)
        does not make a healthy feed's lag grow; ``/readyz`` names such symbols."""
        known = [last for last in lasts if last is not None]
        if not known:
            return
        due = next_open(next_open(max(known), interval), interval)  # the next bar's close
        if now_ms > due and (self.last_bar_lag_ms is None or now_ms - due > self.last_bar_lag_ms):
            self.last_bar_lag_ms = float(now_ms - due)

    def status_line(self) -> str:
        lag = "-" if self.last_bar_lag_ms is None else f"{self.last_bar_lag_ms / 1000:.1f}s"
        rejected = sum(self.rejections.values()) + sum(self.engine_rejections.values())
        # failed connects only when there are some: a healthy feed's line stays short
        failed = f" ({self.connect_failures} connects failed)" if self.connect_failures else ""
        return (
            f"live {self.symbols} symbols | {self.open_connections}/{self.connections} conn | "
            f"{self.bars} bars ({self.bars_per_second:.1f}/s) | previews {self.previews} | "
            f"lag {lag} | reconnects {self.reconnects}{failed} | rejected {rejected}"
        )

    def lines(self) -> list[str]:
        def fmt(counter: Counter) -> str:
            return ", ".join(f"{k}={v}" for k, v in sorted(counter.items())) or "none"

        return [
            f"symbols          {self.symbols} over {self.connections} connection(s)",
            f"bars             {self.warmup_bars} warmup + {self.bars} live "
            f"({self.closed_klines} websocket, {self.backfilled_bars} backfilled)",
            f"time             {self.seconds:.1f} s ({self.bars_per_second:.1f} bars/s)",
            f"previews         {self.previews} ({self.previews_superseded} superseded)",
            f"messages         {self.messages}; connects {self.connects}, "
            f"reconnects {self.reconnects}, connects failed {self.connect_failures}",
            f"disconnects      {fmt(self.disconnects)}",
            f"REST             {self.rest_requests} requests, {self.backfills} backfills "
            f"({self.backfill_failures} failed); retries: {fmt(self.http_retries)}",
            f"REST weight      {self.rest_weight_used} used in the window; "
            f"{self.rest_limit_waits} requests waited ({self.rest_limit_wait_s:.1f} s)",
            f"rejected input   {fmt(self.rejections)}",
            f"engine rejected  {fmt(self.engine_rejections)}",
        ]
