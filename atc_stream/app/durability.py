"""Durability shared by ``replay``, ``demo``, ``live`` and ``run-stream``: snapshots,
resume and signals (docs/design/snapshots.md)."""

from __future__ import annotations

import functools
import os
import re
import signal
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from atc_stream.app.console import RunError, err, interrupted, redis_failure, stderr_is_terminal
from atc_stream.app.defaults import INTERVAL, REDIS_PREFIX, SNAPSHOT_EVERY
from atc_stream.app.extras import require
from atc_stream.connectors.replay.player import BarPlayer
from atc_stream.core.params import ATCParams
from atc_stream.core.schema import params_metadata
from atc_stream.core.strategy import Strategy
from atc_stream.engine.engine import Engine
from atc_stream.io.writers import open_writer, output_format, same_path
from atc_stream.kernels import cuda_available
from atc_stream.state.snapshot import SnapshotError, SnapshotWarning
from atc_stream.state.snapshot_stores import DirectorySnapshotStore, SnapshotStore
from atc_stream.state.snapshotter import Snapshotter

if TYPE_CHECKING:
    from atc_stream.connectors.redis.loop import LoopPublisher
    from atc_stream.connectors.redis.pubsub import SignalPublisher

__all__ = [
    "Durability",
    "open_snapshot_store",
    "StopRun",
    "check_backend",
    "check_resume_matches",
    "play_durably",
]


def is_redis_target(target: str | os.PathLike[str]) -> bool:
    """Whether a CLI-style snapshot ``target`` is a Redis URL (else a directory path)."""
    return re.match(r"(redis|rediss|unix)://", os.fspath(target)) is not None


def open_snapshot_store(
    target: str | os.PathLike[str], *, keep: int = 5, namespace: str = "default"
) -> SnapshotStore:
    """A store for a CLI-style ``target``.

    A ``redis://``, ``rediss://`` or ``unix://`` URL gives a ``RedisSnapshotStore`` with
    key prefix ``atc-stream:<namespace>`` (needs the ``redis`` extra); anything else is a
    directory path and gives a ``DirectorySnapshotStore`` with file prefix ``snapshot``
    (``snapshot-<namespace>`` for a namespace other than "default", so shards may share a
    directory).
    """
    text = os.fspath(target)
    if is_redis_target(text):
        require("redis", "a Redis snapshot store")
        # imported here: redis is an optional extra, and the base install must run
        from atc_stream.connectors.redis.snapshots import RedisSnapshotStore, namespace_prefix

        return RedisSnapshotStore(text, prefix=namespace_prefix(namespace), keep=keep)
    prefix = "snapshot" if namespace == "default" else f"snapshot-{namespace}"
    try:
        return DirectorySnapshotStore(text, keep=keep, prefix=prefix)
    except ValueError:  # the namespace is part of every snapshot's file name
        raise RunError(
            f"namespace {namespace!r} cannot name snapshot files in {text}: use letters, "
            "digits, '_', '.' and '-'"
        ) from None
    except OSError as exc:  # a file in the way, a read-only or virtual file system
        why = "it is a file; give a directory" if Path(text).is_file() else exc.strerror or exc
        raise RunError(f"cannot use {text} as a snapshot directory: {why}") from None


def _strategy_difference(asked: list[dict], traded: list[dict]) -> str:
    """What differs between the strategies asked for and those a snapshot trades, shortly."""
    if len(asked) != len(traded):
        return f"{len(asked)} strategies asked, the snapshot trades {len(traded)}"
    for i, (mine, theirs) in enumerate(zip(asked, traded, strict=True)):
        keys = sorted(set(mine) | set(theirs))
        changed = [
            f"{k}={mine.get(k)!r} (snapshot: {theirs.get(k)!r})"
            for k in keys
            if mine.get(k) != theirs.get(k)
        ]
        if changed:
            return f"strategy {i}: " + ", ".join(changed)
    return "their order"


def check_redis_reachable(url: str) -> None:
    """``RunError`` (``redis_failure``) when Redis at ``url`` cannot be reached or
    refuses to serve it (a database out of range, refused credentials) at the start: a
    run would otherwise publish into the void, counting drops, until it ends. Later
    outages are retried with backoff."""
    import redis as redis_lib

    client = redis_lib.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5)
    try:
        client.ping()
    except (redis_lib.RedisError, OSError) as exc:
        raise redis_failure(url, exc, "at the start") from None
    finally:
        client.close()


def refuse_earlier_output(output, store) -> None:
    """``RunError`` when ``--resume`` found no snapshot but ``output`` (a file, or a
    Parquet directory) already holds rows of an earlier run that a fresh start could
    not write again: it would overwrite them."""
    if output is None or str(output) == "-":
        return
    path = Path(output)
    if _holds_rows(path):
        raise RunError(
            f"--resume: no snapshot in the {store} to resume from, but {path} already holds "
            "the output of an earlier run; starting fresh would overwrite it. Move it away "
            "(or choose another -o) to start fresh"
        )


def _holds_rows(path: Path) -> bool:
    """Whether ``path`` (a file, or a Parquet directory) holds rows. A CSV file's header
    line is written when the file is opened: on its own (a run stopped before its first
    row) it is no row to keep."""
    if path.is_dir():
        return any(path.iterdir())
    if not path.is_file():
        return False
    try:
        with open(path, "rb") as file:
            if output_format(path) == "csv":
                file.readline()
            return file.read(1) != b""
    except OSError:  # not readable: judged by its size alone
        return path.stat().st_size > 0


class TerminatedBeforeStart(KeyboardInterrupt):
    """SIGTERM while a job starts up, before its ``Durability`` handles the signal."""


#: What a stop during a job's start-up says after ``atc-stream: SIGTERM: `` (or SIGINT).
STOPPED_IN_START_UP = "stopped during start-up, before any row was written"


def sigterm_stops_start_up(job: Callable[..., int]) -> Callable[..., int]:
    """``job`` (a command's run function) ended cleanly by a SIGTERM that comes before its
    ``Durability`` takes the signal over (checks, restoring a snapshot, loading kernels,
    connecting): nothing is applied by then, so the snapshots are as they were; one line,
    exit 0. Without it the process would die on the spot without a word."""

    @functools.wraps(job)
    def run(**options: Any) -> int:
        def stop(signum, frame) -> None:
            if not Durability.entered:  # (after the run, its own stop is under way)
                raise TerminatedBeforeStart

        Durability.entered = Durability.signalled = False
        previous = signal.signal(signal.SIGTERM, stop)
        try:
            return job(**options)
        except TerminatedBeforeStart as exc:
            interrupted(exc, f"atc-stream: SIGTERM: {STOPPED_IN_START_UP}")
            return 0
        finally:
            # after a stop by signal the process is on its way out: a service manager's
            # second SIGTERM then meets ``stop`` (a no-op once entered), not the default
            # action that would end a clean stop as "killed by SIGTERM"
            if not Durability.signalled:
                signal.signal(signal.SIGTERM, previous)

    return run


class StopRun(Exception):
    """Raised from a result callback to end a run early (after SIGINT/SIGTERM)."""


class Durability:
    """Snapshots (store + periodic ``Snapshotter``), the Redis publisher and clean shutdown
    on SIGINT/SIGTERM for one run.

    ``snapshot_dir`` (else ``redis``) names the snapshot store; ``resume`` restores from
    it. ``namespace``: the command's ``--namespace`` (None: it has none; the store's is
    "default"). With ``refuse_existing`` and without ``resume`` a store that already
    holds snapshots is refused (a fresh run must not bury the snapshots of another one).
    """

    def __init__(
        self,
        *,
        redis: str | None,
        redis_prefix: str = REDIS_PREFIX,
        snapshot_dir: Path | None,
        snapshot_every: int | None,
        resume: bool,
        publish: bool = True,
        namespace: str | None = None,
        refuse_existing: bool = False,
        events_before_ready: bool = False,
    ) -> None:
        self.events_before_ready = events_before_ready
        self.redis = redis
        self.redis_prefix = redis_prefix
        self.snapshot_every = snapshot_every
        self.resume = resume
        self.publish = publish and redis is not None
        self.store: SnapshotStore | None = None
        self.snapshotter: Snapshotter | None = None
        #: the thread publisher, or the event-loop one a command sets (``live``)
        self.publisher: SignalPublisher | LoopPublisher | None = None
        self.stop_requested = False
        #: the signal that asked the run to stop (``signal.SIGINT``/``SIGTERM``), or None
        self.stop_signal: int | None = None
        self.restored = False
        #: what starts fresh beside this store, as the refusals of a resume say it
        self.fresh_store = _fresh_store(snapshot_dir, namespace)
        self.final_offsets: Callable[[], dict[str, Any]] | None = None
        #: whether the run has started up, for a job whose run starts up before it
        #: applies anything (``live`` waits for the exchange's history): stopped before,
        #: it leaves the snapshots as they were. None: the run applies from its start
        self.started_up: Callable[[], bool] | None = None
        #: whether the run has written output (rows, previews) yet: from the first row
        #: on, a stop during start-up is an ordinary stop, since only a final snapshot
        #: accounts for those rows on ``--resume``. None: taken as nothing written
        self.wrote: Callable[[], bool] | None = None
        self._signalled_in_start_up = False
        self._on_stop: list[Callable[[], object]] = []
        if redis is not None:
            require("redis", "--redis")
        target = snapshot_dir if snapshot_dir is not None else redis
        if target is None:
            if snapshot_every is not None or resume:
                raise RunError("--snapshot-every and --resume need --snapshot-dir or --redis")
            return
        if snapshot_dir is not None or snapshot_every is not None or resume:
            self.store = open_snapshot_store(target, namespace=namespace or "default")
        if refuse_existing and self.store is not None and not resume:
            try:
                existing = self.store.list()
            except Exception as exc:  # store unreachable: reported when first used
                existing = []
                err(f"atc-stream: cannot list snapshots in {self.store!r}: {exc}")
            if existing:
                raise RunError(
                    f"{self.store!r} already holds snapshots ({len(existing)}); add --resume "
                    f"to continue from them, or use {self.fresh_store} (or delete them) to "
                    "start fresh"
                )
        if redis is not None:  # after the local checks of the options and the store
            check_redis_reachable(redis)

    def restore(self, backend: str, outputs="all"):
        """The engine of the newest good snapshot with ``--resume``; None to start fresh."""
        if not self.resume or self.store is None:
            return None
        try:
            with warnings.catch_warnings():  # logged already: one line on stderr, not two
                warnings.simplefilter("ignore", SnapshotWarning)
                found = self.store.latest()
        except SnapshotError as exc:
            raise RunError(
                f"{exc}; to start fresh, run without --resume and with "
                f"{self.fresh_store} (or delete the damaged snapshots)"
            ) from exc
        except Exception as exc:  # a store that cannot be reached
            raise RunError(f"cannot read snapshots from {self.store!r}: {exc}") from exc
        if found is None:
            err(f"atc-stream: no snapshot in the {self.store}; starting from the beginning")
            return None
        engine = Engine.restore(found.decoded or found.blob, backend=backend, outputs=outputs)
        self.restored = True
        err(f"atc-stream: restored snapshot {found.id} ({len(engine.streams)} streams)")
        return engine

    def open_engine(
        self,
        backend: str,
        param_sets=None,
        interval: str | None = None,
        outputs="all",
        strategies: list[Strategy] | None = None,
    ):
        """The engine to run: with ``--resume`` the restored one (``RunError`` when it does
        not match ``param_sets``/``interval``), else a fresh one (defaults for None). Its CPU
        kernels are compiled or loaded before it returns, so no progress rate, ETA,
        ``--max-seconds`` or event loop includes compilation. ``outputs``: the engine's
        output groups (``Engine(outputs=...)``); the CLI writes the full schema.
        ``strategies``: paper trading (a resumed engine must trade the same ones)."""
        engine = self.restore(backend, outputs)
        if engine is not None:
            check_resume_matches(
                engine, param_sets=param_sets, interval=interval, fresh=self.fresh_store
            )
            asked = [s.to_dict() for s in strategies or []]
            traded = [s.to_dict() for s in engine.strategies]
            if asked != traded:
                difference = _strategy_difference(asked, traded)
                raise RunError(
                    f"--strategy differs from the snapshot's ({difference}); resume with the "
                    f"snapshot's strategies, or start fresh with {self.fresh_store}"
                )
        else:
            engine = Engine(
                param_sets or [ATCParams()], backend=backend, interval=interval or INTERVAL,
                outputs=outputs, strategies=strategies or None,
            )  # fmt: skip
        _load_kernels(engine)
        return engine

    def start(self, engine) -> None:
        if self.store is not None:
            self.snapshotter = Snapshotter(
                engine, self.store, every_bars=self.snapshot_every or SNAPSHOT_EVERY
            )
        if self.publish:
            from atc_stream.connectors.redis.pubsub import SignalPublisher

            assert self.redis is not None  # publish is only set with a Redis URL
            self.publisher = SignalPublisher(
                self.redis, prefix=self.redis_prefix, events_before_ready=self.events_before_ready
            )

    def open_output(self, engine, output, source_name: str, *, replayable: bool = True):
        """The writer of ``output`` (Parquet parts carry the parameter sets): after a
        restore, cut back to the position the snapshot recorded for ``source_name`` and
        appended to; else new. ``replayable`` False (``live``: bars that closed while the
        process was down cannot be had again): ``--resume`` without a snapshot refuses an
        output that holds an earlier run's rows rather than start it afresh."""
        recorded = engine.source_offsets.get(source_name) if self.restored else None
        if self.resume and not self.restored and not replayable:
            refuse_earlier_output(output, self.store)
        earlier = ((recorded or {}).get("output") or {}).get("path")
        if earlier and str(output) != "-" and not same_path(earlier, output):
            err(
                f"atc-stream: note: the snapshot's output is {earlier}; {output} is another "
                "file and gets only the rows from the snapshot on"
            )
        if self.restored and str(output) == "-":
            err(
                "atc-stream: note: resuming to stdout: rows written after the snapshot by "
                "the stopped run come again (a file output is cut back to the snapshot)"
            )
        return open_writer(
            output,
            metadata=params_metadata(engine.param_sets, engine.interval),
            resume_from=(recorded or {}).get("output"),
        )

    def on_stop(self, callback: Callable[[], object]) -> None:
        self._on_stop.append(callback)

    def starting_up(self) -> bool:
        """Whether the run is still starting up (``started_up`` says not yet) and has
        written nothing."""
        if self.started_up is None or self.started_up():
            return False
        return not self._wrote()

    def _wrote(self) -> bool:
        return self.wrote is not None and self.wrote()

    @property
    def stopped_in_start_up(self) -> bool:
        """Whether a signal stopped the run during its start-up, before it wrote anything,
        so that no final snapshot is taken and the summary is short. Decided when the
        signal came, unless the batch under way then wrote rows after all: the output
        then holds rows that only the final snapshot can account for."""
        return self._signalled_in_start_up and not self._wrote()

    def _handle(self, signum, frame) -> None:
        if self.stop_requested and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop at once
        first = not self.stop_requested
        self.stop_requested = Durability.signalled = True
        self.stop_signal = self.stop_signal or signum
        name = signal.Signals(signum).name
        if first:
            self._signalled_in_start_up = self.starting_up()
        if self._signalled_in_start_up:
            err(f"atc-stream: {name}: {STOPPED_IN_START_UP}")
        else:
            err(f"atc-stream: {name}: stopping after the current batch")
        for callback in self._on_stop:
            callback()

    #: whether a run has taken over SIGINT/SIGTERM (``sigterm_stops_start_up``), and
    #: whether a signal has asked it to stop
    entered = False
    signalled = False

    def __enter__(self) -> Durability:
        Durability.entered = True
        self._previous = {
            sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        clean = exc_type is None or exc_type is StopRun
        if clean and self._signalled_in_start_up and not self.stopped_in_start_up:
            # its line said "before any row was written", which is no longer so
            err(
                "atc-stream: note: the batch under way when the signal came wrote rows "
                "after all: the stop is an ordinary one (a final snapshot, the summary)"
            )
        if self.snapshotter is not None:
            snapshotter = self.snapshotter
            # stopped before any row was written, the engine is the restored snapshot or
            # empty: a snapshot of it would only bury the newest one with nothing new
            if clean and not self.stopped_in_start_up:  # the state matches the offsets
                try:
                    offsets = self.final_offsets() if self.final_offsets is not None else None
                    snapshot_id = snapshotter.close(offsets)
                    err(f"atc-stream: final snapshot {snapshot_id}")
                except Exception as exc:  # store down, disk full: say so, do not crash
                    snapshotter.failures += 1
                    snapshotter.last_error = exc
                    err(f"atc-stream: final snapshot NOT saved ({type(exc).__name__}: {exc}); "
                         f"the newest saved one is {snapshotter.last_id or 'none'}")  # fmt: skip
            else:
                snapshotter.wait()
            if snapshotter.failures:
                written, failed = snapshotter.snapshots_written, snapshotter.failures
                err(f"  snapshots        {written} written, {failed} failed "
                     f"(last error: {snapshotter.last_error})")  # fmt: skip
        if self.publisher is not None:
            self.publisher.close()
            stats = self.publisher.stats()
            err(
                f"  redis publish    {stats['delivered']} steps delivered, "
                f"{stats['dropped']} dropped ({stats['delivered_rows']} rows delivered, "
                f"{stats['dropped_rows']} dropped)"
            )


def _fresh_store(snapshot_dir: Path | None, namespace: str | None) -> str:
    """The options that give a run a store of its own: a snapshot directory's name, or
    for snapshots in Redis the ``--namespace`` of their keys (a command without one gets
    a directory instead)."""
    if snapshot_dir is not None:
        return "another --snapshot-dir" + (" or --namespace" if namespace is not None else "")
    return "another --namespace" if namespace is not None else "a --snapshot-dir"


def check_resume_matches(
    engine, *, param_sets=None, interval: str | None = None, fresh: str = "another --snapshot-dir"
) -> None:
    """``RunError`` when the parameter sets or interval asked for differ from the restored
    engine's (None: not asked for, take the snapshot's); ``fresh``: what the message
    offers to start fresh with (``Durability.fresh_store``)."""
    if param_sets is not None:
        have = [p.to_dict() for p in engine.param_sets]
        want = [p.to_dict() for p in param_sets]
        if have != want:
            raise RunError(
                f"--params differ from the snapshot's ({len(want)} parameter set(s) asked, "
                f"the snapshot holds {have}); resume with the snapshot's parameters, or "
                f"start fresh with {fresh}"
            )
    if interval is not None and engine.interval != interval:
        raise RunError(
            f"--interval {interval!r} differs from the snapshot's {engine.interval!r}; "
            f"resume with the snapshot's interval, or start fresh with {fresh}"
        )


def last_times_by_symbol(engine, names: np.ndarray) -> np.ndarray:
    """Per symbol of ``names``: the earliest last-applied bar time over its streams
    (``iinfo(int64).min`` for a symbol without streams, or with a stream without bars)."""
    floor = np.iinfo(np.int64).min
    out = np.full(len(names), floor, np.int64)
    known = engine.symbol_slots
    for i, name in enumerate(names.tolist()):
        if name not in known:
            continue
        lasts = engine.last_bar_times(name)
        if None not in lasts:
            out[i] = min(lasts)
    return out


def play_durably(
    engine,
    bars,
    *,
    warmup: int,
    speed: float | None,
    progress: bool,
    writer,
    durability: Durability,
    source: dict[str, Any],
    on_result: Callable | None = None,
):
    """Play ``bars`` (a ``BarTable`` or a ``replay.stream.BarFileSource``) through
    ``engine``; snapshots record each symbol's last bar time (in
    the state) and the writer's durable position (in ``source_offsets[source['name']]``).

    After a restore, rows at or before their symbol's last applied time are skipped and
    no warmup is done (the restored streams are warm). Returns the ``ReplaySummary``.
    """
    name = source["name"]
    recorded = engine.source_offsets.get(name) if durability.restored else None
    if durability.restored:
        if recorded is None:
            raise RunError(
                f"the snapshot holds no {name!r} position (it was taken by another command; "
                f"offsets: {sorted(engine.source_offsets)})"
            )
        if recorded.get("columns") not in (None, source.get("columns")):
            raise RunError(
                f"input columns {source.get('columns')} differ from the snapshot's "
                f"{recorded.get('columns')}; resume with the same --*-column options"
            )
        if recorded.get("input") != source["input"]:
            err(
                f"atc-stream: note: the snapshot was taken on {recorded.get('input')!r}; "
                f"continuing on {source['input']!r} after each symbol's last applied time"
            )
        warmup = 0
    rows_before = int(recorded.get("rows", 0)) if recorded else 0
    durability.start(engine)
    player = BarPlayer(
        engine, bars, warmup_bars=warmup, speed=speed, progress=progress,
        events_before_ready=durability.events_before_ready,
    )  # fmt: skip
    if durability.publisher is not None:
        player.batch_rows = 0  # Redis gets one batch message per engine step: a bar time
    snapshotter = durability.snapshotter

    def offsets() -> dict[str, Any]:
        rows = rows_before + player.summary.warmup_bars + player.summary.step_bars
        entry = {"input": source["input"], "rows": rows, "output": writer.position()}
        if source.get("columns") is not None:
            entry["columns"] = source["columns"]
        return {name: entry}

    def stop_if_asked() -> None:  # after a result, and in a paced replay's wait
        if durability.stop_requested:
            raise StopRun

    def emit(result) -> None:
        writer.write(result)
        if on_result is not None:
            on_result(result)
        if durability.publisher is not None:
            durability.publisher.publish(result)
        if snapshotter is not None:
            # the output's position is taken (and made durable) only when the state is
            # copied, so snapshot and output agree
            snapshotter.maybe_snapshot(len(result), offsets)
        stop_if_asked()

    player.on_result = emit
    player.on_wait = stop_if_asked
    durability.final_offsets = offsets
    applied_until = None
    if durability.restored:  # rows at or before each symbol's last applied bar: skipped
        names = np.array(player.source.symbol_names, dtype=object)
        applied_until = last_times_by_symbol(engine, names)
    with durability:
        try:
            summary = player.run(applied_until)
        except StopRun:
            summary = player.summary
            summary.stopped = True
    if durability.restored:
        err(f"atc-stream: resuming: {player.source.skipped} rows at or before their "
             f"symbol's last applied bar skipped, {summary.step_bars} played")  # fmt: skip
    return summary


def check_backend(backend: str) -> None:
    """``RunError`` naming the missing extra or piece when ``backend`` is "cuda" and CUDA
    cannot run here; a job calls it before any work (the engine would raise the same
    as a ``RuntimeError`` only when it is built)."""
    if backend != "cuda":
        return
    require("cuda", "--backend cuda")
    available, why = cuda_available(allow_simulator=True)
    if not available:
        raise RunError(f"--backend cuda: CUDA is unavailable here: {why}")


def _load_kernels(engine) -> None:
    """The CPU kernels of ``engine`` (``load_cpu_kernels``); other backends compile their
    own kernels, only the CPU kernels are cached here."""
    if engine.backend.name == "cpu":
        load_cpu_kernels(strategies=bool(engine.strategies))


def load_cpu_kernels(*, strategies: bool, progress: bool = True) -> None:
    """Before a command reads input: compile/load the CPU kernels (``strategies``: those
    of trading too), saying so on a first run (a progress bar with ``progress``, on a
    terminal). So progress bars, ``--max-seconds`` and the event loop never include
    compilation."""
    result = Engine.compile(
        lambda line: err(f"atc-stream: {line}"),
        progress=progress and stderr_is_terminal(),
        strategies=strategies,
    )
    if result.compiled:
        err(f"atc-stream: {result.summary()}")
