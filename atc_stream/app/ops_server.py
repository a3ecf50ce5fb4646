"""``/metrics``, ``/healthz`` and ``/readyz`` of ``atc-stream live``, served by aiohttp in the
feed's own event loop (docs/design/live-feed.md, "Operations").

In the loop, a scrape or a readiness check reads the feed's counters and per-symbol
state between two batches, with no lock and no torn read; one port serves all three.
"""

from __future__ import annotations

import logging
from typing import Any

from atc_stream.app.metrics import LiveCollector
from atc_stream.connectors.exchanges.feed import KlineClient

#: Seconds a request in flight may take to finish when the server stops.
SHUTDOWN_TIMEOUT = 1.0


class _OneLineErrors(logging.Filter):
    """A request aiohttp cannot serve (a malformed or oversized request line from some
    client) is answered with 400 and logged with its traceback: kept to one line, the
    exception's own, so that a scanner on the port never floods the service's stderr."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            text = " ".join(str(exc).split())[:200]
            record.msg = f"{record.getMessage()}: {type(exc).__name__}: {text}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
            # the client's error, not the service's
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


#: The logger of the endpoints' HTTP server (aiohttp's ``RequestHandler`` logger).
http_log = logging.getLogger("atc_stream.ops_server.http")
http_log.addFilter(_OneLineErrors())


class OpsServer:
    """The operations endpoints of one ``KlineClient`` on ``host:port`` (port 0: a free one,
    see ``port`` once started). Start and close it inside the client's event loop
    (``async with OpsServer(client, port=9108): await client.run()``).

    - ``/metrics``: Prometheus text format (``metrics.LiveCollector`` and process metrics).
    - ``/healthz``: 200 while the process serves.
    - ``/readyz``: 200 when every symbol is live (``KlineClient.not_live``), else 503; the
      JSON body lists the symbols that are not, with why.
    """

    def __init__(
        self,
        client: KlineClient,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        snapshotter: Any | None = None,
    ) -> None:
        from prometheus_client import CollectorRegistry, ProcessCollector

        self.client = client
        self.host = host
        self.port = port
        self.registry = CollectorRegistry()
        self.registry.register(LiveCollector(client, snapshotter))
        ProcessCollector(registry=self.registry)
        self._runner: Any = None

    @property
    def url(self) -> str:
        """Base URL of the endpoints (after ``start``)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        """Listens; ``OSError`` when the address cannot be bound."""
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        runner = web.AppRunner(
            app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT, logger=http_log
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]

    async def close(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> OpsServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _metrics(self, request: Any) -> Any:
        from aiohttp import web
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(text="ok\n")

    async def _readyz(self, request: Any) -> Any:
        from aiohttp import web

        not_live = self.client.not_live()
        symbols = len(self.client.symbols)
        body = {"ready": not not_live, "symbols": symbols, "live": symbols - len(not_live),
                "not_live": not_live}  # fmt: skip
        return web.json_response(body, status=503 if not_live else 200)
