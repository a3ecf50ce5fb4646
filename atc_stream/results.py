"""Result and rejection types returned by the engine (no numba, no I/O)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .params import FAMILIES
from .state import layout as L


@dataclass(frozen=True, order=True)
class StreamKey:
    """One stream: a symbol at one bar interval under one parameter set."""

    symbol: str
    interval: str
    params_id: int

    def __str__(self) -> str:
        return f"{self.symbol}:{self.interval}:{self.params_id}"


@dataclass(frozen=True)
class Rejection:
    """One input that was left out, with why and the offending value."""

    index: int  #: position of the input in its batch (or bar position in a warmup history)
    reason: str
    detail: str
    symbol: str | None = None


def family_columns(outputs: np.ndarray) -> dict[str, np.ndarray]:
    """``<FAMILY>_Signal`` then ``<FAMILY>_S`` columns (golden-vector names) of output rows."""
    columns = {}
    for j, family in enumerate(FAMILIES):
        columns[f"{family}_Signal"] = outputs[:, L.OUT_LAYER1 + j]
    for j, family in enumerate(FAMILIES):
        columns[f"{family}_S"] = outputs[:, L.OUT_LAYER2 + j]
    return columns


def _float_or_none(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


class StepResult:
    """Outputs of one ``step``/``preview``/``warmup`` call: one row per (stream, bar) applied.

    Columns follow ``state/layout.py`` (``OUT_*``); the properties below name them.
    ``rejected`` lists the inputs that were left out, with reasons.
    """

    def __init__(
        self,
        keys_by_slot: list[StreamKey | None],
        slots: np.ndarray,
        times: np.ndarray,
        closes: np.ndarray,
        outputs: np.ndarray,
        rejected: list[Rejection] | None = None,
        provisional: bool = False,
    ) -> None:
        self._keys_by_slot = keys_by_slot
        self.slots = slots
        self.times = times
        self.closes = closes
        self.outputs = outputs
        self.rejected = rejected or []
        self.provisional = provisional

    def __len__(self) -> int:
        return self.slots.shape[0]

    def __repr__(self) -> str:
        kind = "preview" if self.provisional else "step"
        return f"<StepResult {kind}: {len(self)} rows, {len(self.rejected)} rejected>"

    @property
    def keys(self) -> list[StreamKey]:
        return [self._keys_by_slot[s] for s in self.slots]

    @property
    def symbols(self) -> list[str]:
        return [k.symbol for k in self.keys]

    @property
    def signal(self) -> np.ndarray:
        """Final signal (Average_Signal) per row; NaN while the stream is before cutout."""
        return self.outputs[:, L.OUT_SIGNAL]

    @property
    def layer1_signals(self) -> np.ndarray:
        """Layer-1 signal per family, shape (rows, 6), families in ``FAMILIES`` order."""
        return self.outputs[:, L.OUT_LAYER1 : L.OUT_LAYER1 + len(FAMILIES)]

    @property
    def layer2_equities(self) -> np.ndarray:
        """Layer-2 equity per family, shape (rows, 6)."""
        return self.outputs[:, L.OUT_LAYER2 : L.OUT_LAYER2 + len(FAMILIES)]

    @property
    def long_events(self) -> np.ndarray:
        return self.outputs[:, L.OUT_LONG] == 1.0

    @property
    def short_events(self) -> np.ndarray:
        return self.outputs[:, L.OUT_SHORT] == 1.0

    @property
    def growth(self) -> np.ndarray:
        """exp(λ·(bar_index − cutout)) of each row's bar; NaN before cutout."""
        return self.outputs[:, L.OUT_GROWTH]

    @property
    def bar_index(self) -> np.ndarray:
        return self.outputs[:, L.OUT_BAR_INDEX].astype(np.int64)

    def records(self) -> list[dict[str, Any]]:
        """One JSON-ready dict per row (NaN becomes None)."""
        rows = []
        keys = self.keys
        for i, key in enumerate(keys):
            out = self.outputs[i]
            rows.append(
                {
                    "symbol": key.symbol,
                    "interval": key.interval,
                    "params_id": key.params_id,
                    "time": int(self.times[i]),
                    "close": float(self.closes[i]),
                    "bar_index": int(out[L.OUT_BAR_INDEX]),
                    "signal": _float_or_none(out[L.OUT_SIGNAL]),
                    "layer1": {
                        f: _float_or_none(out[L.OUT_LAYER1 + j]) for j, f in enumerate(FAMILIES)
                    },
                    "layer2": {
                        f: _float_or_none(out[L.OUT_LAYER2 + j]) for j, f in enumerate(FAMILIES)
                    },
                    "long": bool(out[L.OUT_LONG] == 1.0),
                    "short": bool(out[L.OUT_SHORT] == 1.0),
                    "growth": _float_or_none(out[L.OUT_GROWTH]),
                    "provisional": self.provisional,
                }
            )
        return rows
