"""The ``demo`` job: a deterministic multi-symbol random walk replayed through the engine
(with the same snapshots and lossless resume as ``replay``), then checked against a full
recomputation of each symbol's series."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from atc_stream.app.console import OptionError, err
from atc_stream.app.durability import Durability, check_backend, play_durably
from atc_stream.connectors.replay.player import random_walk_table
from atc_stream.core.params import load_param_sets
from atc_stream.engine.series import compute
from atc_stream.io.writers import check_apart, check_outputs, open_writer

#: Name of the demo's entry in ``Engine.source_offsets``.
DEMO_SOURCE = "demo"
#: Memory a bar of the demo's data set takes at the peak of making it (its close, time
#: and symbol in the table, and the random walk's temporaries)
BYTES_PER_BAR = 64


def run_demo(
    *,
    symbols: int,
    bars: int,
    seed: int,
    warmup: int,
    output: str,
    params: Path | None,
    progress: bool,
    backend: str,
    check: bool,
    redis: str | None,
    redis_prefix: str,
    snapshot_dir: Path | None,
    snapshot_every: int | None,
    resume: bool,
) -> int:
    """Replay the random walk; the exit status (130 when stopped by a signal, 1 when the
    recomputation check finds a mismatch)."""
    check_backend(backend)
    check_apart({}, {"-o": output}, snapshot_dir)
    check_outputs({"-o": output})
    _check_size(symbols, bars)
    try:
        param_sets = load_param_sets(params)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    table = random_walk_table(symbols, bars, seed)
    shown = min(warmup, bars)  # a longer warmup is the whole walk
    err(f"atc-stream demo: {symbols} symbols x {bars} bars, warmup {shown}, output {output}")
    last_signal: dict[str, float] = {}

    def remember(result) -> None:
        for key, value in zip(result.keys, result.signal, strict=True):
            if key.params_id == 0:
                last_signal[key.symbol] = value

    durability = Durability(
        redis=redis, redis_prefix=redis_prefix, snapshot_dir=snapshot_dir,
        snapshot_every=snapshot_every, resume=resume,
    )  # fmt: skip
    engine = durability.open_engine(backend, param_sets if params else None)
    source = {"name": DEMO_SOURCE, "input": f"random-walk {symbols}x{bars} seed {seed}"}
    resume_from = (engine.source_offsets.get(DEMO_SOURCE) or {}).get("output")
    with open_writer(output, resume_from=resume_from) as writer:
        summary = play_durably(
            engine, table, warmup=warmup, speed=None, progress=progress, writer=writer,
            durability=durability, source=source, on_result=remember,
        )  # fmt: skip
    err(f"atc-stream: demo done ({engine.backend.name} backend)")
    for line in summary.lines():
        err("  " + line)
    if durability.stop_requested:
        return 130
    if check:
        return _check(table, engine.param_sets[0], last_signal)
    return 0


def _check_size(symbols: int, bars: int) -> None:
    """Refuse a data set larger than half this machine's memory (it would be killed or
    swap for minutes), before making it."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # not a POSIX system: no check
        return
    need = symbols * bars * BYTES_PER_BAR
    if need > memory // 2:
        raise OptionError(
            f"{symbols:,} symbols x {bars:,} bars need ~{need / 2**30:,.1f} GiB for the demo's "
            f"data set, more than half of this machine's {memory / 2**30:,.1f} GiB; give "
            "fewer --symbols or --bars",
            param_hint="--bars",
        )


def _check(table, params, last_signal: dict[str, float]) -> int:
    """Compare each symbol's last streamed signal with a full recomputation; 1 on any
    mismatch."""
    mismatches = 0
    checked = [sym for sym in table.symbol_names if sym in last_signal]  # all unless resumed
    for symbol in checked:
        closes = table.closes[table.symbols == symbol]
        full = compute(closes, params)["signal"][-1]
        mismatches += not np.array_equal(full, last_signal[symbol], equal_nan=True)
    verdict = "identical" if mismatches == 0 else f"{mismatches} MISMATCHES"
    err(f"  full recomputation check: last signal of {len(checked)} symbols {verdict}")
    return 1 if mismatches else 0
