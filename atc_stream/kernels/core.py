"""The ATC update of one stream for one bar, written once for every backend.

Design: docs/design/kernels.md, "One source".
"""

import math

from atc_stream.core.output_row import (
    OUT_BAR_INDEX,
    OUT_GROWTH,
    OUT_LAYER1,
    OUT_LAYER2,
    OUT_LONG,
    OUT_SHORT,
    OUT_SIGNAL,
)
from atc_stream.core.params import LENGTHS_PER_FAMILY, N_FAMILIES
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
    LANES,
    LAST_TIME,
    MA_AUX1,
    MA_AUX2,
    MA_BASE,
    MA_EQUITY,
    MA_FIELDS,
    MA_PREV,
    MA_RETURN,
    MA_SIG,
    PARAM_ROW,
    PV_CUT,
    PV_DECAY,
    PV_LAM,
    PV_LONG,
    PV_SHORT,
    PV_WEIGHT,
    RING_HEAD,
)

EMA = 0
HMA = 1
WMA = 2
DEMA = 3
LSMA = 4
KAMA = 5

KAMA_FAST = 0.666
KAMA_SLOW = 0.064
EQUITY_FLOOR = 0.25
NAN = math.nan


# -- state access -------------------------------------------------------------------


def value(values, slot, field):
    """Field ``field`` of stream ``slot`` in the lane layout (``state/layout.py``)."""
    return values[slot // LANES, field, slot % LANES]


def set_value(values, slot, field, x):
    values[slot // LANES, field, slot % LANES] = x


# -- ring ---------------------------------------------------------------------------


def ring_push(ring, counters, slot, close):
    """Store ``close`` as the newest ring entry; return its doubled-ring index ``end``.

    The window of the last ``n`` closes is then ``ring[slot, end - n + 1 : end + 1]``.
    """
    capacity = ring.shape[1] // 2
    head = counters[slot, RING_HEAD] + 1
    if head == capacity:
        head = 0
    ring[slot, head] = close
    ring[slot, head + capacity] = close
    counters[slot, RING_HEAD] = head
    return head + capacity


def window_sum(ring, slot, end, n):
    acc = 0.0
    for k in range(end - n + 1, end + 1):
        acc += ring[slot, k]
    return acc


# -- moving averages (docs/spec.md, "Moving averages") ------------------------------


def ema_next(ring, slot, end, length, bar_index, prev, close):
    """EMA(L): na before bar L-1, seeded with the SMA at L-1, then the recurrence."""
    if bar_index < length - 1:
        return NAN
    if bar_index == length - 1:
        return window_sum(ring, slot, end, length) / length
    alpha = 2.0 / (length + 1)
    return alpha * close + (1.0 - alpha) * prev


def sma_value(ring, slot, end, length, bar_index):
    if bar_index < length - 1:
        return NAN
    return window_sum(ring, slot, end, length) / length


def wma_value(ring, slot, end, length, bar_index):
    if bar_index < length - 1:
        return NAN
    start = end - length + 1
    acc = 0.0
    for j in range(1, length + 1):
        acc += j * ring[slot, start + j - 1]
    return acc / (length * (length + 1) / 2)


def lsma_value(ring, slot, end, length, bar_index):
    """Least-squares line through the window (x = 0 oldest), evaluated at x = L-1."""
    if bar_index < length - 1:
        return NAN
    start = end - length + 1
    sy = 0.0
    sxy = 0.0
    for j in range(length):
        y = ring[slot, start + j]
        sy += y
        sxy += j * y
    sx = length * (length - 1) / 2
    sxx = (length - 1) * length * (2 * length - 1) / 6
    denominator = length * sxx - sx * sx
    if denominator == 0.0:
        return NAN  # L == 1: the slope is 0/0
    slope = (length * sxy - sx * sy) / denominator
    intercept = (sy - slope * sx) / length
    return intercept + slope * (length - 1)


def kama_next(ring, slot, end, length, bar_index, prev, close):
    """KAMA(L): defined from bar 0, starting from nz(KAMA[1]) = 0."""
    ratio = 0.0
    if bar_index >= length:
        signal = abs(close - ring[slot, end - length])
        noise = 0.0
        for k in range(end - length, end):
            noise += abs(ring[slot, k + 1] - ring[slot, k])
        if noise != 0.0:
            ratio = signal / noise
    t = ratio * (KAMA_FAST - KAMA_SLOW) + KAMA_SLOW
    smooth = t * t
    return prev + smooth * (close - prev)


def dema_next(values, slot, base, ring, end, length, bar_index, close):
    """DEMA(L) = 2*e1 - e2; updates e1 (MA_AUX1) and e2 or its seed sum (MA_AUX2)."""
    e1 = ema_next(ring, slot, end, length, bar_index, value(values, slot, base + MA_AUX1), close)
    set_value(values, slot, base + MA_AUX1, e1)
    if bar_index < length - 1:
        return NAN
    e2 = value(values, slot, base + MA_AUX2)
    seed_bar = 2 * length - 2
    if bar_index <= seed_bar:
        e2 += e1  # seed sum of e1, oldest first, from 0.0
        if bar_index == seed_bar:
            e2 = e2 / length
    else:
        alpha = 2.0 / (length + 1)
        e2 = alpha * e1 + (1.0 - alpha) * e2
    set_value(values, slot, base + MA_AUX2, e2)
    if bar_index < seed_bar:
        return NAN
    return 2.0 * e1 - e2


def ma_next(family, values, slot, base, ring, end, length, bar_index, close):
    """The MA value of this bar for one MA instance, updating its recurrence state."""
    if family == EMA:
        m = ema_next(ring, slot, end, length, bar_index, value(values, slot, base + MA_AUX1), close)
        set_value(values, slot, base + MA_AUX1, m)
        return m
    if family == HMA:
        return sma_value(ring, slot, end, length, bar_index)
    if family == WMA:
        return wma_value(ring, slot, end, length, bar_index)
    if family == DEMA:
        return dema_next(values, slot, base, ring, end, length, bar_index, close)
    if family == LSMA:
        return lsma_value(ring, slot, end, length, bar_index)
    m = kama_next(ring, slot, end, length, bar_index, value(values, slot, base + MA_AUX1), close)
    set_value(values, slot, base + MA_AUX1, m)
    return m


# -- signals and equity -------------------------------------------------------------


def crossing_signal(previous_signal, close, previous_close, m, previous_m):
    """Persistent MA signal: +1 on an upward cross, -1 on a downward one (na → no cross)."""
    signal = previous_signal
    if close > m and previous_close <= previous_m:
        signal = 1.0
    if close < m and previous_close >= previous_m:
        signal = -1.0
    return signal


def equity_next(values, slot, equity_field, return_field, previous_signal, r, first, start, decay):
    """One active bar of ``eq(start, s, R)``; ``previous_signal`` is s[1] (NaN = na)."""
    a = value(values, slot, return_field)
    if previous_signal > 0:
        a = r
    elif previous_signal < 0:
        a = -r
    set_value(values, slot, return_field, a)
    if first:
        e = start
    else:
        e = (value(values, slot, equity_field) * decay) * (1.0 + a)
    if e < EQUITY_FLOOR:
        e = EQUITY_FLOOR
    set_value(values, slot, equity_field, e)
    return e


def round2(x):
    return math.floor(x * 100.0 + 0.5) / 100.0


def cut_level(x, cut):
    if x > cut:
        return 1.0
    if x < -cut:
        return -1.0
    return 0.0


def growth_factor(lam, bar_index, cutout):
    """exp(λ·(i − cutout)); the CUDA driver gets it from the host so both sides use glibc."""
    return math.exp(lam * (bar_index - cutout))


# -- one bar of one stream ----------------------------------------------------------


def layer1_signal(family, values, slot, ring, end, lengths, bar_index, close, prev_close, r, decay):
    """Update the 9 MAs of one family; return the family's layer-1 signal (NaN if inactive)."""
    cutout = lengths[CUTOUT_COLUMN]
    active = bar_index >= cutout
    weighted = 0.0
    total = 0.0
    for j in range(LENGTHS_PER_FAMILY):
        k = family * LENGTHS_PER_FAMILY + j
        base = MA_BASE + k * MA_FIELDS
        m = ma_next(family, values, slot, base, ring, end, lengths[k], bar_index, close)
        previous_signal = value(values, slot, base + MA_SIG)
        previous_m = value(values, slot, base + MA_PREV)
        signal = crossing_signal(previous_signal, close, prev_close, m, previous_m)
        set_value(values, slot, base + MA_SIG, signal)
        set_value(values, slot, base + MA_PREV, m)
        if active:
            e = equity_next(
                values,
                slot,
                base + MA_EQUITY,
                base + MA_RETURN,
                previous_signal,
                r,
                bar_index == cutout,
                1.0,
                decay,
            )
            weighted += signal * e
            total += e
    if not active:
        return NAN
    return round2(weighted / total)


def update_stream(
    ring, values, counters, slot, bar_time, close, growth, param_lengths, param_values, out, row
):
    """Apply one closed bar to stream ``slot`` and write its outputs to ``out[row]``.

    ``growth`` is ``growth_factor(lam, bar_index, cutout)`` for this bar (ignored while
    the stream is inactive, i.e. bar_index < cutout).
    """
    param_row = counters[slot, PARAM_ROW]
    lengths = param_lengths[param_row]
    cutout = lengths[CUTOUT_COLUMN]
    decay = param_values[param_row, PV_DECAY]
    bar_index = counters[slot, BAR_INDEX]
    active = bar_index >= cutout

    end = ring_push(ring, counters, slot, close)
    prev_close = ring[slot, end - 1] if bar_index > 0 else NAN
    r = NAN
    if active:
        r = ((close - prev_close) / prev_close) * growth
    else:
        growth = NAN

    weighted = 0.0
    total = 0.0
    for family in range(N_FAMILIES):
        signal = layer1_signal(
            family, values, slot, ring, end, lengths, bar_index, close, prev_close, r, decay
        )
        fam = FAMILY_BASE + family * FAMILY_FIELDS
        previous_signal = value(values, slot, fam + FAM_SIGNAL_PREV)
        set_value(values, slot, fam + FAM_SIGNAL_PREV, signal)
        out[row, OUT_LAYER1 + family] = signal
        if active:
            start = param_values[param_row, PV_WEIGHT + family]
            s = equity_next(
                values,
                slot,
                fam + FAM_EQUITY,
                fam + FAM_RETURN,
                previous_signal,
                r,
                bar_index == cutout,
                start,
                decay,
            )
            weighted += cut_level(signal, param_values[param_row, PV_CUT]) * s
            total += s
        else:
            s = NAN
        out[row, OUT_LAYER2 + family] = s
    average = weighted / total if active else NAN

    emit_events(values, counters, slot, average, param_values, param_row, out, row)
    set_value(values, slot, GROWTH, growth)
    counters[slot, BAR_INDEX] = bar_index + 1
    counters[slot, LAST_TIME] = bar_time
    out[row, OUT_SIGNAL] = average
    out[row, OUT_GROWTH] = growth
    out[row, OUT_BAR_INDEX] = bar_index


def emit_events(values, counters, slot, average, param_values, param_row, out, row):
    """Long/short events on threshold crossings of the final signal (docs/spec.md, "Events")."""
    long_threshold = param_values[param_row, PV_LONG]
    short_threshold = param_values[param_row, PV_SHORT]
    previous = value(values, slot, AVG_PREV)
    direction = counters[slot, DIRECTION]
    up = average > long_threshold and previous <= long_threshold
    down = average < short_threshold and previous >= short_threshold
    out[row, OUT_LONG] = 1.0 if up and direction == -1 else 0.0
    out[row, OUT_SHORT] = 1.0 if down and direction == 1 else 0.0
    if up:
        direction = 1
    if down:
        direction = -1
    counters[slot, DIRECTION] = direction
    set_value(values, slot, AVG_PREV, average)


def stream_growth(counters, param_lengths, param_values, slot):
    """Growth factor for the next bar of ``slot`` (1.0 placeholder while inactive)."""
    param_row = counters[slot, PARAM_ROW]
    cutout = param_lengths[param_row, CUTOUT_COLUMN]
    bar_index = counters[slot, BAR_INDEX]
    if bar_index < cutout:
        return 1.0
    return growth_factor(param_values[param_row, PV_LAM], bar_index, cutout)
