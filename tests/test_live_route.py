"""``live --route-shards``: the live feed's closed bars (history included) to a cluster's
shard streams, where shard engines compute what one engine over the same bars does
(real redis-server, the local Binance emulator)."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("websockets")

from cluster_helpers import check_outputs, reference  # noqa: E402
from exchange_emulators import IMS, FakeExchange, make_bars  # noqa: E402
from redis_fixtures import redis_server, redis_url  # noqa: E402, F401
from typer.testing import CliRunner  # noqa: E402

from atc_stream.app.cli import app  # noqa: E402
from atc_stream.connectors.cluster.registry import recorded_shards  # noqa: E402
from atc_stream.connectors.cluster.shard import ShardConfig, ShardWorker  # noqa: E402
from atc_stream.core.shards import bars_stream, shard_of  # noqa: E402

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]

SYMBOLS = ["BTCUSDT", "ETHUSDT", "SOLUSDT", "XRPUSDT"]


def test_live_routes_every_applied_bar_once_and_the_shards_equal_one_engine(
    tmp_path,
    redis_url,  # noqa: F811
):
    import redis

    closes = make_bars(SYMBOLS, 250, seed=21)
    start, history = 235, 80
    t0 = int(time.time() * 1000) - start * IMS - 1000
    with FakeExchange(closes, start, t0=t0) as ex:
        result = CliRunner().invoke(
            app,
            ["live", "--symbols", ",".join(SYMBOLS), "--history", str(history),
             "--ws-url", ex.ws_url, "--rest-url", ex.rest_url,
             "--output", str(tmp_path / "live.jsonl"), "--redis", redis_url,
             "--route-shards", "2", "--max-bars", str(len(SYMBOLS) * (250 - start)),
             "--max-seconds", "60", "--backend", "cpu", "--status-every", "0"],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "routed" in result.output and "bars to 2 shard streams" in result.output
    client = redis.Redis.from_url(redis_url)
    assert recorded_shards(client, "atc") == 2
    # each shard stream: its symbols' bars, history then live, each once and in order
    bars = [(s, t0 + i * IMS, float(closes[s][i])) for i in range(start - history, 250)
            for s in SYMBOLS]  # fmt: skip
    for shard in range(2):
        entries = client.xrange(bars_stream("atc", shard))
        got = [(f[b"symbol"].decode(), int(f[b"time"]), float(f[b"close"])) for _, f in entries]
        want = [b for b in bars if shard_of(b[0], 2) == shard]
        assert sorted(got, key=lambda b: (b[1], b[0])) == want
        for symbol in {b[0] for b in want}:
            times = [t for s, t, _ in got if s == symbol]
            assert times == sorted(times)
        ShardWorker(
            ShardConfig(redis_url, shard, output_stream="out", batch_size=50, backend="cpu")
        ).run(stop_when_idle=0.3)
    check_outputs(client, "out", reference(bars))
    client.close()


def test_route_shards_needs_redis(tmp_path):
    result = CliRunner().invoke(
        app, ["live", "--symbols", "BTCUSDT", "--route-shards", "2",
              "--output", str(tmp_path / "x.jsonl")],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--route-shards needs --redis" in result.output
