"""The REST weight limiter: budget per window, the exchange's used-weight header, 429
pauses and 418 bans -- on an injected clock, and over HTTP against the local exchange
of ``test_binance_live`` (real aiohttp servers on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

pytest.importorskip("aiohttp")

from exchange_emulators import (  # noqa: E402
    IMS,
    INTERVAL,
    FakeExchange,
    compile_kernels,
    fast_config,
    make_bars,
)

from atc_stream import Engine  # noqa: E402
from atc_stream.connectors.exchanges.config import LiveConfig, LiveStats  # noqa: E402
from atc_stream.connectors.exchanges.feed import KlineClient  # noqa: E402
from atc_stream.connectors.exchanges.limits import (  # noqa: E402
    RateLimitBan,
    WeightLimiter,
    WeightRules,
)
from atc_stream.connectors.exchanges.registry import NATIVE  # noqa: E402
from atc_stream.connectors.exchanges.rest import KlineRest, RestBanned  # noqa: E402
from atc_stream.connectors.exchanges.venues.binance import (  # noqa: E402
    BINANCE_SPOT,
    BinanceSpot,
)

SYMBOLS = ["BTCUSDT", "ETHUSDT", "XRPUSDT"]


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels():
    """Compile the engine's kernels first, so no client stalls for seconds on it."""
    compile_kernels(INTERVAL)


USED = "X-MBX-USED-WEIGHT-1M"


class FakeTime:
    """A clock that moves only when a sleeper wakes: to the end of its sleep."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        wake = self.now + seconds
        await asyncio.sleep(0)  # let the other tasks run first
        self.now = max(self.now, wake)


def test_budget_bounds_the_weight_of_each_window():
    clock = FakeTime()
    rules = WeightRules(budget=20, window=60.0, request_weight=2, used_weight_header=USED)

    async def fifteen_at_once() -> list[tuple[float, int]]:
        limiter = WeightLimiter(rules, margin=0.0, clock=clock, sleep=clock.sleep)

        async def one() -> tuple[float, int]:
            window = await limiter.acquire()
            return clock(), window

        sent = await asyncio.gather(*(one() for _ in range(15)))
        assert limiter.waits == 5 and limiter.waited == 5 * 60.0
        assert limiter.used == 10
        return sent

    sent = asyncio.run(fifteen_at_once())
    assert sorted(sent) == [(0.0, 0)] * 10 + [(60.0, 1)] * 5  # 20 weight a window
    # the safety margin: 90% of 6000 is 2700 klines requests a minute
    assert WeightLimiter(BINANCE_SPOT).usable == 5400
    # a budget below one request still lets one through per window
    assert WeightLimiter(WeightRules(1, 60.0, 2)).usable == 2


def test_used_weight_header_corrects_the_count_when_higher():
    clock = FakeTime(30.0)

    async def scenario() -> None:
        limiter = WeightLimiter(BINANCE_SPOT, clock=clock, sleep=clock.sleep)
        window = await limiter.acquire()
        assert limiter.used == 2
        limiter.record(window, 200, {USED: "1"})  # lower than ours: ours stands
        assert limiter.used == 2
        limiter.record(window, 200, {USED: "garbage"})
        limiter.record(window, 200, {USED: "5399"})  # others on this IP spent the rest
        assert limiter.used == 5399
        window = await limiter.acquire()  # 5401 > 5400: the next minute
        assert clock() == 60.0 and window == 1 and limiter.used == 2 and limiter.waits == 1
        # a late answer to a request of the previous minute reports that minute's weight
        limiter.record(0, 200, {USED: "5000"})
        assert limiter.used == 2

    asyncio.run(scenario())


def test_429_retry_after_pauses_every_request():
    clock = FakeTime()

    async def scenario() -> list[float]:
        limiter = WeightLimiter(BINANCE_SPOT, clock=clock, sleep=clock.sleep)
        windows = [await limiter.acquire() for _ in range(3)]
        limiter.record(windows[0], 429, {"Retry-After": "30", USED: "12"})
        assert limiter.pauses == 1 and limiter.used == 12

        async def one() -> float:
            await limiter.acquire()
            return clock()

        sent = await asyncio.gather(*(one() for _ in range(4)))
        # no Retry-After: the rest of the exchange's window
        limiter.record(0, 429, {})
        sent.append(await one())
        return sent

    sent = asyncio.run(scenario())
    assert sent[:4] == [30.0] * 4 and sent[4] == 60.0


def test_418_raises_a_clear_error_and_every_later_request_too():
    clock = FakeTime(10.0)

    async def scenario() -> None:
        limiter = WeightLimiter(BINANCE_SPOT, clock=clock, sleep=clock.sleep)
        window = await limiter.acquire()
        with pytest.raises(RateLimitBan, match=r"HTTP 418: .*banned this IP for 120 s") as ban:
            limiter.record(window, 418, {"Retry-After": "120"})
        assert ban.value.until == 130.0
        with pytest.raises(RateLimitBan):
            await limiter.acquire()

    asyncio.run(scenario())


def test_rules_and_budget_are_validated():
    with pytest.raises(ValueError, match="budget"):
        WeightRules(0, 60.0, 2)
    with pytest.raises(ValueError, match="window"):
        WeightRules(6000, 0, 2)
    with pytest.raises(ValueError, match="budget"):
        WeightLimiter(BINANCE_SPOT, 0)
    with pytest.raises(ValueError, match="rest_weight_budget"):
        LiveConfig(rest_weight_budget=-5)
    assert WeightLimiter(BINANCE_SPOT, 1200).usable == 1080


@pytest.mark.parametrize(
    ("name", "budget", "window", "weight", "header"),
    [
        ("binance", 6000, 60.0, 2, USED),
        ("binance-usdm", 2400, 60.0, 5, USED),
        ("bybit", 600, 5.0, 1, None),
        ("bybit-linear", 600, 5.0, 1, None),
        ("okx", 20, 2.0, 1, None),
    ],
)
def test_each_exchange_limits_its_rest_by_its_own_rules(name, budget, window, weight, header):
    """The REST client's limiter spends its exchange's budget; ``rest_weight_budget``
    replaces the budget, not the window, weight or header."""
    exchange = NATIVE[name]()

    def limiter(cfg: LiveConfig) -> WeightLimiter:
        return KlineRest(
            None, cfg, INTERVAL, LiveStats(), lambda: 0, random.Random(1), exchange=exchange
        ).limiter  # fmt: skip

    own = limiter(LiveConfig())
    assert own.rules is exchange.limits and own.budget == budget
    assert (own.rules.window, own.rules.request_weight) == (window, weight)
    assert own.rules.used_weight_header == header
    overridden = limiter(LiveConfig(rest_weight_budget=100))
    assert overridden.budget == 100 and overridden.rules is exchange.limits
    assert overridden.usable == max(weight, 90)


# -- over HTTP -------------------------------------------------------------------------------


def fetch_all(ex: FakeExchange, cfg: LiveConfig, limiter: WeightLimiter, symbols) -> LiveStats:
    """Every symbol's last few klines through one ``KlineRest`` at once: its stats."""
    import aiohttp

    stats = LiveStats()

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            rest = KlineRest(
                session, cfg, INTERVAL, stats, lambda: ex.now_ms, random.Random(1),
                exchange=BinanceSpot(), limiter=limiter,
            )  # fmt: skip
            end = ex.now_ms
            await asyncio.gather(*(rest.fetch(s, end - 5 * IMS, end) for s in symbols))

    asyncio.run(run())
    return stats


def test_the_exchanges_used_weight_holds_requests_to_the_next_window():
    """Another client on the IP used 5390 of the 6000: after five requests the sixth
    waits for the next minute, and the count follows the exchange's header."""
    symbols = [f"S{i}USDT" for i in range(6)]
    clock = FakeTime()
    with FakeExchange(make_bars(symbols, 20), 10) as ex:
        ex.other_weight = 5390
        ex.rest_clock = clock
        limiter = WeightLimiter(BINANCE_SPOT, clock=clock, sleep=clock.sleep)
        stats = fetch_all(ex, fast_config(ex, rest_concurrency=1), limiter, symbols)
        stamps = list(ex.rest_stamps)
    assert stamps == [0.0] * 5 + [60.0]
    assert stats.rest_weight_used == 5390 + 12 and stats.rest_limit_waits == 1
    assert stats.rest_limit_wait_s == 60.0


class LoggingLimiter(WeightLimiter):
    """The limiter, logging when it lets a request go and each answer's status."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.log: list[tuple[str, float]] = []

    async def acquire(self, weight: int | None = None) -> int:
        window = await super().acquire(weight)
        self.log.append(("go", self._clock()))
        return window

    def record(self, window: int, status: int, headers) -> None:
        self.log.append((str(status), self._clock()))
        super().record(window, status, headers)


def test_a_429_over_http_pauses_every_request_until_retry_after():
    """The first answer is a 429 with Retry-After 30 while three other requests are in
    flight: every request let go after it -- the retry and the four that waited for a
    slot -- goes at 30 s on the limiter's clock, not before."""
    symbols = [f"S{i}USDT" for i in range(8)]
    clock = FakeTime()
    faults = ["429:30", "slow", "slow", "slow"]
    with FakeExchange(make_bars(symbols, 20), 10, rest_faults=faults, slow_seconds=0.3) as ex:
        limiter = LoggingLimiter(BINANCE_SPOT, clock=clock, sleep=clock.sleep)
        stats = fetch_all(ex, fast_config(ex, rest_concurrency=4), limiter, symbols)
        requests = len(ex.rest_requests)
    assert stats.http_retries == {"status_429": 1} and limiter.pauses == 1
    assert requests == 9
    log = limiter.log
    paused = log.index(("429", 0.0))
    assert log[:paused] == [("go", 0.0)] * 4
    after = [t for event, t in log[paused:] if event == "go"]
    assert len(after) == 5 and min(after) == 30.0


def test_concurrency_is_bounded():
    symbols = [f"S{i}USDT" for i in range(24)]
    with FakeExchange(
        make_bars(symbols, 20), 10, rest_faults=["slow"] * 24, slow_seconds=0.2
    ) as ex:
        cfg = fast_config(ex, rest_concurrency=6)
        stats = fetch_all(ex, cfg, WeightLimiter(BINANCE_SPOT), symbols)
        most = ex.max_rest_in_flight
    assert stats.rest_requests == 24 and 2 <= most <= 6


def test_a_ban_stops_the_feed_at_once():
    """A 418 ends the run with ``RestBanned`` (one line, what happened and for how long);
    no request is sent after it."""
    closes = make_bars(SYMBOLS, 240, seed=4)
    with FakeExchange(closes, 220, rest_faults=["418:120"]) as ex:
        client = KlineClient(
            Engine(backend="cpu", interval=INTERVAL, outputs="all"), SYMBOLS,
            fast_config(ex, history=50), clock_ms=lambda: ex.now_ms,
        )  # fmt: skip
        started = time.monotonic()
        with pytest.raises(RestBanned, match="HTTP 418.*banned this IP for 120 s") as ban:
            asyncio.run(client.run(max_seconds=30))
        assert time.monotonic() - started < 20  # stopped, not waiting the ban out
        requests = len(ex.rest_requests)
    assert "\n" not in str(ban.value)
    assert requests == len(SYMBOLS)  # the three sent at once; none after the ban


def test_cli_live_banned_exits_1_with_the_reason(tmp_path):
    from typer.testing import CliRunner

    from atc_stream.app.cli import app

    closes = make_bars(["BTCUSDT"], 240, seed=4)
    t0 = int(time.time() * 1000) - 220 * IMS - 1000
    with FakeExchange(closes, 220, t0=t0, rest_faults=["418:300"]) as ex:
        result = CliRunner().invoke(
            app,
            ["live", "--symbols", "BTCUSDT", "--history", "50", "--ws-url", ex.ws_url,
             "--rest-url", ex.rest_url, "--output", str(tmp_path / "out.jsonl"),
             "--max-seconds", "30", "--backend", "cpu", "--status-every", "0",
             "--rest-weight-budget", "1200"],
        )  # fmt: skip
    assert result.exit_code == 1, result.output
    failed = [line for line in result.stderr.splitlines() if "failed:" in line]
    assert len(failed) == 1 and "HTTP 418" in failed[0] and "300 s" in failed[0]
    refused = CliRunner().invoke(app, ["live", "--symbols", "BTCUSDT", "--rest-weight-budget", "0"])
    assert refused.exit_code == 2 and "--rest-weight-budget" in refused.output


def test_each_answer_is_parsed_only_once_the_pace_lets_it():
    """``pace`` is awaited before each page is decoded and parsed (the feed waits there
    for room before the next burst): while it holds, no fetch returns; released, every
    page is parsed, in full."""
    import aiohttp

    symbols = ["S0USDT", "S1USDT"]
    held = asyncio.Event()
    paced: list[int] = []

    async def pace() -> None:
        paced.append(len(paced))
        await held.wait()

    async def run(ex: FakeExchange) -> list[list]:
        async with aiohttp.ClientSession() as session:
            rest = KlineRest(
                session, fast_config(ex), INTERVAL, LiveStats(), lambda: ex.now_ms,
                random.Random(1), exchange=BinanceSpot(), pace=pace,
            )  # fmt: skip
            end = ex.now_ms
            fetches = [asyncio.ensure_future(rest.fetch(s, end - 5 * IMS, end)) for s in symbols]
            while len(paced) < len(symbols):  # both answers came, and wait for the pace
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            assert not any(f.done() for f in fetches)
            held.set()
            return list(await asyncio.gather(*fetches))

    with FakeExchange(make_bars(symbols, 20), 10) as ex:
        pages = asyncio.run(run(ex))
    assert len(paced) == len(symbols)
    assert [len(klines) for klines in pages] == [5, 5]  # the closed ones of the range
    assert all(k.symbol == s for s, klines in zip(symbols, pages, strict=True) for k in klines)
