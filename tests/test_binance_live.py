"""Live kline client on Binance spot against real local servers (websocket + HTTP on
127.0.0.1, no mocks).

``FakeExchange`` (``exchange_emulators.BinanceEmulator``) speaks the exchange's
combined-stream kline format and serves ``/api/v3/klines`` from one fixed,
deterministic bar set. Its ticker publishes bar after bar (a few in-progress klines,
then the closed one) to whoever is connected, and can misbehave on cue: close
connections (cleanly, abruptly, mid-message), stall, inject hostile messages, and
answer REST with 429/418/500/timeouts/garbage (reporting the weight used in
``X-MBX-USED-WEIGHT-1M``, as the exchange does). Every test checks that the client's
closed-bar outputs hold every bar exactly once and equal ``atc_stream.compute`` over
the same closes, bit for bit.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("websockets")
pytest.importorskip("aiohttp")

from aiohttp import web  # noqa: E402

from atc_stream import Engine, compute  # noqa: E402
from atc_stream.core.schema import SCHEMA_VERSION

try:  # a real redis-server for the --redis test (skipped without one)
    from redis_fixtures import collected_messages, redis_server, redis_url  # noqa: E402, F401
except ImportError:  # pragma: no cover

    @pytest.fixture
    def redis_url():
        pytest.skip("tests/redis_fixtures.py is not available")


from exchange_emulators import (  # noqa: E402
    IMS,
    INTERVAL,
    T0,
    FakeExchange,
    assert_exact,
    collect,
    compile_kernels,
    fast_config,
    fmt,
    make_bars,
    run_client,
    small_heap,
)
from exchange_emulators import feed as feed_symbols  # noqa: E402

from atc_stream.connectors.exchanges.config import LiveConfig, LiveStats  # noqa: E402
from atc_stream.connectors.exchanges.feed import KlineClient  # noqa: E402
from atc_stream.connectors.exchanges.venues.binance import BinanceParser  # noqa: E402
from atc_stream.connectors.retry import Backoff  # noqa: E402
from atc_stream.core.intervals import interval_ms, next_open  # noqa: E402


def feed(ex: FakeExchange, config: LiveConfig, *, seed: int, **run) -> tuple[LiveStats, list]:
    """A fresh engine fed by a client of ``SYMBOLS`` on ``ex``'s clock: (stats, results)."""
    return feed_symbols(ex, config, SYMBOLS, seed=seed, **run)


SYMBOLS = ["BTCUSDT", "ETHUSDT", "XRPUSDT"]


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels():
    """Compile the engine's kernels first, so no test's client stalls for seconds on it."""
    compile_kernels(INTERVAL)


# -- tests ---------------------------------------------------------------------------------------


def test_warmup_stream_previews_equal_compute():
    closes = make_bars(SYMBOLS, 320)
    start, history = 260, 200
    with FakeExchange(closes, start, wait_connections=2, previews_per_bar=3) as ex:
        engine = Engine(backend="cpu", interval=INTERVAL, outputs="all")
        results, previews = [], []
        client = KlineClient(
            engine, ",".join(s.lower() for s in SYMBOLS), fast_config(ex, history=history,
            max_streams_per_connection=2), on_result=results.append, on_preview=previews.append,
            clock_ms=lambda: ex.now_ms, seed=1,
        )  # fmt: skip
        stats = run_client(client, max_bars=len(SYMBOLS) * (320 - start), max_seconds=60)
    # two connections (2 + 1 streams), each asking for its own streams
    assert stats.connections == 2 and len(ex.paths) == 2
    assert sorted(p.count("@kline_1m") for p in ex.paths) == [1, 2]
    assert all(p.startswith("/stream?streams=") for p in ex.paths)
    assert ex.extensions == [None, None]  # no permessage-deflate unless asked
    assert stats.warmup_bars == len(SYMBOLS) * history
    assert stats.bars == len(SYMBOLS) * (320 - start)
    # bars closing while the history was fetched came from REST (and were dropped from
    # the websocket): no bar needed a backfill
    assert stats.closed_klines + stats.backfilled_bars == stats.bars and stats.backfills == 0
    assert len(ex.rest_requests) == len(SYMBOLS)
    assert not stats.rejections and not stats.engine_rejections
    # warmup row (bar start-1) + every streamed bar, exactly once, bit-identical
    assert_exact(collect(results), closes, start - history, start - 1, 319)
    # previews: provisional, never changed state, equal a full computation with that close
    assert stats.previews > 0
    pv = collect_previews(previews)
    assert pv
    for (sym, t), (close, signal) in list(pv.items())[:: max(1, len(pv) // 12)]:
        i = (t - T0) // IMS
        series = np.append(closes[sym][start - history : i], close)
        assert np.array_equal(signal, compute(series)["signal"][-1], equal_nan=True)
    # stream state ends at the last closed bar, not at any previewed one
    for key in engine.streams:
        assert engine.stream_state(key)["last_time"] == T0 + 319 * IMS


def consumer_locals() -> set[str]:
    """Names bound in the feed's consumer loop (``KlineClient._consume_items``), which
    must be suspended at an ``await``."""
    for task in asyncio.all_tasks():
        coro = task.get_coro()
        while coro is not None and hasattr(coro, "cr_code"):
            if coro.cr_code.co_name == "_consume_items":
                return set(coro.cr_frame.f_locals)
            coro = coro.cr_await
    raise AssertionError("no consumer loop is running")


def test_a_batch_is_freed_once_applied():
    """The consumer holds no batch while it waits for the next: a start-up's batch
    (histories or backfills, tens of thousands of klines at 200 symbols) kept in its
    locals was deallocated by the next batch, the first live burst, delaying its signals
    by milliseconds."""
    closes = make_bars(SYMBOLS, 240, seed=21)
    start, history = 230, 100
    seen: list[set[str]] = []

    def on_result(result) -> None:  # inside the consumer's step: look once it yields
        asyncio.get_running_loop().call_soon(lambda: seen.append(consumer_locals()))

    with FakeExchange(closes, start) as ex:
        client = KlineClient(
            Engine(backend="cpu", interval=INTERVAL, outputs="all"), SYMBOLS,
            fast_config(ex, history=history), on_result=on_result, clock_ms=lambda: ex.now_ms,
        )  # fmt: skip
        run_client(client, max_bars=len(SYMBOLS) * (240 - start), max_seconds=60)
    assert len(seen) >= 2  # the warmup's result, then live steps
    for names in seen:
        assert "queue" in names  # the loop's frame was found
        assert not {"items", "item", "warmups"} & names, names


def collect_previews(previews):
    out = {}
    for res in previews:
        assert res.provisional
        for j, (sym, t) in enumerate(zip(res.symbols, res.times.tolist(), strict=True)):
            out[(sym, t)] = (float(res.closes[j]), float(res.signal[j]))
    return out


def test_disconnects_and_stall_every_bar_once():
    closes = make_bars(SYMBOLS, 300, seed=5)
    start = 220
    rng = random.Random(11)
    actions = ["close", "abort", "midmessage", "close", "abort", "midmessage", "stall"]
    rng.shuffle(actions)
    at = sorted(rng.sample(range(start + 2, 290), len(actions)))
    faults: dict[int, list] = {i: [(a, 1)] for i, a in zip(at, actions, strict=True)}
    faults[299] = [("abort", 1)]  # the very last closed bar is missed
    with FakeExchange(closes, start, faults=faults, bar_pause=0.008) as ex:
        stats, results = feed(
            ex, fast_config(ex, history=150, idle_timeout=0.3), seed=2,
            max_bars=len(SYMBOLS) * (300 - start), max_seconds=60,
        )  # fmt: skip
        applied = ex.applied
    assert stats.bars == len(SYMBOLS) * (300 - start)
    assert_exact(collect(results), closes, start - 150, start - 1, 299)
    assert applied["stall"] == 1 and applied["abort"] >= 2 and applied["midmessage"] == 2
    d = stats.disconnects
    assert d["closed_by_server"] == applied["close"] >= 1
    # abrupt aborts and the frame cut mid-message
    assert d["connection_lost"] == applied["abort"] + applied["midmessage"]
    assert d["idle_timeout"] == 1  # the stall
    assert stats.reconnects == sum(applied.values())
    assert stats.backfilled_bars > 0 and stats.backfill_failures == 0
    assert stats.closed_klines + stats.backfilled_bars == stats.bars
    assert not stats.engine_rejections


def test_hostile_stream_inputs_counted_and_survived():
    closes = make_bars(["BTCUSDT", "ETHUSDT"], 290, seed=9)
    start = 240
    ex0 = FakeExchange(closes, start)  # only used to format messages
    good = ex0.ws_message("BTCUSDT", 250, closes["BTCUSDT"][250], True)
    msg = json.loads(good)

    def variant(**k_changes) -> str:
        m = json.loads(good)
        m["data"]["k"].update(k_changes)
        return json.dumps(m)

    def without(field) -> str:
        m = json.loads(good)
        del m["data"]["k"][field]
        return json.dumps(m)

    unsub = json.loads(good)
    unsub["stream"] = "dogeusdt@kline_1m"
    unsub["data"]["s"] = unsub["data"]["k"]["s"] = "DOGEUSDT"
    hostile = {
        "malformed_json": ['{"stream": "btcusdt@kline_1m", "data": {', "not json at all", "\x00"],
        "not_a_kline": ["[1, 2, 3]", '{"result": null, "id": 1}', json.dumps(
            {"stream": "btcusdt@kline_1m", "data": {"e": "trade", "s": "BTCUSDT"}})],
        "missing_field": [without("c"), without("t"), without("x")],
        "bad_type": [variant(x="true"), variant(s=123)],
        "bad_time": [variant(t="1700000000000"), variant(t=1.5e12), variant(T=None)],
        "bad_number": [variant(c="abc"), variant(o="NaN"), variant(h=[1]), variant(v="1e999")],
        "non_positive_price": [variant(c="0"), variant(c="-5.0")],
        "unsubscribed_symbol": [json.dumps(unsub)],
        "wrong_interval": [variant(i="5m")],
        "inconsistent_message": [json.dumps({**msg, "stream": "ethusdt@kline_1m"})],
    }  # fmt: skip
    faults: dict[int, list] = {}
    i = 246
    for messages in hostile.values():
        for m in messages:
            faults.setdefault(i, []).append(("raw", "BTCUSDT", m))
        i += 2
    # duplicates and out-of-order closed klines of already applied bars, a stale preview
    faults.setdefault(270, []).extend(
        [
            ("raw", "BTCUSDT", ex0.ws_message("BTCUSDT", 268, closes["BTCUSDT"][268], True)),
            ("raw", "BTCUSDT", ex0.ws_message("BTCUSDT", 269, closes["BTCUSDT"][269], True)),
            ("raw", "ETHUSDT", ex0.ws_message("ETHUSDT", 260, closes["ETHUSDT"][260], True)),
            ("raw", "ETHUSDT", ex0.ws_message("ETHUSDT", 261, 1.0, False)),
        ]
    )
    # a closed kline half an interval off the grid (would be an extra bar) and one a day
    # ahead of the exchange's clock (would freeze the symbol): both rejected, counted
    off_grid = json.loads(ex0.ws_message("BTCUSDT", 272, closes["BTCUSDT"][272], True))
    off_grid["data"]["k"]["t"] += IMS // 2
    off_grid["data"]["k"]["T"] += IMS // 2
    future = json.loads(ex0.ws_message("BTCUSDT", 272 + 1440, 1.0, True))
    faults.setdefault(272, []).extend(
        [("raw", "BTCUSDT", json.dumps(off_grid)), ("raw", "BTCUSDT", json.dumps(future))]
    )
    # a closed kline corrupted in transit (the real one never comes): refetched over REST
    corrupt = json.loads(ex0.ws_message("ETHUSDT", 275, closes["ETHUSDT"][275], True))
    corrupt["data"]["k"]["c"] = "12,5"
    with FakeExchange(closes, start, faults=faults) as ex:
        ex.faults.setdefault(275, []).append(("raw", "ETHUSDT", json.dumps(corrupt)))
        engine = Engine(backend="cpu", interval=INTERVAL, outputs="all")
        results = []
        client = KlineClient(
            engine, ["BTCUSDT", "ETHUSDT"], fast_config(ex, history=120),
            on_result=results.append, clock_ms=lambda: ex.now_ms, seed=3,
        )  # fmt: skip
        # the real closed kline of ETHUSDT bar 275 is not sent: drop it from the feed
        original = ex.ws_message

        def ws_message(symbol, i, close, closed):
            if symbol == "ETHUSDT" and i == 275 and closed:
                return json.dumps(corrupt)
            return original(symbol, i, close, closed)

        ex.ws_message = ws_message
        stats = run_client(client, max_bars=2 * (290 - start), max_seconds=60)
    rej = stats.rejections
    for reason, messages in hostile.items():
        expected = len(messages) + (reason == "bad_number") * 2  # + the corrupted close x2
        assert rej[reason] == expected, (reason, rej[reason], expected)
    assert rej["duplicate_kline"] == 1 and rej["out_of_order_kline"] == 2
    assert rej["stale_preview"] == 1
    assert rej["off_grid_kline"] == 1 and rej["future_kline"] == 1
    assert stats.backfills == 1  # ETHUSDT bar 275, from REST
    assert not stats.engine_rejections
    assert_exact(collect(results), closes, start - 120, start - 1, 289)


def test_parameter_sets_fan_out_and_a_kline_the_engine_refuses_is_refetched():
    """Closed klines step as slot arrays: with two parameter sets each kline fans out to
    both streams, and a kline the engine refuses (a paper-trading engine: high < low) is
    mapped back to its symbol, whose missing bar then comes over REST."""
    from short_params import SHORT, SHORT_UNCUT

    from atc_stream import Strategy

    closes = make_bars(["BTCUSDT", "ETHUSDT"], 280, seed=13)
    start, history = 250, 60
    with FakeExchange(closes, start) as ex:
        engine = Engine(
            [SHORT, SHORT_UNCUT], backend="cpu", interval=INTERVAL, outputs="all",
            strategies=Strategy(max_hold=3),
        )  # fmt: skip
        results: list = []
        client = KlineClient(
            engine, ["BTCUSDT", "ETHUSDT"], fast_config(ex, history=history),
            on_result=results.append, clock_ms=lambda: ex.now_ms, seed=4,
        )  # fmt: skip
        original = ex.ws_message

        def ws_message(symbol, i, close, closed):
            message = original(symbol, i, close, closed)
            if symbol == "ETHUSDT" and i == 275 and closed:  # untradeable: high < low
                m = json.loads(message)
                m["data"]["k"].update(h=fmt(close * 0.9), l=fmt(close * 1.1))
                message = json.dumps(m)
            return message

        ex.ws_message = ws_message
        stats = run_client(client, max_bars=2 * (280 - start), max_seconds=60)
    assert stats.engine_rejections == Counter({"bad_ohlc": 1})  # once for its two streams
    assert stats.backfilled_bars == 1  # ETHUSDT bar 275, from REST
    rows: dict = {}
    for res in results:
        for key, t, signal in zip(res.keys, res.times.tolist(), res.signal, strict=True):
            assert (key.symbol, key.params_id, t) not in rows
            rows[(key.symbol, key.params_id, t)] = signal
    span = range(start - 1, 280)
    assert len(rows) == 2 * 2 * len(span)
    for symbol, series in closes.items():
        for params_id, params in enumerate((SHORT, SHORT_UNCUT)):
            want = compute(series[start - history :], params)["signal"]
            got = [rows[(symbol, params_id, T0 + i * IMS)] for i in span]
            assert np.array_equal(got, want[np.array(span) - (start - history)], True)


def test_rest_faults_retried_paged_and_weight_limited():
    from atc_stream.connectors.exchanges.limits import WeightLimiter
    from atc_stream.connectors.exchanges.venues.binance import BINANCE_SPOT

    closes = make_bars(["BTCUSDT", "ETHUSDT"], 1300, seed=4)
    start, history = 1250, 1100  # > 1000: two pages per symbol
    faults = ["429", "500", "garbage", "slow", "badrow"]
    now = [0.0]  # the limiter's clock: moves only when it waits for the next minute

    async def sleep(seconds: float) -> None:
        now[0] += seconds

    # the slow reply outlasts the client's timeout 3x; the timeout leaves ordinary replies a
    # full second, as one on a busy 2-core machine can take a few tenths of one
    with FakeExchange(closes, start, rest_faults=faults, slow_seconds=3.0) as ex:
        ex.other_weight = 5390  # another client of this IP spent most of the minute
        engine = Engine(backend="cpu", interval=INTERVAL, outputs="all")
        results = []
        cfg = fast_config(ex, history=history, rest_timeout=1.0, rest_concurrency=1)
        client = KlineClient(
            engine, ["BTCUSDT", "ETHUSDT"], cfg, on_result=results.append,
            clock_ms=lambda: ex.now_ms, seed=4,
            rest_limiter=WeightLimiter(BINANCE_SPOT, clock=lambda: now[0], sleep=sleep),
        )  # fmt: skip
        stats = run_client(client, max_bars=2 * (1300 - start), max_seconds=60)
        requests = list(ex.rest_requests)
    retries = stats.http_retries
    assert retries["status_429"] == 1 and retries["status_5xx"] == 1
    assert retries["bad_response"] == 1 and retries["timeout"] == 1
    assert stats.rejections["rest_bad_row"] == 1
    assert all(int(r["limit"]) == 1000 for r in requests)
    assert len(requests) == 4 + len(faults) - 1  # 2 pages x 2 symbols + retried faults
    assert stats.warmup_bars == 2 * history
    # the exchange's count (5390 + 2 a request) filled the minute after five requests
    assert stats.rest_limit_waits >= 1 and stats.rest_weight_used >= 5392
    assert_exact(collect(results), closes, start - history, start - 1, 1299)


def test_bars_closing_during_a_slow_history_fetch_are_stepped_once():
    """The websocket is subscribed before the history is asked for: bars that close while
    REST answers slowly come over both, and each is stepped (its result emitted, not
    folded into the warmup) exactly once, in order; one request per symbol, no backfill."""
    closes = make_bars(SYMBOLS, 330, seed=15)
    start, history = 200, 150
    faults = ["slow"] * (len(SYMBOLS) - 1)  # one answer comes at once: two warmup batches
    with FakeExchange(
        closes, start, rest_faults=faults, slow_seconds=0.6, previews_per_bar=1, bar_pause=0.01
    ) as ex:
        stats, results = feed(
            ex, fast_config(ex, history=history), seed=7,
            max_bars=len(SYMBOLS) * (330 - start), max_seconds=20,
        )  # fmt: skip
        requests, answered_at = len(ex.rest_requests), list(ex.rest_answered_at)
    assert requests == len(SYMBOLS) and stats.backfills == 0
    assert max(answered_at) > start + 5  # bars closed while REST took its time
    assert stats.warmup_bars == len(SYMBOLS) * history
    # they came over the websocket, held until the warmup; REST has those closed before
    # it was asked (by the clock then: a later one may be the bar still in progress)
    assert stats.closed_klines + stats.backfilled_bars == stats.bars
    assert stats.bars == len(SYMBOLS) * (330 - start)
    assert not stats.rejections and not stats.engine_rejections
    assert_exact(collect(results), closes, start - history, start - 1, 329)


def test_bars_closed_since_live_from_are_stepped_not_warmed_up():
    """A process that started five bars before the client runs: those five bars are
    emitted (stepped), and the warmup ends before them."""
    closes = make_bars(SYMBOLS, 260, seed=16)
    start, history, late = 230, 100, 5
    with FakeExchange(closes, start) as ex:
        results: list = []
        client = KlineClient(
            Engine(backend="cpu", interval=INTERVAL, outputs="all"), SYMBOLS,
            fast_config(ex, history=history), on_result=results.append,
            clock_ms=lambda: ex.now_ms, live_from_ms=ex.now_ms - late * IMS,
        )  # fmt: skip
        stats = run_client(client, max_bars=len(SYMBOLS) * (260 - start + late), max_seconds=60)
    assert stats.warmup_bars == len(SYMBOLS) * history and stats.backfills == 0
    assert stats.backfilled_bars >= len(SYMBOLS) * late
    first = start - late - history
    assert_exact(collect(results), closes, first, start - late - 1, 259)


def test_restart_from_snapshot_every_bar_once():
    closes = make_bars(SYMBOLS, 300, seed=8)
    start = 230
    faults = {262: [("abort", 1)]}
    with FakeExchange(closes, start, faults=faults, bar_pause=0.01) as ex:
        engine = Engine(backend="cpu", interval=INTERVAL, outputs="all")
        first, second = [], []
        cfg = fast_config(ex, history=150)
        c1 = KlineClient(engine, SYMBOLS, cfg, on_result=first.append,
                         clock_ms=lambda: ex.now_ms, seed=5)  # fmt: skip
        s1 = run_client(c1, max_bars=len(SYMBOLS) * 25, max_seconds=60)
        blob = engine.snapshot()
        # the exchange moves on while we are down (bar 262 waits for a connection)
        ex.wait_for_bar(260)
        restored = Engine.restore(blob, backend="cpu", outputs="all")
        c2 = KlineClient(restored, SYMBOLS, cfg, on_result=second.append,
                         clock_ms=lambda: ex.now_ms, seed=6)  # fmt: skip
        remaining = len(SYMBOLS) * (300 - start) - s1.bars
        s2 = run_client(c2, max_bars=remaining, max_seconds=60)
    assert s2.warmup_bars == 0 and s2.backfilled_bars > 0
    rows = collect(first + second)
    assert_exact(rows, closes, start - 150, start - 1, 299)


def test_connect_failures_back_off():
    import socket

    with socket.socket() as sock:  # a port where nobody listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    engine = Engine(backend="cpu", interval=INTERVAL, outputs="all")
    cfg = LiveConfig(
        ws_url=f"ws://127.0.0.1:{port}", rest_url=f"http://127.0.0.1:{port}", history=0,
        backoff_initial=0.05, backoff_max=0.4, backoff_jitter=0.0,
    )  # fmt: skip
    client = KlineClient(engine, ["BTCUSDT"], cfg)
    t0 = time.monotonic()
    stats = run_client(client, max_seconds=1.0)
    assert 0.9 < time.monotonic() - t0 < 5
    # delays 0.05, 0.1, 0.2, 0.4, 0.4 ...: about 5 tries in a second, not hundreds (a
    # busy machine runs fewer of them in the second)
    assert 2 <= stats.disconnects["connect_failed"] <= 8
    assert stats.connects == 0 and stats.bars == 0
    # a server that accepts TCP connections but never answers the handshake
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)  # never accept(): the kernel completes TCP, nobody answers HTTP
        port = silent.getsockname()[1]
        cfg.ws_url = f"ws://127.0.0.1:{port}"
        cfg.open_timeout = 0.2
        client = KlineClient(
            Engine(backend="cpu", interval=INTERVAL, outputs="all"), ["BTCUSDT"], cfg
        )
        stats = run_client(client, max_seconds=1.0)
    # each try ends at the 0.2 s open timeout: at least one in the second, and backed off
    assert stats.connects == 0 and 1 <= stats.disconnects["connect_failed"] <= 6


def test_config_backoff_grows_is_capped_and_jittered():
    cfg = LiveConfig(backoff_initial=0.5, backoff_max=10.0, backoff_factor=2.0, backoff_jitter=0.0)
    assert cfg.backoff == Backoff(initial=0.5, maximum=10.0, factor=2.0, jitter=0.0)
    delays = [cfg.backoff.delay(a) for a in range(8)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    cfg.backoff_jitter = 0.5
    rng = random.Random(0)
    jittered = [cfg.backoff.delay(3, rng.random) for _ in range(200)]
    assert 2.0 <= min(jittered) < 2.3 and 3.7 < max(jittered) <= 4.0
    with pytest.raises(ValueError, match="backoff"):
        LiveConfig(backoff_initial=1.0, backoff_max=0.5)
    with pytest.raises(ValueError, match="jitter"):
        LiveConfig(backoff_jitter=1.5)


def test_config_and_argument_validation():
    with pytest.raises(ValueError, match="max_streams_per_connection"):
        LiveConfig(max_streams_per_connection=0)
    with pytest.raises(ValueError, match="idle_timeout"):
        LiveConfig(idle_timeout=-1)
    for bad in (-1, True, "3"):
        with pytest.raises(ValueError, match="warm_before_ms"):
            LiveConfig(warm_before_ms=bad)
    with pytest.raises(ValueError, match="rest_url"):
        LiveConfig(rest_url="api.binance.com")
    with pytest.raises(ValueError, match="symbols"):
        KlineClient(Engine(backend="cpu", outputs="all"), ["BTC/USDT"])
    for url in ("http://stream.binance.com", "ws:///no-host", "ws://host:99999"):
        client = KlineClient(Engine(backend="cpu", outputs="all"), ["BTCUSDT"],
                             LiveConfig(ws_url=url, history=0))  # fmt: skip
        with pytest.raises(ValueError, match="is not a websocket URL"):
            run_client(client, max_seconds=1)
    with pytest.raises(ValueError, match="interval"):
        interval_ms("1x")
    assert next_open(T0, "1m") == T0 + IMS
    # months: calendar arithmetic (2024-01-01 → 2024-02-01 → 2024-03-01)
    jan = 1_704_067_200_000
    assert next_open(jan, "1M") == jan + 31 * 86_400_000
    assert next_open(next_open(jan, "1M"), "1M") == jan + 60 * 86_400_000


def test_parser_counts_each_hostile_class():
    rejections: Counter = Counter()
    parser = BinanceParser(["BTCUSDT"], "1m", rejections)
    ex = FakeExchange({"BTCUSDT": np.array([10.0, 11.0])}, 1)
    good = ex.ws_message("BTCUSDT", 0, 10.5, True)
    k = parser.parse(good)
    assert k is not None and k.close == 10.5 and k.closed and k.open_time == T0
    raw_event = json.dumps(json.loads(good)["data"])  # the /ws raw-stream format
    assert parser.parse(raw_event.encode()) == k
    cases = {
        b"\xff\xfe": "malformed_json",
        '{"data": 1}': "missing_field",
        '{"stream": 5, "data": {}}': "bad_type",
        '{"stream": "btcusdt@kline_1m", "data": {"e": "kline", "k": 7}}': "bad_type",
        '{"stream": "btcusdt@kline_1m", "data": {"k": {}}}': "missing_field",
        good.replace('"x": true', '"x": 1'): "bad_type",
        good.replace('"c": "10.5"', '"c": "1e400"'): "bad_number",
        good.replace('"c": "10.5"', '"c": "nan"'): "bad_number",
        good.replace('"h": "10.5"', '"h": "-inf"'): "bad_number",
        good.replace('"o": "10.5"', '"o": "0"'): "non_positive_price",
        good.replace('"v": "1.5"', '"v": "-1"'): "bad_number",
        good.replace('"t": 1700000040000', '"t": -5'): "bad_time",
        good.replace('"t": 1700000040000', '"t": 99999999999999999999999'): "bad_time",
        good.replace('"T": 1700000099999', '"T": 1700000000000'): "inconsistent_message",
    }
    for raw, reason in cases.items():
        before = rejections[reason]
        assert parser.parse(raw) is None, raw
        assert rejections[reason] == before + 1, (raw, reason, rejections)
    assert parser.parse(good.replace('"c": "10.5"', '"c": 10.5')).close == 10.5  # numbers too


#: (field as sent, replacement) pairs msgspec's lax mode would coerce or misread
LAX_VARIANTS = [
    ('"t": 1700000040000', '"t": 1700000040000.0'), ('"t": 1700000040000', '"t": "1700000040000"'),
    ('"x": true', '"x": 1'), ('"x": true', '"x": "1"'),
    ('"s": "BTCUSDT"', '"s": null'), ('"s": "BTCUSDT"', '"s": "null"'),
    *(('"c": "10.5"', f'"c": {v}') for v in ('"NaN"', '"Infinity"', '" 10.5"', '"1e-400"',
                                              '"1e400"', "true", "null")),
]  # fmt: skip


def test_parser_fast_path_agrees_with_the_full_parser():
    """The typed fast path returns a kline only where the full parser returns the same one;
    everything else falls through to the full parser, so every reason stays exact."""
    parser = BinanceParser(["BTCUSDT", "ETHUSDT"], "1m", Counter())
    ex = FakeExchange({"BTCUSDT": np.array([10.0, 11.0]), "ETHUSDT": np.array([5.0, 6.0])}, 1)
    good = ex.ws_message("BTCUSDT", 0, 10.5, True)
    variants = [
        good,
        ex.ws_message("ETHUSDT", 1, 6.25, False),
        good.replace('"s": "BTCUSDT"', '"s": "btcusdt"'),  # lower-case symbol: accepted
        good.replace("btcusdt@kline_1m", "BTCUSDT@KLINE_1M"),  # stream name in capitals too
        good.replace('"s": "BTCUSDT"', '"s": "ETHUSDT"', 1),  # the event's symbol disagrees
        good.replace('"c": "10.5"', '"c": 10.5'),  # a JSON number: accepted by both
        good.replace('"c": "10.5"', '"c": "0"'),
        good.replace('"c": "10.5"', '"c": "nan"'),
        good.replace('"c": "10.5"', '"c": "abc"'),
        good.replace('"i": "1m"', '"i": "5m"'),
        good.replace('"e": "kline"', '"e": "trade"'),
        good.replace("btcusdt@kline_1m", "ethusdt@kline_1m"),
        good.replace('"x": true', '"x": "true"'),
        good.replace('"T": 1700000099999', '"T": 1700000000000'),
        good.replace("BTCUSDT", "XRPUSDT"),
        json.dumps(json.loads(good)["data"]),  # raw-stream format: full parser only
        # what msgspec's lax mode would coerce, and the full parser rejects
        *(good.replace(field, value, 1) for field, value in LAX_VARIANTS),
    ]
    fast_hits = 0
    for raw in variants:
        fast = parser._parse_usual(raw)
        full = parser._parse(raw)
        assert fast is None or fast == full, raw
        fast_hits += fast is not None
    assert fast_hits == 5  # the five well-formed combined-stream klines


@settings(max_examples=400, deadline=None)
@given(
    text=st.one_of(
        st.floats().map(repr),
        st.decimals(allow_nan=False).map(str),
        st.text(alphabet="0123456789.eE+-_ infatyINFxX", max_size=12),
    )
)
def test_parser_fast_path_reads_prices_as_float_does(text):
    """The fast path's lax decode turns a price string into the float ``float()`` makes of
    it, or declines it; it never accepts a string the full parser rejects."""
    parser = BinanceParser(["BTCUSDT"], "1m", Counter())
    ex = FakeExchange({"BTCUSDT": np.array([10.0, 11.0])}, 1)
    raw = ex.ws_message("BTCUSDT", 0, 10.5, True).replace(
        '"c": "10.5"', json.dumps({"c": text})[1:-1]
    )
    fast = parser._parse_usual(raw)
    assert fast is None or fast == parser._parse(raw)
    if fast is not None:
        assert fast.close == float(text)


def test_cli_live_streams_to_file(tmp_path):
    from typer.testing import CliRunner

    from atc_stream.app.cli import app

    closes = make_bars(["BTCUSDT", "ETHUSDT"], 260, seed=12)
    start = 230
    out = tmp_path / "live.jsonl"
    # the CLI uses the real clock: put the bar in progress at the start into the present
    t0 = int(time.time() * 1000) - start * IMS - 1000  # bar `start` opened a second ago
    with FakeExchange(closes, start, t0=t0) as ex:
        result = CliRunner().invoke(
            app,
            [
                "live", "--symbols", "BTCUSDT,ETHUSDT", "--interval", "1m", "--history", "100",
                "--ws-url", ex.ws_url, "--rest-url", ex.rest_url, "--output", str(out),
                "--max-bars", str(2 * (260 - start)), "--max-seconds", "60",
                "--backend", "cpu", "--no-previews", "--status-every", "0.2",
                "--ws-compression",
            ],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert ex.extensions[0].startswith("permessage-deflate")  # asked for, and agreed
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(not r["provisional"] for r in rows)
    assert len(rows) == 2 + 2 * (260 - start)  # warmup rows + every streamed bar
    for sym in ("BTCUSDT", "ETHUSDT"):
        mine = [r for r in rows if r["symbol"] == sym]
        full = compute(closes[sym][start - 100 :])["signal"]
        for r in mine:
            i = (r["time"] - t0) // IMS - (start - 100)
            want = full[i]
            assert (r["signal"] is None and np.isnan(want)) or r["signal"] == want
    assert "live 2 symbols" in result.stderr
    assert "reconnects" in result.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the start is read from /proc")
def test_cli_counts_the_bars_after_the_start_from_the_process_start():
    """``atc-stream live`` publishes every bar closing after its process started, not
    after the seconds of imports and kernel loading: the start is read from the OS."""
    import subprocess

    code = (
        "import time; time.sleep(1.0); from atc_stream.app.cli import _process_started_ms; "
        "print(time.time() * 1000 - _process_started_ms())"
    )
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               check=True).stdout)  # fmt: skip
    assert 1000 <= age < 30_000


def test_cli_live_paper_trades_as_backtest_after_the_warmup(tmp_path):
    from typer.testing import CliRunner

    from atc_stream import Strategy, backtest
    from atc_stream.app.cli import app
    from atc_stream.core.strategy_outputs import records

    closes = make_bars(["BTCUSDT", "ETHUSDT"], 260, seed=12)
    start, history = 230, 100
    t0 = int(time.time() * 1000) - start * IMS - 1000
    trades, positions = tmp_path / "trades.jsonl", tmp_path / "positions.jsonl"
    with FakeExchange(closes, start, t0=t0) as ex:
        result = CliRunner().invoke(
            app,
            [
                "live", "--symbols", "BTCUSDT,ETHUSDT", "--history", str(history),
                "--ws-url", ex.ws_url, "--rest-url", ex.rest_url,
                "--output", str(tmp_path / "live.jsonl"), "--max-bars", str(2 * (260 - start)),
                "--max-seconds", "60", "--backend", "cpu", "--no-previews",
                "--status-every", "0", "--strategy", "max_hold=2,fee_bps=5",
                "--trades", str(trades), "--positions", str(positions),
            ],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    held = [json.loads(x) for x in positions.read_text().splitlines()]
    last = (max(r["time"] for r in held) - t0) // IMS
    index = np.arange(start - history, last + 1)
    frame = {  # the exchange's klines: open = high = low = close
        "symbol": np.repeat(["BTCUSDT", "ETHUSDT"], index.size),
        "time": np.tile(t0 + index * IMS, 2),
        **{k: np.concatenate([closes[s][index] for s in ("BTCUSDT", "ETHUSDT")])
           for k in ("open", "high", "low", "close")},
    }  # fmt: skip
    expected = backtest(frame, None, Strategy(max_hold=2, fee_bps=5))
    warm_end = t0 + (start - 1) * IMS  # trades closed before the warmup's last bar: not written
    want = [r for r in records(expected.trade_columns) if r["exit_time"] >= warm_end]
    got = [json.loads(x) for x in trades.read_text().splitlines()]

    def key(r):
        return r["symbol"], r["exit_time"]

    assert sorted(got, key=key) == sorted(want, key=key) and want
    finals = {r["symbol"]: r["equity"] for r in held if r["time"] == t0 + last * IMS}
    metrics = expected.metric_columns
    assert finals == dict(zip(metrics["symbol"], metrics["final_equity"], strict=True))


def test_cli_live_snapshot_resume_every_bar_once(tmp_path):
    from typer.testing import CliRunner

    from atc_stream.app.cli import app

    closes = make_bars(["BTCUSDT", "ETHUSDT"], 270, seed=13)
    start, history = 230, 100
    t0 = int(time.time() * 1000) - start * IMS - 1000
    snaps = tmp_path / "snaps"
    common = ["live", "--symbols", "BTCUSDT,ETHUSDT", "--history", str(history),
              "--backend", "cpu", "--no-previews", "--status-every", "0", "--max-seconds", "60",
              "--snapshot-dir", str(snaps)]  # fmt: skip
    with FakeExchange(closes, start, t0=t0, bar_pause=0.01) as ex:
        urls = ["--ws-url", ex.ws_url, "--rest-url", ex.rest_url]
        first = CliRunner().invoke(
            app, [*common, *urls, "--output", str(tmp_path / "a.jsonl"), "--max-bars", "24"]
        )
        assert first.exit_code == 0, first.output
        rows = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
        live_rows = len(rows) - 2  # the first two are the warmup's last bars
        ex.wait_for_bar(247)  # the exchange moves on while we are down
        second = CliRunner().invoke(
            app,
            [*common, *urls, "--resume", "--output", str(tmp_path / "b.jsonl"),
             "--max-bars", str(2 * (270 - start) - live_rows)],
        )  # fmt: skip
        assert second.exit_code == 0, second.output
    assert "restored snapshot" in second.stderr and "final snapshot" in first.stderr
    rows += [json.loads(x) for x in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert_rows_once_and_exact(rows, closes, t0, start, history)  # across the restart


def test_cli_live_resume_on_another_exchange_is_refused(tmp_path):
    """A snapshot's streams hold one venue's series: another venue's prices would go on
    from them as if they were the same market."""
    from exchange_emulators import BinanceUsdmEmulator
    from typer.testing import CliRunner

    from atc_stream.app.cli import app

    closes = make_bars(["BTCUSDT"], 270, seed=13)
    start = 230
    t0 = int(time.time() * 1000) - start * IMS - 1000
    common = ["live", "--symbols", "BTCUSDT", "--history", "100", "--backend", "cpu",
              "--no-previews", "--status-every", "0", "--max-seconds", "60",
              "--snapshot-dir", str(tmp_path / "snaps")]  # fmt: skip
    with FakeExchange(closes, start, t0=t0, bar_pause=0.01) as ex:
        first = CliRunner().invoke(
            app, [*common, "--ws-url", ex.ws_url, "--rest-url", ex.rest_url,
                  "--output", str(tmp_path / "a.jsonl"), "--max-bars", "2"],
        )  # fmt: skip
        assert first.exit_code == 0, first.output
    with BinanceUsdmEmulator(closes, start, t0=t0, bar_pause=0.01) as ex:
        again = CliRunner().invoke(
            app, [*common, "--ws-url", ex.ws_url, "--rest-url", ex.rest_url, "--resume",
                  "--exchange", "binance-usdm", "--output", str(tmp_path / "b.jsonl")],
        )  # fmt: skip
    assert again.exit_code == 2, again.output
    last = again.stderr.strip().splitlines()[-1]
    assert last.startswith("atc-stream: error: the snapshot was taken on binance, not ")
    assert "resume with --exchange binance," in last


def test_cli_live_a_refused_request_quotes_the_exchange_as_text():
    from typer.testing import CliRunner

    from atc_stream.app.cli import app

    closes = make_bars(["BTCUSDT"], 270, seed=13)
    t0 = int(time.time() * 1000) - 230 * IMS - 1000
    with FakeExchange(closes, 230, t0=t0, bar_pause=0.01) as ex:  # it serves 1m only
        done = CliRunner().invoke(
            app, ["live", "--symbols", "BTCUSDT", "--interval", "3m", "--history", "10",
                  "--backend", "cpu", "--max-seconds", "5", "--ws-url", ex.ws_url,
                  "--rest-url", ex.rest_url],
        )  # fmt: skip
    assert done.exit_code == 1
    assert 'answered HTTP 400: {"code": -1121, "msg": "Invalid symbol."})' in done.stderr


def test_cli_live_resume_without_a_snapshot_keeps_an_earlier_output(tmp_path):
    """A run without snapshots, then ``--resume``: nothing to resume from, and the bars of
    the first run cannot be had again, so its output is kept and the run refused."""
    from typer.testing import CliRunner

    from atc_stream.app.cli import app

    closes = make_bars(["BTCUSDT"], 270, seed=13)
    start = 230
    t0 = int(time.time() * 1000) - start * IMS - 1000
    out = tmp_path / "a.jsonl"
    common = ["live", "--symbols", "BTCUSDT", "--history", "100", "--backend", "cpu",
              "--no-previews", "--status-every", "0", "--max-seconds", "60",
              "--output", str(out)]  # fmt: skip
    with FakeExchange(closes, start, t0=t0, bar_pause=0.01) as ex:
        urls = ["--ws-url", ex.ws_url, "--rest-url", ex.rest_url]
        first = CliRunner().invoke(app, [*common, *urls, "--max-bars", "3"])
        assert first.exit_code == 0, first.output
        written = out.read_bytes()
        again = CliRunner().invoke(
            app, [*common, *urls, "--snapshot-dir", str(tmp_path / "s"), "--resume"]
        )
    assert again.exit_code == 2, again.output
    last = again.stderr.strip().splitlines()[-1]
    assert last.startswith("atc-stream: error: --resume: no snapshot") and str(out) in last
    assert "already holds the output of an earlier run" in last
    assert out.read_bytes() == written and written


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_cli_live_output_on_a_full_disk_is_one_line_and_exit_2(tmp_path):
    from typer.testing import CliRunner

    from atc_stream.app.cli import app

    closes = make_bars(["BTCUSDT"], 270, seed=13)
    start = 230
    t0 = int(time.time() * 1000) - start * IMS - 1000
    out = tmp_path / "full.jsonl"
    out.symlink_to("/dev/full")  # every write: ENOSPC
    with FakeExchange(closes, start, t0=t0, bar_pause=0.01) as ex:
        result = CliRunner().invoke(
            app,
            ["live", "--symbols", "BTCUSDT", "--history", "100", "--backend", "cpu",
             "--no-previews", "--status-every", "0", "--max-seconds", "60", "--max-bars", "5",
             "--ws-url", ex.ws_url, "--rest-url", ex.rest_url, "--output", str(out)],
        )  # fmt: skip
    assert result.exit_code == 2, result.output
    last = result.stderr.strip().splitlines()[-1]
    assert last == f"atc-stream: error: cannot write {out}: No space left on device"
    assert "Traceback" not in result.stderr


def assert_rows_once_and_exact(rows, closes, t0, start, history):
    """Written rows (dicts) of BTCUSDT and ETHUSDT: every bar exactly once, from the
    warmup's last bar to bar 269, each signal equal to ``compute`` over the history."""
    seen = Counter((r["symbol"], r["params_id"], r["time"]) for r in rows)
    assert set(seen.values()) == {1}, [k for k, v in seen.items() if v > 1][:5]
    for sym in ("BTCUSDT", "ETHUSDT"):
        full = compute(closes[sym][start - history :])["signal"]
        mine = sorted((r["time"], r["signal"]) for r in rows if r["symbol"] == sym)
        assert [(t - t0) // IMS for t, _ in mine] == list(range(start - 1, 270))
        for t, signal in mine:
            want = full[(t - t0) // IMS - (start - history)]
            assert (signal is None and np.isnan(want)) or signal == want


def written_rows(out, upto=None):
    """Rows of a JSONL file (its first ``upto`` bytes) or a Parquet part directory (its
    first ``upto`` parts), as dicts."""
    if out.suffix == ".jsonl":
        data = out.read_bytes()[:upto]
        return [json.loads(x) for x in data.splitlines()]
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for part in sorted(out.glob("part-*.parquet"))[:upto]:
        table = pq.read_table(part)
        at = table.schema.get_field_index("time")  # a timestamp column: epoch ms back
        rows += table.set_column(at, "time", table.column("time").cast(pa.int64())).to_pylist()
    return rows


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_cli_live_resume_cuts_the_output_back_to_the_snapshot(tmp_path, suffix):
    """A crash after rows were written but before the next snapshot (here: the newest
    snapshots dropped) leaves rows the restored state has not seen in the output;
    ``--resume`` with the same ``-o`` cuts them off and the backfill writes them again,
    so the output holds every (symbol, params_id, time) exactly once."""
    from typer.testing import CliRunner

    from atc_stream.app.cli import app
    from atc_stream.app.durability import open_snapshot_store

    closes = make_bars(["BTCUSDT", "ETHUSDT"], 270, seed=14)
    start, history = 230, 100
    t0 = int(time.time() * 1000) - start * IMS - 1000
    snaps, out = tmp_path / "snaps", tmp_path / f"live{suffix}"
    common = ["live", "--symbols", "BTCUSDT,ETHUSDT", "--history", str(history),
              "--backend", "cpu", "--no-previews", "--status-every", "0",
              "--max-seconds", "60", "--snapshot-dir", str(snaps), "--snapshot-every", "4",
              "--output", str(out)]  # fmt: skip
    with FakeExchange(closes, start, t0=t0, bar_pause=0.01) as ex:
        urls = ["--ws-url", ex.ws_url, "--rest-url", ex.rest_url]
        first = CliRunner().invoke(app, [*common, *urls, "--max-bars", "24"])
        assert first.exit_code == 0, first.output
        store = open_snapshot_store(snaps)
        for snapshot_id in store.list()[-2:]:  # the final one and the one before
            store.delete(snapshot_id)
        kept = Engine.restore(store.latest().blob)
        position = kept.source_offsets["live"]["output"]
        assert position["path"] == str(out)
        cut = position["bytes"] if suffix == ".jsonl" else position["parts"]
        before = written_rows(out)
        kept_rows = written_rows(out, cut)
        assert 2 < len(kept_rows) < len(before)  # rows after the snapshot: a crash
        rows_in_state = len(kept_rows) - 2  # less the warmup's last bars
        ex.wait_for_bar(247)  # the exchange moves on while we are down
        second = CliRunner().invoke(
            app, [*common, *urls, "--resume", "--max-bars", str(2 * (270 - start) - rows_in_state)]
        )
        assert second.exit_code == 0, second.output
    assert "restored snapshot" in second.stderr
    rows = written_rows(out)
    assert rows[: len(kept_rows)] == kept_rows  # kept, then appended
    assert_rows_once_and_exact(rows, closes, t0, start, history)


@pytest.mark.redis
def test_cli_live_publishes_closed_bars_to_redis(tmp_path, redis_url):  # noqa: F811

    import msgspec
    from typer.testing import CliRunner

    from atc_stream.app.cli import app
    from atc_stream.connectors.redis.pubsub import SignalSubscriber

    closes = make_bars(["BTCUSDT", "ETHUSDT"], 250, seed=14)
    start = 235
    t0 = int(time.time() * 1000) - start * IMS - 1000
    sub = SignalSubscriber(redis_url, batch=True)
    sub.wait_ready()
    out = tmp_path / "live.jsonl"
    with collected_messages(sub) as got, FakeExchange(closes, start, t0=t0) as ex:
        result = CliRunner().invoke(
            app,
            ["live", "--symbols", "BTCUSDT,ETHUSDT", "--history", "80", "--ws-url", ex.ws_url,
             "--rest-url", ex.rest_url, "--output", str(out), "--redis", redis_url,
             "--max-bars", str(2 * (250 - start)), "--max-seconds", "60", "--backend", "cpu",
             "--status-every", "0"],
        )  # fmt: skip
    sub.close()
    assert result.exit_code == 0, result.output
    published = [msgspec.to_builtins(r) for m in got for r in m.data.records]
    closed = [json.loads(x) for x in out.read_text().splitlines()]
    assert any(r["provisional"] for r in closed)  # previews went to the file only
    closed = [r for r in closed if not r["provisional"]]
    assert len(closed) == 2 + 2 * (250 - start)
    assert published == [dict(r, v=SCHEMA_VERSION) for r in closed]
    # published from the event loop: every step acknowledged before the summary
    steps = len({m.data.seq for m in got})
    assert f"redis publish    {steps} steps delivered, 0 dropped" in result.output


def test_ping_timeout_reconnects_and_pongs_keep_a_connection():
    """A server that never answers our pings is dropped within ping_timeout (reason
    ``ping_timeout``) and reconnected, while its own pings get pongs; one that answers
    (the local exchange) is kept."""
    pings, pongs = [], []

    async def silent_ws(request):
        ws = web.WebSocketResponse(autoping=False)  # receives PINGs, never answers them
        await ws.prepare(request)
        await ws.ping(b"server")  # the client answers the exchange's pings
        async for msg in ws:
            if msg.type == web.WSMsgType.PING:
                pings.append(time.monotonic())
            elif msg.type == web.WSMsgType.PONG:
                pongs.append(bytes(msg.data))
        return ws

    async def run_against_silent_server():
        app = web.Application()
        app.router.add_get("/stream", silent_ws)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        cfg = LiveConfig(
            ws_url=f"ws://127.0.0.1:{port}", rest_url=f"http://127.0.0.1:{port}", history=0,
            ping_interval=0.1, ping_timeout=0.2, idle_timeout=30.0, backoff_initial=0.05,
            backoff_max=0.1, backoff_jitter=0.0,
        )  # fmt: skip
        engine = Engine(backend="cpu", interval=INTERVAL, outputs="all")
        try:
            return await KlineClient(engine, ["BTCUSDT"], cfg).run(max_seconds=1.5)
        finally:
            await runner.cleanup()

    with small_heap():
        stats = asyncio.run(run_against_silent_server())
    # each connection: a ping after 0.1 s, dropped 0.2 s later, 0.05-0.1 s of backoff
    assert 2 <= stats.disconnects["ping_timeout"] <= 6
    assert set(stats.disconnects) == {"ping_timeout"} and pings
    assert pongs and set(pongs) == {b"server"}
    assert stats.reconnects == stats.connects - 1 >= 2

    closes = make_bars(SYMBOLS, 240, seed=4)
    with FakeExchange(closes, 200, bar_pause=0.02) as ex:  # websockets answers pings
        client = KlineClient(
            Engine(backend="cpu", interval=INTERVAL, outputs="all"), SYMBOLS,
            fast_config(ex, history=50, ping_interval=0.05, ping_timeout=0.5),
            clock_ms=lambda: ex.now_ms,
        )  # fmt: skip
        stats = run_client(client, max_seconds=1.0)
    assert stats.connects == 1 and not stats.disconnects and stats.bars > 0


def test_a_stalled_stream_that_still_answers_pings_times_out_and_no_bar_is_lost():
    """The stall keeps the socket open and its websocket library still answers our pings:
    pongs are not messages, so the idle timeout fires, the client reconnects and
    backfills, and every bar arrives once."""
    closes = make_bars(SYMBOLS, 260, seed=8)
    start = 220
    with FakeExchange(closes, start, faults={start + 5: [("stall", 1)]}, bar_pause=0.008) as ex:
        config = fast_config(
            ex, history=150, idle_timeout=0.4, ping_interval=0.05, ping_timeout=2.0
        )
        stats, results = feed(
            ex, config, seed=2, max_bars=len(SYMBOLS) * (260 - start), max_seconds=60
        )
    assert stats.disconnects == {"idle_timeout": 1}
    assert stats.bars == len(SYMBOLS) * (260 - start)
    assert_exact(collect(results), closes, start - 150, start - 1, 259)


def test_an_oversized_frame_drops_the_connection_and_no_bar_is_lost():
    """A frame over ``max_message_bytes`` is refused: the connection ends
    (``connection_lost``), the client reconnects and backfills, every bar arrives once."""
    closes = make_bars(SYMBOLS, 260, seed=6)
    start = 220
    huge = json.dumps({"stream": "btcusdt@kline_1m", "data": {"pad": "x" * 20_000}})
    with FakeExchange(closes, start, faults={230: [("raw", "BTCUSDT", huge)]}) as ex:
        stats, results = feed(
            ex, fast_config(ex, history=100, max_message_bytes=16_384), seed=4,
            max_bars=len(SYMBOLS) * (260 - start), max_seconds=60,
        )  # fmt: skip
    assert stats.disconnects == {"connection_lost": 1} and stats.reconnects == 1
    assert stats.bars == len(SYMBOLS) * (260 - start) and stats.backfilled_bars > 0
    assert_exact(collect(results), closes, start - 100, start - 1, 259)
