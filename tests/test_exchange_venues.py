"""The exchange adapters (Binance spot and USD-M, Bybit spot and linear, OKX) against
local emulators of their wire formats (``exchange_emulators``: real websocket and HTTP
servers on 127.0.0.1), their parsers on the documented example frames, and the
``--exchange`` option of ``atc-stream live``.

Every feed test checks that the client's closed-bar outputs hold every bar exactly once
and equal ``atc_stream.compute`` over the same closes, and that the counters say what
the emulator did.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("websockets")
pytest.importorskip("aiohttp")

from exchange_emulators import (  # noqa: E402
    IMS,
    INTERVAL,
    BinanceEmulator,
    BinanceUsdmEmulator,
    BybitEmulator,
    BybitLinearEmulator,
    OkxEmulator,
    assert_exact,
    collect,
    compile_kernels,
    fast_config,
    feed,
    make_bars,
)

from atc_stream import compute  # noqa: E402
from atc_stream.connectors.exchanges.exchange import PONG, Control  # noqa: E402
from atc_stream.connectors.exchanges.registry import make_exchange  # noqa: E402
from atc_stream.connectors.exchanges.venues.binance import BinanceUsdm  # noqa: E402
from atc_stream.connectors.exchanges.venues.bybit import BybitLinear, BybitSpot  # noqa: E402
from atc_stream.connectors.exchanges.venues.okx import Okx  # noqa: E402

#: name -> (emulator, symbols as the exchange writes them)
VENUES = {
    "binance": (BinanceEmulator, ["BTCUSDT", "ETHUSDT"]),
    "binance-usdm": (BinanceUsdmEmulator, ["BTCUSDT", "ETHUSDT"]),
    "bybit": (BybitEmulator, ["BTCUSDT", "ETHUSDT"]),
    "bybit-linear": (BybitLinearEmulator, ["BTCUSDT", "ETHUSDT"]),
    "okx": (OkxEmulator, ["BTC-USDT", "ETH-USDT"]),
}


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels():
    compile_kernels(INTERVAL)


# -- each exchange against its emulator ---------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VENUES))
def test_every_bar_once_through_drops_duplicates_garbage_and_rate_limits(name):
    """Warmup over more than one page (forwards on Binance, backwards from the newest on
    Bybit and OKX), then a duplicate, an out-of-order and a malformed frame, a clean
    close, an abort and a frame cut mid-message, and two 429s (with Retry-After) on the
    first REST requests: every bar arrives once, equal to ``compute``, and the
    counters say what happened."""
    emulator, symbols = VENUES[name]
    n, start, history = 1100, 1050, 1030
    closes = make_bars(symbols, n, seed=21)
    first = symbols[0]
    pages = len(symbols) * (4 if name == "okx" else 2)
    with emulator(
        closes, start, rest_faults=["429", "429"], retry_after="0.1", wait_rest=pages
    ) as ex:
        # bars close once the warmup's pages are answered; these are sent before bar at's
        # closed kline, once the warmup is applied: bar at - 1 is the last applied
        at = start + 15
        ex.faults.update({
            at: [("raw", first, ex.ws_message(first, at - 1, closes[first][at - 1], True)),
                 ("raw", first, ex.ws_message(first, at - 3, closes[first][at - 3], True)),
                 ("raw", first, ex.ws_message(first, at - 2, 1.0, True)[:25])],
            at + 5: [("close", 1)], at + 11: [("abort", 1)], at + 17: [("midmessage", 1)],
        })  # fmt: skip
        stats, results = feed(
            ex, fast_config(ex, history=history), symbols, seed=7, exchange=make_exchange(name),
            max_bars=len(symbols) * (n - start), max_seconds=60,
        )  # fmt: skip
        log, messages = list(ex.rest_log), list(ex.client_messages)
    assert stats.bars == len(symbols) * (n - start)
    assert_exact(collect(results), closes, start - history, start - 1, n - 1)
    assert stats.warmup_bars == len(symbols) * history
    assert stats.rejections == {"duplicate_kline": 1, "out_of_order_kline": 1,
                                "malformed_json": 1}  # fmt: skip
    assert stats.http_retries == {"status_429": 2}
    assert stats.disconnects == {"closed_by_server": 1, "connection_lost": 2}
    assert stats.reconnects == 3 and stats.connects == 4
    assert stats.closed_klines + stats.backfilled_bars == stats.bars
    assert not stats.engine_rejections
    # every request after a 429 waited its Retry-After (0.1 s)
    faulted = max(t for t, _, fault in log if fault is not None)
    retried = min(t for t, _, fault in log if fault is None)
    assert retried - faulted >= 0.09
    # the warmup's pages: 1032 bars a symbol, 1000 a page (OKX: 300), in the page order
    pages = ex.rest_requests[2 : 2 + pages]
    ends = {"okx": "after", "bybit": "end", "bybit-linear": "end"}.get(name, "startTime")
    for symbol in symbols:
        key = "instId" if name == "okx" else "symbol"
        mine = [int(q[ends]) for q in pages if q[key] == symbol]
        assert len(mine) == (4 if name == "okx" else 2)
        assert mine == sorted(mine, reverse=ends != "startTime")
    subscribes = [m for m in messages if "subscribe" in m]
    if name.startswith("binance"):  # streams are named in the URL
        assert not subscribes and all("@kline_1m" in p for p in ex.paths)
    else:  # each connection subscribes after connecting
        assert len(subscribes) == stats.connects


@pytest.mark.parametrize("name", ["bybit", "okx"])
def test_text_pings_keep_a_connection_and_a_silent_one_is_dropped(name):
    emulator, symbols = VENUES[name]
    closes = make_bars(symbols, 240, seed=4)
    ping = '{"op":"ping"}' if name == "bybit" else "ping"
    with emulator(closes, 200, bar_pause=0.02) as ex:
        cfg = fast_config(ex, history=50, ping_interval=0.05, ping_timeout=0.5)
        stats, _ = feed(ex, cfg, symbols, seed=1, exchange=make_exchange(name), max_seconds=1.0)
        pings = [m for m in ex.client_messages if m == ping]
    assert stats.connects == 1 and not stats.disconnects and stats.bars > 0
    assert len(pings) >= 3
    with emulator(closes, 200, bar_pause=0.02) as ex:
        ex.answer_pings = False
        cfg = fast_config(ex, history=50, ping_interval=0.1, ping_timeout=0.2,
                          idle_timeout=30.0)  # fmt: skip
        stats, _ = feed(ex, cfg, symbols, seed=1, exchange=make_exchange(name), max_seconds=1.5)
    assert stats.disconnects["ping_timeout"] >= 1 and stats.reconnects >= 1


def test_a_refused_subscription_drops_the_connection():
    """An OKX ``error`` event (a subscription refused) ends the connection as
    ``subscribe_failed`` and the client connects and subscribes again."""
    symbols = ["BTC-USDT"]
    closes = make_bars(symbols, 240, seed=5)
    refusal = json.dumps({"event": "error", "code": "60012", "msg": "Invalid request",
                          "connId": "a4d3ae55"})  # fmt: skip
    with OkxEmulator(closes, 200, faults={205: [("raw", "BTC-USDT", refusal)]}) as ex:
        stats, results = feed(
            ex, fast_config(ex, history=60), symbols, seed=2, exchange=Okx(),
            max_bars=240 - 200, max_seconds=60,
        )  # fmt: skip
    assert stats.disconnects == {"subscribe_failed": 1} and stats.reconnects == 1
    assert_exact(collect(results), closes, 200 - 60, 199, 239)


def test_symbols_are_checked_against_the_instruments_list():
    """Bybit's list comes in pages (``nextPageCursor``); OKX's by instrument type."""
    closes = make_bars(["BTCUSDT", "ETHUSDT", "SOLUSDT"], 10)
    with BybitEmulator(closes, 5) as ex:
        cfg = fast_config(ex)
        unknown = asyncio.run(
            BybitSpot().unknown_symbols(cfg, "1m", ["SOLUSDT", "DOGEUSDT", "BTCUSDT"])
        )
        pages = [path for _, path, _ in ex.rest_log if "instruments" in path]
    assert unknown == ["DOGEUSDT"] and len(pages) == 2
    with OkxEmulator({"BTC-USDT": closes["BTCUSDT"]}, 5) as ex:
        cfg = fast_config(ex)
        unknown = asyncio.run(Okx().unknown_symbols(cfg, "1m", ["BTC-USDT", "BTC-USDT-SWAP"]))
    assert unknown == ["BTC-USDT-SWAP"]


# -- the documented frames ------------------------------------------------------------------


def test_bybit_parses_the_documented_kline_push_and_answers():
    # the example push of https://bybit-exchange.github.io/docs/v5/websocket/public/kline
    documented = {
        "topic": "kline.5.BTCUSDT",
        "data": [{"start": 1672324800000, "end": 1672325099999, "interval": "5",
                  "open": "16649.5", "close": "16677", "high": "16677", "low": "16608",
                  "volume": "2.081", "turnover": "34666.4005", "confirm": False,
                  "timestamp": 1672324988882}],
        "ts": 1672324988882, "type": "snapshot",
    }  # fmt: skip
    rejections: Counter = Counter()
    parser = BybitSpot().parser(["BTCUSDT"], "5m", rejections)
    k = parser.parse(json.dumps(documented))
    assert (k.symbol, k.open_time, k.close_time, k.closed) == (
        "BTCUSDT", 1672324800000, 1672325099999, False,
    )  # fmt: skip
    assert (k.open, k.high, k.low, k.close, k.volume) == (16649.5, 16677, 16608, 16677, 2.081)
    two = dict(documented, data=[dict(documented["data"][0], confirm=True),
                                 dict(documented["data"][0], start=1672325100000,
                                      end=1672325399999)])  # fmt: skip
    both = parser.parse(json.dumps(two).encode())
    assert [(x.open_time, x.closed) for x in both] == [
        (1672324800000, True), (1672325100000, False)
    ]  # fmt: skip
    # the pong of spot and of linear, a subscription's answer and its refusal
    spot_pong = {"success": True, "ret_msg": "pong", "conn_id": "0970e817", "op": "ping"}
    linear_pong = {"req_id": "100001", "op": "pong", "args": ["1672916271846"], "conn_id": "c"}
    assert parser.parse(json.dumps(spot_pong)) is PONG
    assert parser.parse(json.dumps(linear_pong)) is PONG
    ok = {"success": True, "ret_msg": "", "conn_id": "c", "req_id": "", "op": "subscribe"}
    assert parser.parse(json.dumps(ok)) is None
    refused = dict(ok, success=False, ret_msg="error:handler not found")
    assert parser.parse(json.dumps(refused)) == Control("subscribe_failed",
                                                        "error:handler not found")  # fmt: skip
    assert not rejections
    item = documented["data"][0]

    def push(**changes) -> str:
        return json.dumps(dict(documented, data=[dict(item, **changes)]))

    cases = {
        b"\xff{": "malformed_json",
        "[1, 2]": "not_a_kline",
        json.dumps({"topic": "tickers.BTCUSDT", "data": {}}): "not_a_kline",
        json.dumps({"topic": 5, "data": []}): "bad_type",
        json.dumps({"topic": "kline.5.BTCUSDT"}): "missing_field",
        json.dumps({"topic": "kline.5.BTCUSDT", "data": {}}): "bad_type",
        json.dumps({"topic": "kline.5.ETHUSDT", "data": []}): "unsubscribed_symbol",
        json.dumps({"topic": "kline.1.BTCUSDT", "data": []}): "wrong_interval",
        json.dumps({"data": []}): "missing_field",
        push(confirm="false"): "bad_type",
        push(start="1672324800000"): "bad_time",
        push(end=1672324700000): "inconsistent_message",
        push(interval="1"): "inconsistent_message",
        push(close="abc"): "bad_number",
        push(low="0"): "non_positive_price",
    }
    for raw, reason in cases.items():
        before = rejections[reason]
        assert parser.parse(raw) is None, raw
        assert rejections[reason] == before + 1, (raw, reason, rejections)


def test_bybit_reads_the_documented_rest_page():
    # the example answer of https://bybit-exchange.github.io/docs/v5/market/kline
    documented = {
        "retCode": 0, "retMsg": "OK",
        "result": {"symbol": "BTCUSD", "category": "inverse", "list": [
            ["1670608800000", "17071", "17073", "17027", "17055.5", "268611", "15.74462667"],
            ["1670605200000", "17071.5", "17071.5", "17061", "17071", "4177", "0.24469757"],
        ]},
        "retExtInfo": {}, "time": 1672025956592,
    }  # fmt: skip
    bybit = BybitSpot()
    rows = bybit.page_rows(documented)
    klines = [bybit.parse_row(r, "BTCUSD", "1h", 1670609000000) for r in rows]
    assert [(k.open_time, k.close_time, k.close, k.closed) for k in klines] == [
        (1670608800000, 1670612399999, 17055.5, False),  # the hour in progress at "now"
        (1670605200000, 1670608799999, 17071.0, True),
    ]
    assert bybit.page_rows({"retCode": 10006, "retMsg": "Too many visits!"}) is None
    assert bybit.newest_first
    request = bybit.klines_request("BTCUSDT", "1h", 1, 2, 3)
    assert request.path == "/v5/market/kline" and request.params["interval"] == "60"
    assert BybitLinear().klines_request("BTCUSDT", "1d", 1, 2, 3).params["category"] == "linear"


def test_okx_parses_the_documented_candle_push_and_rest_page():
    # the examples of https://www.okx.com/docs-v5/en/ (WS candlesticks channel, GET candles)
    push = {"arg": {"channel": "candle1D", "instId": "BTC-USDT"},
            "data": [["1597026383085", "8533.02", "8553.74", "8527.17", "8548.26", "45247",
                      "529.5858061", "5000000", "0"]]}  # fmt: skip
    rejections: Counter = Counter()
    okx = Okx()
    parser = okx.parser(["BTC-USDT"], "1d", rejections)
    # our days open at 00:00 UTC: OKX's candle1D opens at Hong Kong midnight, 1Dutc at ours
    assert parser.parse(json.dumps(push)) is None and rejections == {"wrong_interval": 1}
    push["arg"]["channel"] = "candle1Dutc"
    k = parser.parse(json.dumps(push))
    assert (k.symbol, k.open_time, k.close, k.volume, k.closed) == (
        "BTC-USDT", 1597026383085, 8548.26, 45247.0, False,
    )  # fmt: skip
    assert k.close_time == 1597026383085 + 86_400_000 - 1
    page = {"code": "0", "msg": "", "data": [
        ["1597026383085", "3.721", "3.743", "3.677", "3.708", "8422410", "22698348.04828491",
         "12698348.04828491", "0"],
        ["1597026383085", "3.731", "3.799", "3.494", "3.72", "24912403", "67632347.24399722",
         "37632347.24399722", "1"],
    ]}  # fmt: skip
    rows = okx.page_rows(page)
    assert [okx.parse_row(r, "BTC-USDT", "1d", 0).closed for r in rows] == [False, True]
    assert okx.page_rows({"code": "50011", "msg": "Rate limit reached", "data": []}) is None
    assert parser.parse("pong") is PONG and parser.parse(b"pong") is PONG
    subscribed = {"event": "subscribe", "arg": {"channel": "candle1Dutc", "instId": "BTC-USDT"},
                  "connId": "a4d3ae55"}  # fmt: skip
    assert parser.parse(json.dumps(subscribed)) is None
    error = {"event": "error", "code": "60012", "msg": "Invalid request", "connId": "a4d3ae55"}
    assert parser.parse(json.dumps(error)) == Control("subscribe_failed", "60012: Invalid request")
    row = push["data"][0]

    def candle(**at) -> str:
        r = list(row)
        for i, v in at.items():
            r[int(i[1:])] = v
        return json.dumps(dict(push, data=[r]))

    cases = {
        "pon": "malformed_json",
        '"text"': "not_a_kline",
        json.dumps({"arg": {"channel": "tickers", "instId": "BTC-USDT"}, "data": []}):
            "not_a_kline",
        json.dumps({"arg": {"channel": "candle1Dutc", "instId": "BTC-USDT"}}): "missing_field",
        json.dumps({"arg": [], "data": []}): "bad_type",
        json.dumps(dict(push, arg={"channel": "candle1Dutc", "instId": "ETH-USDT"})):
            "unsubscribed_symbol",
        json.dumps(dict(push, data=["x"])): "bad_type",
        json.dumps(dict(push, data=[row[:5]])): "missing_field",
        candle(c0="-1"): "bad_time",
        candle(c8="yes"): "bad_type",
        candle(c4="NaN"): "bad_number",
        candle(c1="0"): "non_positive_price",
    }  # fmt: skip
    for raw, reason in cases.items():
        before = rejections[reason]
        assert parser.parse(raw) is None, raw
        assert rejections[reason] == before + 1, (raw, reason, rejections)


def test_okx_pages_recent_candles_then_history_candles():
    okx = Okx()
    now = 1_700_000_000_000
    recent = okx.klines_request("BTC-USDT", "1m", now - 1000 * IMS, now, now)
    old = okx.klines_request("BTC-USDT", "1m", now - 2000 * IMS, now, now)
    assert recent.path == "/api/v5/market/candles" and recent.limit == 300
    assert old.path == "/api/v5/market/history-candles" and old.limit == 100
    assert recent.params == {"instId": "BTC-USDT", "bar": "1m", "after": str(now + 1),
                             "before": str(now - 1000 * IMS - 1), "limit": "300"}  # fmt: skip


def test_binance_usdm_parses_the_documented_kline_event():
    # the example of the USD-M "Kline/Candlestick Streams" page (a raw-stream event)
    documented = {"e": "kline", "E": 1638747660000, "s": "BTCUSDT", "k": {
        "t": 1638747660000, "T": 1638747719999, "s": "BTCUSDT", "i": "1m", "f": 100, "L": 200,
        "o": "0.0010", "c": "0.0020", "h": "0.0025", "l": "0.0015", "v": "1000", "n": 100,
        "x": False, "q": "1.0000", "V": "500", "Q": "0.500", "B": "123456"}}  # fmt: skip
    usdm = BinanceUsdm()
    k = usdm.parser(["BTCUSDT"], "1m", Counter()).parse(json.dumps(documented))
    assert (k.open_time, k.close_time, k.open, k.close, k.high, k.low, k.closed) == (
        1638747660000, 1638747719999, 0.001, 0.002, 0.0025, 0.0015, False,
    )  # fmt: skip
    request = usdm.klines_request("BTCUSDT", "1m", 1, 2, 3)
    assert request.path == "/fapi/v1/klines" and request.params["limit"] == 1000
    assert usdm.limits.request_weight == 5 and usdm.limits.budget == 2400
    url = usdm.stream_url(usdm.ws_url, "1m", ["BTCUSDT", "ETHUSDT"])
    assert url == "wss://fstream.binance.com/stream?streams=btcusdt@kline_1m/ethusdt@kline_1m"


# -- intervals, symbols, subscriptions ----------------------------------------------------------


def test_interval_names_and_refusals():
    bybit, okx = BybitSpot(), Okx()
    assert [bybit.interval_name(i) for i in ("1m", "15m", "1h", "4h", "1d", "1w", "1M")] == [
        "1", "15", "60", "240", "D", "W", "M"
    ]  # fmt: skip
    assert [okx.interval_name(i) for i in ("1s", "1m", "1h", "6h", "1d", "1w", "1M")] == [
        "1s", "1m", "1H", "6Hutc", "1Dutc", "1Wutc", "1Mutc"
    ]  # fmt: skip
    for exchange, interval in ((bybit, "1s"), (okx, "8h"), (BinanceUsdm(), "1s")):
        with pytest.raises(ValueError, match=f"^{exchange.name} has no {interval} klines; "):
            exchange.interval_name(interval)
    assert make_exchange("binance").interval_name("1s") == "1s"


def test_symbol_rules():
    assert Okx().normalise_symbol(" btc-usdt-swap ") == "BTC-USDT-SWAP"
    assert BybitSpot().normalise_symbol("ethusdt") == "ETHUSDT"
    assert BinanceUsdm().normalise_symbol("btcusdt_250926") == "BTCUSDT_250926"
    for exchange, symbol in ((Okx(), "BTCUSDT"), (BybitSpot(), "BTC/USDT"), (BybitSpot(), "")):
        with pytest.raises(ValueError, match=f"^{exchange.name} symbols look like "):
            exchange.normalise_symbol(symbol)
    with pytest.raises(ValueError, match="unknown exchange 'kraken'; choose one of binance"):
        make_exchange("kraken")


def test_subscribe_messages_stay_within_the_exchanges_limits():
    symbols = [f"S{i}USDT" for i in range(25)]
    bybit = [json.loads(m) for m in BybitSpot().subscribe_messages("1m", symbols)]
    assert [len(m["args"]) for m in bybit] == [10, 10, 5]
    assert bybit[0] == {"op": "subscribe", "args": [f"kline.1.S{i}USDT" for i in range(10)]}
    okx = [json.loads(m) for m in Okx().subscribe_messages("1h", ["BTC-USDT"])]
    assert okx == [{"op": "subscribe", "args": [{"channel": "candle1H", "instId": "BTC-USDT"}]}]
    assert BybitSpot().stream_url("ws://127.0.0.1:9", "1m", symbols) == (
        "ws://127.0.0.1:9/v5/public/spot"
    )  # fmt: skip
    assert Okx().stream_url(Okx.ws_url, "1m", []) == "wss://ws.okx.com:8443/ws/v5/business"


# -- the command line -------------------------------------------------------------------------


def test_cli_live_on_okx_streams_to_file(tmp_path):
    from typer.testing import CliRunner

    from atc_stream.app.cli import app

    symbols = ["BTC-USDT", "ETH-USDT"]
    closes = make_bars(symbols, 250, seed=12)
    start, history = 230, 100
    t0 = int(time.time() * 1000) - start * IMS - 1000  # bar `start` opened a second ago
    out = tmp_path / "live.jsonl"
    with OkxEmulator(closes, start, t0=t0) as ex:
        result = CliRunner().invoke(
            app,
            [
                "live", "--exchange", "okx", "--symbols", "btc-usdt,ETH-USDT",
                "--history", str(history), "--ws-url", ex.ws_url, "--rest-url", ex.rest_url,
                "--output", str(out), "--max-bars", str(2 * (250 - start)),
                "--max-seconds", "60", "--backend", "cpu", "--no-previews",
                "--status-every", "0",
            ],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"from okx {ex.ws_url}" in result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 + 2 * (250 - start)
    for sym in symbols:
        full = compute(closes[sym][start - history :])["signal"]
        for r in (r for r in rows if r["symbol"] == sym):
            want = full[(r["time"] - t0) // IMS - (start - history)]
            assert (r["signal"] is None and np.isnan(want)) or r["signal"] == want


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--exchange", "kraken", "--symbols", "BTCUSDT"],
         "--exchange kraken: unknown exchange 'kraken'; choose one of binance, binance-usdm, "
         "bybit, bybit-linear, okx, ccxt:<id>"),
        (["--exchange", "bybit", "--symbols", "BTCUSDT", "--interval", "1s"],
         "--exchange bybit: bybit has no 1s klines; intervals: 1m, 3m, 5m, 15m, 30m, 1h, 2h, "
         "4h, 6h, 12h, 1d, 1w, 1M"),
        (["--exchange", "bybit", "--symbols", "BTCUSDT,DOGEUSDT,ETHUSDT"],
         "bybit has no symbol DOGEUSDT (--symbols)"),
    ],
)  # fmt: skip
def test_cli_live_refuses_an_unknown_exchange_interval_or_symbol_in_one_line(
    args, line, tmp_path, run_main
):
    closes = make_bars(["BTCUSDT", "ETHUSDT"], 10)
    with BybitEmulator(closes, 5) as ex:
        code, stderr = run_main(["live", *args, "--ws-url", ex.ws_url, "--rest-url",
                                 ex.rest_url, "--output", str(tmp_path / "o.jsonl")])  # fmt: skip
        klines = list(ex.rest_requests)
    assert code == 2 and stderr.strip().splitlines() == [f"atc-stream: error: {line}"]
    assert not klines and not (tmp_path / "o.jsonl").exists()
