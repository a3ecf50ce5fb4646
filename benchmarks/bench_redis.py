#!/usr/bin/env python
"""Redis load benchmark: bars in through a Redis Stream, signals out over pub/sub.

Run from the repository root::

    .venv/bin/python benchmarks/bench_redis.py                  # 1,000 symbols x 1,000 bars
    .venv/bin/python benchmarks/bench_redis.py --quick          # 100 x 100, a smoke test
    .venv/bin/python benchmarks/bench_redis.py --output-stream  # also XADD every output row

It starts its own ``redis-server`` on a free port (no persistence) and three parties:

* a **producer** process ``XADD``-s the bars (fields symbol, time, close) into the input
  stream, one pipelined round trip per bar time (all symbols), recording the wall clock
  (``time.time_ns``) just before each round trip;
* the **engine** (this process): ``RedisStreamRunner`` reading with ``XREADGROUP``
  (consumer group, ``--batch-size`` entries per read), one ``Engine.step`` per read,
  ``XACK``, and a ``SignalPublisher`` (per-symbol channels, batch channel, events
  channel, latest hash; msgspec JSON) in its background thread;
* a **subscriber** process on the batch channel (every row) and on the per-symbol
  channels of ``--sample`` symbols, noting the wall clock when each message arrives.

End-to-end latency of a bar = arrival of the first message carrying its row minus the
XADD time of its bar time (same machine, same clock). Two phases:

1. **saturated**: the producer pushes all ``--bars`` bar times as fast as it can while
   the engine consumes; throughput = bars / (first XADD .. last row received).
   Latencies here include queueing behind the backlog.
2. **paced**: ``--paced-bars`` more bar times at ``--paced-load`` x the phase-1
   throughput (one bar time per interval): latency when the engine keeps up.

Numba compilation is done before timing. "engine wall / CPU s" is the engine process
from its first read to the last step published (CPU: all its threads; near or above
the wall time means the engine process is the bottleneck, far below means it waited
for the other parties or for a core). Prints a markdown table (and ``--json``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import msgspec
import numpy as np

BASE_TIME = 1_700_000_000_000
BAR_MS = 60_000
INPUT = "bench:bars"
OUTPUT = "bench:signals"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis() -> tuple[subprocess.Popen, str, str]:
    binary = os.environ.get("ATC_REDIS_SERVER") or shutil.which("redis-server")
    binary = binary or "/usr/bin/redis-server"
    workdir = tempfile.mkdtemp(prefix="atc-bench-redis-")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir, "--logfile", os.path.join(workdir, "redis.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    import redis

    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis.from_url(url).ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("redis-server did not start") from None
            time.sleep(0.02)
    return proc, url, workdir


def random_walk(n_symbols: int, n_bars: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    starts = rng.uniform(20, 500, n_symbols)
    steps = rng.normal(0, 0.004, (n_symbols, n_bars))
    return np.maximum(np.round(starts[:, None] * np.exp(np.cumsum(steps, axis=1)), 2), 0.01)


def symbol_names(n: int) -> list[str]:
    return [f"S{i:05d}" for i in range(n)]


# -- producer (own process) --------------------------------------------------------------


def producer(url, n_symbols, closes, first_bar, last_bar, interval, start_at, conn) -> None:
    import redis

    from atc_stream.connectors.redis.resp import pack_command, send_packed

    client = redis.Redis.from_url(url)
    names = [s.encode() for s in symbol_names(n_symbols)]
    key = INPUT.encode()
    sent = np.zeros(last_bar - first_bar, np.int64)
    while time.time() < start_at:
        time.sleep(0.001)
    origin = time.perf_counter()
    for k in range(first_bar, last_bar):
        t = b"%d" % (BASE_TIME + k * BAR_MS)
        commands = [
            pack_command(
                [b"XADD", key, b"*", b"symbol", name, b"time", t, b"close", repr(c).encode()]
            )
            for name, c in zip(names, closes[:, k].tolist(), strict=True)
        ]
        if interval:
            delay = origin + (k - first_bar) * interval - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        sent[k - first_bar] = time.time_ns()
        send_packed(client, commands)
    conn.send(sent)
    conn.close()


# -- subscriber (own process) ------------------------------------------------------------


class _Row(msgspec.Struct):
    time: int


class _Batch(msgspec.Struct):
    records: list[_Row]


def subscriber(url, sample, expected_rows, ready, done, conn) -> None:
    from atc_stream.connectors.redis.pubsub import SignalSubscriber

    sub = SignalSubscriber(url, batch=True, symbols=sample)
    sub.wait_ready()
    ready.set()
    batch_decoder = msgspec.json.Decoder(_Batch)
    row_decoder = msgspec.json.Decoder(_Row)
    batch_recv, batch_times, symbol_recv, symbol_times = [], [], [], []
    rows = 0
    idle_since = time.monotonic()
    while True:
        got = sub.get_raw(timeout=0.2)
        now = time.time_ns()
        if got is None:
            if done.is_set() and (rows >= expected_rows or time.monotonic() - idle_since > 5):
                break
            continue
        idle_since = time.monotonic()
        channel, data = got
        if channel == sub.batch_channel:
            times = [r.time for r in batch_decoder.decode(data).records]
            batch_recv.append(np.full(len(times), now, np.int64))
            batch_times.append(np.array(times, np.int64))
            rows += len(times)
        else:
            symbol_recv.append(now)
            symbol_times.append(row_decoder.decode(data).time)
    sub.close()
    cat = np.concatenate
    conn.send(
        (
            cat(batch_recv) if batch_recv else np.zeros(0, np.int64),
            cat(batch_times) if batch_times else np.zeros(0, np.int64),
            np.array(symbol_recv, np.int64),
            np.array(symbol_times, np.int64),
        )
    )
    conn.close()


# -- engine (this process) ---------------------------------------------------------------


def percentiles_ms(values_ns: np.ndarray) -> dict[str, float]:
    if values_ns.size == 0:
        return {k: float("nan") for k in ("p50", "p90", "p99", "max")}
    ms = values_ns / 1e6
    return {
        "p50": float(np.percentile(ms, 50)),
        "p90": float(np.percentile(ms, 90)),
        "p99": float(np.percentile(ms, 99)),
        "max": float(ms.max()),
    }


def run_phase(name, args, url, runner, publisher, closes, first_bar, last_bar, interval):
    n = args.symbols
    ctx = mp.get_context("spawn")
    sample = symbol_names(n)[: args.sample]
    sub_recv, sub_send = ctx.Pipe(duplex=False)
    prod_recv, prod_send = ctx.Pipe(duplex=False)
    ready, done = ctx.Event(), ctx.Event()
    rows_expected = n * (last_bar - first_bar)
    sub = ctx.Process(
        target=subscriber, args=(url, sample, rows_expected, ready, done, sub_send), daemon=True
    )
    sub.start()
    if not ready.wait(60):
        raise RuntimeError("subscriber did not start")
    start_at = time.time() + 0.5
    prod = ctx.Process(
        target=producer,
        args=(url, n, closes, first_bar, last_bar, interval, start_at, prod_send),
        daemon=True,
    )
    prod.start()
    before = runner.stats.entries
    dropped_before = publisher.dropped
    runner.stats.seconds = 0.0
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    runner.run(max_entries=before + rows_expected)
    publisher.flush(120)
    engine_seconds = time.perf_counter() - t0
    engine_cpu = time.process_time() - cpu0
    done.set()
    sent = prod_recv.recv()
    batch_recv, batch_times, symbol_recv, symbol_times = sub_recv.recv()
    prod.join(30)
    sub.join(30)

    def latencies(recv, times):
        bar = (times - BASE_TIME) // BAR_MS - first_bar
        ok = (bar >= 0) & (bar < sent.size)
        return recv[ok] - sent[bar[ok]]

    lat_batch = latencies(batch_recv, batch_times)
    lat_symbol = latencies(symbol_recv, symbol_times)
    wall = (batch_recv.max() - sent.min()) / 1e9 if batch_recv.size else float("nan")
    return {
        "phase": name,
        "bar_times": last_bar - first_bar,
        "bars": rows_expected,
        "rows_received": int(batch_times.size),
        "dropped_steps": publisher.dropped - dropped_before,
        "wall_seconds": wall,
        "bars_per_second": rows_expected / wall,
        "engine_seconds": engine_seconds,
        "engine_cpu_seconds": engine_cpu,
        "producer_bars_per_second": rows_expected / ((sent.max() - sent.min()) / 1e9 or 1e-9),
        "latency_ms_batch": percentiles_ms(lat_batch),
        "latency_ms_symbol": percentiles_ms(lat_symbol),
        "symbol_messages": int(symbol_times.size),
        "interval_ms": interval * 1e3 if interval else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--symbols", type=int, default=1000)
    ap.add_argument("--bars", type=int, default=1000, help="bar times in the saturated phase")
    ap.add_argument("--paced-bars", type=int, default=200, help="bar times in the paced phase")
    ap.add_argument("--paced-load", type=float, default=0.5, help="fraction of phase-1 rate")
    ap.add_argument("--batch-size", type=int, default=1000, help="entries per XREADGROUP")
    ap.add_argument("--sample", type=int, default=10, help="symbols followed per channel")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--output-stream", action="store_true", help="also XADD every output row")
    ap.add_argument("--quick", action="store_true", help="100 symbols x 100 (+50) bars")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    if args.quick:
        args.symbols, args.bars, args.paced_bars = 100, 100, 50

    from atc_stream import Engine
    from atc_stream.connectors.redis.pubsub import SignalPublisher
    from atc_stream.connectors.redis.streams import RedisStreamRunner

    closes = random_walk(args.symbols, args.bars + args.paced_bars, args.seed)
    server, url, workdir = start_redis()
    try:
        warm = Engine(backend=args.backend)  # compile before any timing
        warm.add_symbol("X")
        warm.step([("X", 0, 1.0), ("X", 1, 1.1)])
        engine = Engine(backend=args.backend, capacity=args.symbols)
        for symbol in symbol_names(args.symbols):
            engine.add_symbol(symbol)
        publisher = SignalPublisher(url, queue_size=100_000)
        runner = RedisStreamRunner(
            engine, url, INPUT, group="bench", consumer="engine-1",
            output_stream=OUTPUT if args.output_stream else None,
            batch_size=args.batch_size, publisher=publisher,
        )  # fmt: skip
        runner.prepare()
        load_before = os.getloadavg()
        phases = [run_phase("saturated", args, url, runner, publisher, closes, 0, args.bars, None)]
        rate = phases[0]["bars_per_second"] * args.paced_load
        interval = args.symbols / rate
        phases.append(
            run_phase(
                f"paced ({args.paced_load:.0%} load)",
                args,
                url,
                runner,
                publisher,
                closes,
                args.bars,
                args.bars + args.paced_bars,
                interval,
            )  # fmt: skip
        )
        publisher.close()
        rejected = dict(engine.rejections)
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)

    print(
        f"\n## Redis Streams in -> engine -> pub/sub out: {args.symbols:,} symbols "
        f"({args.backend} backend, batch {args.batch_size}, "
        f"output stream {'on' if args.output_stream else 'off'})\n"
    )
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average before {load_before[0]:.2f}; rejected inputs: {rejected or 'none'}\n"
    )
    print(
        "| phase | bars | bars/s end to end | engine wall / CPU s | dropped steps | "
        "latency p50 / p90 / p99 / max (ms), batch channel | "
        "per-symbol channel p50 / p90 / p99 (ms) |"
    )
    print("|---|---:|---:|---:|---:|---|---|")
    for p in phases:
        b, s = p["latency_ms_batch"], p["latency_ms_symbol"]
        print(
            f"| {p['phase']} | {p['bars']:,} | {p['bars_per_second']:,.0f} | "
            f"{p['engine_seconds']:.1f} / {p['engine_cpu_seconds']:.1f} | {p['dropped_steps']} | "
            f"{b['p50']:.1f} / {b['p90']:.1f} / {b['p99']:.1f} / {b['max']:.1f} | "
            f"{s['p50']:.1f} / {s['p90']:.1f} / {s['p99']:.1f} |"
        )
    print(
        f"\nproducer XADD rate in the saturated phase: "
        f"{phases[0]['producer_bars_per_second']:,.0f} bars/s; paced interval "
        f"{phases[1]['interval_ms']:.1f} ms per bar time of {args.symbols} bars"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "phases": phases, "load_before": load_before}, f,
                      indent=2)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
