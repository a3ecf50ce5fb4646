"""The ATC update of ``LANES`` streams at once: ``core.py``'s arithmetic on lane vectors
(``simd.py``), so every window sum runs ``LANES`` independent chains in one register.

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
from atc_stream.kernels.core import (
    DEMA,
    EMA,
    EQUITY_FLOOR,
    HMA,
    KAMA,
    KAMA_FAST,
    KAMA_SLOW,
    LSMA,
    WMA,
    growth_factor,
)
from atc_stream.kernels.simd import (
    LANES,
    SUM_PARTS,
    floor,
    gather_tile,
    load,
    load_sum,
    splat,
    splat_sum,
    store,
    store_sum,
    where,
)
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

NAN = math.nan

# rows of the per-block scratch ``lane[row]`` (one lane vector each)
L_GROWTH = 0
L_BAR_INDEX = 1
L_DIRECTION = 2
N_LANE_ROWS = 3
# rows of the per-block ``starts[row, lane]``: where each lane's stream begins in the
# flat ring, values and closes arrays; the lane's slot; its member (-1: none)
S_RING = 0
S_VALUES = 1
S_CLOSES = 2
S_SLOT = 3
S_MEMBER = 4
N_START_ROWS = 5
# rows of ``sums`` (``family_window_sums``): a family's nine window sums in rows 0-8,
# LSMA's ``sxy`` in 9-17, the HMA family's plain sums in 18-26 for the rest of the bar
PLAIN_SUMS = 2 * LENGTHS_PER_FAMILY
N_SUM_ROWS = 3 * LENGTHS_PER_FAMILY


def steady_bar(lengths):
    """First bar index from which every bar-index branch of the update is the same:
    lanes at or past it may share a block whatever their bar indices."""
    longest = 0
    for k in range(N_FAMILIES * LENGTHS_PER_FAMILY):
        longest = max(longest, lengths[k])
    return max(lengths[CUTOUT_COLUMN] + 1, 2 * longest - 1, 1)


# -- moving averages over a block's history ``h[position]`` (one lane vector a row) --


def lane_ema(h, p, length, bar_index, vals, field, close):
    """``core.ema_next``; ``vals[field]`` holds the previous value and gets the new one."""
    if bar_index < length - 1:
        m = splat(NAN)
    elif bar_index == length - 1:
        m = chain_sum(h, 0, p - length + 1, p + 1) / length  # the SMA seed
    else:
        alpha = 2.0 / (length + 1)
        m = alpha * close + (1.0 - alpha) * load(vals, field)
    store(vals, field, m)
    return m


def lane_sma(sums, j, length, bar_index):
    """``core.sma_value`` from the plain window sums (``family_window_sums``)."""
    if bar_index < length - 1:
        return splat(NAN)
    return load(sums, PLAIN_SUMS + j) / length


def lane_wma(sums, j, length, bar_index):
    """``core.wma_value`` from the family's weighted sums (``family_window_sums``)."""
    if bar_index < length - 1:
        return splat(NAN)
    return load(sums, j) / (length * (length + 1) / 2)


def lane_lsma(sums, j, length, bar_index, sy_row):
    """``core.lsma_value`` from the family's sums (``sy`` in row ``sy_row + j``, ``sxy``
    in row ``LENGTHS_PER_FAMILY + j``)."""
    if bar_index < length - 1:
        return splat(NAN)
    sy = load(sums, sy_row + j)
    sxy = load(sums, LENGTHS_PER_FAMILY + j)
    sx = length * (length - 1) / 2
    sxx = (length - 1) * length * (2 * length - 1) / 6
    denominator = length * sxx - sx * sx
    if denominator == 0.0:
        return splat(NAN)
    slope = (length * sxy - sx * sy) / denominator
    intercept = (sy - slope * sx) / length
    return intercept + slope * (length - 1)


def lane_kama(h, p, sums, j, length, bar_index, vals, field, close):
    """``core.kama_next`` with the noise from ``family_window_sums``; ``vals[field]`` holds
    the previous value and gets the new one."""
    ratio = splat(0.0)
    if bar_index >= length:
        signal = abs(close - load(h, p - length))
        noise = load(sums, j)
        ratio = where(noise != 0.0, signal / noise, 0.0)
    t = ratio * (KAMA_FAST - KAMA_SLOW) + KAMA_SLOW
    smooth = t * t
    prev = load(vals, field)
    m = prev + smooth * (close - prev)
    store(vals, field, m)
    return m


# -- the nine window sums of a family at once ----------------------------------------
#
# A window sum is a chain of dependent additions, oldest first; one chain at a time waits
# on the latency of every addition. The nine windows of a family all end at the newest
# close, so after each chain's own older part (added alone, oldest first) the nine run
# side by side over their common newest part, each still adding exactly its scalar
# terms in the scalar order. Rows of windows that are not defined yet hold garbage that
# their MA never reads.

if LENGTHS_PER_FAMILY != 9:
    raise ImportError("the family sums below are written for 9 lengths a family")


def chain_sum(x, first, start, stop):
    """The sum from 0.0 of ``x[start:stop]`` (position ``i`` is row ``i - first``),
    oldest row first."""
    acc = splat(0.0)
    for k in range(start, stop):
        acc = acc + load(x, k - first)
    return acc


def part_chain_sum(x, first, start, stop, weight, part):
    """The sum from 0.0 of one part (``simd.SUM_PARTS``) of ``x[start:stop]``, oldest row
    first, each row times its weight (``weight`` for the row at ``start``, one more per
    row; ``weight < 0`` for plain rows)."""
    acc = splat_sum(0.0)
    w = float(weight)
    for k in range(start, stop):
        if weight < 0:
            acc = acc + load_sum(x, k - first, part)
        else:
            acc = acc + w * load_sum(x, k - first, part)
            w += 1.0
    return acc


def family_sums(x, first, last, lengths, k0, weight, sums, row, weights):
    """``sums[row + j]``: the sum from 0.0, oldest first, of the window of ``lengths[k0 + j]``
    rows of ``x`` ending at position ``last`` (position ``i`` is row ``i - first``), each
    row times its 1-based (``weight`` 1), 0-based (0) or no (-1) position weight.

    Runs on ``SUM_PARTS`` parts of the lanes one after the other, so that the nine chains
    of a part stay in registers. Over the common rows a row's weight is read from
    ``weights`` (row ``i`` holds ``i`` in every lane): one load a chain and row instead of
    counting nine weights up, the same integer, so the same double."""
    shortest = lengths[k0]
    for j in range(1, LENGTHS_PER_FAMILY):
        shortest = min(shortest, lengths[k0 + j])
    common = last - shortest + 1
    s0 = last - lengths[k0] + 1
    s1 = last - lengths[k0 + 1] + 1
    s2 = last - lengths[k0 + 2] + 1
    s3 = last - lengths[k0 + 3] + 1
    s4 = last - lengths[k0 + 4] + 1
    s5 = last - lengths[k0 + 5] + 1
    s6 = last - lengths[k0 + 6] + 1
    s7 = last - lengths[k0 + 7] + 1
    s8 = last - lengths[k0 + 8] + 1
    for part in range(SUM_PARTS):
        a0 = part_chain_sum(x, first, s0, common, weight, part)
        a1 = part_chain_sum(x, first, s1, common, weight, part)
        a2 = part_chain_sum(x, first, s2, common, weight, part)
        a3 = part_chain_sum(x, first, s3, common, weight, part)
        a4 = part_chain_sum(x, first, s4, common, weight, part)
        a5 = part_chain_sum(x, first, s5, common, weight, part)
        a6 = part_chain_sum(x, first, s6, common, weight, part)
        a7 = part_chain_sum(x, first, s7, common, weight, part)
        a8 = part_chain_sum(x, first, s8, common, weight, part)
        if weight < 0:
            for k in range(common, last + 1):
                y = load_sum(x, k - first, part)
                a0 = a0 + y
                a1 = a1 + y
                a2 = a2 + y
                a3 = a3 + y
                a4 = a4 + y
                a5 = a5 + y
                a6 = a6 + y
                a7 = a7 + y
                a8 = a8 + y
        else:
            for k in range(common, last + 1):
                y = load_sum(x, k - first, part)
                a0 = a0 + load_sum(weights, k - s0 + weight, part) * y
                a1 = a1 + load_sum(weights, k - s1 + weight, part) * y
                a2 = a2 + load_sum(weights, k - s2 + weight, part) * y
                a3 = a3 + load_sum(weights, k - s3 + weight, part) * y
                a4 = a4 + load_sum(weights, k - s4 + weight, part) * y
                a5 = a5 + load_sum(weights, k - s5 + weight, part) * y
                a6 = a6 + load_sum(weights, k - s6 + weight, part) * y
                a7 = a7 + load_sum(weights, k - s7 + weight, part) * y
                a8 = a8 + load_sum(weights, k - s8 + weight, part) * y
        store_sum(sums, row, part, a0)
        store_sum(sums, row + 1, part, a1)
        store_sum(sums, row + 2, part, a2)
        store_sum(sums, row + 3, part, a3)
        store_sum(sums, row + 4, part, a4)
        store_sum(sums, row + 5, part, a5)
        store_sum(sums, row + 6, part, a6)
        store_sum(sums, row + 7, part, a7)
        store_sum(sums, row + 8, part, a8)


def longest_length(lengths, k0):
    longest = 0
    for j in range(LENGTHS_PER_FAMILY):
        longest = max(longest, lengths[k0 + j])
    return longest


def same_lengths(lengths, family, other):
    """Whether two families have the same nine lengths, in the same order."""
    for j in range(LENGTHS_PER_FAMILY):
        if lengths[family * LENGTHS_PER_FAMILY + j] != lengths[other * LENGTHS_PER_FAMILY + j]:
            return False
    return True


def lsma_sy_row(lengths):
    """Row of ``sums`` where LSMA's ``sy`` is: the HMA family's plain sums (the same
    terms added in the same order, so the same bits) when both have the same lengths,
    as with the defaults, else its own, in row 0."""
    return PLAIN_SUMS if same_lengths(lengths, LSMA, HMA) else 0


def family_window_sums(family, h, p, lengths, sums, diffs, weights, sy_row):
    """The window quantities of a family's nine MAs into ``sums`` (see ``lane_sma``,
    ``lane_wma``, ``lane_lsma``, ``lane_kama``); EMA and DEMA need none. The HMA family's
    plain sums stay in rows ``PLAIN_SUMS`` for the bar, where LSMA reuses them when its
    ``sy_row`` (``lsma_sy_row``) says so."""
    k0 = family * LENGTHS_PER_FAMILY
    if family == HMA:
        family_sums(h, 0, p, lengths, k0, -1, sums, PLAIN_SUMS, weights)
    elif family == WMA:
        family_sums(h, 0, p, lengths, k0, 1, sums, 0, weights)
    elif family == LSMA:
        if sy_row == 0:
            family_sums(h, 0, p, lengths, k0, -1, sums, 0, weights)
        family_sums(h, 0, p, lengths, k0, 0, sums, LENGTHS_PER_FAMILY, weights)
    elif family == KAMA:
        # noise: the sum of |close[k + 1] - close[k]| over the window ending at k = p - 1
        first = p - longest_length(lengths, k0)
        for k in range(first, p):
            store(diffs, k - first, abs(load(h, k + 1) - load(h, k)))
        family_sums(diffs, first, p - 1, lengths, k0, -1, sums, 0, weights)


def lane_dema(h, p, length, bar_index, vals, base, close):
    """``core.dema_next`` (e1 in MA_AUX1, e2 or its seed sum in MA_AUX2)."""
    e1 = lane_ema(h, p, length, bar_index, vals, base + MA_AUX1, close)
    if bar_index < length - 1:
        return splat(NAN)
    e2 = load(vals, base + MA_AUX2)
    seed_bar = 2 * length - 2
    if bar_index <= seed_bar:
        e2 = e2 + e1  # seed sum of e1, oldest first, from 0.0
        if bar_index == seed_bar:
            e2 = e2 / length
    else:
        alpha = 2.0 / (length + 1)
        e2 = alpha * e1 + (1.0 - alpha) * e2
    store(vals, base + MA_AUX2, e2)
    if bar_index < seed_bar:
        return splat(NAN)
    return 2.0 * e1 - e2


def lane_ma(family, h, p, sums, j, length, bar_index, vals, base, close, sy_row):
    """``core.ma_next`` of MA ``j`` of ``family`` for every lane (``sums`` from
    ``family_window_sums``, LSMA's ``sy`` in rows from ``sy_row``)."""
    if family == EMA:
        return lane_ema(h, p, length, bar_index, vals, base + MA_AUX1, close)
    if family == HMA:
        return lane_sma(sums, j, length, bar_index)
    if family == WMA:
        return lane_wma(sums, j, length, bar_index)
    if family == DEMA:
        return lane_dema(h, p, length, bar_index, vals, base, close)
    if family == LSMA:
        return lane_lsma(sums, j, length, bar_index, sy_row)
    return lane_kama(h, p, sums, j, length, bar_index, vals, base + MA_AUX1, close)


# -- signals and equity (selects where the scalar kernel branches on a lane's value) --


def lane_equity(vals, equity_field, return_field, previous_signal, r, first, start, decay):
    """``core.equity_next``; ``previous_signal`` is s[1] (NaN = na)."""
    a = load(vals, return_field)
    a = where(previous_signal > 0, r, where(previous_signal < 0, -r, a))
    store(vals, return_field, a)
    if first:
        e = splat(start)
    else:
        e = (load(vals, equity_field) * decay) * (1.0 + a)
    e = where(e < EQUITY_FLOOR, EQUITY_FLOOR, e)
    store(vals, equity_field, e)
    return e


def lane_layer1(
    family, h, p, lengths, bar_index, vals, decay, close, previous_close, r, sums, diffs,
    weights,
):  # fmt: skip
    """``core.layer1_signal``: the family's layer-1 signal (NaN while inactive)."""
    sy_row = lsma_sy_row(lengths) if family == LSMA else 0
    family_window_sums(family, h, p, lengths, sums, diffs, weights, sy_row)
    cutout = lengths[CUTOUT_COLUMN]
    active = bar_index >= cutout
    first = bar_index == cutout
    weighted = splat(0.0)
    total = splat(0.0)
    for j in range(LENGTHS_PER_FAMILY):
        k = family * LENGTHS_PER_FAMILY + j
        base = MA_BASE + k * MA_FIELDS
        m = lane_ma(family, h, p, sums, j, lengths[k], bar_index, vals, base, close, sy_row)
        previous_signal = load(vals, base + MA_SIG)
        previous_m = load(vals, base + MA_PREV)
        signal = where((close > m) & (previous_close <= previous_m), 1.0, previous_signal)
        signal = where((close < m) & (previous_close >= previous_m), -1.0, signal)
        store(vals, base + MA_SIG, signal)
        store(vals, base + MA_PREV, m)
        if active:
            e = lane_equity(
                vals, base + MA_EQUITY, base + MA_RETURN, previous_signal, r, first, 1.0, decay
            )
            weighted = weighted + signal * e
            total = total + e
    if not active:
        return splat(NAN)
    return floor((weighted / total) * 100.0 + 0.5) / 100.0


def lane_bar(h, p, bar_index, lengths, pvalues, vals, lane, o, sums, diffs, weights):
    """One bar of every lane: ``core.update_stream`` with the outputs in ``o[column]``.

    ``bar_index`` decides every branch (all lanes share them); ``lane[L_BAR_INDEX]`` and
    ``lane[L_GROWTH]`` (``core.growth_factor`` of each lane, unused while inactive) are
    per lane, and ``lane[L_DIRECTION]`` is each lane's direction.
    """
    cutout = lengths[CUTOUT_COLUMN]
    decay = pvalues[PV_DECAY]
    cut = pvalues[PV_CUT]
    active = bar_index >= cutout
    first = bar_index == cutout
    close = load(h, p)
    previous_close = load(h, p - 1) if bar_index > 0 else splat(NAN)
    if active:
        growth = load(lane, L_GROWTH)
        r = ((close - previous_close) / previous_close) * growth
    else:
        growth = splat(NAN)
        r = splat(NAN)
    weighted = splat(0.0)
    total = splat(0.0)
    for family in range(N_FAMILIES):
        signal = lane_layer1(
            family, h, p, lengths, bar_index, vals, decay, close, previous_close, r, sums, diffs,
            weights,
        )  # fmt: skip
        fam = FAMILY_BASE + family * FAMILY_FIELDS
        previous_signal = load(vals, fam + FAM_SIGNAL_PREV)
        store(vals, fam + FAM_SIGNAL_PREV, signal)
        store(o, OUT_LAYER1 + family, signal)
        if active:
            start = pvalues[PV_WEIGHT + family]
            s = lane_equity(
                vals, fam + FAM_EQUITY, fam + FAM_RETURN, previous_signal, r, first, start, decay
            )
            level = where(signal > cut, 1.0, where(signal < -cut, -1.0, 0.0))
            weighted = weighted + level * s
            total = total + s
        else:
            s = splat(NAN)
        store(o, OUT_LAYER2 + family, s)
    average = weighted / total if active else splat(NAN)

    long_threshold = pvalues[PV_LONG]
    short_threshold = pvalues[PV_SHORT]
    previous = load(vals, AVG_PREV)
    direction = load(lane, L_DIRECTION)
    up = (average > long_threshold) & (previous <= long_threshold)
    down = (average < short_threshold) & (previous >= short_threshold)
    store(o, OUT_LONG, where(up & (direction == -1.0), 1.0, 0.0))
    store(o, OUT_SHORT, where(down & (direction == 1.0), 1.0, 0.0))
    direction = where(up, 1.0, direction)
    direction = where(down, -1.0, direction)
    store(lane, L_DIRECTION, direction)
    store(vals, AVG_PREV, average)
    store(vals, GROWTH, growth)
    store(o, OUT_SIGNAL, average)
    store(o, OUT_GROWTH, growth)
    store(o, OUT_BAR_INDEX, load(lane, L_BAR_INDEX))


# -- one block of streams through their histories -----------------------------------


def block_warmup(
    ring, values, counters, param_lengths, param_values, slots, times, closes, counts,
    out, record_all, members, n_members, in_place, h, scratch, o, lane, starts, sums, diffs,
    weights,
):  # fmt: skip
    """Apply ``counts[s]`` bars to ``slots[s]`` for the streams ``s = members[:n_members]``
    (one parameter row; bar indices equal, or all at least ``steady_bar``), like
    ``core.update_stream`` bar after bar. Scratch, every float array ``(rows, LANES)``:
    ``h`` (ring capacity + bars), ``scratch`` (N_VALUE_FIELDS), ``o`` (N_OUT), ``lane``
    (N_LANE_ROWS); ``starts`` int64 ``(N_START_ROWS, LANES)``; ``sums``
    (N_SUM_ROWS), ``diffs`` (ring capacity) and ``weights`` (ring capacity, row ``i``
    holding ``i`` in every lane) for ``family_window_sums``.

    With ``in_place`` (``cpu.plan_blocks`` sets it for streams of one stored block of
    values, ``state/layout.py``, in slot order and with one history length, when no other
    block of the call has a stream of that stored block), they are updated where they are
    stored, each in its own lane; the block's other lanes compute on a member's inputs and
    get their values back afterwards. Any other block works on a copy of its
    streams' values in ``scratch``, lane ``i`` for stream ``members[i]``, the lanes past
    ``n_members`` repeating the last stream; lanes that are no member are never written
    back.
    """
    capacity = ring.shape[1] // 2
    first = members[0]
    first_slot = slots[first]
    param_row = counters[first_slot, PARAM_ROW]
    lengths = param_lengths[param_row]
    pvalues = param_values[param_row]
    cutout = lengths[CUTOUT_COLUMN]
    lam = pvalues[PV_LAM]
    bars = 0
    for q in range(n_members):
        bars = max(bars, counts[members[q]])
    for i in range(LANES):
        starts[S_MEMBER, i] = -1
    for q in range(n_members):
        i = slots[members[q]] % LANES if in_place else q
        starts[S_MEMBER, i] = members[q]
    for i in range(LANES):
        s = starts[S_MEMBER, i]
        if s < 0:
            s = first if in_place else members[n_members - 1]
        slot = slots[s]
        starts[S_SLOT, i] = slot
        starts[S_RING, i] = slot * ring.shape[1] + counters[slot, RING_HEAD] + 1
        starts[S_VALUES, i] = (slot // LANES) * N_VALUE_FIELDS * LANES + slot % LANES
        starts[S_CLOSES, i] = s * closes.shape[1]
        lane[L_DIRECTION, i] = counters[slot, DIRECTION]
    if in_place:
        vals = values[first_slot // LANES]
        copy_idle_lanes(vals, scratch, starts[S_MEMBER])  # the streams not in this call
    else:
        vals = scratch
        gather_lanes(values, starts[S_VALUES], vals)
    gather_rows(ring, starts[S_RING], capacity, h, 0)
    gather_rows(closes, starts[S_CLOSES], bars, h, capacity)
    bar_index = counters[first_slot, BAR_INDEX]
    for t in range(bars):
        previous_index = -1
        growth = 1.0
        for i in range(LANES):
            lane_index = counters[starts[S_SLOT, i], BAR_INDEX] + t
            lane[L_BAR_INDEX, i] = lane_index
            if lane_index != previous_index:  # lanes at one bar index share one exp
                growth = 1.0
                if lane_index >= cutout:
                    growth = growth_factor(lam, lane_index, cutout)
                previous_index = lane_index
            lane[L_GROWTH, i] = growth
        lane_bar(
            h, capacity + t, bar_index + t, lengths, pvalues, vals, lane, o, sums, diffs, weights
        )
        for i in range(LANES):
            s = starts[S_MEMBER, i]
            if s < 0:
                continue
            count = counts[s]
            if t < count and (record_all or t == count - 1):
                row = t if record_all else 0
                for c in range(N_OUT):
                    out[s, row, c] = o[c, i]
            if t == count - 1:
                store_lane(ring, values, counters, slots[s], times[s, t], h, capacity, t, vals,
                           lane, i, not in_place)  # fmt: skip
    if in_place:
        copy_idle_lanes(scratch, vals, starts[S_MEMBER])


def copy_idle_lanes(source, target, lane_members):
    """``target[f, i] = source[f, i]`` for every field of the lanes ``i`` with no member
    (``lane_members[i] < 0``)."""
    for i in range(LANES):  # lanes outermost: a whole block tests 8 flags, not 8 a field
        if lane_members[i] < 0:
            for f in range(N_VALUE_FIELDS):
                target[f, i] = source[f, i]


def gather_lanes(values, lane_starts, vals):
    """``vals[f, i] = values.flat[lane_starts[i] + f * LANES]``: each lane's stream's
    values (``lane_starts``: where its field 0 is in the lane layout) in lane order."""
    flat = values.reshape(values.size)
    for f in range(N_VALUE_FIELDS):
        for i in range(LANES):
            vals[f, i] = flat[lane_starts[i] + f * LANES]


def gather_rows(source, lane_starts, n, rows, row):
    """``rows[row + k, i] = source.flat[lane_starts[i] + k]`` for ``k < n``: each lane's
    ``n`` consecutive doubles as lane rows, a tile of LANES at a time."""
    k = 0
    while k + LANES <= n:
        gather_tile(source, lane_starts, k, rows, row + k)
        k += LANES
    flat = source.reshape(source.size)
    for i in range(LANES):
        for j in range(k, n):
            rows[row + j, i] = flat[lane_starts[i] + j]


def store_lane(ring, values, counters, slot, last_time, h, capacity, t, vals, lane, i,
               with_values):  # fmt: skip
    """Write lane ``i``'s state back to ``slot`` after bar ``t`` of the block's history,
    as ``core.ring_push`` and the update would have left it (its values from ``vals``
    only when ``with_values``: otherwise they were updated where they are stored)."""
    pushed = t + 1
    first = max(0, pushed - capacity)
    # the ring positions counted on, not a modulo a close (an integer division is
    # ~10-40 cycles; a step pushes one close and needs none)
    position = counters[slot, RING_HEAD] + first
    if position >= capacity:
        position %= capacity
    for k in range(first, pushed):
        position += 1
        if position == capacity:
            position = 0
        close = h[capacity + k, i]
        ring[slot, position] = close
        ring[slot, position + capacity] = close
    counters[slot, RING_HEAD] = position
    counters[slot, BAR_INDEX] = counters[slot, BAR_INDEX] + pushed
    counters[slot, LAST_TIME] = last_time
    counters[slot, DIRECTION] = int(lane[L_DIRECTION, i])
    if with_values:
        block = values[slot // LANES]
        for f in range(N_VALUE_FIELDS):
            block[f, slot % LANES] = vals[f, i]
