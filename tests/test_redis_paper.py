"""Paper trading over Redis, against a real redis-server: positions (and trades) on pub/sub
from both publishers, the subscriber and ``atc-stream subscribe`` reading them, and the
trade and position output streams of ``run-stream``, exactly once across SIGKILLs."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd
import pytest
from redis_fixtures import redis_server, redis_url  # noqa: F401
from test_redis_pubsub import Collector, _wait_for_subscriber

from atc_stream import ATCParams, Engine, Strategy, backtest
from atc_stream.app.defaults import INTERVAL
from atc_stream.connectors.redis.loop import LoopPublisher
from atc_stream.connectors.redis.pubsub import SignalPublisher, SignalSubscriber
from atc_stream.connectors.redis.stream_output import read_outputs
from atc_stream.connectors.redis.streams import RedisStreamRunner
from atc_stream.core.messages import PositionRecord
from atc_stream.core.schema import SCHEMA_VERSION
from atc_stream.core.strategy_outputs import records

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]

SPECS = ["stop=0.02,fee_bps=10,slippage_bps=5", "direction=long_only,take_profit=0.03,max_hold=40"]
STRATEGIES = [
    Strategy(stop=0.02, fee_bps=10, slippage_bps=5),
    Strategy(direction="long_only", take_profit=0.03, max_hold=40),
]
#: a fast parameter set: events (and so trades) from the first few dozen bars
SHORT = ATCParams(
    ema_len=6, hma_len=7, wma_len=5, dema_len=6, lsma_len=8, kama_len=5,
    robustness="Narrow", La=0.05, De=0.1, cutout=3,
)  # fmt: skip
BASE_TIME = 1_700_000_000_000


def ohlc_frame(n_symbols: int, n_bars: int, seed: int) -> pd.DataFrame:
    """Random-walk OHLC bars of ``n_symbols`` symbols, in time order."""
    rng = np.random.default_rng(seed)
    parts = []
    for k in range(n_symbols):
        close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, n_bars)))
        open_ = np.r_[close[0], close[:-1]] * np.exp(rng.normal(0, 0.003, n_bars))
        high = np.maximum(open_, close) * (1 + rng.uniform(0, 0.01, n_bars))
        low = np.minimum(open_, close) * (1 - rng.uniform(0, 0.01, n_bars))
        time_ = BASE_TIME + 60_000 * np.arange(n_bars, dtype=np.int64)
        parts.append(
            pd.DataFrame({"symbol": f"S{k:02d}", "time": time_, "open": open_, "high": high,
                          "low": low, "close": close})
        )  # fmt: skip
    return pd.concat(parts).sort_values(["time", "symbol"], kind="stable", ignore_index=True)


def step_results(frame: pd.DataFrame, params) -> list:
    """One step per bar time of a strategy engine (every symbol each step)."""
    engine = Engine(params, backend="cpu", outputs="all", strategies=STRATEGIES)
    for symbol in frame["symbol"].unique():
        engine.add_symbol(symbol)
    results = []
    for _, bars in frame.groupby("time", sort=True):
        rows = bars[["symbol", "time", "open", "high", "low", "close"]].itertuples(index=False)
        results.append(engine.step([tuple(row) for row in rows]))
        assert not results[-1].rejected
    return results


@pytest.fixture(scope="module")
def results():
    return step_results(ohlc_frame(3, 160, seed=2), [ATCParams(), SHORT])


def plain(record) -> dict:
    """A received record as the dict of ``position_records``/``trade_records`` (no ``v``)."""
    out = msgspec.to_builtins(record)
    assert out.pop("v") == SCHEMA_VERSION
    return out


def sort_trades(rows: list[dict]) -> list[dict]:
    keys = ("symbol", "params_id", "strategy_id", "exit_time", "entry_time")
    return sorted(rows, key=lambda r: tuple(r[k] for k in keys))


def collect(url: str, publish, **subscription) -> list:
    sub = SignalSubscriber(url, **subscription)
    sub.wait_ready()
    collector = Collector(sub)
    collector.start()
    publish()
    messages = collector.drain(quiet=0.5)
    sub.close()
    return messages


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_positions_are_published_per_bar_and_strategy(redis_url, results, encoding):  # noqa: F811
    def publish():
        with SignalPublisher(redis_url, encoding=encoding) as pub:
            for result in results:
                assert pub.publish(result)
            assert pub.flush(30) and pub.dropped == 0

    got = collect(
        redis_url, publish, encoding=encoding, positions=True, trades=True,
        patterns=["atc:position:*"],
    )  # fmt: skip
    positions = [r for result in results for r in result.position_records()]
    assert len(positions) == len(results) * 3 * 2 * 2  # symbols x parameter sets x strategies
    on_all = [m for m in got if m.channel == "atc:positions"]
    assert all(m.kind == "position" and isinstance(m.data, PositionRecord) for m in on_all)
    assert [plain(m.data) for m in on_all] == positions  # every bar's side and equity, in order
    assert {p["side"] for p in positions} == {-1, 0, 1}
    for symbol in ("S00", "S01", "S02"):
        mine = [plain(m.data) for m in got if m.channel == f"atc:position:{symbol}"]
        assert mine == [p for p in positions if p["symbol"] == symbol]
    trades = [plain(m.data) for m in got if m.channel == "atc:trades"]
    assert trades == [t for result in results for t in result.trade_records()] and trades
    assert {m.kind for m in got} == {"position", "trade"}

    with SignalSubscriber(redis_url, encoding=encoding) as reader:
        latest = reader.latest_positions()
    last = {f"{p['symbol']}:{p['interval']}:{p['params_id']}:{p['strategy_id']}": p
            for p in positions}  # fmt: skip
    assert {key: plain(record) for key, record in latest.items()} == last
    assert all(record.key == key for key, record in latest.items())


def test_without_per_symbol_or_latest_only_the_positions_channel(redis_url, results):  # noqa: F811
    import redis

    def publish():
        with SignalPublisher(redis_url, per_symbol=False, latest=False) as pub:
            for result in results[:30]:
                pub.publish(result)

    got = collect(redis_url, publish, positions=True, patterns=["atc:position:*", "atc:trade:*"])
    assert {m.channel for m in got} == {"atc:positions"}
    assert len(got) == sum(len(r.position_records()) for r in results[:30])
    client = redis.Redis.from_url(redis_url)
    assert not client.exists("atc:positions:latest", "atc:latest")
    client.close()


def test_the_loop_publisher_sends_the_same_positions_and_trades(redis_url, results):  # noqa: F811
    import redis

    client = redis.Redis.from_url(redis_url)
    subscription = {"positions": True, "trades": True, "patterns": ["atc:position:*"]}

    def by_thread():
        with SignalPublisher(redis_url) as publisher:
            for result in results:
                publisher.publish(result)

    async def by_loop(publisher: LoopPublisher):
        await publisher.start()
        for result in results:
            assert publisher.publish(result)
            await asyncio.sleep(0)  # the loop runs between steps, as in live
        assert await publisher.aclose(10)

    thread_messages = collect(redis_url, by_thread, **subscription)
    thread_latest = client.hgetall("atc:positions:latest")
    client.delete("atc:positions:latest")
    loop_publisher = LoopPublisher(redis_url)
    loop_messages = collect(redis_url, lambda: asyncio.run(by_loop(loop_publisher)), **subscription)
    loop_latest = client.hgetall("atc:positions:latest")
    client.close()
    assert loop_publisher.dropped == 0 and loop_publisher.errors == 0

    def by_channel(messages):
        out: dict[str, list] = {}
        for m in messages:
            out.setdefault(m.channel, []).append(m.data)
        return out

    assert by_channel(loop_messages) == by_channel(thread_messages)
    assert {"atc:positions", "atc:trades", "atc:position:S00"} <= set(by_channel(loop_messages))
    assert loop_latest == thread_latest and len(loop_latest) == 3 * 2 * 2


def subscribe_cli(url: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "atc_stream", "subscribe", "--redis", url, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def printed(proc: subprocess.Popen) -> list[dict]:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_subscribe_cli_prints_positions_trades_and_the_latest_positions(redis_url, results):  # noqa: F811
    proc = subscribe_cli(redis_url, "--trades", "--positions", "--count", "60")
    _wait_for_subscriber(redis_url, "atc:trades", proc)
    with SignalPublisher(redis_url) as pub:
        for result in results:
            pub.publish(result)
    lines = printed(proc)
    assert len(lines) == 60 and {line["kind"] for line in lines} <= {"position", "trade"}
    positions = [line for line in lines if line["kind"] == "position"]
    assert {line["channel"] for line in positions} == {"atc:positions"}
    assert [line["data"] for line in positions] == [
        {**p, "v": SCHEMA_VERSION} for result in results for p in result.position_records()
    ][: len(positions)]

    # --latest --positions: the latest record of every stream, then of every strategy stream
    lines = printed(subscribe_cli(redis_url, "--positions", "--latest", "--timeout", "0.5"))
    assert [line["kind"] for line in lines] == ["latest"] * 6 + ["latest_position"] * 12
    latest_positions = lines[6:]
    assert {line["channel"] for line in latest_positions} == {"atc:positions:latest"}
    assert [(line["key"], line["data"]) for line in latest_positions] == sorted(
        (f"{p['symbol']}:{p['interval']}:{p['params_id']}:{p['strategy_id']}",
         {**p, "v": SCHEMA_VERSION})
        for p in results[-1].position_records()
    )  # fmt: skip


# -- output streams of run-stream -------------------------------------------------------

INPUT, OUTPUT = "bars:in", "paper:out"


def push_bars(client, frame: pd.DataFrame, key: str = INPUT) -> None:
    pipe = client.pipeline(transaction=False)
    for row in frame.itertuples(index=False):
        pipe.xadd(key, {"symbol": row.symbol, "time": row.time, "open": repr(row.open),
                        "high": repr(row.high), "low": repr(row.low),
                        "close": repr(row.close)})  # fmt: skip
    pipe.execute()


def uninterrupted(client, output: str, *, batch_size: int) -> RedisStreamRunner:
    """The input read once, start to end, by an in-process runner of its own group."""
    engine = Engine(backend="cpu", interval=INTERVAL, outputs="all", strategies=STRATEGIES)
    runner = RedisStreamRunner(
        engine, client, INPUT, group=f"group-{output}", consumer="c", output_stream=output,
        batch_size=batch_size,
    )  # fmt: skip
    runner.prepare()
    runner.run(stop_when_idle=0.3)
    return runner


def entries(client, key: str) -> list[tuple]:
    """(src, key, time, record) of every entry of an output stream (not the entry IDs)."""
    return [(o["src"], o["key"], o["time"], o["record"]) for o in read_outputs(client, key)]


def test_run_stream_writes_trades_and_positions_streams(redis_url):  # noqa: F811
    import redis

    client = redis.Redis.from_url(redis_url)
    frame = ohlc_frame(2, 300, seed=11)
    push_bars(client, frame)
    runner = uninterrupted(client, OUTPUT, batch_size=37)
    signals = read_outputs(client, OUTPUT)
    trades = read_outputs(client, OUTPUT + ":trades")
    positions = read_outputs(client, OUTPUT + ":positions")
    assert len(signals) == len(frame) and len(positions) == 2 * len(frame)
    assert runner.stats.trades_out == len(trades) and runner.stats.positions_out == len(positions)
    assert any(line.startswith("trades out") for line in runner.stats.lines())

    # the trades of backtest() on the same bars
    expected = backtest(frame, None, STRATEGIES)
    got = [o["record"] for o in trades]
    assert all(record.pop("v") == SCHEMA_VERSION for record in got)
    assert sort_trades(got) == sort_trades(records(expected.trade_columns)) and got
    # each trade and position tagged with the input entry of its bar
    src_of = {(o["record"]["symbol"], o["time"]): o["src"] for o in signals}
    for o in trades:
        record = o["record"]
        assert o["src"] == src_of[(record["symbol"], record["exit_time"])]
        assert o["time"] == record["exit_time"]
        assert o["key"] == f"{record['symbol']}:1m:0:{record['strategy_id']}"
    for o in positions:
        record = o["record"]
        assert (o["src"], o["time"]) == (src_of[(record["symbol"], record["time"])], record["time"])
        assert o["key"] == f"{record['symbol']}:1m:0:{record['strategy_id']}"
    # the positions are the engine's, bar by bar: the last equity is backtest's final one
    final = {(o["record"]["symbol"], o["record"]["strategy_id"]): o["record"] for o in positions}
    metrics = expected.metrics.set_index(["symbol", "strategy_id"])["final_equity"]
    assert {key: record["equity"] for key, record in final.items()} == metrics.to_dict()

    # without strategies the run writes no trade or position stream
    client.flushall()
    push_bars(client, frame)
    plain_runner = RedisStreamRunner(
        Engine(backend="cpu", outputs="all"), client, INPUT, group="g", output_stream=OUTPUT
    )
    plain_runner.prepare()
    plain_runner.run(stop_when_idle=0.3)
    assert client.xlen(OUTPUT) == len(frame)
    assert not client.exists(OUTPUT + ":trades", OUTPUT + ":positions")
    with pytest.raises(ValueError, match="differ from input_stream"):
        RedisStreamRunner(plain_runner.engine, client, "x:trades", output_stream="x")
    client.close()


def test_trades_and_positions_streams_are_trimmed_like_the_signals(redis_url):  # noqa: F811
    import redis

    client = redis.Redis.from_url(redis_url)
    push_bars(client, ohlc_frame(4, 200, seed=4))
    engine = Engine(backend="cpu", outputs="all", strategies=STRATEGIES)
    runner = RedisStreamRunner(
        engine, client, INPUT, group="g", output_stream=OUTPUT, output_maxlen=300
    )
    runner.prepare()
    runner.run(stop_when_idle=0.3)
    assert runner.stats.positions_out == 1600
    for key in (OUTPUT, OUTPUT + ":positions"):  # MAXLEN ~ trims in whole nodes
        assert 300 <= client.xlen(key) < 800
    client.close()


def command(url: str, snapshot_dir: Path) -> list[str]:
    cmd = [
        sys.executable, "-m", "atc_stream", "run-stream",
        "--redis", url, "--input-stream", INPUT, "--output-stream", OUTPUT,
        "--group", "g", "--consumer", "c1", "--snapshot-dir", str(snapshot_dir),
        "--snapshot-every", "150", "--batch-size", "30", "--backend", "cpu",
    ]  # fmt: skip
    for spec in SPECS:
        cmd += ["--strategy", spec]
    return cmd


@pytest.mark.timeout(420)
def test_sigkill_anywhere_then_resume_writes_trades_and_positions_exactly_once(
    redis_url,  # noqa: F811
    tmp_path,
):
    """``run-stream --strategy --output-stream`` is SIGKILLed at random instants, while a
    snapshot is written and at each injected point of the batch loop, and resumed each
    time (``tests/crash_driver_streams.py``): the signal, trade and position streams end
    with every entry exactly once, equal to an uninterrupted run's."""
    import redis

    client = redis.Redis.from_url(redis_url)
    frame = ohlc_frame(8, 300, seed=7)
    push_bars(client, frame)
    total = len(frame)
    rng = random.Random(20240612)
    # each kill must come before the input runs out (or the attempt waits out its deadline)
    plan = [["random", rng.randint(5, 80)] for _ in range(6)]
    plan += [["snapshot", 1], ["fault:after_snapshot", rng.randint(1, 2)]]
    plan += [[f"fault:{point}", rng.randint(2, 4)]
             for point in ("after_output", "after_step", "after_read")]  # fmt: skip
    rng.shuffle(plan)
    snapshots = tmp_path / "snapshots"
    spec = {
        "url": redis_url, "args": command(redis_url, snapshots)[3:], "snaps": str(snapshots),
        "output": OUTPUT, "total": total, "plan": plan, "seed": 3,
    }  # fmt: skip
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    driver = Path(__file__).with_name("crash_driver_streams.py")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(driver), str(tmp_path / "spec.json")],
        capture_output=True, text=True, timeout=360,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    kills = json.loads(done.stdout.strip().splitlines()[-1])
    assert kills[-1][0] == "finish" and kills[-1][2] == 0, str(kills)
    killed = [k for k in kills if k[2] == -signal.SIGKILL]
    assert len(killed) == len(plan), str(kills)  # every planned kill hit a running process
    assert client.xpending(INPUT, "g")["pending"] == 0

    reference = uninterrupted(client, "reference", batch_size=30)
    assert reference.stats.bars == total
    for suffix in ("", ":trades", ":positions"):
        mine, theirs = entries(client, OUTPUT + suffix), entries(client, "reference" + suffix)
        assert len({(e[1], e[2], e[3].get("entry_time")) for e in mine}) == len(mine), suffix
        assert mine == theirs, f"{suffix or 'signals'}: {len(mine)} vs {len(theirs)} ({kills})"
    positions = entries(client, OUTPUT + ":positions")
    assert len(positions) == 2 * total
    trades = [dict(e[3]) for e in entries(client, OUTPUT + ":trades")]
    assert all(trade.pop("v") == SCHEMA_VERSION for trade in trades)
    want = sort_trades(records(backtest(frame, None, STRATEGIES).trade_columns))
    assert sort_trades(trades) == want and want
    client.close()
    print(f"paper crash test: {len(killed)} kills, {time.monotonic() - started:.1f} s, {kills}")
