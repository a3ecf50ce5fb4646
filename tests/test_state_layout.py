"""The values array's lane layout (``state/layout.py``): slots map to ``[block, field,
lane]``, conversions to and from rows are exact, growth keeps every stream's values."""

from __future__ import annotations

import numpy as np

from atc_stream.core.params import ATCParams
from atc_stream.state import layout as L
from atc_stream.state.arrays import (
    StateStore,
    lane_blocks,
    lanes_to_rows,
    rows_to_lanes,
    set_values_of,
    values_of,
)


def test_slot_maps_to_block_field_lane():
    values = np.zeros((3, L.N_VALUE_FIELDS, L.LANES))
    set_values_of(values, np.array([0, 9, 23]), np.arange(3.0)[:, None] + 1.0)
    assert (values[0, :, 0] == 1.0).all()
    assert (values[1, :, 1] == 2.0).all()
    assert (values[2, :, 7] == 3.0).all()
    assert np.count_nonzero(values) == 3 * L.N_VALUE_FIELDS


def test_rows_and_lanes_convert_both_ways_bit_for_bit():
    rng = np.random.default_rng(1)
    for n in (1, 7, 8, 9, 40):
        rows = rng.standard_normal((n, L.N_VALUE_FIELDS))
        rows[rng.random(rows.shape) < 0.1] = np.nan
        lanes = rows_to_lanes(rows)
        assert lanes.shape == (lane_blocks(n), L.N_VALUE_FIELDS, L.LANES)
        assert lanes.flags.c_contiguous
        back = lanes_to_rows(lanes, n)
        assert back.tobytes() == rows.tobytes()
        slots = rng.permutation(n)
        assert values_of(lanes, slots).tobytes() == rows[slots].tobytes()


def test_growth_keeps_values_and_pads_to_whole_blocks():
    store = StateStore(5)
    store.add_params(ATCParams())
    slots = store.allocate_many(np.zeros(5, np.int64))
    rows = np.arange(5 * L.N_VALUE_FIELDS, dtype=np.float64).reshape(5, -1)
    set_values_of(store.values, slots, rows)
    store.reserve(21)
    assert store.values.shape[0] == lane_blocks(store.capacity)
    assert values_of(store.values, slots).tobytes() == rows.tobytes()
    new = store.allocate(0)
    initial = values_of(store.values, [new])[0]
    assert np.isnan(initial[L.GROWTH]) and initial[L.MA_SIG] == 0.0
