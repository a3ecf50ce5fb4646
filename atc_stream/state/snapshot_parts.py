"""Snapshots cut into parts by symbol and parts put back together: the streams of some
symbols taken out of a captured state, ``split_snapshot`` and ``merge_snapshots``
(docs/design/resharding-and-sweeps.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from atc_stream.core.results import StreamKey
from atc_stream.state.snapshot import (
    CapturedState,
    Snapshot,
    decode_snapshot,
    encode_snapshot,
    normalize_offsets,
    read_header,
)

__all__ = [
    "captured_from_snapshot",
    "check_compatible",
    "merge_snapshots",
    "select_streams",
    "split_snapshot",
]

#: The arrays with one row per slot, and those with one row per (slot, strategy).
SLOT_ARRAYS = ("ring", "values", "counters")
STRATEGY_ROW_ARRAYS = ("strategy_values", "strategy_counters", "strategy_entry_times")


def captured_from_snapshot(snap: Snapshot) -> CapturedState:
    """A decoded snapshot as the captured state it was encoded from (no copies)."""
    h = snap.header
    return CapturedState(
        params=list(h.params), interval=h.interval, backend=h.backend,
        registry=sorted(h.registry.items(), key=lambda item: item[1]),
        arrays=dict(snap.arrays), ring_capacity=h.ring_capacity,
        source_offsets=dict(h.source_offsets), rejections=dict(h.rejections),
        created_at=h.created_at, strategies=list(h.strategies),
    )  # fmt: skip


def _strategy_rows(slots: np.ndarray, n_strategies: int) -> np.ndarray:
    """The strategy state rows of ``slots``, slot by slot (row ``slot * n + k``)."""
    return (slots[:, None] * n_strategies + np.arange(n_strategies)).reshape(-1)


def _stacked(parts: Sequence[CapturedState]) -> CapturedState:
    """The streams of ``parts`` (compatible, disjoint) in one state, renumbered from slot 0
    in the order of the parts; free slots are left out (one free slot if none is left)."""
    first = parts[0]
    n_strategies = len(first.strategies)
    registry: list[tuple[StreamKey, int]] = []
    pieces: dict[str, list[np.ndarray]] = {n: [] for n in SLOT_ARRAYS + STRATEGY_ROW_ARRAYS}
    for part in parts:
        slots = np.array([slot for _, slot in part.registry], np.int64)
        registry += [(key, len(registry) + i) for i, (key, _) in enumerate(part.registry)]
        for name in SLOT_ARRAYS:
            pieces[name].append(part.arrays[name][slots])
        for name in STRATEGY_ROW_ARRAYS:
            pieces[name].append(part.arrays[name][_strategy_rows(slots, n_strategies)])
    arrays = {name: np.concatenate(p) for name, p in pieces.items()}
    n = len(registry)
    in_use = np.ones(max(n, 1), np.bool_)
    if n == 0:  # a state has at least one slot; a free one is reset when it is allocated
        in_use[0] = False
        for name in SLOT_ARRAYS:
            arrays[name] = np.zeros((1, *first.arrays[name].shape[1:]), first.arrays[name].dtype)
        arrays["ring"][:] = np.nan
        for name in STRATEGY_ROW_ARRAYS:
            a = first.arrays[name]
            arrays[name] = np.zeros((n_strategies, *a.shape[1:]), a.dtype)
    arrays["in_use"] = in_use
    for name in ("param_lengths", "param_values", "strategy_param_values", "strategy_param_ints"):
        arrays[name] = first.arrays[name]
    return replace(first, registry=registry, arrays=arrays)


def select_streams(captured: CapturedState, keep: Callable[[StreamKey], bool]) -> CapturedState:
    """The streams of ``captured`` that ``keep`` accepts, renumbered from slot 0 (copies)."""
    picked = [(key, slot) for key, slot in captured.registry if keep(key)]
    return _stacked([replace(captured, registry=picked)])


def check_compatible(mine: CapturedState, other: CapturedState, what: str = "snapshot") -> None:
    """``ValueError`` naming the difference unless the streams of ``other`` can live beside
    those of ``mine`` (same parameter table, interval, strategies and ring; no stream in
    both)."""
    for name, a, b in (
        ("parameter table", mine.params, other.params),
        ("interval", mine.interval, other.interval),
        ("strategies", mine.strategies, other.strategies),
        ("ring capacity", mine.ring_capacity, other.ring_capacity),
    ):
        if a != b:
            raise ValueError(f"{what} has another {name} ({b!r}) than this engine's ({a!r})")
    both = {key for key, _ in mine.registry} & {key for key, _ in other.registry}
    if both:
        raise ValueError(f"{what} holds stream(s) already present: {sorted(both)[:5]}")


def split_snapshot(blob: bytes, assign: Callable[[str], int], parts: int) -> list[bytes]:
    """``blob`` cut into ``parts`` snapshots: part ``assign(symbol)`` gets every stream of
    ``symbol``. Each part keeps ``blob``'s source offsets (its streams stand where the whole
    stood); part 0 carries the rejection counts, so a merge of the parts sums back to them.
    ``SnapshotError`` if ``blob`` does not verify, ``ValueError`` for a bad assignment."""
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ValueError(f"parts must be a positive int, got {parts!r}")
    whole = captured_from_snapshot(decode_snapshot(blob))
    where: dict[str, int] = {}
    for key, _ in whole.registry:
        if key.symbol not in where:
            part = assign(key.symbol)
            if isinstance(part, bool) or not isinstance(part, (int, np.integer)):
                raise ValueError(f"assign({key.symbol!r}) returned {part!r}, not an int")
            if not 0 <= part < parts:
                raise ValueError(f"assign({key.symbol!r}) = {part} is not in 0..{parts - 1}")
            where[key.symbol] = int(part)
    out = []
    for i in range(parts):
        mine = [(key, slot) for key, slot in whole.registry if where[key.symbol] == i]
        piece = _stacked([replace(whole, registry=mine)])
        piece.rejections = dict(whole.rejections) if i == 0 else {}
        out.append(encode_snapshot(piece, _compression(blob)))
    return out


def merge_snapshots(
    blobs: Iterable[bytes], source_offsets: Mapping[str, Any] | None = None
) -> bytes:
    """One snapshot with the streams of every blob (same parameter table, interval and
    strategies; no stream in two of them), rejection counts summed.

    Source offsets: ``source_offsets`` when given; otherwise the parts' own offsets when
    they are all equal; otherwise ``{"parts": [offsets of part 0, of part 1, ...]}``, so
    that no single position claims to hold for streams that stood elsewhere.
    """
    blobs = list(blobs)
    if not blobs:
        raise ValueError("merge_snapshots needs at least one snapshot")
    parts = [captured_from_snapshot(decode_snapshot(b)) for b in blobs]
    for i, part in enumerate(parts[1:], 1):
        merged_keys = replace(parts[0], registry=[kv for p in parts[:i] for kv in p.registry])
        check_compatible(merged_keys, part, f"snapshot {i}")
    merged = _stacked(parts)
    if source_offsets is not None:
        merged.source_offsets = normalize_offsets(source_offsets)
    elif any(p.source_offsets != parts[0].source_offsets for p in parts):
        merged.source_offsets = {"parts": [p.source_offsets for p in parts]}
    rejections: dict[str, int] = {}
    for p in parts:
        for reason, count in p.rejections.items():
            rejections[reason] = rejections.get(reason, 0) + count
    merged.rejections = rejections
    return encode_snapshot(merged, _compression(blobs[0]))


def _compression(blob: bytes) -> str:
    """The compression ``blob`` was written with (the parts are written the same way)."""
    return read_header(blob).compression
