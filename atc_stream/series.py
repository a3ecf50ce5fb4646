"""``compute``: fast full-history ATC for one series (the warmup kernel, every bar kept)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .params import ATCParams
from .results import family_columns
from .state import layout as L
from .state.store import StateStore


def compute(
    closes: Sequence[float] | np.ndarray,
    params: ATCParams | None = None,
    *,
    threads: int | None = None,
) -> dict[str, np.ndarray]:
    """ATC over a whole close series; the same columns as the golden vectors.

    Returns ``bar_index``, ``close``, ``Average_Signal``, ``long``, ``short``,
    ``<FAMILY>_Signal`` and ``<FAMILY>_S`` for each family, and ``growth``.
    One series runs on one thread whatever ``threads`` says (a stream is sequential);
    ``threads`` is accepted so every entry point takes the same setting.
    """
    from .kernels.cpu import CpuBackend

    params = ATCParams() if params is None else params
    closes = np.ascontiguousarray(closes, dtype=np.float64)
    if closes.ndim != 1:
        raise ValueError(f"closes must be 1-D, got shape {closes.shape}")
    if not np.all(np.isfinite(closes)) or not np.all(closes > 0):
        bad = int(np.flatnonzero(~(np.isfinite(closes) & (closes > 0)))[0])
        raise ValueError(f"closes must be finite and > 0; closes[{bad}] = {closes[bad]!r}")
    store = StateStore(capacity=1)
    slot = store.allocate(store.add_params(params))
    n = closes.shape[0]
    out = CpuBackend(store, threads).warmup(
        np.array([slot], np.int64),
        np.arange(n, dtype=np.int64)[None, :],
        closes[None, :],
        np.array([n], np.int64),
        True,
    )[0, :n]
    columns = {
        "bar_index": np.arange(n, dtype=np.int64),
        "close": closes.copy(),
        "Average_Signal": out[:, L.OUT_SIGNAL],
        "long": out[:, L.OUT_LONG].astype(np.int64),
        "short": out[:, L.OUT_SHORT].astype(np.int64),
    }
    columns.update(family_columns(out))
    columns["growth"] = out[:, L.OUT_GROWTH]
    return columns
