"""SIGTERM ends ``atc-stream live`` (a subprocess, many symbols live on a local exchange
whose 1 s bars close on the wall clock) after the current batch, with a final snapshot and
exit 0 within 5 s; ``--resume`` then goes on so that the output holds every closed row
exactly once, each equal to ``compute`` over the same closes, i.e. to what an
uninterrupted run writes (the live tests show a run equals ``compute``).

``ATC_STREAM_SIGTERM_SYMBOLS`` sets the number of symbols (default 1,000, the case the
5 s promise is made for; the run takes about 20 s, most of it two process starts).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("prometheus_client")
pytest.importorskip("aiohttp")
pytest.importorskip("websockets")

from test_live_ops import PREFIX, free_port, get, realtime_exchange, samples  # noqa: E402

from atc_stream import compute  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SYMBOL_COUNT = int(os.environ.get("ATC_STREAM_SIGTERM_SYMBOLS", "1000"))
#: Longest time from SIGTERM to the process's exit.
SHUTDOWN_LIMIT_S = 5.0
#: Generous waits for events (start-up, readiness, bars): a busy machine is no failure.
WAIT_S = 240.0


def start_live(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")])}  # fmt: skip
    with open(log, "w") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "atc_stream", "live", *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, env=env,
        )  # fmt: skip


def wait_for(what: str, check, process: subprocess.Popen, log: Path) -> None:
    """Returns once ``check()`` is true; fails when the process ended first or after
    ``WAIT_S``."""
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert process.poll() is None, f"live ended ({process.returncode}):\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {what} within {WAIT_S} s:\n{log.read_text()}"
        time.sleep(0.1)


def answered(url: str) -> tuple[int, bytes]:
    try:
        return get(url, timeout=5)
    except OSError:  # not listening yet
        return 0, b""


def test_sigterm_stops_within_5_s_with_a_final_snapshot_and_resume_writes_each_row_once(
    tmp_path,
):
    symbols = [f"S{k:04d}" for k in range(SYMBOL_COUNT)]
    exchange, closes = realtime_exchange(symbols, 40, 400, seed=31)
    out, snaps = tmp_path / "live.jsonl", tmp_path / "snaps"
    port = free_port()
    with exchange as ex:
        common = [
            "--symbols", ",".join(symbols), "--interval", "1s", "--history", "1000",
            "--ws-url", ex.ws_url, "--rest-url", ex.rest_url, "--backend", "cpu",
            "--no-previews", "--status-every", "0", "--max-streams-per-connection", "250",
            "--snapshot-dir", str(snaps), "--output", str(out), "--max-seconds", "600",
            "--log-format", "json",
        ]  # fmt: skip
        first_log = tmp_path / "first.log"
        first = start_live([*common, "--metrics-port", str(port)], first_log)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for("readiness", lambda: answered(f"{url}/readyz")[0] == 200, first, first_log)

            def websocket_bars() -> float:
                page = samples(answered(f"{url}/metrics")[1].decode())
                return page.get((f"{PREFIX}_bars_total", (("source", "websocket"),)), 0)

            wait_for("bars", lambda: websocket_bars() >= 2 * len(symbols), first, first_log)
            signalled = time.monotonic()
            first.send_signal(signal.SIGTERM)
            code = first.wait(timeout=60)
            shutdown = time.monotonic() - signalled
        finally:
            if first.poll() is None:
                first.kill()
        lines = [json.loads(line) for line in first_log.read_text().splitlines()]
        print(f"\n{len(symbols)} symbols: exit {shutdown:.2f} s after SIGTERM")
        assert code == 0, first_log.read_text()
        assert shutdown < SHUTDOWN_LIMIT_S, f"{shutdown:.2f} s after SIGTERM"
        messages = [line["message"] for line in lines]
        assert any("SIGTERM: stopping after the current batch" in m for m in messages)
        assert any(m.startswith("final snapshot ") for m in messages), messages
        written = len(out.read_text().splitlines())

        second_log = tmp_path / "second.log"
        second = start_live([*common, "--resume", "--max-bars", str(3 * len(symbols))],
                            second_log)  # fmt: skip
        try:
            assert second.wait(timeout=WAIT_S) == 0, second_log.read_text()
        finally:
            if second.poll() is None:
                second.kill()
        t0 = ex.t0
    messages = [json.loads(line)["message"] for line in second_log.read_text().splitlines()]
    assert any(m.startswith("restored snapshot") for m in messages), messages
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) >= written + 3 * len(symbols)
    seen = Counter((r["symbol"], r["time"]) for r in rows)
    assert set(seen.values()) == {1}, [k for k, n in seen.items() if n > 1][:5]
    by_symbol: dict[str, list] = {}
    for r in rows:
        by_symbol.setdefault(r["symbol"], []).append(r)
    assert set(by_symbol) == set(symbols)
    for symbol, mine in by_symbol.items():
        bars = sorted((r["time"] - t0) // 1000 for r in mine)
        assert bars == list(range(bars[0], bars[-1] + 1)), symbol  # no bar left out
        want = compute(closes[symbol])["signal"]  # the warmup starts at bar 0: history 1000
        for r in mine:
            expected = want[(r["time"] - t0) // 1000]
            assert (r["signal"] is None and np.isnan(expected)) or r["signal"] == expected


def test_sigterm_during_start_up_is_one_line_and_exit_0(tmp_path):
    """SIGTERM while live still starts up (here: waiting on an exchange that accepts the
    connection and never answers), before it handles the signal as a run: one line, exit
    0, nothing written, no traceback."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    log = tmp_path / "live.log"
    url = f"127.0.0.1:{port}"
    process = start_live(
        ["--symbols", "BTCUSDT", "--rest-url", f"http://{url}", "--ws-url", f"ws://{url}",
         "--backend", "cpu", "-o", str(tmp_path / "out.jsonl")], log,
    )  # fmt: skip
    try:
        wait_for("a request to the exchange", lambda: bool(held), process, log)
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
        listener.close()
        for conn in held:
            conn.close()
    text = log.read_text()
    assert code == 0, text
    assert text.strip().splitlines()[-1] == (
        "atc-stream: SIGTERM: stopped during start-up, before any row was written"
    )
    assert "Traceback" not in text


def stop_a_live_run(tmp_path: Path, *signals: int, seed: int) -> tuple[int, str]:
    """Two symbols live on a local exchange until rows are written, then ``signals`` 20 ms
    apart: the exit status and the log."""
    exchange, _ = realtime_exchange(["BTCUSDT", "ETHUSDT"], 40, 400, seed=seed)
    log = tmp_path / "live.log"
    out = tmp_path / "out.jsonl"
    with exchange as ex:
        process = start_live(
            ["--symbols", "BTCUSDT,ETHUSDT", "--interval", "1s", "--history", "20",
             "--ws-url", ex.ws_url, "--rest-url", ex.rest_url, "--backend", "cpu",
             "--status-every", "0", "--snapshot-dir", str(tmp_path / "snaps"),
             "-o", str(out), "--max-seconds", "120"], log,
        )  # fmt: skip
        try:
            wait_for("rows", lambda: out.exists() and out.stat().st_size > 0, process, log)
            for k, signum in enumerate(signals):
                if k:
                    time.sleep(0.02)
                process.send_signal(signum)
            code = process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
    return code, log.read_text()


def test_a_second_sigterm_during_the_stop_still_ends_it_with_exit_0(tmp_path):
    """Service managers send SIGTERM again: the one that comes while the stop runs, or
    while the interpreter shuts down after it, must not turn the clean stop into a kill."""
    code, text = stop_a_live_run(tmp_path, signal.SIGTERM, signal.SIGTERM, seed=32)
    assert code == 0, text
    assert "final snapshot" in text and "Traceback" not in text


def test_ctrl_c_stops_live_cleanly_with_exit_130(tmp_path):
    """SIGINT stops a live run as SIGTERM does (the current batch, a final snapshot), and
    exits 130 as every command's Ctrl-C does, so a script tells it from a run that ended."""
    code, text = stop_a_live_run(tmp_path, signal.SIGINT, seed=33)
    assert code == 130, text
    assert "final snapshot" in text and "live done" in text and "Traceback" not in text
