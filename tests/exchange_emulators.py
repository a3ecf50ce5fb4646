"""Local kline exchanges for the live-feed tests: real servers on 127.0.0.1 (a websocket
server and an aiohttp REST app, in their own thread and event loop) speaking the wire
format of Binance spot and USD-M, Bybit v5 and OKX, plus the helpers that check a
client's results against ``compute``. Imported by the tests as a module (pytest's
``prepend`` import mode puts ``tests/`` on the path, as for ``redis_fixtures``).

Every emulator serves one fixed, deterministic bar set: its ticker publishes bar after
bar (a few in-progress klines, then the closed one) to whoever is connected (subscribed,
where the exchange wants a subscribe message), and misbehaves on cue: closes connections
(cleanly, abruptly, mid-message), stalls, sends raw messages, and answers REST with
429/418 (with ``Retry-After``), 5xx, timeouts, garbage or a bad row. The Binance ones
report the weight used in ``X-MBX-USED-WEIGHT-1M``, as the exchange does.
"""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
from collections import Counter
from contextlib import contextmanager
from urllib.parse import parse_qs, urlparse

import numpy as np
from aiohttp import web
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed

from atc_stream import ATCParams, Engine, compute
from atc_stream.connectors.exchanges.config import LiveConfig, LiveStats
from atc_stream.connectors.exchanges.feed import KlineClient
from atc_stream.core.intervals import interval_ms
from atc_stream.core.results import StepResult

INTERVAL = "1m"
IMS = 60_000
T0 = 1_700_000_040_000 - 1_700_000_040_000 % IMS


def make_bars(symbols, n_bars, seed=3):
    """Deterministic random walks on a 0.01 grid (ties happen, as with real prices)."""
    rng = np.random.default_rng(seed)
    out = {}
    for s in symbols:
        steps = rng.normal(0, 0.004, n_bars)
        steps[rng.random(n_bars) < 0.05] = 0.0
        out[s] = np.maximum(np.round(rng.uniform(20, 500) * np.exp(np.cumsum(steps)), 2), 0.01)
    return out


def fmt(x: float) -> str:
    return repr(float(x))


class Emulator:
    """The exchange-independent part: lifecycle, ticker, faults, REST fault injection.

    Subclasses give the wire format: ``ws_message`` (one kline push), ``routes`` (REST
    paths to handlers), ``url_symbols`` (streams named in the URL) and
    ``client_message`` (subscribe and ping messages of the client)."""

    name = "emulator"
    used_weight_header: str | None = None  #: the response header of the weight used
    klines_weight = 1  #: weight of one klines request

    def __init__(
        self,
        closes: dict[str, np.ndarray],
        start: int,
        *,
        previews_per_bar: int = 2,
        bar_pause: float = 0.006,
        wait_connections: int = 1,
        wait_rest: int = 0,
        faults: dict[int, list] | None = None,
        rest_faults: list[str] | None = None,
        slow_seconds: float = 1.0,
        retry_after: str = "0",
        t0: int = T0,
        interval: str = INTERVAL,
        realtime: bool = False,
    ) -> None:
        self.t0 = t0  # open time of bar 0
        self.interval = interval
        # bars close on the wall clock (connected or not), and REST answers by it
        self.realtime = realtime
        self.ims = interval_ms(interval)
        self.closes = closes
        self.n_bars = len(next(iter(closes.values())))
        self.cursor = start  # bars < cursor are closed; bar `cursor` is in progress
        self.previews_per_bar = previews_per_bar
        self.bar_pause = bar_pause
        self.wait_connections = wait_connections
        #: the ticker also waits for this many klines answers (a client's whole warmup)
        self.wait_rest = wait_rest
        self.faults = faults or {}  # bar index -> actions done before its closed kline
        self.rest_faults = list(rest_faults or [])
        self.slow_seconds = slow_seconds
        self.retry_after = retry_after  #: the Retry-After of a 429 or 418
        self.answer_pings = True  #: answer the client's text pings (Bybit, OKX)
        self._conns: list[dict] = []
        self._all_ws: list = []
        self.ws_connections = 0
        self.paths: list[str] = []
        self.extensions: list[str | None] = []  # negotiated Sec-WebSocket-Extensions
        self.client_messages: list[str] = []  # text the clients sent (subscribes, pings)
        self.rest_requests: list[dict] = []  # query of every klines request
        self.rest_log: list[tuple[float, str, str | None]] = []  # (monotonic, path, fault)
        self.rest_answers = Counter()
        #: called at each klines request, its value kept in ``rest_stamps`` (a test's clock)
        self.rest_clock = None
        self.rest_stamps: list = []
        self.other_weight = 0  #: weight other clients of the same IP used (reported too)
        self.rest_in_flight = 0
        self.max_rest_in_flight = 0  #: most klines requests being answered at once
        self.rest_answered_at: list[int] = []  #: the bar in progress at each klines answer
        self.done = False
        self.applied: Counter = Counter()  # fault actions that hit a connection
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    # -- lifecycle -----------------------------------------------------------------------

    def __enter__(self):
        self._thread.start()
        assert self._ready.wait(10), "fake exchange did not start"
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(10)
        assert not self._thread.is_alive(), "fake exchange did not stop"

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        app = web.Application()
        for path, handler in self.routes().items():
            app.router.add_get(path, self._rest(path, handler))
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.rest_port = runner.addresses[0][1]
        async with serve(self._handler, "127.0.0.1", 0, close_timeout=0.2) as server:
            self.ws_port = server.sockets[0].getsockname()[1]
            ticker = asyncio.ensure_future(self._ticker())
            self._ready.set()
            await self._stopping.wait()
            ticker.cancel()
            for conn in self._conns:
                conn["queue"].put_nowait(("abort",))
            for ws in self._all_ws:
                ws.transport.abort()
        await runner.cleanup()

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.ws_port}"

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def now_ms(self) -> int:
        """The exchange clock: the middle of the bar in progress (in real time: now)."""
        if self.realtime:
            return int(time.time() * 1000)
        return self.t0 + self.cursor * self.ims + self.ims // 2

    def rest_cursor(self) -> int:
        """The bar in progress as REST answers: in real time, the clock's, also in the
        moment between a bar's close and the ticker's broadcast of it."""
        if not self.realtime:
            return self.cursor
        return max(self.cursor, (int(time.time() * 1000) - self.t0) // self.ims)

    def wait_for_bar(self, i: int) -> None:
        """Returns once bar ``i`` is in progress (every bar before it has closed)."""
        deadline = time.monotonic() + 10
        while self.cursor < i:
            assert time.monotonic() < deadline, "the exchange stopped closing bars"
            time.sleep(0.005)

    # -- data ------------------------------------------------------------------------------

    def ws_message(self, symbol: str, i: int, close: float, closed: bool) -> str:
        raise NotImplementedError

    def preview_close(self, symbol: str, i: int, p: int) -> float:
        base = self.closes[symbol][min(i, self.n_bars - 1)]
        return round(base * (1 + 0.002 * (p + 1)), 2)

    def bars(
        self, symbol: str, start: int | None, end: int | None
    ) -> list[tuple[int, float, bool]]:
        """(open time, close, closed) of the bars opening in ``[start, end]`` the REST API
        knows now: the closed ones and the one in progress, ascending."""
        out = []
        cursor = self.rest_cursor()
        for i in range(0, min(cursor, self.n_bars - 1) + 1):
            t = self.t0 + i * self.ims
            if (start is not None and t < start) or (end is not None and t > end):
                continue
            in_progress = i >= cursor
            close = self.preview_close(symbol, i, 0) if in_progress else self.closes[symbol][i]
            out.append((t, float(close), not in_progress))
        if cursor >= self.n_bars:
            t = self.t0 + self.n_bars * self.ims  # the bar in progress after the data set ends
            if (start is None or t >= start) and (end is None or t <= end):
                out.append((t, float(self.preview_close(symbol, self.n_bars, 0)), False))
        return out

    # -- websocket -------------------------------------------------------------------------

    def url_symbols(self, path: str) -> set[str]:
        """Symbols a connection's URL subscribes to (none where a message does it)."""
        return set()

    def client_message(self, conn: dict, text: str) -> list[str]:
        """Answers to a text message of the client (subscribe, ping)."""
        return []

    async def _handler(self, ws) -> None:
        self.paths.append(ws.request.path)
        self.extensions.append(ws.response.headers.get("Sec-WebSocket-Extensions"))
        conn = {"ws": ws, "symbols": self.url_symbols(ws.request.path), "queue": asyncio.Queue()}
        self._all_ws.append(ws)
        self._conns.append(conn)
        self.ws_connections += 1
        reader = asyncio.ensure_future(self._read(conn))
        try:
            while True:
                item = await conn["queue"].get()
                if isinstance(item, str):
                    await ws.send(item)
                    continue
                action = item[0]
                if action == "close":
                    await ws.close()
                    return
                if action == "abort":
                    ws.transport.abort()
                    return
                if action == "midmessage":  # a frame header promising 256 bytes, then 15
                    ws.transport.write(b"\x81\x7e\x01\x00" + b'{"stream": "xx')
                    ws.transport.abort()
                    return
                if action == "stall":  # keep the socket open, never send (or answer) again
                    conn["stalled"] = True
                    self._conns.remove(conn)
                    conn = None
                    await ws.wait_closed()
                    return
        except ConnectionClosed:
            pass
        finally:
            reader.cancel()
            if conn is not None:
                self._conns.remove(conn)

    async def _read(self, conn: dict) -> None:
        try:
            async for text in conn["ws"]:
                if conn.get("stalled"):
                    continue
                self.client_messages.append(text)
                for answer in self.client_message(conn, text):
                    conn["queue"].put_nowait(answer)
        except ConnectionClosed:
            pass

    def _broadcast(self, symbol: str, message: str) -> None:
        for conn in self._conns:
            if symbol in conn["symbols"]:
                conn["queue"].put_nowait(message)

    def _act(self, action) -> bool:
        """Fault actions: ('close'|'abort'|'midmessage'|'stall', n) hits n connections;
        ('raw', symbol, message) sends a raw message to the symbol's connection.
        False when there was no connection to act on (the action waits for one)."""
        if action[0] == "raw":
            self._broadcast(action[1], action[2])
            return True
        alive = [c for c in self._conns if not c.get("doomed") and c["symbols"]]
        targets = alive[: action[1] if len(action) > 1 else None]
        if not targets:
            return False
        for conn in targets:
            conn["doomed"] = True
            conn["queue"].put_nowait((action[0],))
            self.applied[action[0]] += 1
        return True

    async def _ticker(self) -> None:
        while not self.realtime and (
            sum(bool(c["symbols"]) for c in self._conns) < self.wait_connections
            or len(self.rest_answered_at) < self.wait_rest
        ):
            await asyncio.sleep(0.005)
        for i in range(self.cursor, self.n_bars):
            for p in range(self.previews_per_bar):
                for s in self.closes:
                    self._broadcast(s, self.ws_message(s, i, self.preview_close(s, i, p), False))
                await asyncio.sleep(self.bar_pause / max(self.previews_per_bar, 1))
            if self.realtime:
                await asyncio.sleep(max(0.0, (self.t0 + (i + 1) * self.ims) / 1000 - time.time()))
            for action in self.faults.get(i, []):
                deadline = time.monotonic() + 10
                while not self._act(action) and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)  # wait for the client to reconnect
            for s in self.closes:
                self._broadcast(s, self.ws_message(s, i, self.closes[s][i], True))
            self.cursor = i + 1
        self.done = True
        while True:  # the next bar stays in progress: clients learn they are up to date
            for s in self.closes:
                close = self.preview_close(s, self.n_bars, 0)
                self._broadcast(s, self.ws_message(s, self.n_bars, close, False))
            await asyncio.sleep(0.02)

    # -- REST ------------------------------------------------------------------------------

    def routes(self) -> dict:
        raise NotImplementedError

    def _rest(self, path: str, handler):
        """``handler`` behind the REST fault injection: faults hit klines requests only.
        Where the exchange reports the weight used (``used_weight_header``), klines answers
        carry it: ``other_weight`` plus ``klines_weight`` a klines request so far."""
        klines = handler.__name__ == "_klines"

        async def serve_request(request: web.Request) -> web.Response:
            if not klines:
                return await self._answer(path, request, handler, None)
            self.rest_in_flight += 1
            self.max_rest_in_flight = max(self.max_rest_in_flight, self.rest_in_flight)
            try:
                fault = self.rest_faults.pop(0) if self.rest_faults else None
                self.rest_requests.append(dict(request.query))
                if self.rest_clock is not None:
                    self.rest_stamps.append(self.rest_clock())
                response = await self._answer(path, request, handler, fault)
            finally:
                self.rest_in_flight -= 1
            if self.used_weight_header is not None:
                used = self.other_weight + self.klines_weight * len(self.rest_requests)
                response.headers[self.used_weight_header] = str(used)
            return response

        return serve_request

    async def _answer(self, path: str, request: web.Request, handler, fault) -> web.Response:
        self.rest_log.append((time.monotonic(), path, fault))
        if fault is not None:
            self.rest_answers[fault] += 1
        status, _, retry_after = (fault or "").partition(":")
        if status in ("429", "418"):  # "429:SECONDS": with that Retry-After
            headers = {"Retry-After": retry_after or self.retry_after}
            return web.Response(status=int(status), headers=headers, text="slow down")
        if fault == "500":
            return web.Response(status=502, text="bad gateway")
        if fault == "garbage":
            return web.Response(status=200, text="<html>oops</html>")
        if fault == "slow":
            await asyncio.sleep(self.slow_seconds)
        response = await handler(request, fault)
        if handler.__name__ == "_klines":
            self.rest_answered_at.append(self.cursor)
        return response


class BinanceEmulator(Emulator):
    """Binance spot: combined streams named in the URL, ``/api/v3/klines`` ascending."""

    name = "binance"
    used_weight_header = "X-MBX-USED-WEIGHT-1M"
    klines_weight = 2
    klines_path = "/api/v3/klines"
    tickers_path = "/api/v3/ticker/price"

    def routes(self) -> dict:
        return {self.klines_path: self._klines, self.tickers_path: self._tickers}

    def url_symbols(self, path: str) -> set[str]:
        streams = parse_qs(urlparse(path).query).get("streams", [""])[0].split("/")
        return {s.split("@")[0].upper() for s in streams if s}

    def kline(self, symbol: str, i: int, close: float, closed: bool) -> list:
        t = self.t0 + i * self.ims
        return [t, close, close, close, close, 1.5, t + self.ims - 1, closed]

    def ws_message(self, symbol: str, i: int, close: float, closed: bool) -> str:
        t = self.t0 + i * self.ims
        k = {
            "t": t, "T": t + self.ims - 1, "s": symbol, "i": self.interval, "f": 1, "L": 2,
            "o": fmt(close), "c": fmt(close), "h": fmt(close), "l": fmt(close),
            "v": "1.5", "n": 2, "x": closed, "q": "0", "V": "0", "Q": "0", "B": "0",
        }  # fmt: skip
        data = {"e": "kline", "E": self.now_ms, "s": symbol, "k": k}
        return json.dumps({"stream": f"{symbol.lower()}@kline_{self.interval}", "data": data})

    async def _tickers(self, request: web.Request, fault) -> web.Response:
        return web.json_response([{"symbol": s, "price": "1.0"} for s in self.closes])

    async def _klines(self, request: web.Request, fault) -> web.Response:
        q = request.query
        symbol = q.get("symbol", "")
        if symbol not in self.closes or q.get("interval") != self.interval:
            return web.json_response({"code": -1121, "msg": "Invalid symbol."}, status=400)
        limit = min(int(q.get("limit", 500)), 1000)
        start = int(q["startTime"]) if "startTime" in q else None
        end = int(q["endTime"]) if "endTime" in q else None
        rows = []
        for t, close, _ in self.bars(symbol, start, end):
            c = fmt(close)
            rows.append([t, c, c, c, c, "1.5", t + self.ims - 1, "0", 2, "0", "0", "0"])
        rows = rows[:limit] if start is not None else rows[-limit:]
        if fault == "badrow":
            rows.insert(0, ["x", "nan", None])
        return web.json_response(rows)


#: The emulator of the Binance spot test module, by its first name.
FakeExchange = BinanceEmulator


class BinanceUsdmEmulator(BinanceEmulator):
    """Binance USD-M futures: the spot format under ``/fapi/v1``."""

    klines_weight = 5

    name = "binance-usdm"
    klines_path = "/fapi/v1/klines"
    tickers_path = "/fapi/v1/ticker/price"


class BybitEmulator(Emulator):
    """Bybit v5: topics subscribed by message, ``{"op":"ping"}`` answered, klines REST
    newest first (the documented formats of ``/v5/market/kline`` and ``kline.{i}.{s}``)."""

    name = "bybit"
    category = "spot"
    instruments_page = 2  #: symbols per instruments page (paged with nextPageCursor)

    @property
    def bar_name(self) -> str:
        from atc_stream.connectors.exchanges.venues.bybit import INTERVALS

        return INTERVALS[self.interval]

    def routes(self) -> dict:
        return {"/v5/market/kline": self._klines, "/v5/market/instruments-info": self._instruments}

    def client_message(self, conn: dict, text: str) -> list[str]:
        msg = json.loads(text)
        if msg.get("op") == "ping":
            if not self.answer_pings:
                return []
            return [json.dumps({"success": True, "ret_msg": "pong", "conn_id": "c1",
                                "req_id": "", "op": "ping"})]  # fmt: skip
        if msg.get("op") == "subscribe":
            for topic in msg["args"]:
                _, name, symbol = topic.split(".")
                if name == self.bar_name:
                    conn["symbols"].add(symbol)
            return [json.dumps({"success": True, "ret_msg": "subscribe", "conn_id": "c1",
                                "req_id": "", "op": "subscribe"})]  # fmt: skip
        return []

    def ws_message(self, symbol: str, i: int, close: float, closed: bool) -> str:
        t = self.t0 + i * self.ims
        c = fmt(close)
        k = {
            "start": t, "end": t + self.ims - 1, "interval": self.bar_name, "open": c,
            "close": c, "high": c, "low": c, "volume": "1.5", "turnover": "0",
            "confirm": closed, "timestamp": self.now_ms,
        }  # fmt: skip
        topic = f"kline.{self.bar_name}.{symbol}"
        return json.dumps({"topic": topic, "data": [k], "ts": self.now_ms, "type": "snapshot"})

    def answer(self, result: dict) -> web.Response:
        body = {"retCode": 0, "retMsg": "OK", "result": result, "retExtInfo": {},
                "time": self.now_ms}  # fmt: skip
        return web.json_response(body)

    async def _instruments(self, request: web.Request, fault) -> web.Response:
        names = sorted(self.closes)
        at = int(request.query.get("cursor", 0))
        page = names[at : at + self.instruments_page]
        more = str(at + len(page)) if at + len(page) < len(names) else ""
        listed = [{"symbol": s, "status": "Trading"} for s in page]
        return self.answer({"category": self.category, "list": listed, "nextPageCursor": more})

    async def _klines(self, request: web.Request, fault) -> web.Response:
        q = request.query
        symbol = q.get("symbol", "")
        if symbol not in self.closes or q.get("interval") != self.bar_name:
            return web.json_response({"retCode": 10001, "retMsg": "params error", "result": {}})
        limit = min(int(q.get("limit", 200)), 1000)
        start = int(q["start"]) if "start" in q else None
        end = int(q["end"]) if "end" in q else None
        rows = [[str(t), fmt(c), fmt(c), fmt(c), fmt(c), "1.5", "0"]
                for t, c, _ in self.bars(symbol, start, end)][-limit:][::-1]  # fmt: skip
        if fault == "badrow":
            rows.insert(0, ["x", "nan"])
        return self.answer({"symbol": symbol, "category": self.category, "list": rows})


class BybitLinearEmulator(BybitEmulator):
    name = "bybit-linear"
    category = "linear"


class OkxEmulator(Emulator):
    """OKX v5: candle channels subscribed by message, text ping/pong, candles REST newest
    first between the exclusive ``before`` and ``after``."""

    name = "okx"

    @property
    def bar_name(self) -> str:
        from atc_stream.connectors.exchanges.venues.okx import INTERVALS

        return INTERVALS[self.interval]

    def routes(self) -> dict:
        return {
            "/api/v5/market/candles": self._klines,
            "/api/v5/market/history-candles": self._klines,
            "/api/v5/public/instruments": self._instruments,
        }

    def client_message(self, conn: dict, text: str) -> list[str]:
        if text == "ping":
            return ["pong"] if self.answer_pings else []
        msg = json.loads(text)
        answers = []
        if msg.get("op") == "subscribe":
            for arg in msg["args"]:
                if arg["channel"] == "candle" + self.bar_name:
                    conn["symbols"].add(arg["instId"])
                answers.append(json.dumps({"event": "subscribe", "arg": arg, "connId": "a4d3ae55"}))
        return answers

    def row(self, t: int, close: float, closed: bool) -> list[str]:
        c = fmt(close)
        return [str(t), c, c, c, c, "1.5", "0", "0", "1" if closed else "0"]

    def ws_message(self, symbol: str, i: int, close: float, closed: bool) -> str:
        arg = {"channel": "candle" + self.bar_name, "instId": symbol}
        return json.dumps({"arg": arg, "data": [self.row(self.t0 + i * self.ims, close, closed)]})

    async def _instruments(self, request: web.Request, fault) -> web.Response:
        kind = request.query.get("instType")
        listed = [{"instId": s, "instType": kind} for s in self.closes if kind == "SPOT"]
        return web.json_response({"code": "0", "msg": "", "data": listed})

    async def _klines(self, request: web.Request, fault) -> web.Response:
        q = request.query
        symbol = q.get("instId", "")
        if symbol not in self.closes or q.get("bar") != self.bar_name:
            return web.json_response({"code": "51001", "msg": "Instrument ID does not exist"})
        limit = min(int(q.get("limit", 100)), 300)  # both paths: at most 300 rows
        after = int(q["after"]) if "after" in q else None  # rows older than this
        before = int(q["before"]) if "before" in q else None  # rows newer than this
        bars = self.bars(symbol, None if before is None else before + 1,
                         None if after is None else after - 1)  # fmt: skip
        rows = [self.row(t, c, closed) for t, c, closed in bars][-limit:][::-1]
        if fault == "badrow":
            rows.insert(0, ["x", "nan"])
        return web.json_response({"code": "0", "msg": "", "data": rows})


# -- checking a client's results ----------------------------------------------------------------


def expected_outputs(closes: np.ndarray, first: int) -> dict[str, np.ndarray]:
    return compute(closes[first:], ATCParams())


def collect(results, provisional=False):
    """(symbol, time) -> output row, asserting each appears exactly once."""
    rows: dict = {}
    for res in results:
        assert res.provisional is provisional
        for j, (sym, t) in enumerate(zip(res.symbols, res.times.tolist(), strict=True)):
            assert (sym, t) not in rows, f"bar {sym} {t} emitted twice"
            rows[(sym, t)] = res.outputs[j]
    return rows


def assert_exact(
    rows: dict,
    closes: dict[str, np.ndarray],
    first: int,
    emitted_from: int,
    last: int,
    t0: int = T0,
    ims: int = IMS,
) -> None:
    """``rows`` hold bars ``emitted_from..last`` of every symbol exactly once (the warmup
    emits its last bar only), each equal to ``compute`` over the closes from ``first``."""
    span = range(emitted_from, last + 1)
    assert set(rows) == {(s, t0 + i * ims) for s in closes for i in span}
    for s, series in closes.items():
        full = expected_outputs(series, first)
        idx = np.array([i - first for i in span])
        got = np.stack([rows[(s, t0 + i * ims)] for i in span])
        n = len(idx)
        res = StepResult([None], np.zeros(n, np.int64), np.zeros(n), np.zeros(n), got)
        assert np.array_equal(res.signal, full["signal"][idx], equal_nan=True), s
        for j, fam in enumerate(("ema", "hma", "wma", "dema", "lsma", "kama")):
            assert np.array_equal(res.layer1_signals[:, j], full[f"{fam}_signal"][idx], True)
            assert np.array_equal(res.layer2_equities[:, j], full[f"{fam}_equity"][idx], True)
        assert np.array_equal(res.growth, full["growth"][idx], equal_nan=True)
        assert np.array_equal(res.long_events, full["long"][idx] == 1)
        assert np.array_equal(res.short_events, full["short"][idx] == 1)
        assert np.array_equal(res.bar_index, idx)


def fast_config(ex: Emulator, **kw) -> LiveConfig:
    """Settings for a client of ``ex``: short timeouts and backoffs, no rate limit."""
    base = dict(
        ws_url=ex.ws_url,
        rest_url=ex.rest_url,
        history=200,
        idle_timeout=5.0,
        open_timeout=3.0,
        close_timeout=0.5,
        backoff_initial=0.02,
        backoff_max=0.2,
        rest_timeout=3.0,
        gap_confirm_delay=0.05,
    )
    base.update(kw)
    return LiveConfig(**base)


@contextmanager
def small_heap():
    """The test session's objects out of the collector's view while a client runs: the
    client's ``gc.collect()`` after its start-up then costs milliseconds, not the seconds a
    long session's heap takes, inside a test's timed window."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def run_client(client: KlineClient, **kw) -> LiveStats:
    with small_heap():
        return asyncio.run(client.run(**kw))


def feed(ex: Emulator, config: LiveConfig, symbols, *, seed: int, exchange=None, **run):
    """A fresh engine fed by a client of ``symbols`` on ``ex``'s clock: (stats, results)."""
    results: list = []
    client = KlineClient(
        Engine(backend="cpu", interval=ex.interval, outputs="all"), symbols, config,
        on_result=results.append, clock_ms=lambda: ex.now_ms, seed=seed, exchange=exchange,
    )  # fmt: skip
    return run_client(client, **run), results


def compile_kernels(interval: str = INTERVAL) -> None:
    """Compiles the engine's kernels, so no test's client stalls for seconds on it."""
    engine = Engine(backend="cpu", interval=interval, outputs="all")
    engine.warmup({"X": (np.arange(50), np.linspace(1.0, 2.0, 50))})
    engine.step([("X", 50, 1.5)])
    engine.preview([("X", 51, 1.6)])
    compute(np.linspace(1.0, 2.0, 50))
