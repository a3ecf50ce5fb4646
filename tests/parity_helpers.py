"""Helpers to compare engine outputs with the reference, bit for bit."""

from __future__ import annotations

import numpy as np

from atc_stream.core import output_row
from atc_stream.core.params import FAMILIES, N_MAS
from atc_stream.state import layout as L


def reference_outputs(ref: dict[str, np.ndarray]) -> np.ndarray:
    """Engine output rows (``layout.OUT_*``) from the reference's columns (golden names:
    ``Average_Signal``, ``EMA_S``...) or from ``compute``'s (the schema: ``signal``,
    ``ema_equity``...)."""
    names = SCHEMA_NAMES if "signal" in ref else GOLDEN_NAMES
    n = ref[names["signal"]].shape[0]
    out = np.empty((n, output_row.N_OUT))
    for name, column in OUT_COLUMN.items():
        out[:, column] = ref[names[name]]
    return out


#: Kernel output column of each schema column that ``reference_outputs`` arranges.
OUT_COLUMN = {
    "signal": output_row.OUT_SIGNAL,
    **{f"{f.lower()}_signal": output_row.OUT_LAYER1 + j for j, f in enumerate(FAMILIES)},
    **{f"{f.lower()}_equity": output_row.OUT_LAYER2 + j for j, f in enumerate(FAMILIES)},
    "long": output_row.OUT_LONG,
    "short": output_row.OUT_SHORT,
    "growth": output_row.OUT_GROWTH,
    "bar_index": output_row.OUT_BAR_INDEX,
}
SCHEMA_NAMES = {name: name for name in OUT_COLUMN}
#: Schema column -> golden-vector / reference column name.
GOLDEN_NAMES = {
    **SCHEMA_NAMES,
    "signal": "Average_Signal",
    **{f"{f.lower()}_signal": f"{f}_Signal" for f in FAMILIES},
    **{f"{f.lower()}_equity": f"{f}_S" for f in FAMILIES},
}


def ma_signals(values_row: np.ndarray) -> np.ndarray:
    """The 54 per-MA ``sig`` values from one slot's value row."""
    return values_row[L.MA_BASE + np.arange(N_MAS) * L.MA_FIELDS + L.MA_SIG]


def assert_bit_identical(got: np.ndarray, expected: np.ndarray, what: str = "") -> None:
    """Equal as IEEE bit patterns (NaN where NaN; -0.0 vs 0.0 allowed)."""
    got = np.asarray(got, np.float64)
    expected = np.asarray(expected, np.float64)
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    same = (got == expected) | (np.isnan(got) & np.isnan(expected))
    if not same.all():
        idx = tuple(int(i) for i in np.argwhere(~same)[0])
        raise AssertionError(
            f"{what}: first difference at {idx}: got {got[idx]!r}, expected {expected[idx]!r} "
            f"({int((~same).sum())} differences)"
        )
