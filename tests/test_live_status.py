"""What ``atc-stream live`` shows while its feed is unwell, on real local servers: the lag
of the status line and of ``/metrics`` grows while a stalled websocket (open, sending
nothing) delivers no bar, and connect attempts the exchange refuses are counted on both,
not hidden behind ``reconnects 0``."""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

pytest.importorskip("prometheus_client")
pytest.importorskip("aiohttp")
pytest.importorskip("websockets")

from exchange_emulators import INTERVAL  # noqa: E402
from test_live_ops import (  # noqa: E402
    PREFIX,
    SYMBOLS,
    FakeExchange,
    Served,
    assert_metrics_match,
    fast_config,
    free_port,
    get,
    make_bars,
    realtime_exchange,
    samples,
)
from test_live_sigterm import answered, start_live, wait_for  # noqa: E402

from atc_stream import Engine  # noqa: E402
from atc_stream.connectors.exchanges.feed import KlineClient  # noqa: E402

LAG = f"{PREFIX}_last_bar_lag_seconds"


def scraped_lag(url: str) -> float | None:
    return samples(answered(f"{url}/metrics")[1].decode()).get((LAG, ()))


def test_the_lag_grows_while_a_stalled_feed_delivers_no_bar(tmp_path):
    """Once live, the exchange's websocket stalls (open, never sending again; the idle
    timeout is far off): /readyz goes 503, and the lag of the status lines and of the
    metrics page grows with the clock instead of staying at the last bar's."""
    exchange, _ = realtime_exchange(["BTCUSDT", "ETHUSDT"], 40, 400, seed=41)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "live.log"
    with exchange as ex:
        process = start_live(
            ["--symbols", "BTCUSDT,ETHUSDT", "--interval", "1s", "--history", "20",
             "--ws-url", ex.ws_url, "--rest-url", ex.rest_url, "--backend", "cpu",
             "--no-previews", "--status-every", "0.2", "--idle-timeout", "60",
             "--max-seconds", "120", "--log-format", "json", "-o", str(tmp_path / "o.jsonl"),
             "--metrics-port", str(port)], log,
        )  # fmt: skip
        try:
            wait_for("readiness", lambda: answered(f"{url}/readyz")[0] == 200, process, log)
            live_lag = scraped_lag(url)
            assert live_lag is not None and live_lag < 1.5, live_lag
            ex.faults[ex.cursor + 1] = [("stall",)]  # the next close never comes
            wait_for("the stall", lambda: ex.applied["stall"] == 1, process, log)
            stalled_at = time.monotonic()
            wait_for("a 503", lambda: answered(f"{url}/readyz")[0] == 503, process, log)
            lags = []
            while time.monotonic() - stalled_at < 3.5:
                lags.append(scraped_lag(url))
                time.sleep(0.25)
            status_lines = len(log.read_text().splitlines())
            time.sleep(0.5)  # a status line or two more, drawn after the last scrape
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0, log.read_text()
        finally:
            if process.poll() is None:
                process.kill()
    assert None not in lags and lags[-1] >= 2.5, lags
    assert lags == sorted(lags), lags  # with the clock, since the stall
    records = [json.loads(line) for line in log.read_text().splitlines()]
    shown = [r for r in records[status_lines - 1 :] if "| lag " in r["message"]]
    # the status lines drawn after the last scrape: the same lag as /metrics, grown on
    assert shown and shown[-1]["lag_seconds"] >= lags[-1], (shown, lags)
    assert f"| lag {shown[-1]['lag_seconds']:.1f}s |" in shown[-1]["message"]


def test_connect_attempts_the_exchange_refuses_show_on_the_status_line_and_metrics():
    """The websocket's port refuses every connection (REST answers): no handshake ever
    succeeds, so ``reconnects`` stays 0, and the failed attempts are what shows the feed
    retrying: on the status line, in the summary, as ``connect_failures_total``."""
    closes = make_bars(SYMBOLS, 300, seed=42)
    with FakeExchange(closes, 250) as ex:
        config = fast_config(ex, ws_url=f"ws://127.0.0.1:{free_port()}", history=20)
        client = KlineClient(
            Engine(backend="cpu", interval=INTERVAL), SYMBOLS, config,
            clock_ms=lambda: ex.now_ms, seed=7,
        )  # fmt: skip
        lines: list[str] = []
        run = {"max_seconds": 1.5, "status_every": 0.1,
               "on_status": lambda stats: lines.append(stats.status_line())}  # fmt: skip
        with Served(client, **run) as served:
            served.wait(60)
            found = samples(get(f"{served.url}/metrics")[1].decode())
            stats = client.stats
    failed = stats.connect_failures
    assert stats.connects == stats.reconnects == 0
    assert failed >= 3 and failed == stats.disconnects["connect_failed"], stats.disconnects
    assert found[(f"{PREFIX}_connect_failures_total", ())] == failed
    assert_metrics_match(found, stats)
    shown = [int(m.group(1)) for m in map(re.compile(r"reconnects 0 \((\d+) connects failed\)")
                                          .search, lines) if m]  # fmt: skip
    assert shown and shown[-1] >= 2 and shown == sorted(shown), lines
    assert f"connects failed {failed}" in "\n".join(stats.lines())


def test_one_quiet_symbol_does_not_make_a_healthy_feeds_lag_grow():
    from atc_stream.connectors.exchanges.config import LiveStats

    minute = 60_000
    newest, quiet = 100 * minute, 90 * minute  # the quiet pair's last bar: ten bars ago
    stats = LiveStats()
    stats.note_lag(newest + 2 * minute - 1, [newest, quiet, None], "1m")
    assert stats.last_bar_lag_ms is None  # the newest symbol's next bar is not due yet
    stats.note_lag(newest + 2 * minute + 5_000, [newest, quiet], "1m")
    assert stats.last_bar_lag_ms == 5_000.0  # no symbol brought it: the feed stalls
