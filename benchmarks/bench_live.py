#!/usr/bin/env python
"""Live benchmark (issue 9): time to live and kline → Redis latency of ``atc-stream live``.

Run from the repository root (needs redis-server and the ``live``/``redis`` extras)::

    .venv/bin/python benchmarks/bench_live.py                       # 20 and 200 symbols
    .venv/bin/python benchmarks/bench_live.py --symbols 20 200 1000 --bars 30

A local exchange in Binance's format (the websocket + REST server of
``tests/test_binance_live.py``) serves ``--history`` closed bars per symbol over REST,
then sends every symbol's closed kline once per ``--bar-seconds`` of wall clock. A
real ``atc-stream live --redis`` process (warm kernel cache: ``atc-stream compile``
runs first) consumes it, and a redis-py subscriber on ``atc:batch`` stamps every
message on arrival. Latency of a bar = arrival of its signal − send time of its
closed kline (same host, same clock). *Time to live* = process start → the first bar
from which every bar's signals arrive within 100 ms of their kline. Steady p50/p99
are over the bars after that. Targets at 200 symbols with 300 bars of history and a
warm cache: live within 10 s; p50 <= 2 ms, p99 <= 5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from redis_fixtures import RedisServer  # noqa: E402
from test_binance_live import IMS, FakeExchange, make_bars  # noqa: E402

STREAMS_PER_CONNECTION = 200
LIVE_WITHIN = 0.100  # seconds: a bar is "live" when its signals arrive this soon


class WallClockExchange(FakeExchange):
    """Sends each bar's closed klines on a wall-clock tick and remembers when."""

    def __init__(self, closes, start, *, bar_seconds: float, t0: int, connections: int) -> None:
        super().__init__(closes, start, previews_per_bar=0, t0=t0, wait_connections=connections)
        self.bar_seconds = bar_seconds
        self.sent_at: dict[int, float] = {}  # bar open time (ms) -> wall time sent

    async def _ticker(self) -> None:
        while len(self._conns) < self.wait_connections:
            await asyncio.sleep(0.002)
        next_tick = time.time() + self.bar_seconds
        for i in range(self.cursor, self.n_bars):
            await asyncio.sleep(max(0.0, next_tick - time.time()))
            next_tick += self.bar_seconds
            self.sent_at[self.t0 + i * IMS] = time.time()
            for s in self.closes:
                self._broadcast(s, self.ws_message(s, i, self.closes[s][i], True))
            self.cursor = i + 1
        self.done = True
        while True:
            await asyncio.sleep(0.05)


def _subscribe(url: str, stop: threading.Event, arrivals: list) -> threading.Thread:
    from atc_stream.adapters.redis_pubsub import SignalSubscriber

    sub = SignalSubscriber(url, batch=True)
    sub.wait_ready()

    def read() -> None:
        while not stop.is_set():
            raw = sub.get_raw(timeout=0.1)
            if raw is not None:
                arrived = time.time()
                message = sub.decode(*raw)
                arrivals.append((arrived, {int(r.time) for r in message.data.records},
                                 len(message.data.records)))  # fmt: skip
        sub.close()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def run_one(n_symbols: int, args, redis_url: str, tmp: Path) -> dict:
    symbols = [f"S{i:04d}USDT" for i in range(n_symbols)]
    total = args.history + args.bars
    closes = make_bars(symbols, total + 1, seed=n_symbols)
    # bar `history` is the first one in progress when the process starts
    t0 = int(time.time() * 1000) - args.history * IMS - IMS // 2
    arrivals: list = []
    stop = threading.Event()
    reader = _subscribe(redis_url, stop, arrivals)
    # 200 streams per websocket: the local server rejects longer URLs (HTTP 414)
    connections = -(-n_symbols // STREAMS_PER_CONNECTION)
    with WallClockExchange(
        closes, args.history, bar_seconds=args.bar_seconds, t0=t0, connections=connections
    ) as ex:
        command = [
            sys.executable, "-m", "atc_stream.cli", "live", "--symbols", ",".join(symbols),
            "--history", str(args.history), "--ws-url", ex.ws_url, "--rest-url", ex.rest_url,
            "--redis", redis_url, "--backend", "cpu", "--status-every", "0",
            "--no-previews", "--rest-rate", "10000", "--output", str(tmp / "live.jsonl"),
            "--max-seconds", str(args.bars * args.bar_seconds + 60),
            "--max-bars", str(n_symbols * args.bars),
            "--max-streams-per-connection", str(STREAMS_PER_CONNECTION),
        ]  # fmt: skip
        started = time.time()
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        sent_at = dict(ex.sent_at)
    time.sleep(0.3)
    stop.set()
    reader.join(5)
    if done.returncode != 0:
        raise SystemExit(f"atc-stream live failed:\n{done.stderr[-2000:]}")
    if not sent_at:  # the client never connected its websocket: say why
        print(f"{n_symbols} symbols: no bar was sent; atc-stream said:\n{done.stderr[-1500:]}")
    # latest arrival of each bar's signals (all symbols) minus its kline send time
    last_arrival: dict[int, float] = {}
    counts: dict[int, int] = {}
    for arrived, times, n in arrivals:
        for t in times:
            last_arrival[t] = max(last_arrival.get(t, 0.0), arrived)
            counts[t] = counts.get(t, 0) + n
    bars = sorted(t for t in sent_at if t in last_arrival)
    latency = {t: last_arrival[t] - sent_at[t] for t in bars}
    live_from = None
    for k, t in enumerate(bars):
        if all(latency[u] <= LIVE_WITHIN for u in bars[k:]):
            live_from = t
            break
    steady = [latency[t] * 1e3 for t in bars if live_from is not None and t >= live_from]
    return {
        "symbols": n_symbols,
        "bars sent": len(sent_at),
        "bars received": len(bars),
        "time to live": (sent_at[live_from] - started) if live_from is not None else None,
        "p50": float(np.percentile(steady, 50)) if steady else None,
        "p99": float(np.percentile(steady, 99)) if steady else None,
        "first bar late by": latency[bars[0]] if bars else None,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--symbols", type=int, nargs="+", default=[20, 200])
    parser.add_argument("--history", type=int, default=300)
    parser.add_argument("--bars", type=int, default=20, help="live bars after the history")
    parser.add_argument("--bar-seconds", type=float, default=1.0)
    args = parser.parse_args(argv)
    compiled = subprocess.run([sys.executable, "-m", "atc_stream.cli", "compile"],
                              capture_output=True, text=True)  # fmt: skip
    print(compiled.stderr.strip())
    print(f"1-min load average before: {os.getloadavg()[0]:.2f}\n")
    print("| symbols | history | time to live | first bar late by | steady p50 | steady p99 "
          "| bars received |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        for n in args.symbols:
            r = run_one(n, args, server.url, Path(tmp))

            def s(x, unit="s", scale=1.0):
                return "never" if x is None else f"{x * scale:.2f} {unit}"

            print(f"| {n:,} | {args.history} | {s(r['time to live'])} | "
                  f"{s(r['first bar late by'], 'ms', 1e3)} | {s(r['p50'], 'ms')} | "
                  f"{s(r['p99'], 'ms')} | {r['bars received']}/{r['bars sent']} |")  # fmt: skip
    print(f"\n1-min load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
