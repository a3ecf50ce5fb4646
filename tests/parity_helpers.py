"""Helpers to compare engine outputs with the reference, bit for bit."""

from __future__ import annotations

import numpy as np

from atc_stream.params import FAMILIES, N_MAS
from atc_stream.state import layout as L


def reference_outputs(ref: dict[str, np.ndarray]) -> np.ndarray:
    """The reference's columns arranged as engine output rows (``layout.OUT_*``)."""
    n = ref["Average_Signal"].shape[0]
    out = np.empty((n, L.N_OUT))
    out[:, L.OUT_SIGNAL] = ref["Average_Signal"]
    for j, family in enumerate(FAMILIES):
        out[:, L.OUT_LAYER1 + j] = ref[f"{family}_Signal"]
        out[:, L.OUT_LAYER2 + j] = ref[f"{family}_S"]
    out[:, L.OUT_LONG] = ref["long"]
    out[:, L.OUT_SHORT] = ref["short"]
    out[:, L.OUT_GROWTH] = ref["growth"]
    out[:, L.OUT_BAR_INDEX] = ref["bar_index"]
    return out


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
