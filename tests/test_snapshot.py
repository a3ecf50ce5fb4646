"""Snapshots: format round trip, bit-identical continuation, refusal of damaged blobs,
the directory store, and the periodic Snapshotter (atc_stream/state/snapshot.py,
stores.py, snapshotter.py; Engine.snapshot/restore)."""

from __future__ import annotations

import os
import struct
import threading
import time
import warnings

import msgspec
import numpy as np
import pytest
from cuda_targets import cuda_kernels_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atc_stream import ATCParams, Engine, StreamKey
from atc_stream.app.durability import open_snapshot_store
from atc_stream.state.arrays import lanes_to_rows, values_of
from atc_stream.state.snapshot import (
    FORMAT_VERSION,
    MAGIC,
    PREAMBLE_SIZE,
    SnapshotError,
    SnapshotHeader,
    SnapshotWarning,
    assemble_blob,
    decode_snapshot,
    read_header,
)
from atc_stream.state.snapshot_stores import DirectorySnapshotStore
from atc_stream.state.snapshotter import Snapshotter

FAST = ATCParams(
    ema_len=9,
    hma_len=10,
    wma_len=8,
    dema_len=7,
    lsma_len=11,
    kama_len=6,
    robustness="Narrow",
    cutout=5,
    La=0.5,
)
PARAMS = [ATCParams(), FAST]
SYMBOLS = ["BTCUSDT", "ETHUSDT", "SOLUSDT", "XRPUSDT", "ADAUSDT"]
MINUTE = 60_000
STATE_ARRAYS = ("ring", "values", "counters", "in_use")


def random_walks(seed: int, n_bars: int, symbols=SYMBOLS) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        s: np.round(100.0 * np.exp(np.cumsum(rng.normal(0.0, 0.01, n_bars))), 4) for s in symbols
    }


def warmed_engine(seed: int = 1, n_bars: int = 200) -> tuple[Engine, dict[str, np.ndarray]]:
    """An engine warmed up on ``n_bars`` bars per symbol, and the continuation closes."""
    closes = random_walks(seed, n_bars + 200)
    eng = Engine(PARAMS, backend="cpu", outputs="all")
    eng.warmup({s: (np.arange(n_bars) * MINUTE, c[:n_bars]) for s, c in closes.items()})
    return eng, {s: c[n_bars:] for s, c in closes.items()}


def next_bars(rest: dict[str, np.ndarray], start_bar: int, k: int, first_time: int):
    """Bars ``start_bar .. start_bar+k-1`` of every symbol, as one step batch."""
    return [
        (s, first_time + (start_bar + j) * MINUTE, float(c[start_bar + j]))
        for j in range(k)
        for s, c in rest.items()
    ]


def _live_rows(engine: Engine) -> int:
    live = np.flatnonzero(engine.store.in_use)
    return int(live[-1]) + 1 if live.size else 0


def _strip(keys: list) -> list:
    keys = list(keys)
    while keys and keys[-1] is None:
        keys.pop()
    return keys


def slot_rows(store, name: str) -> np.ndarray:
    """A state array one row per slot (values are stored in lane blocks)."""
    if name == "values":
        return lanes_to_rows(store.values, store.capacity)
    return getattr(store, name)


def assert_same_state(a: Engine, b: Engine) -> None:
    """Bitwise-equal state of every slot up to the last live stream. Free slots after it
    are not state: snapshots leave them out, so a restored engine may have fewer."""
    n = max(_live_rows(a), _live_rows(b))
    for name in STATE_ARRAYS:
        x, y = slot_rows(a.store, name), slot_rows(b.store, name)
        assert x.dtype == y.dtype and x.shape[1:] == y.shape[1:], name
        assert x.shape[0] >= n and y.shape[0] >= n, name
        x, y = x[:n], y[:n]
        if x.dtype.kind == "f":
            assert np.array_equal(x.view(np.int64), y.view(np.int64)), name  # bitwise, NaN too
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name
    assert a.store.ring_capacity == b.store.ring_capacity
    assert a._slot_of == b._slot_of
    assert _strip(a._keys_by_slot) == _strip(b._keys_by_slot)
    assert a._symbol_slots.keys() == b._symbol_slots.keys()
    for sym in a._symbol_slots:
        assert np.array_equal(a._symbol_slots[sym], b._symbol_slots[sym])
    assert a.param_sets == b.param_sets
    assert np.array_equal(a.store.params.lengths, b.store.params.lengths)
    assert np.array_equal(a.store.params.values, b.store.params.values)
    assert a.interval == b.interval


def assert_same_outputs(r1, r2) -> None:
    assert np.array_equal(r1.slots, r2.slots)
    assert np.array_equal(r1.times, r2.times)
    assert r1.keys == r2.keys
    assert np.array_equal(r1.outputs, r2.outputs, equal_nan=True)
    assert np.array_equal(r1.outputs.view(np.int64), r2.outputs.view(np.int64))
    assert [(x.index, x.reason) for x in r1.rejected] == [(x.index, x.reason) for x in r2.rejected]


# -- round trip -----------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["zlib", "none"])
def test_round_trip_state_registry_and_next_bars(compression):
    eng, rest = warmed_engine()
    blob = eng.snapshot({"file": 12345, "redis": "1700000000000-3"}, compression=compression)
    restored = Engine.restore(blob, backend="cpu", outputs="all")
    assert_same_state(eng, restored)
    assert restored.source_offsets == {"file": 12345, "redis": "1700000000000-3"}
    assert restored.streams == eng.streams and len(restored.streams) == 2 * len(SYMBOLS)

    t0 = 200 * MINUTE
    for start, k in [(0, 1), (1, 3), (4, 1), (5, 10)]:  # single- and multi-bar batches
        bars = next_bars(rest, start, k, t0)
        bars.append(("BTCUSDT", t0, 1.0))  # a duplicate: rejected the same way by both
        assert_same_outputs(eng.step(bars), restored.step(bars))
    pv = next_bars(rest, 15, 1, t0)
    assert_same_outputs(eng.preview(pv), restored.preview(pv))
    assert_same_state(eng, restored)


def test_header_contents_and_read_header():
    eng, _ = warmed_engine(n_bars=50)
    eng.step([("BTCUSDT", 50 * MINUTE, float("nan"))])  # rejected
    eng.source_offsets["stream"] = "5-0"
    blob = eng.snapshot({"rows": np.int64(7)})  # numpy scalars become plain ints
    h = read_header(blob)
    assert isinstance(h, SnapshotHeader)
    assert h.format_version == FORMAT_VERSION and h.dtype == "float64"
    import atc_stream

    assert h.package_version == atc_stream.__version__
    assert h.interval == "1m" and h.backend == "cpu" and h.compression == "zlib"
    assert [ATCParams.from_dict(p) for p in h.params] == PARAMS
    assert h.source_offsets == {"stream": "5-0", "rows": 7}
    assert eng.source_offsets == {"stream": "5-0", "rows": 7}
    assert sum(h.rejections.values()) == 1  # once per input, not per stream of the symbol
    assert h.registry == eng._slot_of
    for s in h.streams:
        assert s.bar_index == 50 and s.last_time == 49 * MINUTE
    assert h.last_time_by_symbol() == {s: 49 * MINUTE for s in SYMBOLS}
    assert {a.name for a in h.arrays} >= set(STATE_ARRAYS)
    assert abs(h.created_at - time.time()) < 60
    restored = Engine.restore(blob, backend="cpu", outputs="all")
    assert restored.rejections == eng.rejections


def test_restore_registry_with_holes_and_new_streams():
    """Removed streams leave free slots; the registry and later additions still match."""
    eng, rest = warmed_engine(n_bars=60)
    eng.remove_symbol("ETHUSDT")
    eng.add_stream("NEWCOIN", 1)
    restored = Engine.restore(eng.snapshot(), backend="cpu", outputs="all")
    assert_same_state(eng, restored)
    assert restored.stream_state(StreamKey("NEWCOIN", "1m", 1))["last_time"] is None
    for e in (eng, restored):
        e.add_symbol("LATE")
    assert_same_state(eng, restored)
    rest = dict(rest)
    rest.pop("ETHUSDT")
    rest["NEWCOIN"] = rest["LATE"] = rest["BTCUSDT"] * 1.5
    bars = next_bars(rest, 0, 3, 60 * MINUTE)
    assert_same_outputs(eng.step(bars), restored.step(bars))


def test_restore_of_a_ring_longer_than_the_parameters_need():
    """A snapshot whose rings outgrew the parameter table (restore reshapes the store)."""
    eng, rest = warmed_engine(n_bars=60)
    eng.store._grow_ring(eng.store.ring_capacity + 17)
    restored = Engine.restore(eng.snapshot(), backend="cpu", outputs="all")
    assert restored.store.ring_capacity == eng.store.ring_capacity
    assert_same_state(eng, restored)
    bars = next_bars(rest, 0, 4, 60 * MINUTE)
    assert_same_outputs(eng.step(bars), restored.step(bars))


def test_restore_of_an_empty_engine():
    eng = Engine(ATCParams(), backend="cpu", outputs="all")
    restored = Engine.restore(eng.snapshot(), backend="cpu", outputs="all")
    assert_same_state(eng, restored)
    assert restored.streams == []


def _run_with_cuts(closes, batch_sizes, cuts, compression):
    """Feed batches to a never-stopped engine and to one restored at each cut; compare."""
    n0 = 30
    ref = Engine(PARAMS, backend="cpu", outputs="all")
    ref.warmup({s: (np.arange(n0) * MINUTE, c[:n0]) for s, c in closes.items()})
    eng = Engine.restore(ref.snapshot(compression=compression), backend="cpu", outputs="all")
    bar = n0
    for i, k in enumerate(batch_sizes):
        if i in cuts:
            blob = eng.snapshot({"bar": bar}, compression=compression)
            del eng
            eng = Engine.restore(blob, backend="cpu", outputs="all")
            assert eng.source_offsets["bar"] == bar
            assert_same_state(ref, eng)
        bars = [
            (s, (bar + j) * MINUTE, float(c[bar + j])) for j in range(k) for s, c in closes.items()
        ]
        assert_same_outputs(ref.step(bars), eng.step(bars))
        bar += k
    assert_same_state(ref, eng)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31),
    batch_sizes=st.lists(st.integers(1, 4), min_size=1, max_size=30),
    cuts=st.sets(st.integers(0, 29), max_size=8),
    compression=st.sampled_from(["zlib", "none"]),
)
def test_stop_snapshot_restore_continue_equals_never_stopped(seed, batch_sizes, cuts, compression):
    closes = random_walks(seed, 30 + 4 * 30, SYMBOLS[:3])
    _run_with_cuts(closes, batch_sizes, cuts, compression)


def test_stop_restore_continue_long_run():
    """Many cut points over a long run (past warm-up of every MA, events included)."""
    closes = random_walks(7, 30 + 600)
    _run_with_cuts(closes, [1] * 200 + [5] * 80, set(range(0, 280, 17)), "zlib")


# -- damaged blobs ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_blob() -> bytes:
    eng, _ = warmed_engine(n_bars=40)
    return eng.snapshot({"file": 40})


def _reassemble(blob: bytes, **changes) -> bytes:
    """Re-encode ``blob`` with header fields changed (valid header digest, same payload)."""
    header = read_header(blob)
    payload = blob[-header.payload_size :]
    return assemble_blob(msgspec.structs.replace(header, **changes), payload)


def _flip(blob: bytes, pos: int, mask: int = 0x01) -> bytes:
    b = bytearray(blob)
    b[pos] ^= mask
    return bytes(b)


def _header_end(blob: bytes) -> int:
    return PREAMBLE_SIZE + struct.unpack_from("<I", blob, 12)[0]


def test_good_blob_decodes(good_blob):
    snap = decode_snapshot(good_blob)
    assert snap.source_offsets == {"file": 40}
    assert snap.params == PARAMS


def test_flipped_payload_byte_is_refused(good_blob):
    end = _header_end(good_blob)
    for pos in (end, (end + len(good_blob)) // 2, len(good_blob) - 1):
        with pytest.raises(SnapshotError, match="payload checksum mismatch"):
            decode_snapshot(_flip(good_blob, pos))
        with pytest.raises(SnapshotError, match="payload checksum mismatch"):
            Engine.restore(_flip(good_blob, pos), backend="cpu", outputs="all")


def test_flipped_header_byte_is_refused(good_blob):
    end = _header_end(good_blob)
    for pos in (PREAMBLE_SIZE, (PREAMBLE_SIZE + end) // 2, end - 1, 20, 47):  # header, digest
        with pytest.raises(SnapshotError, match="header checksum mismatch"):
            decode_snapshot(_flip(good_blob, pos))


def test_array_checksum_catches_what_the_payload_checksum_would_not(good_blob):
    """A payload replaced consistently (payload size and checksum updated) still fails."""
    header = read_header(good_blob)
    import hashlib
    import zlib

    raw = bytearray(zlib.decompress(good_blob[-header.payload_size :]))
    raw[100] ^= 0x10
    payload = zlib.compress(bytes(raw))
    forged = assemble_blob(
        msgspec.structs.replace(
            header,
            payload_size=len(payload),
            payload_checksum=hashlib.blake2b(payload, digest_size=32).hexdigest(),
        ),
        payload,
    )
    with pytest.raises(SnapshotError, match="array checksum mismatch"):
        decode_snapshot(forged)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_flipped_bit_is_refused(good_blob, data):
    pos = data.draw(st.integers(0, len(good_blob) - 1))
    mask = 1 << data.draw(st.integers(0, 7))
    with pytest.raises(SnapshotError):
        decode_snapshot(_flip(good_blob, pos, mask))


@pytest.mark.parametrize("cut", [1, 7, 30, PREAMBLE_SIZE - 1, PREAMBLE_SIZE + 10, -1, -500])
def test_truncated_blob_is_refused(good_blob, cut):
    with pytest.raises(SnapshotError, match="truncated"):
        decode_snapshot(good_blob[:cut])


def test_empty_trailing_and_foreign_blobs_are_refused(good_blob):
    with pytest.raises(SnapshotError, match="empty"):
        decode_snapshot(b"")
    with pytest.raises(SnapshotError, match="3 unexpected trailing bytes"):
        decode_snapshot(good_blob + b"xyz")
    with pytest.raises(SnapshotError, match="not an atc-stream snapshot"):
        decode_snapshot(b"PK\x03\x04" + good_blob[4:])
    with pytest.raises(SnapshotError, match="must be bytes"):
        decode_snapshot("not bytes")
    assert isinstance(SnapshotError("x"), ValueError)


def test_wrong_format_version_is_refused(good_blob):
    future = _reassemble(good_blob, format_version=FORMAT_VERSION + 1)
    with pytest.raises(
        SnapshotError, match=f"format version {FORMAT_VERSION + 1} is not supported"
    ):
        decode_snapshot(future)
    # preamble says 1, header says something else
    header = read_header(good_blob)
    hb = msgspec.json.encode(msgspec.structs.replace(header, format_version=99))
    import hashlib

    pre = struct.pack("<8sII32s", MAGIC, 1, len(hb), hashlib.blake2b(hb, digest_size=32).digest())
    with pytest.raises(SnapshotError, match="header says format version 99"):
        decode_snapshot(pre + hb + good_blob[-header.payload_size :])


def test_wrong_dtype_is_refused(good_blob):
    with pytest.raises(SnapshotError, match="dtype is 'float32'.*float64"):
        decode_snapshot(_reassemble(good_blob, dtype="float32"))
    header = read_header(good_blob)
    arrays = [
        msgspec.structs.replace(a, dtype="<f4") if a.name == "values" else a for a in header.arrays
    ]
    with pytest.raises(SnapshotError, match="array 'values' has dtype '<f4'"):
        decode_snapshot(_reassemble(good_blob, arrays=arrays))


def test_other_layout_compression_and_inconsistent_headers_are_refused(good_blob):
    header = read_header(good_blob)
    layout = dict(header.layout, N_VALUE_FIELDS=header.layout["N_VALUE_FIELDS"] + 1)
    with pytest.raises(SnapshotError, match="layout differs.*N_VALUE_FIELDS"):
        decode_snapshot(_reassemble(good_blob, layout=layout))
    with pytest.raises(SnapshotError, match="compression 'zstd' is not supported"):
        decode_snapshot(_reassemble(good_blob, compression="zstd"))
    streams = list(header.streams)
    streams[0] = msgspec.structs.replace(streams[0], bar_index=streams[0].bar_index + 1)
    with pytest.raises(SnapshotError, match="registry disagrees with the state arrays"):
        decode_snapshot(_reassemble(good_blob, streams=streams))
    with pytest.raises(SnapshotError, match="slots in use but"):
        decode_snapshot(_reassemble(good_blob, streams=header.streams[1:]))
    params = [dict(header.params[0], ema_len=30), header.params[1]]
    with pytest.raises(SnapshotError, match="parameter table does not match"):
        decode_snapshot(_reassemble(good_blob, params=params))
    params = [dict(header.params[0], ema_len=-3), header.params[1]]
    with pytest.raises(SnapshotError, match="parameter set 0 is invalid.*ema_len"):
        decode_snapshot(_reassemble(good_blob, params=params))
    with pytest.raises(SnapshotError, match="has shape|declares .* bytes of state"):
        decode_snapshot(_reassemble(good_blob, capacity=header.capacity + 1))


def test_snapshot_argument_errors():
    eng = Engine(ATCParams(), backend="cpu", outputs="all")
    with pytest.raises(ValueError, match="compression"):
        eng.snapshot(compression="brotli")
    with pytest.raises(ValueError, match="source_offsets"):
        eng.snapshot({"x": object()})


# -- directory store ----------------------------------------------------------------------


def _blobs(n: int) -> list[bytes]:
    eng, rest = warmed_engine(n_bars=30)
    out = []
    for i in range(n):
        eng.step(next_bars(rest, i, 1, 30 * MINUTE))
        out.append(eng.snapshot({"i": i}))
    return out


@pytest.fixture(scope="module")
def blobs() -> list[bytes]:
    return _blobs(13)


def test_directory_store_keeps_last_k_in_order(tmp_path, blobs):
    store = DirectorySnapshotStore(tmp_path / "snaps", keep=3)
    assert store.list() == [] and store.load_latest() is None and store.latest() is None
    ids = [store.save(b) for b in blobs]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert store.list() == ids[-3:]  # sequence order, also past 9 and 10
    assert sorted(os.listdir(tmp_path / "snaps")) == [i + ".atcsnap" for i in ids[-3:]]
    assert store.load_latest() == blobs[-1]
    found = store.latest()
    assert found.id == ids[-1] and found.header.source_offsets == {"i": 12}
    assert store.load(ids[-2]) == blobs[-2]
    # a new store object on the same directory continues the sequence
    again = DirectorySnapshotStore(tmp_path / "snaps", keep=3)
    new_id = again.save(blobs[0])
    assert again.list() == ids[-2:] + [new_id]
    assert again.load_latest() == blobs[0]


def test_directory_store_falls_back_to_previous_good_snapshot(tmp_path, blobs):
    store = DirectorySnapshotStore(tmp_path, keep=5)
    ids = [store.save(b) for b in blobs[:4]]
    path = store.file_of(ids[-1])
    path.write_bytes(_flip(path.read_bytes(), len(blobs[3]) - 10))
    with pytest.warns(SnapshotWarning, match=f"snapshot {ids[-1]} .* damaged"):
        found = store.latest()
    assert found.id == ids[-2] and found.blob == blobs[2]
    store.file_of(ids[-2]).write_bytes(blobs[1][:100])  # truncated
    with pytest.warns(SnapshotWarning) as record:
        assert store.load_latest() == blobs[1]
    assert len(record) == 2 and "truncated" in str(record[1].message)
    restored = Engine.restore(store.load(ids[1]), backend="cpu", outputs="all")
    assert restored.source_offsets == {"i": 1}


def test_directory_store_all_damaged_raises(tmp_path, blobs):
    store = DirectorySnapshotStore(tmp_path, keep=5)
    ids = [store.save(b) for b in blobs[:2]]
    for i in ids:
        store.file_of(i).write_bytes(b"garbage")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SnapshotWarning)
        with pytest.raises(SnapshotError, match="no snapshot in .* verifies"):
            store.latest()


def test_directory_store_atomic_write_leaves_no_temp_files(tmp_path, blobs, monkeypatch):
    store = DirectorySnapshotStore(tmp_path, keep=2)
    store.save(blobs[0])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []

    def broken_replace(src, dst):
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk on fire"):
        store.save(blobs[1])
    monkeypatch.undo()
    assert len(list(tmp_path.iterdir())) == 1  # no temp file, no partial snapshot
    assert store.load_latest() == blobs[0]


def test_directory_store_refuses_garbage_and_cleans_stale_temp_files(tmp_path, blobs):
    store = DirectorySnapshotStore(tmp_path, keep=2)
    with pytest.raises(SnapshotError):
        store.save(b"not a snapshot")
    with pytest.raises(ValueError, match="keep"):
        DirectorySnapshotStore(tmp_path, keep=0)
    stale = tmp_path / ".snapshot-abc.tmp"
    fresh = tmp_path / ".snapshot-def.tmp"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"x")
    old = time.time() - 2 * DirectorySnapshotStore.STALE_TEMP_SECONDS
    os.utime(stale, (old, old))
    DirectorySnapshotStore(tmp_path)
    assert not stale.exists() and fresh.exists()
    assert store.list() == []  # temp files are never listed


def test_open_snapshot_store_directory(tmp_path, blobs):
    a = open_snapshot_store(tmp_path, keep=2)
    b = open_snapshot_store(tmp_path, keep=2, namespace="shard1")
    assert isinstance(a, DirectorySnapshotStore)
    a.save(blobs[0])
    b.save(blobs[1])
    b.save(blobs[2])
    assert len(a.list()) == 1 and len(b.list()) == 2  # shards share a directory safely
    assert a.load_latest() == blobs[0] and b.load_latest() == blobs[2]


# -- periodic snapshots -------------------------------------------------------------------


class SlowStore(DirectorySnapshotStore):
    """A directory store whose ``save`` waits until the test opens ``gate``."""

    def __init__(self, path, keep=100):
        super().__init__(path, keep=keep)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.saved_offsets: list[dict] = []

    def save(self, blob):
        self.entered.set()
        assert self.gate.wait(30), "test never opened the gate"
        self.saved_offsets.append(read_header(blob).source_offsets)
        return super().save(blob)


class FailingStore:
    def __init__(self):
        self.calls = 0

    def save(self, blob):
        self.calls += 1
        raise ConnectionError("store is down")


def _feed(eng, rest, snap, start, n, per_step=1):
    for i in range(start, start + n, per_step):
        res = eng.step(next_bars(rest, i, per_step, 100 * MINUTE))
        snap.maybe_snapshot(len(res), {"bar": i + per_step})


def test_snapshotter_every_n_bars(tmp_path):
    eng, rest = warmed_engine(n_bars=100)
    store = SlowStore(tmp_path)
    n_streams = len(eng.streams)
    snap = Snapshotter(eng, store, every_bars=5 * n_streams, every_seconds=None)
    for i in range(20):
        res = eng.step(next_bars(rest, i, 1, 100 * MINUTE))
        snap.maybe_snapshot(len(res), {"bar": i + 1})
        snap.wait()  # let each write finish so none is skipped
    assert snap.snapshots_written == 4 and snap.skipped == 0 and snap.failures == 0
    assert [o["bar"] for o in store.saved_offsets] == [5, 10, 15, 20]
    final = snap.close({"bar": 20, "final": True})
    assert final == store.list()[-1] and snap.snapshots_written == 5
    restored = Engine.restore(store.load_latest(), backend="cpu", outputs="all")
    assert_same_state(eng, restored)
    assert restored.source_offsets == {"bar": 20, "final": True}
    assert snap.close() is None  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        snap.maybe_snapshot(1)


def test_snapshotter_does_not_block_the_step_loop(tmp_path):
    eng, rest = warmed_engine(n_bars=100)
    store = SlowStore(tmp_path)
    store.gate.clear()  # every write blocks until we open the gate
    snap = Snapshotter(eng, store, every_bars=len(eng.streams), every_seconds=None)
    res = eng.step(next_bars(rest, 0, 1, 100 * MINUTE))
    assert snap.maybe_snapshot(len(res), {"bar": 1}) is True
    assert store.entered.wait(10)
    # the write is stuck in the store (its gate stays shut); the loop keeps stepping: a
    # call that waited for the write could only return once the gate's wait had failed,
    # which would leave nothing in flight and count a failure
    for i in range(1, 30):
        res = eng.step(next_bars(rest, i, 1, 100 * MINUTE))
        assert snap.maybe_snapshot(len(res), {"bar": i + 1}) is False
    assert snap.in_flight and snap.failures == 0
    assert snap.skipped == 29 and snap.snapshots_written == 0
    ref_state = eng.stream_state(eng.streams[0])
    store.gate.set()
    assert snap.wait(10) and snap.snapshots_written == 1
    # the snapshot holds the state as of the capture (bar 1), not of later steps
    first = Engine.restore(store.load(store.list()[0]), backend="cpu", outputs="all")
    assert first.stream_state(eng.streams[0])["bar_index"] == 101
    assert first.source_offsets == {"bar": 1}
    # the trigger stayed armed: the next call takes the snapshot at once
    res = eng.step(next_bars(rest, 30, 1, 100 * MINUTE))
    assert snap.maybe_snapshot(len(res), {"bar": 31}) is True
    snap.close()
    assert snap.snapshots_written == 3
    last = Engine.restore(store.load_latest(), backend="cpu", outputs="all")
    assert_same_state(eng, last)
    assert ref_state["bar_index"] == 130


def test_snapshotter_time_trigger_and_failures(tmp_path):
    eng, rest = warmed_engine(n_bars=100)
    now = [0.0]
    store = FailingStore()
    snap = Snapshotter(eng, store, every_bars=None, every_seconds=10, clock=lambda: now[0])
    assert snap.maybe_snapshot(0) is False
    now[0] = 11.0
    assert snap.maybe_snapshot(0) is False  # nothing changed: no snapshot
    res = eng.step(next_bars(rest, 0, 1, 100 * MINUTE))
    assert snap.maybe_snapshot(len(res)) is True  # due by time, state changed
    snap.wait()
    assert snap.failures == 1 and isinstance(snap.last_error, ConnectionError)
    assert snap.maybe_snapshot(0) is False  # the failure re-arms, but only after 10 s
    now[0] = 25.0
    assert snap.maybe_snapshot(0) is True
    snap.wait()
    assert snap.failures == 2 and store.calls == 2
    with pytest.raises(ConnectionError):
        snap.close()  # the final write's error reaches the caller


def test_snapshotter_arguments(tmp_path):
    eng = Engine(ATCParams(), backend="cpu", outputs="all")
    store = DirectorySnapshotStore(tmp_path)
    for bad in (dict(every_bars=0), dict(every_seconds=0), dict(compression="lz4")):
        with pytest.raises(ValueError):
            Snapshotter(eng, store, **bad)
    with Snapshotter(eng, store) as snap:
        with pytest.raises(ValueError, match="bars_applied"):
            snap.maybe_snapshot(-1)
    assert len(store.list()) == 1  # the context manager closed it with a final snapshot


# -- CUDA backend (simulator) ------------------------------------------------------------------


@pytest.mark.cudasim
@cuda_kernels_run
def test_snapshot_of_a_cuda_engine_restores_on_cpu_and_cuda():
    """Device state is pulled for the snapshot; restore pushes it to a new device state."""
    tiny = ATCParams(
        ema_len=6, hma_len=7, wma_len=5, dema_len=6, lsma_len=8, kama_len=5,
        robustness="Narrow", La=0.05, cutout=3,
    )  # fmt: skip
    closes = random_walks(3, 60, SYMBOLS[:2])
    cpu_ref = Engine([tiny, FAST], backend="cpu", outputs="all")
    gpu = Engine([tiny, FAST], backend="cuda", outputs="all")
    assert gpu.backend.name == "cuda"
    history = {s: (np.arange(30) * MINUTE, c[:30]) for s, c in closes.items()}
    cpu_ref.warmup(history)
    gpu.warmup(history)
    bars = [(s, 30 * MINUTE, float(c[30])) for s, c in closes.items()]
    assert_same_outputs(cpu_ref.step(bars), gpu.step(bars))  # device now ahead of the host
    blob = gpu.snapshot({"bar": 31})
    from_gpu = decode_snapshot(blob)
    cpu_blob = decode_snapshot(cpu_ref.snapshot())
    for name in STATE_ARRAYS:
        assert np.array_equal(from_gpu.arrays[name], cpu_blob.arrays[name], equal_nan=True), name
    on_cpu = Engine.restore(blob, backend="cpu", outputs="all")
    on_gpu = Engine.restore(blob, backend="cuda", outputs="all")
    assert on_gpu.backend.name == "cuda" and on_cpu.source_offsets == {"bar": 31}
    for j in range(31, 35):
        bars = [(s, j * MINUTE, float(c[j])) for s, c in closes.items()]
        expected = cpu_ref.step(bars)
        for eng in (gpu, on_cpu, on_gpu):
            assert_same_outputs(expected, eng.step(bars))


def test_snapshot_values_are_rows_per_slot_whatever_the_memory_layout():
    """The format keeps values one row per slot (``[slot, field]``): the store's lane
    blocks are converted on capture and back on restore."""
    engine, _ = warmed_engine()
    snap = decode_snapshot(engine.snapshot())
    rows = snap.arrays["values"]
    live = np.flatnonzero(engine.store.in_use)
    assert rows.ndim == 2 and rows.shape[1] == engine.store.values.shape[1]
    assert rows[live].tobytes() == values_of(engine.store.values, live).tobytes()
    restored = Engine.restore(snap)
    assert values_of(restored.store.values, live).tobytes() == rows[live].tobytes()
