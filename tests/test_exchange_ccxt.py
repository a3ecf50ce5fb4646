"""The ccxt adapter (``--exchange ccxt:<id>``) with ccxt's own OKX class, its REST and
websocket URLs pointed at the local OKX emulator (``exchange_emulators.OkxEmulator``):
ccxt's real transports, the emulator's documented wire format, no stubs of our code."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections import Counter

import pytest

pytest.importorskip("websockets")
pytest.importorskip("aiohttp")
ccxt_pro = pytest.importorskip("ccxt.pro")

from exchange_emulators import (  # noqa: E402
    INTERVAL,
    T0,
    OkxEmulator,
    assert_exact,
    collect,
    compile_kernels,
    make_bars,
    small_heap,
)

from atc_stream import Engine  # noqa: E402
from atc_stream.connectors.exchanges.config import LiveConfig, LiveStats  # noqa: E402
from atc_stream.connectors.exchanges.feed import KlineClient  # noqa: E402
from atc_stream.connectors.exchanges.klines import Kline  # noqa: E402
from atc_stream.connectors.exchanges.venues.ccxt_pro import (  # noqa: E402
    CcxtCandles,
    CcxtExchange,
    CcxtStream,
)

IMS = 60_000


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels():
    compile_kernels(INTERVAL)


def okx_on(ex: OkxEmulator) -> CcxtExchange:
    """``ccxt:okx`` whose ccxt client talks to the emulator ``ex``."""

    def client():
        okx = ccxt_pro.okx({"enableRateLimit": True})
        okx.urls["api"] = {"rest": ex.rest_url, "ws": ex.ws_url + "/ws/v5"}
        return okx

    return CcxtExchange("okx", client_factory=client)


def run(client: KlineClient, **kw) -> LiveStats:
    async def go() -> LiveStats:
        try:
            return await client.run(**kw)
        finally:
            await client.exchange.aclose()

    with small_heap():
        return asyncio.run(go())


def config(**kw) -> LiveConfig:
    base = dict(history=150, idle_timeout=5.0, backoff_initial=0.02, backoff_max=0.2,
                rest_timeout=3.0, gap_confirm_delay=0.05)  # fmt: skip
    return LiveConfig(**{**base, **kw})


def test_ccxt_okx_every_bar_once_through_a_dropped_connection():
    """Warmup over ``fetch_ohlcv`` (ccxt pages OKX's history candles by 100), then
    ``watch_ohlcv``: bars close as the next one opens; a dropped socket is watched again
    and the bars it missed are backfilled: every bar once, equal to ``compute``."""
    names = ["BTC-USDT", "ETH-USDT"]
    n, start, history = 300, 250, 150
    closes = make_bars(names, n, seed=31)
    with OkxEmulator(closes, start, bar_pause=0.01, faults={270: [("abort", 1)]}) as ex:
        results: list = []
        client = KlineClient(
            Engine(backend="cpu", interval=INTERVAL, outputs="all"), ["btc/usdt", "ETH/USDT"],
            config(history=history), on_result=results.append, exchange=okx_on(ex),
            clock_ms=lambda: ex.now_ms, seed=3,
        )  # fmt: skip
        stats = run(client, max_bars=2 * (n - start), max_seconds=60)
        pages = [q for _, path, q in ex.rest_log if "candles" in path]
    assert client.symbols == ["BTC/USDT", "ETH/USDT"]
    unified = {s.replace("-", "/"): v for s, v in closes.items()}
    assert stats.bars == 2 * (n - start)
    assert_exact(collect(results), unified, start - history, start - 1, n - 1)
    assert stats.disconnects == {"connection_lost": 1} and stats.reconnects == 1
    assert stats.closed_klines + stats.backfilled_bars == stats.bars
    assert stats.warmup_bars == 2 * history and len(pages) >= 2 * 2
    assert not stats.rejections and not stats.engine_rejections


def test_a_ccxt_bar_closes_when_the_next_one_opens():
    """ccxt's candles carry no "closed" flag: a bar is sent closed, with its latest
    values, when a later bar shows up; late updates of a passed bar are left out."""
    queue: asyncio.Queue = asyncio.Queue()
    parser = CcxtCandles(["BTC/USDT"], "1m", Counter())
    stream = CcxtStream(0, ["BTC/USDT"], None, queue, parser, LiveConfig(), LiveStats(), None)

    async def send_all(updates):
        pending = None
        for candles in updates:
            pending = await stream._send("BTC/USDT", candles, pending)
        return [queue.get_nowait() for _ in range(queue.qsize())]

    t = T0
    updates = [
        [[t, 10.0, 10.0, 10.0, 10.0, 1.0]],
        [[t, 10.0, 11.0, 10.0, 11.0, 2.0]],
        [[t + IMS, 11.0, 11.0, 11.0, 11.0, 0.5]],  # the next bar: t is closed
        [[t, 10.0, 12.0, 10.0, 12.0, 3.0]],  # a late update of t: left out
        [[t + IMS, 11.0, 11.5, 11.0, 11.5, 1.0], [t + 2 * IMS, 11.5, 11.5, 11.5, 11.5, 0.1]],
        [["bad", 1, 1, 1, 1, 1], [t + 2 * IMS, 11.5, 11.5, 11.5, -1.0, 0.1]],
    ]
    sent = asyncio.run(send_all(updates))
    assert [(k.open_time - t) // IMS for k in sent] == [0, 0, 0, 1, 1, 1, 2]
    assert [k.closed for k in sent] == [False, False, True, False, False, True, False]
    closed = [k for k in sent if k.closed]
    assert closed[0] == Kline("BTC/USDT", t, t + IMS - 1, 10.0, 11.0, 10.0, 11.0, 2.0, True)
    assert closed[1].close == 11.5
    assert parser.rejections == {"bad_time": 1, "non_positive_price": 1}


def test_ccxt_failed_connects_count_as_a_websockets_do():
    """A watch that cannot connect (nothing listens on the websocket port: refused) is a
    failed connect, once a retry: in ``connect_failures`` and in
    ``disconnects["connect_failed"]``, as a native websocket's attempt; nothing is up."""
    names = ["BTC/USDT", "ETH/USDT"]
    with socket.socket() as s:  # a port that was free a moment ago: connects are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stats = LiveStats()
    with OkxEmulator(make_bars(["BTC-USDT", "ETH-USDT"], 10), 5) as ex:
        okx = ccxt_pro.okx({"enableRateLimit": True})
        # the markets come from the emulator's REST; the websocket is refused
        okx.urls["api"] = {"rest": ex.rest_url, "ws": f"ws://127.0.0.1:{port}/ws/v5"}

        async def go() -> CcxtStream:
            parser = CcxtCandles(names, INTERVAL, Counter())
            stream = CcxtStream(0, names, okx, asyncio.Queue(), parser, config(), stats,
                                random.Random(1))  # fmt: skip
            task = asyncio.create_task(stream.run())
            deadline = time.monotonic() + 30
            while stats.connect_failures < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            await okx.close()
            return stream

        stream = asyncio.run(go())
    assert stats.connect_failures >= 3
    assert stats.disconnects == {"connect_failed": stats.connect_failures}
    assert stats.connects == 0 and stats.open_connections == 0
    assert not stream.connected.is_set()


def test_ccxt_symbols_are_checked_against_ccxt_markets():
    closes = make_bars(["BTC-USDT", "ETH-USDT"], 10)
    with OkxEmulator(closes, 5) as ex:
        exchange = okx_on(ex)
        unknown = asyncio.run(
            exchange.unknown_symbols(LiveConfig(), "1m", ["ETH/USDT", "DOGE/USDT"])
        )
    assert unknown == ["DOGE/USDT"]


def test_ccxt_names_intervals_and_refusals():
    okx = CcxtExchange("okx")
    assert okx.name == "ccxt:okx" and okx.interval_name("1h") == "1h"
    with pytest.raises(ValueError, match="^ccxt:okx has no 1s klines"):
        okx.interval_name("1s")
    with pytest.raises(ValueError, match="^ccxt:okx symbols look like BTC/USDT"):
        okx.normalise_symbol("BTC-USDT")
    with pytest.raises(ValueError, match="^ccxt has no websocket exchange 'nope'"):
        CcxtExchange("nope")
    with pytest.raises(ValueError, match="no --ws-url/--rest-url"):
        okx.check_config(LiveConfig(ws_url="ws://127.0.0.1:1"))


def test_cli_ccxt_refusals_are_one_line(run_main, tmp_path):
    out = str(tmp_path / "o.jsonl")
    code, stderr = run_main(["live", "--exchange", "ccxt:nope", "--symbols", "BTC/USDT", "-o", out])
    assert code == 2 and stderr.strip().splitlines() == [
        "atc-stream: error: --exchange ccxt:nope: ccxt has no websocket exchange 'nope' "
        "(ccxt.pro.exchanges lists them)"
    ]
    code, stderr = run_main(
        ["live", "--exchange", "ccxt:okx", "--symbols", "BTC/USDT", "--ws-url", "ws://h", "-o", out]
    )
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and "--ws-url" in stderr
