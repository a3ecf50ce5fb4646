"""One shard's engine: the exactly-once Redis Streams loop on the shard's bar stream, with
snapshots under the shard's namespace and a heartbeat in Redis (no Ray in here)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import redis

from atc_stream.connectors.cluster.registry import beat, heartbeat_key, mark_key, record_start
from atc_stream.connectors.redis.lease import (
    LEASE_TTL_S,
    Lease,
    LeasedStreamRunner,
    stream_lease_key,
)
from atc_stream.connectors.redis.snapshots import RedisSnapshotStore, namespace_prefix
from atc_stream.core.params import ATCParams
from atc_stream.core.results import StepResult
from atc_stream.core.shards import bars_stream, shard_namespace
from atc_stream.engine.engine import Engine

log = logging.getLogger("atc_stream.cluster")


def shard_store(redis_url: str, shard: int, keep: int = 5) -> RedisSnapshotStore:
    """The snapshot store of ``shard``: ``{atc-stream:shard-3}:snapshot:*``, where
    ``run-stream --namespace shard-3`` and ``replay --shard-snapshots`` keep them too."""
    prefix = namespace_prefix(shard_namespace(shard))
    return RedisSnapshotStore(redis_url, prefix=prefix, keep=keep)


@dataclass
class ShardConfig:
    """Everything a shard's engine needs (plain data: it travels to the Ray actor)."""

    redis: str
    shard: int
    prefix: str = "atc"
    output_stream: str | None = None
    output_maxlen: int = 1_000_000
    group: str = "atc"
    batch_size: int = 1000
    snapshot_every: int = 10_000
    snapshot_seconds: float = 60.0
    publish: bool = False
    backend: str = "auto"
    interval: str = "1m"
    params: list[dict[str, Any]] = field(default_factory=list)  #: ATCParams dicts
    beat_seconds: float = 1.0
    #: how long a start waits for the lease of its shard's stream: an actor that Ray
    #: restarts after a SIGKILL waits out its predecessor's lease (``LEASE_TTL_S``)
    lease_wait_s: float = 2 * LEASE_TTL_S


def shard_lease_key(prefix: str, shard: int, group: str) -> str:
    """The lease of the shard's stream: ``atc:bars:{shard-3}:lease:atc``, the key that
    ``run-stream --input-stream atc:bars:{shard-3}`` takes too."""
    return stream_lease_key(bars_stream(prefix, shard), group)


class _ShardRunner(LeasedStreamRunner):
    """The stream runner (applying only while it holds the shard's lease), noting the
    newest bar time it applied."""

    last_bar_time: int | None = None

    def process(self, entries: list) -> StepResult:
        result = super().process(entries)
        if len(result):
            newest = int(np.max(result.times))
            if self.last_bar_time is None or newest > self.last_bar_time:
                self.last_bar_time = newest
        return result


class ShardWorker:
    """Runs shard ``config.shard``: restores its newest good snapshot (the previous one,
    with a warning, when the newest is damaged), resumes its stream after the snapshot's
    offset and applies bars until stopped or idle.

    >>> worker = ShardWorker(ShardConfig("redis://127.0.0.1:6379/0", shard=3))
    >>> summary = worker.run(stop_when_idle=5.0)

    ``node``: the name its heartbeat gives the machine (default: the host name).

    Each start increments ``starts`` in the shard's heartbeat hash, which a thread
    rewrites every ``beat_seconds`` (streams, last bar time, offset, backend, node).
    """

    def __init__(self, config: ShardConfig, node: str | None = None) -> None:
        self.config = config
        self.client = redis.Redis.from_url(
            config.redis, socket_timeout=10, socket_connect_timeout=5
        )
        self.runner: _ShardRunner | None = None
        self.engine: Engine | None = None
        self.restored_from: str | None = None
        self.warnings: list[str] = []
        self._stop = threading.Event()
        self.state = "starting"  #: then "running", and "stopped" once ``run`` returns
        self.node = node or socket.gethostname()
        self.starts = record_start(self.client, config.prefix, config.shard, self._fields())

    def pid(self) -> int:
        return os.getpid()

    def stop(self) -> None:
        """Ask ``run`` to return after the batch in progress."""
        self._stop.set()
        if self.runner is not None:
            self.runner.stop()

    def open_engine(self) -> Engine:
        """The shard's engine: restored from its newest good snapshot, else new."""
        config = self.config
        store = shard_store(config.redis, config.shard)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = store.latest()
        for warning in caught:  # a damaged newest snapshot: said again, and recorded
            self.warnings.append(str(warning.message))
            warnings.warn(warning.message, warning.category, stacklevel=2)
        params = [ATCParams.from_dict(p) for p in config.params] or [ATCParams()]
        if found is None:
            return Engine(params, backend=config.backend, interval=config.interval, outputs="all")
        engine = Engine.restore(found.decoded or found.blob, backend=config.backend, outputs="all")
        if config.params and [p.to_dict() for p in engine.param_sets] != [
            p.to_dict() for p in params
        ]:
            raise ValueError(
                f"shard {config.shard}: the snapshot's parameter sets differ from --params"
            )
        self.restored_from = found.id
        return engine

    def run(self, stop_when_idle: float | None = None) -> dict[str, Any]:
        """Apply the shard's bars until ``stop()`` or ``stop_when_idle`` seconds without
        any; a summary (counts, malformed entries and rejected bars by reason, the
        snapshot restored from, starts). Holds the lease of the shard's stream throughout
        (``LeaseHeld`` when another process keeps it past ``lease_wait_s``); one that is
        lost raises ``LeaseLost``, with no final snapshot."""
        config = self.config
        lease = Lease(
            config.redis, shard_lease_key(config.prefix, config.shard, config.group),
            what=f"shard {config.shard}", on_lost=lambda why: self.stop(),
        )  # fmt: skip
        try:
            lease.acquire(wait=config.lease_wait_s)
            return self._run(lease, stop_when_idle)
        finally:
            lease.release()

    def _run(self, lease: Lease, stop_when_idle: float | None) -> dict[str, Any]:
        from atc_stream.state.snapshotter import Snapshotter

        config = self.config
        engine = self.engine = self.open_engine()
        store = shard_store(config.redis, config.shard)
        snapshotter = Snapshotter(
            engine, store, every_bars=config.snapshot_every, every_seconds=config.snapshot_seconds
        )
        publisher = None
        if config.publish:
            from atc_stream.connectors.redis.pubsub import SignalPublisher

            publisher = SignalPublisher(config.redis, prefix=config.prefix)
        runner = self.runner = _ShardRunner(
            engine, config.redis, bars_stream(config.prefix, config.shard), group=config.group,
            consumer=f"shard-{config.shard}", output_stream=config.output_stream,
            output_maxlen=config.output_maxlen, batch_size=config.batch_size,
            snapshotter=snapshotter, publisher=publisher,
            output_mark_key=mark_key(config.prefix, config.shard),
        )  # fmt: skip
        runner.lease = lease
        known = [t for s in engine.symbols for t in engine.last_bar_times(s) if t is not None]
        runner.last_bar_time = max(known) if known else None  # the status after a restart
        beats = threading.Thread(target=self._beat_loop, name="atc-shard-beat", daemon=True)
        try:
            runner.prepare(resume=True)
            self.state = "running"
            beats.start()
            if self._stop.is_set():
                runner.stop()
            stats = runner.run(stop_when_idle=stop_when_idle)
            # lost while idle, or not renewed since: another process may have applied bars
            # this state lacks, so it must not become the newest snapshot
            lease.ensure(stopping=lambda: True)
            try:
                snapshotter.close()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                # Redis went away as the shard stopped, its outputs all written: the next
                # start resumes from the previous snapshot, and the output mark keeps the
                # batches it applies again from being written twice
                self.warnings.append(f"final snapshot not saved (Redis unreachable: {exc})")
                log.warning("shard %d: %s", config.shard, self.warnings[-1])
        finally:
            self.state = "stopped"
            self._stop.set()
            if beats.is_alive():
                beats.join()
            if publisher is not None:
                publisher.close()
        try:  # the last heartbeat ("stopped"); a stop during an outage goes without it
            beat(self.client, config.prefix, config.shard, self._fields())
        except redis.RedisError as exc:
            log.warning("shard %d: final heartbeat not written: %s", config.shard, exc)
        return {
            "shard": config.shard, "starts": self.starts, "restored_from": self.restored_from,
            "entries": stats.entries, "bars": stats.bars, "rows_out": stats.rows_out,
            "suppressed": stats.rows_suppressed, "offset": runner.offset,
            "backend": engine.backend.name, "warnings": list(self.warnings),
            "malformed": dict(stats.malformed), "rejected": dict(engine.rejections),
        }  # fmt: skip

    def _fields(self) -> dict[str, Any]:
        engine, runner = self.engine, self.runner
        return {
            "streams": None if engine is None else len(engine.streams),
            "backend": None if engine is None else engine.backend.name,
            "last_bar_time": None if runner is None else runner.last_bar_time,
            "offset": None if runner is None else runner.offset,
            "pid": os.getpid(),
            "node": self.node,
            "warning": self.warnings[-1] if self.warnings else None,
            "state": self.state,
        }

    def _beat_loop(self) -> None:
        while True:
            try:
                beat(self.client, self.config.prefix, self.config.shard, self._fields())
            except redis.RedisError as exc:  # Redis away: the runner waits it out too
                log.debug("heartbeat of shard %d not written: %s", self.config.shard, exc)
            if self._stop.wait(self.config.beat_seconds):
                return


__all__ = ["ShardConfig", "ShardWorker", "heartbeat_key", "shard_lease_key", "shard_store"]
