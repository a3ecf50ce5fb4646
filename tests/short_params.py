"""Short ATC parameter sets the tests share: short windows, so a few dozen bars reach
ready rows and every moving average is in play."""

from __future__ import annotations

from atc_stream import ATCParams

#: windows 5 to 8, Narrow, a 3-bar cutout
SHORT = ATCParams(
    ema_len=6, hma_len=7, wma_len=5, dema_len=6, lsma_len=8, kama_len=5,
    robustness="Narrow", La=0.05, De=0.1, cutout=3,
)  # fmt: skip
#: other windows (5 to 10) and no cutout: a second set beside ``SHORT``
SHORT_UNCUT = ATCParams(
    ema_len=9, hma_len=5, wma_len=8, dema_len=5, lsma_len=6, kama_len=10,
    robustness="Narrow", La=0.03, cutout=0,
)  # fmt: skip
#: every window 8, the other fields default
SHORT_8 = ATCParams(ema_len=8, hma_len=8, wma_len=8, dema_len=8, lsma_len=8, kama_len=8)
