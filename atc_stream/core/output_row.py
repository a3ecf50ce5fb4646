"""The kernel output row: which column of a ``[row, N_OUT]`` output array holds what.

Every backend writes one such row per (stream, bar); ``schema`` names the columns and
``results`` reads them. Plain ints, so numba folds them into the compiled kernels.
"""

from __future__ import annotations

from atc_stream.core.params import N_FAMILIES

OUT_SIGNAL = 0
OUT_LAYER1 = 1  # 6 columns: layer-1 signal per family
OUT_LAYER2 = OUT_LAYER1 + N_FAMILIES  # 6 columns: layer-2 equity per family
OUT_LONG = OUT_LAYER2 + N_FAMILIES
OUT_SHORT = OUT_LONG + 1
OUT_GROWTH = OUT_SHORT + 1
OUT_BAR_INDEX = OUT_GROWTH + 1
N_OUT = OUT_BAR_INDEX + 1
