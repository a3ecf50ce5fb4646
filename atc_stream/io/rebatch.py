"""Record batches of a fixed number of rows, joined from pieces of any size."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa


def whole_batches(pieces: Iterable[pa.RecordBatch], size: int) -> Iterator[pa.RecordBatch]:
    """``pieces``' rows in record batches of ``size`` rows (the last one may be shorter);
    the dictionaries of the pieces of one batch are unified."""
    held: list[pa.RecordBatch] = []
    rows = 0
    for piece in pieces:
        while piece.num_rows:
            take = min(size - rows, piece.num_rows)
            held.append(piece.slice(0, take))
            rows += take
            piece = piece.slice(take)
            if rows == size:
                yield _joined(held)
                held, rows = [], 0
    if rows:
        yield _joined(held)


def _joined(pieces: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(pieces) == 1:
        return pieces[0]
    return pa.Table.from_batches(pieces).combine_chunks().to_batches()[0]
