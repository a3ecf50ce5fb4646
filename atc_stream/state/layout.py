"""The field table: where each piece of per-stream state lives in the state arrays
(docs/design/state-layout.md)."""

from __future__ import annotations

from atc_stream.core.params import LENGTHS_PER_FAMILY, N_FAMILIES, N_MAS

# -- lane blocks ------------------------------------------------------------------------
#: streams per block of the values array, ``values[slot // LANES, field, slot % LANES]``:
#: one AVX-512 register of doubles, so a block's field is one vector load on the CPU and
#: one 64-byte segment for neighbouring GPU threads
LANES = 8

# -- values: per MA instance ------------------------------------------------------
#: previous MA value m[1] (NaN while the MA is na)
MA_PREV = 0
#: the recurrence state: EMA value (EMA, DEMA's e1) or KAMA value
MA_AUX1 = 1
#: DEMA's second EMA e2 (before seeding: the running seed sum of e1)
MA_AUX2 = 2
#: persistent crossing signal -1/0/+1
MA_SIG = 3
#: layer-1 equity E_j
MA_EQUITY = 4
#: persistent equity return `a`
MA_RETURN = 5
MA_FIELDS = 6

MA_BASE = 0
# -- values: per family ---------------------------------------------------------------
FAMILY_BASE = MA_BASE + N_MAS * MA_FIELDS
#: previous layer-1 signal F_f[1] (NaN while inactive)
FAM_SIGNAL_PREV = 0
#: layer-2 equity S_f
FAM_EQUITY = 1
#: layer-2 persistent return `a`
FAM_RETURN = 2
FAMILY_FIELDS = 3
# -- values: per stream ---------------------------------------------------------------
STREAM_BASE = FAMILY_BASE + N_FAMILIES * FAMILY_FIELDS
#: previous final signal avg[1]
AVG_PREV = STREAM_BASE + 0
#: growth factor of the last bar (NaN while inactive)
GROWTH = STREAM_BASE + 1
N_VALUE_FIELDS = STREAM_BASE + 2

# -- counters (int64) ---------------------------------------------------------------
#: index of the next bar (= number of bars this stream has seen)
BAR_INDEX = 0
#: ring position (0 .. C-1) of the newest close
RING_HEAD = 1
#: open time of the last applied bar (any int64 clock; ms since epoch by convention)
LAST_TIME = 2
#: row of this stream's parameter set in the parameter table
PARAM_ROW = 3
#: event direction: 0 = na, +1, -1
DIRECTION = 4
N_COUNTER_FIELDS = 5
#: LAST_TIME of a stream that has seen no bar
NO_TIME = -(2**63)

# -- parameter table ----------------------------------------------------------------
#: param_lengths[row, k] for MA k = family * 9 + j; column CUTOUT_COLUMN holds cutout
CUTOUT_COLUMN = N_MAS
N_LENGTH_COLUMNS = N_MAS + 1
#: param_values[row, :]: 6 weights, then the scalars below
PV_WEIGHT = 0
PV_LAM = N_FAMILIES
PV_DECAY = N_FAMILIES + 1
PV_CUT = N_FAMILIES + 2
PV_LONG = N_FAMILIES + 3
PV_SHORT = N_FAMILIES + 4
N_PARAM_VALUES = N_FAMILIES + 5


__all__ = [name for name in dir() if name.isupper()] + ["LENGTHS_PER_FAMILY"]
