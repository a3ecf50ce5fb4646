"""``atc-stream live --max-bars N`` stops after exactly N closed bars applied after the
warmup, all symbols together, bars a ``--resume`` backfills included: a resumed run whose
backfill brings more than N bars at once writes N rows, not the whole backfill, and the
next ``--resume`` goes on from there with every bar exactly once (a local exchange on
127.0.0.1, real CLI runs, no mocks)."""

from __future__ import annotations

import re
import time

import pytest

pytest.importorskip("websockets")
pytest.importorskip("aiohttp")

from exchange_emulators import IMS, FakeExchange, compile_kernels, make_bars  # noqa: E402
from test_binance_live import assert_rows_once_and_exact, written_rows  # noqa: E402

SYMBOLS = ["BTCUSDT", "ETHUSDT"]
SUMMARY = re.compile(r"(\d+) live \((\d+) websocket, (\d+) backfilled\)")


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels():
    compile_kernels()


def test_max_bars_counts_a_resumes_backfill_and_stops_at_exactly_n(tmp_path):
    from typer.testing import CliRunner

    from atc_stream.app.cli import app

    closes = make_bars(SYMBOLS, 270, seed=23)
    start, history = 230, 100
    t0 = int(time.time() * 1000) - start * IMS - 1000
    out = tmp_path / "live.jsonl"
    common = ["live", "--symbols", ",".join(SYMBOLS), "--history", str(history),
              "--backend", "cpu", "--no-previews", "--status-every", "0", "--max-seconds", "60",
              "--snapshot-dir", str(tmp_path / "snaps"), "--output", str(out)]  # fmt: skip

    def run(*args: str) -> int:
        """Rows the run added to the output; its summary counts the bars it applied."""
        before = len(written_rows(out)) if out.exists() else 0
        done = CliRunner().invoke(app, [*common, *urls, *args])
        assert done.exit_code == 0, done.output
        applied, websocket, rest = map(int, SUMMARY.search(done.stderr).groups())
        assert applied == int(args[-1]) == websocket + rest, done.stderr
        return len(written_rows(out)) - before

    with FakeExchange(closes, start, t0=t0, bar_pause=0.01) as ex:
        urls = ["--ws-url", ex.ws_url, "--rest-url", ex.rest_url]
        assert run("--max-bars", "6") == 2 + 6  # the warmup's last bars, then 6
        ex.wait_for_bar(250)  # down while the exchange moves on: a backfill of 14+ bars each
        assert run("--resume", "--max-bars", "5") == 5
        assert run("--resume", "--max-bars", str(2 * (270 - start) - 6 - 5)) == 69
    assert_rows_once_and_exact(written_rows(out), closes, t0, start, history)
