"""``atc-stream live`` killed (SIGKILL) during its start-up, once rows were written and
before any periodic snapshot: ``--resume`` writes every row exactly once."""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("prometheus_client")
pytest.importorskip("aiohttp")
pytest.importorskip("websockets")

from exchange_emulators import make_bars  # noqa: E402
from test_live_exits import HeldHistory, snapshot_files  # noqa: E402
from test_live_sigterm import start_live, wait_for  # noqa: E402

from atc_stream import compute  # noqa: E402


def test_sigkill_once_start_up_wrote_rows_resumes_with_every_row_once(tmp_path):
    """One symbol is warmed up and its rows written while the other's REST history is
    held; the process is then killed. The fresh run took a snapshot before its first row
    (no periodic one is due yet), so ``--resume`` cuts the output back to it, warms both
    symbols up as of the first run's start and writes each row once, equal to
    ``compute``."""
    symbols = ["BTCUSDT", "ETHUSDT"]
    closes = make_bars(symbols, 400, seed=57)
    now = int(time.time() * 1000)
    exchange = HeldHistory(closes, 40, t0=now - now % 1000 - 40_000, interval="1s",
                           realtime=True, previews_per_bar=0)  # fmt: skip
    out, snaps = tmp_path / "out.jsonl", tmp_path / "snaps"
    positions = tmp_path / "positions.jsonl"
    with exchange as ex:
        common = ["--symbols", ",".join(symbols), "--interval", "1s", "--history", "1000",
                  "--backend", "cpu", "--no-previews", "--ws-url", ex.ws_url,
                  "--rest-url", ex.rest_url, "--snapshot-dir", str(snaps),
                  "--snapshot-every", "100000", "-o", str(out), "--strategy", "max_hold=2",
                  "--positions", str(positions)]  # fmt: skip
        ex.held = {"ETHUSDT"}  # its history waits, BTCUSDT's does not
        ex.gate.clear()
        log = tmp_path / "first.log"
        first = start_live([*common, "--status-every", "0.1", "--log-format", "json",
                            "--max-seconds", "120"], log)  # fmt: skip

        def rows_out() -> int:
            counts = [0]
            for line in log.read_text().splitlines():
                with contextlib.suppress(ValueError):  # a line still being written
                    counts.append(json.loads(line).get("rows_out") or 0)
            return max(counts)

        try:
            wait_for("ETHUSDT's history asked for",
                     lambda: any(q.get("symbol") == "ETHUSDT" for q in ex.rest_requests),
                     first, log)  # fmt: skip
            wait_for("rows", lambda: rows_out() > 0, first, log)
            first.kill()
            first.wait(timeout=30)
        finally:
            if first.poll() is None:
                first.kill()
            ex.gate.set()
        assert snapshot_files(snaps), log.read_text()
        time.sleep(1.2)  # a bar closes while it is down: both symbols' rows must cover it
        down_until = ex.cursor
        ex.held = set()
        log = tmp_path / "second.log"
        second = start_live([*common, "--resume", "--status-every", "0", "--max-seconds", "6"],
                            log)  # fmt: skip
        try:
            assert second.wait(timeout=120) == 0, log.read_text()
        finally:
            if second.poll() is None:
                second.kill()
        t0 = ex.t0
    text = log.read_text()
    assert "restored snapshot" in text, text
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    seen = Counter((r["symbol"], r["time"]) for r in rows)
    assert set(seen.values()) == {1}, [k for k, n in seen.items() if n > 1][:5]
    held = Counter((r["symbol"], r["time"]) for r in map(json.loads, positions.open()))
    assert set(held.values()) == {1} and set(held) == set(seen)  # the strategy's too
    bars = {s: sorted((r["time"] - t0) // 1000 for r in rows if r["symbol"] == s)
            for s in symbols}  # fmt: skip
    assert bars["ETHUSDT"][0] == bars["BTCUSDT"][0], bars  # warmed up as of the first start
    for symbol, mine in bars.items():
        assert mine == list(range(mine[0], mine[-1] + 1)), symbol  # no bar left out
        assert mine[-1] >= down_until, (symbol, mine[-1], down_until)
        want = compute(closes[symbol])["signal"]
        for r in rows:
            if r["symbol"] == symbol:
                expected = want[(r["time"] - t0) // 1000]
                assert (r["signal"] is None and np.isnan(expected)) or r["signal"] == expected


def test_resume_without_a_snapshot_refuses_strategy_outputs_of_an_earlier_run(tmp_path):
    """``--resume`` finding no snapshot refuses ``--trades``/``--positions`` files that
    hold an earlier run's rows (exit 2, the files as they were), as it does ``-o``."""
    from typer.testing import CliRunner

    from atc_stream.app.cli import app

    closes = make_bars(["BTCUSDT"], 60, seed=58)
    now = int(time.time() * 1000)
    earlier = '{"symbol": "BTCUSDT", "time": 1}\n'
    with HeldHistory(closes, 40, t0=now - now % 1000 - 40_000, interval="1s") as ex:
        for flag in ("--trades", "--positions"):
            kept = tmp_path / f"{flag[2:]}.jsonl"
            kept.write_text(earlier)
            result = CliRunner().invoke(app, [
                "live", "--symbols", "BTCUSDT", "--interval", "1s", "--backend", "cpu",
                "--ws-url", ex.ws_url, "--rest-url", ex.rest_url, "--max-seconds", "5",
                "--snapshot-dir", str(tmp_path / "snaps"), "--resume", "--strategy",
                "max_hold=2", "-o", str(tmp_path / f"{flag[2:]}-out.jsonl"), flag, str(kept),
            ])  # fmt: skip
            assert result.exit_code == 2, result.output
            assert "already holds the output of an earlier run" in result.output
            assert kept.read_text() == earlier


@pytest.mark.parametrize("previews", [False, True])
def test_sigkill_of_a_run_without_history_resumes(tmp_path, previews):
    """``--history 0``: no warmup, the first rows are a step's (or a preview's). A kill
    before any periodic snapshot still finds the fresh run's first snapshot, taken before
    them: ``--resume`` starts (it refused an output holding rows with no snapshot) and
    writes each (symbol, time) once."""
    symbols = ["BTCUSDT", "ETHUSDT"]
    closes = make_bars(symbols, 400, seed=58)
    now = int(time.time() * 1000)
    exchange = HeldHistory(closes, 40, t0=now - now % 1000 - 40_000, interval="1s",
                           realtime=True, previews_per_bar=2 if previews else 0)  # fmt: skip
    out, snaps = tmp_path / "out.jsonl", tmp_path / "snaps"
    with exchange as ex:
        common = ["--symbols", ",".join(symbols), "--interval", "1s", "--history", "0",
                  "--backend", "cpu", "--ws-url", ex.ws_url, "--rest-url", ex.rest_url,
                  "--snapshot-dir", str(snaps), "--snapshot-every", "100000", "-o", str(out),
                  *([] if previews else ["--no-previews"])]  # fmt: skip
        first = start_live([*common, "--max-seconds", "120"], tmp_path / "first.log")
        try:
            wait_for("rows", lambda: out.exists() and out.stat().st_size > 0, first,
                     tmp_path / "first.log")  # fmt: skip
            first.kill()
            first.wait(timeout=30)
        finally:
            if first.poll() is None:
                first.kill()
        assert snapshot_files(snaps)
        log = tmp_path / "second.log"
        second = start_live([*common, "--resume", "--max-seconds", "4"], log)
        try:
            assert second.wait(timeout=120) == 0, log.read_text()
        finally:
            if second.poll() is None:
                second.kill()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    closed = Counter((r["symbol"], r["time"]) for r in rows if not r["provisional"])
    assert closed and set(closed.values()) == {1}, [k for k, n in closed.items() if n > 1][:5]
