"""Streams moved between engines: ``Engine.export_streams`` / ``import_streams`` and
``split_snapshot`` / ``merge_snapshots`` (atc_stream/state/snapshot_parts.py), checked
against one engine that never split, on the CPU (the CUDA simulator's run is in
test_snapshot_parts_cudasim.py)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from parts_helpers import (
    PARAMS,
    STRATEGIES,
    bars_of,
    canonical,
    make_engine,
    play,
    walks,
)

from atc_stream import Engine
from atc_stream.core.shards import shard_of
from atc_stream.state.snapshot import SnapshotError, read_header
from atc_stream.state.snapshot_parts import merge_snapshots, split_snapshot


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_symbols=st.integers(1, 5),
    parts=st.integers(1, 3),
    seed=st.integers(0, 2**16),
    warm=st.integers(0, 30),
    steps=st.integers(1, 12),
    trading=st.booleans(),
    data=st.data(),
)
def test_split_restore_step_equals_never_split(n_symbols, parts, seed, warm, steps, trading, data):
    symbols = [f"S{i}" for i in range(n_symbols)]
    where = {s: data.draw(st.integers(0, parts - 1), label=s) for s in symbols}
    closes = walks(seed, symbols, warm + steps)
    whole = make_engine("cpu", trading, symbols, closes, warm)
    blob = whole.snapshot(source_offsets={"row": warm})
    pieces = split_snapshot(blob, where.__getitem__, parts)
    assert len(pieces) == parts
    engines = [Engine.restore(p, backend="cpu", outputs="all") for p in pieces]
    for i, eng in enumerate(engines):
        assert eng.symbols == sorted(s for s in symbols if where[s] == i)
        assert eng.source_offsets == {"row": warm}
    expected = canonical(play(whole, closes, warm, steps, trading))
    got: list = []
    for eng in engines:
        got += canonical(play(eng, closes, warm, steps, trading))
    assert sorted(got) == expected
    # the parts merged back go on like the engine that never split
    merged = Engine.restore(merge_snapshots(e.snapshot() for e in engines), backend="cpu")
    merged.outputs = "all"
    reference = make_engine("cpu", trading, symbols, closes, warm + steps)
    more = walks(seed + 1, symbols, warm + steps + 4)
    for s in symbols:  # the same continuation bars for both
        more[s][: warm + steps] = closes[s]
    assert canonical(play(merged, more, warm + steps, 4, trading)) == canonical(
        play(reference, more, warm + steps, 4, trading)
    )
    assert merged.rejections == reference.rejections


@pytest.mark.parametrize("trading", [False, True])
def test_export_then_import_moves_symbols_between_live_engines(trading):
    symbols = ["BTC", "ETH", "SOL", "XRP"]
    closes = walks(7, symbols, 60)
    whole = make_engine("cpu", trading, symbols, closes, 40)
    left = make_engine("cpu", trading, symbols[:2], closes, 40)
    right = make_engine("cpu", trading, symbols[2:], closes, 40)
    blob = right.export_streams(["SOL"], source_offsets={"stream": "5-0"})
    assert read_header(blob).source_offsets == {"stream": "5-0"}
    assert read_header(blob).rejections == {}
    added = left.import_streams(blob)
    assert sorted({k.symbol for k in added}) == ["SOL"]
    assert len(added) == len(PARAMS)
    right.remove_symbol("SOL")
    assert left.symbols == ["BTC", "ETH", "SOL"] and right.symbols == ["XRP"]
    got = canonical(play(left, closes, 40, 20, trading)) + canonical(
        play(right, closes, 40, 20, trading)
    )
    assert sorted(got) == canonical(play(whole, closes, 40, 20, trading))


def test_export_of_every_parameter_set_and_strategy():
    symbols = ["A", "B"]
    eng = make_engine("cpu", True, symbols, walks(1, symbols, 20), 20)
    snap = Engine.restore(eng.export_streams(["B"]), backend="cpu")
    assert snap.streams == [k for k in eng.streams if k.symbol == "B"]
    assert snap.strategies == STRATEGIES
    for key in snap.streams:
        assert snap.stream_state(key) == eng.stream_state(key)


def test_unknown_symbol_is_named():
    eng = make_engine("cpu", False, ["A"], walks(1, ["A"], 5), 5)
    with pytest.raises(ValueError, match="NOPE"):
        eng.export_streams(["A", "NOPE"])


def test_import_conflicts_are_named():
    closes = walks(2, ["A", "B"], 10)
    eng = make_engine("cpu", False, ["A"], closes, 10)
    with pytest.raises(ValueError, match="already present"):
        eng.import_streams(make_engine("cpu", False, ["A"], closes, 10).snapshot())
    with pytest.raises(ValueError, match="parameter table"):
        eng.import_streams(Engine(PARAMS[:1], backend="cpu").snapshot())
    with pytest.raises(ValueError, match="interval"):
        eng.import_streams(Engine(PARAMS, backend="cpu", interval="5m").snapshot())
    with pytest.raises(ValueError, match="strategies"):
        eng.import_streams(make_engine("cpu", True, ["B"], closes, 10).snapshot())
    assert eng.symbols == ["A"]  # nothing was added by a refused import


def test_damaged_blobs_are_refused():
    closes = walks(3, ["A", "B"], 10)
    blob = make_engine("cpu", False, ["A", "B"], closes, 10).snapshot()
    damaged = blob[:-10] + bytes(b ^ 0xFF for b in blob[-10:])
    eng = make_engine("cpu", False, ["C"], walks(3, ["C"], 10), 10)
    for bad in (damaged, blob[:-1], b"", b"ATCSNAP\x00junk"):
        with pytest.raises(SnapshotError):
            split_snapshot(bad, lambda s: 0, 2)
        with pytest.raises(SnapshotError):
            merge_snapshots([blob, bad])
        with pytest.raises(SnapshotError):
            eng.import_streams(bad)
    assert eng.symbols == ["C"]


def test_merge_offsets_never_claim_one_position_for_all():
    a = make_engine("cpu", False, ["A"], walks(4, ["A"], 5), 5).snapshot(source_offsets={"x": 1})
    b = make_engine("cpu", False, ["B"], walks(4, ["B"], 5), 5).snapshot(source_offsets={"x": 2})
    c = make_engine("cpu", False, ["C"], walks(4, ["C"], 5), 5).snapshot(source_offsets={"x": 1})
    assert read_header(merge_snapshots([a, c])).source_offsets == {"x": 1}
    parts = read_header(merge_snapshots([a, b])).source_offsets
    assert parts == {"parts": [{"x": 1}, {"x": 2}]}
    given_offsets = read_header(merge_snapshots([a, b], {"x": 9})).source_offsets
    assert given_offsets == {"x": 9}
    with pytest.raises(ValueError, match="already present"):
        merge_snapshots([a, c, a])


def test_split_by_shard_and_bad_assignments():
    symbols = [f"SYM{i}" for i in range(12)]
    blob = make_engine("cpu", False, symbols, walks(5, symbols, 8), 8).snapshot()
    pieces = split_snapshot(blob, lambda s: shard_of(s, 4), 4)
    for shard, piece in enumerate(pieces):
        syms = {e.symbol for e in read_header(piece).streams}
        assert syms == {s for s in symbols if shard_of(s, 4) == shard}
    with pytest.raises(ValueError, match="not in 0..1"):
        split_snapshot(blob, lambda s: 2, 2)
    with pytest.raises(ValueError, match="positive int"):
        split_snapshot(blob, lambda s: 0, 0)


def test_empty_part_restores_and_takes_new_streams():
    blob = make_engine("cpu", False, ["A"], walks(6, ["A"], 8), 8).snapshot()
    empty = split_snapshot(blob, lambda s: 1, 2)[0]
    eng = Engine.restore(empty, backend="cpu")
    assert eng.streams == []
    eng.warmup({"B": bars_of(walks(6, ["B"], 8)["B"], 0, 8, False)})
    fresh = make_engine("cpu", False, ["B"], walks(6, ["B"], 8), 8)
    for key in fresh.streams:
        assert eng.stream_state(key) == fresh.stream_state(key)
