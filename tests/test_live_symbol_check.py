"""``atc-stream live`` checks its symbols against the exchange's instrument list before
anything else: a slow or broken exchange is reported as it happens and bounded by
``--max-seconds``, and an answer that is no instrument list is not blamed on the symbols."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

pytest.importorskip("aiohttp")
from aiohttp import web  # noqa: E402


@contextmanager
def rest_server(answer) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 whose every GET is ``await answer(request)``; its
    base URL."""
    ready = threading.Event()
    state: dict = {}

    async def handle(request):
        return await answer(request)

    async def serve():
        app = web.Application()
        app.router.add_get("/{tail:.*}", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["url"] = f"http://127.0.0.1:{runner.addresses[0][1]}"
        state["stop"] = asyncio.Event()
        ready.set()
        await state["stop"].wait()
        await runner.cleanup()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield state["url"]
    finally:
        loop.call_soon_threadsafe(state["stop"].set)
        thread.join(10)


def _live(url: str, tmp_path, *extra: str) -> list[str]:
    return [
        "live", "--symbols", "BTCUSDT", "--interval", "1s", "--rest-url", url,
        "--ws-url", "ws://127.0.0.1:9", "--output", str(tmp_path / "o.jsonl"), *extra,
    ]  # fmt: skip


@pytest.mark.parametrize("body", [[1, 2, 3], [{"symbol": 5}, {"nope": 1}], []])
def test_an_answer_that_lists_no_instrument_is_not_blamed_on_the_symbols(body, tmp_path, run_main):
    async def answer(request):
        return web.json_response(body)

    with rest_server(answer) as url:
        code, stderr = run_main(_live(url, tmp_path))
    assert code == 2
    (line,) = stderr.strip().splitlines()
    assert line.startswith("atc-stream: error: cannot list the symbols of binance: ")
    assert "lists no instrument" in line and "--rest-url" in line
    assert "has no symbol" not in line
    assert not (tmp_path / "o.jsonl").exists()


def test_each_retry_of_the_symbol_check_is_a_warning_line(tmp_path, run_main):
    async def answer(request):
        return web.Response(status=503, text="down for maintenance")

    with rest_server(answer) as url:
        started = time.monotonic()
        code, stderr = run_main(_live(url, tmp_path, "--max-seconds", "2"))
        took = time.monotonic() - started
    lines = stderr.strip().splitlines()
    assert code == 2 and took < 6, (took, lines)
    warnings = lines[:-1]
    assert warnings and all(
        w.startswith("atc-stream: warning: listing the symbols of binance: HTTP 503; retry ")
        for w in warnings
    ), lines
    assert warnings[0].split("; ")[1].startswith("retry 1 of 5 in ")
    assert lines[-1] == (
        "atc-stream: error: cannot list the symbols of binance: no answer within --max-seconds 2"
    )


def test_an_exchange_that_never_answers_is_given_up_at_max_seconds(tmp_path, run_main):
    async def answer(request):
        await asyncio.sleep(60)
        return web.json_response([])

    with rest_server(answer) as url:
        started = time.monotonic()
        code, stderr = run_main(_live(url, tmp_path, "--max-seconds", "1"))
        took = time.monotonic() - started
    assert code == 2 and took < 5, took
    assert stderr.strip().splitlines()[-1] == (
        "atc-stream: error: cannot list the symbols of binance: no answer within --max-seconds 1"
    )
