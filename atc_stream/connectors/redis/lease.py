"""A lease in Redis that makes one process at a time the consumer of an input stream."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
from redis.exceptions import LockError, LockNotOwnedError
from redis.lock import Lock
from tenacity import Retrying, retry_if_exception_type, wait_fixed

from atc_stream.connectors.redis.stream_output import FENCE_ERROR
from atc_stream.connectors.redis.streams import RedisStreamRunner
from atc_stream.core.results import StepResult

log = logging.getLogger("atc_stream.lease")

#: Seconds a lease lives unless renewed: how long a SIGKILLed holder blocks a restart.
LEASE_TTL_S = 5.0
#: Renewals per ttl: a holder survives a few lost renewals (a slow reply, a short
#: outage) before its lease runs out.
RENEWALS_PER_TTL = 5

_UNREACHABLE = (redis.ConnectionError, redis.TimeoutError)


def stream_lease_key(input_stream: str, group: str) -> str:
    """The lease of ``group`` on ``input_stream``: ``<input_stream>:lease:<group>`` (the
    stream's hash tag, if any, puts it in the stream's Redis Cluster slot)."""
    return f"{input_stream}:lease:{group}"


class LeaseHeld(RuntimeError):
    """Another process holds the lease: the message says which, and how to go on."""


class LeaseLost(RuntimeError):
    """This process no longer holds its lease (it expired, or another took it)."""


class Lease:
    """``key`` in Redis held by this process: ``SET key token NX PX ttl``, renewed by a
    thread every ``ttl / RENEWALS_PER_TTL`` (redis-py ``Lock.reacquire``: only while the
    key still holds this process's token) and deleted on ``release`` (compare and
    delete: never another's).

    >>> with Lease(url, stream_lease_key("bars", "atc"), what="run-stream") as lease:
    ...     lease.ensure()  # before each write: raises LeaseLost once it is gone

    ``what`` names the holder's kind in the refusal (``LeaseHeld``). A renewal that finds
    the token gone marks the lease lost for good and calls ``on_lost``; one that cannot
    reach Redis leaves it held until ``ttl`` after the last renewal, when ``ensure``
    starts waiting for the next renewal (another process may take the key once it has
    expired in Redis)."""

    def __init__(
        self,
        redis_url: str,
        key: str,
        *,
        what: str,
        ttl: float = LEASE_TTL_S,
        on_lost: Callable[[str], Any] | None = None,
    ) -> None:
        self.key = key
        self.what = what
        self.ttl = ttl
        self.on_lost = on_lost
        self.every = ttl / RENEWALS_PER_TTL
        # replies later than a renewal period are as good as lost: the next one is due
        self.client = redis.Redis.from_url(
            redis_url, socket_timeout=self.every, socket_connect_timeout=self.every
        )
        self.token = f"{socket.gethostname()} pid {os.getpid()} ({uuid.uuid4().hex[:8]})"
        # thread_local=False: the renewal thread must see the token that acquire stored
        self._lock = Lock(self.client, key, timeout=ttl, blocking=False, thread_local=False)
        self._valid_until = 0.0  # monotonic: last renewal sent + ttl
        self._done = threading.Event()
        self._renewals: threading.Thread | None = None
        self.lost: str | None = None  #: why the lease was lost; None while held

    def acquire(self, wait: float = 0.0) -> None:
        """Take the lease, waiting up to ``wait`` seconds for the holder's to end;
        ``LeaseHeld`` when it does not."""
        sent = time.monotonic()
        if not self._lock.acquire(blocking=wait > 0, blocking_timeout=wait, token=self.token):
            raise LeaseHeld(self._held_message())
        self._valid_until = sent + self.ttl
        self._renewals = threading.Thread(target=self._renew_loop, name="atc-lease", daemon=True)
        self._renewals.start()

    def _held_message(self) -> str:
        holder, ms = self._holder(), self.client.pttl(self.key)
        who = holder or "a process that just let go"
        left = f"{ms / 1000:.1f} s" if ms and ms > 0 else "a moment"
        return (
            f"{self.what} is already running: {who} holds the lease {self.key}, renewed "
            f"while it runs ({left} left); stop that process first, or, if it was killed, "
            f"start again once the lease has expired ({self.ttl:g} s after its last renewal)"
        )

    def _holder(self) -> str | None:
        value = self.client.get(self.key)
        return value.decode(errors="replace") if isinstance(value, bytes) else value

    def valid(self) -> bool:
        """Held, and renewed within the last ``ttl``: no other process can hold it."""
        return self.lost is None and time.monotonic() < self._valid_until

    def ensure(self, stopping: Callable[[], bool] = lambda: False) -> None:
        """Return while the lease is valid; ``LeaseLost`` once it is lost. Past ``ttl``
        without a renewal (Redis unreachable, or this process paused) it renews now,
        retrying while Redis cannot be reached until ``stopping()`` (then the connection
        error is raised)."""
        if self.valid():
            return
        if self.lost is None:
            for attempt in Retrying(
                retry=retry_if_exception_type(_UNREACHABLE),
                wait=wait_fixed(self.every),
                stop=lambda state: stopping(),
                reraise=True,
            ):
                with attempt:
                    self._renew()
        if self.lost is not None:
            raise LeaseLost(self.lost)

    def _renew(self) -> None:
        """One renewal; a token no longer in the key marks the lease lost."""
        if self.lost is not None:
            return
        sent = time.monotonic()
        try:
            self._lock.reacquire()
        except LockNotOwnedError:
            holder = self._holder()
            by = f"{holder} holds it" if holder else "it expired"
            self.lose(f"the lease {self.key} was lost ({by})")
            return
        self._valid_until = max(self._valid_until, sent + self.ttl)

    def lose(self, why: str) -> None:
        self.lost = why
        log.error("%s", why)
        if self.on_lost is not None:
            self.on_lost(why)

    def _renew_loop(self) -> None:
        while not self._done.wait(self.every) and self.lost is None:
            try:
                self._renew()
            except _UNREACHABLE as exc:  # held until its validity ends; ensure() waits
                log.warning("lease %s not renewed (Redis unreachable: %s)", self.key, exc)

    def release(self) -> None:
        """Stop renewing and delete the key if it still holds this process's token (a
        lease lost to another process stays theirs); an unreachable Redis lets it expire."""
        self._done.set()
        if self._renewals is not None and self._renewals is not threading.current_thread():
            self._renewals.join()
        try:
            if self._renewals is not None and self.lost is None:
                self._lock.release()
        except LockError:  # expired meanwhile (or taken): nothing of ours to delete
            pass
        except _UNREACHABLE as exc:
            log.warning("lease %s not released (it expires in %g s): %s", self.key, self.ttl, exc)
        finally:
            self.client.close()

    def __enter__(self) -> Lease:
        if self._renewals is None:
            self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class LeasedStreamRunner(RedisStreamRunner):
    """The stream runner, applying a batch only while ``lease`` is valid: a runner whose
    lease was lost stops (``LeaseLost`` from ``process``) instead of applying bars that
    the process that took the lease reads too. Its output script is fenced as well: it
    writes only while the lease key holds this process's token, so a process paused
    between its check and its write (longer than the ttl) writes nothing."""

    lease: Lease | None = None

    def process(self, entries: list) -> StepResult:
        lease = self.lease
        if lease is None:
            return super().process(entries)
        lease.ensure(stopping=lambda: self._stop)
        if self.output is not None:
            self.output.fence = (lease.key, lease.token)
        try:
            return super().process(entries)
        except redis.ResponseError as exc:
            if not str(exc).startswith(FENCE_ERROR):
                raise
            lease.lose(f"the lease {lease.key} was lost before this batch was written")
            raise LeaseLost(lease.lost) from None


__all__ = [
    "LEASE_TTL_S",
    "Lease",
    "LeaseHeld",
    "LeaseLost",
    "LeasedStreamRunner",
    "stream_lease_key",
]
