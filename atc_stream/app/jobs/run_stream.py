"""The ``run-stream`` job: bars from a Redis Stream through the engine, exactly once across
restarts (``connectors.redis.streams.RedisStreamRunner``), with snapshots of the state
and the last applied entry (``app.durability.Durability``)."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from pathlib import Path

from atc_stream.app.console import (
    OptionError,
    RunError,
    err,
    log_warnings,
    param_sets_option,
    redis_failure,
)
from atc_stream.app.durability import Durability, check_backend
from atc_stream.app.extras import require
from atc_stream.app.paper import check_paper_options, paper_lines
from atc_stream.app.stream_interval import choose_stream_interval


def run_stream(
    *,
    redis: str,
    input_stream: str,
    output_stream: str | None,
    group: str,
    consumer: str,
    snapshot_dir: Path | None,
    snapshot_every: int | None,
    resume: bool,
    stop_when_idle: float | None,
    publish: bool,
    redis_prefix: str,
    batch_size: int,
    output_maxlen: int,
    namespace: str,
    params: Path | None,
    backend: str,
    interval: str | None,
    time_unit: str | None = None,
    strategies: Sequence[str] = (),
) -> int:
    """Consume ``input_stream`` until SIGINT/SIGTERM or ``stop_when_idle``; the exit
    status: 0, or 130 when a SIGINT (Ctrl-C) stopped it after its batch (a SIGTERM is
    how a service is stopped: 0). No output (neither ``output_stream`` nor ``publish``)
    is an ``OptionError``. A Redis that cannot be reached at the start or refuses a
    command, and a consumer group already read from without ``resume``, are a
    ``RunError`` (one line, exit 2)."""
    require("redis", "atc-stream run-stream")
    if output_stream is None and not publish:
        # every entry would be applied and acknowledged with its rows written nowhere
        raise OptionError(
            "neither is given, so the rows would go nowhere while every entry is read and "
            "acknowledged; give --output-stream KEY (a Redis Stream), --publish (pub/sub), "
            "or both",
            "--output-stream/--publish",
        )
    from redis import exceptions as redis_errors

    from atc_stream.connectors.redis.lease import (
        Lease,
        LeasedStreamRunner,
        LeaseLost,
        stream_lease_key,
    )

    log_warnings()
    check_backend(backend)
    param_sets = param_sets_option(params)
    paper = check_paper_options(strategies, trades=None, positions=None)
    durability = Durability(
        redis=redis, redis_prefix=redis_prefix, snapshot_dir=snapshot_dir,
        snapshot_every=snapshot_every, resume=resume, publish=publish,
        namespace=namespace, refuse_existing=True,
    )  # fmt: skip
    lease = _take_lease(Lease, redis, stream_lease_key(input_stream, group))
    try:  # until the final snapshot is written: the next holder restores it
        engine = _open_engine(durability, backend, param_sets, interval, paper)
        durability.start(engine)
        try:
            runner = LeasedStreamRunner(
                engine, redis, input_stream, group=group, consumer=consumer,
                output_stream=output_stream, output_maxlen=output_maxlen,
                batch_size=batch_size, snapshotter=durability.snapshotter,
                publisher=durability.publisher, time_unit=time_unit,
            )  # fmt: skip
        except ValueError as exc:
            raise OptionError(str(exc)) from None
        runner.lease = lease
        lease.on_lost = lambda why: runner.stop()
        durability.on_stop(runner.stop)
        try:
            if not resume:
                _refuse_a_group_read_before(runner)
            label = _label_interval(engine, runner, interval, restored=durability.restored)
            runner.prepare(resume=resume)
            with durability:  # left by an exception: no final snapshot (state past the offset)
                err(f"atc-stream: reading {input_stream} after entry {runner.offset} "
                    f"({engine.backend.name} backend); interval {label}")  # fmt: skip
                stats = runner.run(stop_when_idle=stop_when_idle)
                # lost while idle, or not renewed since: the final snapshot would be taken
                # of a state that may lack the bars another process applied meanwhile
                lease.ensure(stopping=lambda: True)
        except LeaseLost as exc:
            # another process took the input over: a snapshot of this state (which lacks
            # the bars that process applied) must not become the newest
            raise RunError(
                f"{exc}, so another process may be reading {input_stream}: stopped without "
                f"a final snapshot after entry {runner.offset}; the lease's holder goes on "
                "from the snapshots"
            ) from None
        except (redis_errors.ConnectionError, redis_errors.TimeoutError) as exc:
            if not durability.stop_requested:
                raise redis_failure(redis, exc) from None
            # stopped while a batch's outputs waited for Redis: that batch is applied in
            # memory only, so no final snapshot was taken and the input still holds it
            raise redis_failure(
                redis, exc, "stopped with the outputs of the last batch read not written; "
                "--resume applies it again",
            ) from None  # fmt: skip
        except redis_errors.RedisError as exc:
            raise redis_failure(redis, exc) from None
    finally:
        lease.release()
    err("atc-stream: run-stream done")
    for line in stats.lines() + (paper_lines(engine) if paper is not None else []):
        err("  " + line)
    # scripts tell a Ctrl-C from a finished run by the status, as replay's
    return 130 if durability.stop_signal == signal.SIGINT else 0


def _take_lease(lease_class, redis: str, key: str):
    """The input's lease, taken for this process (``connectors/redis/lease.py``): a
    second consumer of the same group would apply part of the bars to a state of its
    own, and both would write the same snapshots. Another holder is a ``RunError``."""
    from redis import exceptions as redis_errors

    from atc_stream.connectors.redis.lease import LeaseHeld

    lease = lease_class(redis, key, what="run-stream")
    try:
        lease.acquire()
    except (LeaseHeld, redis_errors.RedisError) as exc:
        lease.release()  # not taken: only its client to close
        if isinstance(exc, LeaseHeld):
            raise RunError(str(exc)) from None
        raise redis_failure(redis, exc) from None
    return lease


def _open_engine(durability, backend: str, param_sets, interval, paper):
    """The restored (or new) engine; a ``RunError`` for options it cannot run."""
    try:  # before reading
        return durability.open_engine(
            backend, param_sets, interval, strategies=paper.strategies if paper else None
        )
    except ValueError as exc:  # e.g. strategies on a backend that cannot trade them
        raise RunError(str(exc)) from None


def _label_interval(engine, runner, interval: str | None, *, restored: bool) -> str:
    """Set the interval of a fresh ``engine`` (it has no streams yet, so its label can
    still be chosen) from ``choose_stream_interval`` of the input stream; a restored
    engine keeps the snapshot's. Returns the label and where it came from, for the
    start line; ``interval`` that the bars' spacing contradicts is a ``RunError``."""
    if restored:
        return f"{engine.interval}, the snapshot's"
    chosen = choose_stream_interval(
        runner.client, [runner.input_stream], interval, time_unit=runner.time_unit
    )
    engine.interval = chosen.interval
    return chosen.said()


def _refuse_a_group_read_before(runner) -> None:
    """A fresh run on a consumer group that has delivered entries would go on after them
    with none of them applied to its new engine: every row after would be computed from
    a stream that starts there. Refused; ``--resume`` rewinds the group instead."""
    position = runner.group_position()
    if position is not None:
        raise RunError(
            f"consumer group {runner.group!r} has already read {runner.input_stream} up to "
            f"entry {position}, and a fresh engine would continue after it with none of "
            "those bars applied; add --resume to continue from the snapshots (or from the "
            "start of the stream when there are none), or give a new --group to apply the "
            "stream from its start"
        )
