"""Live to Redis: an engine steps closed bars and publishes them; a subscriber reads them.

    python examples/live_to_redis.py [--redis redis://127.0.0.1:6379/0] [--bars 120]

Needs a running redis-server and the redis extra (pip install 'atc-stream[redis]').
The "exchange" here is a random walk per symbol, one closed bar per tick of a fake
clock, so the example runs anywhere; replace ``fake_feed`` with your own bar source (or
use ``atc-stream live`` for Binance). The subscriber runs in a thread, follows the
per-symbol channels and the events channel (events of ready rows only, by default),
and prints what it got.
"""

from __future__ import annotations

import argparse
import threading
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pandas as pd

from atc_stream import ATCParams, Engine
from atc_stream.connectors.redis.pubsub import SignalPublisher, SignalSubscriber

SYMBOLS = ("BTCUSDT", "ETHUSDT", "SOLUSDT")
MINUTE_MS = 60_000
T0 = 1_735_689_600_000  # 2025-01-01T00:00Z
#: what the engine returns and publishes (the default: the signal and the events); the
#: subscriber decodes records of these columns
OUTPUTS = ("signal", "events")


def fake_feed(n_bars: int, seed: int = 1) -> Iterator[list[tuple[str, pd.Timestamp, float]]]:
    """Closed 1m bars, one batch (all symbols) per bar time, with pandas Timestamps."""
    rng = np.random.default_rng(seed)
    price = {s: 100.0 * (k + 1) for k, s in enumerate(SYMBOLS)}
    for i in range(n_bars):
        stamp = pd.Timestamp(T0 + i * MINUTE_MS, unit="ms", tz="UTC")
        batch = []
        for s in SYMBOLS:
            price[s] = round(price[s] * float(np.exp(rng.normal(0, 0.004))), 2)
            batch.append((s, stamp, price[s]))
        yield batch


def subscribe(url: str, prefix: str, received: Counter, ready: threading.Event,
              done: threading.Event) -> None:  # fmt: skip
    with SignalSubscriber(url, prefix=prefix, symbols=SYMBOLS, events=True, outputs=OUTPUTS) as sub:
        sub.wait_ready()
        ready.set()
        while True:
            msg = sub.get(timeout=0.2)
            if msg is None:
                if done.is_set():  # the publisher has flushed: nothing more is coming
                    break
                continue
            received[msg.kind] += 1
            if msg.kind == "event":
                side = "LONG " if msg.data.long else "SHORT"
                print(f"  event {side} {msg.data.symbol} bar {msg.data.bar_index} "
                      f"close {msg.data.close} signal {msg.data.signal:+.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--prefix", default="atc-example")
    parser.add_argument("--bars", type=int, default=120)
    args = parser.parse_args()

    params = ATCParams(ema_len=10, hma_len=10, wma_len=10, dema_len=10, lsma_len=10, kama_len=10)
    engine = Engine(params, backend="cpu", interval="1m", outputs=OUTPUTS)
    for s in SYMBOLS:
        engine.add_symbol(s)

    received: Counter = Counter()
    ready, done = threading.Event(), threading.Event()
    reader = threading.Thread(
        target=subscribe, args=(args.redis, args.prefix, received, ready, done)
    )
    reader.start()
    if not ready.wait(10):
        raise SystemExit("subscriber did not connect to Redis")

    published = Counter()
    publisher = SignalPublisher(args.redis, prefix=args.prefix, batch=False)
    try:
        for bars in fake_feed(args.bars):
            result = engine.step(bars)  # Timestamps are converted to epoch ms exactly
            publisher.publish(result)
            published["signal"] += len(result)
            published["event"] += int(
                ((result.long_events | result.short_events) & result.ready).sum()
            )
    finally:
        publisher.close()
        done.set()
        reader.join(timeout=30)
    last = engine.stream_state(engine.streams[0])
    print(f"published {published['signal']} signal rows, {published['event']} events (ready rows)")
    print(f"received  {received['signal']} signal rows, {received['event']} events")
    print(f"{engine.streams[0]}: {last}")
    if received != published:
        raise SystemExit("subscriber missed messages")


if __name__ == "__main__":
    main()
