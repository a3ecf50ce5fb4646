"""The operations surface of ``atc-stream live`` against real local servers on 127.0.0.1:
``/metrics`` (parsed by prometheus-client's own parser, equal to ``LiveStats``),
``/healthz`` and ``/readyz`` (not ready before the warmup, ready once every bar is
applied), ``--config`` files, ``--log-format json`` lines, and SIGTERM then ``--resume``
of the command in a subprocess (``tests/test_live_sigterm.py``)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import socket
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

pytest.importorskip("prometheus_client")
pytest.importorskip("aiohttp")
pytest.importorskip("websockets")

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from test_binance_live import (  # noqa: E402, F401
    INTERVAL,
    SYMBOLS,
    FakeExchange,
    compiled_kernels,
    fast_config,
    make_bars,
)

from atc_stream import Engine, compute  # noqa: E402
from atc_stream.app.metrics import PREFIX, LiveCollector  # noqa: E402
from atc_stream.app.ops_server import OpsServer  # noqa: E402
from atc_stream.connectors.exchanges.config import LiveConfig  # noqa: E402
from atc_stream.connectors.exchanges.feed import KlineClient  # noqa: E402

# -- helpers ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """(status, body) of a GET; an error status is an answer too."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of a Prometheus text page: (name, sorted labels) -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def labelled(found: dict, name: str, label: str) -> dict[str, float]:
    """The samples of ``name`` by the value of ``label``."""
    return {dict(k)[label]: v for (n, k), v in found.items() if n == name}


def assert_histogram(found: dict, name: str, histogram) -> None:
    """The exposed histogram ``name`` is ``histogram``'s (buckets, count, sum)."""
    le = {dict(k)["le"]: v for (n, k), v in found.items() if n == f"{name}_bucket"}
    want = {("+Inf" if math.isinf(b) else repr(b)): c for b, c in histogram.cumulative()}
    assert {float(k): v for k, v in le.items()} == {float(k): v for k, v in want.items()}
    assert found[(f"{name}_count", ())] == histogram.count
    assert found[(f"{name}_sum", ())] == pytest.approx(histogram.sum)


def assert_metrics_match(found: dict, stats) -> None:
    """The counters and gauges of a scrape equal ``stats`` (a ``LiveStats``)."""
    bars = labelled(found, f"{PREFIX}_bars_total", "source")
    assert bars == {"websocket": stats.closed_klines, "backfill": stats.backfilled_bars,
                    "warmup": stats.warmup_bars}  # fmt: skip
    for name, value in [
        ("signal_rows_total", stats.rows_out), ("previews_total", stats.previews),
        ("messages_total", stats.messages), ("connects_total", stats.connects),
        ("reconnects_total", stats.reconnects),
        ("connect_failures_total", stats.connect_failures),
        ("rest_requests_total", stats.rest_requests),
        ("backfills_total", stats.backfills), ("backfill_failures_total", stats.backfill_failures),
        ("rest_limit_waits_total", stats.rest_limit_waits),
        ("rest_limit_wait_seconds_total", stats.rest_limit_wait_s),
        ("rest_weight_used", stats.rest_weight_used),
        ("symbols", stats.symbols), ("connections", stats.connections),
        ("open_connections", stats.open_connections),
    ]:  # fmt: skip
        assert found[(f"{PREFIX}_{name}", ())] == value, name
    rejections = {
        (dict(k)["stage"], dict(k)["reason"]): v
        for (n, k), v in found.items()
        if n == f"{PREFIX}_rejections_total"
    }
    want = {("feed", r): n for r, n in stats.rejections.items()}
    want |= {("engine", r): n for r, n in stats.engine_rejections.items()}
    assert rejections == want
    assert labelled(found, f"{PREFIX}_disconnects_total", "reason") == dict(stats.disconnects)
    assert labelled(found, f"{PREFIX}_rest_retries_total", "reason") == dict(stats.http_retries)
    if stats.last_bar_lag_ms is not None:
        assert found[(f"{PREFIX}_last_bar_lag_seconds", ())] == stats.last_bar_lag_ms / 1000
    assert_histogram(found, f"{PREFIX}_step_seconds", stats.step_seconds)
    assert_histogram(found, f"{PREFIX}_kline_to_publish_seconds", stats.kline_to_publish_seconds)


class GatedExchange(FakeExchange):
    """REST answers wait until ``gate`` is set: the client's warmup is held meanwhile."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()

    async def _klines(self, request, fault):
        while not self.gate.is_set():
            await asyncio.sleep(0.005)
        return await super()._klines(request, fault)


class Served:
    """A client's run with its ``OpsServer``, in an event loop of their own thread; the
    server stays up after the run until ``close()``."""

    def __init__(self, client: KlineClient, **run) -> None:
        self.client, self.run = client, run
        self.url: str | None = None
        self.error: BaseException | None = None
        self.started, self.ran = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.release = asyncio.Event()
        async with OpsServer(self.client) as server:
            self.url = server.url
            self.started.set()
            try:
                await self.client.run(**self.run)
            except BaseException as exc:
                self.error = exc
            finally:
                self.ran.set()
            await self.release.wait()

    def __enter__(self) -> Served:
        self._thread.start()
        assert self.started.wait(30), "the ops server did not start"
        return self

    def wait(self, seconds: float) -> None:
        assert self.ran.wait(seconds), "the client did not finish its run"
        assert self.error is None, repr(self.error)

    def __exit__(self, *exc) -> None:
        if self.started.is_set():
            self.client.stop()
            self.loop.call_soon_threadsafe(self.release.set)
        self._thread.join(30)
        assert not self._thread.is_alive()


# -- /metrics, /healthz, /readyz of a running client ----------------------------------------------


def test_readiness_and_metrics_follow_the_feed():
    """/readyz is 503 listing every symbol while the warmup is held, 200 once every bar is
    applied; /healthz is 200 throughout; /metrics after the run equals ``LiveStats``."""
    start, n_bars = 230, 242
    closes = make_bars(SYMBOLS, n_bars, seed=21)
    hostile = {"stream": "btcusdt@kline_1m", "data": {"e": "kline", "k": "nope"}}
    with GatedExchange(
        closes, start, bar_pause=0.02, faults={235: [("raw", "BTCUSDT", json.dumps(hostile))]}
    ) as ex:
        config = fast_config(ex, history=100, rest_timeout=60.0)
        engine = Engine(backend="cpu", interval=INTERVAL)
        client = KlineClient(engine, SYMBOLS, config, clock_ms=lambda: ex.now_ms, seed=5)
        every_bar = len(SYMBOLS) * (n_bars - start)
        with Served(client, max_bars=every_bar, max_seconds=60) as served:
            code, body = get(f"{served.url}/readyz")
            assert code == 503
            assert json.loads(body) == {
                "ready": False, "symbols": 3, "live": 0,
                "not_live": {s: "no bar yet (warming up)" for s in SYMBOLS},
            }  # fmt: skip
            assert get(f"{served.url}/healthz") == (200, b"ok\n")
            found = samples(get(f"{served.url}/metrics")[1].decode())
            assert found[(f"{PREFIX}_bars_total", (("source", "warmup"),))] == 0
            assert found[(f"{PREFIX}_symbols_live", ())] == 0
            ex.gate.set()
            served.wait(90)
            # the run is over, the server still up: the scrape sees the final counters
            code, body = get(f"{served.url}/readyz")
            assert (code, json.loads(body)) == (
                200, {"ready": True, "symbols": 3, "live": 3, "not_live": {}}
            )  # fmt: skip
            assert get(f"{served.url}/healthz") == (200, b"ok\n")
            page = get(f"{served.url}/metrics")
            stats = client.stats
    assert page[0] == 200
    found = samples(page[1].decode())
    assert stats.bars == every_bar and stats.warmup_bars == 3 * 100
    assert stats.rejections and found[(f"{PREFIX}_symbols_live", ())] == 3
    assert_metrics_match(found, stats)
    assert stats.status_line().split(" | ")[2].startswith(f"{stats.bars} bars")
    latency = stats.kline_to_publish_seconds
    assert 0 < latency.count <= stats.closed_klines and latency.sum > 0
    assert 0 < stats.step_seconds.count <= stats.bars and stats.step_seconds.sum > 0
    assert found[(f"{PREFIX}_queue_depth", ())] == 0
    assert found.get(("process_cpu_seconds_total", ()), 1) > 0


def test_collector_exposes_every_field_of_live_stats():
    """Every counter, gauge and histogram of the page is the ``LiveStats`` field it names,
    read at scrape time (the engine's rejections too; a REST weight field the feed may lack
    reads 0)."""
    config = LiveConfig(ws_url="ws://127.0.0.1:9", rest_url="http://127.0.0.1:9")
    engine = Engine(backend="cpu", interval=INTERVAL)
    client = KlineClient(engine, ["BTCUSDT", "ETHUSDT"], config)
    registry = CollectorRegistry()
    registry.register(LiveCollector(client))
    stats = client.stats
    for name, value in [("closed_klines", 11), ("backfilled_bars", 4), ("warmup_bars", 200),
                        ("rows_out", 17), ("previews", 3), ("messages", 40), ("connects", 2),
                        ("reconnects", 1), ("connect_failures", 4), ("rest_requests", 9),
                        ("backfills", 2), ("backfill_failures", 1),
                        ("last_bar_lag_ms", 1250.0)]:  # fmt: skip
        setattr(stats, name, value)
    stats.rejections.update({"bad_json": 2, "future_kline": 1})
    stats.disconnects.update({"idle_timeout": 1, "closed_by_server": 2})
    stats.http_retries.update({"429": 3})
    stats.step_seconds.observe(0.0003)
    stats.step_seconds.observe(7.0)
    stats.kline_to_publish_seconds.observe_many(np.array([0.0001, 0.002, 0.002, 30.0]))
    engine.step([("BTCUSDT", 60_000, float("nan"))])  # an engine rejection, after the start
    found = samples(generate_latest(registry).decode())
    assert_metrics_match(found, client.stats_now())
    assert dict(stats.engine_rejections) and found[(f"{PREFIX}_rest_weight_used", ())] == 0
    stats.rest_weight_used = 1234  # the REST limiter's fields
    stats.rest_limit_waits, stats.rest_limit_wait_s = 3, 1.5
    found = samples(generate_latest(registry).decode())
    assert found[(f"{PREFIX}_rest_weight_used", ())] == 1234
    assert found[(f"{PREFIX}_rest_limit_waits_total", ())] == 3
    assert found[(f"{PREFIX}_rest_limit_wait_seconds_total", ())] == 1.5
    assert found[(f"{PREFIX}_kline_to_publish_seconds_bucket", (("le", "+Inf"),))] == 4
    assert found[(f"{PREFIX}_kline_to_publish_seconds_bucket", (("le", "0.0025"),))] == 3


def unconnected_client() -> KlineClient:
    """A client of one symbol that is never run: the endpoints' server alone."""
    return KlineClient(
        Engine(backend="cpu", interval=INTERVAL), ["BTCUSDT"],
        LiveConfig(ws_url="ws://127.0.0.1:9", rest_url="http://127.0.0.1:9"),
    )  # fmt: skip


def test_ops_server_on_a_taken_port_is_an_error_and_frees_nothing():
    async def main():
        client = unconnected_client()
        async with OpsServer(client) as first:
            with pytest.raises(OSError):
                await OpsServer(client, port=first.port).start()
            status, _ = await asyncio.to_thread(get, f"{first.url}/healthz")
            assert status == 200

    asyncio.run(main())


def test_a_request_the_server_cannot_parse_is_one_log_line(caplog):
    """A request line over aiohttp's limit gets a 400; the log says so in one line, no
    traceback, and the endpoints go on serving."""
    import socket

    async def main():
        client = unconnected_client()
        async with OpsServer(client) as server:

            def oversized() -> bytes:
                with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
                    conn.sendall(b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
                    return conn.recv(200)

            answer = await asyncio.to_thread(oversized)
            status, _ = await asyncio.to_thread(get, f"{server.url}/healthz")
        return answer, status

    with caplog.at_level(logging.DEBUG, logger="atc_stream.ops_server.http"):
        answer, status = asyncio.run(main())
    assert answer.split(b"\r\n")[0].endswith(b" 400 Bad Request") and status == 200
    records = [r for r in caplog.records if r.name == "atc_stream.ops_server.http"]
    assert records and all(r.exc_info is None and "\n" not in r.getMessage() for r in records)
    assert all(r.levelname == "WARNING" and "LineTooLong" in r.getMessage() for r in records)
    assert "Traceback" not in caplog.text


# -- the command: --config, --log-format json, --metrics-port ------------------------------------


def realtime_exchange(symbols, start: int, n_bars: int, seed: int) -> tuple[FakeExchange, dict]:
    """An exchange of 1 s bars closing on the wall clock, bar ``start`` in progress now."""
    closes = make_bars(symbols, n_bars, seed=seed)
    now = int(time.time() * 1000)
    t0 = now - now % 1000 - start * 1000
    return FakeExchange(closes, start, t0=t0, interval="1s", realtime=True,
                        previews_per_bar=0), closes  # fmt: skip


def test_cli_config_file_with_flags_winning_and_json_logs(tmp_path):
    """Every option comes from the TOML file unless given as a flag; stderr is JSON lines."""
    from typer.testing import CliRunner

    from atc_stream.app.cli import app

    symbols = ["BTCUSDT", "ETHUSDT"]
    exchange, closes = realtime_exchange(symbols, 40, 400, seed=22)
    with exchange as ex:
        config = tmp_path / "live.toml"
        config.write_text(
            f'symbols = ["BTCUSDT", "ETHUSDT"]\ninterval = "1s"\nhistory = 30\n'
            f'ws-url = "{ex.ws_url}"\nrest_url = "{ex.rest_url}"\nbackend = "cpu"\n'
            f"previews = false\nstatus_every = 0.2\nmax_seconds = 60.0\nmax_bars = 4\n"
            f'output = "{tmp_path / "from_file.jsonl"}"\nlog_format = "json"\n'
        )
        out = tmp_path / "from_flag.jsonl"
        result = CliRunner().invoke(
            app, ["live", "--config", str(config), "--history", "25", "--output", str(out)]
        )
    assert result.exit_code == 0, result.output
    assert out.exists() and not (tmp_path / "from_file.jsonl").exists()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["interval"] for r in rows} == {"1s"} and {r["symbol"] for r in rows} == set(symbols)
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    done = next(line for line in lines if line["message"].startswith("live done"))
    assert done["warmup_bars"] == 2 * 25 and done["bars"] >= 4  # --history 25 won
    assert any("bars_per_second" in line for line in lines if line is not done)
    for r in rows:  # each row as compute over the history the warmup started at
        first = (min(x["time"] for x in rows if x["symbol"] == r["symbol"]) - ex.t0) // 1000
        i = (r["time"] - ex.t0) // 1000
        want = compute(closes[r["symbol"]][first - 24 :])["signal"][i - first + 24]
        assert (r["signal"] is None and np.isnan(want)) or r["signal"] == want


@pytest.mark.parametrize(
    "text, named",
    [
        ("symbols = 'BTCUSDT'\nhistroy = 10\n", "unknown key 'histroy'"),
        ("symbols = 'BTCUSDT'\nhistory = 'ten'\n", "key 'history' must be an integer"),
        ("symbols = 'BTCUSDT'\nhistory = -1\n", "key 'history': "),
        ("symbols = 'BTCUSDT'\nprevious = true\n", "unknown key 'previous'"),
        ("symbols = 'BTCUSDT'\nprevews = 1\n", "unknown key 'prevews'"),
        ("symbols = 'BTCUSDT'\npreviews = 1\n", "key 'previews' must be true or false"),
        ("symbols = 'BTCUSDT'\nmax_seconds = [1]\n", "key 'max_seconds' must be a number"),
        ("symbols = [1, 2]\n", "key 'symbols' must be a list of strings"),
        ("symbols = 'BTCUSDT'\nlog_format = 'xml'\n", "key 'log_format'"),
        ("symbols = 'BTCUSDT'\n[live]\nhistory = 3\n", "unknown key 'live'"),
        ("symbols = \n", "cannot read config file"),
        (
            "symbols = 'BTCUSDT'\nmax_bars = 3\nmax-bars = 6\n",
            "'max-bars' gives the option 'max_bars' a second time",
        ),
    ],
)
def test_cli_config_file_refuses_a_bad_key_in_one_line(tmp_path, run_main, text, named):
    config = tmp_path / "live.toml"
    config.write_text(text)
    code, stderr = run_main(["live", "--config", str(config), "--max-seconds", "1"])
    assert code == 2
    (line,) = stderr.strip().splitlines()
    assert line.startswith("atc-stream: error: ") and named in line and str(config) in line


def test_cli_config_file_given_twice_is_refused_not_half_read(tmp_path, run_main):
    """click keeps the last value of an option given twice: the first file's settings
    would be dropped without a word, so two files are refused."""
    first, second = tmp_path / "a.toml", tmp_path / "b.toml"
    first.write_text("symbols = 'BTCUSDT'\n")
    second.write_text("history = 3\n")
    code, stderr = run_main(
        ["live", "--config", str(first), "--config", str(second), "--max-seconds", "1"]
    )
    assert code == 2
    (line,) = stderr.strip().splitlines()
    assert "--config: given 2 times" in line and str(first) in line and str(second) in line


def test_cli_metrics_port_without_the_metrics_extra_names_it(tmp_path, run_main, monkeypatch):
    from atc_stream.app import extras

    real = extras.find_spec
    monkeypatch.setattr(
        extras, "find_spec", lambda name: None if name == "prometheus_client" else real(name)
    )
    code, stderr = run_main(["live", "--symbols", "BTCUSDT", "--metrics-port", "9",
                             "--max-seconds", "1"])  # fmt: skip
    assert code == 2 and "atc-stream[metrics]" in stderr and len(stderr.splitlines()) == 1


def test_cli_json_logs_carry_the_commands_own_refusal_of_a_flag(run_main):
    """A value the command itself refuses (not click's parser) is a JSON line too."""
    code, stderr = run_main(
        ["live", "--symbols", "BTCUSDT", "--route-shards", "2", "--log-format", "json"]
    )
    (line,) = stderr.strip().splitlines()
    record = json.loads(line)
    assert code == 2 and record["level"] == "error"
    assert record["message"].startswith("Invalid value: --route-shards needs --redis URL")


def _bad_key_file(tmp_path, log_format: str | None = None):
    config = tmp_path / "jj.toml"
    said = f'log_format = "{log_format}"\n' if log_format else ""
    config.write_text(f"symbols = 'BTCUSDT'\n{said}histroy = 10\n")
    return str(config)


@pytest.mark.parametrize(
    "args, named",
    [
        (lambda p: ["--config", _bad_key_file(p, "json")], "unknown key 'histroy'"),
        (lambda p: ["--config", _bad_key_file(p), "--log-format", "json"], "unknown key"),
        (lambda p: ["--log-format=json", "--config", _bad_key_file(p, "text")], "unknown key"),
        (lambda p: ["--symbols", "X", "--log-format", "json", "--history", "ten"], "--history"),
        (lambda p: ["--symbols", "X", "--interval", "7x", "--log-format", "json"], "--interval"),
        (lambda p: ["--log-format", "json", "--max-seconds", "1"], "Missing option '--symbols'"),
        (lambda p: ["--symbols", "X", "--log-format", "json", "--histroy", "3"], "--histroy"),
    ],
    ids=["file", "flag", "flag-over-file", "number", "interval", "missing", "unknown-option"],
)
def test_cli_json_logs_carry_usage_and_config_file_errors(tmp_path, run_main, args, named):
    """With JSON logs asked for (the flag, or else the file as far as it was read), the one
    line of a refused option or config file is a JSON record too."""
    code, stderr = run_main(["live", *args(tmp_path)])
    (line,) = stderr.strip().splitlines()
    record = json.loads(line)
    assert code == 2 and record["level"] == "error" and named in record["message"]
    assert not record["message"].startswith("atc-stream")


def test_cli_the_log_format_flag_wins_over_the_files_for_its_error_too(tmp_path, run_main):
    code, stderr = run_main(["live", "--config", _bad_key_file(tmp_path, "json"),
                             "--log-format", "text"])  # fmt: skip
    (line,) = stderr.strip().splitlines()
    assert code == 2 and line.startswith("atc-stream: error: Invalid value for --config: ")
    assert "unknown key 'histroy'" in line


def test_cli_json_warning_records_carry_no_level_in_their_message(tmp_path, run_main):
    from aiohttp import web
    from test_live_symbol_check import rest_server

    async def answer(request):
        return web.Response(status=503, text="down for maintenance")

    with rest_server(answer) as url:
        code, stderr = run_main(
            ["live", "--symbols", "BTCUSDT", "--rest-url", url, "--ws-url", "ws://127.0.0.1:9",
             "--max-seconds", "1.5", "--log-format", "json", "-o", str(tmp_path / "o.jsonl")]
        )  # fmt: skip
    records = [json.loads(line) for line in stderr.strip().splitlines()]
    warnings = [r for r in records if r["level"] == "warning"]
    assert code == 2 and warnings, records
    assert all(r["message"].startswith("listing the symbols of binance: HTTP 503; retry ")
               for r in warnings)  # fmt: skip
    assert records[-1]["message"].startswith("cannot list the symbols of binance: ")


# -- the config file: flags undo its settings, its values checked as its own -------------------


def test_cli_every_on_off_flag_of_live_has_its_off_form(capsys, monkeypatch):
    import typer

    from atc_stream.app.cli import app

    live = typer.main.get_command(app).commands["live"]
    flags = [p for p in live.params if getattr(p, "is_bool_flag", False) and p.name != "help"]
    assert {p.name for p in flags} >= {"resume", "events_before_ready", "previews"}
    assert all(p.secondary_opts == [f"--no-{p.opts[0][2:]}"] for p in flags), [
        (p.name, p.secondary_opts) for p in flags
    ]
    monkeypatch.setenv("COLUMNS", "200")  # the help's table, not cut at 80
    with pytest.raises(SystemExit):
        from atc_stream.app.cli import main

        main(["live", "--help"])
    shown = capsys.readouterr().out
    assert "--no-resume" in shown and "--no-events-before-ready" in shown


@pytest.mark.parametrize(
    "undo, stops_at",
    [(["--max-seconds=", "--max-bars", "4"], 4), (["--max-bars", "", "--max-seconds", "3"], 2)],
)
def test_cli_flags_undo_what_the_config_file_sets(tmp_path, run_main, monkeypatch, undo, stops_at):
    """The file turns on --resume and --events-before-ready and sets --redis (unreachable:
    the run would fail), --max-seconds and --max-bars (the run would stop at once or at
    bar 1): --no-FLAG and an empty value undo each. Its ~ paths are the home directory's."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    (home / "signals.jsonl").write_text('{"symbol": "BTCUSDT", "time": 1}\n')  # resume: refused
    exchange, _ = realtime_exchange(["BTCUSDT", "ETHUSDT"], 40, 400, seed=25)
    with exchange as ex:
        config = tmp_path / "live.toml"
        config.write_text(
            f'symbols = ["BTCUSDT", "ETHUSDT"]\ninterval = "1s"\nhistory = 20\n'
            f'ws_url = "{ex.ws_url}"\nrest_url = "{ex.rest_url}"\nbackend = "cpu"\n'
            'previews = false\nstatus_every = 0\nlog_format = "json"\n'
            'redis = "redis://127.0.0.1:9/0"\nresume = true\nevents_before_ready = true\n'
            'snapshot_dir = "~/snaps"\noutput = "~/signals.jsonl"\n'
            "max_seconds = 0.2\nmax_bars = 1\n"
        )
        code, stderr = run_main(["live", "--config", str(config), "--redis", "", "--no-resume",
                                 "--no-events-before-ready", *undo])  # fmt: skip
    assert code == 0, stderr
    records = [json.loads(line) for line in stderr.splitlines()]
    done = next(r for r in records if r["message"] == "live done")
    assert done["bars"] >= stops_at
    rows = [json.loads(line) for line in (home / "signals.jsonl").read_text().splitlines()]
    assert rows and all(r["interval"] == "1s" for r in rows)  # the old line is gone
    assert any((home / "snaps").iterdir()) and not any(work.iterdir())  # no ./~ made


@pytest.mark.parametrize(
    "text, said",
    [
        ("max_seconds = -5\n", "key 'max_seconds': must be > 0, got -5.0"),
        ("max-seconds = nan\n", "key 'max-seconds': must be > 0, got nan"),
        ("interval = '7x'\n", "key 'interval': interval must look like 1s"),
        ("idle_timeout = 0\n", "key 'idle_timeout': must be > 0, got 0"),
        ("ws_url = 'stream.example'\n", "key 'ws_url': must be a URL like scheme://host"),
        ("rest-url = 'nope'\n", "key 'rest-url': must be a URL like scheme://host"),
    ],
)
def test_cli_a_bad_value_in_the_config_file_names_the_file_and_key(tmp_path, run_main, text, said):
    config = tmp_path / "live.toml"
    config.write_text("symbols = 'BTCUSDT'\n" + text)
    code, stderr = run_main(["live", "--config", str(config)])
    (line,) = stderr.strip().splitlines()
    assert code == 2 and f"{config}: {said}" in line, line
    assert "'--max-seconds'" not in line and "--ws-url" not in line


def test_cli_the_same_bad_value_as_a_flag_names_the_flag(run_main):
    code, stderr = run_main(["live", "--symbols", "BTCUSDT", "--max-seconds", "-5"])
    (line,) = stderr.strip().splitlines()
    assert code == 2
    assert line.startswith("atc-stream: error: Invalid value for --max-seconds: must be > 0")


def test_cli_a_taken_metrics_port_is_refused_before_the_output_is_touched(tmp_path, run_main):
    symbols = ["BTCUSDT"]
    exchange, _ = realtime_exchange(symbols, 40, 400, seed=23)
    output = tmp_path / "keep.jsonl"
    output.write_text("a row from before\n")
    with socket.socket() as taken, exchange as ex:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, stderr = run_main(
            ["live", "--symbols", "BTCUSDT", "--interval", "1s", "--history", "20",
             "--ws-url", ex.ws_url, "--rest-url", ex.rest_url, "--backend", "cpu",
             "--max-seconds", "3", "-o", str(output), "--metrics-port", str(port)]
        )  # fmt: skip
    assert code == 2
    (line,) = stderr.strip().splitlines()
    assert line.startswith(f"atc-stream: error: --metrics-port: cannot listen on 127.0.0.1:{port}")
    assert output.read_text() == "a row from before\n"


@pytest.mark.parametrize("name", ["signals.csv", "signals.parquet/"])
def test_cli_previews_are_written_to_csv_and_never_to_parquet(tmp_path, run_main, name):
    exchange, _ = realtime_exchange(["BTCUSDT"], 40, 400, seed=24)
    exchange.previews_per_bar = 2
    output = str(tmp_path / name)
    with exchange as ex:
        code, stderr = run_main(
            ["live", "--symbols", "BTCUSDT", "--interval", "1s", "--history", "20",
             "--ws-url", ex.ws_url, "--rest-url", ex.rest_url, "--backend", "cpu",
             "--max-bars", "3", "--max-seconds", "30", "-o", output]
        )  # fmt: skip
    assert code == 0, stderr
    if name.endswith(".csv"):
        import csv

        rows = list(csv.DictReader(open(output)))
        assert any(row["provisional"] == "true" for row in rows)
    else:
        import pyarrow.parquet as pq

        table = pq.read_table(output.rstrip("/"))
        assert table.num_rows > 0 and not any(table.column("provisional").to_pylist())
