"""The live feed's Prometheus metrics, read from its ``LiveStats`` when scraped: nothing is
counted twice and the kline path pays nothing for them (docs/design/live-feed.md).

Needs the ``metrics`` extra (prometheus-client), imported when a scrape collects.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from atc_stream.connectors.exchanges.feed import KlineClient
from atc_stream.connectors.exchanges.timing import BucketHistogram

#: Prefix of every metric of the live feed.
PREFIX = "atc_stream_live"

#: Counters: (metric name, ``LiveStats`` field, help). A field the feed does not have
#: (the REST limiter's, on a feed without one) reads 0.
COUNTERS = (
    ("signal_rows", "rows_out", "Signal rows out (closed bars; the warmup's last too)."),
    ("previews", "previews", "In-progress klines previewed."),
    ("messages", "messages", "Websocket messages received."),
    ("connects", "connects", "Websocket handshakes that succeeded."),
    ("reconnects", "reconnects", "Websocket handshakes after a connection's first."),
    (
        "connect_failures",
        "connect_failures",
        "Websocket connect attempts that failed (refused, timed out, handshake refused).",
    ),
    ("rest_requests", "rest_requests", "REST requests sent."),
    (
        "rest_limit_waits",
        "rest_limit_waits",
        "REST requests that waited for the weight budget or a 429 pause.",
    ),
    (
        "rest_limit_wait_seconds",
        "rest_limit_wait_s",
        "Seconds REST requests waited for the weight budget or a 429 pause, summed.",
    ),
    ("backfills", "backfills", "REST backfills of gaps started."),
    ("backfill_failures", "backfill_failures", "REST backfills that failed (and were retried)."),
)
#: Counters by one label: (metric name, label, ``LiveStats`` Counter field, help).
BY_REASON = (
    ("disconnects", "reason", "disconnects", "Websocket connection ends, by reason."),
    ("rest_retries", "reason", "http_retries", "REST retries, by reason."),
)
#: Gauges of ``LiveStats`` fields: (metric name, field, help).
GAUGES = (
    ("symbols", "symbols", "Symbols followed."),
    ("connections", "connections", "Websocket connections the symbols are spread over."),
    ("open_connections", "open_connections", "Websocket connections open now."),
    ("rest_weight_used", "rest_weight_used", "REST weight used in the exchange's window."),
)


class LiveCollector:
    """A prometheus-client collector (``registry.register(LiveCollector(client))``) of a
    ``KlineClient``'s counters, gauges and timing histograms. ``collect`` runs in the
    client's event loop (``ops_server``), so one scrape sees the counters between two
    batches, never in the middle of one. ``snapshotter`` (optional) adds its counts."""

    def __init__(self, client: KlineClient, snapshotter: Any | None = None) -> None:
        self.client = client
        self.snapshotter = snapshotter

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self.client.stats_now()
        bars = CounterMetricFamily(
            f"{PREFIX}_bars", "Closed bars applied, by where they came from.", labels=["source"]
        )
        bars.add_metric(["websocket"], stats.closed_klines)
        bars.add_metric(["backfill"], stats.backfilled_bars)
        bars.add_metric(["warmup"], stats.warmup_bars)
        yield bars
        rejections = CounterMetricFamily(
            f"{PREFIX}_rejections", "Bad input left out, by stage and reason.",
            labels=["stage", "reason"],
        )  # fmt: skip
        for stage, counts in (("feed", stats.rejections), ("engine", stats.engine_rejections)):
            for reason, count in sorted(counts.items()):
                rejections.add_metric([stage, reason], count)
        yield rejections
        for name, field, doc in COUNTERS:
            yield CounterMetricFamily(f"{PREFIX}_{name}", doc, getattr(stats, field))
        for name, label, field, doc in BY_REASON:
            family = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=[label])
            for reason, count in sorted(getattr(stats, field).items()):
                family.add_metric([reason], count)
            yield family
        gauges = [(f"{PREFIX}_{name}", doc, getattr(stats, field)) for name, field, doc in GAUGES]
        gauges += [
            (f"{PREFIX}_symbols_live", "Symbols whose last bar is the latest closed one.",
             len(self.client.symbols) - len(self.client.not_live())),
            (f"{PREFIX}_queue_depth", "Klines and backfills waiting for the engine.",
             self.client.queue_depth()),
            (f"{PREFIX}_uptime_seconds", "Seconds since the feed started.", stats.seconds),
        ]  # fmt: skip
        if stats.last_bar_lag_ms is not None:
            lag = ("Seconds the feed is behind: clock minus the close of the newest bar "
                   "applied, when it was applied; while a closed bar is overdue, clock minus "
                   "its close (it grows while no bar comes).")  # fmt: skip
            gauges.append((f"{PREFIX}_last_bar_lag_seconds", lag, stats.last_bar_lag_ms / 1000))
        for name, doc, value in gauges:
            yield GaugeMetricFamily(name, doc, value)
        yield histogram("step_seconds", "Seconds of one engine step of closed bars.",
                        stats.step_seconds)  # fmt: skip
        yield histogram("kline_to_publish_seconds", "Seconds from a closed websocket kline's "
                        "receipt to its result's hand-off to the publisher.",
                        stats.kline_to_publish_seconds)  # fmt: skip
        if self.snapshotter is not None:
            written, failed = self.snapshotter.snapshots_written, self.snapshotter.failures
            yield CounterMetricFamily(f"{PREFIX}_snapshots", "Snapshots written.", written)
            yield CounterMetricFamily(f"{PREFIX}_snapshot_failures", "Snapshots failed.", failed)


def histogram(name: str, doc: str, source: BucketHistogram) -> Any:
    """The ``HistogramMetricFamily`` of a ``BucketHistogram``."""
    from prometheus_client.core import HistogramMetricFamily
    from prometheus_client.utils import floatToGoString

    buckets = [(floatToGoString(bound), count) for bound, count in source.cumulative()]
    return HistogramMetricFamily(f"{PREFIX}_{name}", doc, buckets=buckets, sum_value=source.sum)
