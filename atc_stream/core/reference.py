"""Full-history reference ATC: the oracle every other code path is tested against.

Written to be read beside ``docs/spec.md``: plain Python loops over bars, Python floats,
``math.exp`` and ``math.floor``, following the spec's "Canonical arithmetic" operation
by operation (window sums oldest first from ``0.0``, never numpy or running sums). Slow
on purpose (O(T * L) per MA): the CPU step, the GPU kernels and restored snapshots must
reproduce its numbers. ``na`` is ``float("nan")``: comparisons with it are false, which
is the spec's rule for ``na`` operands.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from atc_stream.core.params import FAMILIES, ATCParams

__all__ = [
    "OUTPUT_COLUMNS",
    "compute_reference",
    "cut",
    "dema_series",
    "ema_series",
    "kama_series",
    "lsma_series",
    "ma_series",
    "round2",
    "sma_series",
    "wma_series",
]

na = float("nan")

#: Golden CSV columns after ``bar_index`` and ``close``, in golden CSV order.
OUTPUT_COLUMNS: tuple[str, ...] = (
    "Average_Signal",
    "long",
    "short",
    *(f"{f}_Signal" for f in FAMILIES),
    *(f"{f}_S" for f in FAMILIES),
)

#: KAMA constants (spec: ``fast = 0.666``, ``slow = 0.064``).
KAMA_FAST = 0.666
KAMA_SLOW = 0.064

_DEFAULT_PARAMS = ATCParams()


def _is_na(x: float) -> bool:
    return x != x  # NaN is the only float not equal to itself


# ---------------------------------------------------------------------------
# Moving averages. Each takes the full close list and returns one float per bar
# (NaN where the spec says na).
# ---------------------------------------------------------------------------


def _window_sum(values: Sequence[float], i: int, length: int) -> float:
    """Sum of ``values[i-length+1 .. i]``, sequential from 0.0, oldest first."""
    acc = 0.0
    for k in range(i - length + 1, i + 1):
        acc += values[k]
    return acc


def sma_series(closes: Sequence[float], length: int) -> list[float]:
    """SMA(L) (the "HMA" family): window sum / L; na while i < L-1."""
    out = [na] * len(closes)
    for i in range(length - 1, len(closes)):
        out[i] = _window_sum(closes, i, length) / length
    return out


def ema_series(values: Sequence[float], length: int) -> list[float]:
    """EMA(L): na while i < L-1, SMA seed at i = L-1, then ``alpha*c + (1-alpha)*prev``.

    ``values`` must not contain na from index 0 on (DEMA builds its own second EMA).
    """
    alpha = 2.0 / (length + 1)
    out = [na] * len(values)
    for i in range(length - 1, len(values)):
        if i == length - 1:
            out[i] = _window_sum(values, i, length) / length
        else:
            out[i] = alpha * values[i] + (1.0 - alpha) * out[i - 1]
    return out


def wma_series(closes: Sequence[float], length: int) -> list[float]:
    """WMA(L): ``acc += j * c_j`` for j = 1..L (oldest weight 1), then ``acc / (L(L+1)/2)``."""
    denom = length * (length + 1) / 2
    out = [na] * len(closes)
    for i in range(length - 1, len(closes)):
        acc = 0.0
        oldest = i - length + 1
        for j in range(1, length + 1):
            acc += j * closes[oldest + j - 1]
        out[i] = acc / denom
    return out


def dema_series(closes: Sequence[float], length: int) -> list[float]:
    """DEMA(L) = ``2.0 * e1 - e2``; e1 = EMA(L) of closes, e2 = EMA(L) of e1.

    e2 is seeded at i = 2L-2 with the sequential sum of the L values of e1
    (i = L-1 .. 2L-2) divided by L; DEMA is na before that.
    """
    alpha = 2.0 / (length + 1)
    e1 = ema_series(closes, length)
    seed_bar = 2 * length - 2
    out = [na] * len(closes)
    e2 = na
    for i in range(seed_bar, len(closes)):
        if i == seed_bar:
            e2 = _window_sum(e1, i, length) / length
        else:
            e2 = alpha * e1[i] + (1.0 - alpha) * e2
        out[i] = 2.0 * e1[i] - e2
    return out


def lsma_series(closes: Sequence[float], length: int) -> list[float]:
    """LSMA(L): least-squares line through the last L closes evaluated at x = L-1.

    ``sy += y_j``, ``sxy += j * y_j`` for j = 0..L-1 oldest first;
    ``slope = (L*sxy - sx*sy) / (L*sxx - sx*sx)``; ``intercept = (sy - slope*sx) / L``.
    When the denominator is 0 (only for L == 1) the value is NaN.
    """
    sx = length * (length - 1) / 2
    sxx = (length - 1) * length * (2 * length - 1) / 6
    denom = length * sxx - sx * sx
    out = [na] * len(closes)
    for i in range(length - 1, len(closes)):
        if denom == 0:
            continue  # L == 1: 0/0, na
        sy = 0.0
        sxy = 0.0
        oldest = i - length + 1
        for j in range(length):
            y = closes[oldest + j]
            sy += y
            sxy += j * y
        slope = (length * sxy - sx * sy) / denom
        intercept = (sy - slope * sx) / length
        out[i] = intercept + slope * (length - 1)
    return out


def kama_series(closes: Sequence[float], length: int) -> list[float]:
    """KAMA(L), defined from bar 0 and starting from 0 (``nz(KAMA[1])``).

    signal = |c - c[L]| and noise = sum |c[k] - c[k+1]| (oldest pair first) are na
    while i < L, which makes ratio 0; ratio is also 0 when noise == 0.
    """
    out = [na] * len(closes)
    prev = 0.0  # nz(KAMA[1]) on bar 0
    for i in range(len(closes)):
        c = closes[i]
        ratio = 0.0
        if i >= length:
            signal = abs(c - closes[i - length])
            noise = 0.0
            for k in range(length - 1, -1, -1):  # oldest pair (c[L-1], c[L]) first
                noise += abs(closes[i - k] - closes[i - k - 1])
            if noise != 0:
                ratio = signal / noise
        t = ratio * (KAMA_FAST - KAMA_SLOW) + KAMA_SLOW
        smooth = t * t
        prev = prev + smooth * (c - prev)
        out[i] = prev
    return out


_MA_FUNCTIONS = {
    "EMA": ema_series,
    "HMA": sma_series,
    "WMA": wma_series,
    "DEMA": dema_series,
    "LSMA": lsma_series,
    "KAMA": kama_series,
}


def ma_series(family: str, closes: Sequence[float], length: int) -> list[float]:
    """The MA of ``family`` (one of ``FAMILIES``) with the given length."""
    return _MA_FUNCTIONS[family](closes, length)


# ---------------------------------------------------------------------------
# Per-MA signal, equity, layer helpers
# ---------------------------------------------------------------------------


def signal_series(closes: Sequence[float], ma: Sequence[float]) -> list[float]:
    """Persistent crossover signal: starts at 0; +1 on an up-cross, then -1 on a down-cross.

    ``c > m and c[1] <= m[1]`` -> 1; then ``c < m and c[1] >= m[1]`` -> -1. Any na
    operand (including c[1], m[1] on bar 0) makes the comparison false.
    """
    out = [0.0] * len(closes)
    sig = 0.0
    for i in range(len(closes)):
        c, m = closes[i], ma[i]
        c1 = closes[i - 1] if i >= 1 else na
        m1 = ma[i - 1] if i >= 1 else na
        if c > m and c1 <= m1:
            sig = 1.0
        if c < m and c1 >= m1:
            sig = -1.0
        out[i] = sig
    return out


class Equity:
    """``eq(start, s, R)`` of the spec, one bar at a time.

    Inactive (returns na) while ``i < cutout``; on inactive bars nothing changes,
    so the persistent ``a`` stays 0 until the first active bar. On an active bar:
    ``a`` is updated from ``s[1]`` (the previous bar's signal; na keeps ``a``),
    then ``e = start`` on the first active bar (``i == cutout``), else
    ``(e1 * d) * (1.0 + a)``; finally ``e = max(e, 0.25)``.
    """

    FLOOR = 0.25

    def __init__(self, start: float, params: ATCParams) -> None:
        self.start = float(start)
        self.cutout = params.cutout
        self.lam = params.lam
        self.d = params.decay
        self.a = 0.0
        self.e = na

    def step(self, i: int, s1: float, R: float) -> float:
        if i < self.cutout:
            return na
        r = R * math.exp(self.lam * (i - self.cutout))
        if s1 > 0:
            self.a = r
        elif s1 < 0:
            self.a = -r
        if i == self.cutout:
            e = self.start
        else:
            e = (self.e * self.d) * (1.0 + self.a)
        if e < self.FLOOR:
            e = self.FLOOR
        self.e = e
        return e


def round2(x: float) -> float:
    """``floor(x * 100.0 + 0.5) / 100.0``."""
    return math.floor(x * 100.0 + 0.5) / 100.0


def cut(x: float, threshold: float) -> float:
    """Layer-2 discretisation: 1.0 if x > cut, -1.0 if x < -cut, else 0.0 (na -> 0)."""
    if x > threshold:
        return 1.0
    if x < -threshold:
        return -1.0
    return 0.0


# ---------------------------------------------------------------------------
# Full ATC
# ---------------------------------------------------------------------------


def _validate_closes(closes: Sequence[float] | np.ndarray) -> list[float]:
    try:
        arr = np.asarray(closes, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"closes must be a 1-D sequence of numbers: {exc}") from exc
    if arr.ndim != 1:
        raise ValueError(f"closes must be 1-D, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        bad = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise ValueError(f"closes must be finite; closes[{bad}] = {arr[bad]!r}")
    if not np.all(arr > 0):
        bad = int(np.flatnonzero(~(arr > 0))[0])
        raise ValueError(f"closes must be > 0; closes[{bad}] = {arr[bad]!r}")
    return [float(x) for x in arr]


def compute_reference(
    closes: Sequence[float] | np.ndarray, params: ATCParams = _DEFAULT_PARAMS
) -> dict[str, np.ndarray]:
    """Full-history ATC of one close series (bar 0 = ``closes[0]``).

    Returns numpy arrays of length ``T = len(closes)``: ``bar_index`` (int64),
    ``close``, the golden columns (:data:`OUTPUT_COLUMNS`; ``long``/``short`` int64),
    ``growth`` (``exp(lam * (i - cutout))``, NaN while inactive) and per-MA arrays
    of shape ``(T, 54)`` in canonical order (family-major, lengths in
    ``family_lengths`` order): ``ma`` (NaN when na), ``sig`` (-1/0/1) and
    ``equity`` (layer-1 ``E_j``, NaN while inactive).
    """
    if not isinstance(params, ATCParams):
        raise TypeError(f"params must be an ATCParams, got {type(params).__name__}")
    c = _validate_closes(closes)
    T = len(c)
    n_fam = len(FAMILIES)

    # Per-MA values and persistent signals (independent of equity / cutout).
    mas: list[list[float]] = []
    sigs: list[list[float]] = []
    for family in FAMILIES:
        for length in params.family_lengths(family):
            m = ma_series(family, c, length)
            mas.append(m)
            sigs.append(signal_series(c, m))
    n_ma = len(mas)
    per_family = n_ma // n_fam

    layer1 = [Equity(1.0, params) for _ in range(n_ma)]
    layer2 = [Equity(w, params) for w in params.weights]

    growth = [na] * T
    equity = [[na] * n_ma for _ in range(T)]
    fam_signal = [[na] * n_fam for _ in range(T)]
    fam_equity = [[na] * n_fam for _ in range(T)]
    avg = [na] * T
    long_ev = [0] * T
    short_ev = [0] * T

    direction = na
    for i in range(T):
        R = (c[i] - c[i - 1]) / c[i - 1] if i >= 1 else na
        if i >= params.cutout:
            growth[i] = math.exp(params.lam * (i - params.cutout))

        # Layer 1: E_j = eq(1, sig_j, R); F_f = round2(sum sig_j*E_j / sum E_j).
        for j in range(n_ma):
            s1 = sigs[j][i - 1] if i >= 1 else na
            equity[i][j] = layer1[j].step(i, s1, R)
        for f in range(n_fam):
            num = 0.0
            den = 0.0
            any_na = False
            for j in range(f * per_family, (f + 1) * per_family):
                e_j = equity[i][j]
                if _is_na(e_j):
                    any_na = True
                num += sigs[j][i] * e_j
                den += e_j
            fam_signal[i][f] = na if any_na else round2(num / den)

        # Layer 2: S_f = eq(w_f, F_f, R); avg = sum Cut(F_f)*S_f / sum S_f.
        num = 0.0
        den = 0.0
        any_na = False
        for f in range(n_fam):
            F1 = fam_signal[i - 1][f] if i >= 1 else na
            S = layer2[f].step(i, F1, R)
            fam_equity[i][f] = S
            if _is_na(S):
                any_na = True
            num += cut(fam_signal[i][f], params.cut) * S
            den += S
        avg[i] = na if any_na else num / den

        # Events.
        avg1 = avg[i - 1] if i >= 1 else na
        up = avg[i] > params.long_threshold and avg1 <= params.long_threshold
        down = avg[i] < params.short_threshold and avg1 >= params.short_threshold
        long_ev[i] = int(up and direction == -1)
        short_ev[i] = int(down and direction == 1)
        if up:
            direction = 1
        if down:
            direction = -1

    out: dict[str, np.ndarray] = {
        "bar_index": np.arange(T, dtype=np.int64),
        "close": np.asarray(c, dtype=np.float64),
        "Average_Signal": np.asarray(avg, dtype=np.float64),
        "long": np.asarray(long_ev, dtype=np.int64),
        "short": np.asarray(short_ev, dtype=np.int64),
    }
    sig_arr = np.asarray(fam_signal, dtype=np.float64).reshape(T, n_fam)
    s_arr = np.asarray(fam_equity, dtype=np.float64).reshape(T, n_fam)
    for f, family in enumerate(FAMILIES):
        out[f"{family}_Signal"] = sig_arr[:, f].copy()
    for f, family in enumerate(FAMILIES):
        out[f"{family}_S"] = s_arr[:, f].copy()
    out["growth"] = np.asarray(growth, dtype=np.float64)
    out["ma"] = np.asarray(mas, dtype=np.float64).reshape(n_ma, T).T.copy()
    out["sig"] = np.asarray(sigs, dtype=np.float64).reshape(n_ma, T).T.copy()
    out["equity"] = np.asarray(equity, dtype=np.float64).reshape(T, n_ma)
    return out
