#!/usr/bin/env python
"""Cluster benchmark: the router's cost per bar, and bars/s end to end through one
process against 1 and 2 shard actors on a local Ray cluster.

Run from the repository root::

    .venv/bin/python benchmarks/bench_cluster.py            # 200 symbols x 1,000 bars, 5 rounds
    .venv/bin/python benchmarks/bench_cluster.py --quick    # 20 x 20, 1 round (smoke test)

It starts its own ``redis-server`` (no persistence) and a local Ray of 2 CPUs.

**Router alone** (no consumer running): the same bars written by a pipelined ``XADD``
to one stream (the baseline), by ``Router.send`` alone (queueing: symbol check, CRC-32
shard, flattening; nothing sent), by ``Router.send`` + ``flush`` to 1 and 2 shard
streams, and moved from one input stream to 2 shard streams by ``StreamRouter`` (the
``cluster route`` Lua script: XADD + XACK per entry). Microseconds per bar.

**End to end**: this process writes every bar as fast as it can while the consumers
run; time = from just before the first ``XADD`` to the Redis ID (server clock, ms) of
the last output entry. Paths: *one process* (``RedisStreamRunner`` on one stream, in one
Ray actor, with a Redis snapshot store, as ``run-stream`` runs) and the cluster with 1
and 2 shards (``Router`` → shard streams → one ``ShardActor`` per shard). Every
consumer writes every output row to one output stream and first applies one untimed bar
per shard (kernels loaded); one untimed run comes first. Rounds rotate the order of the
paths. Redis's own CPU time, commands and network bytes per bar are read from ``INFO``
around each run.
Also measured: the size of a bar entry and of an output entry (``MEMORY USAGE`` per
entry and the ``XADD`` as sent). Prints markdown tables (and ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))

from bench_redis import random_walk, start_redis, symbol_names  # noqa: E402

BASE_TIME = 1_700_000_000_000
BAR_MS = 60_000
SINGLE_INPUT = "bench:bars"
ROUTE_INPUT = "bench:in"
OUTPUT = "bench:signals"
CHUNK = 500  # bars per pipelined round trip, as Router's default batch


def load1() -> float:
    return os.getloadavg()[0]


def bar_fields(n_symbols: int, n_bars: int, seed: int) -> list[dict[str, Any]]:
    """Every bar in time order (all symbols per time), as the fields of its entry."""
    closes = random_walk(n_symbols, n_bars, seed)
    names = symbol_names(n_symbols)
    return [
        {"symbol": names[i], "time": BASE_TIME + k * BAR_MS, "close": repr(float(closes[i, k]))}
        for k in range(n_bars)
        for i in range(n_symbols)
    ]


def warm_bars(shards: int) -> list[dict[str, Any]]:
    """One bar per shard (its own symbol, before the timed bars): loads the kernels."""
    from atc_stream.core.shards import shard_of

    out: dict[int, dict[str, Any]] = {}
    i = 0
    while len(out) < shards:
        symbol = f"WARM{i}"
        out.setdefault(shard_of(symbol, shards), {"symbol": symbol, "time": BASE_TIME - BAR_MS,
                                                   "close": "100.0"})  # fmt: skip
        i += 1
    return [out[s] for s in range(shards)]


def xadd_all(client, key: str, bars: list[dict[str, Any]]) -> None:
    """Pipelined XADDs to one stream, ``CHUNK`` a round trip (the baseline producer)."""
    from atc_stream.connectors.redis.resp import pack_command, send_packed

    stream = key.encode()
    for start in range(0, len(bars), CHUNK):
        commands = []
        for bar in bars[start : start + CHUNK]:
            flat: list[Any] = [b"XADD", stream, b"*"]
            for name, value in bar.items():
                flat += (name, value if isinstance(value, str) else str(value))
            commands.append(pack_command(flat))
        send_packed(client, commands)


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


# -- router alone --------------------------------------------------------------------------


def router_costs(url: str, bars: list[dict[str, Any]], rounds: int) -> dict[str, list[float]]:
    """µs per bar of each producer path, ``rounds`` samples each (Redis flushed between)."""
    import redis

    from atc_stream.connectors.cluster.router import Router, StreamRouter

    client = redis.Redis.from_url(url)
    n = len(bars)
    out: dict[str, list[float]] = {}

    def sample(name: str, seconds: float) -> None:
        out.setdefault(name, []).append(seconds / n * 1e6)

    for _ in range(rounds):
        client.flushall()
        t = time.perf_counter()
        xadd_all(client, SINGLE_INPUT, bars)
        sample("XADD pipelined, one stream (baseline)", time.perf_counter() - t)
        for shards in (1, 2):
            client.flushall()
            router = Router(client, shards, batch=n + 1)
            t = time.perf_counter()
            for bar in bars:
                router.send(bar)
            queued = time.perf_counter()
            router.batch = CHUNK
            router.flush()
            done = time.perf_counter()
            if shards == 2:
                sample("Router.send alone (queue, no I/O), 2 shards", queued - t)
            sample(f"Router.send + flush, {shards} shard{'s' * (shards > 1)}", done - t)
        client.flushall()
        xadd_all(client, ROUTE_INPUT, bars)
        mover = StreamRouter(client, ROUTE_INPUT, 2, batch_size=CHUNK, block_ms=1)
        mover.prepare()
        t = time.perf_counter()
        stats = mover.run(stop_when_idle=0.02)
        sample("StreamRouter (`cluster route`), one stream → 2 shards", time.perf_counter() - t)
        assert stats.routed == n, stats
    client.flushall()
    client.close()
    return out


# -- end to end ----------------------------------------------------------------------------


class SingleProcess:
    """``RedisStreamRunner`` on one stream with a Redis snapshot store: ``run-stream``."""

    def __init__(self, url: str) -> None:
        from atc_stream import ATCParams, Engine
        from atc_stream.connectors.redis.snapshots import RedisSnapshotStore
        from atc_stream.connectors.redis.streams import RedisStreamRunner
        from atc_stream.state.snapshotter import Snapshotter

        engine = Engine([ATCParams()], backend="cpu", outputs="all")
        self.snapshotter = Snapshotter(engine, RedisSnapshotStore(url, prefix="atc-stream"),
                                       every_bars=10_000)  # fmt: skip
        self.runner = RedisStreamRunner(engine, url, SINGLE_INPUT, output_stream=OUTPUT,
                                        batch_size=1000, snapshotter=self.snapshotter)  # fmt: skip

    def run(self, stop_when_idle: float | None = None) -> dict[str, Any]:
        self.runner.prepare(resume=True)
        stats = self.runner.run(stop_when_idle=stop_when_idle)
        self.snapshotter.close()
        return {"bars": stats.bars}

    def stop(self) -> None:
        self.runner.stop()


def note(text: str) -> None:
    print(f"bench_cluster: {text}", file=sys.stderr, flush=True)


def wait_for(what: str, check, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def redis_counters(client) -> dict[str, float]:
    info = client.info("all")
    calls = sum(v["calls"] for k, v in info.items() if k.startswith("cmdstat_"))
    return {
        "cpu": float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
        "calls": float(calls),
        "net_in": float(info["total_net_input_bytes"]),
        "net_out": float(info["total_net_output_bytes"]),
    }


def end_to_end(url: str, bars: list[dict[str, Any]], shards: int) -> dict[str, float]:
    """One run: ``shards`` = 0 is the single process; else a Router and shard actors."""
    import ray
    import redis

    from atc_stream.connectors.cluster.actors import start_shard_actors
    from atc_stream.connectors.cluster.router import Router
    from atc_stream.connectors.cluster.shard import ShardConfig

    client = redis.Redis.from_url(url)
    client.flushall()
    if shards == 0:
        actors = [ray.remote(SingleProcess).options(num_cpus=1, max_concurrency=2).remote(url)]
        warm = warm_bars(1)
    else:
        configs = [ShardConfig(redis=url, shard=s, output_stream=OUTPUT, backend="cpu")
                   for s in range(shards)]  # fmt: skip
        actors = start_shard_actors(configs)
        warm = warm_bars(shards)
    runs = [actor.run.remote(None) for actor in actors]
    note(f"{shards} shards: actors started")
    router = Router(client, shards, batch=CHUNK) if shards else None
    if router is None:
        xadd_all(client, SINGLE_INPUT, warm)
    else:
        for bar in warm:
            router.send(bar)
        router.flush()
    wait_for("the warm bars' outputs", lambda: client.xlen(OUTPUT) >= len(warm))
    note(f"{shards} shards: warm")
    expected = len(warm) + len(bars)
    before = redis_counters(client)
    load_before = load1()
    start = time.time()
    t = time.perf_counter()
    if router is None:
        xadd_all(client, SINGLE_INPUT, bars)
    else:
        for bar in bars:
            router.send(bar)
        router.flush()
    produce = time.perf_counter() - t
    wait_for("every output", lambda: client.xlen(OUTPUT) >= expected)
    last_id = client.xrevrange(OUTPUT, count=1)[0][0]
    end = int(last_id.split(b"-")[0]) / 1000
    after = redis_counters(client)
    for actor in actors:
        actor.stop.remote()
    ray.get(runs)
    for actor in actors:
        ray.kill(actor)
    got = client.xlen(OUTPUT)
    client.close()
    if got != expected:
        raise RuntimeError(f"{got} output entries, expected {expected}")
    n = len(bars)
    return {
        "seconds": end - start,
        "bars_per_s": n / (end - start),
        "produce_us": produce / n * 1e6,
        "redis_cpu_us": (after["cpu"] - before["cpu"]) / n * 1e6,
        "redis_calls": (after["calls"] - before["calls"]) / n,
        "net_in": (after["net_in"] - before["net_in"]) / n,
        "net_out": (after["net_out"] - before["net_out"]) / n,
        "load": load_before,
    }


def entry_sizes(url: str, bars: list[dict[str, Any]]) -> dict[str, float]:
    """Bytes of a bar entry and an output entry: Redis memory per entry and the XADD
    command as sent (RESP)."""
    import redis

    from atc_stream.connectors.redis.resp import pack_command

    client = redis.Redis.from_url(url)
    client.flushall()
    xadd_all(client, SINGLE_INPUT, bars)
    actor = SingleProcess(url)
    actor.run(stop_when_idle=0.2)

    def per_entry(key: str) -> float:
        return client.memory_usage(key, samples=0) / client.xlen(key)

    def resp(key: str) -> float:
        sizes = []
        for _, fields in client.xrange(key, count=200):
            flat = [part for pair in fields.items() for part in pair]
            sizes.append(len(pack_command([b"XADD", key.encode(), b"*", *flat])))
        return statistics.mean(sizes)

    _, fields = client.xrange(OUTPUT, count=1)[0]
    out = {
        "bar_memory": per_entry(SINGLE_INPUT),
        "bar_resp": resp(SINGLE_INPUT),
        "out_memory": per_entry(OUTPUT),
        "out_resp": resp(OUTPUT),
        "out_fields": float(len(fields)),
        "out_bytes": float(sum(len(k) + len(v) for k, v in fields.items())),
    }
    client.flushall()
    client.close()
    return out


# -- main ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--symbols", type=int, default=200)
    ap.add_argument("--bars", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5, help="samples of each path")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--quick", action="store_true", help="20 x 20 bars, 1 round (smoke test)")
    ap.add_argument("--json", type=Path, help="also write every sample here")
    args = ap.parse_args(argv)
    if args.quick:
        args.symbols, args.bars, args.rounds = 20, 20, 1
    if not shutil.which("redis-server") and not os.environ.get("ATC_REDIS_SERVER"):
        print("bench_cluster: needs redis-server on PATH (or ATC_REDIS_SERVER)", file=sys.stderr)
        return 2
    try:
        import ray
    except ImportError:
        print("bench_cluster: needs ray (pip install 'atc-stream[ray]')", file=sys.stderr)
        return 2

    bars = bar_fields(args.symbols, args.bars, args.seed)
    n = len(bars)
    proc, url, _ = start_redis()
    paths = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    os.environ["PYTHONPATH"] = paths  # the Ray workers import this tree
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_start = load1()
    try:
        sizes = entry_sizes(url, bars)
        costs = router_costs(url, bars, args.rounds)
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
        end_to_end(url, bars, 0)  # untimed: Ray's own start-up work settles
        order = [0, 1, 2]
        e2e: dict[int, list[dict[str, float]]] = {s: [] for s in order}
        for r in range(args.rounds):
            for shards in order[r % 3 :] + order[: r % 3]:
                e2e[shards].append(end_to_end(url, bars, shards))
        ray.shutdown()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    load_end = load1()

    print(f"# bench_cluster: {args.symbols} symbols x {args.bars} bars = {n:,} bars, "
          f"{args.rounds} rounds; {started}; {platform.machine()}, {os.cpu_count()} CPUs; "
          f"1-min load {load_start:.2f} before, {load_end:.2f} after\n")  # fmt: skip
    print("## Router alone (no consumer running): µs per bar\n")
    print("| path | µs per bar (median) | min–max | ratio to baseline |")
    print("|---|---:|---|---:|")
    base = statistics.median(next(iter(costs.values())))
    for name, values in costs.items():
        s = summary(values)
        print(f"| {name} | {s['median']:.2f} | {s['min']:.2f}–{s['max']:.2f} | "
              f"{s['median'] / base:.2f}x |")  # fmt: skip
    print("\n## End to end: first XADD → last output entry\n")
    print("| path | time (median) | min–max | bars/s (median) | ratio to one process | "
          "producer µs/bar | Redis CPU µs/bar | Redis cmds/bar | net in / out B/bar | "
          "load |")  # fmt: skip
    print("|---|---:|---|---:|---:|---:|---:|---:|---|---|")
    names = {0: "one process (`RedisStreamRunner`)", 1: "Router → 1 shard actor",
             2: "Router → 2 shard actors"}  # fmt: skip
    base_rate = statistics.median(r["bars_per_s"] for r in e2e[0])
    for shards in order:
        runs = e2e[shards]
        s = summary([r["seconds"] for r in runs])
        rate = statistics.median(r["bars_per_s"] for r in runs)
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        loads = [r["load"] for r in runs]
        print(f"| {names[shards]} | {s['median']:.3f} s | {s['min']:.3f}–{s['max']:.3f} s | "
              f"{rate:,.0f} | {rate / base_rate:.2f}x | {med['produce_us']:.1f} | "
              f"{med['redis_cpu_us']:.1f} | {med['redis_calls']:.2f} | "
              f"{med['net_in']:.0f} / {med['net_out']:.0f} | "
              f"{min(loads):.2f}–{max(loads):.2f} |")  # fmt: skip
    print("\n## Entry sizes (bytes)\n")
    print("| entry | Redis memory per entry | XADD as sent (RESP) | fields |")
    print("|---|---:|---:|---|")
    print(f"| bar (symbol, time, close) | {sizes['bar_memory']:.0f} | {sizes['bar_resp']:.0f} | "
          f"3 |")  # fmt: skip
    print(f"| output row (`outputs=\"all\"`) | {sizes['out_memory']:.0f} | "
          f"{sizes['out_resp']:.0f} | {sizes['out_fields']:.0f} ({sizes['out_bytes']:.0f} B "
          f"of names and values) |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"bars": n, "router_us": costs, "sizes": sizes,
                                         "end_to_end": {str(k): v for k, v in e2e.items()},
                                         "load": [load_start, load_end]}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
