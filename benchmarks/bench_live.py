#!/usr/bin/env python
"""Live benchmark: time to live and kline → Redis latency of ``atc-stream live``.

Run from the repository root (needs redis-server and the ``live``/``redis`` extras)::

    .venv/bin/python benchmarks/bench_live.py                       # 20 and 200 symbols
    .venv/bin/python benchmarks/bench_live.py --symbols 20 200 1000 --bars 30

A local exchange in Binance's format (the websocket + REST server of
``tests/exchange_emulators.py``) closes every symbol's 1-second bar once per second of
wall clock from the start, ``--history`` of them closed before: REST serves the closed
ones, the websocket sends each closed kline to whoever is connected then, stamping it
when the send returns. A real ``atc-stream live --redis`` process with default options
(warm kernel cache: ``atc-stream compile`` runs first) consumes it,
and a redis-py subscriber on ``atc:batch``, in a process of its own (so it does not
share a GIL with the exchange), stamps every record on arrival. Latency of a kline =
arrival of its signal record − send time of that kline (same host, same clock); the
table also gives the whole bar's latency (last record of a bar − first kline of it
sent), which includes the exchange writing N messages, the median number of batch
messages a bar arrives in, and the CPU time per live bar of each process sharing the
machine's cores (Linux): the client, this exchange, redis-server and the subscriber.
*Time to live* = process start → the first bar from which every kline's signal
arrives within 100 ms. Steady p50/p99 are over the klines of the bars after that.
*Missing* / *twice*: (symbol, bar)s closed after the process started (up to the last
bar sent) that never reached Redis / reached it more than once. Targets with 300 bars
of history and a warm cache: 200 symbols live within 5 s, 1,000 within 10 s, none
missing; at 200, p50 <= the floor's + 1 ms and p99 <= the floor's + 2 ms (medians over
``--rounds``, each round's engine against the floor measured beside it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
from websockets.frames import Frame, Opcode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from exchange_emulators import FakeExchange, make_bars  # noqa: E402
from redis_fixtures import RedisServer  # noqa: E402

# Wall-clock bars: the exchange serves 1-second klines, so open times follow the clock
# (the client rejects closed klines from the future, as it must on a real feed).
INTERVAL, IMS = "1s", 1_000

STREAMS_PER_CONNECTION = 200
MEASURE_FROM_BAR = 5  # CPU per bar is measured from this many live bars on, to the end
LIVE_WITHIN = 0.100  # seconds: a bar is "live" when its signals arrive this soon
TARGET_SYMBOLS = 200  # the latency target is set at this many symbols


class WallClockExchange(FakeExchange):
    """Sends each bar's closed klines on a wall-clock tick, stamping every kline's send.

    ``writes="bar"``: a connection's klines of one bar go out as websocket frames in one
    socket write, stamped just *before* it (a remote exchange costs the client's machine
    no CPU; here ~35 us of it per ``ws.send`` would compete with the client for the two
    cores). ``writes="message"``: one ``ws.send`` per kline, stamped when it returns.
    """

    def __init__(self, closes, start, *, t0: int, writes: str, rest_latency: float) -> None:
        super().__init__(
            closes, start, previews_per_bar=0, t0=t0, interval=INTERVAL, realtime=True
        )  # fmt: skip
        self.sent_at: dict[tuple[str, int], float] = {}  # (symbol, bar open ms) -> sent
        self.writes = writes
        self.rest_latency = rest_latency

    async def _klines(self, request, fault):
        if self.rest_latency:  # a remote exchange: the round trip, without the CPU
            await asyncio.sleep(self.rest_latency)
        return await super()._klines(request, fault)

    async def _ticker(self) -> None:
        # bars close on the clock whether or not anyone is connected, as on an exchange
        next_tick = (self.t0 + (self.cursor + 1) * IMS) / 1000  # the bar's close on the clock
        for i in range(self.cursor, self.n_bars):
            t = self.t0 + i * IMS
            # messages are built before the tick, half an interval before it: only their
            # sending is timed, and building them (~2 ms of CPU for 200) does not compete
            # with the clients for the two cores while they apply the last bar
            await asyncio.sleep(max(0.0, next_tick - IMS / 2000 - time.time()))
            messages = {s: self.ws_message(s, i, self.closes[s][i], True) for s in self.closes}
            await asyncio.sleep(max(0.0, next_tick - time.time()))
            next_tick += IMS / 1000
            await asyncio.gather(*(self._send_bar(conn, messages, t) for conn in self._conns))
            self.cursor = i + 1
        self.done = True
        while True:
            await asyncio.sleep(0.05)

    async def _send_bar(self, conn: dict, messages: dict[str, str], t: int) -> None:
        symbols = sorted(conn["symbols"] & messages.keys())
        ws = conn["ws"]
        if self.writes == "bar" and not ws.protocol.extensions:  # frames need no context
            frames = b"".join(
                Frame(Opcode.TEXT, messages[s].encode()).serialize(mask=False) for s in symbols
            )
            sent = time.time()
            ws.transport.write(frames)
            for symbol in symbols:
                self.sent_at[(symbol, t)] = sent
            return
        for symbol in symbols:
            await conn["ws"].send(messages[symbol])
            self.sent_at[(symbol, t)] = time.time()


SUBSCRIBER = """
import json, sys, time
from pathlib import Path
from atc_stream.connectors.redis.pubsub import SignalSubscriber
url, out, stop = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
sub = SignalSubscriber(url, batch=True)
sub.wait_ready()
print("ready", flush=True)
arrivals = []
while not stop.exists():
    raw = sub.get_raw(timeout=0.5)  # returns on a message; the timeout paces the stop check
    if raw is not None:
        arrived = time.time()
        arrivals.append((arrived, raw))
rows = []
for arrived, raw in arrivals:  # decoded after the run: decoding is not on the timed path
    for r in sub.decode(*raw).data.records:
        rows.append((arrived, r.symbol, int(r.time)))
out.write_text(json.dumps(rows))
sub.close()
"""


# The floor: what this machine, the local exchange, Redis and the subscriber cost on their
# own. A client that does what `atc-stream live` must at the least -- read the klines
# over the same websocket library, publish one batch message a burst in the same format
# -- and nothing else: its records are templates (a real record's fields and size, the
# kline's symbol and time), no engine, no checks, no file.
NULL_CLIENT = r"""
import asyncio, sys, time, aiohttp, msgspec
from atc_stream.core.messages import SignalRecord
from atc_stream.core.schema import SCHEMA_VERSION
urls, redis_url, interval = sys.argv[1].split(" "), sys.argv[2], sys.argv[3]
class K(msgspec.Struct):
    t: int
    s: str
    x: bool
class D(msgspec.Struct):
    k: K
class M(msgspec.Struct):
    data: D
decode = msgspec.json.Decoder(M).decode
zero = {"str": "", "int": 0, "float": 0.5, "bool": False}
fields = {f.name: zero[getattr(f.type, "__name__", "float")]
          for f in msgspec.structs.fields(SignalRecord) if f.name != "v"}
templates = {}
def record(symbol, t):
    template = templates.get(symbol)
    if template is None:
        values = dict(fields, symbol=symbol, interval=interval, time=123456789)
        template = msgspec.json.encode(SignalRecord(**values)).replace(b"123456789", b"%d")
        templates[symbol] = template
    return template % t
async def main():
    host, port = redis_url.split("//")[1].split("/")[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    async def replies():
        while await reader.read(65536):
            pass
    asyncio.ensure_future(replies())
    pending, ready, seq = [], asyncio.Event(), 0
    async def read(session, url):
        async with session.ws_connect(url, autoping=True) as ws:
            while True:
                msg = await ws.receive()
                if msg.type is not aiohttp.WSMsgType.TEXT:
                    return
                k = decode(msg.data).data.k
                if k.x:
                    pending.append(record(k.s, k.t))
                    ready.set()
    async with aiohttp.ClientSession() as session:
        for url in urls:
            asyncio.ensure_future(read(session, url))
        while True:
            await ready.wait()
            ready.clear()
            records, pending[:] = list(pending), []
            seq += 1
            body = b'{"v":%d,"seq":%d,"published_at":%d,"count":%d,"records":[%s]}' % (
                SCHEMA_VERSION, seq, time.time_ns(), len(records), b",".join(records))
            writer.write(b"*3\r\n$7\r\nPUBLISH\r\n$9\r\natc:batch\r\n$%d\r\n%s\r\n"
                         % (len(body), body))
asyncio.run(main())
"""


def _start_subscriber(url: str, tmp: Path) -> tuple[subprocess.Popen, Path, Path]:
    out, stop = tmp / "arrivals.json", tmp / "stop"
    out.unlink(missing_ok=True)
    stop.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", SUBSCRIBER, url, str(out), str(stop)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout.readline().strip() == "ready"
    return proc, out, stop


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` so far (Linux ``schedstat``; NaN elsewhere)."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")
    return total / 1e9


def run_one(n_symbols: int, args, redis_url: str, redis_pid: int, tmp: Path, client: str) -> dict:
    symbols = [f"S{i:04d}USDT" for i in range(n_symbols)]
    total = args.history + args.bars
    closes = make_bars(symbols, total + 1, seed=n_symbols)
    # bar `history` is the first one in progress when the process starts
    t0 = int(time.time() * 1000) - args.history * IMS - IMS // 2
    reader, arrivals_file, stop_file = _start_subscriber(redis_url, tmp)
    with WallClockExchange(
        closes, args.history, t0=t0, writes=args.exchange_writes, rest_latency=args.rest_latency
    ) as ex:
        chunks = [symbols[i : i + STREAMS_PER_CONNECTION]
                  for i in range(0, n_symbols, STREAMS_PER_CONNECTION)]  # fmt: skip
        urls = [f"{ex.ws_url}/stream?streams=" + "/".join(f"{s.lower()}@kline_{INTERVAL}"
                for s in chunk) for chunk in chunks]  # fmt: skip
        floor_command = [sys.executable, "-c", NULL_CLIENT, " ".join(urls), redis_url, INTERVAL]
        command = floor_command if client == "floor" else [
            sys.executable, "-m", "atc_stream", "live", "--symbols", ",".join(symbols),
            "--history", str(args.history), "--ws-url", ex.ws_url, "--rest-url", ex.rest_url,
            "--redis", redis_url, "--backend", "cpu", "--status-every", "0",
            "--no-previews", "--output", str(tmp / "live.jsonl"),
            "--interval", INTERVAL, "--max-seconds", str(args.bars + 60),
            # 200 streams per websocket: the local server rejects longer URLs (HTTP 414)
            "--max-streams-per-connection", str(STREAMS_PER_CONNECTION),
            *shlex.split(args.live_args),
        ]  # fmt: skip
        started = time.time()
        # the run ends when the exchange has sent its last bar (plus a second to apply
        # it): --max-bars would also count the bars backfilled over REST at start-up
        live = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        # CPU per live bar of each process on the two cores: the exchange (this one),
        # the client, redis-server and the subscriber
        pids = {"client": live.pid, "exchange": os.getpid(), "redis": redis_pid,
                "subscriber": reader.pid}  # fmt: skip
        cpu_from = None
        while not ex.done and live.poll() is None:
            if cpu_from is None and ex.cursor >= args.history + MEASURE_FROM_BAR:
                cpu_from = ex.cursor, {k: cpu_seconds(p) for k, p in pids.items()}
            time.sleep(0.1)
        if cpu_from is not None:
            bars_measured = ex.cursor - cpu_from[0]
            cpu_per_bar = {k: (cpu_seconds(p) - cpu_from[1][k]) / max(bars_measured, 1)
                           for k, p in pids.items()}  # fmt: skip
        else:
            cpu_per_bar = {}
        time.sleep(1.0)
        live.send_signal(signal.SIGTERM)
        _, stderr = live.communicate(timeout=120)
        done = subprocess.CompletedProcess(command, live.returncode, "", stderr)
        sent_at = dict(ex.sent_at)
        closed_bars = ex.cursor  # bars 0 .. closed_bars - 1 have closed
    time.sleep(0.3)
    stop_file.touch()
    reader.wait(60)
    if done.returncode != 0 and not (client == "floor" and done.returncode == -signal.SIGTERM):
        raise SystemExit(f"atc-stream live failed:\n{done.stderr[-2000:]}")
    if not sent_at:  # the client never connected its websocket: say why
        print(f"{n_symbols} symbols: no bar was sent; atc-stream said:\n{done.stderr[-1500:]}")
    arrival: dict[tuple[str, int], float] = {}
    messages_of_bar: dict[int, set] = {}  # bar -> arrival stamps (one per batch message)
    copies: Counter = Counter()
    for arrived, symbol, t in json.loads(arrivals_file.read_text()):
        arrival.setdefault((symbol, t), arrived)  # the first message carrying the record
        messages_of_bar.setdefault(t, set()).add(arrived)
        copies[(symbol, t)] += 1
    # every bar closing after the process started must reach Redis exactly once
    first_after = next(i for i in range(total + 1) if (t0 + (i + 1) * IMS) / 1000 > started)
    due = [(s, t0 + i * IMS) for s in symbols for i in range(first_after, closed_bars)]
    missing = sum(1 for key in due if copies[key] == 0)
    twice = sum(1 for key in due if copies[key] > 1)
    rest = re.search(r"REST +(\d+) requests", done.stderr)
    latency = {k: arrival[k] - sent for k, sent in sent_at.items() if k in arrival}
    by_bar: dict[int, list] = {}
    for (_symbol, t), lat in latency.items():
        by_bar.setdefault(t, []).append(lat)
    bars = sorted(by_bar)
    live_from = None
    for k, t in enumerate(bars):
        if all(max(by_bar[u]) <= LIVE_WITHIN for u in bars[k:]):
            live_from = t
            break
    steady_bars = [t for t in bars if live_from is not None and t >= live_from]
    steady = [lat * 1e3 for t in steady_bars for lat in by_bar[t]]
    first_sent = {}
    for (_symbol, t), sent in sent_at.items():
        first_sent[t] = min(first_sent.get(t, sent), sent)
    whole_bar = [
        (max(arrival[(s, t)] for s in symbols if (s, t) in arrival) - first_sent[t]) * 1e3
        for t in steady_bars
    ]
    started_bar = first_sent[live_from] if live_from is not None else None
    return {
        "client": client,
        "symbols": n_symbols,
        "klines sent": len(sent_at),
        "due": len(due),
        "missing": missing if client != "floor" else None,
        "twice": twice if client != "floor" else None,
        "rest requests": int(rest.group(1)) if rest else None,
        "klines received": len(latency),
        "time to live": (started_bar - started) if started_bar is not None else None,
        "p50": float(np.percentile(steady, 50)) if steady else None,
        "p99": float(np.percentile(steady, 99)) if steady else None,
        "bar p50": float(np.percentile(whole_bar, 50)) if whole_bar else None,
        "first bar late by": max(by_bar[bars[0]]) if bars else None,
        "messages per bar": float(np.median([len(messages_of_bar[t]) for t in steady_bars]))
        if steady_bars
        else None,
        "cpu per bar": cpu_per_bar,
        # each steady bar's kline median and worst kline (ms), in the order they closed
        "per bar": [
            (float(np.median(by_bar[t])) * 1e3, max(by_bar[t]) * 1e3) for t in steady_bars
        ],  # fmt: skip
    }


def _row(r: dict, round_no: int, history: int) -> str:
    cpu = r["cpu per bar"]
    cpu_text = (
        " / ".join(f"{cpu[k] * 1e3:.1f}" for k in ("client", "exchange", "redis", "subscriber"))
        if cpu
        else "-"
    )

    def s(x, unit="s", scale=1.0):
        return "never" if x is None else f"{x * scale:.2f} {unit}"

    name = "floor: no engine" if r["client"] == "floor" else "atc-stream live"
    lost = "-" if r["missing"] is None else f"{r['missing']} / {r['twice']} ({r['due']})"
    rest = r["rest requests"] if r["rest requests"] is not None else "-"
    return (
        f"| {round_no} | {name} | {r['symbols']:,} | {history} | {s(r['time to live'])} | "
        f"{lost} | {rest} | {s(r['first bar late by'], 'ms', 1e3)} | {s(r['p50'], 'ms')} | "
        f"{s(r['p99'], 'ms')} | {s(r['bar p50'], 'ms')} | "
        f"{r['klines received']}/{r['klines sent']} | {s(r['messages per bar'], '')} | "
        f"{cpu_text} |"
    )


def _spread(values: list[float]) -> str:
    """Median and range of ``values`` (ms)."""
    if not values:
        return "-"
    return f"{np.median(values):.2f} ms ({min(values):.2f} to {max(values):.2f})"


def _summary(n: int, rounds: list[dict[str, dict]]) -> list[str]:
    """Median and range over the rounds of each client's p50/p99 and, per round, the
    engine's excess over the floor measured beside it (the target's terms)."""
    lines = [f"\n{n:,} symbols over {len(rounds)} round(s): median (range)\n",
             "| client | kline p50 | kline p99 |", "|---|---|---|"]  # fmt: skip
    for client, name in (("atc-stream", "atc-stream live"), ("floor", "floor: no engine")):
        runs = [r[client] for r in rounds if client in r]
        if runs:
            p50 = [x["p50"] for x in runs if x["p50"] is not None]
            p99 = [x["p99"] for x in runs if x["p99"] is not None]
            lines.append(f"| {name} | {_spread(p50)} | {_spread(p99)} |")
    pairs = [r for r in rounds if "floor" in r and r["atc-stream"]["p50"] is not None
             and r["floor"]["p50"] is not None]  # fmt: skip
    if pairs:
        over50 = [r["atc-stream"]["p50"] - r["floor"]["p50"] for r in pairs]
        over99 = [r["atc-stream"]["p99"] - r["floor"]["p99"] for r in pairs]
        met = np.median(over50) <= 1.0 and np.median(over99) <= 2.0
        lines.append(f"| over the floor, same round | {_spread(over50)} | {_spread(over99)} |")
        if n == TARGET_SYMBOLS:
            lines.append(f"\nTarget at {n} symbols, p50 <= floor + 1 ms and p99 <= floor + 2 ms "
                         f"(medians over the rounds): {'met' if met else 'missed'}")  # fmt: skip
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--symbols", type=int, nargs="+", default=[20, 200])
    parser.add_argument("--history", type=int, default=300)
    parser.add_argument("--bars", type=int, default=20, help="live bars after the history")
    parser.add_argument(
        "--rounds", type=int, default=3,
        help="rounds per symbol count, the clients alternating first (medians and ranges "
        "are reported over them)",
    )  # fmt: skip
    parser.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="leave out the floor rows (a client with no engine: see NULL_CLIENT)",
    )
    parser.add_argument(
        "--exchange-writes", choices=("bar", "message"), default="bar",
        help="the local exchange writes a bar's klines in one socket write (like a remote "
        "exchange: no CPU taken from the client) or sends them one ws.send each",
    )  # fmt: skip
    parser.add_argument(
        "--rest-latency", type=float, default=0.0,
        help="seconds the local exchange takes to answer each REST request (a remote "
        "exchange's round trip)",
    )  # fmt: skip
    parser.add_argument(
        "--per-bar", action="store_true",
        help="also print each steady bar's kline median / worst (ms), to see which bars "
        "make the p99",
    )  # fmt: skip
    parser.add_argument(
        "--live-args", default="",
        help="more options for `atc-stream live` (one string), e.g. \"--warm-every-ms 0\"",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    compiled = subprocess.run([sys.executable, "-m", "atc_stream", "compile"],
                              capture_output=True, text=True)  # fmt: skip
    print(compiled.stderr.strip())
    print(f"1-min load average before: {os.getloadavg()[0]:.2f}\n")
    header = ("| round | client | symbols | history | time to live | missing / twice (of due) "
              "| REST requests | first bar late by | kline p50 | kline p99 "
              "| whole bar p50 | klines received | batch messages per bar "
              "| CPU ms per bar: client / exchange / redis / subscriber |")  # fmt: skip
    clients = ("atc-stream", "floor") if args.floor else ("atc-stream",)
    summaries = []
    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        for n in args.symbols:
            print(header)
            print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
            rounds = []
            for round_no in range(1, args.rounds + 1):
                # the clients take turns going first, so a drift of the machine falls on both
                order = clients if round_no % 2 else clients[::-1]
                results = {}
                for client in order:
                    r = run_one(n, args, server.url, server.proc.pid, Path(tmp), client)
                    results[client] = r
                    print(_row(r, round_no, args.history), flush=True)
                    if args.per_bar:
                        bars = " ".join(f"{m:.1f}/{w:.1f}" for m, w in r["per bar"])
                        print(f"<!-- round {round_no} {client} per bar: {bars} -->", flush=True)
                rounds.append(results)
            summaries += _summary(n, rounds)
            print()
    print("\n".join(summaries))
    print(f"\n1-min load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
