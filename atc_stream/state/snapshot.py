"""The snapshot format: a versioned, checksummed blob of an engine's whole state
(docs/design/snapshots.md)."""

from __future__ import annotations

import hashlib
import math
import struct
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import msgspec
import numpy as np

from atc_stream.core.params import ATCParams
from atc_stream.core.results import StreamKey
from atc_stream.core.strategy import Strategy
from atc_stream.state import layout as L
from atc_stream.state.snapshot_strategies import (
    STRATEGY_DTYPES,
    check_strategy_table,
    empty_strategy_arrays,
    strategy_layout_fingerprint,
    strategy_shapes,
)

__all__ = [
    "CHECKSUM_ALGORITHM",
    "COMPRESSIONS",
    "FORMAT_VERSION",
    "MAGIC",
    "STATE_DTYPE",
    "ArraySpec",
    "CapturedState",
    "Snapshot",
    "SnapshotError",
    "SnapshotHeader",
    "SnapshotWarning",
    "StreamEntry",
    "assemble_blob",
    "capture_state",
    "decode_snapshot",
    "encode_snapshot",
    "read_header",
    "verify_snapshot",
]

#: First bytes of every snapshot blob.
MAGIC = b"ATCSNAP\x00"
#: Version of the blob layout and header schema written by this build (2: the strategy
#: table and state; a version-1 snapshot loads as an engine without strategies).
FORMAT_VERSION = 2
#: Versions this build can read.
READABLE_VERSIONS = frozenset({1, FORMAT_VERSION})
#: Floating-point dtype of the state arrays in this build.
STATE_DTYPE = "float64"
CHECKSUM_ALGORITHM = "blake2b-256"

_PREAMBLE = struct.Struct("<8sII32s")
PREAMBLE_SIZE = _PREAMBLE.size  # 48

#: Arrays in payload order, with the dtype (numpy ``dtype.str``, little-endian) each must have.
ARRAY_DTYPES: dict[str, str] = {
    "ring": "<f8",
    "values": "<f8",
    "counters": "<i8",
    "in_use": "|b1",
    "param_lengths": "<i8",
    "param_values": "<f8",
    **STRATEGY_DTYPES,
}


def layout_fingerprint() -> dict[str, int]:
    """The state-layout constants a snapshot's arrays depend on (``state/layout.py``)."""
    return {
        "N_VALUE_FIELDS": L.N_VALUE_FIELDS,
        "N_COUNTER_FIELDS": L.N_COUNTER_FIELDS,
        "MA_FIELDS": L.MA_FIELDS,
        "FAMILY_FIELDS": L.FAMILY_FIELDS,
        "N_LENGTH_COLUMNS": L.N_LENGTH_COLUMNS,
        "N_PARAM_VALUES": L.N_PARAM_VALUES,
        "BAR_INDEX": L.BAR_INDEX,
        "RING_HEAD": L.RING_HEAD,
        "LAST_TIME": L.LAST_TIME,
        "PARAM_ROW": L.PARAM_ROW,
        "DIRECTION": L.DIRECTION,
    }


class SnapshotError(ValueError):
    """A snapshot blob that cannot be restored; the message says what is wrong."""


class SnapshotWarning(UserWarning):
    """A damaged snapshot was skipped and an older one used (see the stores)."""


# -- header -----------------------------------------------------------------------------


class ArraySpec(msgspec.Struct, frozen=True):
    """One state array in the raw payload."""

    name: str
    dtype: str  #: numpy ``dtype.str``, little-endian (``<f8``, ``<i8``, ``|b1``)
    shape: list[int]
    offset: int  #: byte offset in the decompressed payload
    nbytes: int


class StreamEntry(msgspec.Struct, frozen=True):
    """One registered stream: its key, slot and position (duplicated from ``counters``)."""

    symbol: str
    interval: str
    params_id: int
    slot: int
    bar_index: int  #: bars this stream has seen
    last_time: int | None  #: open time of its last bar; None before its first bar

    @property
    def key(self) -> StreamKey:
        return StreamKey(self.symbol, self.interval, self.params_id)


class SnapshotHeader(msgspec.Struct, kw_only=True):
    """Everything about a snapshot except the array bytes (JSON in the blob)."""

    format_version: int
    package_version: str
    created_at: float  #: unix seconds
    created_utc: str  #: the same, ISO 8601, for people
    dtype: str  #: floating dtype of the state arrays ("float64")
    interval: str  #: the engine's bar interval
    backend: str  #: backend that held the state (informative only)
    params: list[dict[str, Any]]  #: the parameter table, row order (``ATCParams.to_dict``)
    capacity: int  #: slots in the state arrays
    ring_capacity: int  #: closes per ring (the ring array has 2x this many columns)
    layout: dict[str, int]  #: ``layout_fingerprint()`` of the writer
    streams: list[StreamEntry]  #: the registry, in slot order
    source_offsets: dict[str, Any]  #: where the inputs stood (caller-defined, JSON values)
    rejections: dict[str, int]  #: the engine's rejection counters
    arrays: list[ArraySpec]
    compression: str  #: "none" or "zlib"
    raw_size: int  #: bytes of the decompressed payload
    payload_size: int  #: bytes of the stored payload
    checksum_algorithm: str
    checksum: str  #: hex digest of the raw (decompressed) array bytes
    payload_checksum: str  #: hex digest of the stored payload bytes
    #: the strategy table, row order (``Strategy.to_dict``); empty before version 2
    strategies: list[dict[str, Any]] = msgspec.field(default_factory=list)
    #: ``strategy_layout_fingerprint()`` of the writer (empty without strategies)
    strategy_layout: dict[str, int] = msgspec.field(default_factory=dict)

    @property
    def registry(self) -> dict[StreamKey, int]:
        """Stream key -> slot."""
        return {s.key: s.slot for s in self.streams}

    def last_time_by_symbol(self) -> dict[str, int | None]:
        """Per symbol, the earliest last-bar time over its streams (None: a stream saw none).

        That is where an input must resume for the symbol (e.g. REST backfill from it);
        bars at or before a stream's own last time are dropped by the engine.
        """
        out: dict[str, int | None] = {}
        for s in self.streams:
            if s.symbol in out and out[s.symbol] is None:
                continue
            if s.last_time is None or s.symbol not in out:
                out[s.symbol] = s.last_time
            else:
                out[s.symbol] = min(out[s.symbol], s.last_time)  # type: ignore[type-var]
        return out


_header_decoder = msgspec.json.Decoder(SnapshotHeader)


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")


def _digest(data) -> bytes:
    return hashlib.blake2b(data, digest_size=32).digest()


# -- compression --------------------------------------------------------------------------


def _zlib_compress(data, level: int | None) -> bytes:
    return zlib.compress(data, 1 if level is None else level)


def _zlib_decompress(data, raw_size: int) -> bytes:
    try:
        d = zlib.decompressobj()
        out = d.decompress(data, raw_size + 1)
    except zlib.error as exc:
        raise SnapshotError(f"snapshot payload cannot be decompressed (zlib): {exc}") from None
    if not d.eof or d.unconsumed_tail or d.unused_data:
        raise SnapshotError(
            "snapshot payload does not decompress to the size its header says "
            f"({raw_size} bytes): zlib stream incomplete or with extra data"
        )
    return out


#: name -> (compress(data, level), decompress(data, raw_size)). "zlib" defaults to level 1:
#: float state compresses little past that, and level 1 is several times faster.
COMPRESSIONS: dict[str, tuple[Any, Any]] = {
    "none": (lambda data, level: data, lambda data, raw_size: data),
    "zlib": (_zlib_compress, _zlib_decompress),
}


# -- capture (cheap, on the caller's thread) --------------------------------------------------


@dataclass
class CapturedState:
    """A consistent copy of an engine's state, not yet encoded (see :func:`encode_snapshot`).

    Built with plain copies only, so the step loop can hand it to a background thread.
    """

    params: list[dict[str, Any]]
    interval: str
    backend: str
    registry: list[tuple[StreamKey, int]]
    arrays: dict[str, np.ndarray]
    ring_capacity: int
    source_offsets: dict[str, Any] = field(default_factory=dict)
    rejections: dict[str, int] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    strategies: list[dict[str, Any]] = field(default_factory=list)


def normalize_offsets(source_offsets: Mapping[str, Any] | None) -> dict[str, Any]:
    """A deep, JSON-typed copy of ``source_offsets`` (numpy scalars become Python ones)."""
    if source_offsets is None:
        return {}
    if not isinstance(source_offsets, Mapping):
        raise ValueError(
            f"source_offsets must be a dict of str -> JSON value, got {type(source_offsets)}"
        )
    try:
        return msgspec.json.decode(msgspec.json.encode(dict(source_offsets), enc_hook=_enc_hook))
    except (TypeError, msgspec.EncodeError) as exc:
        raise ValueError(
            f"source_offsets must map str to JSON values (str, int, float, bool, None, "
            f"lists, dicts): {exc}"
        ) from None


def capture_state(
    *,
    params: Sequence[ATCParams],
    interval: str,
    backend: str,
    registry: Mapping[StreamKey, int],
    ring: np.ndarray,
    values: np.ndarray,
    counters: np.ndarray,
    in_use: np.ndarray,
    param_lengths: np.ndarray,
    param_values: np.ndarray,
    ring_capacity: int,
    source_offsets: Mapping[str, Any] | None = None,
    rejections: Mapping[str, int] | None = None,
    copy: bool = True,
    strategies: Sequence[Strategy] = (),
    strategy_arrays: Mapping[str, np.ndarray] | None = None,
) -> CapturedState:
    """Copy the given host state (``copy=False`` only when it is encoded right away).

    ``strategy_arrays``: the ``STRATEGY_DTYPES`` of an engine with ``strategies``."""
    arrays = {
        "ring": ring,
        "values": values,
        "counters": counters,
        "in_use": in_use,
        "param_lengths": param_lengths,
        "param_values": param_values,
        **empty_strategy_arrays(0, len(strategies)),
        **(strategy_arrays or {}),
    }
    arrays = {name: np.array(a, copy=True) if copy else np.asarray(a) for name, a in arrays.items()}
    return CapturedState(
        params=[p.to_dict() for p in params],
        interval=interval,
        backend=backend,
        registry=sorted(registry.items(), key=lambda item: item[1]),
        arrays=arrays,
        ring_capacity=int(ring_capacity),
        source_offsets=normalize_offsets(source_offsets),
        rejections={str(k): int(v) for k, v in (rejections or {}).items()},
        strategies=[s.to_dict() for s in strategies],
    )


# -- encode (may run on a background thread) ------------------------------------------------------


def encode_snapshot(
    captured: CapturedState, compression: str = "zlib", *, level: int | None = None
) -> bytes:
    """The snapshot blob of ``captured`` (``compression``: a name in ``COMPRESSIONS``)."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {sorted(COMPRESSIONS)}, got {compression!r}")
    specs: list[ArraySpec] = []
    parts: list[np.ndarray] = []
    offset = 0
    for name, want in ARRAY_DTYPES.items():
        a = np.ascontiguousarray(captured.arrays[name], dtype=np.dtype(want))
        specs.append(ArraySpec(name, a.dtype.str, list(a.shape), offset, a.nbytes))
        parts.append(a)
        offset += a.nbytes
    raw = bytearray(offset)
    for spec, a in zip(specs, parts, strict=True):
        np.frombuffer(raw, np.uint8, spec.nbytes, spec.offset)[:] = a.reshape(-1).view(np.uint8)
    compress, _ = COMPRESSIONS[compression]
    payload = compress(raw, level)
    raw_digest = _digest(raw).hex()

    counters = captured.arrays["counters"]
    streams = []
    for key, slot in captured.registry:
        last = int(counters[slot, L.LAST_TIME])
        streams.append(
            StreamEntry(
                key.symbol,
                key.interval,
                int(key.params_id),
                int(slot),
                int(counters[slot, L.BAR_INDEX]),
                None if last == L.NO_TIME else last,
            )
        )
    from atc_stream.core.version import __version__

    header = SnapshotHeader(
        format_version=FORMAT_VERSION,
        package_version=__version__,
        created_at=captured.created_at,
        created_utc=datetime.fromtimestamp(captured.created_at, timezone.utc).isoformat(),
        dtype=STATE_DTYPE,
        interval=captured.interval,
        backend=captured.backend,
        params=captured.params,
        capacity=int(captured.arrays["in_use"].shape[0]),
        ring_capacity=captured.ring_capacity,
        layout=layout_fingerprint(),
        streams=streams,
        source_offsets=captured.source_offsets,
        rejections=captured.rejections,
        arrays=specs,
        compression=compression,
        raw_size=len(raw),
        payload_size=len(payload),
        checksum_algorithm=CHECKSUM_ALGORITHM,
        checksum=raw_digest,
        payload_checksum=raw_digest if payload is raw else _digest(payload).hex(),
        strategies=captured.strategies,
        strategy_layout=strategy_layout_fingerprint() if captured.strategies else {},
    )
    return assemble_blob(header, payload)


def assemble_blob(header: SnapshotHeader, payload) -> bytes:
    """Preamble + header + payload (low level: no check that they agree)."""
    header_bytes = msgspec.json.encode(header, enc_hook=_enc_hook)
    preamble = _PREAMBLE.pack(
        MAGIC, header.format_version, len(header_bytes), _digest(header_bytes)
    )
    return b"".join((preamble, header_bytes, payload))


# -- decode and verify --------------------------------------------------------------------------


@dataclass
class Snapshot:
    """A verified snapshot: its header and its arrays (native byte order, writable)."""

    header: SnapshotHeader
    arrays: dict[str, np.ndarray]

    @property
    def registry(self) -> dict[StreamKey, int]:
        return self.header.registry

    @property
    def params(self) -> list[ATCParams]:
        return [ATCParams.from_dict(d) for d in self.header.params]

    @property
    def source_offsets(self) -> dict[str, Any]:
        return self.header.source_offsets

    @property
    def strategies(self) -> list[Strategy]:
        return [Strategy.from_dict(d) for d in self.header.strategies]


def _split(blob) -> tuple[SnapshotHeader, memoryview]:
    """Check the preamble and the header; return the header and the stored payload."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise SnapshotError(f"a snapshot must be bytes, got {type(blob).__name__}")
    view = memoryview(blob).cast("B")
    size = len(view)
    if size == 0:
        raise SnapshotError("snapshot is empty (0 bytes)")
    if bytes(view[: len(MAGIC)]) != MAGIC[: min(size, len(MAGIC))]:
        raise SnapshotError(
            f"not an atc-stream snapshot: it starts with {bytes(view[:8])!r}, "
            f"expected the magic bytes {MAGIC!r}"
        )
    if size < PREAMBLE_SIZE:
        raise SnapshotError(
            f"snapshot is truncated: {size} bytes, shorter than the {PREAMBLE_SIZE}-byte preamble"
        )
    _, version, header_len, header_digest = _PREAMBLE.unpack_from(view)
    if version not in READABLE_VERSIONS:
        raise SnapshotError(
            f"snapshot format version {version} is not supported: this atc-stream reads "
            f"version(s) {sorted(READABLE_VERSIONS)} (was it written by another release?)"
        )
    end = PREAMBLE_SIZE + header_len
    if end > size:
        raise SnapshotError(
            f"snapshot is truncated: the header needs bytes {PREAMBLE_SIZE}..{end}, "
            f"the blob has {size}"
        )
    header_bytes = view[PREAMBLE_SIZE:end]
    if _digest(header_bytes) != header_digest:
        raise SnapshotError(
            "snapshot header checksum mismatch: the header is corrupted "
            f"({CHECKSUM_ALGORITHM} of {header_len} header bytes differs from the preamble's)"
        )
    try:
        header = _header_decoder.decode(header_bytes)
    except msgspec.DecodeError as exc:
        raise SnapshotError(f"snapshot header cannot be decoded: {exc}") from None
    if header.format_version != version:
        raise SnapshotError(
            f"snapshot header says format version {header.format_version} but the preamble "
            f"says {version}"
        )
    payload = view[end:]
    if len(payload) < header.payload_size:
        raise SnapshotError(
            f"snapshot is truncated: the payload has {len(payload)} of {header.payload_size} bytes"
        )
    if len(payload) > header.payload_size:
        raise SnapshotError(
            f"snapshot has {len(payload) - header.payload_size} unexpected trailing bytes "
            f"after its {header.payload_size}-byte payload"
        )
    return header, payload


def _check_header(header: SnapshotHeader, dtype: str) -> None:
    if header.dtype != dtype:
        raise SnapshotError(
            f"snapshot state dtype is {header.dtype!r} but this atc-stream keeps state in "
            f"{dtype!r}; it cannot be restored here"
        )
    mine = layout_fingerprint()
    if header.layout != mine:
        diff = sorted(
            f"{k}: snapshot {header.layout.get(k)} vs here {mine.get(k)}"
            for k in set(mine) | set(header.layout)
            if header.layout.get(k) != mine.get(k)
        )
        raise SnapshotError(
            "snapshot state layout differs from this build's (state/layout.py): " + "; ".join(diff)
        )
    if header.checksum_algorithm != CHECKSUM_ALGORITHM:
        raise SnapshotError(
            f"snapshot checksum algorithm {header.checksum_algorithm!r} is not supported "
            f"(expected {CHECKSUM_ALGORITHM!r})"
        )
    if header.strategies and header.strategy_layout != strategy_layout_fingerprint():
        raise SnapshotError(
            "snapshot strategy layout differs from this build's (state/strategy_layout.py): "
            f"{header.strategy_layout} vs {strategy_layout_fingerprint()}"
        )
    if header.compression not in COMPRESSIONS:
        raise SnapshotError(
            f"snapshot compression {header.compression!r} is not supported here "
            f"(known: {sorted(COMPRESSIONS)})"
        )


def read_header(blob) -> SnapshotHeader:
    """The header of ``blob``, after checking the preamble, header checksum and sizes.

    Cheap (the payload is not hashed): for listing or for reading source offsets.
    :func:`decode_snapshot` does the full verification.
    """
    return _split(blob)[0]


def _arrays_from_raw(header: SnapshotHeader, raw) -> dict[str, np.ndarray]:
    specs = {s.name: s for s in header.arrays}
    older = header.format_version < 2  # written before strategies: none
    missing = [n for n in ARRAY_DTYPES if n not in specs and not (older and n in STRATEGY_DTYPES)]
    if missing:
        raise SnapshotError(f"snapshot lacks the state array(s) {missing}")
    arrays = empty_strategy_arrays(0, 0) if older else {}
    for name, want in ARRAY_DTYPES.items():
        if name not in specs:
            continue
        spec = specs[name]
        if spec.dtype != want:
            raise SnapshotError(
                f"snapshot array {name!r} has dtype {spec.dtype!r}, expected {want!r}"
            )
        dtype = np.dtype(spec.dtype)
        count = math.prod(spec.shape)
        if (
            any(d < 0 for d in spec.shape)
            or spec.nbytes != count * dtype.itemsize
            or spec.offset < 0
            or spec.offset + spec.nbytes > len(raw)
        ):
            raise SnapshotError(
                f"snapshot array {name!r} (shape {spec.shape}, {spec.nbytes} bytes at "
                f"{spec.offset}) does not fit the {len(raw)}-byte payload"
            )
        a = np.frombuffer(raw, dtype, count, spec.offset).reshape(spec.shape)
        arrays[name] = a.astype(dtype.newbyteorder("="), copy=True)
    return arrays


def _array_shapes(header: SnapshotHeader) -> dict[str, tuple[int, ...]]:
    """Shape of every state array that ``header``'s capacity, ring and parameter sets imply."""
    cap, rc, n_params = header.capacity, header.ring_capacity, len(header.params)
    return {
        "ring": (cap, 2 * rc),
        "values": (cap, L.N_VALUE_FIELDS),
        "counters": (cap, L.N_COUNTER_FIELDS),
        "in_use": (cap,),
        "param_lengths": (n_params, L.N_LENGTH_COLUMNS),
        "param_values": (n_params, L.N_PARAM_VALUES),
        **strategy_shapes(cap * len(header.strategies), len(header.strategies)),
    }


def _check_consistency(header: SnapshotHeader, arrays: dict[str, np.ndarray]) -> None:
    """Shapes against the layout, the parameter table, and the registry against the arrays."""
    cap, rc, n_params = header.capacity, header.ring_capacity, len(header.params)
    want_shapes = _array_shapes(header)
    for name, shape in want_shapes.items():
        if arrays[name].shape != shape:
            raise SnapshotError(
                f"snapshot array {name!r} has shape {arrays[name].shape}, expected {shape}"
            )
    # The parameter dicts must rebuild exactly the stored parameter table.
    from atc_stream.state.arrays import ParameterTable

    table = ParameterTable()
    for row, d in enumerate(header.params):
        try:
            params = ATCParams.from_dict(d)
        except (TypeError, ValueError) as exc:
            raise SnapshotError(f"snapshot parameter set {row} is invalid: {exc}") from None
        if table.add(params) != row:
            raise SnapshotError(f"snapshot parameter set {row} duplicates an earlier one")
    if not (
        np.array_equal(table.lengths, arrays["param_lengths"])
        and np.array_equal(table.values.view(np.int64), arrays["param_values"].view(np.int64))
    ):
        raise SnapshotError(
            "snapshot parameter table does not match its parameter sets "
            "(written by a build that maps parameters differently?)"
        )
    if rc < table.ring_capacity_needed:
        raise SnapshotError(
            f"snapshot ring capacity {rc} is below the {table.ring_capacity_needed} "
            "closes its parameter sets need"
        )
    try:
        check_strategy_table(header.strategies, arrays)
    except (TypeError, ValueError) as exc:
        raise SnapshotError(f"snapshot strategies: {exc}") from None
    in_use, counters = arrays["in_use"], arrays["counters"]
    seen_slots: set[int] = set()
    seen_keys: set[StreamKey] = set()
    for s in header.streams:
        where = f"snapshot stream {s.symbol}:{s.interval}:{s.params_id} (slot {s.slot})"
        if not 0 <= s.slot < cap or s.slot in seen_slots:
            raise SnapshotError(f"{where}: slot out of range or used twice")
        if s.key in seen_keys:
            raise SnapshotError(f"{where}: stream registered twice")
        seen_slots.add(s.slot)
        seen_keys.add(s.key)
        if s.interval != header.interval:
            raise SnapshotError(f"{where}: interval differs from the engine's {header.interval!r}")
        if not 0 <= s.params_id < n_params:
            raise SnapshotError(f"{where}: params_id is not in the {n_params}-row parameter table")
        row = counters[s.slot]
        last = None if row[L.LAST_TIME] == L.NO_TIME else int(row[L.LAST_TIME])
        if (
            not in_use[s.slot]
            or row[L.PARAM_ROW] != s.params_id
            or row[L.BAR_INDEX] != s.bar_index
            or last != s.last_time
        ):
            raise SnapshotError(f"{where}: registry disagrees with the state arrays")
    if int(in_use.sum()) != len(seen_slots):
        raise SnapshotError(
            f"snapshot has {int(in_use.sum())} slots in use but "
            f"{len(seen_slots)} registered streams"
        )


def _expected_raw_size(header: SnapshotHeader) -> int:
    """Bytes of the state arrays that ``header``'s capacity, ring and parameter sets need."""
    cap, rc = header.capacity, header.ring_capacity
    if cap < 0 or rc < 0:
        raise SnapshotError(f"snapshot declares a negative capacity ({cap}) or ring ({rc})")
    shapes = _array_shapes(header)
    if header.format_version < 2:
        shapes = {n: shape for n, shape in shapes.items() if n not in STRATEGY_DTYPES}
    return sum(math.prod(shape) * np.dtype(ARRAY_DTYPES[n]).itemsize for n, shape in shapes.items())


def decode_snapshot(blob, *, dtype: str = STATE_DTYPE) -> Snapshot:
    """Verify ``blob`` completely; its header and arrays, or :class:`SnapshotError`."""
    header, payload = _split(blob)
    _check_header(header, dtype)
    payload_digest = _digest(payload).hex()
    if payload_digest != header.payload_checksum:
        raise SnapshotError(
            f"snapshot payload checksum mismatch: the payload is corrupted "
            f"({CHECKSUM_ALGORITHM} of {len(payload)} stored bytes differs from the header's)"
        )
    expected = _expected_raw_size(header)
    if header.raw_size != expected:
        # checked before anything is allocated: a damaged header cannot ask for gigabytes
        raise SnapshotError(
            f"snapshot header declares {header.raw_size} bytes of state, but {header.capacity} "
            f"slots x ring {header.ring_capacity} x {len(header.params)} parameter sets "
            f"take {expected} in this layout"
        )
    _, decompress = COMPRESSIONS[header.compression]
    raw = decompress(payload, header.raw_size)
    if len(raw) != header.raw_size:
        raise SnapshotError(
            f"snapshot payload decompresses to {len(raw)} bytes, header says {header.raw_size}"
        )
    if (payload_digest if raw is payload else _digest(raw).hex()) != header.checksum:
        raise SnapshotError(
            "snapshot array checksum mismatch: the decompressed state differs from what was written"
        )
    arrays = _arrays_from_raw(header, raw)
    _check_consistency(header, arrays)
    return Snapshot(header, arrays)


def verify_snapshot(blob) -> SnapshotHeader:
    """Fully verify ``blob`` (as ``decode_snapshot``) and return its header."""
    return decode_snapshot(blob).header
