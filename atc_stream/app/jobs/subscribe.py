"""The ``subscribe`` job: print the signals (and trades, positions) a publisher sends over
Redis pub/sub, one JSON object per line (``connectors.redis.pubsub.SignalSubscriber``
narrows them to the chosen symbols, reconnects and counts malformed messages)."""

from __future__ import annotations

import sys

from atc_stream.app.console import OptionError, err, redis_failure
from atc_stream.app.extras import require


def run_subscribe(
    *,
    redis: str,
    symbols: list[str] | None,
    events: bool,
    batch: bool,
    latest: bool,
    trades: bool = False,
    positions: bool = False,
    redis_prefix: str,
    encoding: str,
    count: int | None,
    timeout: float | None,
) -> int:
    """Follow the channels until ``count`` messages, ``timeout`` seconds of silence or
    Ctrl-C; the exit status. A Redis that cannot be reached at the start, or that refuses
    a command, is a ``RunError`` (one line, exit 2)."""
    require("redis", "atc-stream subscribe")
    import msgspec
    import redis as redis_lib

    from atc_stream.connectors.redis.pubsub import SignalSubscriber

    names = [part for item in symbols or () for part in item.split(",") if part]
    encoder = msgspec.json.Encoder()
    out = sys.stdout.buffer
    try:
        sub = SignalSubscriber(
            redis, prefix=redis_prefix, encoding=encoding, symbols=names, events=events,
            batch=batch, trades=trades, positions=positions, as_dict=True,
        )  # fmt: skip
        sub.wait_ready()
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    except (redis_lib.RedisError, OSError) as exc:  # no server there, or one that refuses
        raise redis_failure(redis, exc, "subscribing") from None
    try:
        if latest:
            hashes = [(sub.latest_key, "latest", sub.latest())]
            if positions:
                hashes.append((sub.positions_latest_key, "latest_position", sub.latest_positions()))
            for channel, kind, values in hashes:
                for key, record in sorted(values.items()):
                    out.write(encoder.encode({"channel": channel, "kind": kind, "key": key,
                                              "data": record}) + b"\n")  # fmt: skip
            out.flush()
        for msg in sub.messages(timeout=timeout, limit=count):
            out.write(encoder.encode({"channel": msg.channel, "kind": msg.kind, "data": msg.data}))
            out.write(b"\n")
            out.flush()
    except KeyboardInterrupt:
        pass
    except redis_lib.RedisError as exc:  # the latest hashes: unreachable, or not hashes
        raise redis_failure(redis, exc, "reading the latest records") from None
    finally:
        sub.close()
        if sub.malformed or sub.reconnects:
            err(f"atc-stream: subscribe: {sub.malformed} malformed messages skipped, "
                f"{sub.reconnects} reconnects")  # fmt: skip
    return 0
