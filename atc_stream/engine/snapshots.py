"""An engine's state to and from a snapshot (format: ``state/snapshot.py``): the arrays
captured for a blob, a decoded snapshot's state loaded into a fresh engine, and the
streams of some symbols exported from or imported into a running engine."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from atc_stream.core.results import StreamKey
from atc_stream.engine.backends import make_backend
from atc_stream.state.arrays import lanes_to_rows, rows_to_lanes, set_values_of
from atc_stream.state.snapshot import (
    CapturedState,
    Snapshot,
    capture_state,
    decode_snapshot,
    encode_snapshot,
    normalize_offsets,
)
from atc_stream.state.snapshot_parts import (
    captured_from_snapshot,
    check_compatible,
    select_streams,
)


def capture(engine: Any, source_offsets: Mapping[str, Any] | None, copy: bool) -> CapturedState:
    """``engine.capture_snapshot()``: the state pulled from the backend, free slots after
    the last live one left out (so a snapshot's size follows the streams, not the capacity;
    slot numbers stay as they are)."""
    if source_offsets:
        engine.source_offsets.update(normalize_offsets(source_offsets))
    engine.backend.pull_state()
    s = engine.store
    live = np.flatnonzero(s.in_use)
    n = int(live[-1]) + 1 if live.size else 1
    rows = n * len(s.strategies)
    return capture_state(
        params=s.params.params, interval=engine.interval, backend=engine.backend.name,
        registry={key: engine.slot_of(key) for key in engine.streams},
        ring=s.ring[:n], values=lanes_to_rows(s.values, n), counters=s.counters[:n],
        in_use=s.in_use[:n],
        param_lengths=s.params.lengths, param_values=s.params.values,
        ring_capacity=s.ring_capacity, source_offsets=engine.source_offsets,
        rejections=engine.rejections, copy=copy, strategies=s.strategies.strategies,
        strategy_arrays={
            "strategy_values": s.strategy_values[:rows],
            "strategy_counters": s.strategy_counters[:rows],
            "strategy_entry_times": s.strategy_entry_times[:rows],
            "strategy_param_values": s.strategies.values,
            "strategy_param_ints": s.strategies.ints,
        },
    )  # fmt: skip


def load_state(eng: Any, snap: Snapshot, backend: str) -> None:
    """``snap``'s arrays, registry, rejection counts and offsets into ``eng``, an engine
    just made with its parameter sets, strategies and capacity."""
    h = snap.header
    store = eng.store
    reshaped = False
    names = ["ring", "values", "counters", "in_use"]
    if h.strategies:
        names += ["strategy_values", "strategy_counters", "strategy_entry_times"]
    for name in names:
        current = getattr(store, name)
        # a snapshot holds values as rows [slot, field]; the store, in lane blocks
        loaded = rows_to_lanes(snap.arrays[name]) if name == "values" else snap.arrays[name]
        if current.shape == loaded.shape:
            np.copyto(current, loaded)  # keeps the backend's host buffers
        else:
            setattr(store, name, loaded)
            reshaped = True
    if reshaped:
        store.ring_capacity = h.ring_capacity
        store.generation += 1
        old, eng.backend = eng.backend, make_backend(backend, store, eng.threads, eng.cuda_graph)
        old.close()
    eng.register_slots(list(h.registry), list(h.registry.values()))
    eng.rejections.update(h.rejections)
    eng.source_offsets = h.source_offsets
    eng.backend.push_state()


def export_streams(
    engine: Any, symbols: Iterable[str], source_offsets: Mapping[str, Any] | None = None
) -> bytes:
    """``engine.export_streams``: a snapshot of the streams of ``symbols`` only."""
    if isinstance(symbols, str):
        raise ValueError(f"symbols must be a list of symbols, not the one str {symbols!r}")
    wanted = list(symbols)
    unknown = [s for s in wanted if not isinstance(s, str) or s not in engine.symbol_slots]
    if unknown:
        raise ValueError(f"unknown symbol(s) {unknown[:5]}: the engine has no stream of them")
    offsets = {**engine.source_offsets, **normalize_offsets(source_offsets)}
    whole = capture(engine, None, copy=False)
    whole.source_offsets = offsets
    chosen = set(wanted)
    part = select_streams(whole, lambda key: key.symbol in chosen)
    part.rejections = {}
    return encode_snapshot(part)


def import_streams(engine: Any, blob: Any) -> list[StreamKey]:
    """``engine.import_streams``: the streams of ``blob`` added to ``engine``, each in a
    fresh slot with its state copied bit for bit."""
    snap = blob if isinstance(blob, Snapshot) else decode_snapshot(blob)
    incoming = captured_from_snapshot(snap)
    mine = capture(engine, None, copy=False)
    check_compatible(mine, incoming)
    store = engine.store
    n_strategies = len(store.strategies)
    added = []
    for key, slot in incoming.registry:
        new = store.allocate(key.params_id)
        store.ring[new] = incoming.arrays["ring"][slot]
        store.counters[new] = incoming.arrays["counters"][slot]
        set_values_of(store.values, np.array([new]), incoming.arrays["values"][slot])
        if n_strategies:
            src = slice(slot * n_strategies, (slot + 1) * n_strategies)
            for name in ("strategy_values", "strategy_counters", "strategy_entry_times"):
                getattr(store, name)[store.strategy_rows(new)] = incoming.arrays[name][src]
        engine.register_slots([key], [new])
        added.append(key)
    engine.backend.push_state()
    return added
