"""The ATC update of ``LANES`` streams at once: ``core.py``'s arithmetic with the stream
index innermost, so every window sum runs ``LANES`` independent chains in SIMD registers.

Design: docs/design/kernels.md, "Lanes". Each lane performs exactly the IEEE operations,
in exactly the order, of ``core.update_stream``; tests compare every bit with it.
"""

import math

from atc_stream.core.output_row import (
    N_OUT,
    OUT_BAR_INDEX,
    OUT_GROWTH,
    OUT_LAYER1,
    OUT_LAYER2,
    OUT_LONG,
    OUT_SHORT,
    OUT_SIGNAL,
)
from atc_stream.core.params import LENGTHS_PER_FAMILY, N_FAMILIES
from atc_stream.kernels.core import DEMA, EMA, EQUITY_FLOOR, HMA, KAMA_FAST, KAMA_SLOW, LSMA, WMA
from atc_stream.state.layout import (
    AVG_PREV,
    BAR_INDEX,
    CUTOUT_COLUMN,
    DIRECTION,
    FAM_EQUITY,
    FAM_RETURN,
    FAM_SIGNAL_PREV,
    FAMILY_BASE,
    FAMILY_FIELDS,
    GROWTH,
    LAST_TIME,
    MA_AUX1,
    MA_AUX2,
    MA_BASE,
    MA_EQUITY,
    MA_FIELDS,
    MA_PREV,
    MA_RETURN,
    MA_SIG,
    N_VALUE_FIELDS,
    PARAM_ROW,
    PV_CUT,
    PV_DECAY,
    PV_LAM,
    PV_LONG,
    PV_SHORT,
    PV_WEIGHT,
    RING_HEAD,
)

#: streams per block: 4 AVX2 vectors of doubles per chain step hide the add latency
LANES = 16
NAN = math.nan

# rows of the per-block scratch ``v[row, lane]`` (one lane vector each)
V_CLOSE = 0
V_PREV_CLOSE = 1
V_R = 2
V_M = 3
V_ACC = 4
V_ACC2 = 5
V_W1 = 6
V_T1 = 7
V_W2 = 8
V_T2 = 9
V_SIGNAL = 10
V_E = 11
N_V = 12


def steady_bar(lengths):
    """First bar index from which every bar-index branch of the update is the same:
    lanes at or past it may share a block whatever their bar indices."""
    longest = 0
    for k in range(N_FAMILIES * LENGTHS_PER_FAMILY):
        longest = max(longest, lengths[k])
    return max(lengths[CUTOUT_COLUMN] + 1, 2 * longest - 1, 1)


# -- window sums over a block's history ``h[position, lane]`` -----------------------


def lane_window_sum(h, p, n, v):
    for lane in range(LANES):
        v[V_ACC, lane] = 0.0
    for k in range(p - n + 1, p + 1):
        for lane in range(LANES):
            v[V_ACC, lane] += h[k, lane]


def lane_ema(h, p, length, bar_index, vals, field, v):
    """``core.ema_next`` into ``v[V_M]``; ``vals[field]`` holds the previous value."""
    if bar_index < length - 1:
        for lane in range(LANES):
            v[V_M, lane] = NAN
    elif bar_index == length - 1:
        lane_window_sum(h, p, length, v)
        for lane in range(LANES):
            v[V_M, lane] = v[V_ACC, lane] / length
    else:
        alpha = 2.0 / (length + 1)
        beta = 1.0 - alpha
        for lane in range(LANES):
            v[V_M, lane] = alpha * v[V_CLOSE, lane] + beta * vals[field, lane]
    for lane in range(LANES):
        vals[field, lane] = v[V_M, lane]


def lane_sma(h, p, length, bar_index, v):
    if bar_index < length - 1:
        for lane in range(LANES):
            v[V_M, lane] = NAN
        return
    lane_window_sum(h, p, length, v)
    for lane in range(LANES):
        v[V_M, lane] = v[V_ACC, lane] / length


def lane_wma(h, p, length, bar_index, v):
    if bar_index < length - 1:
        for lane in range(LANES):
            v[V_M, lane] = NAN
        return
    start = p - length + 1
    for lane in range(LANES):
        v[V_ACC, lane] = 0.0
    for j in range(1, length + 1):
        w = float(j)
        for lane in range(LANES):
            v[V_ACC, lane] += w * h[start + j - 1, lane]
    denominator = length * (length + 1) / 2
    for lane in range(LANES):
        v[V_M, lane] = v[V_ACC, lane] / denominator


def lane_lsma(h, p, length, bar_index, v):
    if bar_index < length - 1:
        for lane in range(LANES):
            v[V_M, lane] = NAN
        return
    start = p - length + 1
    for lane in range(LANES):
        v[V_ACC, lane] = 0.0
        v[V_ACC2, lane] = 0.0
    for j in range(length):
        x = float(j)
        for lane in range(LANES):
            y = h[start + j, lane]
            v[V_ACC, lane] += y
            v[V_ACC2, lane] += x * y
    sx = length * (length - 1) / 2
    sxx = (length - 1) * length * (2 * length - 1) / 6
    denominator = length * sxx - sx * sx
    if denominator == 0.0:
        for lane in range(LANES):
            v[V_M, lane] = NAN
        return
    for lane in range(LANES):
        slope = (length * v[V_ACC2, lane] - sx * v[V_ACC, lane]) / denominator
        intercept = (v[V_ACC, lane] - slope * sx) / length
        v[V_M, lane] = intercept + slope * (length - 1)


def lane_kama(h, p, length, bar_index, vals, field, v):
    """``core.kama_next`` into ``v[V_M]``; ``vals[field]`` holds the previous value."""
    if bar_index >= length:
        for lane in range(LANES):
            v[V_ACC, lane] = 0.0
        for k in range(p - length, p):
            for lane in range(LANES):
                v[V_ACC, lane] += abs(h[k + 1, lane] - h[k, lane])
        for lane in range(LANES):
            noise = v[V_ACC, lane]
            signal = abs(v[V_CLOSE, lane] - h[p - length, lane])
            ratio = signal / noise if noise != 0.0 else 0.0
            t = ratio * (KAMA_FAST - KAMA_SLOW) + KAMA_SLOW
            prev = vals[field, lane]
            m = prev + (t * t) * (v[V_CLOSE, lane] - prev)
            v[V_M, lane] = m
            vals[field, lane] = m
    else:
        t = 0.0 * (KAMA_FAST - KAMA_SLOW) + KAMA_SLOW
        smooth = t * t
        for lane in range(LANES):
            prev = vals[field, lane]
            m = prev + smooth * (v[V_CLOSE, lane] - prev)
            v[V_M, lane] = m
            vals[field, lane] = m


def lane_dema(h, p, length, bar_index, vals, base, v):
    """``core.dema_next`` into ``v[V_M]`` (e1 in MA_AUX1, e2 or its seed sum in MA_AUX2)."""
    lane_ema(h, p, length, bar_index, vals, base + MA_AUX1, v)
    if bar_index < length - 1:
        return  # v[V_M] is already NaN
    e2_field = base + MA_AUX2
    seed_bar = 2 * length - 2
    if bar_index <= seed_bar:
        for lane in range(LANES):
            vals[e2_field, lane] = vals[e2_field, lane] + v[V_M, lane]
        if bar_index == seed_bar:
            for lane in range(LANES):
                vals[e2_field, lane] = vals[e2_field, lane] / length
    else:
        alpha = 2.0 / (length + 1)
        beta = 1.0 - alpha
        for lane in range(LANES):
            vals[e2_field, lane] = alpha * v[V_M, lane] + beta * vals[e2_field, lane]
    if bar_index < seed_bar:
        for lane in range(LANES):
            v[V_M, lane] = NAN
        return
    for lane in range(LANES):
        v[V_M, lane] = 2.0 * v[V_M, lane] - vals[e2_field, lane]


def lane_ma(family, h, p, length, bar_index, vals, base, v):
    if family == EMA:
        lane_ema(h, p, length, bar_index, vals, base + MA_AUX1, v)
    elif family == HMA:
        lane_sma(h, p, length, bar_index, v)
    elif family == WMA:
        lane_wma(h, p, length, bar_index, v)
    elif family == DEMA:
        lane_dema(h, p, length, bar_index, vals, base, v)
    elif family == LSMA:
        lane_lsma(h, p, length, bar_index, v)
    else:
        lane_kama(h, p, length, bar_index, vals, base + MA_AUX1, v)


# -- signals and equity, lane by lane (selects, no data-dependent branches) ---------


def lane_equity(vals, equity_field, return_field, previous_signal, r, first, start, decay, lane):
    """``core.equity_next`` for one lane; ``previous_signal`` is s[1] (NaN = na)."""
    a = vals[return_field, lane]
    a = r if previous_signal > 0 else (-r if previous_signal < 0 else a)
    vals[return_field, lane] = a
    e = start if first else (vals[equity_field, lane] * decay) * (1.0 + a)
    e = EQUITY_FLOOR if e < EQUITY_FLOOR else e
    vals[equity_field, lane] = e
    return e


def lane_layer1(family, h, p, lengths, bar_index, vals, decay, v):
    """``core.layer1_signal`` into ``v[V_SIGNAL]`` (NaN while inactive)."""
    cutout = lengths[CUTOUT_COLUMN]
    active = bar_index >= cutout
    first = bar_index == cutout
    for lane in range(LANES):
        v[V_W1, lane] = 0.0
        v[V_T1, lane] = 0.0
    for j in range(LENGTHS_PER_FAMILY):
        k = family * LENGTHS_PER_FAMILY + j
        base = MA_BASE + k * MA_FIELDS
        lane_ma(family, h, p, lengths[k], bar_index, vals, base, v)
        for lane in range(LANES):
            m = v[V_M, lane]
            close = v[V_CLOSE, lane]
            previous_close = v[V_PREV_CLOSE, lane]
            previous_m = vals[base + MA_PREV, lane]
            previous_signal = vals[base + MA_SIG, lane]
            signal = previous_signal
            signal = 1.0 if close > m and previous_close <= previous_m else signal
            signal = -1.0 if close < m and previous_close >= previous_m else signal
            vals[base + MA_SIG, lane] = signal
            vals[base + MA_PREV, lane] = m
            if active:
                e = lane_equity(
                    vals, base + MA_EQUITY, base + MA_RETURN, previous_signal,
                    v[V_R, lane], first, 1.0, decay, lane,
                )  # fmt: skip
                v[V_W1, lane] += signal * e
                v[V_T1, lane] += e
    for lane in range(LANES):
        if active:
            v[V_SIGNAL, lane] = math.floor((v[V_W1, lane] / v[V_T1, lane]) * 100.0 + 0.5) / 100.0
        else:
            v[V_SIGNAL, lane] = NAN


def lane_bar(h, p, bar_index, lane_bar_index, growth, lengths, pvalues, vals, direction, v, o):
    """One bar of every lane: ``core.update_stream`` with the outputs in ``o[column, lane]``.

    ``bar_index`` decides every branch (all lanes share them); ``lane_bar_index`` and
    ``growth`` (``core.growth_factor`` of each lane, unused while inactive) are per lane.
    """
    cutout = lengths[CUTOUT_COLUMN]
    decay = pvalues[PV_DECAY]
    cut = pvalues[PV_CUT]
    active = bar_index >= cutout
    first = bar_index == cutout
    for lane in range(LANES):
        close = h[p, lane]
        v[V_CLOSE, lane] = close
        previous_close = h[p - 1, lane] if bar_index > 0 else NAN
        v[V_PREV_CLOSE, lane] = previous_close
        if active:
            v[V_R, lane] = ((close - previous_close) / previous_close) * growth[lane]
        else:
            v[V_R, lane] = NAN
            growth[lane] = NAN
        v[V_W2, lane] = 0.0
        v[V_T2, lane] = 0.0
    for family in range(N_FAMILIES):
        lane_layer1(family, h, p, lengths, bar_index, vals, decay, v)
        fam = FAMILY_BASE + family * FAMILY_FIELDS
        start = pvalues[PV_WEIGHT + family]
        for lane in range(LANES):
            signal = v[V_SIGNAL, lane]
            previous_signal = vals[fam + FAM_SIGNAL_PREV, lane]
            vals[fam + FAM_SIGNAL_PREV, lane] = signal
            o[OUT_LAYER1 + family, lane] = signal
            s = NAN
            if active:
                s = lane_equity(
                    vals, fam + FAM_EQUITY, fam + FAM_RETURN, previous_signal,
                    v[V_R, lane], first, start, decay, lane,
                )  # fmt: skip
                level = 1.0 if signal > cut else (-1.0 if signal < -cut else 0.0)
                v[V_W2, lane] += level * s
                v[V_T2, lane] += s
            o[OUT_LAYER2 + family, lane] = s
    long_threshold = pvalues[PV_LONG]
    short_threshold = pvalues[PV_SHORT]
    for lane in range(LANES):
        average = v[V_W2, lane] / v[V_T2, lane] if active else NAN
        previous = vals[AVG_PREV, lane]
        d = direction[lane]
        up = average > long_threshold and previous <= long_threshold
        down = average < short_threshold and previous >= short_threshold
        o[OUT_LONG, lane] = 1.0 if up and d == -1 else 0.0
        o[OUT_SHORT, lane] = 1.0 if down and d == 1 else 0.0
        d = 1 if up else d
        d = -1 if down else d
        direction[lane] = d
        vals[AVG_PREV, lane] = average
        vals[GROWTH, lane] = growth[lane]
        o[OUT_SIGNAL, lane] = average
        o[OUT_GROWTH, lane] = growth[lane]
        o[OUT_BAR_INDEX, lane] = lane_bar_index[lane]


# -- one block of streams through their histories -----------------------------------


def block_warmup(
    ring, values, counters, param_lengths, param_values, slots, times, closes, counts,
    out, record_all, members, n_members, h, vals, v, o, growth, direction, lane_bar_index,
):  # fmt: skip
    """Apply ``counts[s]`` bars to ``slots[s]`` for the streams ``s = members[:n_members]``
    (one parameter row; bar indices equal, or all at least ``steady_bar``), like
    ``core.update_stream`` bar after bar; lanes past ``n_members`` repeat the first stream
    and are never written back. Scratch: ``h`` (ring capacity + bars, LANES), ``vals``
    (N_VALUE_FIELDS, LANES), ``v`` (N_V, LANES), ``o`` (N_OUT, LANES), three LANES vectors.
    """
    capacity = ring.shape[1] // 2
    first_slot = slots[members[0]]
    param_row = counters[first_slot, PARAM_ROW]
    lengths = param_lengths[param_row]
    pvalues = param_values[param_row]
    cutout = lengths[CUTOUT_COLUMN]
    lam = pvalues[PV_LAM]
    bars = 0
    for lane in range(LANES):
        s = members[min(lane, n_members - 1)]
        slot = slots[s]
        bars = max(bars, counts[s])
        head = counters[slot, RING_HEAD]
        for k in range(capacity):
            h[k, lane] = ring[slot, head + 1 + k]
        for f in range(N_VALUE_FIELDS):
            vals[f, lane] = values[slot, f]
        direction[lane] = counters[slot, DIRECTION]
    for lane in range(LANES):
        s = members[min(lane, n_members - 1)]
        for t in range(bars):
            h[capacity + t, lane] = closes[s, t]
    bar_index = counters[first_slot, BAR_INDEX]
    for t in range(bars):
        for lane in range(LANES):
            s = members[min(lane, n_members - 1)]
            lane_index = counters[slots[s], BAR_INDEX] + t
            lane_bar_index[lane] = lane_index
            growth[lane] = 1.0
            if lane_index >= cutout:
                growth[lane] = math.exp(lam * (lane_index - cutout))
        lane_bar(
            h, capacity + t, bar_index + t, lane_bar_index, growth, lengths, pvalues,
            vals, direction, v, o,
        )  # fmt: skip
        for lane in range(n_members):
            s = members[lane]
            count = counts[s]
            if t < count and (record_all or t == count - 1):
                row = t if record_all else 0
                for c in range(N_OUT):
                    out[s, row, c] = o[c, lane]
            if t == count - 1:
                store_lane(ring, values, counters, slots[s], times[s, t], h, capacity, t, vals,
                           direction, lane)  # fmt: skip


def store_lane(ring, values, counters, slot, last_time, h, capacity, t, vals, direction, lane):
    """Write lane ``lane``'s state back to ``slot`` after bar ``t`` of the block's history,
    as ``core.ring_push`` and the update would have left it."""
    head = counters[slot, RING_HEAD]
    pushed = t + 1
    for i in range(max(0, pushed - capacity), pushed):
        position = (head + i + 1) % capacity
        close = h[capacity + i, lane]
        ring[slot, position] = close
        ring[slot, position + capacity] = close
    counters[slot, RING_HEAD] = (head + pushed) % capacity
    counters[slot, BAR_INDEX] = counters[slot, BAR_INDEX] + pushed
    counters[slot, LAST_TIME] = last_time
    counters[slot, DIRECTION] = direction[lane]
    for f in range(N_VALUE_FIELDS):
        values[slot, f] = vals[f, lane]
