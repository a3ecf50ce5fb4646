"""How ``atc-stream live`` ends and what it leaves, on real local exchanges (1 s bars on
the wall clock) and real processes: a reader that closes stdout ends it quietly with
status 141; ``-o /dev/null`` is an output (``replay`` and ``demo`` share the check); a
SIGTERM while the warmup waits for the exchange's history leaves the snapshots as they
were, and one after start-up wrote rows takes a final snapshot that ``--resume`` goes on
from exactly; a Ctrl-C while the command loads is one line and status 130, never a
traceback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("prometheus_client")
pytest.importorskip("aiohttp")
pytest.importorskip("websockets")

from exchange_emulators import FakeExchange, make_bars  # noqa: E402
from test_live_ops import realtime_exchange  # noqa: E402
from test_live_sigterm import REPO, start_live, wait_for  # noqa: E402

from atc_stream import compute  # noqa: E402

START_UP_STOP = "atc-stream: SIGTERM: stopped during start-up, before any row was written"
START_UP_SUMMARY = "atc-stream: live stopped during start-up (nothing written, no snapshot taken)"


def assert_stopped_in_start_up(text: str) -> None:
    """``text`` (a log) ends as a run stopped during start-up: its line, then a short
    summary (connections, REST), with no final snapshot and no summary of a run."""
    lines = text.strip().splitlines()
    assert START_UP_STOP in lines and START_UP_SUMMARY in lines, text
    summary = lines[lines.index(START_UP_SUMMARY) + 1 :]
    assert [line.split()[0] for line in summary] == [
        "symbols", "messages", "disconnects", "REST", "REST",
    ], text  # fmt: skip
    assert "final snapshot" not in text and "live done" not in text, text
    assert "Traceback" not in text, text


def live_env() -> dict[str, str]:
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def one_second_bars(symbols: list[str]) -> list[str]:
    """The options of a run on ``realtime_exchange``'s 1 s bars."""
    return ["--symbols", ",".join(symbols), "--interval", "1s", "--history", "20",
            "--backend", "cpu", "--status-every", "0"]  # fmt: skip


# -- stdout closed by its reader ---------------------------------------------------------------


def test_a_reader_that_closes_stdout_ends_live_quietly_with_141(tmp_path):
    """``atc-stream live ... | head -1``: the next row finds no reader; the run ends
    without a word more (no error, no summary, no traceback), status 141 as ``replay``'s."""
    exchange, _ = realtime_exchange(["BTCUSDT"], 40, 400, seed=51)
    exchange.previews_per_bar = 2  # a row to write every half second
    with exchange as ex:
        process = subprocess.Popen(
            [sys.executable, "-m", "atc_stream", "live", *one_second_bars(["BTCUSDT"]),
             "--ws-url", ex.ws_url, "--rest-url", ex.rest_url, "--max-seconds", "60"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=live_env(),
        )  # fmt: skip
        try:
            first = process.stdout.readline()
            process.stdout.close()  # as `head -1` does once it has its line
            err = process.stderr.read().decode()
            code = process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
    assert json.loads(first)["symbol"] == "BTCUSDT"
    assert code == 141, err
    (line,) = err.strip().splitlines()  # the start line, nothing after it
    assert line.startswith("atc-stream: live 1 symbols x 1s from binance"), err


# -- a device as the output --------------------------------------------------------------------


def test_live_writes_to_dev_null_and_resumes_there(tmp_path, run_main):
    """``-o /dev/null`` (only Redis or the metrics wanted): accepted, snapshots taken, and
    ``--resume`` with it again has nothing to cut back. The trades may go there too."""
    with realtime_exchange(["BTCUSDT", "ETHUSDT"], 40, 400, seed=52)[0] as ex:
        common = ["live", *one_second_bars(["BTCUSDT", "ETHUSDT"]), "--ws-url", ex.ws_url,
                  "--rest-url", ex.rest_url, "--max-seconds", "60", "--max-bars", "2",
                  "-o", os.devnull]  # fmt: skip
        snaps = ["--snapshot-dir", str(tmp_path / "snaps")]
        code, stderr = run_main([*common, *snaps])
        assert code == 0, stderr
        assert "final snapshot" in stderr and "live done" in stderr
        code, stderr = run_main([*common, *snaps, "--resume"])
        assert code == 0, stderr
        assert "restored snapshot" in stderr and "final snapshot" in stderr
        code, stderr = run_main([*common, "--strategy", "direction=long_only",
                                 "--trades", os.devnull])  # fmt: skip
        assert code == 0, stderr


def test_replay_and_demo_write_to_dev_null_as_live_does(tmp_path, run_main):
    """The output check ``live`` uses is theirs too: a device is a JSONL stream there."""
    bars = tmp_path / "bars.csv"
    closes = make_bars(["BTCUSDT"], 120, seed=53)["BTCUSDT"]
    rows = (f"BTCUSDT,{1_700_000_000_000 + 60_000 * i},{c}\n" for i, c in enumerate(closes))
    bars.write_text("symbol,time,close\n" + "".join(rows))
    replay = ["replay", str(bars), "-o", os.devnull, "--no-progress",
              "--snapshot-dir", str(tmp_path / "snaps")]  # fmt: skip
    code, stderr = run_main([*replay, "--warmup", "70"])
    assert code == 0, stderr
    code, stderr = run_main([*replay, "--resume"])
    assert code == 0, stderr
    code, stderr = run_main(["demo", "--symbols", "2", "--bars", "150", "--warmup", "80",
                             "-o", os.devnull, "--no-progress"])  # fmt: skip
    assert code == 0, stderr
    code, stderr = run_main(["demo", "--symbols", "2", "--bars", "150", "-o", "signals.txt"])
    assert code == 2 and "cannot tell the output format of 'signals.txt'" in stderr


# -- SIGTERM during the warmup -----------------------------------------------------------------


class HeldHistory(FakeExchange):
    """Klines over REST wait for ``gate`` (only those of the symbols in ``held``, when it
    names any): a client's warmup (or backfill) waits with them."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.gate.set()
        self.held: set[str] = set()

    async def _klines(self, request, fault):
        symbol = request.query.get("symbol")
        while not self.gate.is_set() and (not self.held or symbol in self.held):
            await asyncio.sleep(0.005)
        return await super()._klines(request, fault)


@contextlib.contextmanager
def sigterm_after(process: subprocess.Popen, gate=None):
    """Runs the block, then SIGTERMs ``process`` and puts its exit status in the list
    yielded; whatever happens, a process still running is killed and the emulator's
    held requests (``gate``) let go."""
    status: list[int] = []
    try:
        yield status
        process.send_signal(signal.SIGTERM)
        status.append(process.wait(timeout=60))
    finally:
        if process.poll() is None:
            process.kill()
        if gate is not None:
            gate.set()


def snapshot_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_sigterm_while_the_warmup_waits_for_history_leaves_the_snapshots_as_they_were(
    tmp_path,
):
    """A fresh run stopped while its REST history is asked for writes no snapshot (one of
    an engine without a bar would be what ``--resume`` restores), and a resumed one
    stopped while its backfill waits leaves the newest snapshot the newest: one line,
    exit 0, no summary."""
    closes = make_bars(["BTCUSDT"], 400, seed=54)
    now = int(time.time() * 1000)
    exchange = HeldHistory(closes, 40, t0=now - now % 1000 - 40_000, interval="1s",
                           realtime=True, previews_per_bar=0)  # fmt: skip
    fresh, resumed = tmp_path / "fresh", tmp_path / "resumed"
    fresh.mkdir()
    resumed.mkdir()
    with exchange as ex:
        common = [*one_second_bars(["BTCUSDT"]), "--ws-url", ex.ws_url, "--rest-url",
                  ex.rest_url, "--max-seconds", "120"]  # fmt: skip

        def stopped_while_held(args: list[str], log: Path) -> tuple[int, str]:
            ex.gate.clear()
            asked = len(ex.rest_requests)
            process = start_live([*common, *args], log)
            with sigterm_after(process, ex.gate) as status:
                wait_for("a klines request", lambda: len(ex.rest_requests) > asked, process, log)
                time.sleep(0.3)  # the request waits: the run is in its start-up
            return status[0], log.read_text()

        code, text = stopped_while_held(
            ["--snapshot-dir", str(fresh / "snaps"), "-o", str(fresh / "out.jsonl")],
            tmp_path / "fresh.log",
        )  # fmt: skip
        assert code == 0, text
        assert_stopped_in_start_up(text)
        assert snapshot_files(fresh / "snaps") == [] and (fresh / "out.jsonl").read_text() == ""

        resumed_args = ["--snapshot-dir", str(resumed / "snaps"), "-o",
                        str(resumed / "out.jsonl")]  # fmt: skip
        first = start_live([*common, *resumed_args, "--max-bars", "2"], tmp_path / "first.log")
        assert first.wait(timeout=120) == 0, (tmp_path / "first.log").read_text()
        before = snapshot_files(resumed / "snaps")
        rows = (resumed / "out.jsonl").read_text()
        assert before and rows
        time.sleep(1.2)  # a bar closes while it is down: the resume backfills it
        code, text = stopped_while_held([*resumed_args, "--resume"], tmp_path / "second.log")
    assert code == 0, text
    assert "restored snapshot" in text
    assert_stopped_in_start_up(text)
    assert snapshot_files(resumed / "snaps") == before
    assert (resumed / "out.jsonl").read_text() == rows


def test_sigterm_once_start_up_wrote_rows_takes_a_final_snapshot_resume_goes_on_exactly(
    tmp_path,
):
    """The histories come in batches: one symbol is warmed up, its rows written, while the
    other's REST history is still held. A SIGTERM then is an ordinary stop (a final
    snapshot, the summary), since only a snapshot accounts for the rows on ``--resume``
    (without one it would refuse the output). The resumed run keeps them, warms the other
    symbol up as of the first run's start, and so writes every row once, each symbol's
    from the same first bar as an uninterrupted run, each equal to ``compute``."""
    symbols = ["BTCUSDT", "ETHUSDT"]
    closes = make_bars(symbols, 400, seed=56)
    now = int(time.time() * 1000)
    exchange = HeldHistory(closes, 40, t0=now - now % 1000 - 40_000, interval="1s",
                           realtime=True, previews_per_bar=0)  # fmt: skip
    out, snaps = tmp_path / "out.jsonl", tmp_path / "snaps"
    with exchange as ex:
        common = ["--symbols", ",".join(symbols), "--interval", "1s", "--history", "1000",
                  "--backend", "cpu", "--no-previews", "--ws-url", ex.ws_url,
                  "--rest-url", ex.rest_url, "--snapshot-dir", str(snaps),
                  "-o", str(out)]  # fmt: skip
        ex.held = {"ETHUSDT"}  # its history waits, BTCUSDT's does not
        ex.gate.clear()
        log = tmp_path / "first.log"
        # the status lines' fields count the rows written (the file's buffer holds them)
        first = start_live([*common, "--status-every", "0.1", "--log-format", "json",
                            "--max-seconds", "120"], log)  # fmt: skip

        def rows_out() -> int:
            counts = [0]
            for line in log.read_text().splitlines():
                with contextlib.suppress(ValueError):  # a line still being written
                    counts.append(json.loads(line).get("rows_out") or 0)
            return max(counts)

        with sigterm_after(first, ex.gate) as status:
            # BTCUSDT's warmup row is written while ETHUSDT's request waits: in start-up
            wait_for("ETHUSDT's history asked for",
                     lambda: any(q.get("symbol") == "ETHUSDT" for q in ex.rest_requests),
                     first, log)  # fmt: skip
            wait_for("rows", lambda: rows_out() > 0, first, log)
        code = status[0]
        text = log.read_text()
        assert code == 0, text
        assert "SIGTERM: stopping after the current batch" in text
        assert "stopped during start-up" not in text
        assert "final snapshot" in text and "live done" in text, text
        written = out.read_bytes()
        assert {json.loads(line)["symbol"] for line in written.splitlines()} == {"BTCUSDT"}
        time.sleep(1.2)  # a bar closes while it is down: both symbols' rows must cover it
        down_until = ex.cursor
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
    assert "restored snapshot" in text and "final snapshot" in text, text
    assert out.read_bytes().startswith(written)  # the first run's rows, kept
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    seen = Counter((r["symbol"], r["time"]) for r in rows)
    assert set(seen.values()) == {1}, [k for k, n in seen.items() if n > 1][:5]
    bars = {s: sorted((r["time"] - t0) // 1000 for r in rows if r["symbol"] == s)
            for s in symbols}  # fmt: skip
    assert bars["ETHUSDT"][0] == bars["BTCUSDT"][0], bars  # warmed up as of the first start
    for symbol, mine in bars.items():
        assert mine == list(range(mine[0], mine[-1] + 1)), symbol  # no bar left out
        assert mine[-1] >= down_until, (symbol, mine[-1], down_until)
        want = compute(closes[symbol])["signal"]  # the warmup starts at bar 0: history 1000
        for r in rows:
            if r["symbol"] == symbol:
                expected = want[(r["time"] - t0) // 1000]
                assert (r["signal"] is None and np.isnan(expected)) or r["signal"] == expected


def test_sigterm_before_any_row_leaves_a_csv_header_that_resume_starts_afresh_over(tmp_path):
    """A CSV output gets its header when it is opened: a run stopped before its first row
    leaves that line alone, no rows, and ``--resume`` (no snapshot) starts afresh over it
    rather than refuse it as an earlier run's output."""
    closes = make_bars(["BTCUSDT"], 400, seed=57)
    now = int(time.time() * 1000)
    exchange = HeldHistory(closes, 40, t0=now - now % 1000 - 40_000, interval="1s",
                           realtime=True, previews_per_bar=0)  # fmt: skip
    out = tmp_path / "out.csv"
    with exchange as ex:
        common = [*one_second_bars(["BTCUSDT"]), "--no-previews", "--ws-url", ex.ws_url,
                  "--rest-url", ex.rest_url, "--snapshot-dir", str(tmp_path / "snaps"),
                  "-o", str(out)]  # fmt: skip
        ex.gate.clear()
        log = tmp_path / "first.log"
        first = start_live([*common, "--max-seconds", "120"], log)
        with sigterm_after(first, ex.gate) as status:
            wait_for("a klines request", lambda: bool(ex.rest_requests), first, log)
        assert status == [0], log.read_text()
        assert_stopped_in_start_up(log.read_text())
        assert len(out.read_text().splitlines()) == 1  # the header
        assert snapshot_files(tmp_path / "snaps") == []
        log = tmp_path / "second.log"
        second = start_live([*common, "--resume", "--max-seconds", "60", "--max-bars", "2"], log)
        try:
            assert second.wait(timeout=120) == 0, log.read_text()
        finally:
            if second.poll() is None:
                second.kill()
    text = log.read_text()
    assert "no snapshot in the" in text and "final snapshot" in text, text
    lines = out.read_text().splitlines()
    assert lines[0].startswith("symbol,") and lines.count(lines[0]) == 1
    assert len(lines) == 1 + 1 + 2  # the header, the warmup's last bar, two bars


@pytest.mark.parametrize("wrote_after_the_signal", [False, True])
def test_a_start_up_stop_takes_a_final_snapshot_only_when_rows_were_written(
    tmp_path, capsys, monkeypatch, wrote_after_the_signal
):
    """The signal decides a stop during start-up, but the batch under way when it came
    may still write rows (a stop takes effect between batches): those rows then get the
    final snapshot that accounts for them, with a note that says so."""
    from atc_stream.app.durability import Durability
    from atc_stream.engine.engine import Engine

    for flag in ("entered", "signalled"):  # the whole process's: put back after the test
        monkeypatch.setattr(Durability, flag, False)
    durability = Durability(redis=None, snapshot_dir=tmp_path / "snaps", snapshot_every=None,
                            resume=False)  # fmt: skip
    durability.start(Engine(backend="cpu", interval="1m"))
    rows: list[str] = []
    durability.started_up = lambda: False
    durability.wrote = lambda: bool(rows)
    with durability:
        signal.raise_signal(signal.SIGTERM)
        assert durability.stop_requested and durability.stopped_in_start_up
        if wrote_after_the_signal:
            rows.append("a row")
    err = capsys.readouterr().err
    assert START_UP_STOP in err.splitlines()
    assert durability.stopped_in_start_up is not wrote_after_the_signal
    assert ("final snapshot" in err) is wrote_after_the_signal
    assert ("wrote rows after all" in err) is wrote_after_the_signal
    assert bool(snapshot_files(tmp_path / "snaps")) is wrote_after_the_signal


def test_a_resumed_run_with_no_bar_to_backfill_is_past_its_start_up(tmp_path):
    """Restarted within a bar (1 m bars), the resumed run's backfill brings nothing: once
    it is done the run is live, and a SIGTERM then is an ordinary stop (its final
    snapshot and summary), not a stop "during start-up"."""
    closes = make_bars(["BTCUSDT"], 400, seed=55)
    now = int(time.time() * 1000)
    if now % 60_000 > 45_000:  # both runs within one bar: not across a minute's close
        time.sleep(61 - (now % 60_000) / 1000)
        now = int(time.time() * 1000)
    exchange = FakeExchange(closes, 40, t0=now - now % 60_000 - 40 * 60_000, interval="1m",
                            realtime=True, previews_per_bar=0)  # fmt: skip
    snaps, out = tmp_path / "snaps", tmp_path / "out.jsonl"
    with exchange as ex:
        common = ["--symbols", "BTCUSDT", "--interval", "1m", "--history", "20", "--backend",
                  "cpu", "--status-every", "0", "--snapshot-dir", str(snaps), "-o", str(out),
                  "--ws-url", ex.ws_url, "--rest-url", ex.rest_url]  # fmt: skip
        first = start_live([*common, "--max-seconds", "2"], tmp_path / "first.log")
        assert first.wait(timeout=120) == 0, (tmp_path / "first.log").read_text()
        log = tmp_path / "second.log"
        second = start_live([*common, "--resume", "--max-seconds", "120"], log)
        with sigterm_after(second) as status:
            wait_for("the run", lambda: "atc-stream: live 1 symbols" in log.read_text(),
                     second, log)  # fmt: skip
            time.sleep(1.0)  # its backfill: one REST request to this machine
    code = status[0]
    text = log.read_text()
    assert code == 0, text
    assert "stopping after the current batch" in text and START_UP_STOP not in text
    assert "final snapshot" in text and "live done" in text, text


# -- Ctrl-C while the command loads ------------------------------------------------------------

# The command as its console script runs it, after saying on stdout that the interpreter is
# up and the entry point imported (before that, a Ctrl-C is Python's own: the interpreter's
# start-up and the .pth files of site-packages). ``CTRL_C_WHEN`` names a module whose import
# gets a Ctrl-C in the middle (numba's compiled dispatcher imports its device arrays from
# C: an interrupt there comes back as an ``ImportError``), instead of the test's timing.
_STARTED_THEN_LIVE = """
import os, signal, sys

class CtrlCDuring:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ.get("CTRL_C_WHEN"):
            print("importing " + name, flush=True)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlCDuring())
from atc_stream.app.entry import main
print("started", flush=True)
sys.argv = ["atc-stream", *sys.argv[1:]]
sys.exit(main())
"""


def start_loading(tmp_path: Path, ctrl_c_when: str = "") -> subprocess.Popen:
    """``live`` against an address that refuses everything: it would take seconds (the
    symbol check's retries) to end by itself."""
    return subprocess.Popen(
        [sys.executable, "-c", _STARTED_THEN_LIVE, "live", "--symbols", "BTCUSDT",
         "--ws-url", "ws://127.0.0.1:9", "--rest-url", "http://127.0.0.1:9",
         "--max-seconds", "20", "-o", str(tmp_path / "out.jsonl")],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**live_env(), "CTRL_C_WHEN": ctrl_c_when},
    )  # fmt: skip


def test_ctrl_c_inside_an_import_that_masks_it_is_one_line_and_exit_130(tmp_path):
    process = start_loading(tmp_path, ctrl_c_when="numba._devicearray")
    try:
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert "importing numba._devicearray" in out, (out, err)  # the Ctrl-C came in there
    assert process.returncode == 130, err
    assert err == "atc-stream: interrupted\n", err


def test_a_start_up_time_recorded_long_ago_is_not_warmed_up_from(capsys):
    """A snapshot of a run stopped in its start-up records when that run went live; a
    resume warms its unwarmed symbols up as of then only while ``--history`` covers it
    (else it would fetch and step everything since): older, as of now, with a note."""
    from atc_stream.app.jobs.live import _live_from

    now, minute = 1_700_000_000_000, 60_000
    assert _live_from(None, now, 300 * minute) == now
    assert _live_from({"output": 10}, now, 300 * minute) == now
    recent = {"live_from": now - 299 * minute}
    assert _live_from(recent, now, 300 * minute) == now - 299 * minute
    assert capsys.readouterr().err == ""
    stale = {"live_from": now - 7 * 24 * 60 * minute}
    assert _live_from(stale, now, 300 * minute) == now
    assert "longer ago than --history covers" in capsys.readouterr().err
