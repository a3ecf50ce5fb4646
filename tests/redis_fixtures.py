"""A real ``redis-server`` for tests: the ``RedisServer`` helper and pytest fixtures.

Use from a test module (``tests/`` is on ``sys.path`` under pytest's default
``prepend`` import mode, as for ``golden_data``)::

    from redis_fixtures import redis_server, redis_url  # noqa: F401

Fixtures
    ``redis_server``  session: one shared server for the whole run (a ``RedisServer``);
                      skips the test when no ``redis-server`` binary is found.
    ``redis_url``     function: FLUSHALL on the shared server, then its URL
                      (``redis://127.0.0.1:<port>/0``).
    ``private_redis`` function: a server of the test's own, stopped afterwards: for
                      outage tests (``stop()`` / ``start()`` again on the same port)
                      without disturbing the shared one.

``RedisServer(port=None)``: ``start()``, ``stop()``, ``restart()``, ``url``, ``port``,
``ping()``, ``client()``; also a context manager. The binary is ``$ATC_REDIS_SERVER``,
else ``redis-server`` on ``PATH``, else ``/usr/bin/redis-server``. The server runs on
127.0.0.1 without persistence (``--save '' --appendonly no``) in a temporary directory.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = [
    "RedisServer",
    "collected_messages",
    "find_redis_server",
    "free_port",
    "private_redis",
    "redis_server",
    "redis_url",
    "requires_redis_server",
]


def _die_with_parent() -> None:
    """In the child (Linux): get SIGTERM when the test process dies, so no server outlives it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def find_redis_server() -> str | None:
    """Path of the ``redis-server`` binary, or None."""
    candidates = [os.environ.get("ATC_REDIS_SERVER"), shutil.which("redis-server")]
    candidates.append("/usr/bin/redis-server")
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


@contextlib.contextmanager
def collected_messages(subscriber) -> Iterator[list]:
    """The messages ``subscriber`` receives while the block runs, read on a thread of
    their own (and a last second's worth after it), in arrival order."""
    got: list = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            got.extend(subscriber.messages(timeout=0.2))
        got.extend(subscriber.messages(timeout=1.0))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        yield got
    finally:
        done.set()
        reader.join()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


requires_redis_server = pytest.mark.skipif(
    find_redis_server() is None, reason="no redis-server binary (set ATC_REDIS_SERVER)"
)


class RedisServer:
    """A ``redis-server`` subprocess on 127.0.0.1 (no persistence), restartable on its port."""

    def __init__(self, port: int | None = None, *, binary: str | None = None) -> None:
        self.binary = binary or find_redis_server()
        if self.binary is None:
            raise FileNotFoundError("no redis-server binary found (set ATC_REDIS_SERVER)")
        self._fixed_port = port
        self.port = port or free_port()
        self._dir = tempfile.mkdtemp(prefix="atc-redis-")
        self.proc: subprocess.Popen | None = None
        self._started_once = False

    # -- addresses ----------------------------------------------------------------------

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return Path(self._dir) / "redis.log"

    def client(self, **kwargs):
        """A ``redis.Redis`` client for this server."""
        import redis

        return redis.Redis.from_url(self.url, **kwargs)

    # -- life cycle -----------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ping(self, timeout: float = 0.5) -> bool:
        """True if the server answers PING (raw RESP, no client library)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server (on the same port as before after a ``stop``); wait for PING."""
        if self.running:
            return self
        for attempt in range(5):
            self._spawn()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                if self.ping():
                    self._started_once = True
                    return self
                time.sleep(0.02)
            log = self._log_tail()
            self._kill()
            port_clash = "Address already in use" in log
            if port_clash and self._fixed_port is None and not self._started_once and attempt < 4:
                self.port = free_port()  # lost the race for a free port: take another
                continue
            raise RuntimeError(f"redis-server on port {self.port} did not start:\n{log}")
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", self._dir,
            "--daemonize", "no",
            "--logfile", str(self.log_path),
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"

    def _kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc = None

    def stop(self, timeout: float = 10.0, *, kill: bool = False) -> None:
        """Terminate the server (SIGTERM, then SIGKILL) and wait until the port is closed.
        ``kill``: SIGKILL at once (after SIGTERM, Redis serves on until its next cron tick,
        up to 100 ms)."""
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
            self.proc.wait(timeout=timeout)
        elif self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        self.proc = None
        deadline = time.monotonic() + timeout
        while self.ping(timeout=0.1) and time.monotonic() < deadline:
            time.sleep(0.02)

    def restart(self) -> RedisServer:
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop and remove the temporary directory."""
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RedisServer(port={self.port}, running={self.running})"


# One shared server per process, however many modules import the fixture (each import
# makes its own fixture definition; they all hand out this one server).
_shared: RedisServer | None = None


def _shared_server() -> RedisServer:
    global _shared
    if _shared is None:
        _shared = RedisServer()
        atexit.register(_shared.close)
    if not _shared.running:
        _shared.start()  # also brings it back if a test stopped it
    return _shared


@pytest.fixture(scope="session")
def redis_server():
    """The shared ``RedisServer`` (started once per test run); skip without a binary."""
    if find_redis_server() is None:
        pytest.skip("no redis-server binary (set ATC_REDIS_SERVER)")
    yield _shared_server()
    # stopped at interpreter exit (atexit), after every module's fixture is done with it


@pytest.fixture
def redis_url(redis_server):
    """URL of the shared server, emptied (FLUSHALL) for this test."""
    server = _shared_server()  # restart if an earlier test stopped it
    client = server.client()
    try:
        client.flushall()
    finally:
        client.close()
    yield server.url


@pytest.fixture
def private_redis():
    """A ``RedisServer`` for this test only (started; stopped and removed afterwards)."""
    if find_redis_server() is None:
        pytest.skip("no redis-server binary (set ATC_REDIS_SERVER)")
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.close()
